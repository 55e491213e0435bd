"""`provisiond secret set|rotate` and `node revoke|status` as a user runs them: values from a
file or stdin, never printed; generated keys made anew; credentials ended; refusals shown."""

from __future__ import annotations

import io
import json

import pytest

from provisiond.events import read_since
from provisiond.inventory.secrets import SecretStore
from provisiond.overlays import ensure_overlay
from provisiond.overlays.hostkeys import host_key_dir
from provisiond.status import record_refusal
from provisiond.trust import has_credential

PEM = "-----BEGIN KEY-----\nline one\nline two\n-----END KEY-----\n"


@pytest.fixture
def cluster(cli):
    assert cli("init").code == 0
    assert cli("node", "add", "n[1-3]", "--ipaddr", "10.10.0.11", "--mac",
               "52:54:00:00:01:01").code == 0
    return cli


def test_a_value_from_a_file_is_kept_whole_and_never_printed(cluster, config, tmp_path):
    source = tmp_path / "munge.key"
    source.write_text(PEM)
    result = cluster("secret", "set", "profile", "default", "munge.key", "--file", str(source))
    assert result.code == 0 and PEM not in result.out + result.err
    assert SecretStore(config).get("profiles", "default", "munge.key") == PEM
    assert oct(config.secrets_path.stat().st_mode & 0o777) == "0o600"
    listed = cluster("secret", "list", "--json")
    assert "munge.key" in listed.out and "line one" not in listed.out


def test_stdin_gives_all_of_it_without_the_last_line_end(cluster, config, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(PEM))
    assert cluster("secret", "set", "node", "n[1-2]", "tls.key").code == 0
    assert SecretStore(config).get("nodes", "n2", "tls.key") == PEM.removesuffix("\n")


@pytest.mark.parametrize("key,problem", [("ssh_host_keys", "made by provisiond"),
                                         ("a b", "letters, digits"), ("x" * 64, "at most 63")])
def test_names_templates_cannot_use_are_refused(cluster, config, monkeypatch, key, problem):
    monkeypatch.setattr("sys.stdin", io.StringIO("value\n"))
    result = cluster("secret", "set", "node", "n1", key)
    assert result.code == 2 and problem in result.err and result.err.count("\n") == 1
    assert not config.secrets_path.exists()


def test_a_binary_or_missing_file_is_one_line(cluster, tmp_path):
    binary = tmp_path / "munge.key"
    binary.write_bytes(bytes(range(256)))
    result = cluster("secret", "set", "node", "n1", "munge.key", "--file", str(binary))
    assert result.code == 2 and "not UTF-8 text (store binary keys base64-encoded)" in result.err
    result = cluster("secret", "set", "node", "n1", "munge.key", "--file", str(tmp_path / "no"))
    assert result.code == 2 and "cannot read" in result.err


def test_rotate_makes_new_host_keys_and_rebuilds_the_runtime_overlay(cluster, config):
    before = ensure_overlay(config, "n1", "runtime").read_bytes()
    old_keys = {p.name: p.read_bytes() for p in host_key_dir(config, "n1").glob("ssh_*")}
    other = (host_key_dir(config, "n2") / "ssh_host_ed25519_key").read_bytes() if \
        host_key_dir(config, "n2").exists() else None
    result = cluster("secret", "rotate", "n1", "ssh-host-keys")
    assert result.code == 0 and "rotated ssh-host-keys of 1 node(s)" in result.out, result.err
    new_keys = {p.name: p.read_bytes() for p in host_key_dir(config, "n1").glob("ssh_*")}
    assert new_keys.keys() == old_keys.keys() and len(new_keys) == 4
    assert all(new_keys[name] != old_keys[name] for name in new_keys)
    if other is not None:
        assert (host_key_dir(config, "n2") / "ssh_host_ed25519_key").read_bytes() == other
    after = ensure_overlay(config, "n1", "runtime").read_bytes()
    assert after != before
    event = [e for e in read_since(config, 0) if e.kind == "secret.changed"][-1]
    assert event.data["keys"] == ["ssh-host-keys"] and event.subject == "node:n1"
    assert "PRIVATE" not in json.dumps(event.data)


def test_rotate_refuses_unknown_nodes_and_secrets(cluster, config):
    assert cluster("secret", "rotate", "n9", "ssh-host-keys").code == 3
    with pytest.raises(SystemExit) as usage:  # argparse: the choices are listed
        cluster("secret", "rotate", "n1", "munge.key")
    assert usage.value.code == 2
    from provisiond.errors import InvalidInput
    from provisiond.lifecycle import rotate_secrets

    with pytest.raises(InvalidInput, match="provisiond makes only ssh-host-keys"):
        rotate_secrets(config, ["n1"], "munge.key")


