"""A stand-in Redfish BMC on 127.0.0.1 (a small HTTP server of the tests' own, not a real
BMC) serving the documents in tests/fixtures/redfish: captured from sushy-tools, derived from
them, or hand-written where sushy-tools has none (see that README). It keeps just enough
state (power, boot override, task) to test the redfish driver's own logic: translation
tables, redirects, busy retries, task polling."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "redfish"
USER, PASSWORD = "root", "calvin-secret"


def load(name: str):
    return json.loads((FIXTURES / name).read_text())


EXCHANGES = {e["name"]: e for e in load("captured/exchanges.json")["exchanges"]}
SYSTEM = load("captured/system.json")["@odata.id"]
SYSTEM_BY_NAME = EXCHANGES["system_by_name"]  # sushy-tools: a domain name answers 307
UPDATE = EXCHANGES["simple_update"]  # sushy-tools: 204, the task's URL in Location
TASK = UPDATE["location"]


class FakeBmcState:
    """What the stand-in BMC holds; tests change it to stage quirks."""

    def __init__(self):
        self.system = load("captured/system.json")
        self.requests: list[tuple[str, str, dict | None]] = []
        self.busy_left = 0  # answer this many next requests with 503
        self.task_polls_running = 2
        self.task_end = "captured/task.json"
        self.extra_systems: list[str] = []
        self.without_firmware_inventory = False
        self.hanging = False
        self.raw: dict[str, bytes] = {}  # path -> a body answered with 200 (not Redfish's)
        self.hung = threading.Event()  # set once a request hangs
        self.release = threading.Event()
        # a BMC quoting the ImageURI it was given: in a 400 refusing it, in the task's end
        self.refuse_update: str | None = None  # the refusal's message, {uri} the ImageURI
        self.refuse_status = 400  # 500: a server-side error, which sushy logs and retries
        self.task_message: str | None = None  # the ended task's message, {uri} the same
        self.image_uri = ""

    def documents(self) -> dict[str, dict]:
        docs = {"/redfish/v1": load("captured/service_root.json"),
                "/redfish/v1/Systems": self._systems(), SYSTEM: self.system}
        for name in ("captured/manager.json", "captured/update_service.json"):
            doc = load(name)
            docs[doc["@odata.id"]] = doc
        if not self.without_firmware_inventory:  # sushy-tools has none: hand-written
            for name in ("firmware_inventory", "firmware_bios", "firmware_bmc"):
                doc = load(f"handwritten/{name}.json")
                docs[doc["@odata.id"]] = doc
        return docs

    def _systems(self) -> dict:
        doc = load("captured/systems.json")
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
        path = self.path.split("?")[0].rstrip("/") or "/"  # sushy-tools: /redfish/v1/
        self.state.requests.append((method, path, body))
        if self.state.hanging:
            self.state.hung.set()
            self.state.release.wait(30)
        if path != "/redfish/v1" and not self._authorized():
            return self._send(401, {"error": {"message": "Unauthorized"}})
        if path in self.state.raw:  # a web server that is no Redfish service, or broken
            return self._send_raw(self.state.raw[path])
        if self.state.busy_left > 0 and path != "/redfish/v1":
            self.state.busy_left -= 1  # sushy-tools's error document, with status 503
            return self._send(503, load("captured/error_bad_request.json"))
        self._route(method, path, body)

    def _authorized(self) -> bool:
        expected = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        return self.headers.get("Authorization") == f"Basic {expected}"

    def _route(self, method: str, path: str, body) -> None:
        docs = self.state.documents()
        if path == SYSTEM_BY_NAME["path"]:
            return self._send(SYSTEM_BY_NAME["status"], None,
                              {"Location": SYSTEM_BY_NAME["location"]})
        if method == "GET" and path in docs:
            return self._send(200, docs[path])
        if method == "GET" and path == TASK:
            return self._task()
        if method == "PATCH" and path == SYSTEM:
            self.state.system["Boot"].update(body["Boot"])
            return self._send(200, self.state.system)
        if method == "POST" and path == SYSTEM + "/Actions/ComputerSystem.Reset":
            return self._reset(body["ResetType"])
        if method == "POST" and path == UPDATE["path"]:
            return self._simple_update(body)
        self._send(404, load("captured/error_not_found.json"))

    def _reset(self, reset_type: str) -> None:
        off = reset_type in ("ForceOff", "GracefulShutdown")
        self.state.system["PowerState"] = "Off" if off else "On"
        self._send(204, None)

    def _simple_update(self, body: dict) -> None:
        self.state.image_uri = body["ImageURI"]
        if self.state.refuse_update is None:
            return self._send(UPDATE["status"], None, {"Location": TASK})
        refusal = load("captured/error_bad_request.json")  # sushy-tools's 400, reworded
        refusal["error"]["message"] = self.state.refuse_update.format(uri=body["ImageURI"])
        self._send(self.state.refuse_status, refusal)

    def _task(self) -> None:
        """Running (202, as a Redfish task monitor answers) for some polls, then the end."""
        if self.state.task_polls_running > 0:
            self.state.task_polls_running -= 1
            return self._send(202, load("derived/task_running.json"))
        task = load(self.state.task_end)
        if self.state.task_message is not None:
            task["Messages"] = [{"Message": self.state.task_message.format(
                uri=self.state.image_uri), "Severity": "OK"}]
        self._send(200, task)

    def _send_raw(self, data: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html" if data.startswith(b"<") else
                         "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

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
    """(server, state) of the stand-in Redfish BMC on 127.0.0.1 serving in a thread."""
    state = FakeBmcState()
    handler = type("BoundHandler", (Handler,), {"state": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server, state
