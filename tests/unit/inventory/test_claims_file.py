"""The claims file (.inventory.claims.json): a new process (a CLI run) that writes one node
checks that node against the claims saved by the last writer instead of checking the whole
inventory, and trusts them only for the very text, server address and checks they were
found for."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest

from provisiond.errors import InvalidInventory
from provisiond.inventory import InventoryStore
from provisiond.inventory import store as store_module
from provisiond.inventory import validate
from provisiond.inventory.model import Record
from tests.conftest import REPO


def _node(mac: str, ip: str, bmc: str | None = None) -> Record:
    data = {"netdevs": {"eth0": {"mac": mac, "ipaddr": ip, "netmask": "255.255.255.0"}}}
    if bmc:
        data["bmc"] = {"address": bmc, "driver": "redfish", "system_id": "sys1"}
    return Record.model_validate(data)


@pytest.fixture
def whole_checks(monkeypatch):
    """How many whole-inventory checks ran (validate.check_inventory, as the store calls it)."""
    calls = []
    real = validate.check_inventory

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(store_module, "check_inventory", counting)
    return calls


@pytest.fixture
def new_process(monkeypatch):
    """Forget what this process kept, as a new CLI process starts with nothing."""
    def forget():
        monkeypatch.setattr(store_module, "_versions", {})
    return forget


def _three_nodes(config):
    with InventoryStore(config).edit_records() as inventory:
        inventory.nodes["n1"] = _node("52:54:00:00:00:01", "10.0.0.1", "127.0.0.9")
        inventory.nodes["n2"] = _node("52:54:00:00:00:02", "10.0.0.2")
        inventory.nodes["n3"] = _node("52:54:00:00:00:03", "10.0.0.3")


def test_a_new_process_checks_only_the_node_it_writes(config, whole_checks, new_process):
    _three_nodes(config)
    new_process()
    whole_checks.clear()
    with InventoryStore(config).edit_records() as inventory:
        inventory.nodes["n2"] = _node("52:54:00:00:00:22", "10.0.0.22")
    assert whole_checks == []
    assert InventoryStore(config).read().nodes["n2"].netdevs["eth0"].ipaddr == "10.0.0.22"


@pytest.mark.parametrize("field, value, message", [
    ("mac", "52:54:00:00:00:01", "52:54:00:00:00:01 is already used by node n1"),
    ("ip", "10.0.0.1", "10.0.0.1 is already used by node n1"),
    ("bmc", "127.0.0.9", "is already used by node n1"),
])
def test_the_saved_claims_still_refuse_what_another_node_holds(
        config, whole_checks, new_process, field, value, message):
    """The claims read back (a BMC endpoint is a tuple again) catch a clash with a node
    that did not change, without the whole check."""
    _three_nodes(config)
    new_process()
    whole_checks.clear()
    mac, ip, bmc = "52:54:00:00:00:33", "10.0.0.33", None
    mac, ip, bmc = {"mac": (value, ip, bmc), "ip": (mac, value, bmc),
                    "bmc": (mac, ip, value)}[field]
    before = config.inventory_path.read_bytes()
    with pytest.raises(InvalidInventory, match=message):
        with InventoryStore(config).edit_records() as inventory:
            inventory.nodes["n3"] = _node(mac, ip, bmc)
    assert whole_checks == []
    assert config.inventory_path.read_bytes() == before


def _claims_file(config):
    return config.inventory_path.parent / ".inventory.claims.json"


@pytest.mark.parametrize("spoil", [
    "hand-edited inventory", "another server address", "other checks", "damaged",
    "not a claims shape",
])
def test_claims_not_found_for_this_text_server_and_checks_are_not_trusted(
        config, whole_checks, new_process, spoil):
    """Whatever the file holds then, the whole inventory is checked, and a clash the
    file's claims would miss is still refused."""
    _three_nodes(config)
    path = _claims_file(config)
    saved = json.loads(path.read_text())
    if spoil == "hand-edited inventory":
        text = config.inventory_path.read_text()
        config.inventory_path.write_text(text.replace("10.0.0.2\n", "10.0.0.1\n"))
    elif spoil == "another server address":
        saved["server"] = "10.9.9.9"
    elif spoil == "other checks":
        saved["checks"] = "0" * 64
    elif spoil == "damaged":
        path.write_text(path.read_text()[:40])
    else:
        saved["claims"] = {"loopback_ok": True, "held": [["ip", {"a": 1}, "node n9"]]}
    if spoil not in ("hand-edited inventory", "damaged"):
        path.write_text(json.dumps(saved))
    new_process()
    whole_checks.clear()
    if spoil == "hand-edited inventory":  # n2 now has n1's address: the whole check says so
        with pytest.raises(InvalidInventory, match="10.0.0.1 is already used"):
            with InventoryStore(config).edit_records() as inventory:
                inventory.nodes["n3"] = _node("52:54:00:00:00:33", "10.0.0.33")
    else:
        with InventoryStore(config).edit_records() as inventory:
            inventory.nodes["n3"] = _node("52:54:00:00:00:33", "10.0.0.33")
    assert whole_checks == [1]


