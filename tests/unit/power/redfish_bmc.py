"""A tiny Redfish BMC on 127.0.0.1 that serves the captured documents in
tests/fixtures/redfish and keeps just enough state (power, boot override, task) to test the
redfish driver's own logic: translation tables, redirects, busy retries, task following."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "redfish"
SYSTEM = "/redfish/v1/Systems/System.Embedded.1"
MONITOR = "/redfish/v1/TaskService/TaskMonitors/JID_873593526120"
USER, PASSWORD = "root", "calvin-secret"


def load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


class FakeBmcState:
    """What the tiny BMC holds; tests change it to stage quirks."""

    def __init__(self):
        self.system = load("system.json")
        self.requests: list[tuple[str, str, dict | None]] = []
        self.busy_left = 0  # answer this many next requests with 503
        self.task_polls_running = 2
        self.task_end = "task_completed.json"
        self.extra_systems: list[str] = []
        self.without_firmware_inventory = False
        self.hanging = False
        self.release = threading.Event()

    def documents(self) -> dict[str, dict]:
        docs = {
            "/redfish/v1": load("service_root.json"),
            "/redfish/v1/Systems": self._systems(),
            SYSTEM: self.system,
            "/redfish/v1/Managers/iDRAC.Embedded.1": load("manager.json"),
            "/redfish/v1/UpdateService": load("update_service.json"),
        }
        if not self.without_firmware_inventory:
            for name in ("firmware_inventory.json", "firmware_bios.json", "firmware_bmc.json"):
                doc = load(name)
                docs[doc["@odata.id"]] = doc
        return docs

    def _systems(self) -> dict:
        doc = load("systems.json")
        doc["Members"] += [{"@odata.id": path} for path in self.extra_systems]
        doc["Members@odata.count"] = len(doc["Members"])
        return doc


class Handler(BaseHTTPRequestHandler):
    state: FakeBmcState

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        self._handle("GET")

    def do_POST(self):
        self._handle("POST")

    def do_PATCH(self):
        self._handle("PATCH")

    def _handle(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        path = self.path.split("?")[0].rstrip("/") or "/"
        self.state.requests.append((method, path, body))
        if self.state.hanging:
            self.state.release.wait(30)
        if path != "/redfish/v1" and not self._authorized():
            return self._send(401, {"error": {"message": "Unauthorized"}})
        if self.state.busy_left > 0 and path != "/redfish/v1":
            self.state.busy_left -= 1
            return self._send(503, load("error_busy.json"))
        self._route(method, path, body)

    def _authorized(self) -> bool:
        expected = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        return self.headers.get("Authorization") == f"Basic {expected}"

    def _route(self, method: str, path: str, body) -> None:
        docs = self.state.documents()
        if path == "/redfish/v1/Systems/n001-alias":
            return self._send(307, None, {"Location": SYSTEM})
        if method == "GET" and path in docs:
            return self._send(200, docs[path])
        if method == "GET" and path == MONITOR:
            return self._task()
        if method == "PATCH" and path == SYSTEM:
            self.state.system["Boot"].update(body["Boot"])
            return self._send(200, self.state.system)
        if method == "POST" and path == SYSTEM + "/Actions/ComputerSystem.Reset":
            return self._reset(body["ResetType"])
        if method == "POST" and path.endswith("UpdateService.SimpleUpdate"):
            return self._send(202, None, {"Location": MONITOR})
        self._send(404, {"error": {"message": f"no {method} {path}"}})

    def _reset(self, reset_type: str) -> None:
        off = reset_type in ("ForceOff", "GracefulShutdown")
        self.state.system["PowerState"] = "Off" if off else "On"
        self._send(204, None)

    def _task(self) -> None:
        if self.state.task_polls_running > 0:
            self.state.task_polls_running -= 1
            return self._send(202, load("task_running.json"))
        self._send(200, load(self.state.task_end))

    def _send(self, code: int, doc, headers: dict | None = None) -> None:
        data = json.dumps(doc).encode() if doc is not None else b""
        self.send_response(code)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if data:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def start_redfish_bmc():
    """(server, state) of a tiny Redfish BMC on 127.0.0.1 serving in a thread."""
    state = FakeBmcState()
    handler = type("BoundHandler", (Handler,), {"state": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server, state
