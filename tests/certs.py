"""Test certificates (EC P-256, valid from an hour ago for two days), written as PEM files
with their keys unencrypted and mode 0600: one piece of code for every test that needs a
TLS peer."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

LOOPBACK = ("127.0.0.1",)


def name(value: str, oid=NameOID.COMMON_NAME) -> x509.Name:
    return x509.Name([x509.NameAttribute(oid, value)])


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def builder(subject: x509.Name, issuer: x509.Name, key) -> x509.CertificateBuilder:
    """A certificate of `key` for `subject` by `issuer`, valid now, to extend and sign."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2)))


def addresses(hosts=LOOPBACK) -> x509.SubjectAlternativeName:
    return x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))
                                        for host in hosts])


def write(cert: x509.Certificate, key, cert_path: Path, key_path: Path) -> None:
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)


def self_signed(folder: Path, host: str = "127.0.0.1", stem: str = "server") -> tuple[Path, Path]:
    """(cert path, key path) under `folder`: a certificate for `host` signed by itself
    (its own CA)."""
    key = new_key()
    subject = name("provisiond test")
    cert = (builder(subject, subject, key).add_extension(addresses([host]), critical=False)
            .sign(key, hashes.SHA256()))
    paths = folder / f"{stem}.crt", folder / f"{stem}.key"
    write(cert, key, *paths)
    return paths
