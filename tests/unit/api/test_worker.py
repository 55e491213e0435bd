"""The gunicorn worker's socket: kernel sendfile under gevent, and bounded waits."""

import json
import os

import gevent
import pytest
from gevent import socket as gsocket

from provisiond.api import worker


@pytest.fixture
def pair():
    ours, peer = gsocket.socketpair()
    ours.__class__ = worker.SendfileSocket  # as BootWorker.handle does
    ours.settimeout(5)
    yield ours, peer
    ours.close()
    peer.close()


def read_exactly(sock, size: int) -> bytes:
    data = bytearray()
    while len(data) < size and (chunk := sock.recv(1 << 20)):
        data += chunk
    return bytes(data)


def test_sendfile_sends_the_range_with_os_sendfile(pair, tmp_path, monkeypatch):
    ours, peer = pair
    data = os.urandom(8 << 20)  # larger than a socket buffer: sendfile must wait and resume
    (tmp_path / "blob").write_bytes(data)
    calls = []
    real = os.sendfile
    monkeypatch.setattr(worker.os, "sendfile", lambda *args: calls.append(args) or real(*args))
    reader = gevent.spawn(read_exactly, peer, len(data) - 2000)
    with open(tmp_path / "blob", "rb") as handle:
        sent = ours.sendfile(handle, offset=1000, count=len(data) - 2000)
        assert handle.tell() == len(data) - 1000
    assert sent == len(data) - 2000
    assert reader.get(timeout=10) == data[1000:-1000]
    assert len(calls) > 1 and calls[0][2] == 1000  # in several calls, from the offset


def test_a_peer_that_stops_reading_ends_the_send_as_a_reset(pair, tmp_path):
    ours, _ = pair
    ours.settimeout(0.2)
    (tmp_path / "blob").write_bytes(b"x" * (16 << 20))
    with open(tmp_path / "blob", "rb") as handle, pytest.raises(ConnectionResetError):
        ours.sendfile(handle, 0, 16 << 20)


def test_a_silent_peer_ends_a_receive_as_a_reset(pair):
    ours, _ = pair
    ours.settimeout(0.2)
    with pytest.raises(ConnectionResetError):
        ours.recv(10)


def test_a_peer_that_stops_reading_ends_a_sendall_as_a_reset(pair):
    """Responses not sent with sendfile (ranges, scripts, errors) go through sendall."""
    ours, _ = pair
    ours.settimeout(0.2)
    with pytest.raises(ConnectionResetError):
        ours.sendall(b"x" * (16 << 20))


def test_gunicorn_error_pages_become_the_api_json_errors():
    page = b"HTTP/1.1 414 URI Too Long\r\nConnection: close\r\n\r\n<html>...</html>"
    head, _, body = worker.json_error(page, ValueError("line too large")).partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"HTTP/1.1 414 URI Too Long"
    assert f"Content-Length: {len(body)}".encode() in head
    assert json.loads(body) == {"error": {"code": "uri_too_long", "field": None,
                                          "message": "URI Too Long: line too large"}}
    crash = worker.json_error(b"HTTP/1.1 500 Internal Server Error\r\n\r\n", KeyError("/etc"))
    assert json.loads(crash.partition(b"\r\n\r\n")[2]) == {
        "error": {"code": "internal", "message": "internal error", "field": None}}
