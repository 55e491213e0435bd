"""preflight.nodes: the image check reads the manifest through ImageManifest."""

import json

from provisiond.inventory import InventoryStore
from provisiond.inventory.model import NetDev, Record
from provisiond.preflight.nodes import check_nodes
from provisiond.state.layout import Layout


def test_a_damaged_manifest_is_a_failed_check_naming_it(config):
    """A manifest without its kernel stopped `provisiond doctor` with a KeyError."""
    with InventoryStore(config).edit() as inv:
        inv.nodes["n1"] = Record(image="tiny", netdevs={"eth0": NetDev(
            mac="52:54:00:00:00:01", ipaddr="10.0.0.2", netmask="255.255.255.0")})
    path = Layout.of(config).image_manifest("tiny")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"name": "tiny", "layers": []}))
    [image] = [f for f in check_nodes(config, None, bmc=False) if f.check == "image"]
    assert image.level == "fail" and f"{path}: kernel: Field required" in image.detail, image
