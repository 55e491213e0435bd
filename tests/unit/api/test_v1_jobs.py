"""Jobs and events through /api/v1 with Flask's test client on a real state dir (the runners
are real processes): roles, 202 + Location, 409 naming the busy job, bad input as the one
error shape with nothing stored, pages, the audit record, SSE resume and its bound."""

from __future__ import annotations

import json
import time

import pytest

from provisiond import audit, events
from provisiond.api.v1 import events as stream_module
from provisiond.auth import Role
from provisiond.config import load_config
from provisiond.jobs import store
from v1helpers import Api, assert_error

OPERATOR = Role.OPERATOR


@pytest.fixture
def api(cli, config):
    assert cli("node", "add", "n[01-04]", "--bmc-driver", "fake", "--bmc-address", "bmc").code == 0
    return Api(config)


def post(api, path: str, body=None, role=OPERATOR, **kwargs):
    return api.call(role, "POST", path, json=body, **kwargs)


def wait_done(api, job_id: int, deadline: float = 60) -> dict:
    end = time.monotonic() + deadline
    while True:
        job = api.call(Role.READER, "GET", f"/api/v1/jobs/{job_id}").json
        if job["state"] in ("finished", "failed"):
            return job
        assert time.monotonic() < end, store.log_path(api.config, job_id).read_text()
        time.sleep(0.05)


def test_power_is_a_job_with_a_result_per_node(api):
    response = post(api, "/api/v1/power", {"names": "n[01-04]", "action": "on"})
    assert response.status_code == 202, response.json
    job = response.json
    assert response.headers["Location"] == f"/api/v1/jobs/{job['id']}"
    assert (job["kind"], job["target"], job["actor"]) == ("power", "n[01-04]",
                                                          "token:test-operator")
    assert job["params"] == {"action": "on", "timeout": None}
    done = wait_done(api, job["id"])
    assert done["state"] == "finished" and done["message"] is None
    assert [(r["name"], r["result"], r["detail"]) for r in done["results"]] == [
        (f"n0{i}", "ok", "on requested") for i in range(1, 5)]
    entry = audit.read(api.config)[-1]
    assert (entry["actor"], entry["action"], entry["target"]) == (
        "token:test-operator", "job.power", "n[01-04]")


def test_a_busy_node_is_409_naming_the_job(api, monkeypatch):
    monkeypatch.setattr("provisiond.jobs.runner.spawn", lambda config, job_id: 1)  # init: alive
    first = post(api, "/api/v1/bootdev", {"names": "n[01-02]", "device": "pxe"}).json
    error = assert_error(post(api, "/api/v1/power", {"names": "n02", "action": "off"}),
                         409, "conflict")
    assert error["message"] == (f"node n02 is busy: job {first['id']} (bootdev n[01-02], by "
                                "token:test-operator) is pending")
    assert post(api, "/api/v1/power", {"names": "n03", "action": "off"}).status_code == 202


@pytest.mark.parametrize("path, body, status, code, field", [
    ("/api/v1/power", {"names": "n01", "action": "explode"}, 400, "invalid_input", "action"),
    ("/api/v1/power", {"names": "n01", "action": "on", "force": 1}, 400, "invalid_input",
     "force"),
    ("/api/v1/power", {"action": "on"}, 400, "invalid_input", "names"),
    ("/api/v1/power", {"names": "n01", "action": "on", "timeout": -1}, 400, "invalid_input",
     "timeout"),
    ("/api/v1/power", {"names": "n[01-", "action": "on"}, 400, "invalid_input", None),
    ("/api/v1/power", {"names": "n[01-09]", "action": "on"}, 404, "not_found", None),
    ("/api/v1/bootdev", {"names": "n01", "device": "floppy"}, 400, "invalid_input", "device"),
    ("/api/v1/firmware/update", {"names": "n01", "image": "ftp://h/f.bin"}, 400,
     "invalid_input", "image"),
    ("/api/v1/reprovision", {"names": "n01", "timeout": "soon"}, 400, "invalid_input",
     "timeout"),
    ("/api/v1/images/nosuch/build", None, 404, "not_found", None),
    ("/api/v1/images/Bad_Name/build", None, 400, "invalid_input", None),
    ("/api/v1/overlays/build?names=x9", None, 404, "not_found", None),
    ("/api/v1/overlays/build?force=1", None, 400, "invalid_input", "force"),
])
def test_bad_requests_are_one_error_and_store_nothing(api, path, body, status, code, field):
    response = post(api, path, body) if body is not None else post(api, path)
    assert_error(response, status, code, field)
    assert store.job_ids(api.config) == []


def test_a_refused_firmware_url_is_shown_without_its_password(api):
    for image in ("ftp://fw:pw-S3cret@h/f.bin", "http://fw:pw-S3cret@h/a\nb.bin"):
        response = post(api, "/api/v1/firmware/update", {"names": "n01", "image": image})
        error = assert_error(response, 400, "invalid_input", "image")
        assert "not an http(s) URL" in error["message"]
        assert "S3cret" not in response.get_data(as_text=True)
    assert store.job_ids(api.config) == []


