"""Issue 13 in the VM lab, on the debian12 VM n4 (systemd, curl, sshd):

- `node reprovision` boots it while a forger in the lab namespace keeps posting `ready`
  (refused, 401): the result is the real boot's `ready`, after its `booted` and `runtime`.
- The token the VM exchanged (read from its /proc/cmdline) is refused from another address
  of the lab namespace and again from the VM's own address, as two `token.refused` events.
- A status report without the credential gets 401 and changes nothing.
- An unprivileged user on the VM (over ssh) reads no credential, fetches no runtime overlay,
  and cannot exchange a token of their own.
- `secret rotate n4 ssh-host-keys`: after the agent's refresh (the unit its timer starts),
  ssh-keyscan sees the new host key; the VM did not reboot. Rotated again and
  `systemctl restart provisiond-agent` by hand: sshd is reloaded and serves the newest key.
"""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

from provisiond.events import latest_id, read_since
from provisiond.overlays.hostkeys import host_key_dir
from provisiond.power import reprovision
from provisiond.states import NodePhase
from provisiond.status import read_status
from pvlab import process, provision

pytestmark = [pytest.mark.lab, pytest.mark.slow]
NODE = "n4"
OTHER = "10.99.77.250"  # another address of the lab's network, in its namespace
NOBODY = "setpriv --reuid=65534 --regid=65534 --clear-groups --"


def curl(lab, *args: str) -> tuple[str, str]:
    """(HTTP code, body) of curl run in the lab namespace."""
    result = process.run(["curl", "-gsS", "--max-time", "20", "-w", "\n%{http_code}", *args],
                         netns=lab.netns, check=False, timeout=30)
    body, _, code = result.stdout.rpartition("\n")
    return code, body


def ssh_until(lab, command: str, seconds: float = 180, **kw) -> subprocess.CompletedProcess:
    """`command` over ssh, retried while sshd is not answering yet."""
    deadline = time.monotonic() + seconds
    while True:
        result = lab.ssh(NODE, command, **kw)
        if result.returncode != 255 or time.monotonic() > deadline:
            return result
        time.sleep(3)


def refusals(lab, after: int) -> list[tuple]:
    return [(e.subject, e.data["reason"], e.data["address"])
            for e in read_since(lab.config, after) if e.kind == "token.refused"]


def key_of(line: str) -> str:
    return " ".join(line.split()[:2]) if line.startswith("ssh-") else \
        " ".join(line.split()[1:3])


def test_tokens_credentials_and_an_unprivileged_user_on_a_debian12_vm(
        lab, debian12_layers):
    node = lab.nodes[NODE]
    url = lab.serve["url"]
    lab.build_image(node.image)
    process.run(["ip", "addr", "add", f"{OTHER}/24", "dev", "br0"], netns=lab.netns)
    try:
        _reprovision_despite_a_forger(lab, url)
        _token_refused_elsewhere_and_again(lab, url, node)
        _unprivileged_user(lab, url, node)
    finally:
        process.run(["ip", "addr", "del", f"{OTHER}/24", "dev", "br0"], netns=lab.netns,
                    check=False)


def _reprovision_despite_a_forger(lab, url: str) -> None:
    forged: list[tuple[float, str]] = []
    stop = threading.Event()

    def forge():
        while not stop.wait(2):
            for auth in ([], ["-H", "Authorization: Bearer " + "x" * 43]):
                code, _ = curl(lab, "--interface", OTHER, *auth, "--data",
                               "phase=ready&detail=forged", f"{url}/api/v1/status/{NODE}")
                forged.append((time.time(), code))

    forger = threading.Thread(target=forge, daemon=True)
    forger.start()
    try:
        results = {r.node: r for r in reprovision(lab.config, [NODE], timeout=900)}
    finally:
        stop.set()
        forger.join(60)
    assert results[NODE].ok, f"{results[NODE].detail}\n{lab.serial_tail(NODE)}"
    status = read_status(lab.config, NODE)
    phases = status["phases"]
    assert phases["booted"] < phases["runtime"] < phases["ready"], phases
    assert status["detail"] == "node ready"  # the agent's words, not the forger's
    assert forged and {code for _, code in forged} == {"401"}, forged
    assert forged[0][0] < phases["booted"], "no forgery was tried before the real boot"


def _token_refused_elsewhere_and_again(lab, url: str, node) -> None:
    cmdline = ssh_until(lab, "cat /proc/cmdline")
    assert cmdline.returncode == 0, cmdline.stderr
    token = next(w.split("=", 1)[1] for w in cmdline.stdout.split()
                 if w.startswith("provisiond.token="))
    before = latest_id(lab.config)
    code, body = curl(lab, "--interface", OTHER, "--local-port", "700-800", "--data",
                      f"token={token}", f"{url}/api/v1/credentials/{NODE}")
    assert code == "401" and "not reserved for the node" in body, body
    again = lab.ssh(NODE, f"curl -sS --local-port 700-800 -w '\\n%{{http_code}}' "
                          f"--data token={token} {url}/api/v1/credentials/{NODE}")
    assert again.stdout.endswith("\n401") and "used already" in again.stdout, again
    assert refusals(lab, before) == [(NODE, "wrong_address", OTHER),
                                     (NODE, "reused", node.ipaddr)]
    status = read_status(lab.config, NODE)
    assert status["token_refused"]["reason"] == "reused"

    code, _ = curl(lab, "--data", "phase=failed&detail=forged", f"{url}/api/v1/status/{NODE}")
    assert code == "401" and read_status(lab.config, NODE) == status
    refresh = lab.ssh(NODE, "/usr/local/sbin/provisiond-agent refresh", timeout=60)
    assert refresh.returncode == 0, refresh.stderr  # the node's own credential still works
    assert "runtime overlay unchanged" in refresh.stderr


