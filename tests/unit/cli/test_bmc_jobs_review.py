"""Review of the CLI's BMC commands as jobs: scattered ranges, interrupted and killed runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from provisiond.errors import ExitCode
from provisiond.inventory.ranges import MAX_NAMES_TEXT, fold
from provisiond.jobs import store
from provisiond.power.fake import read_fake_bmcs
from provisiond.states import JobKind, JobState


def test_a_scattered_range_longer_than_a_job_target_powers_every_node_it_names(cli, config):
    assert cli("node", "add", "n[1-1200]", "--bmc-driver", "fake",
               "--bmc-address", "bmc").code == 0
    odd = [f"n{i}" for i in range(1, 1201, 2)]
    assert len(fold(odd)) > MAX_NAMES_TEXT  # the job's target is shortened: "...,... (600 nodes)"
    result = cli("power", "on", ",".join(odd))
    assert result.code == 0, result.err
    job = store.get(config, 1)
    assert job.state is JobState.FINISHED, job.message
    assert sorted(r.name for r in job.results) == sorted(odd)
    powered = read_fake_bmcs(config.state_dir / "power" / "fake-bmcs.json")
    assert len(powered) == len(odd)


def _start_power_on(state_dir, pattern: str) -> subprocess.Popen:
    provisiond = os.path.join(os.path.dirname(sys.executable), "provisiond")
    # SIGINT as a terminal's shell leaves it: a CI started in the background ignores it, the
    # child inherits that, and Python then makes no KeyboardInterrupt of a Ctrl-C
    return subprocess.Popen([provisiond, "--state-dir", str(state_dir), "power", "on", pattern,
                             "--timeout", "300"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _running_job(config, process) -> None:
    from tests.waits import wait_until
    wait_until(lambda: store.job_ids(config) and store.read(config, 1).state
               is JobState.RUNNING and store.read(config, 1).results, 60,
               "the CLI's job runs and n1 answered", )


@pytest.fixture
def hanging(cli, config):
    assert cli("node", "add", "n1", "--bmc-driver", "fake", "--bmc-address", "bmc").code == 0
    assert cli("node", "add", "n2", "--bmc-driver", "fake", "--bmc-address", "hang").code == 0
    return cli


def test_ctrl_c_mid_fan_out_exits_130_and_frees_the_nodes(hanging, cli, config, state_dir):
    process = _start_power_on(state_dir, "n[1-2]")
    try:
        _running_job(config, process)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == ExitCode.INTERRUPTED, (out, err)
    assert "Traceback" not in err
    job = store.get(config, 1)
    assert job.state is JobState.FAILED and job.message.startswith("interrupted")
    assert cli("power", "on", "n1").code == 0  # the claims were freed


def test_a_killed_cli_run_does_not_leave_its_nodes_busy(hanging, cli, config, state_dir):
    process = _start_power_on(state_dir, "n[1-2]")
    try:
        _running_job(config, process)
        process.kill()
    finally:
        process.kill()
        process.wait()
    result = cli("power", "on", "n[1-2]", "--timeout", "0.2")
    assert result.code == ExitCode.BMC_FAILED, result.err  # n2 hangs; nothing is busy
    assert store.get(config, 1).state is JobState.FAILED
    assert "ended without finishing" in store.get(config, 1).message


def test_power_status_is_not_refused_while_a_job_holds_a_node_nor_holds_one(cli, config):
    assert cli("node", "add", "n[1-3]", "--bmc-driver", "fake", "--bmc-address", "bmc").code == 0
    held = store.create(config, JobKind.REPROVISION, ["n2"], {"timeout": 600}, "token:sync")
    result = cli("power", "status", "n[1-3]")
    assert result.code == 0, result.err
    reading = store.create(config, JobKind.POWER, ["n1"], {"action": "status"}, "token:poll")
    assert cli("power", "on", "n1").code == 0  # a running status read holds nothing
    assert store.read(config, held.id).active and store.read(config, reading.id).active


@pytest.mark.parametrize("timeout", ["nan", "-5", "0", "inf"])
def test_job_wait_refuses_a_timeout_that_is_no_deadline(cli, config, timeout):
    """nan never passed the deadline and slept 0 s a round: a busy loop until the job ended."""
    assert cli("node", "add", "n1", "--bmc-driver", "fake", "--bmc-address", "bmc").code == 0
    job = store.create(config, JobKind.POWER, ["n1"], {"action": "on"}, "token:sync")
    store.record_runner(config, job.id, os.getpid())  # "runs" as long as this test does
    result = cli("job", "wait", str(job.id), f"--timeout={timeout}")
    assert result.code == ExitCode.INVALID_INPUT, result
    assert result.err.startswith("provisiond: error: timeout: ") and "Traceback" not in result.err
