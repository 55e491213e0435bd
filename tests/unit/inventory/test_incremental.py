"""A write of a few records checks only those (validate.check_changes against the claims of
the last valid version): it refuses exactly what the whole-inventory check refuses."""

from __future__ import annotations

import random
import re

import pytest

from provisiond.errors import InvalidInventory
from provisiond.inventory import InventoryStore
from provisiond.inventory import store as store_module
from provisiond.inventory.model import Inventory, Record
from provisiond.inventory.validate import Claims, check_changes, check_inventory

# Values drawn from small pools, so that random records collide often.
MACS = ["52:54:00:00:00:01", "52:54:00:00:00:02", "52:54:00:00:00:03"]
IPS = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.0", "10.0.0.255", "127.0.0.5",
       "10.9.0.1", "10.0.0.200"]
IP6S = ["fd00::1", "fd00::2", "::1"]
BMCS = ["10.5.0.1", "10.5.0.2"]


def random_record(rng: random.Random, profiles: list[str]) -> Record:
    data: dict = {}
    if rng.random() < 0.7:
        data["profiles"] = rng.sample(profiles + ["missing"], rng.randint(0, 2))
    netdevs = {}
    for dev in rng.sample(["eth0", "eth1"], rng.randint(0, 2)):
        netdev = {key: rng.choice(pool) for key, pool in (
            ("mac", MACS), ("ipaddr", IPS), ("ipaddr6", IP6S)) if rng.random() < 0.5}
        if rng.random() < 0.3:
            netdev["netmask"] = "255.255.255.0"
        if rng.random() < 0.2:
            netdev["gateway"] = rng.choice(["10.0.0.254", "10.1.0.1"])
        netdevs[dev] = netdev
    if netdevs:
        data["netdevs"] = netdevs
    if rng.random() < 0.4:
        data["bmc"] = {"driver": rng.choice(["redfish", "ipmi", "fake"]),
                       "address": rng.choice(BMCS)}
        if rng.random() < 0.3:
            data["bmc"]["port"] = 623
    return Record.model_validate(data)


PROFILES = {
    "net": Record.model_validate({"netdevs": {"eth0": {"netmask": "255.255.255.0"}}}),
    "gw": Record.model_validate({"netdevs": {"eth0": {"gateway": "10.0.0.254"}}}),
    "bmc": Record.model_validate({"bmc": {"driver": "ipmi", "port": 6230}}),
}


def valid_base(rng: random.Random, config) -> tuple[Inventory, Claims]:
    """A random inventory the whole check accepts, and its claims."""
    while True:
        nodes = {f"n{i}": random_record(rng, list(PROFILES)) for i in range(rng.randint(0, 5))}
        inventory = Inventory(profiles=dict(PROFILES), nodes=nodes)
        try:
            return inventory, check_inventory(inventory, config)[1]
        except InvalidInventory:
            continue


def verdict(check) -> str | None:
    try:
        check()
    except InvalidInventory as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("server", ["127.0.0.1", "10.0.0.200"])
def test_check_changes_refuses_exactly_what_the_whole_check_refuses(config, server):
    """Random valid inventories, random changes of one to three nodes (added, replaced,
    removed, renamed to a bad name) drawn from colliding pools: the two checks agree on
    every one, and on what each node holds after an accepted change. (A server on
    loopback allows loopback nodes, another does not.)"""
    config.server.address = server
    rng = random.Random(12)
    refused = accepted = 0
    for _ in range(1500):
        base, claims = valid_base(rng, config)
        names = list(base.nodes)
        draft = Inventory(profiles=dict(base.profiles), nodes=dict(base.nodes))
        changed = []
        for _ in range(rng.randint(1, 3)):
            name = rng.choice(names + ["n7", "n8", "N_bad"] if names else ["n7", "N_bad"])
            if name in draft.nodes and rng.random() < 0.3:
                del draft.nodes[name]
            else:
                draft.nodes[name] = random_record(rng, list(PROFILES))
            changed.append(name)
        held_before = dict(claims.held)
        whole = verdict(lambda: check_inventory(draft, config))
        found: list[Claims] = []
        part = verdict(lambda: found.append(check_changes(draft, claims, changed)))
        assert (whole is None) == (part is None), (base, draft.nodes, changed, whole, part)
        assert claims.held == held_before  # the given claims are left as they were
        if whole is None:
            accepted += 1
            assert found[0].held == check_inventory(draft, config)[1].held
        else:
            refused += 1
    assert refused > 300 and accepted > 300  # both outcomes were really exercised


