"""Builds are keyed on the node fields their templates read: a change to a field no template
reads rebuilds nothing, a change to one a template reads rebuilds that node's part only, and
templates that use `node` whole (iterate it, filter it, alias it) depend on all of it."""

from __future__ import annotations

import pytest
import yaml

from provisiond.config import load_config
from provisiond.overlays import build_overlays, ensure_overlay
from provisiond.overlays.source import ENVIRONMENT
from provisiond.overlays.templates import fields_read, reads_whole_context
from tests.unit.overlays.test_build import SYSTEM, files_of, write_inventory


def edit_node(state, node: str, **fields) -> None:
    data = yaml.safe_load((state / "inventory.yaml").read_text())
    data["nodes"][node].update(fields)
    (state / "inventory.yaml").write_text(yaml.safe_dump(data))


def site_overlay(state, name: str, template: str) -> None:
    folder = state / "overlays" / name / "etc"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "site.j2").write_text(template)


def rebuilt(config) -> dict:
    return build_overlays(config)["rebuilt"]


OPERATOR_KEY = ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIP/7YM7T0bVdRi2b4TqQn4bGqm9hJQyWWUoME0nBYI7C "
                "operator@desk")
BMC = {"driver": "redfish", "address": "10.9.0.2", "username": "admin"}


@pytest.mark.parametrize("change", [{"comment": "rack 4, replaced PSU"},
                                    {"tags": {"rack": "r4"}},
                                    {"bmc": BMC},
                                    {"kernel_args": ["quiet"]}])
def test_a_field_no_template_reads_rebuilds_nothing(state_dir, change):
    write_inventory(state_dir)
    config = load_config(state_dir)
    build_overlays(config)
    edit_node(state_dir, "n2", **change)
    assert rebuilt(config) == {"shared": 0, "system": 0, "runtime": 0}


def test_a_field_a_template_reads_rebuilds_that_node_only(state_dir):
    write_inventory(state_dir)
    config = load_config(state_dir)
    build_overlays(config)
    edit_node(state_dir, "n2", ssh_authorized_keys=[OPERATOR_KEY])
    assert rebuilt(config) == {"shared": 0, "system": 0, "runtime": 1}
    keys = files_of(ensure_overlay(config, "n2", "runtime"))["root/.ssh/authorized_keys"]
    assert b"operator@desk" in keys
    data = yaml.safe_load((state_dir / "inventory.yaml").read_text())
    data["nodes"]["n3"]["netdevs"]["eth0"]["mtu"] = 9000
    (state_dir / "inventory.yaml").write_text(yaml.safe_dump(data))
    assert rebuilt(config) == {"shared": 0, "system": 1, "runtime": 0}


@pytest.mark.parametrize("template", [
    "{% for key, value in node.items() | sort %}{{ key }}={{ value }}\n{% endfor %}",
    "{{ node | tojson }}\n",
    "{% set n = node %}{{ n.comment }}\n",
    "{% for n in [node] %}{{ n.comment }}{% endfor %}\n",
    "{{ node['comm' ~ 'ent'] }}\n",
])
def test_templates_that_use_the_whole_node_depend_on_all_of_it(state_dir, template):
    write_inventory(state_dir, system=[*SYSTEM, "site"])
    site_overlay(state_dir, "site", template)
    config = load_config(state_dir)
    build_overlays(config)
    edit_node(state_dir, "n2", comment="moved to rack 5")
    assert rebuilt(config) == {"shared": 0, "system": 1, "runtime": 0}
    assert b"moved to rack 5" in files_of(ensure_overlay(config, "n2", "system"))["etc/site"]


def test_a_filter_on_a_sub_record_depends_on_that_field_only(state_dir):
    write_inventory(state_dir, system=[*SYSTEM, "site"])
    site_overlay(state_dir, "site",
                 "{% for k, v in (node.tags or {}) | dictsort %}{{ k }}={{ v }}\n{% endfor %}")
    config = load_config(state_dir)
    build_overlays(config)
    edit_node(state_dir, "n2", comment="not read")
    assert rebuilt(config) == {"shared": 0, "system": 0, "runtime": 0}
    edit_node(state_dir, "n2", tags={"rack": "r5"})
    assert rebuilt(config) == {"shared": 0, "system": 1, "runtime": 0}
    assert files_of(ensure_overlay(config, "n2", "system"))["etc/site"] == b"rack=r5\n"


