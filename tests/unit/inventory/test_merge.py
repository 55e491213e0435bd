"""Profile merge: node wins, profiles right to left, lists append, provenance recorded."""

from provisiond.inventory.merge import merge_node
from provisiond.inventory.model import Inventory, Record


def make_inventory() -> Inventory:
    return Inventory(
        profiles={
            "base": Record(image="tiny", kernel_args=["quiet"], tags={"role": "base", "a": "1"},
                           netdevs={"eth0": {"netmask": "255.255.255.0", "mtu": 1500}}),
            "gpu": Record(image="cuda", kernel_args=["nouveau.modeset=0", "quiet"],
                          tags={"role": "gpu"}),
        },
        nodes={"n1": Record(profiles=["base", "gpu"], kernel_args=["debug"],
                            netdevs={"eth0": {"ipaddr": "10.0.0.5", "mtu": 9000}})},
    )


def test_rightmost_profile_wins_and_node_wins_over_profiles():
    node = merge_node(make_inventory(), "n1")
    assert node.record.image == "cuda"
    assert node.provenance["image"] == "profile:gpu"
    assert node.record.netdevs["eth0"].mtu == 9000
    assert node.provenance["netdevs.eth0.mtu"] == "node"
    assert node.record.netdevs["eth0"].netmask == "255.255.255.0"
    assert node.provenance["netdevs.eth0.netmask"] == "profile:base"


def test_lists_append_in_profile_order_without_repeats():
    node = merge_node(make_inventory(), "n1")
    assert node.record.kernel_args == ["quiet", "nouveau.modeset=0", "debug"]
    assert node.provenance["kernel_args"] == "profile:base,profile:gpu,node"


def test_maps_merge_key_by_key():
    node = merge_node(make_inventory(), "n1")
    assert node.record.tags == {"role": "gpu", "a": "1"}
    assert node.provenance["tags.a"] == "profile:base"
    assert node.provenance["tags.role"] == "profile:gpu"


def test_primary_netdev_prefers_flag_then_name_order():
    inventory = Inventory(nodes={"n1": Record(netdevs={
        "eth1": {"ipaddr": "10.0.1.5"}, "eth0": {"ipaddr": "10.0.0.5"}})})
    assert merge_node(inventory, "n1").ipaddr == "10.0.0.5"
    inventory.nodes["n1"].netdevs["eth1"].primary = True
    assert merge_node(inventory, "n1").ipaddr == "10.0.1.5"