def test_serve_s_check_saves_the_claims_a_cli_run_then_uses(config, whole_checks, new_process):
    """valid_nodes (serve, the boot table) checks a hand-written inventory whole once and
    saves its claims; the next CLI write uses them."""
    _three_nodes(config)
    _claims_file(config).unlink()
    new_process()
    whole_checks.clear()
    InventoryStore(config).valid_nodes()
    assert whole_checks == [1]
    new_process()
    with InventoryStore(config).edit_records() as inventory:
        inventory.nodes["n4"] = _node("52:54:00:00:00:04", "10.0.0.4")
    assert whole_checks == [1]


STRICTER = """
_older_check = check_inventory


def check_inventory(inventory, config=None):
    for name, record in inventory.nodes.items():
        if record.comment == "legacy":
            raise InvalidInventory(f"node {name}: comment: 'legacy' is refused now")
    return _older_check(inventory, config)
"""


def test_claims_found_by_the_checks_a_process_runs_are_not_labelled_as_an_upgrade_s(
        state_dir, tmp_path):
    """A server started on an empty inventory reads no claims, so nothing had asked for
    the checks' identity; its first write after the package was upgraded under it (same
    release number: a git build) hashed the new sources and labelled what its old checks
    found as theirs. The upgraded CLI then trusted them: a node its rules refuse stayed."""
    source = tmp_path / "site-packages"
    shutil.copytree(REPO / "provisiond", source / "provisiond",
                    ignore=shutil.ignore_patterns("__pycache__"))
    rules = source / "provisiond" / "inventory" / "validate.py"
    setup = f"""
from pathlib import Path
from provisiond.config import load_config
from provisiond.errors import InvalidInventory
from provisiond.inventory import InventoryStore
from provisiond.inventory.model import Record
config = load_config(Path({str(state_dir)!r}))
"""
    old_server = setup + f"""
rules = Path({str(rules)!r})
rules.write_text(rules.read_text() + {STRICTER!r})  # the upgrade, under the running server
with InventoryStore(config).edit_records() as inventory:
    inventory.nodes["n1"] = Record(comment="legacy")
"""
    new_cli = setup + """
try:
    with InventoryStore(config).edit_records() as inventory:
        inventory.nodes["n2"] = Record()
except InvalidInventory as exc:
    print(exc)
"""
    for script in (old_server, new_cli):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              env={"PYTHONPATH": str(source), "PYTHONDONTWRITEBYTECODE": "1"},
                              cwd=tmp_path, timeout=120)
        assert done.returncode == 0, done.stderr
    assert done.stdout == "node n1: comment: 'legacy' is refused now\n"
    assert "n2" not in (state_dir / "inventory.yaml").read_text()
