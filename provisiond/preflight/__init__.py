"""`provisiond doctor`: what would stop a boot, found before a node tries.

Each check reads and probes, never changes anything (a port is bound and let go at once; a
BMC is asked its power state). A finding is `fail` when a boot (or power control) would
fail, `warn` when it would work in a lesser way, `ok` otherwise; each problem names its fix.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from provisiond.config import Config

LEVELS = ("ok", "warn", "fail")


@dataclass(frozen=True)
class Finding:
    check: str
    """settings, inventory, listener, interface, ipxe, state-dir, discovery, mac, address,
    image, mounted, overlays, bmc"""
    subject: str
    level: str
    detail: str
    fix: str = ""

    def to_data(self) -> dict:
        return asdict(self)


def ok(check: str, subject: str, detail: str) -> Finding:
    return Finding(check, subject, "ok", detail)


def warn(check: str, subject: str, detail: str, fix: str) -> Finding:
    return Finding(check, subject, "warn", detail, fix)


def fail(check: str, subject: str, detail: str, fix: str) -> Finding:
    return Finding(check, subject, "fail", detail, fix)


def run_checks(config: Config, pattern: str | None = None, bmc: bool = True,
               bmc_timeout: float = 3.0) -> list[Finding]:
    """Every check: the host's (settings, listeners, iPXE files, the state dir), the
    discovery image when discovery is on, then each node's of `pattern` (default: all)."""
    from provisiond.preflight import host, nodes

    findings = host.check_host(config) + nodes.check_discovery(config)
    findings += nodes.check_nodes(config, pattern, bmc, bmc_timeout)
    return findings
