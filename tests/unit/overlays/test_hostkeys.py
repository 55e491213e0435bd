"""SSH host keys: made in-process (ed25519 + ecdsa unless the settings ask for RSA), valid
for OpenSSH, kept 0600, and an older node's RSA key kept and still offered."""

from __future__ import annotations

import errno
import subprocess

import pytest

from provisiond import archive
from provisiond.config import load_config, write_default_config
from provisiond.errors import BuildFailed, InvalidConfig
from provisiond.overlays import OverlayBuildFailed, build_overlays, ensure_overlay
from provisiond.overlays.hostkeys import (ensure_host_keys, forget_host_keys, has_host_keys,
                                          host_key_dir, host_key_signature)
from provisiond.state.files import FilesStore
from provisiond.state.open import open_store
from tests.unit.overlays.test_build import files_of, write_inventory

SSH_KEYGEN = "/usr/bin/ssh-keygen"  # the real OpenSSH tool checks what we wrote


def set_key_types(state_dir, types: str) -> None:
    (state_dir / "provisiond.yaml").write_text(f"build:\n  ssh_host_key_types: {types}\n")


def public_of(private_path) -> str:
    """The public key OpenSSH derives from the private key file (`ssh-keygen -y`)."""
    result = subprocess.run([SSH_KEYGEN, "-y", "-f", str(private_path)], capture_output=True,
                            text=True, timeout=30, check=True)
    return result.stdout.split()[1]


def test_default_keys_are_ed25519_and_ecdsa_valid_for_openssh_and_private(config):
    keys = ensure_host_keys(config, "n1")
    assert list(keys) == ["ed25519", "ecdsa"]
    folder = host_key_dir(config, "n1")
    assert folder.stat().st_mode & 0o777 == 0o700
    assert folder.parent.stat().st_mode & 0o777 == 0o700
    for key_type, prefix in (("ed25519", "ssh-ed25519 "), ("ecdsa", "ecdsa-sha2-nistp256 ")):
        private = folder / f"ssh_host_{key_type}_key"
        public = keys[key_type]["public"]
        assert public.startswith(prefix) and public.endswith(" root@n1\n")
        assert keys[key_type]["private"].startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
        assert public_of(private) == public.split()[1]
        for path in (private, folder / f"ssh_host_{key_type}_key.pub"):
            assert path.stat().st_mode & 0o777 == 0o600
    assert not (folder / "ssh_host_rsa_key").exists()


def test_keys_are_made_in_process_without_ssh_keygen(config, monkeypatch):
    """10,000 nodes' keys took over 15 minutes through `ssh-keygen -t rsa -b 3072`."""
    def no_subprocess(*args, **kwargs):
        raise AssertionError(f"a child process was started: {args[0]!r}")

    monkeypatch.setattr(subprocess, "run", no_subprocess)
    monkeypatch.setattr(subprocess, "Popen", no_subprocess)
    assert set(ensure_host_keys(config, "n7")) == {"ed25519", "ecdsa"}


def test_keys_are_made_once_and_kept(config):
    first = ensure_host_keys(config, "n1")
    signature = host_key_signature(config, "n1")
    assert ensure_host_keys(config, "n1") == first
    assert host_key_signature(config, "n1") == signature
    assert ensure_host_keys(config, "n2") != first


def test_rsa_only_when_the_settings_ask(state_dir):
    set_key_types(state_dir, "[ed25519, rsa]")
    config = load_config(state_dir)
    keys = ensure_host_keys(config, "n1")
    assert list(keys) == ["ed25519", "rsa"]
    assert keys["rsa"]["public"].startswith("ssh-rsa ")
    private = host_key_dir(config, "n1") / "ssh_host_rsa_key"
    assert public_of(private) == keys["rsa"]["public"].split()[1]
    length = subprocess.run([SSH_KEYGEN, "-l", "-f", f"{private}.pub"], capture_output=True,
                            text=True, timeout=30, check=True).stdout.split()[0]
    assert length == "3072"


def test_an_older_nodes_rsa_key_is_kept_and_still_offered(state_dir):
    """Nodes keyed before ecdsa became a default have ed25519 + RSA keys (made by
    ssh-keygen): their keys stay, ecdsa is added, and the runtime overlay carries all three."""
    write_inventory(state_dir, count=1)
    set_key_types(state_dir, "[ed25519, rsa]")
    old = ensure_host_keys(load_config(state_dir), "n1")
    set_key_types(state_dir, "[ed25519, ecdsa]")
    config = load_config(state_dir)
    keys = ensure_host_keys(config, "n1")
    assert list(keys) == ["ed25519", "ecdsa", "rsa"]
    assert keys["ed25519"] == old["ed25519"] and keys["rsa"] == old["rsa"]
    files = files_of(ensure_overlay(config, "n1", "runtime"))
    assert files["etc/ssh/ssh_host_rsa_key"].decode() == old["rsa"]["private"]
    assert files["etc/ssh/ssh_host_ecdsa_key.pub"].decode() == keys["ecdsa"]["public"]


