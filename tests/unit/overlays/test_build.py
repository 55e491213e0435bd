"""Per-node builds: cache by input hash, what a change rebuilds, the shared part stored
once, secrets kept apart, failures leaving the previous build in place."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from provisiond.config import load_config
from provisiond.errors import BuildFailed, InvalidInput, NodeNotFound
from provisiond import archive
from provisiond.overlays import OverlayBuildFailed, build_overlays, ensure_overlay
from provisiond.overlays.hostkeys import host_key_dir
from provisiond.overlays.render import COPIES
from provisiond.inventory.secrets import BMC_PASSWORD, SecretStore
from provisiond.state.layout import Layout

SYSTEM = ["init", "hostname", "hosts", "network", "agent"]


def write_inventory(state: Path, count: int = 3, system=SYSTEM, runtime=("ssh",)) -> None:
    nodes = {f"n{i}": {"netdevs": {"eth0": {"mac": f"52:54:00:00:00:{i:02x}",
                                            "ipaddr": f"10.0.0.{10 + i}",
                                            "netmask": "255.255.255.0"}}}
             for i in range(1, count + 1)}
    profile = {"system_overlays": list(system), "runtime_overlays": list(runtime)}
    data = {"profiles": {"default": profile},
            "nodes": {n: {"profiles": ["default"], **r} for n, r in nodes.items()}}
    (state / "inventory.yaml").write_text(yaml.safe_dump(data))


def set_address(state: Path, node: str, address: str) -> None:
    data = yaml.safe_load((state / "inventory.yaml").read_text())
    data["nodes"][node]["netdevs"]["eth0"]["ipaddr"] = address
    (state / "inventory.yaml").write_text(yaml.safe_dump(data))


def files_of(path: Path) -> dict[str, bytes]:
    return {e.path: e.data for e in archive.unpack(archive.decompress(path.read_bytes()))
            if not e.is_dir}


@pytest.fixture
def cfg(state_dir):
    write_inventory(state_dir)
    return load_config(state_dir)


def test_build_then_reuse(cfg):
    first = build_overlays(cfg, kinds=("system",))
    assert first["rebuilt"] == {"shared": 1, "system": 3}
    assert first["reused"] == {"shared": 0, "system": 0}
    second = build_overlays(cfg, kinds=("system",))
    assert second["rebuilt"] == {"shared": 0, "system": 0}
    assert second["reused"] == {"shared": 1, "system": 3}


def test_address_change_rebuilds_node_and_hosts_users_only(state_dir):
    write_inventory(state_dir, system=["hostname", "network"])
    cfg = load_config(state_dir)
    build_overlays(cfg, kinds=("system",))
    set_address(state_dir, "n2", "10.0.0.99")
    summary = build_overlays(cfg, kinds=("system",))
    assert summary["rebuilt"] == {"shared": 0, "system": 1}
    assert summary["reused"] == {"shared": 1, "system": 2}
    assert b"10.0.0.99/24" in files_of(ensure_overlay(cfg, "n2", "system"))[
        "etc/systemd/network/10-provisiond-eth0.network"]


def test_address_change_rebuilds_the_shared_part_once_and_that_node(cfg, state_dir):
    build_overlays(cfg, kinds=("system",))
    old = ensure_overlay(cfg, "n1", "shared")
    set_address(state_dir, "n2", "10.0.0.99")
    summary = build_overlays(cfg, kinds=("system",))
    assert summary["rebuilt"] == {"shared": 1, "system": 1}
    assert summary["reused"] == {"shared": 0, "system": 2}
    shared = ensure_overlay(cfg, "n1", "shared")
    assert b"10.0.0.99\tn2.cluster n2" in files_of(shared)["etc/hosts"]
    assert list(shared.parent.iterdir()) == [shared] and not old.exists()


def test_shared_part_is_stored_once_and_the_node_part_holds_the_rest(cfg):
    build_overlays(cfg, kinds=("system",))
    shared = ensure_overlay(cfg, "n1", "shared")
    assert shared.parent == Layout.of(cfg).overlay_builds / "_shared"
    assert {ensure_overlay(cfg, n, "shared") for n in ("n2", "n3")} == {shared}
    assert shared.stat().st_mode & 0o777 == 0o644
    common, own = files_of(shared), files_of(ensure_overlay(cfg, "n1", "system"))
    assert {"init", "etc/hosts", "usr/local/sbin/provisiond-agent"} <= common.keys()
    assert {"etc/hostname", "usr/local/sbin/provisiond-network"} <= own.keys()
    assert not common.keys() & own.keys()


def test_system_parts_hold_their_files_again_for_init_and_runtime_parts_do_not(cfg):
    """/init copies the system overlays over the image from COPIES (after an unpacked
    boot's whiteouts); a file's data is in the build once, its name in place a hard link."""
    build_overlays(cfg)
    for kind, name in (("shared", "init"), ("system", "usr/local/sbin/provisiond-network")):
        path = ensure_overlay(cfg, "n1", kind)
        files = files_of(path)
        placed = {p: d for p, d in files.items() if not p.startswith(f"{COPIES}/")}
        assert {f"{COPIES}/{p}": d for p, d in placed.items()} == \
            {p: d for p, d in files.items() if p.startswith(f"{COPIES}/")}
        assert archive.decompress(path.read_bytes()).count(files[name]) == 1, name
    runtime = files_of(ensure_overlay(cfg, "n1", "runtime"))
    assert runtime and not any(p.startswith(".provisiond/") for p in runtime)


def test_node_part_without_node_specific_overlays_is_an_empty_archive(state_dir):
    write_inventory(state_dir, system=["init", "hosts"])
    cfg = load_config(state_dir)
    data = ensure_overlay(cfg, "n1", "system").read_bytes()
    assert data[:4] == b"\x28\xb5\x2f\xfd"
    assert archive.decompress(data) == archive.pack([]) and archive.unpack(archive.decompress(data)) == []
    assert "etc/hosts" in files_of(ensure_overlay(cfg, "n1", "shared"))


def test_nodes_with_different_lists_get_different_shared_parts(state_dir):
    write_inventory(state_dir)
    data = yaml.safe_load((state_dir / "inventory.yaml").read_text())
    data["nodes"]["n3"].update(profiles=[], system_overlays=["init", "hostname"])
    (state_dir / "inventory.yaml").write_text(yaml.safe_dump(data))
    cfg = load_config(state_dir)
    summary = build_overlays(cfg, kinds=("system",))
    assert summary["rebuilt"] == {"shared": 2, "system": 3}
    assert "etc/hosts" not in files_of(ensure_overlay(cfg, "n3", "shared"))
    assert len(list((Layout.of(cfg).overlay_builds / "_shared").iterdir())) == 2


def test_ensure_overlay_builds_when_stale_and_is_stable(cfg, state_dir):
    path = ensure_overlay(cfg, "n1", "system")
    assert path.name == "system.cpio.zst"
    before = path.stat().st_mtime_ns
    assert ensure_overlay(cfg, "n1", "system") == path
    assert path.stat().st_mtime_ns == before
    set_address(state_dir, "n1", "10.0.0.77")
    ensure_overlay(cfg, "n1", "system")
    assert b"10.0.0.77/24" in files_of(path)["etc/systemd/network/10-provisiond-eth0.network"]
    assert b"10.0.0.77" in files_of(ensure_overlay(cfg, "n1", "shared"))["etc/hosts"]


def test_a_static_link_is_online_without_waiting_for_an_ipv6_router(state_dir):
    """networkd 252 keeps a link 'configuring' until an IPv6 Router Advertisement or its
    solicitations' timeout (~10 s on a network without IPv6 routers), so wait-online and the
    agent waited for it: a static link is configured at once; a DHCP link keeps waiting for
    its lease as before."""
    write_inventory(state_dir, count=2)
    data = yaml.safe_load((state_dir / "inventory.yaml").read_text())
    del data["nodes"]["n2"]["netdevs"]["eth0"]["ipaddr"]
    (state_dir / "inventory.yaml").write_text(yaml.safe_dump(data))
    cfg = load_config(state_dir)
    network = "etc/systemd/network/10-provisiond-eth0.network"
    static, dhcp = (files_of(ensure_overlay(cfg, n, "system"))[network].decode().splitlines()
                    for n in ("n1", "n2"))
    assert "Address=10.0.0.11/24" in static and "ConfigureWithoutCarrier=yes" in static
    assert "DHCP=ipv4" in dhcp and not any("WithoutCarrier" in line for line in dhcp)


def test_builds_are_deterministic(cfg):
    data = [ensure_overlay(cfg, "n1", kind).read_bytes() for kind in ("shared", "system")]
    shutil.rmtree(Layout.of(cfg).overlay_builds)
    assert [ensure_overlay(cfg, "n1", k).read_bytes() for k in ("shared", "system")] == data


def test_unknown_node_and_kind(cfg):
    with pytest.raises(NodeNotFound):
        ensure_overlay(cfg, "nope", "system")
    with pytest.raises(InvalidInput):
        ensure_overlay(cfg, "n1", "bogus")


def test_runtime_overlay_is_gzip_private_and_holds_only_its_own_keys(cfg):
    build_overlays(cfg)
    for node in ("n1", "n2", "n3"):
        path = ensure_overlay(cfg, node, "runtime")
        assert path.name == "runtime.cpio.gz" and path.read_bytes()[:2] == b"\x1f\x8b"
        assert path.stat().st_mode & 0o777 == 0o600
        blob = archive.decompress(path.read_bytes())
        for other in ("n1", "n2", "n3"):
            key = (host_key_dir(cfg, other) / "ssh_host_ed25519_key").read_bytes()
            assert (key in blob) == (other == node), (node, other)


def test_no_secret_in_any_system_overlay(cfg):
    build_overlays(cfg)
    secrets = [p.read_bytes() for p in (cfg.state_dir / "secrets").rglob("*_key")]
    assert len(secrets) == 6
    paths = [*Layout.of(cfg).overlay_builds.glob("*/system.cpio.*"),
             *Layout.of(cfg).overlay_builds.glob("_shared/*.cpio.*")]
    assert len(paths) == 4
    for path in paths:
        blob = archive.decompress(path.read_bytes())
        for secret in secrets:
            assert secret not in blob
            assert secret.splitlines()[1] not in blob  # not even one line of a key


def test_secret_overlay_refused_as_system_overlay(state_dir):
    write_inventory(state_dir, system=["hostname", "ssh"])
    cfg = load_config(state_dir)
    with pytest.raises(OverlayBuildFailed, match="overlay ssh: file etc/ssh/ssh_host_keys.j2 "
                                                 "reads secrets, which reach runtime"):
        build_overlays(cfg, kinds=("system",))


def _munge_overlay(state: Path) -> None:
    folder = state / "overlays" / "munge" / "etc" / "munge"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "munge.key.j2").write_text('{{ secrets["munge.key"] }}\n')


def test_a_system_template_reading_a_secret_fails_the_build_clearly(state_dir):
    """No `secret: true` in its overlay.yaml: the template scan alone finds it."""
    _munge_overlay(state_dir)
    write_inventory(state_dir, system=["hostname", "munge"])
    cfg = load_config(state_dir)
    SecretStore(cfg).set("profiles", ["default"], "munge.key", "m" * 32)
    with pytest.raises(OverlayBuildFailed) as caught:
        build_overlays(cfg, kinds=("system",))
    assert str(caught.value).startswith(
        "overlay munge: file etc/munge/munge.key.j2 reads secrets, which reach runtime "
        "overlays only (served to the node alone): node n")
    assert "m" * 32 not in str(caught.value)


def test_stored_secrets_reach_runtime_templates_node_over_profile(state_dir):
    _munge_overlay(state_dir)
    write_inventory(state_dir, runtime=["ssh", "munge"])
    cfg = load_config(state_dir)
    store = SecretStore(cfg)
    store.set("profiles", ["default"], "munge.key", "cluster-wide-munge-key")
    store.set("nodes", ["n2"], "munge.key", "n2-own-munge-key")
    store.set("nodes", ["n3"], BMC_PASSWORD, "bmc")  # the server's own: not in templates
    assert build_overlays(cfg)["rebuilt"]["runtime"] == 3
    keys = {n: files_of(ensure_overlay(cfg, n, "runtime"))["etc/munge/munge.key"]
            for n in ("n1", "n2", "n3")}
    assert keys == {"n1": b"cluster-wide-munge-key\n", "n2": b"n2-own-munge-key\n",
                    "n3": b"cluster-wide-munge-key\n"}
    store.set("nodes", ["n1"], "munge.key", "rotated")  # one node's change rebuilds one
    assert build_overlays(cfg)["rebuilt"]["runtime"] == 1
    assert files_of(ensure_overlay(cfg, "n1", "runtime"))["etc/munge/munge.key"] == \
        b"rotated\n"
    for path in Layout.of(cfg).overlay_builds.glob("*/system.cpio.*"):
        assert b"munge-key" not in archive.decompress(path.read_bytes())


def test_a_template_reading_the_bmc_password_fails(state_dir):
    folder = state_dir / "overlays" / "bmc" / "etc"
    folder.mkdir(parents=True)
    (folder / "bmc.j2").write_text('{{ secrets["bmc_password"] }}\n')
    write_inventory(state_dir, runtime=["bmc"])
    cfg = load_config(state_dir)
    SecretStore(cfg).set("nodes", ["n1"], BMC_PASSWORD, "hunter2hunter2")
    with pytest.raises(BuildFailed) as caught:
        ensure_overlay(cfg, "n1", "runtime")
    assert "bmc_password" in str(caught.value) and "hunter2" not in str(caught.value)


@pytest.mark.parametrize("value", ["hunter2", "s3cr\\et-with-backslash", "it's \"quoted\" text",
                                   "-----BEGIN KEY-----\nshort\nb3BlbnNzaC1rZXk\\tdjEAAAA\n"])
def test_a_failing_filter_never_quotes_a_secret_in_its_error(state_dir, value):
    """A filter's error may quote its input (repr: quotes and backslashes escaped, line
    ends as \\n): no line of the secret, short or escaped, reaches the message, which goes
    to the CLI, the API and the server's log."""
    folder = state_dir / "overlays" / "pin" / "etc"
    folder.mkdir(parents=True)
    (folder / "pin.j2").write_text('{{ secrets["pin"] | prefixlen }}\n')
    write_inventory(state_dir, runtime=["pin"])
    cfg = load_config(state_dir)
    SecretStore(cfg).set("nodes", ["n1"], "pin", value)
    with pytest.raises(BuildFailed) as caught:
        ensure_overlay(cfg, "n1", "runtime")
    message = str(caught.value)
    assert "etc/pin.j2, line 1, node n1" in message and "<secret>" in message
    for line in value.splitlines():
        for shown in (line, repr(line)[1:-1], line.replace("\\", "\\\\")):
            assert shown not in message


