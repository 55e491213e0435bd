"""Discovery through the HTTP app on a real state dir: the discovery image's reports and
polls (untrusted: validated, bounded, rate-limited per address), approval by sequence,
by fact order and by rule, rejection, and the facts known nodes report."""

from __future__ import annotations

import copy
import json

import pytest

from bootdata import add_image, add_nodes, credential, node_env
from provisiond.auth import Role
from provisiond.discovery.facts import facts_of
from provisiond.discovery.machines import book_path
from provisiond.discovery.rules import rules_path
from provisiond.events import read_since
from provisiond.inventory import InventoryStore
from provisiond.inventory.model import Record
from provisiond.state.layout import Layout
from v1helpers import Api, assert_error

FACTS = {"cpu": {"sockets": 1, "cores": 2, "threads": 4, "model": "QEMU Virtual CPU"},
         "memory_mib": 2048,
         "disks": [{"name": "vda", "size_bytes": 8 << 30, "model": None, "serial": "d1"}],
         "nics": [{"name": "eth0", "mac": "52:54:00:aa:00:01", "link": True,
                   "speed_mbps": 1000}],
         "dmi": {"vendor": "QEMU", "product": "Standard PC", "serial": "S1",
                 "uuid": "0b5e6c3a-0000-4000-8000-000000000001"},
         "bmc": None}


def mac(i: int) -> str:
    return f"52:54:00:aa:{i >> 8:02x}:{i & 255:02x}"


def facts(**changes) -> dict:
    data = copy.deepcopy(FACTS)
    for path, value in changes.items():
        section, _, key = path.partition("__")
        if key:
            data[section][key] = value
        else:
            data[section] = value
    return data


@pytest.fixture
def api(config):
    config.dhcp.discovery = True
    config.discovery.pool = "10.99.200.1-10.99.200.50"
    with InventoryStore(config).edit() as inv:
        inv.profiles["default"] = Record()
    api = Api(config)
    api.app.extensions["provisiond"].watcher.interval = 0
    return api


def report(api, i: int, address: str | None = None, **changes):
    body = {"mac": mac(i), "facts": facts(**changes)}
    return api.client.post("/api/v1/discovery/reports", json=body,
                           environ_base={"REMOTE_ADDR": address or f"10.99.200.{i}"})


def action(api, i: int):
    return api.client.get(f"/api/v1/discovery/machines/{mac(i)}/action",
                          environ_base={"REMOTE_ADDR": f"10.99.200.{i}"}).json


def machines(api, *query) -> list[dict]:
    return api.call(Role.READER, "GET", "/api/v1/discovery?" + "&".join(query)).json["items"]


def state_files(config) -> dict:
    paths = [config.inventory_path, book_path(config), *Layout.of(config).discovery.rglob("*.json")]
    return {str(p): p.read_bytes() for p in paths if p.exists()}


def test_a_report_enlists_the_machine_which_waits_and_is_listed(api, config):
    answer = report(api, 1)
    assert answer.status_code == 200, answer.json
    assert answer.json["action"] == "wait" and answer.json["node"] is None
    listed = machines(api)
    assert [(m["mac"], m["seq"], m["state"], m["address"]) for m in listed] == [
        (mac(1), 1, "pending", "10.99.200.1")]
    assert listed[0]["facts"]["cpu"]["threads"] == 4
    assert action(api, 1)["action"] == "wait"
    assert action(api, 9)["action"] == "report"  # unknown here: send the facts
    one = api.call(Role.READER, "GET", f"/api/v1/discovery/machines/{mac(1)}").json
    assert one["facts"]["dmi"]["serial"] == "S1"
    assert [e.subject for e in read_since(config, 0) if e.kind == "discovery.enlisted"] == [
        mac(1)]


