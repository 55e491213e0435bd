"""`provisiond slurm config`: slurm.conf from the inventory; `provisiond slurm
resume|suspend HOSTLIST`: Slurm's ResumeProgram/SuspendProgram (provisiond.slurm).

What Slurm's Power Saving Guide (power_save.shtml) asks of these programs: slurmctld runs
them as SlurmUser with one argument, the nodes in hostlist form (`n[001-004],gpu1`); it does
not log their stdout or stderr, so each node's outcome goes to syslog or `--log FILE`; they
have no time limit but must end (every BMC call here has a deadline); a node that does not
register within ResumeTimeout is set DOWN by Slurm (and ResumeFailProgram runs), and one
whose BMC failed is set DOWN by resume at once (provisiond.slurm.power.mark_down). So one name
provisiond does not know never holds back the others: the known nodes are acted on, each
unknown one is logged as an error, and the exit status is non-zero (for people and scripts:
the guide gives Slurm no use for it).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import logging.handlers
import os
import sys

from provisiond import jobs
from provisiond.audit import cli_actor
from provisiond.cli.context import printable
from provisiond.cli.power import node_results
from provisiond.errors import BmcError, ExitCode, NotFound
from provisiond.inventory import load_nodes
from provisiond.inventory.ranges import fold
from provisiond.power import operations
from provisiond.power.report import exit_code
from provisiond.slurm import conf, power
from provisiond.state.layout import Layout
from provisiond.states import JobKind, PowerAction

SYSLOG_SOCKET = "/dev/log"
LOGGER = "provisiond.slurm"
EPILOG = f"""`slurm config` writes <state>/slurm/slurm.conf (the copy the `slurm` runtime
overlay gives nodes: give slurmctld the same file) and, unless slurm.resume_program and
slurm.suspend_program are set, the programs slurm.conf names: <state>/slurm/resume and
<state>/slurm/suspend, which run `slurm resume|suspend` on this state dir with the
hostlist Slurm passes as their only argument.

