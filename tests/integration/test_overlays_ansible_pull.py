"""The ansible-pull overlay's provisiond-configure, rendered by provisiond for a node, run for
real by the node agent (`boot`, then `configure --only-if-changed` as the overlay's timer
does) with Debian's ansible-pull against a git repository of the test (file://), the agent
reporting to the stand-in server of test_overlays_agent: configured and ready, nothing when
the repository has not changed, failed with the log's last lines when a commit breaks the
playbook, configured again when a commit fixes it. The playbook writes under the test's
temporary directory only (examples/site creates a user: the lab runs it, on a VM)."""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from provisiond.config import load_config
from provisiond.inventory import InventoryStore
from provisiond.inventory.model import Ansible
from provisiond.overlays import ensure_overlay
from provisiond.overlays.context import take_snapshot
from provisiond.overlays.render import Builder
from provisiond.overlays.source import load_overlay
from tests.integration.test_overlays_agent import FIXTURES, NodeServer, run_agent
from tests.tools import tool

PLAYBOOK = """- name: The test's site
  hosts: localhost
  gather_facts: false
  tasks:
    - name: A file of the site
      ansible.builtin.copy:
        dest: "{{ out_dir }}/site.conf"
        content: "cluster {{ cluster }}\\n"
"""
BROKEN = """    - name: A file in a directory nobody made
      ansible.builtin.copy:
        dest: "{{ out_dir }}/missing/settings"
        content: "never written\\n"
"""
GIT = [tool("git") or "git", "-c", "user.name=test", "-c", "user.email=test@example.invalid"]


def git(repo: Path, *args: str) -> None:
    subprocess.run([*GIT, "-C", str(repo), *args], check=True, capture_output=True,
                   env={"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
                        "PATH": "/usr/bin:/bin"})


def commit(repo: Path, playbook: str, message: str) -> None:
    (repo / "site.yml").write_text(playbook)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)


@pytest.fixture
def site(tmp_path):
    """(repository, where its playbook writes) for node n001."""
    if not tool("ansible-pull") or not tool("git"):
        pytest.skip("ansible-core or git is not installed (.ci/install-deps.sh)")
    repo, out = tmp_path / "site", tmp_path / "out"
    repo.mkdir()
    out.mkdir()
    git(repo, "init", "-q", "-b", "main")
    commit(repo, PLAYBOOK, "the site")
    return repo, out


def configure_script(tmp_path: Path, ansible: Ansible | None) -> tuple[Path, bytes]:
    """(provisiond-configure rendered for n001 with `ansible` as its settings, written under
    tmp_path; n001's runtime overlay for the stand-in server)."""
    state = tmp_path / "state"
    state.mkdir()
    for name in ("inventory.yaml", "provisiond.yaml"):
        shutil.copy(FIXTURES / name, state / name)
    config = load_config(state)
    with InventoryStore(config).edit() as inventory:
        inventory.nodes["n001"].ansible = ansible
    builder = Builder(config, take_snapshot(config, reuse=False))
    entries = builder.render(load_overlay(config, "ansible-pull"), "n001", "system")
    script = tmp_path / "provisiond-configure"
    script.write_bytes(next(e.data for e in entries
                            if e.path == "usr/local/sbin/provisiond-configure"))
    script.chmod(0o755)
    return script, ensure_overlay(config, "n001", "runtime").read_bytes()


@pytest.fixture
def stand_in():
    """Start a stand-in provisiond for a runtime overlay; shut down afterwards."""
    servers = []

    def start(body: bytes) -> NodeServer:
        httpd = NodeServer(body)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return httpd

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def agent(tmp_path: Path, server: NodeServer, script: Path, *args: str):
    (tmp_path / "home").mkdir(exist_ok=True)
    extra = {"PROVISIOND_AGENT_CONFIGURE": str(script), "PROVISIOND_AGENT_HTTP": "curl",
             "PROVISIOND_ANSIBLE_DIR": str(tmp_path / "checkout"),
             "PROVISIOND_ANSIBLE_LOG": str(tmp_path / "log/provisiond-ansible.log"),
             "HOME": str(tmp_path / "home"), "PROVISIOND_AGENT_TRIES": "1",
             "PYTHONUNBUFFERED": ""}  # as on a node (a developer's shell may set it)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    result = run_agent(tmp_path, url, extra, *args)
    result.__dict__["log"] = (tmp_path / "log/provisiond-ansible.log").read_text() \
        if (tmp_path / "log/provisiond-ansible.log").exists() else ""
    return result