# (what the draft changes, what the whole check says): each rule of validate.py.
RULES = [
    ({"n3": {"netdevs": {"eth0": {"mac": "52:54:00:00:00:01"}}}}, "mac: 52:54:00:00:00:01 is already used"),
    ({"n3": {"netdevs": {"eth0": {"ipaddr": "10.0.0.1"}}}}, "10.0.0.1 is already used"),
    ({"n3": {"netdevs": {"eth0": {"ipaddr6": "fd00::1"}}}}, "fd00::1 is already used"),
    ({"n3": {"netdevs": {"eth0": {"ipaddr": "10.0.0.200"}}}}, "already used by the server"),
    ({"n3": {"netdevs": {"eth0": {"ipaddr": "127.0.0.5"}}}}, "is loopback"),
    ({"n3": {"netdevs": {"eth0": {"ipaddr6": "::1"}}}}, "is loopback"),
    ({"n3": {"netdevs": {"eth0": {"ipaddr": "10.0.0.0", "netmask": "255.255.255.0"}}}},
     "network or broadcast"),
    ({"n3": {"netdevs": {"eth0": {"ipaddr": "10.0.0.9", "netmask": "255.255.255.0",
                                  "gateway": "10.1.0.1"}}}}, "outside the network"),
    ({"n3": {"bmc": {"driver": "redfish", "address": "10.5.0.1"}}}, "bmc.address: 10.5.0.1 is"),
    ({"n3": {"profiles": ["missing"]}}, "unknown profile 'missing'"),
    ({"N_3": {}}, "node name"),
    # n1 changed: its new address is n2's; n2's old one freed for n1 is no conflict
    ({"n1": {"netdevs": {"eth0": {"ipaddr": "10.0.0.2"}}}}, "10.0.0.2 is already used"),
    # two new nodes colliding with each other only
    ({"n3": {"netdevs": {"eth0": {"ipaddr": "10.0.0.7"}}},
      "n4": {"netdevs": {"eth0": {"ipaddr": "10.0.0.7"}}}}, "10.0.0.7 is already used"),
]


def _base_inventory(config) -> None:
    with InventoryStore(config).edit() as inventory:
        inventory.profiles["p"] = Record()
        inventory.nodes["n1"] = Record.model_validate({"netdevs": {"eth0": {
            "mac": "52:54:00:00:00:01", "ipaddr": "10.0.0.1", "ipaddr6": "fd00::1"}},
            "bmc": {"driver": "redfish", "address": "10.5.0.1"}})
        inventory.nodes["n2"] = Record.model_validate({"netdevs": {"eth0": {
            "ipaddr": "10.0.0.2"}}})


@pytest.mark.parametrize("records, message", RULES)
def test_each_rule_is_kept_by_a_write_of_a_few_records(config, monkeypatch, records, message):
    """Through the store's fast path, with the claims of the last write at hand (the whole
    check is not called), each rule refuses what the whole check refuses, with its
    message, and nothing is written. (For a clash, the whole check names the later node of
    the two in file order first; the fast path names the changed one first.)"""
    config.server.address = "10.0.0.200"  # not loopback: loopback nodes are refused
    _base_inventory(config)
    before = config.inventory_path.read_bytes()
    draft = InventoryStore(config).read()
    draft.nodes.update({n: Record.model_validate(d) for n, d in records.items()})
    with pytest.raises(InvalidInventory, match=message) as whole:
        check_inventory(draft, config)
    monkeypatch.setattr(store_module, "check_inventory", _no_whole_check)
    with pytest.raises(InvalidInventory) as part:
        with InventoryStore(config).edit_records() as inventory:
            for name, data in records.items():
                inventory.nodes[name] = Record.model_validate(data)
    assert re.search(message, str(part.value))
    assert _words(part.value) == _words(whole.value)
    assert config.inventory_path.read_bytes() == before


def _words(error: Exception) -> list[str]:
    return sorted(str(error).replace(":", " ").split())


def _no_whole_check(*_args, **_kwargs):
    raise AssertionError("the whole inventory was checked")


def test_a_valid_change_of_one_node_checks_that_node_alone(config, monkeypatch):
    _base_inventory(config)
    monkeypatch.setattr(store_module, "check_inventory", _no_whole_check)
    with InventoryStore(config).edit_records() as inventory:
        inventory.nodes["n1"] = Record.model_validate({"netdevs": {"eth0": {
            "ipaddr": "10.0.0.3"}}})  # n1 gives up its MAC, addresses and BMC
        inventory.nodes["n3"] = Record.model_validate({"netdevs": {"eth0": {
            "mac": "52:54:00:00:00:01", "ipaddr": "10.0.0.1"}}})  # and n3 takes them
    assert InventoryStore(config).read().nodes["n3"].netdevs["eth0"].ipaddr == "10.0.0.1"


def test_a_profile_change_checks_the_whole_inventory(config):
    """A profile's fields are every user's: a MAC given to a profile of two nodes is
    refused (the nodes' own records did not change)."""
    _base_inventory(config)
    with InventoryStore(config).edit_records() as inventory:
        inventory.nodes["n1"] = inventory.nodes["n1"].model_copy(update={"profiles": ["p"]})
        inventory.nodes["n2"] = inventory.nodes["n2"].model_copy(update={"profiles": ["p"]})
    with pytest.raises(InvalidInventory, match="mac: 52:54:00:00:00:09 is already used"):
        with InventoryStore(config).edit_records() as inventory:
            inventory.profiles["p"] = Record.model_validate(
                {"netdevs": {"eth1": {"mac": "52:54:00:00:00:09"}}})


def test_an_invalid_file_is_still_refused_whatever_the_change(config):
    """A hand-edited file with two nodes on one address: a change of a third node is
    refused as the whole check refuses it (no claims of a valid version exist)."""
    config.inventory_path.write_text(
        "nodes:\n  n1:\n    netdevs:\n      eth0: {ipaddr: 10.0.0.1}\n"
        "  n2:\n    netdevs:\n      eth0: {ipaddr: 10.0.0.1}\n")
    with pytest.raises(InvalidInventory, match="node n2: netdevs.eth0.ipaddr: 10.0.0.1 is"):
        with InventoryStore(config).edit_records() as inventory:
            inventory.nodes["n3"] = Record(comment="unrelated")
