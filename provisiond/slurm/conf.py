"""slurm.conf from the inventory: the nodes that list the `slurm` overlay, with CPUs and
RealMemory from their records, partitions from a tag, and power saving through provisiond.

The text depends on nothing but the inventory and the settings (no time stamp), so writing
it again unchanged changes no node's overlay. Nodes with the same attributes share a line
(`NodeName=n[001-128] ...`), at most NODES_PER_LINE names each, as Slurm's parser reads
lines into a bounded buffer.
"""

from __future__ import annotations

import shlex
import socket
import sys
from collections import defaultdict
from dataclasses import dataclass

from provisiond.atomic import write_atomic
from provisiond.config import SLURM_NAME_RE, Config
from provisiond.errors import InvalidInput
from provisiond.inventory import load_nodes
from provisiond.inventory.merge import Node
from provisiond.discovery.facts import facts_of
from provisiond.inventory.model import Slurm, node_sort_key
from provisiond.inventory.ranges import fold
from provisiond.state.layout import Layout

OVERLAY = "slurm"
"""Nodes that list this runtime overlay are Slurm's nodes: they get slurm.conf and the key."""
NODES_PER_LINE = 64
DEFAULTS = {
    "AuthType": "auth/munge",
    "MpiDefault": "none",
    "ProctrackType": "proctrack/linuxproc",
    "ReturnToService": "2",
    "SlurmctldTimeout": "120",
    "SlurmdTimeout": "300",
}
"""provisiond's choices where Slurm's default does not suit stateless nodes (ReturnToService
2: a node that was down serves again when it registers, as a resumed node does);
`slurm.options` replaces any of them."""


@dataclass(frozen=True)
class SlurmConf:
    text: str
    nodes: list[str]
    partitions: dict[str, list[str]]


def program_path(config: Config, verb: str) -> str:
    """The ResumeProgram (`verb` resume) or SuspendProgram slurm.conf names."""
    configured = getattr(config.slurm, f"{verb}_program")
    return configured or str(Layout.of(config).slurm_program(verb))


def slurm_nodes(nodes: dict[str, Node]) -> list[Node]:
    """The nodes that list the slurm overlay, in natural order."""
    return [nodes[name] for name in sorted(nodes, key=node_sort_key)
            if OVERLAY in (nodes[name].record.runtime_overlays or [])]


def render_conf(config: Config, nodes: dict[str, Node]) -> SlurmConf:
    """slurm.conf for `nodes` (the inventory's, merged) and the settings; a node without
    `slurm.cpus` gets the CPUs its agent last reported (provisiond.discovery.facts)."""
    members = slurm_nodes(nodes)
    if not members:
        raise InvalidInput(f"no node lists the {OVERLAY!r} runtime overlay: slurm.conf "
                           "would name no node")
    partitions = _partitions(config, members)
    lines = [f"# slurm.conf for {fold([n.name for n in members])}, written by `provisiond "
             "slurm config` from the",
             "# inventory and provisiond.yaml (slurm:). Do not edit: run it again.", ""]
    lines += [f"{key}={value}" for key, value in _options(config).items()]
    lines.append("")
    lines += _node_lines(members, lambda name: reported_cpus(config, name))
    lines += [_partition_line(config, name, names) for name, names in partitions.items()]
    return SlurmConf("\n".join(lines) + "\n", [n.name for n in members], partitions)


def _options(config: Config) -> dict[str, str]:
    slurm = config.slurm
    options = {
        "ClusterName": slurm.cluster_name,
        "SlurmctldHost": f"{slurm.controller or short_hostname()}"
                         f"({slurm.controller_address or config.server.address})",
        **DEFAULTS,
    }
    if slurm.suspend_time is not None:
        options.update({
            "SuspendTime": str(slurm.suspend_time),
            "SuspendTimeout": str(slurm.suspend_timeout),
            "ResumeTimeout": str(slurm.resume_timeout),
            "ResumeProgram": program_path(config, "resume"),
            "SuspendProgram": program_path(config, "suspend"),
        })
    options.update(slurm.options)
    return options


def short_hostname() -> str:
    return socket.gethostname().split(".")[0]