def _site_overlay(state: Path, text: str) -> None:
    folder = state / "overlays" / "broken" / "etc"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "motd.j2").write_text(text)


def test_template_error_names_overlay_file_line_node_and_keeps_previous(state_dir):
    write_inventory(state_dir, system=["hostname", "broken"])
    _site_overlay(state_dir, "Welcome to {{ node.name }}\n")
    cfg = load_config(state_dir)
    build_overlays(cfg, kinds=("system",))
    previous = ensure_overlay(cfg, "n1", "system").read_bytes()
    _site_overlay(state_dir, "line one\nrack {{ node.rack }}\n")
    with pytest.raises(OverlayBuildFailed) as caught:
        build_overlays(cfg, kinds=("system",))
    message = str(caught.value)
    assert message.startswith("overlay broken, file etc/motd.j2, line 2, node n")
    assert "rack" in message and "(and 2 more nodes failed)" in message
    assert caught.value.summary["failed"].keys() == {"n1", "n2", "n3"}
    path = Layout.of(cfg).overlay_builds / "n1" / "system.cpio.zst"
    assert path.read_bytes() == previous


def test_template_syntax_error(state_dir):
    write_inventory(state_dir, system=["broken"])
    _site_overlay(state_dir, "ok\n{% if node.name %}\nnever closed\n")
    cfg = load_config(state_dir)
    with pytest.raises(BuildFailed, match=r"overlay broken, file etc/motd.j2, line \d"):
        ensure_overlay(cfg, "n1", "system")


