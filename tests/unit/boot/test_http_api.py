"""The HTTP boot endpoints through Flask's test client (real app, real files)."""

import hashlib
import json
import os
from pathlib import Path

import pytest

from bootdata import (add_image, add_nodes, add_overlay, credential, ip_of, mac_of,
                      node_env, token_in)
from provisiond.api import create_app
from provisiond.states import NodePhase
from provisiond.status import read_status


@pytest.fixture
def app(config):
    add_nodes(config, 3, kernel_args=["quiet"])
    add_image(config, "tiny", layers=2)
    return create_app(config)


@pytest.fixture
def client(app):
    return app.test_client()


def test_node_script_names_kernel_layers_and_overlay(client, config):
    manifest = add_image(config, "tiny", layers=2)
    text = client.get(f"/boot/ipxe/{mac_of(2)}").get_data(as_text=True)
    base = "http://127.0.0.1:9873"
    kernel = manifest["kernel"]["digest"].removeprefix("sha256:")
    assert f"kernel {base}/blobs/sha256/{kernel} initrd=l0 initrd=l1 initrd=l2 initrd=l3 " \
           f"console=ttyS0 " \
           f"quiet provisiond.url={base} provisiond.node=n2" in text
    for i, layer in enumerate(manifest["layers"]):
        assert f"initrd --name l{i} {base}/blobs/sha256/{layer['digest'][7:]}" in text
    shared = text.index(f"initrd --name l2 {base}/overlays/n2/shared ||")
    assert text.index(f"initrd --name l3 {base}/overlays/n2/system ||") > shared
    client.application.extensions["provisiond"].phases.flush()
    assert read_status(config, "n2")["phase"] == "ipxe"


def test_a_mounted_boot_asked_of_an_image_that_cannot_says_so_on_the_console(client, config):
    """The image's kernel lacks the modules: the node boots unpacked, and nothing on the
    console said why its provisiond.boot=mounted was not followed."""
    manifest = add_image(config, "tiny", layers=2)
    manifest["kernel_args"] = [*manifest["kernel_args"], "provisiond.boot=mounted"]
    manifest["mounted"] = {"boot": "unpacked", "format": "squashfs", "layers": [],
                           "unavailable": "the kernel has no module squashfs, overlay"}
    (config.images_dir / "tiny" / "manifest.json").write_text(json.dumps(manifest))
    client.application.extensions["provisiond"].manifests.interval = 0
    text = client.get(f"/boot/ipxe/{mac_of(2)}").get_data(as_text=True)
    assert "\necho provisiond: image tiny boots unpacked, not mounted as provisiond.boot=" \
           "mounted asks: the kernel has no module squashfs, overlay\n" in text
    assert "rdinit=" not in text


def test_unknown_mac_and_missing_image_get_retry_scripts(client, config):
    text = client.get("/boot/ipxe/02-00-00-00-00-99").get_data(as_text=True)
    assert "unknown MAC 02:00:00:00:00:99" in text and "sleep" in text and "chain" in text
    (config.images_dir / "tiny" / "manifest.json").unlink()
    client.application.extensions["provisiond"].manifests.interval = 0
    text = client.get(f"/boot/ipxe/{mac_of(1)}").get_data(as_text=True)
    assert "no image named 'tiny'" in text and "kernel" not in text.split("echo")[0]


def test_script_follows_image_rebuilds_and_inventory_edits(client, config):
    from provisiond.atomic import write_atomic
    from provisiond.inventory import InventoryStore

    services = client.application.extensions["provisiond"]
    services.manifests.interval = services.watcher.interval = 0
    first = client.get(f"/boot/ipxe/{mac_of(1)}").get_data(as_text=True)
    second = client.get(f"/boot/ipxe/{mac_of(1)}").get_data(as_text=True)
    assert token_in(first) != token_in(second)  # a token per script served
    assert second.replace(token_in(second), token_in(first)) == first
    path = config.images_dir / "tiny" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["kernel"]["digest"] = "sha256:" + "ab" * 32
    write_atomic(path, json.dumps(manifest))  # as the image builder saves a new build
    assert "/blobs/sha256/" + "ab" * 32 in client.get(f"/boot/ipxe/{mac_of(1)}").get_data(
        as_text=True)
    with InventoryStore(config).edit() as inv:
        inv.nodes["n1"].kernel_args = ["quiet", "debug"]
    assert " quiet debug " in client.get(f"/boot/ipxe/{mac_of(1)}").get_data(as_text=True)


