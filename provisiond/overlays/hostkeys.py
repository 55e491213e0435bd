"""Per-node SSH host keys: generated once with ssh-keygen, kept 0600 under the state dir,
offered to runtime overlays only (as `secrets.ssh_host_keys`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from provisiond.atomic import locked
from provisiond.config import Config
from provisiond.errors import BuildFailed

KEY_TYPES = ("ed25519", "rsa")


def host_key_dir(config: Config, node: str) -> Path:
    return config.state_dir / "secrets" / "ssh-host-keys" / node


def has_host_keys(config: Config, node: str) -> bool:
    folder = host_key_dir(config, node)
    return all((folder / f"ssh_host_{t}_key.pub").is_file() for t in KEY_TYPES)


def ensure_host_keys(config: Config, node: str) -> dict[str, dict[str, str]]:
    """{type: {"private": ..., "public": ...}} for the node, generating missing keys."""
    folder = host_key_dir(config, node)
    if not has_host_keys(config, node):
        with locked(folder.parent / f".{node}.lock"):
            for key_type in KEY_TYPES:
                if not (folder / f"ssh_host_{key_type}_key.pub").is_file():
                    _generate(folder, node, key_type)
    return {t: {"private": (folder / f"ssh_host_{t}_key").read_text(),
                "public": (folder / f"ssh_host_{t}_key.pub").read_text()} for t in KEY_TYPES}


def _generate(folder: Path, node: str, key_type: str) -> None:
    """ssh-keygen into a private temp dir, then rename into the 0700 key dir."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder.parent, 0o700)
    os.chmod(folder, 0o700)
    name = f"ssh_host_{key_type}_key"
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        argv = ["ssh-keygen", "-q", "-t", key_type, "-N", "", "-C", f"root@{node}",
                "-f", f"{tmp}/{name}"]
        if key_type == "rsa":
            argv[4:4] = ["-b", "3072"]
        try:
            subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120)
        except FileNotFoundError:
            raise BuildFailed("ssh host keys: ssh-keygen not found (apt install "
                              "openssh-client)") from None
        except subprocess.CalledProcessError as exc:
            raise BuildFailed(f"ssh-keygen for {node}: {exc.stderr.strip()}") from None
        except subprocess.TimeoutExpired as exc:
            raise BuildFailed(f"ssh-keygen for {node}: no answer in {exc.timeout:.0f} s"
                              ) from None
        for suffix in ("", ".pub"):
            os.chmod(f"{tmp}/{name}{suffix}", 0o600)
            os.replace(f"{tmp}/{name}{suffix}", folder / f"{name}{suffix}")


def forget_host_keys(config: Config, node: str) -> None:
    """Delete a node's keys (a new pair is made on its next runtime build)."""
    shutil.rmtree(host_key_dir(config, node), ignore_errors=True)