@pytest.mark.parametrize("template, netdev, expected", [
    ("{{ node.ipaddr }}\n", {"ipaddr": "10.0.0.201"}, b"10.0.0.201\n"),
    ("{{ node.macs | join(' ') }}\n", {"mac": "52:54:00:00:00:99"}, b"52:54:00:00:00:99\n"),
    ("{{ node.primary_netdev }}\n", None, b"eth1\n"),
])
def test_a_derived_field_follows_the_field_it_is_made_from(state_dir, template, netdev,
                                                          expected):
    """`node.ipaddr`, `node.macs`, `node.primary_netdev` are made from the netdevs: a netdev
    change must rebuild them."""
    write_inventory(state_dir, system=["site"], runtime=())
    site_overlay(state_dir, "site", template)
    config = load_config(state_dir)
    build_overlays(config)
    data = yaml.safe_load((state_dir / "inventory.yaml").read_text())
    netdevs = data["nodes"]["n1"]["netdevs"]
    if netdev is None:  # a second device, marked primary
        netdevs["eth1"] = {"mac": "52:54:00:00:01:01", "primary": True}
    else:
        netdevs["eth0"].update(netdev)
    (state_dir / "inventory.yaml").write_text(yaml.safe_dump(data))
    assert rebuilt(config)["system"] == 1
    assert files_of(ensure_overlay(config, "n1", "system"))["etc/site"] == expected


@pytest.mark.parametrize("source, fields", [
    ("{{ node.name }}", {"name"}),
    ("{{ node['tags'].rack }} {{ node.netdevs.eth0.mtu }}", {"tags", "netdevs"}),
    ("{% set a = node.ansible or {} %}{{ a.repo }}", {"ansible"}),
    ("{% for n in nodes %}{{ n.name }}{% endfor %}", set()),
    ("{{ node.items() }}", {"items"}),
    ("{{ node | tojson }}", None),
    ("{% for node in nodes %}{{ node.name }}{% endfor %}{{ node.name }}", None),
    ("{% macro m(node) %}{{ node.x }}{% endmacro %}", None),
    ("{{ node[key] }}", None),
])
def test_fields_read(source, fields):
    read = fields_read(ENVIRONMENT.parse(source), "node")
    assert read == (None if fields is None else frozenset(fields))


@pytest.mark.parametrize("template", [
    "{{ self._TemplateReference__context.node.comment }}\n",
    "{{ self._TemplateReference__context['node']['comment'] }}\n",
    "{% set k = '_TemplateReference__context' %}{{ self[k].node.comment }}\n",
    "{{ (self | attr('_TemplateReference__context')).node.comment }}\n",
])
def test_a_template_reading_the_context_through_self_depends_on_the_node(state_dir, template):
    """`self._TemplateReference__context[name]` (a known Jinja idiom for a variable looked up
    by name) names no variable: such a template was taken for a node-independent one, built
    once with the first node's data and shared by every node."""
    write_inventory(state_dir, system=[*SYSTEM, "site"])
    site_overlay(state_dir, "site", template)
    config = load_config(state_dir)
    edit_node(state_dir, "n1", comment="node one")
    edit_node(state_dir, "n2", comment="node two")
    build_overlays(config)
    assert files_of(ensure_overlay(config, "n2", "system"))["etc/site"] == b"node two\n"
    edit_node(state_dir, "n2", comment="moved to rack 5")
    assert rebuilt(config)["system"] == 1
    assert files_of(ensure_overlay(config, "n2", "system"))["etc/site"] == b"moved to rack 5\n"


@pytest.mark.parametrize("source, whole", [
    ("{{ self._TemplateReference__context }}", True),
    ("{{ self }}", True),
    ("{{ node.netdevs.__class__ }}", True),
    ("{{ m | attr('_func') }}", True),
    ("{% block b %}{{ node.name }}{% endblock %}{{ self.b() }}", False),
    ("{{ node.name | replace('_', '-') }}", False),
])
def test_reads_whole_context(source, whole):
    assert reads_whole_context(ENVIRONMENT.parse(source)) is whole


def test_a_server_setting_change_rebuilds_what_reads_it(state_dir):
    """The hosts (shared) and network (per node) overlays read `server.domain`; a server
    running with the new settings must not hand out the old files."""
    write_inventory(state_dir)
    build_overlays(load_config(state_dir))
    (state_dir / "provisiond.yaml").write_text("server:\n  domain: lab.example\n")
    config = load_config(state_dir)
    counts = rebuilt(config)
    assert counts["shared"] == 1 and counts["system"] == 3  # (ssh reads server too: runtime)
    hosts = files_of(ensure_overlay(config, "n2", "shared"))["etc/hosts"]
    assert b"n2.lab.example n2" in hosts
    network = files_of(ensure_overlay(config, "n2", "system"))
    assert b"Domains=lab.example" in network["etc/systemd/network/10-provisiond-eth0.network"]


def test_a_field_named_like_a_dict_method_counts_as_the_whole_node(monkeypatch):
    """Jinja's `node.values` is the dict's method (attributes come before items), so a
    template naming it may read every field, even if a record field were called `values`."""
    from provisiond.overlays import context
    monkeypatch.setattr(context, "RECORD_FIELDS", context.RECORD_FIELDS | {"values", "tags"})
    context.record_fields.cache_clear()
    try:
        assert context.record_fields(frozenset({"tags"})) == {"tags"}
        assert context.record_fields(frozenset({"tags", "values"})) is None
    finally:
        context.record_fields.cache_clear()
