"""`power`, `bootdev`, `firmware update` and `node reprovision` from the CLI run as jobs in the
CLI's process (provisiond.jobs.run_here): audited as the local user, told to the event
journal as the API's jobs are, and refused while an API job holds a node."""

from __future__ import annotations

import io
import sys

import pytest

from provisiond import audit, events, jobs
from provisiond.audit import cli_actor
from provisiond.errors import ExitCode
from provisiond.jobs import store
from provisiond.power.fake import read_fake_bmcs
from provisiond.states import JobKind, JobState
from tests.waits import wait_until


@pytest.fixture
def nodes(cli):
    assert cli("node", "add", "n[1-3]", "--bmc-driver", "fake", "--bmc-address", "bmc").code == 0
    return cli


def job_events(config, job_id: int) -> list:
    return [e for e in events.read_since(config, 0, kinds=frozenset({"job."}))
            if e.subject == f"job/{job_id}"]


def runs(kinds: list[str]) -> list[str]:
    return [k for i, k in enumerate(kinds) if not i or kinds[i - 1] != k]


@pytest.mark.parametrize("argv, action, target, changes", [
    (["power", "on", "n[1-2]"], "job.power", "n[1-2]", {"action": "on", "timeout": None}),
    (["power", "status", "n1"], "job.power", "n1", {"action": "status", "timeout": None}),
    (["bootdev", "pxe", "n2", "--uefi"], "job.bootdev", "n2",
     {"device": "pxe", "persistent": False, "uefi": True, "timeout": None}),
    (["firmware", "update", "n3", "--image", "http://u:pw@127.0.0.1/b.bin"],
     "job.firmware-update", "n3", {"image": "http://127.0.0.1/b.bin", "timeout": 1800.0}),
    (["node", "reprovision", "n1", "--timeout", "0.2"], "job.reprovision", "n1",
     {"timeout": 0.2, "wait": True}),
])
def test_each_bmc_command_is_audited_as_the_local_user(nodes, config, argv, action, target,
                                                       changes):
    nodes(*argv)
    entry = audit.read(config, action=action)[-1]
    assert (entry["actor"], entry["target"]) == (cli_actor(), target)
    assert entry["changes"] == {"job": 1, **changes}  # a URL's password is never recorded
    job = jobs.get(config, 1)
    assert job["actor"] == cli_actor() and job["state"] in ("finished", "failed")


def test_a_firmware_urls_password_is_in_no_job_document_shown(nodes, config):
    """The audit record left it out; the job record, which every reader may list (`job
    show`, GET /api/v1/jobs), showed it. The BMC still gets the whole URL."""
    url = "http://u:pw-s3cret@127.0.0.1/b.bin"
    assert nodes("firmware", "update", "n3", "--image", url).code == 0
    assert read_fake_bmcs(config.state_dir / "power" / "fake-bmcs.json")["n3"][
        "last_image"] == url
    started = jobs.start(config, JobKind.FIRMWARE_UPDATE, ["n2"], {"image": url}, "token:op")
    wait_until(lambda: not store.get(config, started["id"]).active, 60, "the API's job ends")
    shown = [started, jobs.get(config, 1), jobs.wait(config, 1, 5), jobs.list_jobs(config)[0],
             nodes("job", "show", "1", "--json").out, nodes("job", "list", "--json").out]
    assert "s3cret" not in repr(shown)
    assert jobs.get(config, 1)["params"]["image"] == "http://127.0.0.1/b.bin"


def test_a_cli_power_tells_the_journal_what_an_api_power_job_does(nodes, config):
    result = nodes("power", "on", "n[1-2]")
    assert result.code == 0, result.err
    started = jobs.start(config, JobKind.POWER, ["n3"], {"action": "on"}, "token:sync")
    wait_until(lambda: job_events(config, started["id"])[-1:] and job_events(
        config, started["id"])[-1].kind == "job.finished", 60, "the API's job ends")
    cli_events, api_events = job_events(config, 1), job_events(config, started["id"])
    # results come in batches: two nodes may make two job.progress events
    assert runs([e.kind for e in cli_events]) == runs([e.kind for e in api_events]) == [
        "job.started", "job.progress", "job.finished"]
    for kind in ("job.started", "job.progress", "job.finished"):
        ours = [e.data.keys() for e in cli_events if e.kind == kind]
        assert ours == [[e.data.keys() for e in api_events if e.kind == kind][0]] * len(ours)
    assert cli_events[0].data["actor"] == cli_actor() and cli_events[0].data["kind"] == "power"
    assert cli_events[-1].data["state"] == "finished"
    assert sorted(r["name"] for e in cli_events[1:-1] for r in e.data["results"]) == ["n1", "n2"]


