"""Each node's checks: a MAC and an address to be known by, its image built and current,
its overlays built and current, its BMC answering; and the discovery image's, which the
machines that are no node yet boot."""

from __future__ import annotations

from provisiond.boot.discovery import enlisting
from provisiond.config import Config
from provisiond.errors import ImageNotFound, ProvisiondError
from provisiond.images import blob_path, load_manifest, load_recipe
from provisiond.images.squash import boot_mode, mounted_problems, mounted_refused
from provisiond.inventory import load_nodes
from provisiond.inventory.merge import Node
from provisiond.inventory.ranges import expand, fold
from provisiond.overlays.build import is_built
from provisiond.overlays.context import take_snapshot
from provisiond.overlays.render import Builder
from provisiond.preflight import Finding, fail, ok, warn
from provisiond.state.layout import Layout
from provisiond.state.models import DamagedDocument, ImageManifest, parse

OVERLAY_KINDS = ("shared", "system", "runtime")


def check_nodes(config: Config, pattern: str | None, bmc: bool = True,
                bmc_timeout: float = 3.0) -> list[Finding]:
    try:
        nodes = load_nodes(config)
    except ProvisiondError as exc:
        return [fail("inventory", str(Layout.of(config).inventory), str(exc),
                     "fix the record it names (provisiond node set, or edit and re-apply)")]
    names = expand(pattern) if pattern else list(nodes)
    missing = [name for name in names if name not in nodes]
    findings = [fail("node", fold(missing), "no such node", "check the range, or add the "
                     "node")] if missing else []
    selected = {name: nodes[name] for name in names if name in nodes}
    if not selected:
        return findings + [warn("inventory", str(Layout.of(config).inventory), "no node to boot",
                                "provisiond node add NAME --mac ... --ipaddr ...")]
    images = _ImageChecks(config)
    builder = Builder(config, take_snapshot(config, reuse=False))
    for node in selected.values():
        findings += _identity(config, node) + [images.check(node), _overlays(builder, node)]
        findings += images.mounted(node)
    if bmc:
        findings += _bmcs(config, selected, bmc_timeout)
    return findings


def check_discovery(config: Config) -> list[Finding]:
    """With discovery on, unknown machines boot the discovery image: it must be built."""
    if not (config.dhcp.enabled and enlisting(config)):
        return []
    image = config.discovery.image
    level, detail, fix = _ImageChecks(config).image_state(image)
    return [Finding("discovery", image, level, f"the image unknown machines boot: {detail}",
                    fix)]


def _identity(config: Config, node: Node) -> list[Finding]:
    """DHCP and iPXE know a node by a netdev's MAC; DHCP gives that netdev its address."""
    netdevs = node.record.netdevs or {}
    with_mac = {name: dev for name, dev in sorted(netdevs.items()) if dev.mac}
    if not with_mac:
        return [fail("mac", node.name, "no netdev has a MAC: DHCP and iPXE cannot tell "
                     "this node", f"provisiond node set {node.name} --netdev eth0 --mac MAC")]
    found = [ok("mac", node.name, ", ".join(f"{n} {d.mac}" for n, d in with_mac.items()))]
    if not config.dhcp.enabled or config.dhcp.proxy:
        return found  # another DHCP server gives the address
    bare = [name for name, dev in with_mac.items() if not dev.ipaddr]
    if bare:
        found.append(fail("address", node.name, f"{', '.join(bare)}: a MAC but no IPv4 "
                          "address: DHCP has none to give", f"provisiond node set {node.name} "
                          f"--netdev {bare[0]} --ipaddr ADDRESS"))
    else:
        found.append(ok("address", node.name, ", ".join(d.ipaddr for d in with_mac.values())))
    return found