resume and suspend run as SlurmUser, which must be able to read the state dir and secrets
and write its records (credentials, jobs, audit, events).
Every node named is tried; each outcome is one log line. resume sets a node whose BMC
failed DOWN in Slurm with the reason (slurm.scontrol); suspend is a `power off` job. Exit status: 0 when every node
was done, {NotFound.exit_code} when a name is no node (the known ones were still done), else \
{BmcError.exit_code} when a BMC
failed; {int(ExitCode.FAILED)} when --log FILE could not be written (the nodes were done,
their outcomes not recorded)."""


def register(subparsers) -> None:
    slurm = subparsers.add_parser(
        "slurm", help="Slurm hand-off: slurm.conf, power saving (ResumeProgram, "
        "SuspendProgram)", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = slurm.add_subparsers(dest="verb", metavar="VERB", required=True)
    config = verbs.add_parser(
        "config", help="write slurm.conf from the inventory (the nodes listing the slurm "
        "overlay) and provisiond.yaml's slurm settings")
    config.add_argument("--print", action="store_true", dest="print_only",
                        help="print slurm.conf instead of writing anything")
    config.set_defaults(func=config_handler)
    resume = verbs.add_parser("resume", help="PXE boot the nodes: end their credentials, "
                              "boot device pxe once, then power on (cycle if on)")
    suspend = verbs.add_parser("suspend", help="power the nodes off")
    for parser, handler in ((resume, resume_handler), (suspend, suspend_handler)):
        parser.add_argument("hostlist", metavar="HOSTLIST", help="Slurm hostlist")
        parser.add_argument("--log", metavar="FILE", help="append to FILE (default: syslog)")
        parser.add_argument("--timeout", type=float, metavar="SECONDS",
                            help="per-BMC deadline (default: power.timeout)")
        parser.set_defaults(func=handler)


def config_handler(args, ctx) -> int:
    if args.print_only:
        sys.stdout.write(conf.render_conf(ctx.config, load_nodes(ctx.config)).text)
        return 0
    written = conf.write_conf(ctx.config)
    partitions = ", ".join(f"{name} ({fold(names)})"
                           for name, names in written.partitions.items())
    print(f"wrote {Layout.of(ctx.config).slurm_conf}: {len(written.nodes)} node(s), partitions "
          f"{partitions}")
    if ctx.config.slurm.suspend_time is None:
        print("power saving is off (slurm.suspend_time is not set)")
    else:
        print(f"ResumeProgram {conf.program_path(ctx.config, 'resume')}, SuspendProgram "
              f"{conf.program_path(ctx.config, 'suspend')}")
    return 0


def resume_handler(args, ctx) -> int:
    def resume(config, nodes, timeout):
        """A `reprovision` job without the wait for ready: audited, claims, events."""
        if not nodes:
            return []
        params = {"wait": False, "timeout": timeout}
        results = node_results(jobs.run_here(config, JobKind.REPROVISION, [fold(list(nodes))],
                                             params, cli_actor()))
        for ok, what in power.mark_down(config, results):
            logging.getLogger(LOGGER).log(logging.INFO if ok else logging.ERROR,
                                          "slurm resume %s", what)
        return results

    return _run(args, ctx, resume)


def suspend_handler(args, ctx) -> int:
    def suspend(config, nodes, timeout):
        """A `power off` job, as `provisiond power off` runs: audited, claims, events."""
        if not nodes:
            return []
        job = jobs.run_here(config, JobKind.POWER, [fold(list(nodes))],
                            {"action": PowerAction.OFF.value, "timeout": timeout}, cli_actor())
        return node_results(job)

    return _run(args, ctx, suspend)


def _run(args, ctx, act) -> int:
    """Log each node's outcome; an error before any node is tried (no state dir, a bad
    range) is logged too (Slurm reads no stderr) and raised for main() to print once."""
    log = _logger(args.log)
    try:
        nodes, unknown = operations.find_nodes(ctx.config, args.hostlist)
        results = act(ctx.config, nodes, args.timeout)
    except Exception as exc:
        if not isinstance(log.handlers[0], _TerminalHandler):  # main() prints it there
            log.error("slurm %s %s: %s", args.verb, args.hostlist, exc)
        raise
    for name in unknown:
        log.error("slurm %s %s: error: no such node", args.verb, name)
    for result in results:
        level = logging.INFO if result.ok else logging.ERROR
        log.log(level, "slurm %s %s: %s: %s", args.verb, result.node,
                "ok" if result.ok else "error", result.detail)
    _check_written(log)
    return NotFound.exit_code if unknown else exit_code(results)


def _logger(path: str | None) -> logging.Logger:
    log = logging.getLogger(LOGGER)
    log.setLevel(logging.INFO)
    log.propagate = False
    for handler in list(log.handlers):
        log.removeHandler(handler)
        with contextlib.suppress(OSError):  # a failed write was reported by that run
            handler.close()
    if path:
        handler = _FileHandler(path, delay=True)
        handler.setFormatter(_PrintableFormatter("%(asctime)s provisiond: %(message)s"))
    elif os.path.exists(SYSLOG_SOCKET):
        handler = logging.handlers.SysLogHandler(address=SYSLOG_SOCKET)
        handler.setFormatter(_PrintableFormatter("provisiond: %(message)s"))
    else:
        handler = _TerminalHandler()
        handler.setFormatter(_PrintableFormatter("provisiond: %(message)s"))
    log.addHandler(handler)
    return log


class _PrintableFormatter(logging.Formatter):
    """One log line per record, for a terminal or a log file: BMC answers and names
    escaped (see `printable`), so none can forge a line or drive a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))


class _TerminalHandler(logging.StreamHandler):
    """Log lines to stderr, where main() prints an error itself."""


class _FileHandler(logging.FileHandler):
    """`--log FILE`, opened at the first line: a file that cannot be opened (a folder
    SlurmUser may not write) or written (a full disk) is kept for `_check_written`, not
    printed as a traceback per line by logging, and the nodes are done all the same."""

    write_error: OSError | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self.stream is None:
                self.stream = self._open()
        except OSError:
            self.handleError(record)
            return
        super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        self.write_error = self.write_error or sys.exc_info()[1]


def _check_written(log: logging.Logger) -> None:
    """Raise the first error met writing the log file: the outcomes were not recorded."""
    for handler in log.handlers:
        error = getattr(handler, "write_error", None)
        if error is not None:
            raise OSError(error.errno, f"cannot write the log: {error.strerror}",
                          handler.baseFilename)
