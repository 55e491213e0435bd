"""Every path under the state directory, named once (and the cache directory beside it).

`Layout(state_dir)` answers paths; `KEYS` is the same layout over an empty root, so
`str(KEYS.status("n1"))` is the store key `status/n1.json` (keys are relative POSIX paths,
provisiond.state.store). `Layout.key(path)` turns a path back into its key.

Each entry below is declared with `@entry(pattern, what)`: ENTRIES lists them in order, and
docs/contracts.md's state directory section is generated from it (`python -m
provisiond.state.layout`; a unit test keeps the two the same). A lock file is the document's
path with `.lock` for its suffix (`lock_of`), except where an entry names another.
"""

from __future__ import annotations

import inspect
import os
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePath, PurePosixPath

from provisiond.config import CACHE_NAME, CONFIG_NAME, SHIPPED_DIR, Config
from provisiond.errors import InvalidInput

CACHE_ENV = "PROVISIOND_CACHE_DIR"
"""Where downloads are cached when set (several state dirs can share it); else <state>/cache."""
PATTERN_WIDTH, DOC_WIDTH = 32, 95  # the contracts doc's block
IMPORTED_LAYOUT = "oci"  # recipes/<name>/oci/: what `image import` keeps of an OCI image
IMPORTED_ARCHIVE = "archive.tar"  # recipes/<name>/archive.tar: of a docker-archive tarball
SHARED_BUILDS = "_shared"  # overlay-builds/_shared: node names start with a letter or digit


@dataclass(frozen=True)
class Entry:
    pattern: str
    """the key with <placeholders> for its parameters; a trailing / marks a directory"""
    what: str
    model: str | None
    function: Callable


ENTRIES: list[Entry] = []


def entry(pattern: str, what: str, model: str | None = None):
    """Declare a layout method (its key `pattern`, what the file holds, the model of its
    document in provisiond.state.models)."""
    def register(function: Callable) -> Callable:
        ENTRIES.append(Entry(pattern, what, model, function))
        return function
    return register


def lock_of(path: PurePath) -> PurePath:
    """The lock file of a document: `status/n1.json` -> `status/n1.lock`."""
    return path.with_suffix(".lock")