@pytest.mark.parametrize("body,status,code", [
    (b"{", 400, "invalid_input"),
    (b"[1, 2]", 400, "invalid_input"),
    (json.dumps({"mac": "52:54:00:aa:00:01"}).encode(), 400, "invalid_input"),
    (json.dumps({"mac": "zz", "facts": FACTS}).encode(), 400, "invalid_input"),
    (json.dumps({"mac": "01:00:5e:00:00:01", "facts": FACTS}).encode(), 400, "invalid_input"),
    (json.dumps({"mac": "52:54:00:aa:00:01", "facts": facts(cpu__threads=-1)}).encode(),
     400, "invalid_input"),
    (json.dumps({"mac": "52:54:00:aa:00:01", "facts": facts(cpu__threads="4")}).encode(),
     400, "invalid_input"),
    (json.dumps({"mac": "52:54:00:aa:00:01", "facts": facts(dmi__product="x\x1b[2J")}
                ).encode(), 400, "invalid_input"),
    (json.dumps({"mac": "52:54:00:aa:00:01", "facts": facts(dmi__product="x" * 129)}
                ).encode(), 400, "invalid_input"),
    (json.dumps({"mac": "52:54:00:aa:00:01", "facts": facts(
        nics=[{**FACTS["nics"][0], "name": "e\x1b[2J"}])}).encode(), 400, "invalid_input"),
    (json.dumps({"mac": "52:54:00:aa:00:01", "facts": facts(
        nics=[{**FACTS["nics"][0], "name": "e\u202e0"}])}).encode(), 400, "invalid_input"),
    (json.dumps({"mac": "52:54:00:aa:00:01", "facts": facts(disks=[FACTS["disks"][0]] * 65)}
                ).encode(), 400, "invalid_input"),
    (json.dumps({"mac": "52:54:00:aa:00:01", "facts": facts(extra=1)}).encode(), 400,
     "invalid_input"),
    (json.dumps({"mac": "52:54:00:aa:00:01", "facts": facts(bmc={"address": "no"})}
                ).encode(), 400, "invalid_input"),
    (b'{"mac": "52:54:00:aa:00:01", "facts": ' + b" " * (70 << 10) + b"{}}", 413,
     "too_large"),
])
def test_junk_and_oversize_reports_are_4xx_and_change_nothing(api, config, body, status, code):
    assert report(api, 2).status_code == 200
    before = state_files(config)
    answer = api.client.post("/api/v1/discovery/reports", data=body,
                             content_type="application/json",
                             environ_base={"REMOTE_ADDR": "10.99.200.7"})
    assert_error(answer, status, code)
    assert state_files(config) == before


def test_500_spoofed_reports_from_one_address_are_limited_and_the_queue_stays_bounded(
        api, config):
    answers = [report(api, i, address="10.99.200.66").status_code for i in range(1, 501)]
    limit = config.discovery.reports_per_minute
    assert answers[:config.discovery.pending_per_address] == [200] * 4
    assert set(answers[limit:]) == {429}  # the address's budget for the minute is spent
    assert len(machines(api)) == config.discovery.pending_per_address
    # with the per-address budget out of the way (other workers), the book still bounds it
    api.app.extensions.pop("provisiond.discovery")
    config.discovery.reports_per_minute = 10_000
    more = [report(api, i, address="10.99.200.66").status_code for i in range(501, 1001)]
    assert set(more) == {429}
    assert len(machines(api, "limit=1000")) == config.discovery.pending_per_address


def test_the_queue_of_waiting_machines_is_bounded_in_all(api, config):
    config.discovery.max_pending = 3
    codes = [report(api, i).status_code for i in range(1, 6)]
    assert codes == [200, 200, 200, 503, 503]
    assert len(machines(api)) == 3
    assert report(api, 1).status_code == 200  # a known one may report again


def test_approve_in_discovery_order_with_names_and_addresses_from_a_sequence(api, config):
    for i in (3, 1, 2):
        assert report(api, i, dmi__serial=f"S{10 - i}").status_code == 200
    add_nodes(config, 0)
    with InventoryStore(config).edit() as inv:  # n065 is taken: the sequence skips it
        inv.nodes["n065"] = Record()
    answer = api.call(Role.ADMIN, "POST", "/api/v1/discovery/approve", json={
        "names": "n[065-128]", "ipaddr": "10.10.0.75", "profile": "default"})
    assert answer.status_code == 200, answer.json
    assert [(m["mac"], m["node"]) for m in answer.json["items"]] == [
        (mac(3), "n066"), (mac(1), "n067"), (mac(2), "n068")]
    nodes = InventoryStore(config).read().nodes
    assert nodes["n066"].netdevs["eth0"].mac == mac(3)
    assert nodes["n066"].netdevs["eth0"].ipaddr == "10.10.0.76"
    assert nodes["n068"].netdevs["eth0"].ipaddr == "10.10.0.78"
    assert {m["state"] for m in machines(api)} == {"approved"}
    assert action(api, 3) == {"action": "reboot", "node": "n066", "retry": 10}
    assert facts_of(config, "n066").facts.dmi.serial == "S7"
    kinds = [e.kind for e in read_since(config, 0)]
    assert kinds.count("discovery.approved") == 3 and "inventory.changed" in kinds