def test_site_overlay_shadows_shipped_one(cfg, state_dir):
    folder = state_dir / "overlays" / "hostname" / "etc"
    folder.mkdir(parents=True)
    (folder / "hostname.j2").write_text("site-{{ node.name }}\n")
    assert files_of(ensure_overlay(cfg, "n1", "system"))["etc/hostname"] == b"site-n1\n"


def test_key_file_when_the_file_system_has_no_user_xattrs(cfg, monkeypatch):
    def no_xattr(*args):
        raise OSError(95, "Operation not supported")

    monkeypatch.setattr("os.setxattr", no_xattr)
    monkeypatch.setattr("os.getxattr", no_xattr)
    assert build_overlays(cfg, kinds=("system",))["rebuilt"] == {"shared": 1, "system": 3}
    assert (Layout.of(cfg).overlay_builds / "n1" / "system.key").is_file()
    assert build_overlays(cfg, kinds=("system",))["reused"] == {"shared": 1, "system": 3}


def test_init_takes_the_image_manifest_init(cfg, monkeypatch):
    monkeypatch.setattr("provisiond.overlays.context.ImageCache._load",
                        lambda self, name: {"name": name, "init": "/lib/systemd/systemd"})
    data = yaml.safe_load((cfg.state_dir / "inventory.yaml").read_text())
    data["profiles"]["default"]["image"] = "debian12"
    (cfg.state_dir / "inventory.yaml").write_text(yaml.safe_dump(data))
    init = files_of(ensure_overlay(cfg, "n1", "shared"))["init"]
    assert b"DEFAULT_INIT='/lib/systemd/systemd'" in init


