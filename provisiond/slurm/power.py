"""Slurm's power saving programs: what `provisiond slurm resume|suspend HOSTLIST` does to
each node (the command line, logging and exit codes are in provisiond.cli.slurm).

Resume is a `reprovision` job that does not wait for ready (provisiond.power.reprovision,
run by provisiond.cli.slurm: audited, with `job.*` events, refused while a node is busy in
another job): the nodes' credentials end, with every token minted until then, the boot
device is set to PXE once, then the node is powered on, or power cycled when it is already
on (Slurm thought it down, but it runs an older boot).
A node its BMC did not boot is set DOWN with the reason (`scontrol update`), at once:
slurmctld would otherwise hold its jobs for ResumeTimeout before it gave up on the node.
Suspend is a hard power off: nodes are stateless, there is nothing to save. It runs as a
`power off` job (provisiond.cli.slurm: jobs.run_here), as `provisiond power off` does:
audited, with `job.*` events, refused (Conflict) while a node is busy in another job.
"""

from __future__ import annotations

import subprocess
from collections import defaultdict

from provisiond.config import CONTROL_RE, Config
from provisiond.inventory.ranges import fold
from provisiond.power.fanout import NodeResult


SCONTROL_TIMEOUT = 30.0
MAX_REASON = 200


def mark_down(config: Config, results: list[NodeResult]) -> list[tuple[bool, str]]:
    """Set the nodes whose resume failed DOWN in Slurm, one `scontrol update` per distinct
    reason; (ok, what happened) per call, for the log."""
    reasons: dict[str, list[str]] = defaultdict(list)
    for result in results:
        if not result.ok:
            detail = CONTROL_RE.sub(" ", result.detail).replace('"', "'")
            reasons[f"provisiond resume: {detail}"[:MAX_REASON]].append(result.node)
    return [_scontrol_down(config, fold(names), reason) for reason, names in reasons.items()]


def _scontrol_down(config: Config, names: str, reason: str) -> tuple[bool, str]:
    argv = [config.slurm.scontrol, "update", f"NodeName={names}", "State=DOWN",
            f"Reason={reason}"]
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=SCONTROL_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{names}: cannot set DOWN: {exc}"
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        return False, f"{names}: cannot set DOWN: {said[-1] if said else done.returncode}"
    return True, f"{names}: set DOWN ({reason})"
