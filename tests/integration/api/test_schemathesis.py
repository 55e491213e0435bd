"""Issue 12's acceptance check: schemathesis (property-based, from the served OpenAPI
document) against a real `provisiond serve` on loopback, with no token, a reader token and
an admin token. Bounded by --max-examples; the seed is fixed (PROVISIOND_SCHEMATHESIS_SEED
picks another) so a failure reproduces.

Asserted: no answer is a 5xx, every answer's status, content type and body are the ones
the document declares for the operation, and no write is accepted without the admin (or
operator) role: every write by no token or a reader is a 4xx (the node's own routes, a
phase report and a token exchange, refuse a request without the node's credential), and
the inventory, tokens, secrets, jobs and audit log are byte for byte what they were.

Left out: `GET /events` with a token (a stream that ends only with the worker, each case
would wait for the request timeout), and from the admin run over every operation those that
start jobs (it writes nodes with BMC addresses the fuzzer makes up, outside loopback).
Job starts get an admin run of their own against a serve whose inventory that run cannot
change (only the job operations are tested): its nodes' BMCs are BMC emulators this test
starts on loopback (IPMI: pyghmi's, one process each; Redfish: sushy-tools over libvirt's
test driver, which never fetches a firmware URL), a body naming any other node is a 4xx,
and every job that ran named only those nodes. An image build is left out there too: it
runs debootstrap against a Debian mirror. Job runners still running at the end (a
reprovision waits for a boot that never comes) are stopped by their pid.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from provisiond.config import load_config
from provisiond.jobs import store
from servers import loopback_services, start_serve, stop_serve, wait_http, write_config
from tests.conftest import run_provisiond
from tests.integration.test_power_ipmi import PASSWORD as IPMI_PASSWORD, USER as IPMI_USER
from tests.integration.test_power_ipmi import bmc_processes, free_udp_ports
from tests.integration.test_power_redfish import PASSWORD as REDFISH_PASSWORD
from tests.integration.test_power_redfish import USER as REDFISH_USER
from tests.integration.test_power_redfish import libvirt_emulator  # noqa: F401 - a fixture

SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"
MAX_EXAMPLES = 5  # per operation (fuzzing); the coverage phase makes ~2,400 cases a run
SEED = os.environ.get("PROVISIOND_SCHEMATHESIS_SEED", "12")
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance," \
         "response_schema_conformance"
WRITES = ("POST", "PUT", "PATCH", "DELETE")
STATE_FILES = ("inventory.yaml", "tokens.json", "secrets.yaml", "audit/audit.jsonl", "jobs")
STREAMS = ("events_stream_events",)
BMC_JOBS = ("power_power", "power_bootdev", "power_firmware_update", "power_reprovision")
JOB_STARTS = (*BMC_JOBS, "builds_build_image", "builds_build_overlays")
JOB_READS = ("jobs_list_jobs", "jobs_get_job")
JOB_NODES = {"n1", "n2", "n3", "n4"}
JOB_HOOKS = Path(__file__).with_name("schemathesis_job_hooks.py")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    state = tmp_path_factory.mktemp("schemathesis") / "state"
    ports = loopback_services(state)
    write_config(state, tftp={"enabled": False}, dns={"enabled": False})
    tokens = {role: _make_token(state, role) for role in ("admin", "reader")}
    for args in (("profile", "add", "rack"), ("node", "add", "n[1-3]", "--profile", "rack",
                                              "--mac", "02:00:00:00:00:01", "--ipaddr",
                                              "10.0.0.11", "--netmask", "255.255.255.0")):
        made = run_provisiond(state, *args)
        assert made.returncode == 0, made.stderr
    made = run_provisiond(state, "secret", "set", "node", "n1", "bmc_password", input="pw\n")
    assert made.returncode == 0, made.stderr
    with serving(state, ports) as url:
        yield state, url, tokens


@contextlib.contextmanager
def serving(state: Path, ports: dict, before_stop=lambda: None):
    """`provisiond serve` on `state` until the block ends; the URL of its OpenAPI document
    (answering). `before_stop` runs first when it ends."""
    proc = start_serve(state)
    try:
        url = f"http://127.0.0.1:{ports['http']}/api/v1/openapi.json"
        wait_http(url, proc)
        yield url
    finally:
        before_stop()
        stop_serve(proc)


def _make_token(state: Path, role: str) -> str:
    made = run_provisiond(state, "token", "create", "--role", role, "--name", f"st-{role}")
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


def fuzz(url: str, token: str | None, report: Path, *args: str, checks: str = CHECKS,
         hooks: Path | None = None) -> list[dict]:
    """Run schemathesis over every operation of the document at `url` (with the `hooks`
    module); asserts it found nothing, and returns its requests and answers as [{method,
    operation, status}]."""
    headers = ["-H", f"Authorization: Bearer {token}"] if token else []
    cmd = [str(SCHEMATHESIS), "run", url, *headers, "--checks", checks,
           "--max-examples", str(MAX_EXAMPLES), "--seed", SEED, "--workers", "1",
           "--phases", "coverage,fuzzing", "--request-timeout", "30",
           "--generation-database", "none", "--generation-with-security-parameters", "false",
           "--report", "ndjson", "--report-ndjson-path", str(report), "--no-color", *args]
    env = dict(os.environ, SCHEMATHESIS_HOOKS=str(hooks)) if hooks else None
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=report.parent,
                          env=env)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    exchanges = list(_exchanges(report))
    assert len(exchanges) > 100, done.stdout[-3000:]  # it did test
    return exchanges


def _exchanges(report: Path):
    for line in report.read_text().splitlines():
        finished = json.loads(line).get("ScenarioFinished")
        if not finished:
            continue
        label = finished["recorder"]["label"]  # "METHOD /path/{template}"
        for exchange in (finished["recorder"].get("interactions") or {}).values():
            answer = exchange.get("response")
            yield {"method": exchange["request"]["method"], "operation": label,
                   "status": answer["status_code"] if answer else None}


def state_of(state: Path) -> dict[str, bytes | list | None]:
    """The bytes of each state file (a directory: its files' names and bytes)."""
    found: dict[str, bytes | list | None] = {}
    for name in STATE_FILES:
        path = state / name
        if path.is_dir():
            found[name] = sorted((str(p), p.read_bytes()) for p in path.rglob("*")
                                 if p.is_file())
        else:
            found[name] = path.read_bytes() if path.exists() else None
    return found


def excluded(*operation_ids: str) -> list[str]:
    return [arg for op in operation_ids for arg in ("--exclude-operation-id", op)]


@pytest.fixture(scope="module")
def served_jobs(tmp_path_factory, libvirt_emulator):  # noqa: F811
    """(state, URL, admin token) of a serve whose nodes n1, n2, n4 (IPMI) and n3 (Redfish)
    have BMC emulators this test runs on loopback; runners of jobs left running are
    stopped."""
    state = tmp_path_factory.mktemp("schemathesis-jobs") / "state"
    ports = loopback_services(state)
    write_config(state, tftp={"enabled": False}, dns={"enabled": False})
    token = _make_token(state, "admin")
    ipmi_ports = free_udp_ports(3)
    (state.parent / "ipmi-pw").write_text(IPMI_PASSWORD)
    (state.parent / "redfish-pw").write_text(REDFISH_PASSWORD)
    redfish_port, ca_file, _ = libvirt_emulator
    nodes = [("n1", "ipmi", ipmi_ports[0], IPMI_USER, "ipmi-pw", "--bmc-cipher-suite", "3"),
             ("n2", "ipmi", ipmi_ports[1], IPMI_USER, "ipmi-pw", "--bmc-cipher-suite", "3"),
             ("n3", "redfish", redfish_port, REDFISH_USER, "redfish-pw", "--bmc-ca-file",
              str(ca_file)),
             ("n4", "ipmi", ipmi_ports[2], IPMI_USER, "ipmi-pw", "--bmc-cipher-suite", "3")]
    for name, driver, port, user, password, *extra in nodes:
        made = run_provisiond(state, "node", "add", name, "--bmc-driver", driver,
                              "--bmc-address", "127.0.0.1", "--bmc-port", str(port),
                              "--bmc-username", user, "--bmc-password-file",
                              str(state.parent / password), *extra)
        assert made.returncode == 0, made.stderr
    with bmc_processes(ipmi_ports), serving(state, ports, lambda: stop_runners(state)) as url:
        yield state, url, token


def stop_runners(state: Path) -> None:
    """SIGKILL the runner of every job still running (its pid and start time, as the jobs
    store knows a runner: never another process that got the pid)."""
    config = load_config(state)
    for job_id in store.job_ids(config):
        job = store.read(config, job_id)
        if job.active and job.runner_pid and store.runner_alive(job):
            os.kill(job.runner_pid, 9)


@pytest.mark.parametrize("who", ["nobody", "reader"])
def test_no_write_is_accepted_without_a_writing_role(served, tmp_path, who):
    state, url, tokens = served
    before = state_of(state)
    exchanges = fuzz(url, tokens.get(who), tmp_path / "report.ndjson",
                     *(excluded(*STREAMS) if who == "reader" else []))
    assert [e for e in exchanges if e["status"] is None or e["status"] >= 500] == []
    writes = [e for e in exchanges if e["method"] in WRITES]
    assert [e for e in writes if e["status"] < 300] == []
    assert (401 if who == "nobody" else 403) in {e["status"] for e in writes}
    assert {e["status"] for e in writes} <= {400, 401, 403, 404, 405, 413, 414, 415, 431}
    assert state_of(state) == before  # nothing stored, not even an audit line


def test_an_admin_gets_no_server_error_and_only_documented_answers(served, tmp_path):
    """Every write is allowed here; DELETE /tokens/{name} is left out, or the run revokes
    its own token (it learns the names from GET /tokens) and tests only 401s after that.
    `ignored_auth` also sends each operation without the token and with a wrong one."""
    state, url, tokens = served
    exchanges = fuzz(url, tokens["admin"], tmp_path / "report.ndjson",
                     *excluded("tokens_revoke_token", *STREAMS, *JOB_STARTS),
                     checks=CHECKS + ",ignored_auth")
    assert [e for e in exchanges if e["status"] is None or e["status"] >= 500] == []
    statuses = {e["status"] for e in exchanges}
    assert {200, 201, 204} <= statuses  # writes were accepted: the token worked throughout
    listing = run_provisiond(state, "token", "list", "--json")
    assert {t["name"] for t in json.loads(listing.stdout)} >= {"st-admin", "st-reader"}


def test_an_admin_starts_jobs_only_on_the_nodes_and_bmcs_of_the_test(served_jobs, tmp_path):
    state, url, token = served_jobs
    inventory = (state / "inventory.yaml").read_bytes()
    included = [arg for op in (*BMC_JOBS, "builds_build_overlays", *JOB_READS)
                for arg in ("--include-operation-id", op)]
    exchanges = fuzz(url, token, tmp_path / "report.ndjson", *included,
                     checks=CHECKS + ",ignored_auth", hooks=JOB_HOOKS)
    assert [e for e in exchanges if e["status"] is None or e["status"] >= 500] == []
    starts = [e for e in exchanges if e["method"] == "POST" and e["operation"].startswith(
        "POST ")]  # not the other methods the coverage phase tries on each path (405)
    assert {e["status"] for e in starts} <= {202, 400, 401, 404, 409, 413, 415, 422}
    for operation in ("power", "bootdev", "firmware/update", "reprovision"):
        answers = {e["status"] for e in starts if e["operation"].endswith(f"/{operation}")}
        assert answers & {202, 409}, (operation, answers)  # started, or its node was busy
    config = load_config(state)
    ran = [store.read(config, job_id) for job_id in store.job_ids(config)]
    assert {job.kind.value for job in ran} >= {"power", "bootdev", "firmware-update",
                                               "reprovision"}, [job.kind for job in ran]
    assert {name for job in ran for name in job.names} <= JOB_NODES
    assert (state / "inventory.yaml").read_bytes() == inventory  # the BMCs stayed the test's