def test_a_key_file_cut_short_is_made_again(config):
    ensure_host_keys(config, "n1")
    public = host_key_dir(config, "n1") / "ssh_host_ecdsa_key.pub"
    public.write_text("")  # what a power cut before the data reached the disk leaves
    assert not has_host_keys(config, "n1")
    keys = ensure_host_keys(config, "n1")
    assert keys["ecdsa"]["public"].startswith("ecdsa-sha2-nistp256 ")


def test_runtime_build_follows_a_replaced_key(config, state_dir):
    write_inventory(state_dir, count=1)
    before = files_of(ensure_overlay(config, "n1", "runtime"))["etc/ssh/ssh_host_ed25519_key"]
    old_lock = host_key_dir(config, "n1").parent / ".n1.lock"  # made by earlier versions
    old_lock.touch()
    forget_host_keys(config, "n1")
    assert not host_key_dir(config, "n1").exists() and not old_lock.exists()
    after = files_of(ensure_overlay(config, "n1", "runtime"))["etc/ssh/ssh_host_ed25519_key"]
    assert after != before and after.startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----")


def test_a_batch_build_syncs_new_keys_once(config, state_dir, monkeypatch):
    """Keys are secrets, not derived data: a batch writes them without per-file fsyncs and
    syncs once before it reports the build done."""
    write_inventory(state_dir, count=3)
    calls = []
    monkeypatch.setattr("provisiond.overlays.hostkeys.os.sync", lambda: calls.append(1))
    summary = build_overlays(config)
    assert summary["rebuilt"]["runtime"] == 3 and calls == [1]
    blob = archive.decompress(ensure_overlay(config, "n2", "runtime").read_bytes())
    assert (host_key_dir(config, "n2") / "ssh_host_ecdsa_key").read_bytes() in blob
    assert sorted(p.name for p in host_key_dir(config, "n1").parent.iterdir()) == \
        ["n1", "n2", "n3"]  # no temp directory left behind


def test_a_builder_that_loses_the_race_for_a_new_node_keeps_the_winners_keys(config,
                                                                             monkeypatch):
    """Two servers building n1's runtime overlay at once: the private key is stored only if
    absent, so the one that stores second takes the first one's key (and its public key is
    that key's), and only the missing types are added."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    winner = ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption())
    store = open_store(config)
    real_put = type(store).put

    def other_server_first(self, key, value, expect=None):
        if key.endswith("/ssh_host_ed25519_key") and self.get(key) is None:
            real_put(self, key, winner)  # the other server's key lands first
        return real_put(self, key, value, expect)

    monkeypatch.setattr(type(store), "put", other_server_first)
    keys = ensure_host_keys(config, "n1")
    assert keys["ed25519"]["private"] == winner.decode()
    assert public_of(host_key_dir(config, "n1") / "ssh_host_ed25519_key") == \
        keys["ed25519"]["public"].split()[1]
    assert keys["ecdsa"]["public"].startswith("ecdsa-sha2-nistp256 ")
    assert [p.name for p in host_key_dir(config, "n1").parent.iterdir()] == ["n1"]


def test_two_servers_on_one_store_give_a_node_the_same_keys(tmp_path, monkeypatch):
    """Servers with state dirs of their own and one shared store: the keys one made are the
    ones the other reads and builds into the node's runtime overlay."""
    shared = FilesStore(tmp_path / "shared")
    monkeypatch.setattr("provisiond.state.open.open_store", lambda config: shared)
    shared.root.mkdir()
    write_inventory(shared.root, count=1)  # the inventory both read from the store
    configs = []
    for name in ("first", "second"):
        write_default_config(tmp_path / name)
        configs.append(load_config(tmp_path / name))
    made = ensure_host_keys(configs[0], "n1")
    assert ensure_host_keys(configs[1], "n1") == made
    files = files_of(ensure_overlay(configs[1], "n1", "runtime"))
    assert files["etc/ssh/ssh_host_ed25519_key"].decode() == made["ed25519"]["private"]
    assert not host_key_dir(configs[1], "n1").exists()  # not on the second's own disk


@pytest.mark.parametrize("types, words", [("[dsa]", "ssh_host_key_types.0"),
                                          ("[]", "ssh_host_key_types")])