def test_init_quotes_the_manifest_init_for_the_shell(cfg, monkeypatch):
    weird = "/sbin/it's; touch /tmp/provisiond-init-quoting"
    monkeypatch.setattr("provisiond.overlays.context.ImageCache._load",
                        lambda self, name: {"name": name, "init": weird})
    data = yaml.safe_load((cfg.state_dir / "inventory.yaml").read_text())
    data["profiles"]["default"]["image"] = "odd"
    (cfg.state_dir / "inventory.yaml").write_text(yaml.safe_dump(data))
    init = files_of(ensure_overlay(cfg, "n1", "shared"))["init"].decode()
    line = next(x for x in init.splitlines() if x.startswith("DEFAULT_INIT="))
    shown = subprocess.run(["sh", "-c", f'{line}\nprintf %s "$DEFAULT_INIT"'],
                           capture_output=True, text=True, timeout=10)
    assert shown.returncode == 0 and shown.stdout == weird


def test_rebuilding_an_image_unchanged_does_not_rebuild_overlays(cfg, monkeypatch):
    """Overlays read the manifest's content; when and how fast it was built is not input."""
    manifest = {"name": "debian12", "init": "/lib/systemd/systemd", "layers": [],
                "built_at": "2026-11-22T00:00:00Z", "build_seconds": 3.0,
                "layer_build_seconds": [3.0]}
    monkeypatch.setattr("provisiond.overlays.context.ImageCache._load",
                        lambda self, name: dict(manifest))
    data = yaml.safe_load((cfg.state_dir / "inventory.yaml").read_text())
    data["profiles"]["default"]["image"] = "debian12"
    (cfg.state_dir / "inventory.yaml").write_text(yaml.safe_dump(data))
    assert build_overlays(cfg, kinds=("system",))["rebuilt"]["shared"] == 1
    manifest.update(built_at="2026-11-22T01:00:00Z", build_seconds=0.2,
                    layer_build_seconds=[0.0])
    assert build_overlays(cfg, kinds=("system",))["reused"]["shared"] == 1
    manifest["init"] = "/sbin/init"
    assert build_overlays(cfg, kinds=("system",))["rebuilt"]["shared"] == 1


