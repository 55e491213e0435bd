"""`provisiond job list|show|wait`: the jobs store as the API's job routes read it, for jobs
the API started (a runner process) and jobs the CLI ran."""

from __future__ import annotations

import json

import pytest

from provisiond import jobs
from provisiond.audit import cli_actor
from provisiond.errors import ExitCode
from provisiond.jobs import store
from provisiond.states import JobKind


@pytest.fixture
def nodes(cli):
    assert cli("node", "add", "n[1-3]", "--bmc-driver", "fake", "--bmc-address", "bmc").code == 0
    assert cli("node", "add", "n9", "--bmc-driver", "fake", "--bmc-address",
               "unreachable").code == 0
    return cli


def test_list_shows_api_and_cli_jobs_newest_first(nodes, config):
    assert nodes("power", "on", "n[1-2]").code == 0
    api = jobs.start(config, JobKind.POWER, ["n3"], {"action": "off"}, "token:sync")
    assert nodes("job", "wait", str(api["id"])).code == 0
    result = nodes("job", "list")
    assert result.code == 0, result.err
    header, *rows = [line.split() for line in result.out.splitlines()]
    assert header == ["ID", "KIND", "TARGET", "STATE", "ACTOR", "CREATED", "RESULTS"]
    assert [(r[0], r[1], r[2], r[3], r[4]) for r in rows] == [
        ("2", "power", "n3", "finished", "token:sync"),
        ("1", "power", "n[1-2]", "finished", cli_actor())]
    assert result.out.splitlines()[2].endswith("2 ok, 0 error of 2")
    listed = json.loads(nodes("job", "list", "--json", "--limit", "1").out)
    assert [j["id"] for j in listed["items"]] == [2] and listed["before"] == 2
    older = json.loads(nodes("job", "list", "--json", "--before", "2").out)
    assert [j["id"] for j in older["items"]] == [1] and older["before"] is None
    assert json.loads(nodes("job", "list", "--json", "--state", "failed").out)["items"] == []


def test_show_prints_the_record_and_each_result(nodes, config):
    assert nodes("power", "off", "n[1,9]").code == ExitCode.BMC_FAILED
    result = nodes("job", "show", "1")
    assert result.code == ExitCode.BMC_FAILED
    lines = result.out.splitlines()
    assert lines[:4] == ["id: 1", "kind: power", "target: n[1,9]", "state: failed"]
    assert "message: 1 of 2 failed; n9: fake BMC of n9 is unreachable" in lines
    results = {line.split()[0]: line.split()[1] for line in lines[lines.index(
        next(line for line in lines if line.startswith("NAME"))) + 1:]}
    assert results == {"n1": "ok", "n9": "error"}
    record = json.loads(nodes("job", "show", "1", "--json").out)
    assert record == jobs.get(config, 1)


def test_wait_follows_an_api_job_to_its_end_and_exits_by_its_results(nodes, config):
    good = jobs.start(config, JobKind.POWER, ["n[1-2]"], {"action": "on"}, "token:sync")
    waited = nodes("job", "wait", str(good["id"]), "--json")
    assert waited.code == 0, waited.err
    record = json.loads(waited.out)
    assert record["state"] == "finished" and [r["result"] for r in record["results"]] == [
        "ok", "ok"]
    bad = jobs.start(config, JobKind.BOOTDEV, ["n[3,9]"], {"device": "pxe"}, "token:sync")
    waited = nodes("job", "wait", str(bad["id"]))
    assert waited.code == ExitCode.BMC_FAILED, waited.err
    assert "state: failed" in waited.out.splitlines()


def test_wait_gives_up_at_its_timeout_in_one_line(nodes, config):
    pending = store.create(config, JobKind.POWER, ["n1"], {"action": "on"}, "token:sync")
    result = nodes("job", "wait", str(pending.id), "--timeout", "0.3")
    assert result.code == ExitCode.FAILED and result.out == ""
    assert result.err.strip() == (f"provisiond: error: job {pending.id} (power n1) is still "
                                  "pending after 0.3 s")


@pytest.mark.parametrize("argv, code, message", [
    (["show", "99"], ExitCode.NOT_FOUND, "no job 99 (the last 1000 ended jobs are kept, up to 256 MiB of them)"),
    (["wait", "99"], ExitCode.NOT_FOUND, "no job 99 (the last 1000 ended jobs are kept, up to 256 MiB of them)"),
    (["list", "--limit", "0"], ExitCode.INVALID_INPUT, "limit must be 1-1000"),
])
def test_bad_requests_are_one_line(nodes, argv, code, message):
    result = nodes("job", *argv)
    assert result.code == code and result.err.strip() == f"provisiond: error: {message}"
