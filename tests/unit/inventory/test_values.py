"""Values are checked when stored: addresses, control characters, MACs, BMC settings, keys."""

import pytest
from pydantic import ValidationError

from provisiond.inventory.model import Record
from provisiond.inventory.values import check_name
from provisiond.inventory.store import describe_validation_error

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE2VKIJgSg1BQBvSU0hrcOMnjwkiRUAX6JcU/3rHVLmv a@b"


def netdev(**fields) -> dict:
    return {"netdevs": {"eth0": fields}}


def refused(data: dict) -> str:
    """The one line a user sees for a record that does not validate."""
    with pytest.raises(ValidationError) as raised:
        Record.model_validate(data)
    return describe_validation_error(raised.value)


@pytest.mark.parametrize("value, text", [
    ("fe80::1%eth0", "scope id"),
    ("fd00::3%x\n10.66.66.66\tprovisiond.cluster", "control character"),
    ("fd00::3%x", "scope id"),
    ("::ffff:10.0.0.5", "IPv4-mapped"),
    ("64:ff9b::10.0.0.5", "NAT64"),
    ("::", "unspecified"),
    ("ff02::1", "multicast"),
    ("fd00::zz", "invalid IPv6"),
])
def test_bad_ipv6_addresses_are_refused(value, text):
    assert text in refused(netdev(ipaddr6=value))


def test_ipv6_is_stored_compressed():
    record = Record.model_validate(netdev(ipaddr6="FD00:0000:0:0::0003"))
    assert record.netdevs["eth0"].ipaddr6 == "fd00::3"


@pytest.mark.parametrize("value, text", [
    ("0.0.0.0", "unspecified"),
    ("224.0.0.1", "multicast"), ("239.1.2.3", "multicast"),
    ("255.255.255.255", "broadcast"),
])
@pytest.mark.parametrize("field", ["ipaddr", "gateway"])
def test_bad_ipv4_addresses_are_refused(field, value, text):
    with pytest.raises(ValidationError, match=text):
        Record.model_validate(netdev(**{field: value}))


@pytest.mark.parametrize("value, text", [
    ("00:00:00:00:00:00", "all zeros"), ("ff:ff:ff:ff:ff:ff", "broadcast"),
    ("01:00:5e:00:00:01", "multicast"), ("33:33:00:00:00:01", "multicast"),
])
def test_macs_no_card_has_are_refused(value, text):
    with pytest.raises(ValidationError, match=text):
        Record.model_validate(netdev(mac=value))


@pytest.mark.parametrize("data", [
    {"kernel_args": ["quiet\nchain http://evil/x.ipxe\n#"]},
    {"comment": "ok\x1b[2J"},
    {"comment": "right-to-left \u202e override"},
    {"tags": {"rack": "r1\r"}},
    {"nomad": {"datacenter": "dc1\n"}},
    {"nomad": {"meta": {"k\n": "v"}}},
    {"nomad": {"servers": ["10.0.0.1:4647\n"]}},
    {"ansible": {"repo": "https://x/y.git\nrm -rf /"}},
    {"ansible": {"extra_vars": {"a": "b\x00"}}},
    {"bmc": {"username": "admin\n"}},
    {"bmc": {"system_id": "abc\t"}},
    {"bmc": {"ca_file": "/x\n"}},
    {"netdevs": {"eth0": {"type": "ethernet\n"}}},
    {"ssh_authorized_keys": [KEY + "\nssh-rsa AAAA evil"]},
])
def test_control_characters_are_refused_everywhere(data):
    assert "control character" in refused(data)


@pytest.mark.parametrize("name", ["n1\n", "n1\t", "n1\x1b"])
def test_names_with_a_trailing_control_character_are_refused(name):
    with pytest.raises(ValueError, match="invalid"):
        check_name(name)
    assert "control character" in refused({"image": name})
    assert "control character" in refused({"system_overlays": [name]})


def test_a_kernel_arg_is_one_word():
    with pytest.raises(ValidationError, match="no whitespace"):
        Record.model_validate({"kernel_args": ["quiet splash"]})
    with pytest.raises(ValidationError, match="no whitespace"):
        Record.model_validate({"kernel_args": [""]})
    record = Record.model_validate({"kernel_args": ["console=ttyS1,115200"]})
    assert record.kernel_args == ["console=ttyS1,115200"]


@pytest.mark.parametrize("bmc, text", [
    ({"timeout": -5}, "timeout -5 is outside"), ({"timeout": 0}, "outside"),
    ({"timeout": 100000}, "outside"), ({"cipher_suite": 99}, "cipher suite 99"),
    ({"cipher_suite": 0}, "cipher suite 0"), ({"address": "bmc 1"}, "invalid address"),
    ({"address": "fe80::1%eth0"}, "scope id"),
    # not IP addresses, and not host names either: the resolver reads 010.0.0.1 as octal
    # (8.0.0.1) and 12345 as 0.0.48.57
    ({"address": "010.0.0.1"}, "invalid address"), ({"address": "10.0.0.256"}, "invalid"),
    ({"address": "1.2.3"}, "invalid address"), ({"address": "12345"}, "invalid address"),
])
def test_bad_bmc_settings_are_refused(bmc, text):
    with pytest.raises(ValidationError, match=text):
        Record.model_validate({"bmc": bmc})


def test_good_bmc_settings_pass():
    record = Record.model_validate({"bmc": {"timeout": 12.5, "cipher_suite": 3,
                                            "address": "FD00::0:9"}})
    assert record.bmc.address == "fd00::9"
    assert Record.model_validate({"bmc": {"address": "bmc-1.lab"}}).bmc.address == "bmc-1.lab"


@pytest.mark.parametrize("key", [
    KEY,
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE2VKIJgSg1BQBvSU0hrcOMnjwkiRUAX6JcU/3rHVLmv",
    'from="10.0.0.1,10.0.0.2" ' + KEY,
    'command="echo a b",no-pty ' + KEY,
])
def test_openssh_public_keys_pass(key):
    assert Record.model_validate({"ssh_authorized_keys": [key]}).ssh_authorized_keys == [key]


@pytest.mark.parametrize("key", [
    "not a key",
    "ssh-ed25519",
    "ssh-ed25519 not-base64! a@b",
    "ssh-rsa AAAAC3NzaC1lZDI1NTE5AAAAIE2VKIJgSg1BQBvSU0hrcOMnjwkiRUAX6JcU/3rHVLmv a@b",
    "ssh-ed25519 AAAAB3NzaC1yc2EAAAADAQABAAABAQC a@b",
    'from="10.0.0.1 ' + KEY,
])
def test_what_is_not_an_openssh_public_key_is_refused(key):
    with pytest.raises(ValidationError, match="not an OpenSSH public key"):
        Record.model_validate({"ssh_authorized_keys": [key]})
