"""`provisiond job list|show ID|wait ID`: the jobs the API and the CLI ran (provisiond.jobs,
as the API's job routes read them)."""

from __future__ import annotations

import time

from provisiond import jobs
from provisiond.errors import BmcError, BuildFailed, ExitCode
from provisiond.service.inventory import DEFAULT_LIMIT, check_limit
from provisiond.states import JobKind, JobState

WAIT_TIMEOUT = 3600.0
BUILDS = (JobKind.IMAGE_BUILD, JobKind.OVERLAY_BUILD)


def register(subparsers) -> None:
    job = subparsers.add_parser("job", help="list, show or wait for jobs (power, boot device, "
                                "firmware, reprovision, builds)")
    verbs = job.add_subparsers(dest="verb", metavar="VERB", required=True)
    listing = verbs.add_parser("list", help="jobs, newest first")
    listing.add_argument("--kind", choices=[k.value for k in JobKind])
    listing.add_argument("--state", choices=[s.value for s in JobState])
    listing.add_argument("--limit", type=int, default=DEFAULT_LIMIT,
                         help=f"at most this many (1-1000, default {DEFAULT_LIMIT})")
    listing.add_argument("--before", type=int, metavar="ID",
                         help="jobs older than this one (the next page)")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=list_handler)
    show = verbs.add_parser("show", help="one job: its state and a result per target")
    show.add_argument("id", type=int, metavar="ID")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=show_handler)
    wait = verbs.add_parser(
        "wait", help="wait until a job ends; exit non-zero if a target failed",
        description="Wait until job ID ends, then show it. Exits 0 if every target's result "
        "is ok, 7 (a BMC job) or 5 (a build) if one failed.")
    wait.add_argument("id", type=int, metavar="ID")
    wait.add_argument("--timeout", type=float, default=WAIT_TIMEOUT, metavar="SECONDS",
                      help=f"give up after this long (default {WAIT_TIMEOUT:g})")
    wait.add_argument("--json", action="store_true")
    wait.set_defaults(func=wait_handler)


def list_handler(args, ctx) -> None:
    found, cursor = jobs.list_jobs(ctx.config, check_limit(args.limit), args.before,
                                   args.kind and JobKind(args.kind),
                                   args.state and JobState(args.state))
    if args.json:
        return ctx.print_json({"items": found, "before": cursor})
    ctx.print_table(["ID", "KIND", "TARGET", "STATE", "ACTOR", "CREATED", "RESULTS"],
                    [[j["id"], j["kind"], j["target"], j["state"], j["actor"],
                      _time(j["created"]), _counts(j)] for j in found])
    if cursor is not None:
        ctx.print_line(f"(more: --before {cursor})")
    return None


def show_handler(args, ctx) -> int:
    return _print_job(ctx, jobs.get(ctx.config, args.id), args.json)


def wait_handler(args, ctx) -> int:
    return _print_job(ctx, jobs.wait(ctx.config, args.id, args.timeout), args.json)


def _print_job(ctx, job: dict, as_json: bool) -> int:
    """The job as key lines and a results table (or JSON); the exit code of its outcome."""
    if as_json:
        ctx.print_json(job)
    else:
        for key in ("id", "kind", "target", "state", "actor", "message"):
            ctx.print_line(f"{key}: {'-' if job[key] is None else job[key]}")
        for key in ("created", "started", "finished"):
            ctx.print_line(f"{key}: {_time(job[key])}")
        ctx.print_table(["NAME", "RESULT", "SECONDS", "DETAIL"],
                        [[r["name"], r["result"], r["seconds"], r["detail"]]
                         for r in job["results"]])
    return exit_code(job)


def exit_code(job: dict) -> int:
    """0 while running or when every target is ok; else the code the command itself exits
    with when a target fails."""
    failed = job["state"] == JobState.FAILED.value or any(
        r["result"] == "error" for r in job["results"])
    if not failed:
        return ExitCode.OK
    return BuildFailed.exit_code if JobKind(job["kind"]) in BUILDS else BmcError.exit_code


def _counts(job: dict) -> str:
    ok = sum(r["result"] == "ok" for r in job["results"])
    return f"{ok} ok, {len(job['results']) - ok} error of {len(job['names'])}"


def _time(epoch: float | None) -> str:
    return "-" if epoch is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))
