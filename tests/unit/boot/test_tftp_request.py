"""TFTP read requests: parsing, option negotiation, names under the root; the setting."""

from __future__ import annotations

import pytest

from provisiond.boot.tftp_request import (ACCESS_VIOLATION, ILLEGAL, MAX_BLKSIZE, MAX_WINDOW,
                                          NOT_FOUND, Refused, negotiate, open_under,
                                          parse_request)


def test_parse_request_reads_name_mode_and_options():
    packet = b"\0\1undionly.kpxe\0OCTET\0BLKSIZE\x001468\0tsize\x000\0"
    assert parse_request(packet) == ("undionly.kpxe", "OCTET",
                                     {"blksize": "1468", "tsize": "0"})


@pytest.mark.parametrize("packet, code", [
    (b"\0\2x\0octet\0", ACCESS_VIOLATION),           # a write
    (b"\0\1x\0octet", ILLEGAL),                      # not NUL-terminated
    (b"\0\1x\0mail\0", ILLEGAL),                     # mode not served
    (b"\0\1\xff\xfe\0octet\0", ILLEGAL),             # not UTF-8
    (b"\0\1a/../../b\0octet\0", ACCESS_VIOLATION),
    (b"\0\1/etc/passwd\0octet\0", ACCESS_VIOLATION),
])
def test_parse_request_refuses(packet, code):
    with pytest.raises(Refused) as refused:
        parse_request(packet)
    assert refused.value.code == code


def test_negotiate_lowers_what_is_too_big_and_drops_what_is_bad():
    asked = {"blksize": "99999", "windowsize": "1000", "timeout": "300", "tsize": "0",
             "multicast": ""}
    assert negotiate(asked, 1234) == {"blksize": MAX_BLKSIZE, "windowsize": MAX_WINDOW,
                                      "tsize": 1234}
    assert negotiate({"blksize": "7", "timeout": "x", "windowsize": "0"}, 5) == {}
    assert negotiate({"blksize": "1468", "timeout": "3"}, 5) == {"blksize": 1468, "timeout": 3}


def test_open_under_keeps_to_the_root(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret").write_text("x")
    (root / "out").symlink_to(outside / "secret")
    (root / "dir").mkdir()
    with pytest.raises(Refused) as refused:
        open_under(str(root), "out")
    assert refused.value.code == ACCESS_VIOLATION
    for name in ("dir", "missing"):
        with pytest.raises(Refused) as refused:
            open_under(str(root), name)
        assert refused.value.code == NOT_FOUND


def test_sessions_per_client_is_a_setting_of_at_least_one(tmp_path):
    from provisiond.config import load_config, write_default_config
    from provisiond.errors import InvalidConfig

    write_default_config(tmp_path)
    assert load_config(tmp_path).tftp.sessions_per_client == 8
    (tmp_path / "provisiond.yaml").write_text("tftp: {sessions_per_client: 0}\n")
    with pytest.raises(InvalidConfig, match="sessions_per_client.*0 is outside 1-256"):
        load_config(tmp_path)


@pytest.mark.parametrize("value", ["\u00b2", "9" * 5000, "\u0661\u0664\u0666\u0668", "-8", " 8"])
def test_negotiate_drops_a_value_that_is_not_ascii_digits(value):
    assert negotiate({"blksize": value, "windowsize": value, "timeout": value}, 5) == {}


@pytest.mark.parametrize("name", ["file/x", "a" * 300, "loop"])
def test_open_under_refuses_what_open_cannot_open(tmp_path, name):
    """ENOTDIR, ENAMETOOLONG, ELOOP: file not found (an OSError would drop the request)."""
    (tmp_path / "file").write_text("x")
    (tmp_path / "loop").symlink_to("loop")
    with pytest.raises(Refused) as refused:
        open_under(str(tmp_path), name)
    assert refused.value.code == NOT_FOUND
