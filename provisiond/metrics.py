"""Prometheus metrics: what provisiond counts, and where `/metrics` reads it from.

Two stores, because the work happens in two kinds of process:

- **Live counters** of `provisiond serve`'s processes (gunicorn workers, the DHCP, DNS and
  TFTP loops in serve's own process, the phase writer): prometheus-client's multiprocess
  mode, one file per process in the run's directory `<state>/run/metrics/<serve pid>/`,
  named to every child by $PROMETHEUS_MULTIPROC_DIR. `start_run` makes it when serve
  starts and removes those of serves no longer running; so each run counts from 0, as
  Prometheus expects of a restarted exporter. Without serve (a test, a bare gunicorn) the
  counters stay in the process.
- **Outcomes any process records**, the CLI included (image and overlay builds, BMC
  calls): few and slow, so each adds itself to one JSON document (`Layout.metrics`)
  under a lock, kept across runs; `FileCollector` reads it as histograms.

Recording never raises: a metric is not worth a failed build or a dropped packet. No metric
has a per-node label; label values come from closed sets (phases, routes, message types,
error class names).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from provisiond.config import Config
from provisiond.errors import ServeFailed
from provisiond.state.layout import Layout
from provisiond.state.local import edited, read_json

log = logging.getLogger("provisiond.metrics")
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus-client's own name for the directory

BOOT_BUCKETS = (1, 2.5, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600, 1200, 3600)
HTTP_BUCKETS = (.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30)
BUILD_BUCKETS = (.1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 3600)
BMC_BUCKETS = (.05, .1, .25, .5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1800)

# provisiond_<name>_total: (label names, help)
COUNTERS = {
    "boot_phases": (("phase",), "Boot phases recorded, by phase (dhcp: boots started)."),
    "http_requests": (("route", "method", "status"), "HTTP requests answered, by route."),
    "http_response_bytes": (("route",), "HTTP response body bytes sent, by route."),
    "dhcp_requests": (("type",), "DHCP requests received, by message type."),
    "dhcp_replies": (("type",), "DHCP replies sent (offer, ack, nak)."),
    "dhcp_ignored": (("reason",), "DHCP requests left unanswered, by reason."),
    "dhcp_errors": (("kind",), "DHCP packets or housekeeping that failed, by kind."),
    "dns_queries": (("handling",), "DNS datagrams received: answered, forwarded or dropped."),
    "dns_replies": (("rcode",), "DNS answers sent from the zone, by response code."),
    "dns_errors": (("kind",), "DNS packets or housekeeping that failed, by kind."),
    "tftp_requests": (("outcome",), "TFTP requests: started, refused (by TFTP error), dropped."),
    "tftp_transfers": (("outcome",), "TFTP transfers ended, by outcome."),
    "tftp_sent_bytes": ((), "Bytes of TFTP transfers completed."),
    "tftp_errors": (("kind",), "TFTP packets that failed in the server loop."),
}
# provisiond_<name>: (label names, help, buckets)
HISTOGRAMS = {
    "boot_phase_seconds": (("phase",), "Seconds from a boot's dhcp phase to each later phase.",
                           BOOT_BUCKETS),
    "http_request_duration_seconds": (("route",), "Seconds from a request's arrival until its "
                                      "response was sent, by route.", HTTP_BUCKETS),
}
FILE_HISTOGRAMS = {
    "build_duration_seconds": (("kind", "outcome"), "Seconds per image or overlay build "
                               "(any process: CLI, jobs).", BUILD_BUCKETS),
    "bmc_call_duration_seconds": (("driver", "outcome"), "Seconds per BMC call; outcome ok "
                                  "or the error class.", BMC_BUCKETS),
}


class _Live:
    """This process's prometheus-client metrics, in the multiprocess directory if one is
    named (`directory`), else in memory."""

    def __init__(self, directory: str | None):
        from prometheus_client import CollectorRegistry, Counter, Histogram, values

        # The value class is chosen when prometheus-client is first imported; choose it
        # again here, so that whichever imported it first, these metrics go where they must.
        values.ValueClass = values.MultiProcessValue() if directory else values.MutexValue
        self.directory = directory
        self.registry = CollectorRegistry(auto_describe=True)
        self.counters = {name: Counter(f"provisiond_{name}", text, labels, registry=self.registry)
                         for name, (labels, text) in COUNTERS.items()}
        self.histograms = {
            name: Histogram(f"provisiond_{name}", text, labels, buckets=buckets,
                            registry=self.registry)
            for name, (labels, text, buckets) in HISTOGRAMS.items()}


_live: _Live | None = None
_failures: set[tuple[str, type]] = set()


def live() -> _Live:
    """The live metrics for the current $PROMETHEUS_MULTIPROC_DIR (made again if it changed)."""
    global _live
    directory = os.environ.get(MULTIPROC_ENV) or None
    if _live is None or _live.directory != directory:
        _live = _Live(directory)
    return _live


def _quietly(what: str, record, *args) -> None:
    """record(*args); a failure is logged once per metric and exception type, and goes no
    further."""
    try:
        record(*args)
    except Exception as exc:  # noqa: BLE001 - never fail the work being counted
        if (what, type(exc)) not in _failures:
            _failures.add((what, type(exc)))
            log.warning("metrics: cannot record %s: %s: %s (logged once)", what,
                        type(exc).__name__, exc)


def count(name: str, *labels: str, amount: float = 1) -> None:
    """Add `amount` to counter provisiond_<name>_total{labels}."""
    _quietly(name, _count, name, labels, amount)


def _count(name: str, labels: tuple, amount: float) -> None:
    counter = live().counters[name]
    (counter.labels(*labels) if labels else counter).inc(amount)


def add_counts(counts: dict[tuple[str, str], int]) -> None:
    """Publish counts kept in a plain dict, {(counter name, label): n}: the UDP loops count
    per packet that way (a dict increment costs a fifteenth of a prometheus one)."""
    for (name, label), amount in counts.items():
        count(name, label, amount=amount)


def observe(name: str, value: float, *labels: str) -> None:
    """Observe `value` in histogram provisiond_<name>{labels}."""
    _quietly(name, lambda: live().histograms[name].labels(*labels).observe(value))


def observe_phase(phase: str, boot_started: float | None, now: float) -> None:
    """A phase recorded: counted, and timed from the boot's dhcp phase (`boot_started`,
    None when the boot's dhcp phase was not seen)."""
    count("boot_phases", phase)
    if boot_started is not None and phase != "dhcp":
        observe("boot_phase_seconds", max(0.0, now - boot_started), phase)