def test_nomad_client_quotes_inventory_strings_for_hcl(state_dir):
    write_inventory(state_dir, system=["nomad-client"], runtime=())
    data = yaml.safe_load((state_dir / "inventory.yaml").read_text())
    odd = 'say "hi" \\ ${node.unique.id}'
    data["nodes"]["n1"]["nomad"] = {"datacenter": odd, "meta": {'k"ey': odd}}
    (state_dir / "inventory.yaml").write_text(yaml.safe_dump(data))
    hcl = files_of(ensure_overlay(load_config(state_dir), "n1", "system"))
    text = hcl["etc/nomad.d/client.hcl"].decode()
    escaped = '"say \\"hi\\" \\\\ $${node.unique.id}"'
    assert f"datacenter = {escaped}" in text
    assert f'"k\\"ey" = {escaped}' in text


def test_a_build_that_cannot_be_written_fails_that_node_only(cfg, monkeypatch):
    from provisiond.overlays import build
    real_replace = build._replace

    def full_disk_for_n2(path, data, mode, key):
        if path.parent.name == "n2" and path.name.startswith("runtime"):
            raise OSError(28, "No space left on device", str(path))
        real_replace(path, data, mode, key)

    monkeypatch.setattr(build, "_replace", full_disk_for_n2)
    with pytest.raises(OverlayBuildFailed) as caught:
        build_overlays(cfg)
    assert str(caught.value) == "overlay build of n2 (runtime): No space left on device"
    assert caught.value.summary["failed"].keys() == {"n2"}
    assert caught.value.summary["rebuilt"] == {"shared": 1, "system": 3, "runtime": 2}