def test_ansible_pull_at_boot_then_only_when_the_repository_changed(tmp_path, site, stand_in):
    repo, out = site
    script, runtime = configure_script(tmp_path, Ansible(
        repo=f"file://{repo}", branch="main", playbook="site.yml",
        extra_vars={"out_dir": str(out), "cluster": "c1"}))
    server = stand_in(runtime)

    booted = agent(tmp_path, server, script, "boot")
    assert booted.returncode == 0, booted.stderr
    assert [p for p, _ in server.phases] == ["booted", "runtime", "configured", "ready"]
    configured = server.phases[2][1]
    assert configured.startswith("localhost : ok=1 changed=1") and "failed=0" in configured
    assert (out / "site.conf").read_text() == "cluster c1\n"
    assert "PLAY RECAP" in booted.stderr  # the run's output reaches the journal too

    unchanged = agent(tmp_path, server, script, "configure", "--only-if-changed")
    assert unchanged.returncode == 0, unchanged.stderr
    assert "Repository has not changed, quitting." in unchanged.log
    assert len(server.phases) == 4, server.phases  # nothing reported

    commit(repo, PLAYBOOK + BROKEN, "a task that cannot succeed")
    broken = agent(tmp_path, server, script, "configure", "--only-if-changed")
    assert broken.returncode == 1
    phase, detail = server.phases[-1]
    assert phase == "failed" and len(server.phases) == 5, server.phases
    prefix = "provisiond-configure exit 2: "
    assert detail.startswith(prefix) and len(detail) <= len(prefix) + 400, detail
    lines = [" ".join(line.strip().rstrip(" *").split()) for line in broken.log.splitlines()]
    parts = detail[len(prefix):].split(" | ")  # whole lines of the log, the last ones
    assert parts == [line for line in lines if line][-len(parts):], (parts, lines)
    assert parts[-2:] == ["PLAY RECAP", "localhost : ok=1 changed=0 unreachable=0 failed=1 "
                          "skipped=0 rescued=0 ignored=0"], parts
    assert f"Destination directory {out}/missing does not exist" in parts[-3], parts

    commit(repo, PLAYBOOK.replace("c1", "c2").replace("{{ cluster }}", "c2"), "fixed")
    fixed = agent(tmp_path, server, script, "configure", "--only-if-changed")
    assert fixed.returncode == 0, fixed.stderr
    assert [p for p, _ in server.phases[5:]] == ["configured", "ready"]
    assert (out / "site.conf").read_text() == "cluster c2\n"


def test_a_node_without_a_repository_goes_ready_without_configured(tmp_path, stand_in):
    script, runtime = configure_script(tmp_path, None)
    server = stand_in(runtime)
    booted = agent(tmp_path, server, script, "boot")
    assert booted.returncode == 0, booted.stderr
    assert [p for p, _ in server.phases] == ["booted", "runtime", "ready"]
    assert "no ansible.repo set for n001; nothing to run" in booted.stderr
    again = agent(tmp_path, server, script, "configure", "--only-if-changed")
    assert again.returncode == 0 and len(server.phases) == 3


def test_a_repository_that_cannot_be_reached_at_boot_fails_the_boot(tmp_path, stand_in):
    script, runtime = configure_script(tmp_path, Ansible(repo=f"file://{tmp_path}/nowhere",
                                                         playbook="site.yml"))
    if not tool("ansible-pull"):
        pytest.skip("ansible-core is not installed (.ci/install-deps.sh)")
    server = stand_in(runtime)
    booted = agent(tmp_path, server, script, "boot")
    assert booted.returncode == 1
    assert [p for p, _ in server.phases] == ["booted", "runtime", "failed"]
    assert server.phases[-1][1].startswith("provisiond-configure exit "), server.phases
    assert "Could not read from remote repository." in server.phases[-1][1], server.phases


