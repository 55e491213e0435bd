"""provisiond.metrics: the outcomes file any process adds to, the run directory serve makes,
and the live counters (in memory here: no serve names a directory in the test process)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys

import pytest
from provisiond import metrics
from provisiond.errors import BuildFailed, ServeFailed
from provisiond.metrics import (MULTIPROC_ENV, FileCollector, record_outcomes, start_run,
                                timed_build)
from provisiond.state.layout import Layout
from tests.conftest import REPO
from tests.prometheus_text import collected


def test_outcomes_become_cumulative_histograms(config):
    record_outcomes(config, "build_duration_seconds", [(("image", "ok"), 0.3),
                                                       (("image", "ok"), 7.0)])
    record_outcomes(config, "build_duration_seconds", [(("overlays", "failed"), 5000.0)])
    seen = collected(FileCollector(config))
    image = (("kind", "image"), ("outcome", "ok"))
    assert seen["provisiond_build_duration_seconds_count", image] == 2
    assert seen["provisiond_build_duration_seconds_sum", image] == pytest.approx(7.3)
    assert seen["provisiond_build_duration_seconds_bucket", (("kind", "image"), ("le", "0.25"),
                                                             ("outcome", "ok"))] == 0
    assert seen["provisiond_build_duration_seconds_bucket", (("kind", "image"), ("le", "0.5"),
                                                             ("outcome", "ok"))] == 1
    assert seen["provisiond_build_duration_seconds_bucket", (("kind", "image"), ("le", "+Inf"),
                                                             ("outcome", "ok"))] == 2
    failed = (("kind", "overlays"), ("le", "3600.0"), ("outcome", "failed"))
    assert seen["provisiond_build_duration_seconds_bucket", failed] == 0  # above every bound
    assert seen["provisiond_build_duration_seconds_count",
                (("kind", "overlays"), ("outcome", "failed"))] == 1


def test_outcomes_from_several_processes_add_up(config):
    code = ("import sys; from provisiond.config import load_config; "
            "from provisiond.metrics import record_outcomes; "
            "record_outcomes(load_config(sys.argv[1]), 'bmc_call_duration_seconds', "
            "[(('fake', 'ok'), 0.1)] * 5)")
    children = [subprocess.Popen([sys.executable, "-c", code, str(config.state_dir)], cwd=REPO)
                for _ in range(4)]
    assert [child.wait(60) for child in children] == [0] * 4
    seen = collected(FileCollector(config))
    assert seen["provisiond_bmc_call_duration_seconds_count",
                (("driver", "fake"), ("outcome", "ok"))] == 20


@pytest.mark.parametrize("damage", ["{not json", "[1, 2]",
                                    json.dumps({"build_duration_seconds": {
                                        "image\tok": {"buckets": [1, -1], "sum": "x"},
                                        "a\tb\tc": {"buckets": [0] * 15, "sum": 1}}})])
def test_a_damaged_file_is_read_as_empty_and_written_anew(config, damage):
    Layout.of(config).metrics.write_text(damage)
    assert ("provisiond_build_duration_seconds_count", (("kind", "image"), ("outcome", "ok"))) \
        not in collected(FileCollector(config))
    record_outcomes(config, "build_duration_seconds", [(("image", "ok"), 1.0)])
    assert collected(FileCollector(config))[
        "provisiond_build_duration_seconds_count", (("kind", "image"), ("outcome", "ok"))] == 1


def test_an_unwritable_file_costs_the_record_not_the_caller(config, caplog, monkeypatch):
    monkeypatch.setattr(metrics, "_failures", set())  # logged once: not yet in this test
    Layout.of(config).metrics.mkdir()  # a directory where the file should be
    with timed_build(config, "image"):
        pass  # the build itself succeeds: no exception may come out of recording it
    assert "cannot record build_duration_seconds" in caplog.text


def test_timed_build_records_ok_failed_and_not_an_interrupt(config):
    with timed_build(config, "overlays"):
        pass
    with pytest.raises(BuildFailed):
        with timed_build(config, "overlays"):
            raise BuildFailed("no")
    with pytest.raises(KeyboardInterrupt):
        with timed_build(config, "image"):
            raise KeyboardInterrupt
    seen = collected(FileCollector(config))
    counts = {labels: value for (name, labels), value in seen.items()
              if name == "provisiond_build_duration_seconds_count"}
    assert counts == {(("kind", "overlays"), ("outcome", "ok")): 1,
                      (("kind", "overlays"), ("outcome", "failed")): 1}


def test_live_counters_in_memory_without_a_run(live_metrics):
    metrics.count("tftp_requests", "started")
    metrics.add_counts({("dns_replies", "nxdomain"): 3})
    metrics.observe_phase("dhcp", None, 100.0)
    metrics.observe_phase("kernel", 100.0, 112.5)
    metrics.observe_phase("ipxe", None, 105.0)  # no dhcp seen: counted, not timed
    seen = live_metrics()
    assert seen["provisiond_tftp_requests_total", (("outcome", "started"),)] == 1
    assert seen["provisiond_dns_replies_total", (("rcode", "nxdomain"),)] == 3
    assert seen["provisiond_boot_phases_total", (("phase", "dhcp"),)] == 1
    assert seen["provisiond_boot_phase_seconds_sum", (("phase", "kernel"),)] == 12.5
    assert seen["provisiond_boot_phases_total", (("phase", "ipxe"),)] == 1
    for untimed in ("ipxe", "dhcp"):
        assert ("provisiond_boot_phase_seconds_count", (("phase", untimed),)) not in seen


def test_a_run_names_its_directory_and_removes_it_when_closed(config, monkeypatch):
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    run = start_run(config)
    try:
        assert os.environ[MULTIPROC_ENV] == str(run.directory)
        assert run.directory == Layout.of(config).run / "metrics" / str(os.getpid())
        assert run.directory.is_dir()
    finally:
        run.close()
    assert MULTIPROC_ENV not in os.environ
    assert list((Layout.of(config).run / "metrics").iterdir()) == []
    run.close()  # twice: nothing more


def test_a_run_removes_dead_serves_directories_and_keeps_live_ones(config, monkeypatch):
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    base = Layout.of(config).run / "metrics"
    for pid in ("111", "222", "333"):
        (base / pid).mkdir(parents=True)
        (base / pid / "counter_1.db").write_bytes(b"x")
    (base / "111.lock").touch()  # its serve was killed: nobody holds the lock
    (base / "222.lock").touch()  # a serve still running holds it
    # 333 has no lock at all (killed between its lock and its directory: stale too)
    held = os.open(base / "222.lock", os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        run = start_run(config)
        run.close()
    finally:
        os.close(held)
    assert sorted(p.name for p in base.iterdir()) == ["222", "222.lock"]


def test_a_run_that_cannot_make_its_directory_is_one_line(config, monkeypatch):
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    Layout.of(config).run.write_text("a file where the run directory should be")
    with pytest.raises(ServeFailed, match="cannot make the metrics directory"):
        start_run(config)
    assert MULTIPROC_ENV not in os.environ
