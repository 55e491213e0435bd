"""Debian packages as build inputs: resolve, download once into a cache, unpack.

Downloaded .deb files are kept in `<cache>/debs` (Layout.debs: $PROVISIOND_CACHE_DIR, else
the state dir's `cache/`), so rebuilds never fetch them again.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

from provisiond.archive import TRUSTED
from provisiond.atomic import write_atomic
from provisiond.config import Config
from provisiond.errors import BuildFailed
from provisiond.images.blobs import file_sha256
from provisiond.state.layout import Layout
from provisiond.state.local import read_json

APT_LISTS = Path("/var/lib/apt/lists")
SOURCES = [Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d")]


def run_tool(argv: list[str], what: str, **kwargs) -> str:
    """Run a host tool; a failure becomes BuildFailed with its last line of stderr.

    The tool runs in its own session, and the whole session is killed if the build is
    interrupted, so no debootstrap or apt keeps running behind a failed build.
    """
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True, **kwargs)
    except FileNotFoundError:
        raise BuildFailed(f"{what}: {argv[0]} is not installed") from None
    try:
        out, err = proc.communicate()
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    if proc.returncode != 0:
        last = (err.strip().splitlines() or ["(no output)"])[-1]
        raise BuildFailed(f"{what}: {argv[0]} exited {proc.returncode}: {last}")
    return out


def resolve_package(config: Config, name: str) -> tuple[str, str]:
    """(package, version) apt would install, remembered until apt's lists change."""
    memo_path = Layout.of(config).debs / "resolved.json"
    lists = str(APT_LISTS.stat().st_mtime_ns) if APT_LISTS.exists() else ""
    memo = read_json(memo_path)
    if memo.get("lists") != lists:
        memo = {"lists": lists}
    if name not in memo:
        memo[name] = _ask_apt(name)
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(memo_path, json.dumps(memo, indent=1, sort_keys=True))
    return tuple(memo[name])


def _ask_apt(name: str) -> list[str]:
    """A metapackage such as linux-image-amd64 resolves to the linux-image-* it depends on."""
    out = run_tool(["apt-cache", "depends", "--no-recommends", "--no-suggests", name],
                   f"resolve {name}")
    target = name
    if name.startswith("linux-image-") and not re.match(r"linux-image-\d", name):
        deps = re.findall(r"Depends: (linux-image-\d\S+)", out)
        target = deps[0] if deps else name
    policy = run_tool(["apt-cache", "policy", target], f"resolve {target}")
    match = re.search(r"Candidate: (\S+)", policy)
    if not match or match.group(1) == "(none)":
        raise BuildFailed(f"resolve {name}: apt has no candidate for {target}")
    return [target, match.group(1)]


def fetch_deb(config: Config, name: str) -> Path:
    """The cached .deb of a package's candidate version, downloaded if missing."""
    package, version = resolve_package(config, name)
    folder = Layout.of(config).debs
    folder.mkdir(parents=True, exist_ok=True)
    filename = f"{package}_{version.replace(':', '%3a')}_amd64.deb"
    for candidate in (folder / filename, Path("/var/cache/apt/archives") / filename):
        if candidate.is_file():
            return candidate
    run_tool(["apt-get", "download", "-q", f"{package}={version}"],
             f"download {package}", cwd=folder)
    found = sorted(folder.glob(f"{package}_*.deb"), key=os.path.getmtime)
    if not found:
        raise BuildFailed(f"download {package}: apt-get left no .deb in {folder}")
    if found[-1].name != filename:
        found[-1].rename(folder / filename)
    return folder / filename


def deb_sha256(path: Path) -> str:
    """The .deb's sha256, remembered beside it so rebuilds do not rehash 70 MB."""
    sidecar = path.parent / (path.name + ".sha256")
    if path.parent.name == "debs" and sidecar.is_file():
        return sidecar.read_text().strip()
    digest = file_sha256(path)
    if path.parent.name == "debs":
        sidecar.write_text(digest + "\n")
    return digest


def extract_deb(deb: Path, dest: Path, keep: Callable[[str], bool] = lambda n: True,
                dirs_under: tuple[str, ...] = ()) -> None:
    """Unpack the data of a .deb into dest: the members `keep` accepts, and every directory
    under `dirs_under` (so directory modes come from the package, not the umask)."""
    proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as archive:
            for member in archive:
                name = member.name.lstrip("./")
                if name and (keep(name) or (member.isdir() and name.startswith(dirs_under))):
                    archive.extract(member, dest, **TRUSTED)
    finally:
        proc.stdout.close()
        err = proc.stderr.read().decode(errors="replace")
        proc.stderr.close()
        if proc.wait() != 0:
            raise BuildFailed(f"unpack {deb.name}: dpkg-deb failed: {err.strip()[-200:]}")


def apt_mirror() -> str:
    """The Debian mirror apt is configured with (first `deb` URI in its sources)."""
    files = [SOURCES[0]] if SOURCES[0].is_file() else []
    if SOURCES[1].is_dir():
        files += sorted(SOURCES[1].glob("*.sources")) + sorted(SOURCES[1].glob("*.list"))
    for path in files:
        text = path.read_text(errors="replace")
        for uri in re.findall(r"^URIs:\s*(\S+)", text, re.M) + re.findall(
                r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)", text, re.M):
            if "security" not in uri:
                return uri
    return "http://deb.debian.org/debian"