def test_approve_sorted_by_a_fact_and_one_by_one(api, config):
    for i, serial in ((1, "C"), (2, "A"), (3, "B")):
        report(api, i, dmi__serial=serial)
    one = api.call(Role.ADMIN, "POST", "/api/v1/discovery/approve", json={
        "macs": [mac(3)], "names": "gpu7", "ipaddr": "10.10.1.7"})
    assert [m["node"] for m in one.json["items"]] == ["gpu7"]
    rest = api.call(Role.ADMIN, "POST", "/api/v1/discovery/approve", json={
        "names": "n[1-8]", "ipaddr": "10.10.0.1", "sort": "dmi.serial"})
    assert [(m["mac"], m["node"]) for m in rest.json["items"]] == [(mac(2), "n1"),
                                                                    (mac(1), "n2")]


def test_approval_that_cannot_be_made_writes_nothing(api, config):
    report(api, 1)
    report(api, 2)
    before = state_files(config)
    for body, status, code in (
            ({"names": "n1"}, 400, "invalid_input"),                   # 2 machines, 1 name
            ({"names": "n[1-2]", "sort": "nope"}, 400, "invalid_input"),
            ({"names": "n[1-2]", "macs": ["52:54:00:00:00:99"]}, 404, "not_found"),
            ({"names": "n[1-2]", "ipaddr": "10.10.0.255", "profile": "nope"}, 422,
             "invalid_inventory")):
        assert_error(api.call(Role.ADMIN, "POST", "/api/v1/discovery/approve", json=body),
                     status, code)
    assert state_files(config) == before
    assert_error(api.call(Role.OPERATOR, "POST", "/api/v1/discovery/approve",
                          json={"names": "n[1-2]"}), 403, "forbidden")


def test_rejected_machines_are_told_to_power_off(api, config):
    report(api, 1)
    answer = api.call(Role.ADMIN, "POST", "/api/v1/discovery/reject", json={"macs": [mac(1)]})
    assert answer.json["items"][0]["state"] == "rejected"
    assert action(api, 1)["action"] == "poweroff"
    assert report(api, 1).json["action"] == "poweroff"


def test_a_rule_approves_a_matching_machine_as_it_reports(api, config):
    rules_path(config).parent.mkdir(parents=True, exist_ok=True)
    rules_path(config).write_text(
        "- name: big\n  match: {dmi.product: 'Big*', cpu.threads: 4}\n"
        "  profile: default\n  names: big[01-10]\n  ipaddr: 10.10.2.1\n"
        "- name: mine\n  match: {mac: '52:54:00:aa:00:0[4-5]'}\n  names: m[1-2]\n")
    assert report(api, 1).json["action"] == "wait"  # Standard PC: no rule
    answer = report(api, 2, dmi__product="Big Iron")
    assert answer.json == {"action": "reboot", "node": "big01", "retry": 10}
    assert report(api, 3, dmi__product="Big Iron", cpu__threads=8).json["action"] == "wait"
    assert report(api, 4).json["node"] == "m1"
    assert report(api, 5).json["node"] == "m2"
    sixth = report(api, 4 + 256)  # 52:54:00:aa:01:04 does not match [4-5] at the end
    assert sixth.json["action"] == "wait"
    by_mac = {m["mac"]: m for m in machines(api)}
    assert by_mac[mac(2)]["decided_by"] == "rule:big"
    assert InventoryStore(config).read().nodes["big01"].netdevs["eth0"].ipaddr == "10.10.2.1"
    listed = api.call(Role.READER, "GET", "/api/v1/discovery/rules").json["items"]
    assert [r["name"] for r in listed] == ["big", "mine"]


def test_a_rule_out_of_names_leaves_the_machine_waiting_with_the_reason(api, config):
    rules_path(config).parent.mkdir(parents=True, exist_ok=True)
    rules_path(config).write_text("- name: one\n  match: {dmi.vendor: QEMU}\n  names: x1\n")
    assert report(api, 1).json["node"] == "x1"
    assert report(api, 2).json["action"] == "wait"
    waiting = machines(api, "state=pending")
    assert "rule one" in waiting[0]["problem"] and "free names" in waiting[0]["problem"]


