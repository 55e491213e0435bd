"""`provisiond discover ...` as an operator runs it: list, show, approve (a sequence, sorted
by a fact, one by one), reject, rules; bad input is one line and a non-zero exit."""

from __future__ import annotations

import json

import pytest

from provisiond.discovery.facts import Facts, facts_of
from provisiond.discovery.machines import enlist
from provisiond.discovery.rules import rules_path

FACTS = {"cpu": {"sockets": 2, "cores": 64, "threads": 128}, "memory_mib": 524288,
         "dmi": {"vendor": "Dell Inc.", "product": "PowerEdge R650"}}


@pytest.fixture
def waiting(cli, config):
    """init'ed state with three machines waiting: serials C, A, B in discovery order."""
    assert cli("init").code == 0
    for i, serial in enumerate("CAB", 1):
        data = {**FACTS, "dmi": {**FACTS["dmi"], "serial": serial}}
        enlist(config, f"b0:26:28:00:00:0{i}", f"10.0.0.{200 + i}", Facts.model_validate(data))
    return cli


def test_list_and_show(waiting):
    out = waiting("discover", "list").out
    assert "b0:26:28:00:00:01" in out and "PowerEdge R650" in out and "524288 MiB" in out
    shown = json.loads(waiting("discover", "show", "B0-26-28-00-00-02", "--json").out)
    assert shown["facts"]["dmi"]["serial"] == "A" and shown["state"] == "pending"
    bad = waiting("discover", "show", "nope")
    assert bad.code == 2 and bad.err.count("\n") == 1 and "Traceback" not in bad.err


def test_approve_sorted_by_serial_then_the_nodes_show_their_facts(waiting, config):
    result = waiting("discover", "approve", "--names", "n[065-128]", "--ipaddr", "10.10.0.75",
                     "--profile", "compute", "--sort", "dmi.serial")
    assert result.code == 0, result.err
    assert result.out.splitlines() == [
        "approved b0:26:28:00:00:02 as n065 (dmi.serial A)",
        "approved b0:26:28:00:00:03 as n066 (dmi.serial B)",
        "approved b0:26:28:00:00:01 as n067 (dmi.serial C)"]
    nodes = {n["name"]: n for n in json.loads(waiting("node", "list", "--json").out)}
    assert nodes["n066"]["netdevs"]["eth0"]["ipaddr"] == "10.10.0.76"
    assert nodes["n066"]["profiles"] == ["compute"]
    shown = waiting("node", "show", "n065").out
    assert "# facts reported" in shown and "threads: 128" in shown
    assert facts_of(config, "n067").facts.dmi.serial == "C"
    again = waiting("discover", "approve", "b0:26:28:00:00:01", "--names", "x1")
    assert again.code == 2 and "already approved" in again.err


def test_one_by_one_and_reject(waiting):
    one = waiting("discover", "approve", "b0:26:28:00:00:03", "--names", "gpu1",
                  "--ipaddr", "10.10.1.1")
    assert one.out.strip() == "approved b0:26:28:00:00:03 as gpu1"
    assert waiting("discover", "reject", "b0:26:28:00:00:01").code == 0
    states = {m["mac"][-1]: m["state"] for m in json.loads(
        waiting("discover", "list", "--json").out)}
    assert states == {"1": "rejected", "2": "pending", "3": "approved"}


def test_too_few_names_writes_nothing(waiting, config):
    before = config.inventory_path.read_bytes()
    result = waiting("discover", "approve", "--names", "n[1-2]")
    assert result.code == 2 and "2 free names for 3 machines" in result.err
    assert config.inventory_path.read_bytes() == before


def test_rules_are_checked(waiting, config, tmp_path):
    rules_path(config).parent.mkdir(parents=True, exist_ok=True)
    rules_path(config).write_text("- name: r650\n  match: {dmi.product: 'PowerEdge R650*'}\n"
                                  "  profile: compute\n  names: n[065-128]\n")
    assert "r650" in waiting("discover", "rules").out
    bad = tmp_path / "bad.yaml"
    bad.write_text("- name: x\n  match: {}\n  names: y\n")
    result = waiting("discover", "rules", "--file", str(bad))
    assert result.code == 2 and "rule 1" in result.err and result.err.count("\n") == 1


@pytest.mark.parametrize("rule, words", [
    ("names: 'n[065-'", "rule 1: names"),
    ("names: 'n[1-9]'\n  ipaddr: 10.10.0.300", "rule 1: ipaddr"),
    ("names: 'n[1-9]'\n  gateway: nope", "rule 1: gateway"),
    ("names: 'n[1-9]'\n  profile: 'a b'", "rule 1: profile"),
    ("names: 'n[1-9]'\n  netdev: 'a/b'", "rule 1: netdev"),
])
def test_rules_check_finds_what_would_make_every_approval_by_the_rule_fail(
        waiting, tmp_path, rule, words):
    """`discover rules --file` is how a file is checked before it is put in place: a rule
    whose names, addresses or profile name can never make a node is refused there, not
    found out at each report (where it only leaves machines waiting)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"- name: x\n  match: {{dmi.vendor: Dell*}}\n  {rule}\n")
    result = waiting("discover", "rules", "--file", str(bad))
    assert result.code == 2, result.out
    assert words in result.err and result.err.count("\n") == 1 and "Traceback" not in result.err


def test_checking_a_rules_file_that_is_not_there_is_an_error(waiting, tmp_path):
    """`discover rules --file F` checks F before it is put in place: a mistyped F printed
    an empty table and exit 0, as if the file held no rule to fault."""
    missing = tmp_path / "rules.yml"
    result = waiting("discover", "rules", "--file", str(missing))
    assert result.code == 2 and result.out == ""
    assert result.err == f"provisiond: error: {missing}: cannot read: No such file or directory\n"
    assert waiting("discover", "rules").code == 0  # the state dir's: none is no rules


@pytest.mark.parametrize("rule,words", [
    ("names: 'n[1-9]'\n  profile: nosuch", "rule 1 (x): profile nosuch does not exist"),
    ("names: 'n[1-9]'\n  ipaddr: 10.10.0.195", "rule 1 (x): ipaddr: 10.10.0.200 is in "
     "discovery.pool (10.10.0.200-10.10.0.250)"),
])
def test_rules_check_finds_what_this_inventory_and_pool_refuse_every_approval(
        waiting, config, tmp_path, rule, words):
    """A rule naming a profile the inventory lacks, or giving addresses the discovery pool
    leases, approves no machine (each waits with the reason): `discover rules` said
    nothing of it."""
    (config.state_dir / "provisiond.yaml").write_text(
        (config.state_dir / "provisiond.yaml").read_text().replace(
            "pool: null", "pool: 10.10.0.200-10.10.0.250"))
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"- name: x\n  match: {{dmi.vendor: Dell*}}\n  {rule}\n")
    result = waiting("discover", "rules", "--file", str(bad))
    assert result.code == 2 and result.out == "" and result.err.count("\n") == 1
    assert result.err.startswith(f"provisiond: error: {bad}: {words}")