def test_a_failed_run_runs_again_on_the_timer_although_the_repository_did_not_change(
        tmp_path, site, stand_in):
    """--only-if-changed skips an unchanged repository only after a run that succeeded: a
    run that failed for a cause outside the repository (here a missing directory, made
    afterwards) is retried by the next timer run, and the node leaves `failed`."""
    repo, out = site
    commit(repo, PLAYBOOK + BROKEN, "a task that needs out/missing")
    script, runtime = configure_script(tmp_path, Ansible(
        repo=f"file://{repo}", branch="main", playbook="site.yml",
        extra_vars={"out_dir": str(out), "cluster": "c1"}))
    server = stand_in(runtime)
    booted = agent(tmp_path, server, script, "boot")
    assert booted.returncode == 1
    assert [p for p, _ in server.phases] == ["booted", "runtime", "failed"]

    (out / "missing").mkdir()  # the cause is gone; the repository is the same
    again = agent(tmp_path, server, script, "configure", "--only-if-changed")
    assert again.returncode == 0, again.stderr
    assert [p for p, _ in server.phases[3:]] == ["configured", "ready"], server.phases
    assert (out / "missing/settings").read_text() == "never written\n"

    unchanged = agent(tmp_path, server, script, "configure", "--only-if-changed")
    assert unchanged.returncode == 0 and len(server.phases) == 5, server.phases


def test_a_configure_run_that_hangs_is_stopped_and_reported_failed(tmp_path, stand_in):
    """The boot's run is bounded (PROVISIOND_CONFIGURE_TIMEOUT s): a playbook that hangs
    must not hold the boot (and ssh, ordered after the agent) forever."""
    _, runtime = configure_script(tmp_path, None)
    script = tmp_path / "hanging-configure"
    script.write_text("#!/bin/sh\necho 'TASK [wait for something that never comes]'\n"
                      "exec sleep 600\n")
    script.chmod(0o755)
    server = stand_in(runtime)
    (tmp_path / "home").mkdir()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    booted = run_agent(tmp_path, url, {"PROVISIOND_AGENT_CONFIGURE": str(script),
                                       "PROVISIOND_AGENT_HTTP": "curl",
                                       "PROVISIOND_AGENT_TRIES": "1",
                                       "PROVISIOND_CONFIGURE_TIMEOUT": "2"}, "boot")
    assert booted.returncode == 1, booted.stderr
    assert [p for p, _ in server.phases] == ["booted", "runtime", "failed"], server.phases
    detail = server.phases[-1][1]
    assert detail.startswith("provisiond-configure timed out after 2 s: "), detail
    assert detail.endswith("TASK [wait for something that never comes]"), detail


def test_credentials_in_the_repository_url_never_reach_the_server(tmp_path, stand_in):
    """ansible-pull logs its command line and git its URL: the failure's detail (the server,
    node status, the API) and the journal get the URL without its user:password."""
    if not tool("ansible-pull"):
        pytest.skip("ansible-core is not installed (.ci/install-deps.sh)")
    script, runtime = configure_script(tmp_path, Ansible(
        repo="http://deploy:s3cret-token@127.0.0.1:9/site.git", playbook="site.yml"))
    server = stand_in(runtime)
    booted = agent(tmp_path, server, script, "boot")
    assert booted.returncode == 1
    assert [p for p, _ in server.phases] == ["booted", "runtime", "failed"], server.phases
    detail = server.phases[-1][1]
    assert "127.0.0.1:9" in detail and "s3cret-token" not in detail, detail
    assert "s3cret-token" in booted.log  # the node's own log, root's only, keeps it
    assert "s3cret-token" not in booted.stderr


def test_extra_vars_with_spaces_and_quotes_reach_the_playbook_whole(tmp_path, site, stand_in):
    """ansible's key=value form splits a value at its spaces (site_cluster="a b" gave "a"):
    each extra var goes as JSON."""
    repo, out = site
    cluster = "c1 \"east\" o'clock & <more>"
    script, runtime = configure_script(tmp_path, Ansible(
        repo=f"file://{repo}", branch="main", playbook="site.yml",
        extra_vars={"out_dir": str(out), "cluster": cluster}))
    server = stand_in(runtime)
    booted = agent(tmp_path, server, script, "boot")
    assert booted.returncode == 0, booted.stderr
    assert (out / "site.conf").read_text() == f"cluster {cluster}\n"