def test_a_bad_rules_file_approves_nothing_and_is_a_clear_error(api, config):
    rules_path(config).parent.mkdir(parents=True, exist_ok=True)
    rules_path(config).write_text("- name: x\n  match: {cpu.speed: 1}\n  names: y1\n")
    assert report(api, 1).json["action"] == "wait"
    assert_error(api.call(Role.READER, "GET", "/api/v1/discovery/rules"), 400,
                 "invalid_input")


def test_known_nodes_report_facts_with_their_credential(api, config):
    add_nodes(config, 2)
    add_image(config, "tiny")
    body = facts()
    assert_error(api.client.post("/api/v1/facts/n1", json=body,
                                 environ_base=node_env(1)), 401, "unauthenticated")
    headers = credential(api.client, 1)
    answer = api.client.post("/api/v1/facts/n1", json=body, headers=headers,
                             environ_base=node_env(1))
    assert answer.status_code == 200, answer.json
    assert_error(api.client.post("/api/v1/facts/n2", json=body, headers=headers,
                                 environ_base=node_env(1)), 401, "unauthenticated")
    shown = api.call(Role.READER, "GET", "/api/v1/nodes/n1/facts").json
    assert shown["facts"]["cpu"]["threads"] == 4 and shown["time"] > 0
    assert_error(api.call(Role.READER, "GET", "/api/v1/nodes/n2/facts"), 404, "not_found")
    assert_error(api.client.post("/api/v1/facts/n1", json={"cpu": {}}, headers=headers,
                                 environ_base=node_env(1)), 400, "invalid_input")
    assert facts_of(config, "n1").facts.memory_mib == 2048
    assert api.call(Role.ADMIN, "DELETE", "/api/v1/nodes/n1").status_code == 204
    assert facts_of(config, "n1") is None  # a deleted node's facts go with it


def test_sightings_are_paged(api, config):
    from provisiond.boot.discovery import DiscoveryLog

    log = DiscoveryLog(config, per_mac=0, per_second=1000)
    for i in range(3):
        assert log.note(f"02:00:00:00:01:0{i}", arch=7)
    first = api.call(Role.READER, "GET", "/api/v1/discovery/sightings?limit=2").json
    assert [r["mac"][-2:] for r in first["items"]] == ["00", "01"] and first["continue"]


def test_with_discovery_off_the_open_routes_are_404_and_store_nothing(api, config):
    config.discovery.pool = None
    assert_error(report(api, 1), 404, "not_found")
    assert_error(api.client.get(f"/api/v1/discovery/machines/{mac(1)}/action"), 404,
                 "not_found")
    assert not book_path(config).exists()


def test_each_address_has_a_budget_of_calls_a_minute(api, config):
    def poll(address: str) -> int:
        return api.client.get(f"/api/v1/discovery/machines/{mac(1)}/action",
                              environ_base={"REMOTE_ADDR": address}).status_code

    budget = config.discovery.reports_per_minute
    assert [poll("10.99.200.9") for _ in range(budget)] == [200] * budget
    assert_error(api.client.get(f"/api/v1/discovery/machines/{mac(1)}/action",
                                environ_base={"REMOTE_ADDR": "10.99.200.9"}), 429,
                 "too_many_requests")
    assert report(api, 1, address="10.99.200.9").status_code == 429
    assert poll("10.99.200.10") == 200  # another address has its own budget
    assert not book_path(config).exists()


def test_a_machine_whose_node_was_deleted_enlists_anew(api, config):
    report(api, 1)
    api.call(Role.ADMIN, "POST", "/api/v1/discovery/approve", json={"names": "n1"})
    assert action(api, 1)["action"] == "reboot"
    assert api.call(Role.ADMIN, "DELETE", "/api/v1/nodes/n1").status_code == 204
    assert action(api, 1)["action"] == "report"
    assert report(api, 1).json["action"] == "wait"
    assert [(m["state"], m["node"]) for m in machines(api)] == [("pending", None)]


