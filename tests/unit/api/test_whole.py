"""Whole blobs and overlays are answered in front of Flask, with the headers of its views."""

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


@pytest.mark.parametrize("what", ["blob", "shared", "system"])
def test_whole_file_headers_are_those_of_the_flask_view(app, config, what):
    url = f"/blobs/sha256/{add_blob(config, b'y' * 777)[7:]}" if what == "blob" else \
        f"/overlays/n1/{what}"
    fast = app.test_client().get(url)
    flask = Client(app.wsgi_app.app).get(url)  # the view itself
    assert flask.status_code == fast.status_code == 200 and fast.data == flask.data
    ours, theirs = dict(fast.headers), dict(flask.headers)
    assert ours.pop("Date", None) is None  # gunicorn adds it; the view adds its own
    theirs.pop("Date")
    assert ours.pop("Expires")[-4:] == theirs.pop("Expires")[-4:] == " GMT"  # may cross a second
    assert ours == theirs


def test_an_overlay_does_not_go_through_flask(app, config, monkeypatch):
    add_image(config, "tiny")
    expected = app.test_client().get("/overlays/n2/system").data
    monkeypatch.setattr(app, "full_dispatch_request", lambda: pytest.fail("went through Flask"))
    assert app.test_client().get("/overlays/n2/system").data == expected


def test_errors_and_conditions_are_left_to_the_views(app, config):
    client = app.test_client()
    assert client.get("/overlays/nobody/system").status_code == 404
    assert client.get("/blobs/sha256/" + "0" * 64).json["error"]["code"] == "not_found"
    system = client.get("/overlays/n1/system")
    again = client.get("/overlays/n1/system", headers={"If-None-Match": system.headers["ETag"]})
    assert again.status_code == 304


def test_kernel_through_the_fast_path_is_the_kernel_phase(app, config):
    manifest = add_image(config, "tiny")
    client = app.test_client()
    client.get(f"/blobs/sha256/{manifest['kernel']['digest'][7:]}",
               environ_base={"REMOTE_ADDR": ip_of(2)})
    app.extensions["provisiond"].phases.flush()
    assert read_status(config, "n2")["phase"] == "kernel"


@pytest.mark.parametrize("header", ["items=0-1", "bytes=0-1,5-6", "bytes=-1,-1"])
@pytest.mark.parametrize("what", ["blob", "system"])
def test_a_range_in_another_unit_or_several_ranges_get_the_whole_file(app, config, what, header):
    """RFC 9110 14.2: an unknown range unit must be ignored, and several ranges may be; 416
    says none of them overlaps the file, which is not so."""
    url = f"/blobs/sha256/{add_blob(config, b'z' * 100)[7:]}" if what == "blob" else \
        "/overlays/n1/system"
    whole = app.test_client().get(url)
    response = app.test_client().get(url, headers={"Range": header})
    assert response.status_code == 200 and response.data == whole.data
    assert app.test_client().get(url, headers={"Range": "bytes=1000000-"}).status_code == 416


@pytest.mark.parametrize("what", ["blob", "system"])
def test_methods_and_every_condition_are_answered_as_http_requires(app, config, what):
    """What the fast path must leave to the views: each would be a plain 200 there."""
    url = f"/blobs/sha256/{add_blob(config, b'w' * 100)[7:]}" if what == "blob" else \
        "/overlays/n1/system"
    client = app.test_client()
    whole = client.get(url)
    etag, modified = whole.headers["ETag"], whole.headers["Last-Modified"]
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        response = client.open(url, method=method)
        assert response.status_code == 405 and response.json["error"]["code"] == "method_not_allowed"
        assert set(response.headers["Allow"].split(", ")) >= {"GET", "HEAD"}
    head = client.head(url)
    assert head.status_code == 200 and head.data == b""
    assert head.headers["Content-Length"] == str(len(whole.data)) and head.headers["ETag"] == etag
    assert client.get(url, headers={"If-Modified-Since": modified}).status_code == 304
    assert client.get(url, headers={"If-Match": '"other"'}).status_code == 412
    ranged = client.get(url, headers={"Range": "bytes=-10", "If-Range": etag})
    assert ranged.status_code == 206 and ranged.data == whole.data[-10:]
    assert ranged.headers["Content-Range"] == f"bytes {len(whole.data) - 10}-" \
        f"{len(whole.data) - 1}/{len(whole.data)}"
    stale = client.get(url, headers={"Range": "bytes=-10", "If-Range": '"other"'})
    assert stale.status_code == 200 and stale.data == whole.data