class Layout:
    """The paths of one state directory (`root`); `cache` holds downloads."""

    def __init__(self, root: PurePath, cache: PurePath | None = None):
        self.root = root
        self._cache = cache

    @property
    def cache(self) -> PurePath:
        return self._cache if self._cache is not None else self.root / CACHE_NAME

    @classmethod
    def of(cls, config: Config) -> "Layout":
        """The layout of `config.state_dir`; the cache from $PROVISIOND_CACHE_DIR if set."""
        shared = os.environ.get(CACHE_ENV)
        return cls(config.state_dir, Path(shared) if shared else None)

    def key(self, path: PurePath | str) -> str:
        """The store key of a path under the state directory."""
        try:
            return PurePath(path).relative_to(self.root).as_posix()
        except ValueError:
            raise InvalidInput(f"{path} is not under the state directory {self.root}") from None

    def path(self, key: str) -> PurePath:
        """The path of a store key (a relative POSIX path without '..')."""
        rel = PurePosixPath(key)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            raise InvalidInput(f"{key!r} is not a state key")
        return self.root.joinpath(*rel.parts)

    # --- settings and inventory -----------------------------------------------------------

    @property
    @entry(CONFIG_NAME, "settings (provisiond.config.Config)")
    def settings(self):
        return self.root / CONFIG_NAME

    @property
    @entry("store.key", "0600: the key secret values are sealed with in etcd, never stored "
           "there (provisiond.state.crypt, provisiond.state.open)")
    def store_key(self):
        return self.root / "store.key"

    @property
    @entry(".store/", "the files store's revisions: `changes.jsonl`, `meta/<key>.rev`, "
           "`locks/N` (provisiond.state.files; git-ignored)")
    def files_store(self):
        return self.root / ".store"

    @property
    @entry("inventory.yaml", "nodes and profiles (provisiond.inventory.store); `schema: 1` "
           "on top; lock inventory.lock")
    def inventory(self):
        return self.root / "inventory.yaml"

    @property
    @entry(".inventory.cache.json", "the parsed inventory, reused while inventory.yaml is "
           "unchanged (derived)")
    def inventory_cache(self):
        return self.root / ".inventory.cache.json"

    @property
    @entry(".inventory.claims.json", "who holds each MAC, address and BMC endpoint of the "
           "inventory.yaml it names by sha256, found valid (derived)")
    def inventory_claims(self):
        return self.root / ".inventory.claims.json"

    @property
    @entry("secrets.yaml", "0600, BMC passwords and node secrets "
           "(provisiond.inventory.secrets); lock secrets.lock")
    def secrets(self):
        return self.root / "secrets.yaml"

    @property
    @entry("tokens.json", "API tokens, hashed (provisiond.auth); lock tokens.lock")
    def tokens(self):
        return self.root / "tokens.json"

    # --- images -----------------------------------------------------------------------------

    @property
    @entry("blobs/sha256/", "content-addressed blobs: kernels, layers, mounted layers, boot "
           "kits (immutable)")
    def blobs(self):
        return self.root / "blobs" / "sha256"

    @entry("blobs/sha256/<hexdigest>", "one blob, named by the sha256 of its bytes")
    def blob(self, hexdigest: str):
        return self.blobs / hexdigest

    @entry("blobs/.fetching/<hexdigest>.lock", "held while the blob is fetched from a peer "
           "(provisiond.boot.peers); removed when the fetch ends")
    def blob_fetch_lock(self, hexdigest: str):
        return self.root / "blobs" / ".fetching" / f"{hexdigest}.lock"

    @property
    @entry("images/", "one folder per built image")
    def images(self):
        return self.root / "images"

    @entry("images/<name>/manifest.json", "the current build of an image", "ImageManifest")
    def image_manifest(self, name: str):
        return self.images / name / "manifest.json"

    @entry("images/<name>/shell.json", "the layers `image shell` added to the image",
           "ShellLayer")
    def image_shell_layers(self, name: str):
        return self.images / name / "shell.json"

    @entry("images/<name>/shell/", "their tarballs, `<sha256>.tar`; and, in no image's "
           "list, those of sessions whose rebuild failed or whose image was replaced (the "
           "error named them; `image gc` shows them, `--shell-tarballs` removes them); "
           "`.layer.*` while a session writes one (a killed session's: removed by gc)")
    def image_shell_dir(self, name: str):
        return self.images / name / "shell"

    @entry("images/.locks/<name>.lock", "serializes builds, imports (`<name>.import.lock`) "
           "and deletes of one image, and an `image shell`'s layer from its shell's exit to "
           "the end of its rebuild")
    def image_lock(self, name: str):
        return self.images / ".locks" / f"{name}.lock"

    @entry("images/.locks/<name>.import.lock", "serializes the imports of one image")
    def image_import_lock(self, name: str):
        return self.images / ".locks" / f"{name}.import.lock"

    @entry("images/.locks/<name>.shell.lock", "held by the `image shell` running on the "
           "image (one at a time), holding its PID")
    def image_shell_lock(self, name: str):
        return self.images / ".locks" / f"{name}.shell.lock"

    @property
    @entry("images/.locks/gc.lock", "builds hold it shared, blob garbage collection "
           "exclusively")
    def images_gc_lock(self):
        return self.images / ".locks" / "gc.lock"

    @property
    @entry("recipes/", "site image recipes, shadowing shipped ones (`image import` writes "
           "`recipes/<name>/image.yaml` + `oci/` or `archive.tar`)")
    def recipes(self):
        return self.root / "recipes"

    @entry("recipes/<name>/", "one imported or site recipe")
    def recipe_dir(self, name: str):
        return self.recipes / name

    @entry("recipes/<name>/oci/", "the image `image import` took from a registry, an "
           "`oci:` layout or a layout folder, as an OCI layout (its blobs)")
    def recipe_imported_layout(self, name: str):
        return self.recipe_dir(name) / IMPORTED_LAYOUT

    @entry("recipes/<name>/archive.tar", "the tarball `image import` was given (a "
           "docker-archive or OCI layout tarball)")
    def recipe_imported_archive(self, name: str):
        return self.recipe_dir(name) / IMPORTED_ARCHIVE

    @entry("recipes/<name>/.import.json", "in a folder `image import` swapped in, until the "
           "swap is ended: the manifest revision it started from, whether it replaces the "
           "image (a killed import is undone or finished by the next build, shell exit or "
           "import of the image)")
    def recipe_swap_mark(self, name: str):
        return self.recipes / name / ".import.json"

    @entry("recipes/.<name>.<step>/", "an import's folders: `import` what it stages, "
           "`previous` the recipe folder it swapped out, `failed` its own, being undone")
    def recipe_aside(self, name: str, step: str):
        return self.recipes / f".{name}.{step}"

    @property
    @entry("cache/layers/", "built layer trees, `<key>/` (root file systems, owned as on a "
           "node), and their records `<key>.json`")
    def layers(self):
        return self.root / CACHE_NAME / "layers"

    @entry("cache/layers/<key>/", "one layer's tree (its overlayfs upper dir)")
    def layer_tree(self, key: str):
        return self.layers / key

    @entry("cache/layers/<key>.json", "the record of a built layer", "LayerRecord")
    def layer_record(self, key: str):
        return self.layers / f"{key}.json"

    @entry("cache/layers/locks/<key>.lock", "one layer's build lock")
    def layer_lock(self, key: str):
        return self.layers / "locks" / f"{key}.lock"

    @entry("cache/layers/shell-<image>.<random>/", "an `image shell` session: its overlayfs "
           "`upper/` and `work/`, and `lowers`, the keys of the layer trees it mounts (gc "
           "keeps those, and a build makes none of them again while the file is flocked, as "
           "an open session keeps it); "
           "removed as it ends (after a SIGKILL, by the next shell on the image)")
    def shell_session(self, image: str, random: str):
        return self.layers / f"shell-{image}.{random}"

    @entry("cache/logs/<recipe>.log", "the output of a recipe's build steps")
    def build_log(self, recipe: str):
        return self.root / CACHE_NAME / "logs" / f"{recipe}.log"

    @property
    @entry("cache/debs/", "downloaded .debs ($PROVISIOND_CACHE_DIR/debs when set) and "
           "`resolved.json`, the dependency resolutions")
    def debs(self):
        return self.cache / "debs"

    # --- overlays and node secrets --------------------------------------------------------

    @property
    @entry("overlays/", "site overlays, shadowing shipped ones")
    def overlays(self):
        return self.root / "overlays"

    @property
    @entry("overlay-builds/", "overlay builds")
    def overlay_builds(self):
        return self.root / "overlay-builds"

    @entry("overlay-builds/<node>/", "a node's builds: `system.cpio.<ext>`, "
           "`runtime.cpio.<ext>` (+ `<kind>.key` where there are no user xattrs)")
    def overlay_node_dir(self, node: str):
        return self.overlay_builds / node

    @property
    @entry("overlay-builds/_shared/", "shared system overlay parts, `<key>.cpio.<ext>`, one "
           "per content")
    def overlay_shared_dir(self):
        return self.overlay_builds / SHARED_BUILDS

    @entry("secrets/ssh-host-keys/<node>/", "0600 in 0700 dirs: per-node "
           "`ssh_host_<type>_key[.pub]` (provisiond.overlays.hostkeys; types from "
           "build.ssh_host_key_types)")
    def host_keys(self, node: str):
        return self.root.joinpath("secrets", "ssh-host-keys", node)  # per node of a build

    @entry("secrets/ssh-host-keys/<node>/.lock", "held while the node's keys are made")
    def host_keys_lock(self, node: str):
        return self.host_keys(node) / ".lock"

    @entry("secrets/ssh-host-keys/.<node>.lock", "the same lock where older builds kept "
           "it; removed with the node's keys")
    def host_keys_old_lock(self, node: str):
        return self.root.joinpath("secrets", "ssh-host-keys", f".{node}.lock")

    @property
    @entry("secrets/token.key", "0600: the key provisioning tokens are signed with "
           "(provisiond.trust.tokens)")
    def token_key(self):
        return self.root / "secrets" / "token.key"

    @property
    @entry("secrets/nodes/", "0700: node credentials")
    def trust_dir(self):
        return self.root / "secrets" / "nodes"

    @entry("secrets/nodes/<node>.json", "0600: sha256 of the node's credential, tokens "
           "used (provisiond.trust.credentials.NodeTrust)")
    def trust(self, node: str):
        return self.trust_dir / f"{node}.json"

    # --- what the servers record -------------------------------------------------------------

    @property
    @entry("status/", "node status, one file per node")
    def status_dir(self):
        return self.root / "status"

    @entry("status/<node>.json", "boot phases, last refused token `token_refused` "
           "(provisiond.status)", "NodeStatus")
    def status(self, node: str):
        return self.status_dir / f"{node}.json"

    @property
    @entry("dhcp-leases.json", "the DHCP server's unexpired leases by MAC, the nodes' and "
           "the discovery pool's (written at most every 5 s and at stop, read back at start)",
           "Leases")
    def leases(self):
        return self.root / "dhcp-leases.json"

    @property
    @entry("discovery.jsonl", "unknown MACs the DHCP server saw, one JSON line each "
           "(rate-limited)", "Sighting")
    def sightings(self):
        return self.root / "discovery.jsonl"

    @property
    @entry("discovery.jsonl.1", "the sightings before, once discovery.jsonl reached 8 MiB",
           "Sighting")
    def older_sightings(self):
        return self.root / "discovery.jsonl.1"

    @property
    @entry("discovery/", "discovered machines, reported facts, rules")
    def discovery(self):
        return self.root / "discovery"

    @property
    @entry("discovery/machines.json", "machines waiting, approved or rejected "
           "(provisiond.discovery.machines.Book); lock machines.lock")
    def machines(self):
        return self.discovery / "machines.json"

    @property
    @entry("discovery/rules.yaml", "discovery rules (provisiond.discovery.rules)")
    def discovery_rules(self):
        return self.discovery / "rules.yaml"

    @entry("discovery/facts/<node>.json", "the facts a node reported "
           "(provisiond.discovery.facts.Facts)")
    def facts(self, node: str):
        return self.discovery / "facts" / f"{node}.json"

    @property
    @entry("power/fake-bmcs.json", "fake driver's BMCs (tests, dry runs)", "FakeBmcs")
    def fake_bmcs(self):
        return self.root / "power" / "fake-bmcs.json"

    @property
    @entry("power/pending-bootdev.json", "boot-device resets owed to BMCs without one-time "
           "boot", "PendingBootdevs")
    def pending_bootdev(self):
        return self.root / "power" / "pending-bootdev.json"

    @property
    @entry("events/journal.jsonl", "the event journal (provisiond.events); lock "
           "journal.jsonl.lock")
    def events(self):
        return self.root / "events" / "journal.jsonl"

    @property
    @entry("audit/audit.jsonl", "the audit record (provisiond.audit); lock "
           "audit.jsonl.lock")
    def audit(self):
        return self.root / "audit" / "audit.jsonl"

    # --- jobs, metrics, serve's run, slurm -------------------------------------------------

    @property
    @entry("jobs/", "asynchronous jobs (provisiond.jobs); the last 1,000 ended jobs are "
           "kept, up to 256 MiB of them (the newest 20 whatever their size)")
    def jobs(self):
        return self.root / "jobs"

    @property
    @entry("jobs/.lock", "held while the index or a record changes")
    def jobs_lock(self):
        return self.jobs / ".lock"

    @entry("jobs/<job_id>.json", "a job's record (provisiond.jobs.model.Job)")
    def job(self, job_id: str):
        return self.jobs / f"{job_id}.json"

    @entry("jobs/<job_id>.log", "its runner's output")
    def job_log(self, job_id: str):
        return self.jobs / f"{job_id}.log"

    @entry("jobs/<job_id>.secret", "0600: the params its record holds without their "
           "credentials (a firmware URL's user and password, its query), whole, until the "
           "job ends")
    def job_secret(self, job_id: str):
        return self.jobs / f"{job_id}.secret"

    @property
    @entry("jobs/index.json", "the next id and the claims of active jobs (node/N, image/N, "
           "overlays/N; provisiond.jobs.store.Index)")
    def jobs_index(self):
        return self.jobs / "index.json"

    @property
    @entry("metrics.json", "build and BMC call histograms any process adds to "
           "(provisiond.metrics); lock metrics.lock")
    def metrics(self):
        return self.root / "metrics.json"

    @property
    @entry("run/", "what lives only while `provisiond serve` runs")
    def run(self):
        return self.root / "run"

    @property
    @entry("run/metrics/", "a running serve's prometheus-client multiprocess files in "
           "`<pid>/` (its lock: `<pid>.lock`); a later serve removes those of dead ones")
    def metrics_runs(self):
        return self.run / "metrics"

    @property
    @entry("slurm/", "what `provisiond slurm config` writes")
    def slurm(self):
        return self.root / "slurm"

    @entry("slurm/<verb>", "Slurm's ResumeProgram (`resume`) and SuspendProgram (`suspend`) "
           "unless the settings name others")
    def slurm_program(self, verb: str):
        return self.slurm / verb

    @property
    @entry("slurm/slurm.conf", "slurm.conf as `provisiond slurm config` wrote it (the slurm "
           "overlay's `slurm_conf`)")
    def slurm_conf(self):
        return self.slurm / "slurm.conf"


