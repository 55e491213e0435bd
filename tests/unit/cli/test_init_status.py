"""`provisiond init`, `node status`, the CLI's error contract."""

import json
import re
import subprocess

import pytest

from provisiond import audit, events
from provisiond.audit import cli_actor
from provisiond.cli import main
from provisiond.config import load_config
from provisiond.state.layout import ENTRIES
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


# What a site keeps in git: every other path of the state layout is derived, built,
# downloaded, recorded by the servers, or a secret.
KEPT = {"provisiond.yaml", "inventory.yaml", "recipes/", "recipes/<name>/", "overlays/",
        "discovery/", "discovery/rules.yaml"}


def test_init_writes_a_gitignore_keeping_derived_and_secret_files_out_of_git(tmp_path,
                                                                           capsys):
    """Sites keep the state dir in git: `git add -A` took .inventory.cache.json and
    .inventory.claims.json (derived) with every change, and secrets.yaml, host keys,
    blobs... with them. Every path of the layout is made here, then added as a site
    would; only what a site writes is taken (a file of the same name in an overlay too)."""
    fresh = tmp_path / "fresh"
    assert main(["--state-dir", str(fresh), "init", "--no-profiles"]) == 0
    assert f"wrote {fresh / '.gitignore'}" in capsys.readouterr().out.splitlines()
    made = {}
    for entry in ENTRIES:
        path = fresh / re.sub(r"<[^>]+>", "site", entry.pattern)
        if entry.pattern.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
            path = path / "x"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        made[entry.pattern] = path.relative_to(fresh).as_posix()
    for name in ("inventory.yaml.schema-1.bak", "inventory.lock", "overlays/site/status/n1",
                 "overlays/site/metrics.json", "overlays/site/app.lock"):
        (fresh / name).parent.mkdir(parents=True, exist_ok=True)
        (fresh / name).touch()
    subprocess.run(["git", "init", "-q", str(fresh)], check=True)
    subprocess.run(["git", "-C", str(fresh), "add", "-A"], check=True)
    listed = set(subprocess.run(["git", "-C", str(fresh), "ls-files"], check=True,
                                capture_output=True, text=True).stdout.splitlines())
    assert {pattern for pattern, path in made.items() if path in listed} == KEPT
    assert listed == {".gitignore", *(made[pattern] for pattern in KEPT),
                      "overlays/site/status/n1", "overlays/site/metrics.json",
                      "overlays/site/app.lock"}


def test_init_keeps_an_existing_gitignore(tmp_path, capsys):
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / ".gitignore").write_text("/site-only\n")
    assert main(["--state-dir", str(fresh), "init", "--no-profiles"]) == 0
    assert f"kept {fresh / '.gitignore'}" in capsys.readouterr().out.splitlines()
    assert (fresh / ".gitignore").read_text() == "/site-only\n"
    assert not [p for p in fresh.iterdir() if p.name.startswith(".gitignore.")]


def test_a_gitignore_init_cannot_write_is_a_warning_not_a_failure(tmp_path, capsys,
                                                                    monkeypatch):
    """The .gitignore is an aid: a state dir where it cannot be written (a read-only or
    full file system) still gets its provisiond.yaml, and init exits 0 with one warning."""
    from provisiond import gitignore

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gitignore.tempfile, "mkstemp", full)
    fresh = tmp_path / "fresh"
    assert main(["--state-dir", str(fresh), "init", "--no-profiles"]) == 0
    out, err = capsys.readouterr()
    assert f"wrote {fresh / 'provisiond.yaml'}" in out.splitlines()
    assert err == f"warning: {fresh / '.gitignore'} not written: No space left on device\n"
    assert not (fresh / ".gitignore").exists()


@pytest.mark.parametrize("address", ["0.0.0.0", "10.9.0.1x", "224.0.0.1",
                                     "10.9.0.1\nstore: etcd://10.0.0.9:2379"])
def test_init_with_a_bad_address_writes_nothing_and_a_good_one_then_works(tmp_path, capsys,
                                                                         address):
    """It wrote provisiond.yaml with the bad address, then refused it, and every later
    `init --address GOOD` refused the file it had left."""
    fresh = tmp_path / "fresh"
    assert main(["--state-dir", str(fresh), "init", "--address", address]) == 2
    err = capsys.readouterr().err
    assert err.startswith("provisiond: error: --address: ") and err.count("\n") == 1, err
    assert not fresh.exists()
    assert main(["--state-dir", str(fresh), "init", "--address", "10.9.0.1"]) == 0
    assert load_config(fresh).server.address == "10.9.0.1"


def test_init_refuses_another_address_than_the_kept_provisiond_yaml_has(tmp_path, capsys):
    """init keeps an existing provisiond.yaml: an --address it would not write is refused,
    not dropped ('kept' and exit 0 left server.address as it was)."""
    fresh = tmp_path / "fresh"
    assert main(["--state-dir", str(fresh), "init"]) == 0
    before = (fresh / "provisiond.yaml").read_bytes()
    assert main(["--state-dir", str(fresh), "init", "--address", "10.9.0.1"]) == 2
    err = capsys.readouterr().err
    assert "has server.address: 127.0.0.1; edit it there" in err and err.count("\n") == 1
    assert (fresh / "provisiond.yaml").read_bytes() == before
    assert main(["--state-dir", str(fresh), "init", "--address", "127.0.0.1"]) == 0


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


def test_status_prints_a_failed_nodes_detail_in_full_under_the_table(cli, config,
                                                                     monkeypatch):
    """The table cuts its widest column to the terminal; a failure's detail (the last lines
    of an ansible-pull log) is printed whole below it, one line per failed node."""
    monkeypatch.setenv("COLUMNS", "80")
    cli("node", "add", "n[1-3]")
    tail = ("provisiond-configure exit 2: TASK [site : A file] | fatal: [localhost]: FAILED! "
            "=> {\"msg\": \"Destination directory /etc/x does not exist\"} | PLAY RECAP | "
            "localhost : ok=3 changed=0 unreachable=0 failed=1")
    record_phase(config, "n1", NodePhase.FAILED, tail)
    record_phase(config, "n2", NodePhase.READY, "node ready")
    lines = cli("node", "status").out.splitlines()
    assert lines[-1] == f"n1 failed: {tail}", lines
    assert not any(line.startswith(("n2 failed", "n3 failed")) for line in lines)
    assert len(lines) == 5 and max(len(line) for line in lines[:4]) <= 80, lines


def test_bad_config_is_one_line_not_a_traceback(cli, state_dir):
    (state_dir / "provisiond.yaml").write_text("http: [")
    result = cli("node", "list")
    assert result.code == 2
    assert result.err.startswith("provisiond: error:") and "Traceback" not in result.err
