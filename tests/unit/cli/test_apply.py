"""`provisiond apply`: plan first, idempotent, prune, bad files change nothing."""

import io
import json
from pathlib import Path

import pytest

from provisiond.inventory.secrets import BMC_PASSWORD, SecretStore
from provisiond.overlays.build import node_dir
from provisiond.overlays.hostkeys import host_key_dir
from provisiond.states import NodePhase
from provisiond.status import read_status, record_phase

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
    pruned = cli("apply", "-f", str(path), "--prune", "--yes", "--json")
    plan = json.loads(pruned.out)
    assert {"kind": "node", "name": "extra", "changes": []} in plan["delete"]
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


def write(tmp_path, text: str) -> str:
    path = tmp_path / "apply.yaml"
    path.write_text(text)
    return str(path)


def nodes(cli) -> dict:
    return {n["name"]: n for n in json.loads(cli("node", "list", "--json").out)}


def test_the_plan_shows_every_field_that_changes(cli, tmp_path):
    cli("apply", "-f", str(FIXTURE))
    assert cli("node", "set", "n001", "--bmc-address", "10.20.0.1", "--bmc-port", "623").code == 0
    path = write(tmp_path, "nodes:\n  n001: {profiles: [compute], comment: rack 3}\n")
    result = cli("apply", "-f", path, "--dry-run")
    assert result.code == 0, result.err
    assert "~ update node n001" in result.out
    for line in ("netdevs.eth0.mac: 52:54:00:00:00:01 -> (unset)",
                 "netdevs.eth0.ipaddr: 10.10.0.11 -> (unset)",
                 "bmc.address: 10.20.0.1 -> (unset)", "bmc.port: 623 -> (unset)",
                 "comment: (unset) -> rack 3"):
        assert f"    {line}\n" in result.out, (line, result.out)
    assert "profiles:" not in result.out
    plan = json.loads(cli("apply", "-f", path, "--json", "--dry-run").out)
    changes = {c["field"]: (c["before"], c["after"]) for c in plan["update"][0]["changes"]}
    assert changes["netdevs.eth0.ipaddr"] == ("10.10.0.11", None)
    assert changes["bmc.port"] == (623, None)
    assert changes["comment"] == (None, "rack 3")
    assert len(changes) == 5


def test_the_json_plan_gives_each_field_as_a_path(cli, tmp_path):
    """A netdev or tag name may hold a dot (eth0.100, rack.row): the dotted field is for
    people, the path list for scripts."""
    path = write(tmp_path, "nodes:\n  v1:\n    netdevs: {eth0.100: {mac: '52:54:00:00:0a:01'}}\n"
                           "    tags: {rack.row: r1}\n")
    plan = json.loads(cli("apply", "-f", path, "--json", "--dry-run").out)
    changes = plan["create"][0]["changes"]
    assert [c["path"] for c in changes] == [["netdevs", "eth0.100", "mac"], ["tags", "rack.row"]]
    assert [c["field"] for c in changes] == ["netdevs.eth0.100.mac", "tags.rack.row"]


@pytest.mark.parametrize("text, message", [
    ("nodes:\n  n003: {profiles: [nope]}\n", "node n003: profiles: unknown profile 'nope'"),
    ("nodes:\n  n003:\n    netdevs: {eth0: {mac: '52:54:00:00:00:01'}}\n",
     "node n003: netdevs.eth0.mac: 52:54:00:00:00:01 is already used by node n001"),
    ("nodes:\n  n003: {image: nosuch}\n", "node n003: image: no recipe and no built image"),
    ("nodes:\n  n003: {system_overlays: [nosuch]}\n",
     "node n003: system_overlays: no overlay named 'nosuch'"),
])
def test_a_dry_run_checks_what_a_real_run_checks(cli, config, tmp_path, text, message):
    cli("apply", "-f", str(FIXTURE))
    before = config.inventory_path.read_bytes()
    path = write(tmp_path, text)
    for extra in (["--dry-run"], []):
        result = cli("apply", "-f", path, *extra)
        assert result.code != 0, (extra, result.out)
        assert message in result.err
        assert len(result.err.strip().splitlines()) == 1
    assert config.inventory_path.read_bytes() == before