def test_a_firmware_job_keeps_the_urls_password_off_its_record(api):
    response = post(api, "/api/v1/firmware/update",
                    {"names": "n01", "image": "http://fw:pw-S3cret@127.0.0.1/f.bin"})
    assert response.status_code == 202, response.json
    done = wait_done(api, response.json["id"])
    assert done["state"] == "finished" and done["params"]["image"] == "http://127.0.0.1/f.bin"
    assert "S3cret" not in store.job_path(api.config, done["id"]).read_text()
    listed = api.call(Role.READER, "GET", "/api/v1/jobs")
    assert "S3cret" not in repr([response.json, done, listed.get_data(as_text=True)])


def test_roles(api):
    body = {"names": "n01", "action": "on"}
    assert_error(post(api, "/api/v1/power", body, role=None), 401, "unauthenticated")
    assert_error(post(api, "/api/v1/power", body, role=Role.READER), 403, "forbidden")
    assert_error(post(api, "/api/v1/overlays/build", role=Role.READER), 403, "forbidden")
    assert_error(api.call(None, "GET", "/api/v1/jobs"), 401, "unauthenticated")
    assert_error(api.call(None, "GET", "/api/v1/events"), 401, "unauthenticated")
    assert store.job_ids(api.config) == []


def test_builds_are_jobs(api, monkeypatch):
    response = post(api, "/api/v1/overlays/build")
    assert response.status_code == 202, response.json
    done = wait_done(api, response.json["id"])
    assert done["params"] == {"all": True} and done["state"] == "finished", done
    assert [r["name"] for r in done["results"]] == ["n01", "n02", "n03", "n04"]
    one = post(api, "/api/v1/overlays/build?names=n02").json
    assert (one["target"], one["params"]) == ("n02", {"all": False})
    wait_done(api, one["id"])
    monkeypatch.setattr("provisiond.jobs.runner.spawn", lambda config, job_id: 1)  # no build
    image = post(api, "/api/v1/images/tiny/build?no_cache=true")
    assert image.status_code == 202 and image.json["params"] == {"no_cache": True}
    assert image.json["kind"] == "image-build" and image.json["target"] == "tiny"


def test_jobs_page_newest_first(api):
    ids = []
    for i in range(1, 5):
        job = post(api, "/api/v1/power", {"names": f"n0{i}", "action": "status"}).json
        ids.append(wait_done(api, job["id"])["id"])
    seen, token = [], None
    while True:
        query = {"limit": 3, **({"continue": token} if token else {})}
        page = api.call(Role.READER, "GET", "/api/v1/jobs", query_string=query).json
        seen += [job["id"] for job in page["items"]]
        token = page["continue"]
        if token is None:
            break
    assert seen == ids[::-1]
    kinds = api.call(Role.READER, "GET", "/api/v1/jobs?kind=bootdev").json
    assert kinds == {"items": [], "continue": None}
    assert_error(api.call(Role.READER, "GET", "/api/v1/jobs?continue=bm9wZQ"), 400,
                 "invalid_input", "continue")
    assert_error(api.call(Role.READER, "GET", "/api/v1/jobs?limit=0"), 400, "invalid_input",
                 "limit")
    for missing in ("999", "x1", "1e3", "٣", "9" * 40):
        assert_error(api.call(Role.READER, "GET", f"/api/v1/jobs/{missing}"), 404, "not_found")


def sse(response) -> list[dict]:
    """The messages in the first chunks of a streamed answer (read until one holds data)."""
    text = ""
    for chunk in response.response:
        text += chunk.decode() if isinstance(chunk, bytes) else chunk
        if "data: " in text:
            break
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def test_events_resume_after_the_last_id(api):
    ids = [events.emit(api.config, "test.tick", None, {"i": i}) for i in range(4)]
    response = api.call(Role.READER, "GET", "/api/v1/events",
                        headers={"Last-Event-ID": str(ids[1])}, buffered=False)
    try:
        assert response.status_code == 200
        assert response.mimetype == "text/event-stream"
        assert [m["id"] for m in sse(response)] == ids[2:]
    finally:
        response.close()
    response = api.call(Role.READER, "GET", f"/api/v1/events?after={ids[2]}&kinds=test.",
                        buffered=False)
    try:
        assert [m["id"] for m in sse(response)] == ids[3:]
    finally:
        response.close()
    assert_error(api.call(Role.READER, "GET", "/api/v1/events",
                          headers={"Last-Event-ID": "x"}), 400, "invalid_input")
    assert_error(api.call(Role.READER, "GET", "/api/v1/events?after=-1"), 400,
                 "invalid_input", "after")


def test_streams_per_worker_are_bounded(api, state_dir):
    (state_dir / "provisiond.yaml").write_text("http:\n  event_streams: 2\n")
    api.app.config["PROVISIOND"] = load_config(state_dir)
    bounded = api
    events.emit(bounded.config, "test.tick")
    opened = [bounded.call(Role.READER, "GET", "/api/v1/events?after=0", buffered=False)
              for _ in range(2)]
    try:
        assert all(r.status_code == 200 for r in opened)
        assert_error(bounded.call(Role.READER, "GET", "/api/v1/events"), 503, "unavailable")
        opened.pop().close()
        again = bounded.call(Role.READER, "GET", "/api/v1/events?after=0", buffered=False)
        opened.append(again)
        assert again.status_code == 200
    finally:
        for response in opened:
            response.close()
    assert stream_module.SLOTS.used == 0
