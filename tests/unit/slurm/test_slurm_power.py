"""`provisiond slurm resume`: a resumed node boots anew, so the credential of its previous
boot ends with the resume (as with `node reprovision`)."""

from __future__ import annotations

import sys
from pathlib import Path

from provisiond.api import create_app
from provisiond.inventory import InventoryStore
from provisiond.inventory.model import Bmc
from provisiond.power.fake import read_fake_bmcs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "boot"))
from bootdata import add_image, add_nodes, credential, node_env  # noqa: E402


def test_resume_ends_the_credential_of_the_nodes_previous_boot(config, cli):
    add_nodes(config, 2)
    add_image(config, "tiny")
    with InventoryStore(config).edit() as inventory:
        for name in ("n1", "n2"):
            inventory.nodes[name].bmc = Bmc(driver="fake", address="bmc")
    client = create_app(config).test_client()
    client.application.extensions["provisiond"].watcher.interval = 0
    old = credential(client, 1)  # the running node's, Slurm thinks it powered down

    def report(headers: dict) -> int:
        return client.post("/api/v1/status/n1", data={"phase": "ready", "detail": "x"},
                           environ_base=node_env(1), headers=headers).status_code

    assert report(old) == 200
    assert cli("slurm", "resume", "n[1-2]", "--log", str(config.state_dir / "p.log")).code == 0
    assert read_fake_bmcs(config.state_dir / "power" / "fake-bmcs.json")["n1"]["boots"] == \
        ["pxe"]
    assert report(old) == 401
    assert report(credential(client, 1)) == 200  # the new boot's agent
