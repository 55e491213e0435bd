"""`provisiond init`, `node status`, the CLI's error contract."""

import json

from provisiond import audit, events
from provisiond.audit import cli_actor
from provisiond.cli import main
from provisiond.config import load_config
from provisiond.states import NodePhase
from provisiond.status import read_status, record_phase


def test_init_writes_config_and_profiles_once(tmp_path, capsys):
    fresh = tmp_path / "fresh"
    assert main(["--state-dir", str(fresh), "init", "--address", "10.9.0.1"]) == 0
    out = capsys.readouterr().out
    assert "wrote" in out and "imported profiles: compute, default, gpu, service" in out
    assert "address: 10.9.0.1" in (fresh / "provisiond.yaml").read_text()
    assert load_config(fresh).server.address == "10.9.0.1"
    assert main(["--state-dir", str(fresh), "init"]) == 0
    out = capsys.readouterr().out
    assert "kept" in out and "imported" not in out


def test_profiles_init_imports_are_audited_and_announced(tmp_path, capsys):
    """Every CLI write is audited: init's profile import wrote the inventory directly."""
    fresh = tmp_path / "fresh"
    assert main(["--state-dir", str(fresh), "init"]) == 0
    config = load_config(fresh)
    entries = audit.read(config, action="profile.create")
    assert len(entries) == 1 and entries[0]["actor"] == cli_actor()
    assert entries[0]["target"] == "profile:compute,default,gpu,service"
    changed = [e for e in events.read_since(config, 0) if e.kind == "inventory.changed"]
    assert [e.data["names"] for e in changed] == [["compute", "default", "gpu", "service"]]
    assert main(["--state-dir", str(fresh), "init"]) == 0  # nothing new: nothing recorded
    assert len(audit.read(config, action="profile.create")) == 1


def test_status_shows_phases_and_a_new_boot_resets_them(cli, config):
    cli("node", "add", "n1")
    record_phase(config, "n1", NodePhase.DHCP)
    record_phase(config, "n1", NodePhase.IPXE)
    record_phase(config, "n1", NodePhase.READY, "nomad up")
    data = json.loads(cli("node", "status", "--json").out)
    assert data["n1"]["phase"] == "ready"
    assert list(data["n1"]["phases"]) == ["dhcp", "ipxe", "ready"]
    table = cli("node", "status").out
    assert "ready" in table and "dhcp+0.0" in table and "nomad up" in table
    record_phase(config, "n1", NodePhase.DHCP)
    assert list(read_status(config, "n1")["phases"]) == ["dhcp"]


def test_bad_config_is_one_line_not_a_traceback(cli, state_dir):
    (state_dir / "provisiond.yaml").write_text("http: [")
    result = cli("node", "list")
    assert result.code == 2
    assert result.err.startswith("provisiond: error:") and "Traceback" not in result.err