def test_prune_asks_or_needs_yes(cli, config, tmp_path, monkeypatch):
    cli("apply", "-f", str(FIXTURE))
    before = config.inventory_path.read_bytes()
    empty = write(tmp_path, "")
    refused = cli("apply", "-f", empty, "--prune")
    assert refused.code != 0
    assert refused.err.strip() == ("provisiond: error: refusing to delete 4 record(s) without "
                                   "--yes (stdin is not a terminal)")
    assert config.inventory_path.read_bytes() == before
    monkeypatch.setattr("sys.stdin.isatty", lambda: True, raising=False)
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    assert cli("apply", "-f", empty, "--prune").code != 0
    assert config.inventory_path.read_bytes() == before
    monkeypatch.setattr("builtins.input", lambda prompt: "yes")
    assert cli("apply", "-f", empty, "--prune").code == 0
    assert nodes(cli) == {}


def test_range_keys_count_up_every_address(cli, tmp_path):
    cli("apply", "-f", str(FIXTURE))
    path = write(tmp_path, """nodes:
  c[001-004]:
    profiles: [compute]
    netdevs:
      eth0: {ipaddr: 10.10.0.51, ipaddr6: 'fd00::51', mac: '52:54:00:00:10:01'}
    bmc: {address: 10.20.0.51}
""")
    result = cli("apply", "-f", path)
    assert result.code == 0, result.err
    found = [nodes(cli)[f"c00{i}"] for i in range(1, 5)]
    assert [n["netdevs"]["eth0"]["ipaddr"] for n in found] == [
        "10.10.0.51", "10.10.0.52", "10.10.0.53", "10.10.0.54"]
    assert [n["netdevs"]["eth0"]["ipaddr6"] for n in found] == [
        "fd00::51", "fd00::52", "fd00::53", "fd00::54"]
    assert [n["netdevs"]["eth0"]["mac"] for n in found] == [
        "52:54:00:00:10:01", "52:54:00:00:10:02", "52:54:00:00:10:03", "52:54:00:00:10:04"]
    assert [n["bmc"]["address"] for n in found] == [
        "10.20.0.51", "10.20.0.52", "10.20.0.53", "10.20.0.54"]
    assert cli("apply", "-f", path).out.endswith("nothing to change\n")


@pytest.mark.parametrize("text, message", [
    ("nodes:\n  n[1-3]: {}\n  n3: {}\n", "nodes: n3 is named by both 'n[1-3]' and 'n3'"),
    ("nodes:\n  n[1-3]: {}\n  n[3-4]: {}\n", "n3 is named by both 'n[1-3]' and 'n[3-4]'"),
    ("nodes:\n  n1: {}\n  n2: {}\n  n1: {comment: x}\n",
     "line 4: duplicate key 'n1' (first given at line 2)"),
    ("profiles:\n  p: {}\n  p: {}\n", "line 3: duplicate key 'p'"),
    ("nodes:\n  n1:\n    netdevs: {eth0: {mac: 52:54:00:00:00:01}}\n",
     "node n1: netdevs.eth0.mac: Input should be a valid string (YAML read the value as a "
     "number, 41135040001: put it in quotes)"),
    ('nodes:\n  n1:\n    tags: {"k\\n": v}\n',
     "node n1: tags.'k\\n': control character '\\n' is not allowed in 'k\\n'"),
    ("nodes:\n  010: {}\n", "nodes: key 8 is not a string (YAML read it as a number: "
     "put it in quotes)"),
    ("nodes:\n  1_000: {}\n", "nodes: key 1000 is not a string"),
    ("nodes:\n  '@x': {}\n", "'@x': node groups (@name) are not supported"),
    ("nodes:\n  ~: {}\n", "nodes: key None is not a string (YAML read it as null"),
    ("nodes:\n  n1:\n    tags: {gpu: yes}\n",
     "node n1: tags.gpu: Input should be a valid string (YAML read the value as a boolean, "
     "True: put it in quotes)"),
])
def test_bad_apply_files_are_one_line(cli, tmp_path, text, message):
    result = cli("apply", "-f", write(tmp_path, text))
    assert result.code != 0
    assert message in result.err, result.err
    assert len(result.err.strip().splitlines()) == 1