def _unprivileged_user(lab, url: str, node) -> None:
    script = f"""
N='{NOBODY}'
$N cat /run/provisiond/credential >/dev/null 2>&1; echo "read=$?"
echo "mode=$(stat -c %a /run/provisiond/credential) dir=$(stat -c %a /run/provisiond)"
echo "runtime=$($N curl -s -o /dev/null -w '%{{http_code}}' {url}/overlays/{NODE}/runtime)"
tok=$($N curl -s {url}/boot/ipxe/{node.mac} | sed -n 's/.*provisiond\\.token=\\([^ ]*\\).*/\\1/p')
echo "token=${{#tok}}"
echo "exchange=$($N curl -s -o /dev/null -w '%{{http_code}}' --data "token=$tok" \
    {url}/api/v1/credentials/{NODE})"
$N curl -s -o /dev/null --local-port 700-710 --data "token=$tok" \
    {url}/api/v1/credentials/{NODE}; echo "bind=$?"
"""
    before = latest_id(lab.config)
    result = lab.ssh(NODE, script, timeout=60)
    seen = dict(line.split("=", 1) for line in result.stdout.split() if "=" in line)
    assert seen == {"read": "1", "mode": "600", "dir": "700", "runtime": "401",
                    "token": seen.get("token"), "exchange": "401", "bind": "45"}, result
    assert int(seen["token"]) > 60  # a fresh token was there to try
    assert refusals(lab, before) == [(NODE, "unprivileged_port", node.ipaddr)]


def test_secret_rotate_reaches_the_running_vm_without_a_reboot(
        lab, debian12_layers):
    node = lab.nodes[NODE]
    if read_status(lab.config, NODE).get("phase") != NodePhase.READY.value:
        lab.build_image(node.image)
        results = reprovision(lab.config, [NODE], timeout=900)
        assert results[0].ok, results[0].detail
    keys = host_key_dir(lab.config, NODE) / "ssh_host_ed25519_key.pub"
    old = keys.read_text()
    boot_id = ssh_until(lab, "cat /proc/sys/kernel/random/boot_id").stdout.strip()
    assert boot_id and _keyscan(lab, node) == key_of(old)
    done = process.run(provision.provisiond_cmd(lab.state, "secret", "rotate", NODE,
                                                "ssh-host-keys"), timeout=300)
    assert "rotated ssh-host-keys of 1 node(s)" in done.stdout
    new = keys.read_text()
    assert key_of(new) != key_of(old)
    # What the agent's timer starts every 5-6 minutes, started now (sshd still has the old key).
    refresh = lab.ssh(NODE, "systemctl start provisiond-agent-refresh.service && "
                            "journalctl -u provisiond-agent-refresh.service -o cat --no-pager "
                            "| grep 'runtime overlay applied'", host_key=old, timeout=120)
    assert refresh.returncode == 0 and "runtime overlay applied" in refresh.stdout, refresh
    deadline = time.monotonic() + 60
    while (seen := _keyscan(lab, node)) != key_of(new) and time.monotonic() < deadline:
        time.sleep(2)
    assert seen == key_of(new), "ssh-keyscan still sees the old host key"
    same = lab.ssh(NODE, "cat /proc/sys/kernel/random/boot_id")  # with the new key
    assert same.returncode == 0 and same.stdout.strip() == boot_id, same
    _restart_by_hand_reloads_sshd(lab, node, keys, boot_id)


def _restart_by_hand_reloads_sshd(lab, node, keys, boot_id: str) -> None:
    """Rotated again, then `systemctl restart provisiond-agent` (the boot's boot-start run
    again, as an administrator would): the new keys are installed and sshd, already
    running, is reloaded by the agent (queued without waiting: the restart must not hang on
    the services ordered after the agent), so ssh-keyscan sees the newest key; no reboot."""
    old = keys.read_text()
    done = process.run(provision.provisiond_cmd(lab.state, "secret", "rotate", NODE,
                                                "ssh-host-keys"), timeout=300)
    assert "rotated ssh-host-keys of 1 node(s)" in done.stdout
    new = keys.read_text()
    assert key_of(new) != key_of(old)
    hups = "journalctl -u ssh.service -o cat --no-pager | grep -c 'Received SIGHUP'"
    before = lab.ssh(NODE, hups, host_key=old)
    assert before.returncode in (0, 1), before  # grep -c: 1 when it counts none
    restart = lab.ssh(NODE, "timeout 120 systemctl restart provisiond-agent.service && "
                            "systemctl is-active provisiond-agent.service",
                      host_key=old, timeout=180)
    assert restart.returncode == 0 and restart.stdout.strip() == "active", restart
    # sshd's reload (a queued job, run once the restart is done) re-executes it: a
    # connection in that second is refused, so ssh is retried
    deadline = time.monotonic() + 60
    while True:
        after = ssh_until(lab, f"cat /proc/sys/kernel/random/boot_id; {hups}", seconds=60)
        assert after.returncode in (0, 1), after
        if int(after.stdout.split()[1]) > int(before.stdout.strip()) or \
                time.monotonic() > deadline:
            break
        time.sleep(2)
    assert after.stdout.split()[0] == boot_id, after
    assert int(after.stdout.split()[1]) > int(before.stdout.strip()), (before, after)
    assert _keyscan(lab, node) == key_of(new), "after the restart, sshd serves the old key"


def _keyscan(lab, node) -> str:
    result = process.run(["ssh-keyscan", "-t", "ed25519", "-T", "10", node.ipaddr],
                         netns=lab.netns, check=False, timeout=30)
    lines = [line for line in result.stdout.splitlines() if not line.startswith("#")]
    return key_of(lines[0]) if lines else ""
