"""Real processes: concurrent writers lose nothing; a writer killed mid-write corrupts nothing."""

import os
import signal
import subprocess
import sys
import time

import yaml

from provisiond.inventory import InventoryStore
from tests.conftest import run_provisiond

WRITER = """
import sys
from pathlib import Path
from provisiond.config import load_config
from provisiond.inventory import InventoryStore
from provisiond.inventory.model import Record
store = InventoryStore(load_config(Path(sys.argv[1])))
i = 0
while True:
    with store.edit() as inventory:
        for n in range(2000):
            inventory.nodes[f"w{n}"] = Record(comment=f"pass {i}", tags={"pass": str(i)})
    i += 1
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


def test_sigkill_mid_write_leaves_a_valid_inventory(state_dir, config):
    assert run_provisiond(state_dir, "node", "add", "keep").returncode == 0
    for delay in (0.6, 0.9, 1.3, 1.7, 2.2):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(state_dir)],
                                cwd=str(state_dir.parent))
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        inventory = InventoryStore(config).read()  # parses and validates
        assert "keep" in inventory.nodes
        passes = {r.comment for n, r in inventory.nodes.items() if n != "keep"}
        assert len(passes) <= 1, "a half-written pass would mix two passes"
    assert run_provisiond(state_dir, "node", "add", "after").returncode == 0