def test_a_file_that_is_not_utf8_is_one_line(cli, tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("nodes:\n  n1: {comment: caf\u00e9}\n".encode("latin-1"))
    result = cli("apply", "-f", str(path))
    assert result.code != 0 and "Traceback" not in result.err
    assert result.err.strip() == (f"provisiond: error: {path}: not UTF-8 text (byte 0xe9 at "
                                  "offset 26)")
    stdin = io.TextIOWrapper(io.BytesIO(path.read_bytes()))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stdin", stdin)
        result = cli("apply", "-f", "-")
    assert "-: not UTF-8 text" in result.err


def test_a_duplicated_node_in_the_inventory_is_an_error(cli, config):
    cli("apply", "-f", str(FIXTURE))
    text = config.inventory_path.read_text()
    config.inventory_path.write_text(text + "  n001:\n    comment: again\n")
    result = cli("node", "list")
    assert result.code != 0
    assert "duplicate key 'n001'" in result.err and "line" in result.err


def test_pruned_and_deleted_nodes_leave_nothing_behind(cli, config, tmp_path):
    cli("apply", "-f", str(FIXTURE))
    for name in ("n001", "n002"):
        SecretStore(config).set("nodes", [name], BMC_PASSWORD, "old-pw")
        host_key_dir(config, name).mkdir(parents=True)
        (host_key_dir(config, name) / "ssh_host_ed25519_key").write_text("old key")
        node_dir(config, name).mkdir(parents=True)
        (node_dir(config, name) / "runtime.img").write_text("old build")
        record_phase(config, name, NodePhase.READY)
    assert cli("node", "delete", "n001", "--yes").code == 0
    kept = FIXTURE.read_text().split("  n002:")[0]
    assert cli("apply", "-f", write(tmp_path, kept), "--prune", "--yes").code == 0
    assert set(nodes(cli)) == {"n001"}
    assert cli("node", "delete", "n001", "--yes").code == 0
    assert cli("node", "add", "n[001-002]").code == 0
    for name in ("n001", "n002"):
        assert SecretStore(config).get("nodes", name, BMC_PASSWORD) is None
        assert not host_key_dir(config, name).exists()
        assert not node_dir(config, name).exists()
        assert read_status(config, name) is None


@pytest.mark.parametrize("breakage", ["bad yaml", "a directory"])
def test_deleting_with_unreadable_secrets_deletes_nothing(cli, config, tmp_path, breakage):
    """The secrets must be removable before the records go: otherwise the node is deleted,
    its BMC password stays, and a new node of that name inherits it."""
    cli("apply", "-f", str(FIXTURE))
    assert cli("profile", "add", "spare").code == 0
    if breakage == "bad yaml":
        config.secrets_path.write_text("nodes: {n001: {bmc_password: pw}\n")
    else:
        config.secrets_path.mkdir()
    before = config.inventory_path.read_bytes()
    kept = write(tmp_path, FIXTURE.read_text().split("  n002:")[0])
    for args in (["node", "delete", "n001", "--yes"], ["profile", "delete", "spare", "--yes"],
                 ["apply", "-f", kept, "--prune", "--yes"],
                 ["apply", "-f", kept, "--prune", "--dry-run"]):
        result = cli(*args)
        assert result.code == 2, (args, result.err)
        assert f"{config.secrets_path}: " in result.err and "Traceback" not in result.err
        assert len(result.err.strip().splitlines()) == 1
        assert config.inventory_path.read_bytes() == before