def test_chain_script(client):
    text = client.get("/boot/ipxe").get_data(as_text=True)
    assert text == "#!ipxe\nchain --autofree http://127.0.0.1:9873/boot/ipxe/${mac}\n"


def test_blob_headers_range_and_etag(client, config):
    data = bytes(range(256)) * 40
    digest = hashlib.sha256(data).hexdigest()
    (config.blob_dir / digest).write_bytes(data)
    response = client.get(f"/blobs/sha256/{digest}")
    assert response.data == data
    assert response.headers["ETag"] == f'"sha256:{digest}"'
    cache = response.headers["Cache-Control"]
    assert "public" in cache and "max-age=31536000" in cache and "immutable" in cache
    part = client.get(f"/blobs/sha256/{digest}", headers={"Range": "bytes=100-"})
    assert part.status_code == 206 and part.data == data[100:]
    bad = client.get(f"/blobs/sha256/{digest}", headers={"Range": "bytes=999999-"})
    assert bad.status_code == 416
    cached = client.get(f"/blobs/sha256/{digest}",
                        headers={"If-None-Match": f'"sha256:{digest}"'})
    assert cached.status_code == 304


def test_kernel_fetch_from_node_address_records_phase(client, config):
    manifest = add_image(config, "tiny")
    url = f"/blobs/sha256/{manifest['kernel']['digest'][7:]}"
    phases = client.application.extensions["provisiond"].phases
    client.get(url, environ_base={"REMOTE_ADDR": "10.200.0.1"})
    phases.flush()
    assert read_status(config, "n1") is None
    client.get(url, environ_base={"REMOTE_ADDR": ip_of(1)})
    phases.flush()
    assert read_status(config, "n1")["phase"] == "kernel"


def test_bad_and_missing_blobs_are_json_errors(client):
    response = client.get("/blobs/sha256/../../etc/passwd")
    assert response.status_code == 404 and response.json["error"]["code"] == "not_found"
    response = client.get("/blobs/sha256/nothex")
    assert response.status_code == 400 and response.json["error"]["code"] == "invalid_input"
    response = client.get("/blobs/sha256/" + "0" * 64)
    assert response.status_code == 404 and "no blob" in response.json["error"]["message"]
    response = client.get("/blobs/sha256/" + "0" * 64 + "%0A")  # `$` matches before a \n
    assert response.status_code == 400 and response.json["error"]["code"] == "invalid_input"


def test_overlays_shared_system_and_runtime_rules(client, config, monkeypatch):
    """OverlayFiles.path is replaced by one returning files put where it would place them."""
    import provisiond.boot.artifacts as artifacts

    system = add_overlay(config, "n1", "system", b"system-cpio")
    runtime = add_overlay(config, "n1", "runtime", b"runtime-cpio")
    shared = add_overlay(config, "_shared", "0" * 64, b"shared-cpio")
    paths = {"shared": shared, "system": system, "runtime": runtime}
    monkeypatch.setattr(artifacts.OverlayFiles, "path", lambda self, n, k: paths[k])
    assert client.get("/overlays/n1/system").data == b"system-cpio"
    common = client.get("/overlays/n1/shared", environ_base={"REMOTE_ADDR": ip_of(2)})
    assert common.data == b"shared-cpio" and "private" not in common.headers["Cache-Control"]
    assert client.get("/overlays/n1/shared", headers={
        "If-None-Match": common.headers["ETag"]}).status_code == 304
    auth = credential(client, 1)
    denied = client.get("/overlays/n1/runtime", environ_base=node_env(1))
    assert denied.status_code == 401 and denied.json["error"]["code"] == "unauthenticated"
    assert denied.headers["WWW-Authenticate"].startswith("Bearer")
    elsewhere = client.get("/overlays/n1/runtime", environ_base=node_env(2), headers=auth)
    assert elsewhere.status_code == 403 and elsewhere.json["error"]["code"] == "forbidden"
    mine = client.get("/overlays/n1/runtime", environ_base=node_env(1), headers=auth)
    assert mine.data == b"runtime-cpio"
    again = client.get("/overlays/n1/runtime", environ_base=node_env(1),
                       headers={"If-None-Match": mine.headers["ETag"], **auth})
    assert again.status_code == 304
    assert client.get("/overlays/nobody/system").status_code == 404
    assert client.get("/overlays/n1/other").status_code == 404