def test_bad_key_type_setting_is_one_line(state_dir, types, words):
    set_key_types(state_dir, types)
    with pytest.raises(InvalidConfig, match=words) as caught:
        load_config(state_dir)
    assert "\n" not in str(caught.value)


def test_dropping_an_old_key_or_asking_for_rsa_rebuilds_the_runtime_part(state_dir):
    write_inventory(state_dir, count=2)
    set_key_types(state_dir, "[ed25519, rsa]")
    build_overlays(load_config(state_dir))
    set_key_types(state_dir, "[ed25519, ecdsa]")
    config = load_config(state_dir)
    assert build_overlays(config)["rebuilt"]["runtime"] == 2  # ecdsa added
    assert build_overlays(config)["rebuilt"]["runtime"] == 0
    for name in ("ssh_host_rsa_key", "ssh_host_rsa_key.pub"):
        (host_key_dir(config, "n1") / name).unlink()
    assert build_overlays(config)["rebuilt"] == {"shared": 0, "system": 0, "runtime": 1}
    files = files_of(ensure_overlay(config, "n1", "runtime"))
    assert "etc/ssh/ssh_host_rsa_key" not in files and "etc/ssh/ssh_host_ecdsa_key" in files
    assert "etc/ssh/ssh_host_rsa_key" in files_of(ensure_overlay(config, "n2", "runtime"))


def test_a_key_that_cannot_be_written_fails_that_node_only(config, state_dir, monkeypatch):
    write_inventory(state_dir, count=3)
    store = open_store(config)
    real_put = type(store).put

    def full_disk_for_n2(self, key, value, expect=None):
        if key.startswith("secrets/ssh-host-keys/n2/"):
            raise OSError(errno.ENOSPC, "No space left on device", key)
        return real_put(self, key, value, expect)

    monkeypatch.setattr(type(store), "put", full_disk_for_n2)
    with pytest.raises(OverlayBuildFailed) as caught:
        build_overlays(config)
    assert str(caught.value) == "ssh host keys for n2: No space left on device"
    summary = caught.value.summary
    assert summary["failed"].keys() == {"n2"} and summary["rebuilt"]["runtime"] == 2
    assert not list(host_key_dir(config, "n2").glob("ssh_*"))
    assert host_key_signature(config, "n2") is None


def test_a_key_type_listed_twice_is_made_once(state_dir):
    """Each listed type was written once per mention: the second write found the file
    (O_EXCL) and every node's runtime build failed with "File exists"."""
    write_inventory(state_dir)
    set_key_types(state_dir, "[ed25519, ecdsa, ed25519]")
    config = load_config(state_dir)
    assert build_overlays(config)["rebuilt"]["runtime"] == 3
    files = files_of(ensure_overlay(config, "n1", "runtime"))
    assert sorted(f for f in files if f.startswith("etc/ssh/ssh_host_") and
                  not f.endswith(".pub")) == ["etc/ssh/ssh_host_ecdsa_key",
                                              "etc/ssh/ssh_host_ed25519_key"]


def test_a_damaged_stored_key_fails_the_nodes_build_with_the_way_out(config, state_dir):
    """A stored key that is not text (a damaged disk, a bad restore) stopped the runtime
    build with a UnicodeDecodeError traceback (an API client got a 500)."""
    write_inventory(state_dir, count=1)
    ensure_host_keys(config, "n1")
    (host_key_dir(config, "n1") / "ssh_host_ed25519_key").write_bytes(b"\xff\xfe damaged")
    with pytest.raises(BuildFailed, match="secret rotate n1 ssh-host-keys") as raised:
        ensure_overlay(config, "n1", "runtime")
    assert "\n" not in str(raised.value)


def test_two_builders_replacing_a_key_cut_short_keep_one(config, monkeypatch):
    """A private key left empty by a cut write, replaced by two servers at once: the one
    that writes second takes the first one's key (it failed with StaleRevision)."""
    from provisiond.state.store import ABSENT

    store = open_store(config)
    key = "secrets/ssh-host-keys/n1/ssh_host_ed25519_key"
    store.put(key, b"")  # what a power cut before the data reached the disk leaves
    winner = ensure_host_keys(config, "n2")["ed25519"]["private"].encode()
    real_put = type(store).put

    def other_server_first(self, put_key, value, expect=None):
        if put_key == key and expect not in (None, ABSENT) and not self.get(key).value:
            real_put(self, key, winner)  # the other server's replacement lands first
        return real_put(self, put_key, value, expect)

    monkeypatch.setattr(type(store), "put", other_server_first)
    keys = ensure_host_keys(config, "n1")
    assert keys["ed25519"]["private"] == winner.decode()
    assert public_of(host_key_dir(config, "n1") / "ssh_host_ed25519_key") == \
        keys["ed25519"]["public"].split()[1]