def reported_cpus(config: Config, name: str) -> int | None:
    """The logical CPUs the node's agent last reported (what Slurm calls CPUs). Its
    reported memory is not used: it is the installed memory, above what slurmd reports as
    RealMemory (the kernel keeps some), and a RealMemory above that drains the node."""
    stored = facts_of(config, name)
    return stored.facts.cpu.threads if stored else None


def _node_lines(members: list[Node], cpus_of) -> list[str]:
    """One line per group of nodes with the same attributes (and per NODES_PER_LINE)."""
    groups: dict[str, list[Node]] = defaultdict(list)
    for node in members:
        groups[_attributes(node, cpus_of)].append(node)
    lines = []
    for attributes, group in groups.items():
        for start in range(0, len(group), NODES_PER_LINE):
            chunk = group[start:start + NODES_PER_LINE]
            addresses = [n.ipaddr for n in chunk]
            where = f" NodeAddr={','.join(addresses)}" if all(addresses) else ""
            lines.append(f"NodeName={fold([n.name for n in chunk])}{where}{attributes}")
    return lines


def _attributes(node: Node, cpus_of) -> str:
    """The NodeName line's attributes from the node's `slurm` settings ('' if none), CPUs
    from its reported facts when the settings have none."""
    slurm = node.record.slurm or Slurm()
    cpus = slurm.cpus if slurm.cpus is not None else cpus_of(node.name)
    pairs = [("CPUs", cpus), ("Sockets", slurm.sockets),
             ("CoresPerSocket", slurm.cores_per_socket),
             ("ThreadsPerCore", slurm.threads_per_core), ("RealMemory", slurm.real_memory),
             ("Weight", slurm.weight),
             ("Feature", ",".join(slurm.features) if slurm.features else None)]
    return "".join(f" {key}={value}" for key, value in pairs if value is not None)


def _partitions(config: Config, members: list[Node]) -> dict[str, list[str]]:
    """Partition -> its nodes: from the node's partition tag (comma-separated), else the
    default partition; the default first, then by name."""
    tag = config.slurm.partition_tag
    found: dict[str, list[str]] = defaultdict(list)
    for node in members:
        value = (node.record.tags or {}).get(tag)
        names = [p.strip() for p in value.split(",")] if value else \
            [config.slurm.default_partition]
        for name in names:
            if not SLURM_NAME_RE.fullmatch(name):
                raise InvalidInput(f"node {node.name}: tag {tag}: {name!r} is not a "
                                   "partition name (letters, digits, '_', '.', '-')")
            found[name].append(node.name)
    default = config.slurm.default_partition
    return {name: found[name] for name in sorted(found, key=lambda n: (n != default, n))}


def _partition_line(config: Config, name: str, names: list[str]) -> str:
    default = " Default=YES" if name == config.slurm.default_partition else ""
    return f"PartitionName={name} Nodes={fold(names)}{default} MaxTime=INFINITE State=UP"


def power_program(config: Config, verb: str) -> str:
    """The shell script slurmctld runs as ResumeProgram or SuspendProgram: Slurm passes
    the hostlist as the only argument; this adds the state dir and the log. Python runs
    isolated (-I): slurmctld's working directory and environment choose no module."""
    argv = [sys.executable, "-I", "-m", "provisiond", "--state-dir", str(config.state_dir),
            "slurm", verb]
    if config.slurm.power_log:
        argv += ["--log", config.slurm.power_log]
    return ("#!/bin/sh\n"
            f"# Slurm's {verb.capitalize()}Program, written by `provisiond slurm config`.\n"
            f"exec {shlex.join(argv)} \"$1\"\n")


def write_conf(config: Config) -> SlurmConf:
    """Write <state>/slurm/slurm.conf (the copy the slurm overlay gives nodes) and the
    resume and suspend programs (when slurm.conf names the defaults)."""
    conf = render_conf(config, load_nodes(config))
    layout = Layout.of(config)
    write_atomic(layout.slurm_conf, conf.text)
    for verb in ("resume", "suspend"):
        if getattr(config.slurm, f"{verb}_program") is None:
            write_atomic(layout.slurm_program(verb), power_program(config, verb), mode=0o755)
    return conf
