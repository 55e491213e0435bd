"""Shared fixtures: a state dir per test, and the CLI run in-process."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from provisiond.cli import main
from provisiond.config import Config, load_config, write_default_config

REPO = Path(__file__).resolve().parent.parent


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def state_dir(tmp_path) -> Path:
    path = tmp_path / "state"
    write_default_config(path)
    return path


@pytest.fixture
def config(state_dir) -> Config:
    return load_config(state_dir)


@pytest.fixture
def cli(state_dir, capsys):
    """Run `provisiond --state-dir STATE ARGS...` in-process; returns CliResult."""

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        code = main(["--state-dir", str(state_dir), *args])
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


@pytest.fixture
def live_metrics(monkeypatch):
    """This process's live counters, new for the test and kept in memory (no serve names a
    multiprocess directory here); returns a function reading them as Prometheus would."""
    from provisiond import metrics
    from tests.prometheus_text import collected

    monkeypatch.delenv(metrics.MULTIPROC_ENV, raising=False)
    monkeypatch.setattr(metrics, "_live", None)
    return lambda: collected(metrics.live().registry)


def run_provisiond(state_dir: Path, *args: str, input: str | None = None,
                   timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the real console entry point in a child process."""
    env = dict(os.environ, PROVISIOND_STATE_DIR=str(state_dir))
    return subprocess.run([sys.executable, "-m", "provisiond", *args], input=input,
                          capture_output=True, text=True, env=env, timeout=timeout)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """With PROVISIOND_NO_SKIP=1 (CI sets it) a skipped test fails: on a machine that has
    everything installed, a skip means a check silently did not run."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("PROVISIOND_NO_SKIP") == "1" and not hasattr(
            report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped, but PROVISIOND_NO_SKIP=1: {report.longrepr}"


def pytest_terminal_summary(terminalreporter):
    """The screenshots the session's browser tests saved, whether they passed or not."""
    from tests.status_page import SAVED

    if SAVED:
        terminalreporter.section("screenshots")
        for path in SAVED:
            terminalreporter.line(str(path))


@pytest.fixture(scope="session")
def debian12_built(tmp_path_factory) -> tuple[Config, dict]:
    """debian12 built once per session in a state dir of its own: (config, manifest).
    tests/integration/test_images_debian.py checks it (and builds debian12-compute over it);
    the VM lab copies its layers (tests/shared_images.py) rather than build them again."""
    from tests.shared_images import build_shared

    config, manifest, seconds = build_shared(tmp_path_factory.mktemp("debian") / "state",
                                             "debian12")
    print(f"debian12 full build: {seconds:.1f}s")
    return config, manifest
