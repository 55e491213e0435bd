"""Discovered machines: MACs that booted the discovery image and reported their facts, and
what was decided for each (pending, approved as a node, rejected).

One JSON document, `<state>/discovery/machines.json`, replaced atomically under a lock, so
every HTTP worker and the CLI share it. It is bounded: at most `discovery.max_pending`
machines wait at once, at most `discovery.pending_per_address` of them enlisted from one
source address (spoofed MACs from one host fill no more), and decided ones beyond
`max_pending` go, oldest first.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from enum import Enum

from pydantic import BaseModel, Field, ValidationError

from provisiond.config import Config
from provisiond.discovery.facts import Facts
from provisiond.errors import NotFound, TooManyRequests, Unavailable
from provisiond.state.layout import Layout
from provisiond.state.local import Stamp, edited, file_stamp, read_json


class MachineState(str, Enum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"


class Machine(BaseModel):
    """One discovered machine: its boot MAC, where and when it reported, what it said."""

    mac: str
    seq: int = Field(description="discovery order: 1 for the first machine ever enlisted")
    state: MachineState = MachineState.PENDING
    first_seen: float
    last_seen: float
    address: str = Field(description="source address of its last report")
    reports: int = 1
    facts: Facts
    node: str | None = Field(None, description="the node it was approved as")
    decided_by: str | None = Field(None, description="cli:USER, token:NAME, rule:NAME, or "
                                   "inventory (a node was given its MAC otherwise)")
    decided_at: float | None = None
    problem: str | None = Field(None, description="why a matching rule did not approve it")


class Book(BaseModel):
    next_seq: int = 1
    machines: dict[str, Machine] = {}


class MachineNotFound(NotFound):
    """No discovered machine has this MAC."""


def book_path(config: Config):
    return Layout.of(config).machines


_read: dict[str, tuple[Stamp, Book]] = {}  # path -> the book last parsed, and its stat
BOOKS_KEPT = 4


def read_book(config: Config) -> Book:
    """The machines as last written (no lock: writes replace the file whole), parsed again
    only once the file changed: every waiting machine's poll reads it (at 1000 waiting,
    100 a second; a parse of that book takes 50 ms). Shared: not to be changed."""
    path = book_path(config)
    stamp = file_stamp(path)  # before the read: a write meanwhile is parsed next time
    kept = _read.get(str(path))
    if stamp is not None and kept is not None and kept[0] == stamp:
        return kept[1]
    book = _book(read_json(path))
    _read.pop(str(path), None)
    if len(_read) >= BOOKS_KEPT:
        _read.pop(next(iter(_read)))
    if stamp is not None:
        _read[str(path)] = (stamp, book)
    return book


def _book(data: dict) -> Book:
    try:
        return Book.model_validate(data)
    except ValidationError:
        return Book()  # a hand-edited file; the next write starts it anew


@contextlib.contextmanager
def edit_book(config: Config) -> Iterator[Book]:
    """The book under the lock; written back when the block ends without an error."""
    with edited(book_path(config)) as data:
        book = _book(data)
        yield book
        data.clear()
        data.update(book.model_dump(mode="json"))


def get_machine(config: Config, mac: str) -> Machine:
    machine = read_book(config).machines.get(mac)
    if machine is None:
        raise MachineNotFound(f"no discovered machine with MAC {mac}")
    return machine


def enlist(config: Config, mac: str, address: str, facts: Facts, reopen: bool = False,
           nodes: dict[str, str] | None = None) -> tuple[Machine, bool]:
    """Record a report from `mac` (a new machine, or new facts of a known one); returns
    the machine and whether it is new. `reopen`: the MAC is no node (any more), so an
    approved record is stale and the machine enlists anew. `nodes` (MAC -> node) settles
    waiting machines whose MAC a node has now (see settle_nodes) before the bounds are
    counted. A new one beyond the bounds: TooManyRequests (its address has enough waiting)
    or Unavailable (the queue is full); nothing is written."""
    now = time.time()
    with edit_book(config) as book:
        settle_nodes(book, nodes or {}, now)
        machine = book.machines.get(mac)
        if machine is not None and reopen and machine.state is MachineState.APPROVED:
            del book.machines[mac]
            machine = None
        if machine is not None:
            machine.last_seen, machine.address, machine.facts = now, address, facts
            machine.reports += 1
            return machine, False
        check_room(config, book, address)
        machine = Machine(mac=mac, seq=book.next_seq, first_seen=now, last_seen=now,
                          address=address, facts=facts)
        book.next_seq += 1
        book.machines[mac] = machine
        trim_decided(book, config.discovery.max_pending)
        return machine, True


def settle_nodes(book: Book, nodes: dict[str, str], now: float) -> None:
    """Mark waiting machines whose MAC a node has (made by `node add --mac`, not approved
    here, or an approval cut short before its book write) approved as that node: they boot
    as it, cannot be rejected, and waiting they held room in the bounds for good."""
    for machine in book.machines.values():
        node = nodes.get(machine.mac)
        if node is not None and machine.state is MachineState.PENDING:
            machine.state, machine.node, machine.problem = MachineState.APPROVED, node, None
            machine.decided_by, machine.decided_at = "inventory", now


def check_room(config: Config, book: Book, address: str) -> None:
    pending = [m for m in book.machines.values() if m.state is MachineState.PENDING]
    settings = config.discovery
    if sum(m.address == address for m in pending) >= settings.pending_per_address:
        raise TooManyRequests(f"{address} has {settings.pending_per_address} machines waiting "
                              "for approval already (discovery.pending_per_address)")
    if len(pending) >= settings.max_pending:
        raise Unavailable(f"{len(pending)} machines wait for approval already "
                          "(discovery.max_pending): approve or reject some")


def trim_decided(book: Book, keep: int) -> None:
    """Forget the oldest decided machines beyond `keep`."""
    decided = sorted((m for m in book.machines.values() if m.state is not MachineState.PENDING),
                     key=lambda m: m.decided_at or 0)
    for machine in decided[:max(0, len(decided) - keep)]:
        del book.machines[machine.mac]


def decide(config: Config, outcomes: dict[str, str | None], state: MachineState, actor: str,
           problem: str | None = None) -> list[Machine]:
    """Mark the machines (MAC -> node name, or None) approved or rejected by `actor`."""
    now = time.time()
    with edit_book(config) as book:
        changed = []
        for mac, node in outcomes.items():
            machine = book.machines.get(mac)
            if machine is None:
                continue
            machine.state, machine.node, machine.problem = state, node, problem
            machine.decided_by, machine.decided_at = actor, now
            changed.append(machine)
        trim_decided(book, config.discovery.max_pending)
    return changed


def note_problem(config: Config, mac: str, problem: str | None) -> None:
    with edit_book(config) as book:
        if mac in book.machines:
            book.machines[mac].problem = problem


def forget_machines(config: Config, macs: list[str]) -> list[str]:
    """Remove machines from the book (they enlist again at their next report)."""
    with edit_book(config) as book:
        return [mac for mac in macs if book.machines.pop(mac, None) is not None]
