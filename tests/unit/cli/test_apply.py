"""`provisiond apply`: plan first, idempotent, prune, bad files change nothing."""

import json
from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "inventory" / "cluster.yaml"


def test_apply_creates_then_changes_nothing(cli):
    first = cli("apply", "-f", str(FIXTURE))
    assert first.code == 0, first.err
    assert "+ create node n001" in first.out and "+ create profile gpu" in first.out
    second = cli("apply", "-f", str(FIXTURE))
    assert second.code == 0
    assert "plan: 0 to create, 0 to update, 0 to delete" in second.out
    assert "nothing to change" in second.out
    node = json.loads(cli("node", "show", "n002", "--all", "--json").out)
    assert node["record"]["kernel_args"] == ["nouveau.modeset=0"]
    assert node["record"]["tags"] == {"role": "gpu-compute", "gpu": "true"}


def test_dry_run_changes_nothing(cli, config):
    result = cli("apply", "-f", str(FIXTURE), "--dry-run")
    assert result.code == 0 and "dry run" in result.out
    assert not config.inventory_path.exists()


def test_update_and_prune(cli, tmp_path):
    cli("apply", "-f", str(FIXTURE))
    cli("node", "add", "extra")
    changed = FIXTURE.read_text().replace("10.10.0.12", "10.10.0.22")
    path = tmp_path / "c.yaml"
    path.write_text(changed)
    kept = cli("apply", "-f", str(path))
    assert "~ update node n002" in kept.out and "extra" not in kept.out
    pruned = cli("apply", "-f", str(path), "--prune", "--json")
    plan = json.loads(pruned.out)
    assert {"kind": "node", "name": "extra"} in plan["delete"]
    names = [n["name"] for n in json.loads(cli("node", "list", "--json").out)]
    assert names == ["n001", "n002"]


def test_ranges_as_node_keys(cli, tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("nodes:\n  c[1-3]:\n    image: tiny\n")
    assert cli("apply", "-f", str(path)).code == 0
    assert len(json.loads(cli("node", "list", "--json").out)) == 3


def test_bad_files_one_line_and_inventory_unchanged(cli, config, tmp_path):
    cli("apply", "-f", str(FIXTURE))
    before = config.inventory_path.read_bytes()
    cases = {
        "nodes: [unclosed": "not valid YAML",
        "nodes:\n  n001:\n    colour: red\n": "node n001: colour: unknown field",
        "nodes:\n  n001:\n    profiles: [nope]\n": "node n001: profiles: unknown profile",
        "nodes:\n  n003:\n    netdevs: {eth0: {mac: '52:54:00:00:00:01'}}\n":
            "node n003: netdevs.eth0.mac: 52:54:00:00:00:01 is already used by node n001",
        "machines: {}\n": "only 'nodes' and 'profiles'",
    }
    for text, message in cases.items():
        path = tmp_path / "bad.yaml"
        path.write_text(text)
        result = cli("apply", "-f", str(path))
        assert result.code != 0, text
        assert message in result.err, (text, result.err)
        assert len(result.err.strip().splitlines()) == 1
        assert config.inventory_path.read_bytes() == before
