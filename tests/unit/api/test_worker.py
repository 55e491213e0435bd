"""The gunicorn worker's socket: kernel sendfile under gevent, and bounded waits."""

import json
import os

import gevent
import pytest
from gevent import socket as gsocket

from provisiond.api import worker
from provisiond.boot import supervisor
from provisiond.config import load_config, write_default_config


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
    with pytest.raises(ConnectionResetError, match="client idle for 0.2 s"):
        ours.recv(10)


@pytest.mark.parametrize("passed, seconds", [(None, 30.0), ("12.5", 12.5), ("0", 30.0),
                                             ("soon", 30.0)])
def test_the_client_timeout_is_the_one_serve_passes_else_the_default(monkeypatch, passed,
                                                                      seconds):
    monkeypatch.delenv(worker.CLIENT_TIMEOUT_ENV, raising=False)
    if passed is not None:
        monkeypatch.setenv(worker.CLIENT_TIMEOUT_ENV, passed)
    assert worker.client_timeout() == seconds


def test_serve_passes_http_client_timeout_to_its_gunicorns(state_dir, monkeypatch):
    write_default_config(state_dir)
    assert load_config(state_dir).http.client_timeout == 30.0  # the default
    text = (state_dir / "provisiond.yaml").read_text()
    assert "client_timeout: 30 " in text  # documented in the file serve reads
    (state_dir / "provisiond.yaml").write_text(text.replace("client_timeout: 30 ",
                                                            "client_timeout: 7.5 "))
    environments = []

    class Started:
        pid = 1

    monkeypatch.setattr(supervisor.subprocess, "Popen",
                        lambda command, env, pass_fds: environments.append(env) or Started())
    run = supervisor.Supervisor.__new__(supervisor.Supervisor)  # no sockets, no services
    run.config, run.gunicorns = load_config(state_dir), {}
    run.phases = type("Phases", (), {"fd": 0})()
    run._start_http("all")
    monkeypatch.setenv(worker.CLIENT_TIMEOUT_ENV, environments[0][worker.CLIENT_TIMEOUT_ENV])
    assert worker.client_timeout() == 7.5  # what the worker then reads
