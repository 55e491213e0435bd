"""Hardware facts a machine reports (the collector `provisiond-facts` in the discovery image
and the agent overlay): their declared shape, their bounds, and where a node's are kept.

A report is untrusted input: every string is bounded and free of control characters, every
list and number bounded, unknown fields refused (the API bounds the body: 64 KiB).
A node's last report is `<state>/discovery/facts/<node>.json` ({"time", "facts"});
`facts_of(config, node)` is how other parts (`provisiond slurm config`) read it.
"""

from __future__ import annotations

import ipaddress
import json
import time
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from provisiond.atomic import write_atomic
from provisiond.config import CONTROL_RE, Config
from provisiond.inventory.values import check_node_mac
from provisiond.state.layout import Layout
from provisiond.state.local import read_json

def _plain(value: str) -> str:
    if CONTROL_RE.search(value):
        raise ValueError("a control or format character")
    return value


def _text(value: str) -> str:
    return _plain(value).strip()


def _address(value: str) -> str:
    return str(ipaddress.ip_address(value))


Text = Annotated[str, Field(max_length=128), AfterValidator(_text)]
Mac = Annotated[str, Field(max_length=17), AfterValidator(check_node_mac)]
Count = Annotated[int, Field(ge=0, le=1 << 20)]


class _Shape(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Cpu(_Shape):
    sockets: Count = Field(description="physical packages")
    cores: Count = Field(description="physical cores, all sockets")
    threads: Count = Field(description="logical CPUs (what Slurm calls CPUs)")
    model: Text | None = None


class Disk(_Shape):
    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9._-]{1,32}$")]
    size_bytes: int = Field(ge=0, le=1 << 62)
    model: Text | None = None
    serial: Text | None = None


class Nic(_Shape):
    name: Annotated[str, Field(pattern=r"^[^\s/:]{1,15}$"), AfterValidator(_plain)]
    mac: Mac
    link: bool | None = None
    speed_mbps: int | None = Field(None, ge=0, le=10_000_000)


class Dmi(_Shape):
    vendor: Text | None = None
    product: Text | None = None
    serial: Text | None = None
    uuid: Text | None = None


class Bmc(_Shape):
    address: Annotated[str, Field(max_length=45), AfterValidator(_address)] | None = None
    mac: Mac | None = None


class Facts(_Shape):
    """What a machine says of its hardware."""

    cpu: Cpu
    memory_mib: int = Field(ge=0, le=1 << 32, description="installed memory, MiB")
    disks: list[Disk] = Field([], max_length=64)
    nics: list[Nic] = Field([], max_length=64)
    dmi: Dmi = Dmi()
    bmc: Bmc | None = None


SECTIONS = {"cpu": Cpu, "dmi": Dmi, "bmc": Bmc}


class NodeFacts(BaseModel):
    """A node's last report and when it came."""

    time: float
    facts: Facts


def flat_facts(facts: Facts, mac: str | None = None) -> dict[str, object]:
    """The scalar facts by dotted name (cpu.threads, dmi.product...), what rules match and
    `discover approve --sort` sorts by; `mac` is the boot MAC, nics.count and disks.count
    the list lengths."""
    flat: dict[str, object] = {"mac": mac, "memory_mib": facts.memory_mib,
                               "nics.count": len(facts.nics), "disks.count": len(facts.disks)}
    for section, model in SECTIONS.items():
        fields = getattr(facts, section)
        for key in model.model_fields:
            flat[f"{section}.{key}"] = getattr(fields, key) if fields is not None else None
    return flat


FACT_NAMES = ("mac", "memory_mib", "nics.count", "disks.count",
              *(f"{s}.{k}" for s, model in SECTIONS.items() for k in model.model_fields))
"""Every name flat_facts gives, for rules and --sort to check theirs against."""


def facts_path(config: Config, node: str):
    return Layout.of(config).facts(node)


def record_facts(config: Config, node: str, facts: Facts, when: float | None = None) -> NodeFacts:
    """Keep `facts` as the node's last report."""
    stored = NodeFacts(time=when or time.time(), facts=facts)
    write_atomic(facts_path(config, node), stored.model_dump_json(), durable=False)
    return stored


def facts_of(config: Config, node: str) -> NodeFacts | None:
    """The node's last reported facts (CPUs: .facts.cpu.threads, memory: .facts.memory_mib)
    and their time, or None if it never reported (or the file is unreadable)."""
    data = read_json(facts_path(config, node))
    try:
        return NodeFacts.model_validate(data) if data else None
    except ValidationError:
        return None


def forget_facts(config: Config, node: str) -> None:
    facts_path(config, node).unlink(missing_ok=True)


def facts_document(stored: NodeFacts | None) -> dict | None:
    return json.loads(stored.model_dump_json()) if stored else None