def test_a_shared_overlay_that_fails_fails_its_nodes_and_builds_no_node_part(state_dir):
    """A template of a node-independent overlay failing fails every node listing it, as a
    node-specific one does: no system part written for them (it was, and such a node's
    boot lacked the overlay), runtime parts and the other nodes built, the previous system
    part left in place."""
    write_inventory(state_dir, system=["hostname"])
    data = yaml.safe_load((state_dir / "inventory.yaml").read_text())
    for node in ("n1", "n2"):
        data["nodes"][node]["system_overlays"] = ["broken"]
    (state_dir / "inventory.yaml").write_text(yaml.safe_dump(data))
    _site_overlay(state_dir, "Welcome\n")
    cfg = load_config(state_dir)
    build_overlays(cfg)
    builds = Layout.of(cfg).overlay_builds
    previous = (builds / "n1" / "system.cpio.zst").read_bytes()
    (builds / "n2" / "system.cpio.zst").unlink()
    _site_overlay(state_dir, "line one\n{{ 1 // 0 }}\n")
    with pytest.raises(OverlayBuildFailed) as caught:
        build_overlays(cfg)
    assert str(caught.value).startswith("overlay broken, file etc/motd.j2, line 2, ")
    assert "ZeroDivisionError" in str(caught.value) and "\n" not in str(caught.value)
    assert caught.value.summary["failed"].keys() == {"n1", "n2"}
    assert not (builds / "n2" / "system.cpio.zst").exists()
    assert (builds / "n1" / "system.cpio.zst").read_bytes() == previous
    assert (builds / "n2" / "runtime.cpio.gz").is_file()
    assert files_of(builds / "n3" / "system.cpio.zst")["etc/hostname"] == b"n3\n"
