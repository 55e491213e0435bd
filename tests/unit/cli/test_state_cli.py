"""`provisiond init --store` and `provisiond state export|import`."""

from __future__ import annotations

import json
import stat

from provisiond.cli import main
from provisiond.config import load_config
from provisiond.state.open import open_url
from provisiond import audit, events
from provisiond.state.transfer import in_journal, shared_keys


def _provisiond(state_dir, capsys, *args):
    capsys.readouterr()
    code = main(["--state-dir", str(state_dir), *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_init_writes_the_store_setting(tmp_path, capsys):
    url = "etcd://127.0.0.1:23791,127.0.0.1:23792"
    code, _, err = _provisiond(tmp_path / "s", capsys, "init", "--store", url, "--no-profiles")
    assert code == 0, err
    assert load_config(tmp_path / "s").store == url


def test_init_refuses_a_bad_store_url_and_another_one(tmp_path, capsys):
    code, _, err = _provisiond(tmp_path / "s", capsys, "init", "--store", "http://x:1")
    assert code == 2 and err.count("\n") == 1 and "--store" in err
    assert not (tmp_path / "s" / "provisiond.yaml").exists()
    assert _provisiond(tmp_path / "s", capsys, "init", "--no-profiles")[0] == 0
    code, _, err = _provisiond(tmp_path / "s", capsys, "init", "--store", "etcd://127.0.0.1:1")
    assert code == 2 and "has store: null" in err
    assert load_config(tmp_path / "s").store is None


def _site(state_dir, capsys):
    """A state dir with every kind of shared document."""
    password = state_dir.parent / f"{state_dir.name}.password"
    password.write_text("hunter2")
    for args in (["init"], ["node", "add", "n1", "--mac", "52:54:00:00:00:01",
                            "--ipaddr", "10.0.0.5"],
                 ["secret", "set", "node", "n1", "bmc_password", "--file", str(password)],
                 ["token", "create", "--name", "ci", "--role", "reader"]):
        code, _, err = _provisiond(state_dir, capsys, *args)
        assert code == 0, (args, err)
    (state_dir / "status").mkdir(exist_ok=True)
    (state_dir / "status" / "n1.json").write_bytes(b'{"phase": "dhcp"}')
    (state_dir / "secrets" / "token.key").parent.mkdir(parents=True, exist_ok=True)
    (state_dir / "secrets" / "token.key").write_bytes(bytes(range(200, 232)))


def _values(state_dir) -> dict[str, bytes]:
    """The shared keys but the journals' (their records are compared by _records)."""
    return {e.key: e.value for e in shared_keys(open_url(f"files://{state_dir}"))
            if not in_journal(e.key)}


def _records(state_dir) -> dict[str, list[dict]]:
    """The journals' records without their ids."""
    config = load_config(state_dir)
    return {name: [{k: v for k, v in r.items() if k != "id"} for r in read(config, 0)]
            for name, read in (("events", lambda c, a: events.journal(c).read_since(a, 10**6)),
                               ("audit", lambda c, a: audit.journal(c).read_since(a, 10**6)))}


def test_export_then_import_into_an_empty_store_is_exact(tmp_path, capsys):
    first, second = tmp_path / "a", tmp_path / "b"
    _site(first, capsys)
    dump = tmp_path / "site.json"
    code, _, err = _provisiond(first, capsys, "state", "export", str(dump))
    assert code == 0, err
    assert stat.S_IMODE(dump.stat().st_mode) == 0o600
    document = json.loads(dump.read_text())
    assert document["keys"]["secrets/token.key"]["base64"]
    assert "hunter2" in document["keys"]["secrets.yaml"]["text"]
    assert "provisiond.yaml" not in document["keys"]
    assert "events/journal.jsonl" not in document["keys"] and document["journals"]["audit/"]
    assert _provisiond(second, capsys, "init", "--no-profiles")[0] == 0
    code, _, err = _provisiond(second, capsys, "state", "import", str(dump))
    assert code == 0, err
    assert _values(second) == _values(first)
    assert _records(second) == _records(first)  # init of the second wrote none
    for key in ("inventory.yaml", "secrets.yaml", "tokens.json", "secrets/token.key"):
        assert (second / key).read_bytes() == (first / key).read_bytes()
    assert stat.S_IMODE((second / "secrets.yaml").stat().st_mode) == 0o600


def test_import_refuses_a_store_with_documents_unless_forced(tmp_path, capsys):
    _site(tmp_path / "a", capsys)
    dump = tmp_path / "site.json"
    assert _provisiond(tmp_path / "a", capsys, "state", "export", str(dump))[0] == 0
    before = _values(tmp_path / "a")
    code, _, err = _provisiond(tmp_path / "a", capsys, "state", "import", str(dump))
    assert code == 4 and "is not empty" in err and err.count("\n") == 1
    assert _values(tmp_path / "a") == before
    assert _provisiond(tmp_path / "a", capsys, "state", "import", "--force", str(dump))[0] == 0
    assert _values(tmp_path / "a") == before


def test_import_of_a_bad_file_is_one_line(tmp_path, capsys):
    assert _provisiond(tmp_path / "s", capsys, "init", "--no-profiles")[0] == 0
    bad = tmp_path / "bad.json"
    for text in ("{", '{"format": "other"}',
                 '{"format": "provisiond-state", "version": 1, "keys": {"a": {"x": 1}}}',
                 '{"format": "provisiond-state", "version": 1, "keys": {"store.key": '
                 '{"text": "k"}}}',
                 '{"format": "provisiond-state", "version": 1, "keys": {}, "journals": '
                 '{"other/": []}}',
                 '{"format": "provisiond-state", "version": 1, "keys": {}, "journals": '
                 '{"audit/": [1]}}'):
        bad.write_text(text)
        code, _, err = _provisiond(tmp_path / "s", capsys, "state", "import", str(bad))
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "s" / "store.key").exists()


def test_an_import_with_a_bad_key_writes_nothing(tmp_path, capsys):
    """Every key is checked before the first is put: a bad one after good ones left those
    imported (a half import) before."""
    assert _provisiond(tmp_path / "s", capsys, "init", "--no-profiles")[0] == 0
    before = _values(tmp_path / "s")
    bad = tmp_path / "bad.json"
    for key in ("../outside.json", "/etc/x.json", ".store/meta/a.rev", "a//b.json"):
        bad.write_text(json.dumps({"format": "provisiond-state", "version": 1, "keys": {
            "a.json": {"text": "1"}, key: {"text": "2"}, "z.json": {"text": "3"}}}))
        code, _, err = _provisiond(tmp_path / "s", capsys, "state", "import", str(bad))
        assert code == 2 and err.count("\n") == 1 and key in err, err
        assert _values(tmp_path / "s") == before
    assert not (tmp_path / "outside.json").exists()


def test_what_one_server_keeps_is_not_exported(tmp_path, capsys):
    from provisiond.state.transfer import is_local

    assert is_local("store.key") and is_local("blobs/sha256/ab") and is_local("provisiond.yaml")
    assert is_local("images/tiny/shell/etc/passwd") and not is_local("images/tiny/manifest.json")
    assert not is_local("inventory.yaml") and not is_local("secrets/token.key")