# --- the run directory ---------------------------------------------------------------

class MetricsRun:
    """The multiprocess directory of one `provisiond serve`, named in $PROMETHEUS_MULTIPROC_DIR
    for the process and its children while it runs; its lock tells other serves it is live."""

    def __init__(self, config: Config):
        self.base = Layout.of(config).metrics_runs
        self.directory = self.base / str(os.getpid())
        self.base.mkdir(parents=True, exist_ok=True)
        self._lock = os.open(self.directory.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._lock, fcntl.LOCK_EX)  # a new pid: nobody else holds it
        remove_stale_runs(self.base, keep=self.directory)
        shutil.rmtree(self.directory, ignore_errors=True)  # a dead process's with our pid
        self.directory.mkdir()
        self._previous = os.environ.get(MULTIPROC_ENV)
        os.environ[MULTIPROC_ENV] = str(self.directory)

    def close(self) -> None:
        """Remove the directory (after the children that wrote into it are gone); once."""
        if self._lock < 0:
            return
        if self._previous is None:
            os.environ.pop(MULTIPROC_ENV, None)
        else:
            os.environ[MULTIPROC_ENV] = self._previous
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory.with_suffix(".lock").unlink(missing_ok=True)
        os.close(self._lock)
        self._lock = -1


def start_run(config: Config) -> MetricsRun:
    """For `provisiond serve`, before it starts its children (see MetricsRun)."""
    try:
        return MetricsRun(config)
    except OSError as exc:
        raise ServeFailed(f"cannot make the metrics directory under {Layout.of(config).run}: "
                          f"{exc.strerror or exc}") from None


