"""What each kind of job does: the library calls the CLI commands make (`power`, `bootdev`,
`firmware update`, `node reprovision`, `image build`, `overlay build`), their progress going to
the job's record and to the event journal."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator

from provisiond import images, overlays
from provisiond.config import Config
from provisiond.errors import BuildFailed
from provisiond.events import emit
from provisiond.jobs import store
from provisiond.jobs.model import (POWER_STATUS, BootdevParams, ImageBuildParams, Job,
                                   JobResult, OverlayBuildParams, PowerParams,
                                   ReprovisionParams, parse_params)
from provisiond.overlays.batch import OverlayBuildFailed
from provisiond.power import operations
from provisiond.power.fanout import NodeResult
from provisiond.power.firmware_url import credentials_hidden_in_logs
from provisiond.power.reprovision import reprovision
from provisiond.states import JobKind, PowerAction

FLUSH_SECONDS = 0.5  # progress reaches the record and the journal at most this often
EVENT_BYTES = 8 << 10  # results per job.progress event, as JSON
MAX_DETAIL = 1000  # characters of a result's detail in an event (the record keeps it all)


class Progress:
    """Results as they come: into the job's record and a `job.progress` event, batched so
    that a 10,000-node job writes neither 10,000 records nor 10,000 events."""

    def __init__(self, config: Config, job: Job,
                 on_result: Callable[[NodeResult], None] | None = None):
        self.config, self.job, self.on_result = config, job, on_result
        self.batch: list[JobResult] = []
        self.flushed = 0.0

    def node(self, result: NodeResult) -> None:
        """A fan-out's progress callback: one node's result."""
        self.job.results.append(job_result(result))
        self.batch.append(self.job.results[-1])
        self.flush(force=False)
        if self.on_result:
            self.on_result(result)

    def count(self, done: int, total: int) -> None:
        """An overlay build's progress callback: nodes built so far."""
        if done == total or time.monotonic() - self.flushed >= FLUSH_SECONDS:
            self.flushed = time.monotonic()
            self._event({"done": done, "total": total})

    def layer(self, event: dict) -> None:
        """An image build's progress callback: one layer starts, is reused or is built."""
        self._event({"layer": {k: event[k] for k in ("index", "count", "kind", "description",
                                                      "status") if k in event}})

    def flush(self, force: bool = True) -> None:
        if not self.batch or (not force and time.monotonic() - self.flushed < FLUSH_SECONDS):
            return
        self.flushed = time.monotonic()
        store.save(self.config, self.job)
        progress = {"done": len(self.job.results), "total": len(self.job.names)}
        for results in _chunks([r.model_dump(mode="json") for r in self.batch]):
            self._event({**progress, "results": results})
        self.batch = []

    def _event(self, data: dict) -> None:
        emit(self.config, "job.progress", job_subject(self.job), {"job": self.job.id, **data})


def _chunks(results: list[dict]) -> Iterator[list[dict]]:
    """The results in runs of at most EVENT_BYTES of JSON (a journal line holds 16 KiB)."""
    chunk, size = [], 0
    for result in results:
        result = {**result, "detail": result["detail"][:MAX_DETAIL]}
        length = len(json.dumps(result)) + 1
        if chunk and size + length > EVENT_BYTES:
            yield chunk
            chunk, size = [], 0
        chunk.append(result)
        size += length
    if chunk:
        yield chunk


def job_subject(job: Job) -> str:
    return f"job/{job.id}"


def job_result(result: NodeResult) -> JobResult:
    return JobResult(name=result.node, result="ok" if result.ok else "error",
                     detail=result.detail, seconds=round(result.seconds, 3))


def execute(config: Config, job: Job, progress: Progress) -> list[JobResult]:
    """Do the job; one result per target. A failure of the whole job raises."""
    return WORK[job.kind](config, job, progress)


def _fan_out(config: Config, job: Job, operation, timeout: float | None,
             progress: Progress) -> list[JobResult]:
    # job.target is for people (shortened when long); job.names are the targets
    results = operations.run(config, ",".join(job.names), operation, timeout, progress.node)
    return [job_result(r) for r in results]


def _power(config: Config, job: Job, progress: Progress) -> list[JobResult]:
    params = PowerParams.model_validate(job.params)
    operation = operations.power_status if params.action == POWER_STATUS \
        else operations.power(PowerAction(params.action))
    return _fan_out(config, job, operation, params.timeout, progress)


def _bootdev(config: Config, job: Job, progress: Progress) -> list[JobResult]:
    params = BootdevParams.model_validate(job.params)
    operation = operations.boot_device(config, params.device, params.persistent, params.uefi)
    return _fan_out(config, job, operation, params.timeout, progress)


def _firmware_update(config: Config, job: Job, progress: Progress) -> list[JobResult]:
    # the URL whole (its credentials are kept apart); a refusal is InvalidInput, whose
    # message never quotes the URL with them
    params = parse_params(job.kind, store.params_of(config, job))
    with credentials_hidden_in_logs(params.image):
        return _fan_out(config, job, operations.firmware_update(params.image),
                        params.timeout, progress)


def _reprovision(config: Config, job: Job, progress: Progress) -> list[JobResult]:
    params = ReprovisionParams.model_validate(job.params)
    return [job_result(r) for r in reprovision(config, job.names, params.timeout,
                                               progress.node, params.wait)]


def _image_build(config: Config, job: Job, progress: Progress) -> list[JobResult]:
    params = ImageBuildParams.model_validate(job.params)
    name = job.names[0]
    if os.geteuid() != 0:
        raise BuildFailed(f"image {name}: building needs root (chroot and mounts) and the "
                          f"server runs as uid {os.geteuid()}; build it on the server with "
                          f"`sudo provisiond image build {name}`")
    manifest = images.build_image(config, name, progress=progress.layer,
                                  rebuild=params.no_cache)
    detail = (f"{len(manifest['layers'])} layers, {manifest['total_size']} bytes, kernel "
              f"{manifest['kernel']['version']}")
    return [JobResult(name=name, result="ok", detail=detail,
                      seconds=manifest["build_seconds"])]


def _overlay_build(config: Config, job: Job, progress: Progress) -> list[JobResult]:
    params = OverlayBuildParams.model_validate(job.params)
    started = time.monotonic()
    try:
        summary = overlays.build_overlays(config, None if params.all else job.names,
                                          progress=progress.count)
    except OverlayBuildFailed as exc:
        summary = exc.summary
    failed, seconds = summary["failed"], round(time.monotonic() - started, 3)
    return [JobResult(name=name, result="error" if name in failed else "ok",
                      detail=failed.get(name, "built"), seconds=seconds)
            for name in job.names]


WORK: dict[JobKind, Callable[[Config, Job, Progress], list[JobResult]]] = {
    JobKind.POWER: _power,
    JobKind.BOOTDEV: _bootdev,
    JobKind.FIRMWARE_UPDATE: _firmware_update,
    JobKind.REPROVISION: _reprovision,
    JobKind.IMAGE_BUILD: _image_build,
    JobKind.OVERLAY_BUILD: _overlay_build,
}