def test_status_reports(client, config):
    auth = credential(client, 1)
    post = lambda **kw: client.post("/api/v1/status/n1", environ_base=node_env(1),  # noqa
                                    headers=auth, **kw)
    assert post(data={"phase": "booted"}).status_code == 200
    response = post(json={"phase": "failed", "detail": "disk"})
    assert response.json["phase"] == "failed" and response.json["detail"] == "disk"
    assert post(data={"phase": "bogus"}).status_code == 400
    assert post(data="junk", content_type="application/json").status_code == 400
    assert client.post("/api/v1/status/zz", data={"phase": "ready"}).status_code == 404
    from provisiond.auth import Role, TokenStore

    token, _ = TokenStore(config).create("reader", Role.READER)
    assert client.get("/api/v1/status").status_code == 401  # open to nodes to write only
    read = client.get("/api/v1/status/n1", headers={"Authorization": f"Bearer {token}"})
    assert read.json["phase"] == "failed" and read.json["detail"] == "disk"


@pytest.mark.parametrize("method,path", [
    ("GET", "/page/__init__.py"), ("GET", "/nothing/here"), ("DELETE", "/boot/ipxe"),
    ("GET", "/boot/ipxe/not-a-mac"), ("GET", "/boot/files/../../etc/passwd"),
    ("GET", "/boot/files/%2e%2e%2fetc%2fpasswd"), ("PUT", "/api/v1/status/n1"),
])
def test_junk_requests_get_json_4xx(client, method, path):
    response = client.open(path, method=method)
    assert 400 <= response.status_code < 500
    assert set(response.json["error"]) == {"code", "message", "field"}


def test_overlays_built_by_the_real_ensure_overlay(client, config):
    from provisiond import overlays
    from provisiond.inventory import InventoryStore

    with InventoryStore(config).edit() as inv:
        inv.nodes["n1"].system_overlays = ["hostname", "init"]
        inv.nodes["n1"].runtime_overlays = ["hosts"]
    client.application.extensions["provisiond"].watcher.interval = 0
    system = client.get("/overlays/n1/system")
    assert system.status_code == 200
    assert system.data == overlays.ensure_overlay(config, "n1", "system").read_bytes()
    shared = client.get("/overlays/n1/shared")
    assert shared.status_code == 200 and shared.headers["ETag"]
    assert shared.data == overlays.ensure_overlay(config, "n1", "shared").read_bytes()
    assert shared.data != system.data
    auth = credential(client, 1)
    runtime = client.get("/overlays/n1/runtime", environ_base=node_env(1), headers=auth)
    assert runtime.status_code == 200 and runtime.data
    again = client.get("/overlays/n1/runtime", environ_base=node_env(1),
                       headers={"If-None-Match": runtime.headers["ETag"], **auth})
    assert again.status_code == 304


@pytest.mark.parametrize("url", ["/boot/ipxe", f"/boot/ipxe/{mac_of(1)}",
                                 "/boot/ipxe/52:54:00:ff:ff:ff"])
def test_ipxe_scripts_are_utf8_text_with_one_charset(client, url):
    response = client.get(url)
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "text/plain; charset=utf-8"


