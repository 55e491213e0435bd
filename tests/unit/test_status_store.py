"""Node status on the store: status/<node>.json, changed by compare-and-swap."""

import json
import threading
import time

from provisiond import status
from provisiond.status import read_status, record_phase
from provisiond.states import NodePhase
from tests.memstore import MemoryStore


def test_phase_is_a_status_key(config, store):
    status.record_phase(config, "n1", NodePhase.DHCP)
    status.record_refusal(config, "n1", {"reason": "expired"})
    stored = json.loads(store.get("status/n1.json").value)
    assert stored["phase"] == "dhcp" and stored["token_refused"]["reason"] == "expired"
    assert status.read_all_status(config) == {"n1": stored}
    status.clear_status(config, "n1")
    assert status.read_status(config, "n1") is None and store.list("status/") == []


def test_a_damaged_status_starts_a_new_boot_record(config, store):
    """A status whose phases are not a mapping (edited by hand, written by another tool)
    made record_phase raise TypeError: the phase writer thread or process of serve died of
    it and recorded no phase of any node after."""
    for damaged in ({"phases": 5}, {"phases": ["dhcp"]}, {"phases": None}):
        store.put("status/n1.json", json.dumps(damaged).encode())
        written = status.record_phase(config, "n1", NodePhase.KERNEL, "k")
        assert written["phase"] == "kernel" and written["phases"] == {"kernel": written["updated"]}
        assert status.read_status(config, "n1") == written


class HeldStore(MemoryStore):
    """Holds the first read of thread `held` until `release` is set."""

    def __init__(self):
        super().__init__()
        self.held, self.reading, self.release = None, threading.Event(), threading.Event()

    def get(self, key):
        if threading.current_thread() is self.held and not self.release.is_set():
            self.reading.set()
            assert self.release.wait(10)
        return super().get(key)


def test_later_stored_phase_has_later_time(config, monkeypatch):
    """A phase taken by one process a moment before another's but stored after it must not
    carry the earlier time (it did: the time was taken before the lock)."""
    store = HeldStore()
    monkeypatch.setattr("provisiond.state.open.open_store", lambda config: store)
    ticks = iter(range(1, 100))
    monkeypatch.setattr(status.time, "time", lambda: float(next(ticks)))
    first = threading.Thread(target=status.record_phase,
                             args=(config, "n1", NodePhase.KERNEL))
    store.held = first
    status.record_phase(config, "n1", NodePhase.DHCP)
    first.start()
    assert store.reading.wait(10)
    status.record_phase(config, "n1", NodePhase.IPXE)  # a moment later, stored first
    store.release.set()
    first.join(10)
    stored = json.loads(store.get("status/n1.json").value)
    assert stored["phase"] == "kernel"
    assert stored["updated"] >= stored["phases"]["ipxe"]


def test_a_phase_written_late_does_not_replace_the_agents_later_report(config):
    """serve's phase writer lags behind a storm: the `ipxe` of a request made before the
    agent's `booted` may be written after it. It joins the boot's phases; `booted` stays
    the node's phase and no event announces ipxe after it (test_status_reports failed so
    on the slower store, and a real node could show `ipxe` after `ready`)."""
    from provisiond.events import read_since

    record_phase(config, "n1", NodePhase.DHCP)
    requested = time.time()
    record_phase(config, "n1", NodePhase.BOOTED, "up")
    status = record_phase(config, "n1", NodePhase.IPXE, at=requested)
    assert (status["phase"], status["detail"]) == ("booted", "up")
    assert status["phases"]["ipxe"] == requested
    assert read_status(config, "n1")["phase"] == "booted"
    assert [e.data["phase"] for e in read_since(config, 0) if e.kind == "node.phase"] == \
        ["dhcp", "booted"]
    # a phase of an older boot than the stored one is dropped
    status = record_phase(config, "n1", NodePhase.KERNEL, at=requested - 3600)
    assert "kernel" not in status["phases"]
