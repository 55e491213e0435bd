"""A site repository for the lab's nodes: a git repository made from a directory and served
by `git daemon` (Debian's git) on the server's address inside the lab namespace, the way a
site serves the repository its nodes' ansible-pull checks out. Started and stopped by PID."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pvlab import process
from pvlab.errors import LabError
from pvlab.layout import SERVER_ADDRESS
from pvlab.provision import tcp_open

GIT_PORT = 9418
BRANCH = "main"
IDENTITY = ["-c", "user.name=pvlab", "-c", "user.email=pvlab@lab.invalid"]
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}  # no host settings


def repo_url(name: str) -> str:
    """The URL a lab node clones repository `name` (a directory under the served base) from."""
    return f"git://{SERVER_ADDRESS}/{name}"


def git(repo: Path, *args: str) -> str:
    """`git -C repo ARGS` with the lab's identity and no system or user settings; stdout."""
    return process.run(["git", "-C", str(repo), *IDENTITY, *args],
                       env={**os.environ, **GIT_ENV}).stdout.strip()


def init_repo(repo: Path, source: Path) -> str:
    """A new repository at `repo` holding a copy of `source` as its first commit on BRANCH;
    returns the commit."""
    shutil.copytree(source, repo)
    git(repo, "init", "-q", "-b", BRANCH)
    return commit_all(repo, f"site repository from {source.name}")


def commit_all(repo: Path, message: str) -> str:
    """Commit every change in the work tree; returns the new commit."""
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def start_git_daemon(netns: str, base: Path, log: Path, timeout: float = 30) -> int:
    """`git daemon` serving every repository under `base` (read-only, git://) on the lab
    server's address in `netns`; waits until it accepts connections; returns its PID."""
    argv = ["git", "daemon", "--reuseaddr", "--export-all", "--informative-errors",
            "--verbose", f"--base-path={base}", f"--listen={SERVER_ADDRESS}",
            f"--port={GIT_PORT}", str(base)]
    pid = process.spawn(argv, log, netns=netns, env={**os.environ, **GIT_ENV})
    try:
        process.wait_for(lambda: _answers(netns, pid, log), timeout, "git daemon")
    except BaseException:
        stop_git_daemon(pid)
        raise
    return pid


def _answers(netns: str, pid: int, log: Path) -> bool:
    if not process.alive(pid, "daemon"):
        raise LabError(f"git daemon ({process.exit_status(pid)}) is not running; see {log}")
    return tcp_open(netns, SERVER_ADDRESS, GIT_PORT)


def stop_git_daemon(pid: int) -> None:
    process.stop(pid, "daemon")