def test_boot_files_serve_ipxe_binaries(client):
    for name in ("ipxe.efi", "undionly.kpxe"):
        response = client.get(f"/boot/files/{name}")
        assert response.status_code == 200
        assert response.data == open(f"/usr/lib/ipxe/{name}", "rb").read()


def test_boot_files_follow_symlinks_out_of_the_root_only_to_their_owners_files(
        config, tmp_path):
    """Debian's ipxe.efi -> /boot/ipxe.efi is served; a link to another user's file (someone
    able to write into tftp.root pointing at root's secrets) is not, nor `..` or a dir."""
    root, boot, secret = tmp_path / "tftp", tmp_path / "boot.efi", tmp_path / "secret"
    root.mkdir()
    boot.write_bytes(b"boot")
    secret.write_bytes(b"secret")
    if os.geteuid() == 0:
        os.chown(secret, 65534, 65534)  # not the link's owner
    else:
        secret = Path("/etc/passwd")  # root's
    (root / "ipxe.efi").write_bytes(b"ipxe")
    (root / "inside.efi").symlink_to("ipxe.efi")
    (root / "debian.efi").symlink_to(boot)
    (root / "evil.efi").symlink_to(secret)
    (root / "dir.efi").mkdir()
    config.tftp.root = str(root)
    client = create_app(config).test_client()
    for name, data in (("ipxe.efi", b"ipxe"), ("inside.efi", b"ipxe"), ("debian.efi", b"boot")):
        assert client.get(f"/boot/files/{name}").data == data
    for name in ("evil.efi", "dir.efi", "..", "%2e%2e", "a%00b", "nothere"):
        response = client.get(f"/boot/files/{name}")
        assert response.status_code == 404 and response.json["error"]["code"] == "not_found", name


def test_a_large_status_body_is_refused_unread(client, config):
    """A status report is a few bytes: a megabyte body gets 413, not read into memory."""
    body = json.dumps({"phase": "booted", "detail": "x" * (1 << 20)})
    response = client.post("/api/v1/status/n1", data=body, content_type="application/json",
                           environ_base=node_env(1), headers=credential(client, 1))
    assert response.status_code == 413 and set(response.json["error"]) == {"code", "message",
                                                                           "field"}
    assert "booted" not in (read_status(config, "n1") or {}).get("phases", {})


def test_overlay_etags_follow_rebuilds_one_entry_per_file(app, tmp_path):
    """An overlay's ETag changes with its content; the worker keeps one entry per file, not
    one per build (a server rebuilding overlays for days must not grow without end)."""
    import os

    svc = app.extensions["provisiond"]
    path = tmp_path / "runtime.cpio.gz"
    tags = set()
    for build in range(5):
        path.write_bytes(b"build %d" % build)
        os.utime(path, ns=(build * 10**9, build * 10**9))
        tags.add(svc.file_etag(path))
    assert tags == {hashlib.sha256(b"build %d" % b).hexdigest() for b in range(5)}
    assert len(svc._etags) == 1


def test_a_dual_stack_bind_still_knows_the_node(client, config, monkeypatch):
    """With http.bind "::" an IPv4 node arrives as ::ffff:a.b.c.d: it is still that node
    (runtime overlay allowed, kernel phase recorded)."""
    import provisiond.boot.artifacts as artifacts

    runtime = add_overlay(config, "n1", "runtime", b"runtime-cpio")
    monkeypatch.setattr(artifacts.OverlayFiles, "path", lambda self, n, k: runtime)
    mapped = node_env(1, address="::ffff:" + ip_of(1))
    script = client.get(f"/boot/ipxe/{mac_of(1)}").get_data(as_text=True)
    exchanged = client.post("/api/v1/credentials/n1", data={"token": token_in(script)},
                            environ_base=mapped)
    assert exchanged.status_code == 200, exchanged.json
    auth = {"Authorization": f"Bearer {exchanged.get_data(as_text=True).strip()}"}
    assert client.get("/overlays/n1/runtime", environ_base=mapped,
                      headers=auth).data == b"runtime-cpio"
    other = node_env(2, address="::ffff:" + ip_of(2))
    assert client.get("/overlays/n1/runtime", environ_base=other,
                      headers=auth).status_code == 403
    manifest = add_image(config, "tiny")
    client.get(f"/blobs/sha256/{manifest['kernel']['digest'][7:]}", environ_base=mapped)
    client.application.extensions["provisiond"].phases.flush()
    assert read_status(config, "n1")["phase"] == "kernel"


