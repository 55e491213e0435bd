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
from provisiond.states import JobState


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