def overlay_search_path(config: Config) -> list[Path]:
    """Site overlays shadow shipped ones: the first dir holding a name wins."""
    return [*config.overlay_dirs, Layout.of(config).overlays, SHIPPED_DIR / "overlays"]


def recipe_search_path(config: Config) -> list[Path]:
    """Site recipes (settings' image_dirs, then the state dir's) shadow shipped ones."""
    return [*config.image_dirs, Layout.of(config).recipes, SHIPPED_DIR / "images"]


KEYS = Layout(PurePosixPath())
"""The layout over an empty root: its paths are the store keys (`str(KEYS.inventory)`)."""


def placeholders(function: Callable) -> list[str]:
    """`<name>` for each parameter of a layout method (after self)."""
    return [f"<{name}>" for name in list(inspect.signature(function).parameters)[1:]]


def doc_lines() -> list[str]:
    """docs/contracts.md's state directory block: one line per entry, pattern then what."""
    lines = []
    for one in ENTRIES:
        model = f" (model: {one.model})" if one.model else ""
        text = f"{one.pattern:<{PATTERN_WIDTH}} {one.what}{model}"
        lines += textwrap.wrap(text, DOC_WIDTH, subsequent_indent=" " * (PATTERN_WIDTH + 1),
                               break_on_hyphens=False)
    return lines


if __name__ == "__main__":
    print("\n".join(doc_lines()))
