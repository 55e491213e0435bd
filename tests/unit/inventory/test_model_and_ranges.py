"""Schema checks and node ranges."""

import re

import pytest
from pydantic import ValidationError

from provisiond.errors import InvalidInput, InvalidInventory
from provisiond.inventory.model import Inventory, Record, node_sort_key
from provisiond.inventory.ranges import (MAX_RANGE_NODES, consecutive, expand, fold,
                                         spread_addresses)
from provisiond.inventory.validate import validate_inventory


def test_expand_and_fold_ranges():
    assert expand("n[001-003]") == ["n001", "n002", "n003"]
    assert expand("n[1-2],gpu[1-2]") == ["gpu1", "gpu2", "n1", "n2"]
    assert expand("n[9-10]") == ["n9", "n10"]
    assert fold(["n001", "n002", "n003"]) == "n[001-003]"


@pytest.mark.parametrize("text", ["\u00b2", "n\u00b2", "n1\u00b2", "\u0663", "n\u0663x1", ""])
def test_every_string_has_a_natural_sort_key(text):
    """'²' is str.isdigit() but no int(); '٣' is \\d: a forged continue token or a range
    naming them was a ValueError (a 500). Only ASCII digits are numbers."""
    key = node_sort_key(text)
    assert all(isinstance(part, int) == (i % 2 == 1) for i, part in enumerate(key))
    assert sorted(["n10", text, "n9", "n1"], key=node_sort_key).index("n9") < sorted(
        ["n10", text, "n9", "n1"], key=node_sort_key).index("n10")


def test_natural_order_of_ascii_names():
    names = ["n10", "n9", "gpu2", "n1", "10", "9", "n01", "a-b1"]
    assert sorted(names, key=node_sort_key) == ["9", "10", "a-b1", "gpu2", "n1", "n01",
                                                "n9", "n10"]


def test_bad_range_is_invalid_input():
    with pytest.raises(InvalidInput, match="invalid node range"):
        expand("n[3-")


@pytest.mark.parametrize("pattern", ["x[1-99999999999]", "x[1-5000000]", "a[1-60000],b[1-60000]",
                                     "r[1-1000]n[1-1000]", "x[0-99999999999/2]"])
def test_a_range_too_large_is_invalid_input_before_it_is_expanded(pattern):
    """NodeSet asserts on 1e9 names (a traceback) and takes minutes on millions."""
    with pytest.raises(InvalidInput, match=f"node range {re.escape(repr(pattern))} names "
                       f"more than {MAX_RANGE_NODES} nodes"):
        expand(pattern)


@pytest.mark.parametrize("template", ["@x/p' /dev/null; touch {mark}; echo '",
                                      "n[1-2],@x/p' /dev/null; touch {mark}; echo '",
                                      "n1!@x/p' /dev/null; touch {mark}; echo '"])
def test_a_range_never_runs_a_node_group_command(tmp_path, template):
    """ClusterShell resolves @group through groups.conf, whose shipped `local` source is a
    shell command with the group name pasted in: a range from an apply file ran commands."""
    mark = tmp_path / "ran"
    try:
        expand(template.format(mark=mark))
        message = ""
    except InvalidInput as exc:
        message = str(exc)
    assert not mark.exists()
    assert "node groups (@name) are not supported" in message


def test_a_large_but_bounded_range_expands():
    assert len(expand("a[1-1000],b[1-1000]")) == 2000
    assert len(expand(f"n[1-{MAX_RANGE_NODES}]")) == MAX_RANGE_NODES
    assert expand("n[1-9/4]") == ["n1", "n5", "n9"]
    assert len(expand(f"n[1-{MAX_RANGE_NODES}]!n[1-10]")) == MAX_RANGE_NODES - 10


