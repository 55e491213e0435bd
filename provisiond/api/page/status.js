// provisiond status page: reads the API with the reader token kept in sessionStorage.
// Live: the event stream (GET /api/v1/events, Server-Sent Events read through fetch() so that
// an Authorization header can be sent; EventSource cannot send one). Where the server has no
// event stream, GET /api/v1/status is polled every POLL_MS instead.
// Every value from the server reaches the page as text (textContent), never as HTML.
"use strict";

(() => {
  const TOKEN_KEY = "provisiond.token";
  const PHASES = ["dhcp", "ipxe", "kernel", "booted", "runtime", "configured", "ready", "failed"];
  const TERMINAL = new Set(["ready", "failed"]);
  const POLL_MS = 2000;
  const IMAGES_MS = 30000;
  const RETRY_MS = 3000;
  const MAX_EVENTS = 50;
  const MAX_ROWS = 500;
  const MAX_PAGES = 100;
  const LIVE_BOOT_S = 3600; // a boot not ended this long after its last phase is not drawn to now
  const MIN_AXIS_S = 10;

  const state = {
    nodes: new Map(), // name -> {node, phase, phases, boot_started, updated, detail}: every
    // node of the inventory (GET /api/v1/status lists those without a report too)
    events: [], // newest first
    images: null, // null: not loaded
    imagesNote: "",
    eventsApi: true, // GET /api/v1/events: false once it answered 404 or 405
    lastEventId: null,
    stream: null, // AbortController of the event stream being read
    wake: null,
    imagesAt: 0,
  };
  const $ = (id) => document.getElementById(id);

  // --- HTTP ---------------------------------------------------------------------------
  class HttpError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  function token() {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  }

  function headers(extra) {
    const result = Object.assign({ Accept: "application/json" }, extra || {});
    if (token()) result.Authorization = "Bearer " + token();
    return result;
  }

  async function errorOf(response) {
    let message = response.statusText || "HTTP " + response.status;
    try {
      const body = await response.json();
      const error = body && body.error;
      if (typeof error === "string") message = error;
      else if (error && error.message) message = error.message;
    } catch (ignored) {
      // not JSON: the status line says enough
    }
    return new HttpError(response.status, message);
  }

  async function getJson(path) {
    const response = await fetch(path, { headers: headers(), cache: "no-store" });
    if (!response.ok) throw await errorOf(response);
    return response.json();
  }

  // A list as the API pages it ({"items": [...], "continue": token|null}), every page
  // followed; a body of another shape is returned as it is.
  async function getAll(path) {
    let items = [];
    let next = null;
    for (let pages = 0; pages < MAX_PAGES; pages++) {
      const separator = path.includes("?") ? "&" : "?";
      const body = await getJson(next ? path + separator + "continue=" + encodeURIComponent(next) : path);
      if (!body || !Array.isArray(body.items)) return body;
      items = items.concat(body.items);
      next = body.continue;
      if (!next) break;
    }
    return items;
  }

  // --- data ---------------------------------------------------------------------------
  function nameOf(record) {
    return record && (record.node || record.name);
  }

  // Status records from either shape: {name: status} or a list of statuses.
  function statusRecords(body) {
    if (Array.isArray(body)) return body.filter((r) => r && typeof r === "object");
    if (body && typeof body === "object") {
      return Object.entries(body).map(([name, status]) => Object.assign({ node: name }, status));
    }
    return [];
  }

  async function loadStatus() {
    const fresh = new Map();
    for (const record of statusRecords(await getAll("/api/v1/status?limit=1000"))) {
      const name = nameOf(record);
      if (typeof name !== "string") continue;
      // An event may have brought a newer phase than this answer, read before it: keep it.
      const known = state.nodes.get(name);
      const newer = known && typeof known.updated === "number" && !(record.updated >= known.updated);
      fresh.set(name, newer ? known : record);
    }
    state.nodes = fresh;
    renderNodes();
  }

  async function loadImages() {
    state.imagesAt = Date.now();
    try {
      const items = await getAll("/api/v1/images?limit=1000");
      state.images = Array.isArray(items) ? items : [];
      state.imagesNote = state.images.length ? "" : "No image built yet.";
    } catch (error) {
      state.images = [];
      state.imagesNote = error.status === 404 ? "This server has no images API yet."
        : "Images: " + error.message;
    }
    renderImages();
  }

  // A node.phase event: its data may carry the whole status, or just the phase.
  function applyPhase(event) {
    const data = event.data || {};
    const name = event.subject;
    if (typeof name !== "string" || !PHASES.includes(data.phase)) return;
    const old = state.nodes.get(name) || { node: name };
    const at = typeof event.time === "number" ? event.time : Date.now() / 1000;
    // An event older than the status read (the stream opens before the status is read, and
    // a resumed stream replays what a reload already showed) must not undo it.
    if (typeof old.updated === "number" && at < old.updated) return;
    let next;
    if (data.phases && typeof data.phases === "object") {
      next = Object.assign({}, old, data, { node: name });
    } else {
      const restart = data.phase === "dhcp";
      const phases = Object.assign({}, restart ? {} : old.phases, { [data.phase]: at });
      next = Object.assign({}, old, {
        node: name, phase: data.phase, phases, updated: at,
        boot_started: restart || !old.boot_started ? at : old.boot_started,
        detail: typeof data.detail === "string" ? data.detail : old.detail,
      });
    }
    state.nodes.set(name, next);
  }

  function addEvent(event) {
    if (!event || typeof event !== "object") return;
    state.events.unshift(event);
    if (state.events.length > MAX_EVENTS) state.events.length = MAX_EVENTS;
    const kind = String(event.kind || "");
    if (kind === "node.phase") {
      applyPhase(event);
      renderNodes();
    } else if (kind === "inventory.changed" || kind === "stream.gap") {
      soon("status", loadStatus); // nodes added or removed, or phase events missed
    } else if (kind.startsWith("build.")) {
      soon("images", loadImages);
    }
    renderEvents();
  }

  const pending = {};
  function soon(key, load) {
    if (pending[key]) return;
    pending[key] = setTimeout(() => {
      delete pending[key];
      load().catch(() => {}); // the next reconnect or poll reloads it
    }, 500);
  }

  // --- the event stream ---------------------------------------------------------------
  // Opens the event stream (from the next event, or the last one seen); null when the server
  // has none (404, 405, or not an event stream); throws HttpError when refused. Opened before
  // the status is read, so that no phase reached in between is missed.
  async function openEvents() {
    state.stream = new AbortController();
    const extra = { Accept: "text/event-stream" };
    if (state.lastEventId) extra["Last-Event-ID"] = state.lastEventId;
    const response = await fetch("/api/v1/events", {
      headers: headers(extra), cache: "no-store", signal: state.stream.signal,
    });
    const stream = (response.headers.get("Content-Type") || "").startsWith("text/event-stream");
    if (response.status === 404 || response.status === 405 || (response.ok && !stream)) {
      state.stream.abort();
      state.eventsApi = false;
      renderEvents();
      return null;
    }
    if (!response.ok) throw await errorOf(response);
    return response;
  }

  // Reads Server-Sent Events until the stream ends.
  async function followEvents(response) {
    setMode("live", "live: events");
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer = (buffer + value).replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        onFrame(buffer.slice(0, end));
        buffer = buffer.slice(end + 2);
      }
    }
  }

  function onFrame(text) {
    let id = null;
    let kind = null;
    const data = [];
    for (const line of text.split("\n")) {
      if (!line || line.startsWith(":")) continue; // a comment: keep-alive
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "id") id = value;
      else if (field === "event") kind = value;
      else if (field === "data") data.push(value);
    }
    if (id !== null) state.lastEventId = id;
    if (!data.length) return;
    let event;
    try {
      event = JSON.parse(data.join("\n"));
    } catch (ignored) {
      return;
    }
    if (event && typeof event === "object" && !event.kind && kind) event.kind = kind;
    addEvent(event);
  }

  // --- the loop ------------------------------------------------------------------------
  function sleep(ms) {
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, ms);
      state.wake = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  }

  // A refused request: say why and wait for a token. True if `error` was one.
  function refused(error) {
    if (error.status !== 401 && error.status !== 403) return false;
    const why = error.status === 401
      ? "This server needs a reader token: enter it above."
      : "This token may not read the status (" + error.message + "): enter a reader token.";
    setMode("token", "token needed");
    notice(why);
    $("token").focus();
    return true;
  }

  async function run() {
    for (;;) {
      let stream = null;
      try {
        if (state.eventsApi) stream = await openEvents();
        await loadStatus();
        notice("");
      } catch (error) {
        if (state.stream) state.stream.abort();
        if (error.name === "AbortError") continue; // a new token: start again
        const needsToken = refused(error);
        if (!needsToken) setMode("offline", "offline: " + error.message + ", retrying");
        await sleep(needsToken ? 3600000 : RETRY_MS); // a token given wakes it
        continue;
      }
      if (Date.now() - state.imagesAt > IMAGES_MS || state.images === null) loadImages();
      if (stream) {
        try {
          await followEvents(stream);
          continue; // the stream ended: reload, then follow from the last event id
        } catch (error) {
          if (error.name === "AbortError") continue;
          setMode("offline", "events: " + error.message + ", retrying");
          await sleep(RETRY_MS);
          continue;
        }
      }
      setMode("polling", "polling every " + POLL_MS / 1000 + " s");
      await sleep(POLL_MS);
    }
  }

  // --- rendering -------------------------------------------------------------------------
  function el(tag, attributes, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attributes || {})) {
      if (value === null || value === undefined) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key === "style") Object.assign(node.style, value); // CSSOM: allowed by the CSP
      else node.setAttribute(key, value);
    }
    for (const child of children) if (child) node.append(child);
    return node;
  }

  function setMode(mode, text) {
    const badge = $("connection");
    badge.dataset.mode = mode;
    badge.textContent = text;
  }

  function notice(text) {
    const box = $("notice");
    box.textContent = text;
    box.hidden = !text;
  }

  function note(id, text) {
    $(id).textContent = text || "";
    $(id).hidden = !text;
  }

  function seconds(value) {
    if (value < 60) return value.toFixed(value < 10 ? 1 : 0) + " s";
    if (value < 3600) return Math.floor(value / 60) + " min " + Math.round(value % 60) + " s";
    return (value / 3600).toFixed(1) + " h";
  }

  function clock(epoch) {
    if (typeof epoch !== "number") return "";
    const date = new Date(epoch * 1000);
    const sameDay = date.toDateString() === new Date().toDateString();
    return sameDay ? date.toLocaleTimeString([], { hour12: false })
      : date.toLocaleString([], { hour12: false, dateStyle: "short", timeStyle: "short" });
  }

  function phaseBadge(phase) {
    const known = PHASES.includes(phase);
    return el("span", { class: "phase" + (known ? " phase-" + phase : " phase-none"),
                        text: known ? phase : "no report" });
  }

  // The boot's phases in time order: [[phase, epoch], ...] from its dhcp phase on.
  function steps(status) {
    const phases = status.phases && typeof status.phases === "object" ? status.phases : {};
    return Object.entries(phases)
      .filter(([phase, at]) => PHASES.includes(phase) && typeof at === "number")
      .sort((a, b) => a[1] - b[1]);
  }

  function bootSpan(status, now) {
    const list = steps(status);
    if (!list.length) return null;
    const start = typeof status.boot_started === "number" ? Math.min(status.boot_started, list[0][1])
      : list[0][1];
    const last = list[list.length - 1];
    const running = !TERMINAL.has(status.phase) && now - last[1] < LIVE_BOOT_S;
    return { list, start, end: running ? now : last[1], running };
  }

  function timeline(status, axis, now) {
    const span = bootSpan(status, now);
    const bar = el("div", { class: "bar", role: "img" });
    if (!span) {
      bar.setAttribute("aria-label", "no boot recorded");
      return el("div", { class: "timeline" }, bar, el("span", { class: "total", text: "" }));
    }
    const parts = [];
    span.list.forEach(([phase, at], i) => {
      const until = i + 1 < span.list.length ? span.list[i + 1][1] : span.end;
      const offset = at - span.start;
      const left = (100 * offset / axis).toFixed(3) + "%";
      parts.push(phase + " +" + seconds(offset));
      bar.append(el("span", {
        class: "segment phase-" + phase + (i + 1 === span.list.length ? " last" : ""),
        // A boot's last phase has no length: a mark ending where the phase was reached.
        style: until > at ? { left, width: (100 * (until - at) / axis).toFixed(3) + "%" }
          : { left: "calc(" + left + " - 3px)", width: "3px" },
        title: phase + " at +" + seconds(offset) + (until > at ? ", " + seconds(until - at) : ""),
      }));
    });
    bar.setAttribute("aria-label", parts.join(", "));
    const total = span.end - span.start; // the badge beside says which phase it ended in
    const label = seconds(total) + (span.running ? "…" : "");
    return el("div", { class: "timeline" }, bar, el("span", {
      class: "total", text: label,
      title: span.running ? "booting for " + seconds(total) : status.phase + " after " + seconds(total),
    }));
  }

  function matches(name, status, filter) {
    if (!filter) return true;
    const words = filter.toLowerCase().split(/\s+/).filter(Boolean);
    return words.every((word) => name.toLowerCase().includes(word) || status.phase === word);
  }

  function renderSummary() {
    const counts = new Map(PHASES.map((phase) => [phase, 0]));
    let none = 0;
    for (const status of state.nodes.values()) {
      if (counts.has(status.phase)) counts.set(status.phase, counts.get(status.phase) + 1);
      else none += 1;
    }
    const list = $("summary");
    list.replaceChildren(el("li", { class: "count" },
      el("strong", { text: String(state.nodes.size) }), state.nodes.size === 1 ? " node" : " nodes"));
    for (const [phase, n] of counts) {
      if (!n) continue;
      const chip = el("button", { type: "button", class: "chip phase-" + phase, "data-phase": phase },
        el("strong", { text: String(n) }), " " + phase);
      chip.addEventListener("click", () => setFilter(phase));
      list.append(el("li", null, chip));
    }
    if (none) list.append(el("li", null, el("span", { class: "chip phase-none" },
      el("strong", { text: String(none) }), " no report")));
  }

  function setFilter(text) {
    $("filter").value = $("filter").value === text ? "" : text;
    renderNodes();
  }

  function renderNodes() {
    renderSummary();
    const now = Date.now() / 1000;
    const filter = $("filter").value.trim();
    const names = [...state.nodes.keys()].sort((a, b) => a.localeCompare(b, undefined, { numeric: true }));
    const shown = names.filter((name) => matches(name, state.nodes.get(name), filter));
    let axis = MIN_AXIS_S;
    for (const name of shown.slice(0, MAX_ROWS)) {
      const span = bootSpan(state.nodes.get(name), now);
      if (span) axis = Math.max(axis, span.end - span.start);
    }
    const rows = shown.slice(0, MAX_ROWS).map((name) => {
      const status = state.nodes.get(name);
      return el("tr", { "data-node": name, "data-phase": status.phase || "" },
        el("td", { class: "name", text: name }),
        el("td", null, phaseBadge(status.phase)),
        el("td", { class: "timeline-cell" }, timeline(status, axis, now)),
        el("td", { class: "opt when", text: clock(status.updated) }),
        el("td", { class: "opt detail", text: status.detail || "", title: status.detail || null }));
    });
    $("nodes").tBodies[0].replaceChildren(...rows);
    if (!names.length) note("nodes-note", "No node in the inventory yet.");
    else if (shown.length > MAX_ROWS) {
      note("nodes-note", "Showing " + MAX_ROWS + " of " + shown.length + " nodes: filter to see others.");
    } else if (!shown.length) note("nodes-note", "No node matches the filter.");
    else note("nodes-note", "");
  }

  function eventText(event) {
    const data = event.data && typeof event.data === "object" ? event.data : {};
    if (event.kind === "node.phase") return data.phase + (data.detail ? " (" + data.detail + ")" : "");
    const text = Object.entries(data).map(([k, v]) => k + "=" + (typeof v === "object" ? JSON.stringify(v) : v)).join(" ");
    return text.length > 120 ? text.slice(0, 117) + "…" : text;
  }

  function renderEvents() {
    $("events").replaceChildren(...state.events.map((event) => el("li", { "data-kind": event.kind || "" },
      el("time", { text: clock(event.time) }),
      el("span", { class: "kind", text: String(event.kind || "event") }),
      el("span", { class: "subject", text: event.subject ? String(event.subject) : "" }),
      el("span", { class: "data", text: eventText(event) }))));
    if (state.events.length) note("events-note", "");
    else if (!state.eventsApi) note("events-note", "This server has no event stream yet: the table is polled.");
    else note("events-note", "No event since the page opened.");
  }

  function size(bytes) {
    if (typeof bytes !== "number") return "";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (bytes >= 1024 && i < units.length - 1) {
      bytes /= 1024;
      i += 1;
    }
    return bytes.toFixed(i && bytes < 10 ? 1 : 0) + " " + units[i];
  }

  function built(value) {
    if (typeof value === "number") return clock(value);
    if (typeof value !== "string") return "";
    const date = new Date(value);
    return isNaN(date) ? value : clock(date.getTime() / 1000);
  }

  function renderImages() {
    const rows = (state.images || []).filter((image) => image && typeof image === "object").map((image) => {
      const layers = Array.isArray(image.layers) ? image.layers.length : image.layers;
      const kernel = image.kernel && image.kernel.version ? "kernel " + image.kernel.version : null;
      return el("tr", { "data-image": String(image.name || "") },
        el("td", { class: "name", text: String(image.name || "?"), title: kernel }),
        el("td", { text: built(image.built_at || image.built) }),
        el("td", { text: size(image.total_size !== undefined ? image.total_size : image.size) }),
        el("td", { text: layers === undefined ? "" : String(layers) }));
    });
    $("images").tBodies[0].replaceChildren(...rows);
    note("images-note", state.imagesNote);
  }

  function renderLegend() {
    $("legend").replaceChildren(...PHASES.map((phase) => el("span", { class: "key" },
      el("span", { class: "swatch phase-" + phase }), phase)));
  }

  // --- start ---------------------------------------------------------------------------
  function useToken(value) {
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    else sessionStorage.removeItem(TOKEN_KEY);
    $("token").value = "";
    $("forget").hidden = !value;
    $("token").placeholder = value ? "token set" : "reader token";
    state.eventsApi = true; // ask again: the token may open it
    if (state.stream) state.stream.abort();
    if (state.wake) state.wake();
    loadImages();
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      useToken($("token").value.trim());
    });
    $("forget").addEventListener("click", () => useToken(""));
    $("forget").hidden = !token();
    $("token").placeholder = token() ? "token set" : "reader token";
    $("filter").addEventListener("input", renderNodes);
    renderLegend();
    renderEvents();
    // Boots in progress: their last segment grows with the clock.
    setInterval(() => {
      const now = Date.now() / 1000;
      for (const status of state.nodes.values()) {
        const span = bootSpan(status, now);
        if (span && span.running) return renderNodes();
      }
    }, 1000);
    run();
  });
})();
