"""Whole blobs are answered in front of Flask, with the headers Flask's view sends."""

import pytest
from werkzeug.test import Client

from bootdata import add_blob, add_image, add_nodes, ip_of
from provisiond.api import create_app
from provisiond.status import read_status


@pytest.fixture
def app(config):
    add_nodes(config, 2)
    return create_app(config)


def test_a_whole_blob_does_not_go_through_flask(app, config, monkeypatch):
    digest = add_blob(config, b"x" * 5000)[7:]
    monkeypatch.setattr(app, "full_dispatch_request", lambda: pytest.fail("went through Flask"))
    response = app.test_client().get(f"/blobs/sha256/{digest}")
    assert response.status_code == 200 and response.data == b"x" * 5000


def test_whole_blob_headers_are_those_of_the_flask_view(app, config):
    digest = add_blob(config, b"y" * 777)[7:]
    fast = app.test_client().get(f"/blobs/sha256/{digest}")
    flask = Client(app.wsgi_app.app).get(f"/blobs/sha256/{digest}")  # the view itself
    assert flask.status_code == fast.status_code == 200 and fast.data == flask.data
    ours, theirs = dict(fast.headers), dict(flask.headers)
    assert ours.pop("Date", None) is None  # gunicorn adds it; the view adds its own
    theirs.pop("Date")
    assert ours.pop("Expires")[-4:] == theirs.pop("Expires")[-4:] == " GMT"  # a year on
    assert ours == theirs


def test_kernel_through_the_fast_path_is_the_kernel_phase(app, config):
    manifest = add_image(config, "tiny")
    client = app.test_client()
    client.get(f"/blobs/sha256/{manifest['kernel']['digest'][7:]}",
               environ_base={"REMOTE_ADDR": ip_of(2)})
    app.extensions["provisiond"].phases.flush()
    assert read_status(config, "n2")["phase"] == "kernel"
