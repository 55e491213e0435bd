"""The status page in a real headless browser: Debian's chromium driven by Selenium through
Debian's chromedriver. For the page test and the lab's (a VM boot followed on the page).

The browser reaches nothing but the page's server: every other host name resolves to
nothing and any other address goes to a proxy on a closed loopback port, and Chromium's
background services (updates, sync, safe browsing...) are off.

    with StatusPage.open(base_url, token=None) as page:
        page.wait_for_phase("n1", "ready", timeout=60)
        page.screenshot(artifact_path("status-page.png"))  # listed at the session's end

Where the server is only reachable inside a network namespace (the VM lab), run the browser
there as a command (Selenium talks to chromedriver over the namespace's loopback):

    ip netns exec LAB python -m tests.status_page URL n1=ready n2=ready --timeout 300 \
        --token-file reader.token --screenshots test-artifacts/lab-page

It prints `following` once the page has drawn its first status (start the boot then), and at the end one JSON
line: {"nodes": {node: [every state of its row the page rendered, in order: phase, the
"Updated" time, the timeline's label (each phase with its offset), when]}, "connection",
"screenshots", "script_errors"}; exit 1 if a node did not reach its phase in time or the
page reloaded. `--screenshots PREFIX` saves PREFIX-NN-NODE-PHASE.png each time the page first
shows a followed node in a new phase, and one at the end.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

from tests.waits import wait_until

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"  # ignored by git
LOAD = 90  # seconds for the page's first status read, at most
SAVED: list[Path] = []  # screenshots of this test session, listed at its end (tests/conftest.py)
QUIET = [  # Chromium's own services that would call out: off
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-domain-reliability", "--no-pings",
    "--disable-client-side-phishing-detection", "--dns-prefetch-disable",
    "--disable-features=OptimizationHints,MediaRouter,Translate,AutofillServerCommunication",
    "--metrics-recording-only", "--no-first-run", "--no-default-browser-check",
]
RECORDER = """
if (!window.__provisiondRows) {
  const rows = window.__provisiondRows = [];
  const last = {};
  const text = (row, css) => { const e = row.querySelector(css); return e ? e.textContent : ""; };
  const note = (row) => {
    if (row.nodeType !== 1 || !row.dataset.node) return;
    const bar = row.querySelector(".timeline .bar");
    const state = {node: row.dataset.node, phase: text(row, ".phase"),
                   when: text(row, ".when"), at: Date.now() / 1000,
                   timeline: bar ? bar.getAttribute("aria-label") || "" : ""};
    const key = [state.phase, state.when, state.timeline].join("|");
    if (last[state.node] === key) return;  // the same row drawn again (the clock ticks it)
    last[state.node] = key;
    rows.push(state);
  };
  const body = document.querySelector("#nodes tbody");
  body.querySelectorAll("tr").forEach(note);
  new MutationObserver((changes) => changes.forEach((change) => change.addedNodes.forEach(note)))
    .observe(body, {childList: true});
}
"""


def only_to(host: str) -> list[str]:
    """Chromium arguments that let it reach `host` (the page's server: loopback, or an
    address in the lab's namespace) and nothing else: other names resolve to nothing,
    other addresses go to a proxy on the discard port of loopback, where nothing listens."""
    return [f"--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE {host}",
            "--proxy-server=http://127.0.0.1:9",
            f"--proxy-bypass-list={host}", *QUIET]


def missing() -> str | None:
    """Why no browser test can run here, or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} is missing (apt: chromium chromium-driver, .ci/install-deps.sh)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    return None


def phases_shown(rows: list[dict]) -> list[str]:
    """The phases in recorded row states (`StatusPage.follow`), each run of one phase once."""
    return [row["phase"] for i, row in enumerate(rows)
            if not i or rows[i - 1]["phase"] != row["phase"]]


def artifact_path(name: str) -> Path:
    """A file under test-artifacts/ (made if needed) for screenshots kept after the run."""
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS / name