def test_consecutive_addresses_and_macs():
    assert consecutive("10.0.0.254", 3, "ipaddr") == ["10.0.0.254", "10.0.0.255", "10.0.1.0"]
    assert consecutive("52:54:00:00:00:ff", 2, "mac") == [
        "52:54:00:00:00:ff", "52:54:00:00:01:00"]
    assert consecutive("fd00::ffff", 2, "ipaddr6") == ["fd00::ffff", "fd00::1:0"]
    assert consecutive("fd00::1", 1, "ipaddr6") == ["fd00::1"]
    with pytest.raises(InvalidInput, match="ipaddr: 2 consecutive values from 255.255.255.255"):
        consecutive("255.255.255.255", 2, "ipaddr")
    with pytest.raises(InvalidInput, match="overflow"):
        consecutive("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 2, "ipaddr6")
    with pytest.raises(InvalidInput, match="overflow"):
        consecutive("ff:ff:ff:ff:ff:ff", 2, "mac")
    assert consecutive("bmc.lab", 2, "bmc.address") == ["bmc.lab", "bmc.lab"]  # not counted


@pytest.mark.parametrize("first", ["fe80::1%eth0", "fd00::1%x", 167772161, 5])
def test_consecutive_leaves_what_the_schema_refuses_alone(first):
    """A scope id (dropped by ipaddress) or a number YAML read (ip_address(167772161) is
    10.0.0.1) must reach the schema as given, to be refused there with its own message."""
    assert consecutive(first, 2, "netdevs.eth0.ipaddr6") == [first, first]
    assert consecutive(first, 2, "bmc.address") == [first, first]


def test_spread_addresses_counts_up_every_address_field():
    data = {"image": "tiny", "bmc": {"address": "10.1.0.9", "port": 623},
            "netdevs": {"eth0": {"mac": "52:54:00:00:00:fe", "ipaddr": "10.0.0.11",
                                 "ipaddr6": "fd00::b", "netmask": "255.255.255.0"},
                        "ib0": {"ipaddr": "10.2.0.1"}}}
    spread = spread_addresses(data, 3)
    assert [d["netdevs"]["eth0"]["mac"] for d in spread] == [
        "52:54:00:00:00:fe", "52:54:00:00:00:ff", "52:54:00:00:01:00"]
    assert [d["netdevs"]["eth0"]["ipaddr6"] for d in spread] == ["fd00::b", "fd00::c", "fd00::d"]
    assert [d["netdevs"]["ib0"]["ipaddr"] for d in spread] == ["10.2.0.1", "10.2.0.2", "10.2.0.3"]
    assert [d["bmc"]["address"] for d in spread] == ["10.1.0.9", "10.1.0.10", "10.1.0.11"]
    assert {d["netdevs"]["eth0"]["netmask"] for d in spread} == {"255.255.255.0"}
    assert data["netdevs"]["eth0"]["ipaddr"] == "10.0.0.11"  # the input is left alone


@pytest.mark.parametrize("data, text", [
    ({"netdevs": {"eth0": {"mac": "52:54:00:zz:00:01"}}}, "invalid MAC"),
    ({"netdevs": {"eth0": {"ipaddr": "10.0.0.300"}}}, "invalid IPv4"),
    ({"netdevs": {"eth0": {"netmask": "255.0.255.0"}}}, "invalid netmask"),
    ({"bmc": {"port": 70000}}, "outside 1-65535"),
    ({"colour": "blue"}, "Extra inputs"),
])
def test_record_rejects_bad_values(data, text):
    with pytest.raises(ValidationError, match=text):
        Record.model_validate(data)


def test_mac_is_normalised():
    record = Record.model_validate({"netdevs": {"eth0": {"mac": "52-54-00-AB-00-01"}}})
    assert record.netdevs["eth0"].mac == "52:54:00:ab:00:01"


def test_validate_rejects_duplicates_and_foreign_networks():
    inventory = Inventory(nodes={
        "n1": Record(netdevs={"eth0": {"mac": "52:54:00:00:00:01", "ipaddr": "10.0.0.5"}}),
        "n2": Record(netdevs={"eth0": {"mac": "52:54:00:00:00:01", "ipaddr": "10.0.0.6"}}),
    })
    with pytest.raises(InvalidInventory, match="node n2: netdevs.eth0.mac: .* used by node n1"):
        validate_inventory(inventory)
    inventory.nodes["n2"] = Record(netdevs={"eth0": {
        "ipaddr": "10.0.1.6", "netmask": "255.255.255.0", "gateway": "10.0.0.1"}})
    with pytest.raises(InvalidInventory, match="outside the network"):
        validate_inventory(inventory)


def test_validate_rejects_unknown_profile_and_nested_profiles():
    with pytest.raises(InvalidInventory, match="unknown profile 'gpu'"):
        validate_inventory(Inventory(nodes={"n1": Record(profiles=["gpu"])}))
    with pytest.raises(InvalidInventory, match="cannot list profiles"):
        validate_inventory(Inventory(profiles={"a": Record(profiles=["b"])}))
