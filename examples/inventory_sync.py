#!/usr/bin/env python3
"""Sync nodes from an inventory system's CSV export into provisiond, then boot them.

    PROVISIOND_TOKEN=... python examples/inventory_sync.py nodes.csv \
        [--url http://HOST:9873] [--build-overlays] [--power-on] [--wait 600]

What an inventory system (NetBox, a CMDB) does, with `requests` only:
1. for each CSV row, GET /api/v1/nodes/NAME: a missing node is created (POST); an existing
   one gets a merge-patch (RFC 7386) of only the fields that differ, with If-Match from its
   ETag; on 412 (someone changed it meanwhile) it is read again and patched once more;
2. --bmc-password-file: the file's first line becomes each node's bmc_password secret;
3. --build-overlays: POST /api/v1/overlays/build for the nodes, waits for the job;
4. --power-on: POST /api/v1/power (operator token) and follows GET /api/v1/events until
   every node reports `ready`, one reports `failed`, the job fails or --wait passes.

Tokens come from the environment or a file, never from the command line (argv is visible
to every user of the machine): PROVISIOND_TOKEN or --token-file (admin: the inventory),
PROVISIOND_OPERATOR_TOKEN or --operator-token-file (power, builds; default: the admin one).
Exit: 0 all done, 1 a node or job failed or the deadline passed, 2 bad input.

CSV columns (header row; an empty cell leaves that field alone): name, mac, ipaddr,
netmask, gateway, profile, image, bmc_driver, bmc_address, bmc_port, bmc_username,
bmc_scheme, bmc_system_id, bmc_cipher_suite. See inventory_sync.csv beside this file.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from urllib.parse import quote

import requests

BMC_FIELDS = ("driver", "address", "port", "username", "scheme", "system_id", "cipher_suite")
NUMBERS = {"port", "cipher_suite"}
TIMEOUT = 30  # seconds for any one request


class SyncError(Exception):
    """One line for the user; the exit code says what kind."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def desired_record(row: dict) -> dict:
    """The fields this CSV row owns, as a node record fragment."""
    netdev = {k: row[k] for k in ("mac", "ipaddr", "netmask", "gateway") if row.get(k)}
    record: dict = {"netdevs": {"eth0": netdev}} if netdev else {}
    if row.get("profile"):
        record["profiles"] = [row["profile"]]
    if row.get("image"):
        record["image"] = row["image"]
    bmc = {f: row[f"bmc_{f}"] for f in BMC_FIELDS if row.get(f"bmc_{f}")}
    for field in NUMBERS & set(bmc):
        if not bmc[field].isdigit():
            raise SyncError(f"{row['name']}: bmc_{field} {bmc[field]!r} is not a number", 2)
        bmc[field] = int(bmc[field])
    if bmc:
        record["bmc"] = bmc
    return record


def merge_patch(current: dict, desired: dict) -> dict:
    """The RFC 7386 patch that brings `current` to `desired` for the fields desired names
    (fields the CSV does not name are left alone)."""
    patch = {}
    for key, value in desired.items():
        if isinstance(value, dict) and isinstance(current.get(key), dict):
            inner = merge_patch(current[key], value)
            if inner:
                patch[key] = inner
        elif current.get(key) != value:
            patch[key] = value
    return patch


def read_csv(path: str) -> dict[str, dict]:
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise SyncError(f"{path}: {exc}", 2) from None
    nodes = {}
    for number, row in enumerate(rows, 2):
        name = (row.get("name") or "").strip()
        if not name:
            raise SyncError(f"{path}:{number}: the name column is empty or missing", 2)
        nodes[name] = desired_record({k: (v or "").strip() for k, v in row.items() if k})
    if not nodes:
        raise SyncError(f"{path}: no nodes", 2)
    return nodes


class Api:
    """The provisiond API at `url` with a bearer token."""

    def __init__(self, url: str, token: str, session: requests.Session | None = None):
        self.url = url.rstrip("/") + "/api/v1"
        self.session = session or requests.Session()
        self.headers = {"Authorization": f"Bearer {token}"}

    def call(self, method: str, path: str, ok=(200,), **kw) -> requests.Response:
        headers = {**self.headers, **kw.pop("headers", {})}
        try:
            answer = self.session.request(method, self.url + path, headers=headers,
                                          timeout=kw.pop("timeout", TIMEOUT), **kw)
        except requests.RequestException as exc:
            raise SyncError(f"{method} {path}: {exc}") from None
        if answer.status_code not in ok:
            raise SyncError(f"{method} {path}: {answer.status_code} {error_of(answer)}",
                            2 if answer.status_code in (401, 403) else 1)
        return answer


def error_of(answer: requests.Response) -> str:
    try:
        return answer.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return answer.text[:200]


def sync_node(api: Api, name: str, desired: dict) -> str:
    """Create the node or patch what differs; returns what was done."""
    for attempt in range(2):
        answer = api.call("GET", f"/nodes/{quote(name, safe='')}", ok=(200, 404))
        if answer.status_code == 404:
            api.call("POST", "/nodes", ok=(201,), json={"names": name, "record": desired})
            return "created"
        patch = merge_patch(answer.json()["record"], desired)
        if not patch:
            return "unchanged"
        answer = api.call("PATCH", f"/nodes/{quote(name, safe='')}", ok=(200, 412),
                          data=json.dumps(patch),
                          headers={"If-Match": answer.headers["ETag"],
                                   "Content-Type": "application/merge-patch+json"})
        if answer.status_code == 200:
            return "patched " + ",".join(sorted(patch)) + (" after a 412" if attempt else "")
    raise SyncError(f"{name}: changed by someone else twice while syncing (412)")