def test_a_failed_node_fails_the_job_and_the_exit(nodes, config):
    nodes("node", "add", "n9", "--bmc-driver", "fake", "--bmc-address", "unreachable")
    result = nodes("power", "off", "n[1,9]")
    assert result.code == ExitCode.BMC_FAILED
    job = store.get(config, 1)
    assert job.state is JobState.FAILED and job.message.startswith("1 of 2 failed; n9:")
    assert job_events(config, 1)[-1].data["error"] == 1


def test_a_node_an_api_job_holds_is_refused_in_one_line(nodes, config):
    held = store.create(config, JobKind.POWER, ["n2"], {"action": "cycle"}, "token:sync")
    result = nodes("power", "on", "n[1-3]")
    assert result.code == ExitCode.CONFLICT and result.out == ""
    assert result.err.strip() == (f"provisiond: error: node n2 is busy: job {held.id} (power n2, "
                                  "by token:sync) is pending")
    assert read_fake_bmcs(config.state_dir / "power" / "fake-bmcs.json") == {}
    assert audit.read(config, action="job.power") == []


def test_bad_params_are_one_line_and_store_nothing(nodes, config):
    result = nodes("power", "on", "n1", "--timeout", "0")
    assert result.code == ExitCode.INVALID_INPUT
    assert result.err.strip() == "provisiond: error: timeout: 0.0 is outside 0.1-86400"
    assert store.job_ids(config) == [] and audit.read(config, action="job.power") == []


def test_a_firmware_urls_password_from_stdin_reaches_the_bmc_only(nodes, config, monkeypatch):
    """--image-password-stdin: the password never in argv (`ps`), percent-encoded into the
    URL the BMC gets, and in no output nor record."""
    monkeypatch.setattr("sys.stdin", io.StringIO("pw/S3cret@x:y\n"))
    result = nodes("firmware", "update", "n3", "--image", "http://fw@127.0.0.1/b.bin",
                   "--image-password-stdin", "--json")
    assert result.code == 0, result.err
    assert read_fake_bmcs(config.state_dir / "power" / "fake-bmcs.json")["n3"][
        "last_image"] == "http://fw:pw%2FS3cret%40x%3Ay@127.0.0.1/b.bin"
    assert "S3cret" not in result.out + result.err + store.job_path(config, 1).read_text()
    assert jobs.get(config, 1)["params"]["image"] == "http://127.0.0.1/b.bin"


@pytest.mark.parametrize("url, message", [
    ("http://127.0.0.1/b.bin", "'http://127.0.0.1/b.bin': a password needs a user in the URL "
     "(https://USER@host/file)"),
    ("http://fw:S3cret@127.0.0.1/b.bin",
     "'http://127.0.0.1/b.bin': the URL holds a password already: give it once"),
    ("ftp://fw@127.0.0.1/b.bin", "'ftp://127.0.0.1/b.bin': not an http(s) URL"),
    ("http://127.0.0.1/b.bin?sig=S3cret", "'http://127.0.0.1/b.bin?***': a password needs a "
     "user in the URL (https://USER@host/file)"),
])
def test_a_url_the_stdin_password_cannot_go_to_is_refused_before_reading_it(
        nodes, config, monkeypatch, url, message):
    monkeypatch.setattr("sys.stdin", io.StringIO("never-read"))
    result = nodes("firmware", "update", "n3", "--image", url, "--image-password-stdin")
    assert result.code == ExitCode.INVALID_INPUT
    assert result.err == f"provisiond: error: firmware image {message}\n"
    assert sys.stdin.read() == "never-read" and store.job_ids(config) == []


def test_an_empty_stdin_password_names_the_url_without_its_query(nodes, config, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("\n"))
    result = nodes("firmware", "update", "n3", "--image", "http://fw@127.0.0.1/b.bin?sig=S3cret",
                   "--image-password-stdin")
    assert result.code == ExitCode.INVALID_INPUT
    assert result.err == ("provisiond: error: password of fw for http://127.0.0.1/b.bin?***: "
                          "read an empty value from stdin\n")
