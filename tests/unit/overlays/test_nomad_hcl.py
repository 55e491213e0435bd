"""The nomad-client overlay's client.hcl read back by a real HCL parser (python-hcl2).

No Nomad binary is available from the package registries here, so no client registers for
real: this checks that what the node gets parses as HCL and says what the inventory says,
including the image digest jobs can constrain on."""

from __future__ import annotations

import json

import hcl2
import yaml

from provisiond import archive
from provisiond.config import load_config
from provisiond.overlays import ensure_overlay
from provisiond.overlays.context import image_digest
from tests.unit.boot.bootdata import add_image
from tests.unit.overlays.test_build import write_inventory

ODD = 'say "hi" \\ ${node.unique.id} %{x}'


def hcl_string(raw):
    """An HCL string as the parser hands it back (quoted, escapes kept) -> its value."""
    if not (isinstance(raw, str) and raw.startswith('"')):
        return raw
    return json.loads(raw).replace("$${", "${").replace("%%{", "%{")


def client_hcl(state_dir, nomad: dict, image: bool = True) -> dict:
    write_inventory(state_dir, system=["nomad-client"], runtime=())
    data = yaml.safe_load((state_dir / "inventory.yaml").read_text())
    data["profiles"]["default"]["image"] = "compute"
    data["nodes"]["n1"]["nomad"] = nomad
    (state_dir / "inventory.yaml").write_text(yaml.safe_dump(data))
    config = load_config(state_dir)
    if image:
        add_image(config, "compute")
    entries = archive.unpack(archive.decompress(ensure_overlay(config, "n1", "system")
                                                .read_bytes()))
    text = next(e.data for e in entries if e.path == "etc/nomad.d/client.hcl").decode()
    return hcl2.loads(text)


def test_client_hcl_parses_with_the_nodes_settings_and_image_digest(state_dir):
    parsed = client_hcl(state_dir, {"datacenter": "hpc1", "node_class": "compute",
                                    "node_pool": "batch", "servers": ["10.0.0.1:4647"],
                                    "meta": {"rack": "r12", "odd": ODD}})
    config = load_config(state_dir)
    manifest = json.loads((config.images_dir / "compute" / "manifest.json").read_text())
    client = parsed["client"][0]
    assert hcl_string(parsed["name"]) == "n1"
    assert hcl_string(parsed["datacenter"]) == "hpc1"
    assert hcl_string(parsed["bind_addr"]) == "10.0.0.11"
    assert parsed["server"][0]["enabled"] is False and client["enabled"] is True
    assert hcl_string(client["node_class"]) == "compute"
    assert hcl_string(client["node_pool"]) == "batch"
    assert [hcl_string(s) for s in client["servers"]] == ["10.0.0.1:4647"]
    meta = {hcl_string(k): hcl_string(v) for k, v in client["meta"].items()}
    assert meta == {"rack": "r12", "odd": ODD, "provisiond.image": "compute",
                    "provisiond.image_digest": image_digest(manifest)}
    assert meta["provisiond.image_digest"].startswith("sha256:") and \
        len(meta["provisiond.image_digest"]) == len("sha256:") + 64


def test_without_settings_or_a_built_image_the_defaults_parse(state_dir):
    parsed = client_hcl(state_dir, {}, image=False)
    assert hcl_string(parsed["datacenter"]) == "dc1"
    assert "meta" not in parsed["client"][0] and parsed["client"][0]["servers"] == []


def test_the_image_digest_follows_what_boots_not_where_or_when_it_was_built():
    manifest = {"kernel": {"digest": "sha256:k"}, "layers": [{"digest": "sha256:a"}],
                "kernel_args": ["console=ttyS0"], "init": "/sbin/init",
                "recipe": {"path": "/here"}, "built_at": "2026-01-01T00:00:00Z"}
    same = {**manifest, "recipe": {"path": "/elsewhere"}, "built_at": "2026-02-02T00:00:00Z"}
    other = {**manifest, "layers": [{"digest": "sha256:b"}]}
    assert image_digest(same) == image_digest(manifest) != image_digest(other)