def test_a_report_claiming_a_nodes_mac_enlists_nothing_and_blocks_no_approval(api, config):
    """A host on the boot network may say it has a known node's MAC: it is told to reboot as
    that node (as the boot table says), but no machine waits with the node's MAC, so
    `approve` of every waiting machine is not stopped by a MAC a node has already."""
    add_nodes(config, 1)
    report(api, 1)
    spoof = api.client.post("/api/v1/discovery/reports",
                            json={"mac": "52:54:00:00:00:01", "facts": facts()},
                            environ_base={"REMOTE_ADDR": "10.99.200.66"})
    assert spoof.json["action"] == "reboot"
    assert [m["mac"] for m in machines(api)] == [mac(1)]
    answer = api.call(Role.ADMIN, "POST", "/api/v1/discovery/approve", json={"names": "x[1-9]"})
    assert answer.status_code == 200, answer.json
    assert [(m["mac"], m["node"]) for m in answer.json["items"]] == [(mac(1), "x1")]


def test_a_waiting_machine_whose_mac_became_a_node_is_not_approved_again(api, config):
    """An admin may `node add` a waiting machine's MAC by hand (or a crash may come between
    an approval's inventory write and its book write): approving every waiting machine
    leaves that one out instead of failing on a MAC used twice."""
    report(api, 1)
    report(api, 2)
    with InventoryStore(config).edit() as inv:
        inv.nodes["hand"] = Record.model_validate({"netdevs": {"eth0": {"mac": mac(1)}}})
    answer = api.call(Role.ADMIN, "POST", "/api/v1/discovery/approve", json={"names": "x[1-9]"})
    assert answer.status_code == 200, answer.json
    assert [(m["mac"], m["node"]) for m in answer.json["items"]] == [(mac(2), "x1")]


def test_waiting_machines_made_nodes_by_hand_hold_no_room_of_their_address(api, config):
    """Machines leased the pool's first address one after another, each made a node by
    `node add --mac` instead of `discover approve`, stayed `pending` for good (they cannot
    be rejected: a node has the MAC), and at discovery.pending_per_address (4) of them no
    new machine leased that address could ever enlist (429)."""
    for i in range(1, 5):
        assert report(api, i, address="10.99.200.1").status_code == 200
    with InventoryStore(config).edit() as inv:
        for i in range(1, 5):
            inv.nodes[f"hand{i}"] = Record.model_validate({"netdevs": {"eth0": {"mac": mac(i)}}})
    answer = report(api, 5, address="10.99.200.1")
    assert answer.status_code == 200 and answer.json["action"] == "wait", answer.json
    states = {m["mac"]: (m["state"], m["node"]) for m in machines(api)}
    assert states == {**{mac(i): ("approved", f"hand{i}") for i in range(1, 5)},
                      mac(5): ("pending", None)}


def test_a_machine_approved_as_an_existing_node_cannot_be_rejected(api, config):
    """Rejecting it changed the book only: its node stayed, so the machine was told to
    reboot as that node while `discover list` said rejected."""
    report(api, 1)
    api.call(Role.ADMIN, "POST", "/api/v1/discovery/approve", json={"names": "n1"})
    before = state_files(config)
    answer = api.call(Role.ADMIN, "POST", "/api/v1/discovery/reject", json={"macs": [mac(1)]})
    assert_error(answer, 400, "invalid_input")
    assert "n1" in answer.json["error"]["message"]
    assert state_files(config) == before
    assert action(api, 1)["action"] == "reboot"


def test_a_rule_on_a_mac_prefix_written_in_capitals_matches(api, config):
    """MACs are kept in lowercase: a rule's `mac: 'B0:26:28:*'` (as vendors print them)
    matched no machine, and never said so."""
    rules_path(config).parent.mkdir(parents=True, exist_ok=True)
    rules_path(config).write_text("- name: caps\n  match: {mac: '52:54:00:AA:*'}\n"
                                  "  names: c[1-9]\n")
    assert report(api, 1).json == {"action": "reboot", "node": "c1", "retry": 10}


def test_approval_gives_no_node_an_address_of_the_discovery_pool(api, config):
    """A node address in the pool was another waiting machine's lease of the moment (two
    hosts, one address, until that one renewed); the pool is for machines no node has."""
    report(api, 1)
    before = state_files(config)
    answer = api.call(Role.ADMIN, "POST", "/api/v1/discovery/approve",
                      json={"names": "n1", "ipaddr": "10.99.200.20"})
    assert_error(answer, 400, "invalid_input")
    assert "discovery.pool" in answer.json["error"]["message"]
    assert state_files(config) == before