def test_node_revoke_ends_credentials(cluster, config):
    from provisiond.inventory import load_nodes
    from provisiond.trust import exchange, tokens

    node = load_nodes(config)["n1"]
    token = tokens.mint(tokens.load_key(config), tokens.binding_for(node, node.macs[0]))
    exchange(config, node, token, "10.10.0.11", 700)
    assert has_credential(config, "n1")
    result = cluster("node", "revoke", "n[1-3]")
    assert result.code == 0 and "revoked: 1 of 3 node(s) had a credential" in result.out
    assert not has_credential(config, "n1")
    assert cluster("node", "revoke", "n9").code == 3


def test_node_status_shows_the_last_refused_token(cluster, config):
    assert "LAST TOKEN REFUSED" not in cluster("node", "status").out
    record_refusal(config, "n2", {"reason": "reused", "address": "10.10.0.99"})
    out = cluster("node", "status").out
    row = [line for line in out.splitlines() if line.startswith("n2 ")][0]
    assert "LAST TOKEN REFUSED" in out and "reused from 10.10.0.99" in row
    data = json.loads(cluster("node", "status", "n2", "--json").out)
    assert data["n2"]["token_refused"]["reason"] == "reused"


def test_rotate_and_revoke_are_audited_with_who_did_them(cluster, config):
    """Both are changes an admin makes (new host keys, ended credentials): each is an audit
    record naming the actor, the nodes and what changed, never a key."""
    from provisiond import audit

    assert cluster("secret", "rotate", "n[1-2]", "ssh-host-keys").code == 0
    assert cluster("node", "revoke", "n[1-3]").code == 0
    rotated = audit.read(config, action="secret.rotate")
    assert [(e["actor"], e["target"], e["changes"]) for e in rotated] == [
        (audit.cli_actor(), "node:n[1-2]", ["ssh-host-keys"])]
    assert "PRIVATE" not in json.dumps(rotated)
    revoked = audit.read(config, action="node.revoke")
    assert [(e["actor"], e["target"], e["changes"]) for e in revoked] == [
        (audit.cli_actor(), "node:n[1-3]", ["credential"])]


def test_a_rotation_that_cannot_be_audited_says_so(cluster, config):
    """As every audited write: the change is made, and the one error line says it was not
    recorded (a user must not take it for a failed rotation)."""
    from provisiond import audit

    audit.audit_path(config).unlink()
    audit.audit_path(config).mkdir()  # the journal cannot be opened for appending
    result = cluster("secret", "rotate", "n1", "ssh-host-keys")
    assert result.code != 0 and "was done but not recorded in the audit log" in result.err
    assert result.err.count("\n") == 1


def test_a_munge_key_shorter_than_munged_takes_is_refused_and_nothing_stored(cluster, config,
                                                                             tmp_path):
    """munged 0.5 exits with "Keyfile must be at least 32 bytes": a node given such a key
    would boot without Slurm working."""
    source = tmp_path / "munge.key"
    source.write_text("x" * 31)
    result = cluster("secret", "set", "profile", "default", "munge.key", "--file", str(source))
    assert result.code == 2 and "munge.key must be at least 32 bytes" in result.err, result.err
    assert "Traceback" not in result.err and len(result.err.strip().splitlines()) == 1
    assert SecretStore(config).get("profiles", "default", "munge.key") is None
    source.write_text("x" * 32)
    assert cluster("secret", "set", "profile", "default", "munge.key", "--file",
                   str(source)).code == 0


def test_unset_says_which_nodes_had_none_and_refuses_when_none_has_it(cluster, config):
    """A mistyped key, or one a profile holds, removed nothing: that is not `removed`."""
    from provisiond import audit

    cluster("node", "add", "n4")
    SecretStore(config).set("nodes", ["n2", "n4"], "munge.key", "k" * 32)
    result = cluster("secret", "unset", "node", "n[1-4]", "munge.key")
    assert result.code == 0, result.err
    assert result.out == "removed munge.key from 2 of 4 node(s); n[1,3] had none\n"
    assert "munge.key" not in json.dumps(SecretStore(config).read())
    assert [e["target"] for e in audit.read(config, action="secret.unset")] == ["node:n[2,4]"]
    before = config.secrets_path.read_bytes()
    for kind, names in (("node", "n[1-4]"), ("profile", "default")):
        result = cluster("secret", "unset", kind, names, "munge.key")
        assert result.code == 3 and result.out == "", result
        assert result.err.startswith(f"provisiond: error: no secret munge.key is set for "
                                     f"{kind} {names}: nothing to remove")
        assert result.err.count("\n") == 1
    assert config.secrets_path.read_bytes() == before
    assert len(audit.read(config, action="secret.unset")) == 1
