"""Secret values sealed for etcd: AES-GCM under the server's key file."""

from __future__ import annotations

import os
import stat

import pytest

from provisiond.state.crypt import SecretBox, StoreKeyError, create_key, read_key


def test_a_sealed_value_opens_with_its_key_and_name_only(tmp_path):
    box = SecretBox(create_key(tmp_path / "store.key"), tmp_path / "store.key")
    sealed = box.seal("secrets.yaml", b"password: hunter2\n")
    assert b"hunter2" not in sealed
    assert box.seal("secrets.yaml", b"password: hunter2\n") != sealed  # a nonce each
    assert box.open("secrets.yaml", sealed) == b"password: hunter2\n"
    with pytest.raises(StoreKeyError, match="does not decrypt"):
        box.open("secrets/nodes/n1.json", sealed)  # moved under another key
    other = SecretBox(create_key(tmp_path / "other.key"), tmp_path / "other.key")
    with pytest.raises(StoreKeyError, match=r"sealed with store key \w{16}, but .*other.key "
                                            r"is key \w{16}: copy store.key"):
        other.open("secrets.yaml", sealed)


def test_a_damaged_or_plain_value_is_one_clear_error(tmp_path):
    box = SecretBox(create_key(tmp_path / "store.key"), tmp_path / "store.key")
    sealed = bytearray(box.seal("secrets.yaml", b"x"))
    sealed[-1] ^= 1
    with pytest.raises(StoreKeyError, match="does not decrypt"):
        box.open("secrets.yaml", bytes(sealed))
    with pytest.raises(StoreKeyError, match="unencrypted"):
        box.open("secrets.yaml", b"password: hunter2\n")


def test_the_key_file_is_private_and_never_replaced(tmp_path):
    path = tmp_path / "state" / "store.key"
    key = create_key(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert read_key(path) == key
    assert create_key(path) == key  # another process's key, already there, wins
    assert read_key(tmp_path / "missing.key") is None
    assert [p.name for p in path.parent.iterdir()] == ["store.key"]  # no temp file left


@pytest.mark.parametrize("text", ["not base64!", "c2hvcnQ=", ""])
def test_a_key_file_that_is_no_key_is_refused(tmp_path, text):
    (tmp_path / "store.key").write_text(text)
    with pytest.raises(StoreKeyError, match="not a store key"):
        read_key(tmp_path / "store.key")