class _ImageChecks:
    """Each image checked once, however many nodes use it."""

    def __init__(self, config: Config):
        self.config = config
        self._done: dict[str, tuple[str, str, str]] = {}
        self._manifests: dict[str, dict] = {}
        self._mounted: dict[str, list[str]] = {}

    def check(self, node: Node) -> Finding:
        image = node.record.image
        if not image:
            return fail("image", node.name, "no image set", f"provisiond node set {node.name} "
                        "--image NAME (or in one of its profiles)")
        level, detail, fix = self.image_state(image)
        return Finding("image", node.name, level, f"{image}: {detail}", fix)

    def image_state(self, image: str) -> tuple[str, str, str]:
        """(level, detail, fix) of an image: built, its blobs there, its recipe unchanged."""
        if image not in self._done:
            self._done[image] = self._check_image(image)
        return self._done[image]

    def _check_image(self, image: str) -> tuple[str, str, str]:
        build = f"provisiond image build {image} (as root)"
        try:
            raw = load_manifest(self.config, image)
            manifest = parse(ImageManifest, raw, Layout.of(self.config).image_manifest(image),
                             DamagedDocument)
            self._manifests[image] = raw  # the mounted checks read it as written
        except ImageNotFound:
            return "fail", "not built", build
        except DamagedDocument as exc:
            return "fail", str(exc), build
        digests = [manifest.kernel.digest, *(layer.digest for layer in manifest.layers)]
        missing = [d for d in digests if not blob_path(self.config, d).is_file()]
        if missing:
            return "fail", f"{len(missing)} blob(s) of its build are missing", build
        try:
            recipe = load_recipe(self.config, image)
        except ProvisiondError:
            return "ok", f"built {manifest.built_at} (no recipe to compare)", ""
        if manifest.recipe is None or recipe.sha256 != manifest.recipe.sha256:
            return ("warn", f"{recipe.path} changed since the build of "
                    f"{manifest.built_at or '?'}: nodes boot the older build", build)
        return "ok", f"built {manifest.built_at}, current", ""

    def mounted(self, node: Node) -> list[Finding]:
        """The image's mounted layer blobs and boot kit (read and hashed once per image):
        a fail for a node that boots mounted, a warning for one that boots unpacked."""
        manifest = self._manifests.get(node.record.image or "")
        if manifest is None:
            return []  # no image, or not built: the image check says so
        image = node.record.image
        if image not in self._mounted:
            self._mounted[image] = mounted_problems(self.config, manifest)
        problems = self._mounted[image]
        mode = boot_mode(manifest, node.record.kernel_args or [])
        refused = mounted_refused(manifest, node.record.kernel_args or [])
        if refused:
            return [Finding("mounted", node.name, "warn", f"{image} {refused}",
                            f"provisiond image show {image} says why; or drop "
                            "provisiond.boot=mounted from the kernel args")]
        if not problems:
            return [ok("mounted", node.name, f"{image}: boots {mode}; mounted blobs intact")]
        level = "fail" if mode == "mounted" else "warn"
        fix = f"provisiond image build {image} (as root): it packs what is missing"
        if any("(damaged)" in p or "bytes, not" in p for p in problems):
            fix = "remove the blob files named above, then " + fix
        return [Finding("mounted", node.name, level, f"{image} (boots {mode}): "
                        + "; ".join(problems), fix)]


def _overlays(builder: Builder, node: Node) -> Finding:
    """Built and current for what the node fetches; serve would build a stale one at the
    first request (slowly, for every node of a boot storm), and fails a broken one."""
    kinds = OVERLAY_KINDS if node.record.runtime_overlays else OVERLAY_KINDS[:2]
    stale = []
    for kind in kinds:
        try:
            current = builder.secrets_exist(node.name, kind) and (
                builder.node_key(node.name, kind) is not None) and is_built(
                builder, node.name, kind)
        except ProvisiondError as exc:
            return fail("overlays", node.name, f"{kind}: {exc}", "fix the overlay or the node "
                        f"record, then provisiond overlay build {node.name}")
        if not current:
            stale.append(kind)
    if stale:
        return fail("overlays", node.name, f"not built or not current: {', '.join(stale)}",
                    f"provisiond overlay build {node.name}")
    return ok("overlays", node.name, f"{', '.join(kinds)} current")


def _bmcs(config: Config, nodes: dict[str, Node], timeout: float) -> list[Finding]:
    """Each BMC asked its power state (changes nothing), with a short timeout."""
    from provisiond.power.operations import power_status, run_nodes

    with_bmc = {n: node for n, node in nodes.items()
                if node.record.bmc and node.record.bmc.driver}
    results = run_nodes(config, with_bmc, power_status, timeout) if with_bmc else []
    findings = []
    for result in results:
        bmc = with_bmc[result.node].record.bmc
        where = f"{bmc.driver.value} {bmc.address or ''}{f':{bmc.port}' if bmc.port else ''}"
        if result.ok:
            findings.append(ok("bmc", result.node, f"{where}: power {result.detail}"))
        else:
            findings.append(fail("bmc", result.node, f"{where}: {result.detail}",
                                 "check bmc.address, bmc.port, the BMC's network and the "
                                 f"credentials (provisiond secret set node {result.node} "
                                 "bmc_password)"))
    return findings
