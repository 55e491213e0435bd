"""Real processes: concurrent writers lose nothing; a writer killed mid-write corrupts nothing."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from provisiond.inventory import InventoryStore
from provisiond.inventory.model import Record
from provisiond.inventory.store import parse_inventory
from tests.conftest import run_provisiond

# One edit that rewrites every w* node, run by a child that stops itself (SIGSTOP) at the
# moment named by argv[2], whatever way the store writes: "write" = the first write() of
# data into a file named like the inventory (seen by a profile hook armed when such a file
# is opened for writing; a truncate-then-write has emptied the target by then), "rename" =
# just before a rename onto inventory.yaml (an audit hook: the new data is complete in
# another file, the target not yet replaced). Before stopping it writes that file's path
# to argv[3].
WRITER = """
import os, signal, sys
from pathlib import Path
from provisiond.config import load_config
from provisiond.inventory import InventoryStore
from provisiond.inventory.model import Record

state, moment, report = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
target = state / "inventory.yaml"
fired = []

def ours(path):
    return path.parent == state and "inventory.yaml" in path.name

def stop(path):
    fired.append(path)
    report.write_text(str(path))
    os.kill(os.getpid(), signal.SIGSTOP)

def on_call(frame, event, func):
    if fired or event != "c_call" or getattr(func, "__name__", "") != "write":
        return
    try:
        path = Path(os.readlink(f"/proc/self/fd/{func.__self__.fileno()}"))
    except (AttributeError, OSError, ValueError):
        return
    if ours(path):
        stop(path)

def on_audit(event, args):
    if fired or not args or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    path = Path(os.fsdecode(args[0]))
    if moment == "write" and event == "open" and ours(path) and args[2] & (
            os.O_WRONLY | os.O_RDWR):
        sys.setprofile(on_call)
    elif moment == "rename" and event == "os.rename" and Path(os.fsdecode(args[1])) == target:
        stop(path)

store = InventoryStore(load_config(state))
store.read()
sys.addaudithook(on_audit)
with store.edit() as inventory:
    for n in range(2000):
        inventory.nodes[f"w{n}"] = Record(comment="new", tags={"pass": "new"})
"""


def test_twenty_concurrent_node_adds_all_land(state_dir, config):
    env = dict(os.environ, PROVISIOND_STATE_DIR=str(state_dir))
    procs = [subprocess.Popen([sys.executable, "-m", "provisiond", "node", "add", f"c{i:02d}",
                               "--ipaddr", f"10.1.0.{i + 10}"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for i in range(20)]
    codes = [p.wait(timeout=120) for p in procs]
    assert codes == [0] * 20, [p.stderr.read() for p in procs]
    inventory = InventoryStore(config).read()
    assert sorted(inventory.nodes) == [f"c{i:02d}" for i in range(20)]
    assert inventory.revision == 20
    assert yaml.safe_load(config.inventory_path.read_text())["revision"] == 20


def _wait_stopped(proc: subprocess.Popen, seconds: float = 120) -> bool:
    """True once the child has stopped itself; False if it ended (reaped: its returncode is
    set) or the time ran out."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pid, status = os.waitpid(proc.pid, os.WUNTRACED | os.WNOHANG)
        if pid and os.WIFSTOPPED(status):
            return True
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return False
        time.sleep(0.02)
    return False


def _passes(inventory) -> set[str]:
    return {r.comment for name, r in inventory.nodes.items() if name != "keep"}


@pytest.mark.parametrize("moment", ["write", "rename"])
def test_sigkill_mid_write_leaves_the_whole_old_inventory(state_dir, config, tmp_path,
                                                          moment):
    """Killed at the dangerous moment, the writer leaves the whole old inventory: never a
    truncated, half-written or empty one."""
    with InventoryStore(config).edit() as inventory:
        inventory.nodes["keep"] = Record()
        for n in range(2000):
            inventory.nodes[f"w{n}"] = Record(comment="old", tags={"pass": "old"})
    old = config.inventory_path.read_bytes()
    report = tmp_path / "writer-report"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(state_dir), moment,
                             str(report)], cwd=str(state_dir.parent))
    try:
        assert _wait_stopped(proc), f"the writer never stopped at {moment!r}: it wrote " \
            "the inventory without passing that moment"
        in_flight = Path(report.read_text())
        assert in_flight.parent == state_dir
        if moment == "rename":  # the new inventory is complete, in a file of its own
            assert in_flight != config.inventory_path
            assert _passes(parse_inventory(in_flight.read_text(), str(in_flight))) == {"new"}
    finally:
        if proc.returncode is None:  # stopped, or still running when the time ran out
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
    assert config.inventory_path.read_bytes() == old
    inventory = InventoryStore(config).read()  # parses and validates
    assert len(inventory.nodes) == 2001 and _passes(inventory) == {"old"}
    assert run_provisiond(state_dir, "node", "add", "after").returncode == 0
    assert "after" in InventoryStore(config).read().nodes