def test_a_damaged_manifest_is_named_in_the_nodes_retry_script(client, config):
    """A manifest without its kernel (a hand edit) was a KeyError: a 500 for every boot of
    the image, naming nothing."""
    path = config.images_dir / "tiny" / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["kernel"]
    path.write_text(json.dumps(manifest))
    client.application.extensions["provisiond"].manifests.interval = 0
    response = client.get(f"/boot/ipxe/{mac_of(1)}")
    text = response.get_data(as_text=True)
    # named by its store key: with etcd there is no file
    assert "images/tiny/manifest.json: kernel: Field required" in text, (response.status_code,
                                                                      text)


def test_an_overlay_that_fails_to_build_is_an_error_logged_and_in_the_status(client, config,
                                                                               caplog):
    """A shared overlay's template failing: its node's shared part is an error, and so is
    its system part, even one built before (served alone it would boot the node without
    that overlay); the log and, when the node itself asks, its status say why."""
    from provisiond.inventory import InventoryStore

    folder = config.state_dir / "overlays" / "site" / "etc"
    folder.mkdir(parents=True)
    (folder / "motd.j2").write_text("Welcome\n")
    with InventoryStore(config).edit() as inv:
        inv.nodes["n1"].system_overlays = ["hostname", "site"]
    services = client.application.extensions["provisiond"]
    services.watcher.interval = services.overlays.interval = 0
    assert client.get("/overlays/n1/system").status_code == 200
    (folder / "motd.j2").write_text("{{ 1 // 0 }}\n")
    for kind in ("shared", "system"):
        response = client.get(f"/overlays/n1/{kind}", environ_base=node_env(1))
        assert response.status_code == 500 and response.json["error"]["code"] == "build_failed"
        assert response.json["error"]["message"].startswith("overlay site, file etc/motd.j2")
    assert "n1 shared-overlay failed: overlay site, file etc/motd.j2" in caplog.text
    services.phases.flush()
    status = read_status(config, "n1")
    assert status["phase"] == "failed"
    assert status["detail"].startswith("shared overlay: overlay site, file etc/motd.j2, line 1")
    assert client.get("/overlays/n2/system").status_code == 200


def test_only_the_booting_node_itself_is_marked_failed_by_a_broken_overlay(client, config):
    """Another address asking for n1's parts (anyone may: they hold no secret), or n1's
    agent refreshing its runtime overlay while the node runs, leaves n1's phase alone: a
    broken overlay is logged, it does not mark a cluster of running nodes failed."""
    from provisiond.inventory import InventoryStore
    from provisiond.status import record_phase

    folder = config.state_dir / "overlays" / "site" / "etc"
    folder.mkdir(parents=True)
    (folder / "motd.j2").write_text("{{ 1 // 0 }}\n")
    with InventoryStore(config).edit() as inv:
        inv.nodes["n1"].system_overlays = ["hostname", "site"]
        inv.nodes["n2"].runtime_overlays = ["site"]
    services = client.application.extensions["provisiond"]
    agent = credential(client, 2)  # as n2's agent got it at boot (its iPXE script first)
    services.phases.flush()
    for name in ("n1", "n2"):
        record_phase(config, name, NodePhase.READY, "node ready")
    services.watcher.interval = services.overlays.interval = 0
    for kind in ("shared", "system"):
        assert client.get(f"/overlays/n1/{kind}",
                          environ_base=node_env(2)).status_code == 500
    refresh = client.get("/overlays/n2/runtime", environ_base=node_env(2), headers=agent)
    assert refresh.status_code in (400, 500), refresh.json
    services.phases.flush()
    assert read_status(config, "n1")["phase"] == "ready"
    assert read_status(config, "n2")["phase"] == "ready"