class StatusPage:
    """One headless Chromium showing provisiond's status page."""

    def __init__(self, driver, base_url: str):
        self.driver = driver
        self.base_url = base_url.rstrip("/")

    @classmethod
    def open(cls, base_url: str, token: str | None = None, width: int = 1280,
             height: int = 900, phone: bool = False) -> "StatusPage":
        """Start the browser, load the page, give it `token` if one is given. `phone`: a
        touch screen `width` CSS pixels wide (a desktop window is at least 500)."""
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                         "--disable-gpu", f"--window-size={width},{height}",
                         *only_to(urlsplit(base_url).hostname)):
            options.add_argument(argument)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        if phone:
            options.add_experimental_option("mobileEmulation", {"deviceMetrics": {
                "width": width, "height": height, "pixelRatio": 2, "touch": True}})
        driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER),
                                  options=options)
        page = cls(driver, base_url)
        try:
            driver.get(page.base_url + "/")
            if token:
                page.give_token(token)
        except BaseException:
            driver.quit()
            raise
        return page

    def __enter__(self) -> "StatusPage":
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def close(self) -> None:
        self.driver.quit()

    def give_token(self, token: str) -> None:
        from selenium.webdriver.common.by import By

        field = self.driver.find_element(By.ID, "token")
        field.clear()
        field.send_keys(token)
        self.driver.find_element(By.CSS_SELECTOR, "#token-form button[type=submit]").click()

    def phases(self) -> dict[str, str]:
        """{node: phase} as the table shows them now."""
        return self.driver.execute_script(
            "const r = {}; for (const row of document.querySelectorAll('#nodes tbody tr'))"
            " r[row.dataset.node] = row.querySelector('.phase').textContent; return r;")

    def wait_for_phase(self, node: str, phase: str, timeout: float) -> None:
        wait_until(lambda: self.phases().get(node) == phase, timeout,
                   f"the page shows {node} {phase} (it shows {self.phases().get(node)!r})")

    def follow(self, until: dict[str, str], timeout: float,
               on_phase=None) -> dict[str, list[dict]]:
        """Every state of each node's row the page renders, in order (see `record`), until
        it shows each node of `until` in its phase (TimeoutError otherwise); AssertionError
        if it reloaded. `on_phase(node, phase)` is called when a followed node is first
        seen in a phase it was not in just before (e.g. to take a screenshot)."""
        self.record()
        self.mark()
        seen: dict[str, list[dict]] = {}

        def reached() -> bool:
            for row in self.recorded(sum(map(len, seen.values()))):
                rows = seen.setdefault(row["node"], [])
                if on_phase and row["node"] in until and (
                        not rows or rows[-1]["phase"] != row["phase"]):
                    on_phase(row["node"], row["phase"])
                rows.append(row)
            return all(seen.get(node, [{}])[-1].get("phase") == phase
                       for node, phase in until.items())

        try:
            wait_until(reached, timeout, f"the page shows {until}", interval=0.1)
        except TimeoutError as exc:
            shown = {node: [row["phase"] for row in rows] for node, rows in seen.items()}
            raise TimeoutError(f"{exc}; it showed {shown}") from None
        assert not self.reloaded(), "the page was reloaded"
        return seen

    def record(self) -> None:
        """From now on, note in the page every state of a node row it renders (each render
        replaces the table's rows: a MutationObserver sees every one, however soon the
        next follows, which polling from here would miss): node, phase, the Updated cell,
        the timeline bar's label and the browser's time. A reload loses the record."""
        self.driver.execute_script(RECORDER)

    def recorded(self, start: int = 0) -> list[dict]:
        """The row states noted since `record`, from the `start`th on."""
        return self.driver.execute_script(
            "return (window.__provisiondRows || []).slice(arguments[0]);", start)

    def connection(self) -> str:
        """The page's connection badge: live, polling, offline, token..."""
        return self.driver.execute_script(
            "return document.getElementById('connection').dataset.mode;")

    def mark(self) -> None:
        """Put a marker into the page's window: a reload loses it (see `reloaded`)."""
        self.driver.execute_script("window.__provisiondMark = true;")

    def reloaded(self) -> bool:
        return not self.driver.execute_script("return window.__provisiondMark === true;")

    def script_errors(self) -> list[str]:
        """Uncaught exceptions and CSP refusals the page caused (failed fetches not counted:
        an API a server does not have yet answers 404 by design)."""
        return [entry["message"] for entry in self.driver.get_log("browser")
                if entry["level"] == "SEVERE" and "Failed to load resource" not in
                entry["message"]]

    def text(self, css: str) -> str | None:
        """The shown text of the first element `css` selects (None: none), read in one
        step: the page redraws its rows every second while a boot runs, so an element
        found first and read after may be gone."""
        return self.driver.execute_script(
            "const e = document.querySelector(arguments[0]); return e ? e.innerText : null;",
            css)

    def screenshot(self, path: Path) -> Path:
        """A PNG of the whole page (beyond the window too) at `path`."""
        shot = self.driver.execute_cdp_cmd("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        SAVED.append(path)
        return path


def main(argv: list[str] | None = None) -> int:
    """Follow the page until nodes reach phases (see the module doc)."""
    parser = argparse.ArgumentParser(prog="python -m tests.status_page")
    parser.add_argument("url", help="the server's base URL, e.g. http://10.99.77.1:9873")
    parser.add_argument("expect", nargs="+", metavar="NODE=PHASE")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--token", help="a reader token, if the server asks for one")
    parser.add_argument("--token-file", type=Path, help="a file holding the reader token")
    parser.add_argument("--screenshots", metavar="PREFIX",
                        help="PNGs PREFIX-NN-NODE-PHASE.png of each new phase, and at the end")
    args = parser.parse_args(argv)
    until = dict(item.partition("=")[::2] for item in args.expect)
    token = args.token_file.read_text().strip() if args.token_file else args.token
    shots: list[str] = []

    def shoot(node: str, phase: str) -> None:
        if args.screenshots:
            name = f"{args.screenshots}-{len(shots):02d}-{node}-{phase.replace(' ', '_')}.png"
            shots.append(str(page.screenshot(Path(name))))

    with StatusPage.open(args.url, token) as page:
        # the first status read drawn (live or polling is said after it): what the caller
        # does after `following` shows as changes, never as the page's first state
        wait_until(lambda: page.connection() in ("live", "polling"), min(args.timeout, LOAD),
                   "the page loads the status")
        print("following", flush=True)
        try:
            seen = page.follow(until, args.timeout, on_phase=shoot)
        except (TimeoutError, AssertionError) as exc:
            print(exc, file=sys.stderr)
            return 1
        finally:
            shoot("end", "page")
        result = {"nodes": seen, "connection": page.connection(), "screenshots": shots,
                  "script_errors": page.script_errors()}
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