def remove_stale_runs(base: Path, keep: Path) -> None:
    """Remove the directories of serves that ended without removing theirs (killed): no
    process holds their lock. A directory without a lock file is stale too: a serve makes
    its lock before its directory."""
    for lock in base.glob("*.lock"):
        run = lock.with_suffix("")
        if run != keep and _free(lock):
            shutil.rmtree(run, ignore_errors=True)
            lock.unlink(missing_ok=True)
    for run in base.iterdir():
        if run.is_dir() and run != keep and not run.with_suffix(".lock").exists():
            shutil.rmtree(run, ignore_errors=True)


def _free(lock_path: Path) -> bool:
    """True if no process holds `lock_path` (its serve is gone)."""
    try:
        fd = os.open(lock_path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


# --- outcomes recorded by any process ---------------------------------------------------

def record_outcomes(config: Config, name: str,
                    observations: Iterable[tuple[tuple[str, ...], float]]) -> None:
    """Add (labels, seconds) observations to file histogram `name` (FILE_HISTOGRAMS)."""
    observations = list(observations)
    if observations:
        _quietly(name, _record_outcomes, Layout.of(config).metrics, name, observations)


def _record_outcomes(path: Path, name: str, observations: list) -> None:
    buckets = FILE_HISTOGRAMS[name][2]
    with edited(path, durable=False, sort_keys=True) as document:
        series = document.setdefault(name, {})
        for labels, seconds in observations:
            key = "\t".join(labels)
            entry = series.get(key)
            if not _valid_series(entry, len(buckets)):
                entry = series[key] = {"buckets": [0] * (len(buckets) + 1), "sum": 0.0}
            entry["buckets"][_bucket(buckets, seconds)] += 1
            entry["sum"] += seconds


def _bucket(buckets: tuple, value: float) -> int:
    """The index of the first bucket whose bound holds `value` (len(buckets): +Inf)."""
    return next((i for i, bound in enumerate(buckets) if value <= bound), len(buckets))


def _valid_series(entry, size: int) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("sum"), (int, float))
            and isinstance(entry.get("buckets"), list) and len(entry["buckets"]) == size + 1
            and all(isinstance(n, int) and n >= 0 for n in entry["buckets"]))


class FileCollector:
    """prometheus-client collector of the outcomes in `Layout.metrics`."""

    def __init__(self, config: Config):
        self.path = Layout.of(config).metrics

    def collect(self):
        from prometheus_client.core import HistogramMetricFamily

        document = read_json(self.path)
        for name, (labels, text, buckets) in FILE_HISTOGRAMS.items():
            family = HistogramMetricFamily(f"provisiond_{name}", text, labels=labels)
            series = document.get(name)
            for key, entry in (series.items() if isinstance(series, dict) else ()):
                values = key.split("\t")
                if len(values) == len(labels) and _valid_series(entry, len(buckets)):
                    family.add_metric(values, _cumulative(buckets, entry["buckets"]),
                                      entry["sum"])
            yield family


def _cumulative(buckets: tuple, counts: list[int]) -> list[tuple[str, int]]:
    from prometheus_client.utils import floatToGoString  # "le" as the library's histograms

    total, result = 0, []
    for bound, n in zip((*map(floatToGoString, buckets), "+Inf"), counts):
        total += n
        result.append((bound, total))
    return result


@contextlib.contextmanager
def timed_build(config: Config, kind: str) -> Iterator[None]:
    """`with timed_build(config, "image"):` records the build's seconds and outcome (ok or
    failed; an interrupted build is not recorded)."""
    started = time.monotonic()
    try:
        yield
    except Exception:
        _record_build(config, kind, "failed", started)
        raise
    _record_build(config, kind, "ok", started)


def _record_build(config: Config, kind: str, outcome: str, started: float) -> None:
    record_outcomes(config, "build_duration_seconds",
                    [((kind, outcome), time.monotonic() - started)])