def wait_job(api: Api, job: dict, deadline: float) -> dict:
    """Poll the job until it ends (or the deadline passes)."""
    while job["state"] in ("pending", "running"):
        if time.monotonic() > deadline:
            raise SyncError(f"job {job['id']} ({job['kind']}) still {job['state']} at the deadline")
        time.sleep(0.5)
        job = api.call("GET", f"/jobs/{job['id']}").json()
    if job["state"] != "finished":
        raise SyncError(f"job {job['id']} ({job['kind']}) failed: {job.get('message')}")
    return job


def follow_events(stream: requests.Response, names: set[str], job_id: int,
                  deadline: float) -> None:
    """Read the open event stream until every node is ready; raise on a failure."""
    pending = set(names)
    try:
        for line in stream.iter_lines(chunk_size=None):
            if time.monotonic() > deadline or not note_event(line, pending, job_id):
                break
    except requests.RequestException as exc:  # broken, or quiet past the read timeout
        if time.monotonic() < deadline:
            raise SyncError(f"event stream: {exc}") from None
    if pending:
        raise SyncError(f"not ready by the deadline: {', '.join(sorted(pending))}")


def note_event(line: bytes, pending: set[str], job_id: int) -> bool:
    """Take one SSE line; False once no node is pending. Raises on a failure."""
    if line.startswith(b"data: "):
        try:
            event = json.loads(line[6:])
        except ValueError:
            raise SyncError(f"event stream: not JSON: {line[:100]!r}") from None
        data = event.get("data") or {}
        if event.get("kind") == "node.phase" and event.get("subject") in pending:
            print(f"{event['subject']}: {data.get('phase')} {data.get('detail') or ''}".rstrip())
            if data.get("phase") == "failed":
                raise SyncError(f"{event['subject']} failed: {data.get('detail')}")
            if data.get("phase") == "ready":
                pending.discard(event["subject"])
        elif event.get("kind") == "job.finished" and data.get("job") == job_id \
                and data.get("state") != "finished":
            raise SyncError(f"power job {job_id} failed: {data.get('message')}")
    return bool(pending)


def power_on(api: Api, names: list[str], wait: float) -> None:
    deadline = time.monotonic() + wait
    # opened before the power job, so no phase is missed; the server writes a keepalive
    # comment every 15 s, so a read waits at most that long past the deadline
    stream = api.call("GET", "/events", params={"kinds": "node.phase,job.finished"},
                      stream=True, timeout=(TIMEOUT, max(1.0, min(wait, 20.0))))
    try:
        job = api.call("POST", "/power", ok=(202,),
                       json={"names": ",".join(names), "action": "on"}).json()
        print(f"power job {job['id']} started")
        follow_events(stream, set(names), job["id"], deadline)
    finally:
        stream.close()


def token_from(env: str, path: str | None) -> str | None:
    if path:
        try:
            with open(path, encoding="utf-8") as handle:
                return handle.readline().strip() or None
        except OSError as exc:
            raise SyncError(f"{path}: {exc}", 2) from None
    return os.environ.get(env) or None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("csv", help="the inventory export (see inventory_sync.csv)")
    parser.add_argument("--url", default=os.environ.get("PROVISIOND_URL",
                                                        "http://127.0.0.1:9873"))
    parser.add_argument("--token-file", help="admin token file (else $PROVISIOND_TOKEN)")
    parser.add_argument("--operator-token-file",
                        help="operator token file (else $PROVISIOND_OPERATOR_TOKEN)")
    parser.add_argument("--bmc-password-file", help="set each node's bmc_password from it")
    parser.add_argument("--build-overlays", action="store_true")
    parser.add_argument("--power-on", action="store_true")
    parser.add_argument("--wait", type=float, default=600,
                        help="seconds for the builds and the boot to ready (default 600)")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> None:
    nodes = read_csv(args.csv)
    admin = token_from("PROVISIOND_TOKEN", args.token_file)
    if not admin:
        raise SyncError("no token: set PROVISIOND_TOKEN or give --token-file", 2)
    operator = token_from("PROVISIOND_OPERATOR_TOKEN", args.operator_token_file) or admin
    api = Api(args.url, admin)
    for name, desired in nodes.items():
        print(f"{name}: {sync_node(api, name, desired)}")
    names = ",".join(nodes)
    if args.bmc_password_file:
        password = token_from("", args.bmc_password_file)
        api.call("PUT", f"/secrets/nodes/{quote(names, safe='')}/bmc_password", ok=(204,),
                 json={"value": password})
    ops = Api(args.url, operator, api.session)
    if args.build_overlays:
        job = ops.call("POST", "/overlays/build", ok=(202,), params={"names": names}).json()
        wait_job(ops, job, time.monotonic() + args.wait)
        print(f"overlays built (job {job['id']})")
    if args.power_on:
        power_on(ops, list(nodes), args.wait)
        print(f"ready: {names}")


def main(argv: list[str] | None = None) -> int:
    try:
        run(parse_args(argv))
    except SyncError as exc:
        print(f"inventory_sync: {exc}", file=sys.stderr)
        return exc.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
