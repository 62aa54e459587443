"use strict";
/* The Warden dashboard: a router of views by URL hash (one function per
   view, see VIEWS) over the public API. No inline script or style (CSP). */
const base = "/api/autonomous";
const $ = (sel, root = document) => root.querySelector(sel);
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const ENDED = ["completed", "stopped", "interrupted", "failed", "paused"];
/** Reasons that read better as words; any other shows as its code. */
const REASON_TEXT = { waiting_for_children: "Waiting for its delegated tasks", parent_ended: "Its parent ended first" };
const reasonText = (reason) => (reason ? REASON_TEXT[reason] || reason : "");
/** Paused only until its children end, then it runs on by itself: the page keeps following it. */
const waitsForChildren = (s) => s.status === "paused" && s.reason === "waiting_for_children";
/** Whether nothing more happens to the session without someone acting. */
const isOver = (s) => ENDED.includes(s.status) && !waitsForChildren(s);
let stream = null;

/* ---------- the API key: asked once, kept in sessionStorage, never in a URL ---------- */
const KEY = "warden.key";
const apiKey = () => sessionStorage.getItem(KEY) || "";
const authHeaders = () => (apiKey() ? { authorization: "Bearer " + apiKey() } : {});
class Unauthorized extends Error {}

function showLogin(message) {
  closeStream();
  $("#app").replaceChildren($("#login-view").content.cloneNode(true));
  $("#login-error").textContent = message || "";
  $("#login-form").onsubmit = (e) => {
    e.preventDefault();
    sessionStorage.setItem(KEY, $("#api-key").value.trim());
    route();
  };
  $("#api-key").focus();
}

function showKey() {
  const k = apiKey();
  $("#key-shown").textContent = k ? "key " + k.slice(0, 12) + "…" : "";
  $("#logout-btn").hidden = !k;
}
$("#logout-btn").onclick = () => { sessionStorage.removeItem(KEY); showKey(); showLogin(""); };

async function api(path, options = {}) {
  const res = await fetch(base + path, { ...options, headers: { "content-type": "application/json", ...authHeaders(), ...(options.headers || {}) } });
  const body = await res.json().catch(() => null);
  if (res.status === 401) {
    const had = apiKey();
    sessionStorage.removeItem(KEY);
    showKey();
    showLogin(had ? "That key was refused (unknown, revoked or mistyped)." : "This Warden needs an API key.");
    throw new Unauthorized((body && body.detail) || "unauthorized");
  }
  if (!res.ok) throw new Error((body && body.detail) || res.statusText);
  return body;
}

/** Server-Sent Events read with fetch, since EventSource cannot send an
 *  Authorization header. Same surface as EventSource: addEventListener, close;
 *  reconnects with Last-Event-ID like it. */
class KeyedStream {
  constructor(url) { this.url = url; this.listeners = {}; this.lastId = null; this.ctl = null; this.closed = false; this.run(); }
  addEventListener(type, fn) { (this.listeners[type] ||= []).push(fn); }
  close() { this.closed = true; if (this.ctl) this.ctl.abort(); }
  async run() {
    while (!this.closed) {
      this.ctl = new AbortController();
      try {
        const headers = { accept: "text/event-stream", ...authHeaders() };
        if (this.lastId !== null) headers["last-event-id"] = this.lastId;
        const res = await fetch(this.url, { headers, signal: this.ctl.signal });
        if (res.status === 401) { this.closed = true; showLogin("That key was refused."); return; }
        if (!res.ok || !res.body) throw new Error(res.statusText);
        const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += value.replace(/\r\n?/g, "\n");
          let end;
          while ((end = buf.indexOf("\n\n")) >= 0) { this.dispatch(buf.slice(0, end)); buf = buf.slice(end + 2); }
        }
      } catch (err) { if (this.closed) return; }
      if (!this.closed) await new Promise((r) => setTimeout(r, 1000));
    }
  }
  dispatch(frame) {
    let type = "message", data = [];
    for (const line of frame.split("\n")) {
      if (line.startsWith(":")) continue;
      const i = line.indexOf(":");
      const field = i < 0 ? line : line.slice(0, i);
      const value = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
      if (field === "event") type = value; else if (field === "data") data.push(value); else if (field === "id") this.lastId = value;
    }
    if (!data.length) return;
    // "*" hears every event (the timeline), with its type.
    for (const fn of [...(this.listeners[type] || []), ...(this.listeners["*"] || [])]) fn({ type, data: data.join("\n"), lastEventId: this.lastId });
  }
}

function closeStream() { if (stream) { stream.close(); stream = null; } }
/** Shows an error in `sel`, unless the key was refused (the login form is shown instead). */
function say(sel, err) { if (!(err instanceof Unauthorized) && $(sel)) $(sel).textContent = err.message; }


/* ---------- the router: one function per view, chosen by the URL hash ---------- */
const STATUSES = ["queued", "running", "awaiting_refinement", "awaiting_confirmation", "paused", "completed", "stopped", "interrupted", "failed"];
const SESSION_TABS = ["overview", "iterations", "decisions", "timeline", "checkpoints", "files"];
/** [pattern, view]: the first pattern matching the hash's path wins; its groups and the hash's query are the view's arguments. */
const VIEWS = [
  [/^\/s\/([0-9a-f-]{36})(?:\/(iterations|decisions|timeline|checkpoints|files)(?:\/(\d+))?)?$/, (m) => showSession(m[1], m[2] || "overview", m[3] ? Number(m[3]) : null)],
  [/^\/new$/, () => showList(new URLSearchParams(), true)],
  [/^\/approvals$/, () => showApprovals()],
  [/^\/?$/, (m, query) => showList(query, false)],
];

function route() {
  closeStream();
  showKey();
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, qs] = hash.split("?");
  const query = new URLSearchParams(qs || "");
  for (const [pattern, view] of VIEWS) {
    const m = path.match(pattern);
    if (m) { view(m, query); return; }
  }
  showList(new URLSearchParams(), false);
}

/** Sets a bar's fill from JS (the CSP allows no inline style attribute). */
function setBar(el, pct) { if (el) el.style.width = pct + "%"; }

/* ---------- list ---------- */
const DEFAULT_STEPS = [
  { action: "plan", tokens: 50, output: "outline the README", delay_ms: 800 },
  { action: "write_file", arguments: { path: "README.md" }, tokens: 120, output: "wrote README.md", delay_ms: 800 },
  { action: "report", tokens: 30, output: "done\n<<WARDEN_GOAL_DONE: README.md written>>" } ];

/** Percent complete, 0–100, as shown both in numbers and as a bar. */
function percentOf(s) {
  const raw = s.status === "completed" ? 100 : s.percent_complete || 0;
  return Math.min(100, Math.max(0, Math.round(raw)));
}

/* Goals of parent sessions, by id, as read for "child of …" (a goal never changes but by refinement; a stale one is harmless). */
const parentGoals = new Map();
/* Parents whose goal was asked for (read, in flight or failed): each is asked once. */
const parentsAsked = new Set();

/** A parent's goal, shortened, or its id's start until the goal is read. */
function parentLabel(parentId) {
  const goal = parentGoals.get(parentId);
  return goal ? (goal.length > 60 ? goal.slice(0, 59) + "…" : goal) : parentId.slice(0, 8) + "…";
}

/** "child of <parent's goal>", a link to the parent. */
function childOf(parentId) {
  if (!parentId) return "";
  return `<span class="muted child-of">child of <a href="#/s/${esc(parentId)}" data-parent="${esc(parentId)}">${esc(parentLabel(parentId))}</a></span>`;
}

/** Reads the goals of the parents linked under `root` that are not known yet, and writes them into every link to them. */
async function resolveParents(root = document) {
  const ids = [...new Set([...root.querySelectorAll("a[data-parent]")].map((a) => a.dataset.parent))].filter((id) => !parentsAsked.has(id));
  ids.forEach((id) => parentsAsked.add(id));
  await Promise.all(ids.map(async (id) => {
    try { parentGoals.set(id, (await api(`/${id}`)).goal); } catch (_) { return; }
    for (const a of document.querySelectorAll(`a[data-parent="${id}"]`)) { a.textContent = parentLabel(id); a.title = parentGoals.get(id); }
  }));
}

function sessionRow(s) {
  const label = s.status === "queued" && s.queue_position ? `queued #${s.queue_position}` : s.status;
  return `<td><span class="badge s-${esc(s.status)}">${esc(label)}</span></td><td><a class="sess-link" href="#/s/${esc(s.id)}">${esc(s.goal)}</a>${childOf(s.parent_id)}</td>
    <td><div class="bar bar-cell"><div></div></div></td><td>${s.iterations}</td><td class="hide-narrow">${s.tokens_used}</td>
    <td class="muted hide-narrow">${new Date(s.created_at).toLocaleString()}</td>`;
}

/** Whether a session passes the list's filters (for sessions the live stream brings in). */
function passes(s, f) {
  if (f.get("status") && s.status !== f.get("status")) return false;
  if (f.get("root_only") === "true" && s.parent_id) return false;
  if (f.get("mode") && s.mode !== f.get("mode")) return false;
  if (f.get("executor") && (s.executor || {}).kind !== f.get("executor")) return false;
  if (f.get("q") && !s.goal.toLowerCase().includes(f.get("q").toLowerCase())) return false;
  if (f.get("created_from") && Date.parse(s.created_at) < Date.parse(f.get("created_from"))) return false;
  if (f.get("created_before") && Date.parse(s.created_at) >= Date.parse(f.get("created_before"))) return false;
  return true;
}

function upsertRow(s, prepend) {
  const body = $("#sessions");
  if (!body) return;
  let tr = body.querySelector(`tr[data-id="${s.id}"]`);
  if (!tr) {
    tr = document.createElement("tr"); tr.dataset.id = s.id;
    tr.onclick = (e) => { if (e.target.tagName !== "A") location.hash = "#/s/" + s.id; };
    if (prepend) body.prepend(tr); else body.append(tr);
  }
  tr.dataset.status = s.status;
  tr.innerHTML = sessionRow(s);
  setBar(tr.querySelector(".bar > div"), percentOf(s));
  if (s.parent_id && !parentsAsked.has(s.parent_id)) resolveParents(tr);
}

const FILTER_KEYS = ["status", "mode", "executor", "q", "created_from", "created_before", "sort", "order", "root_only"];
/** The list's URL for these filters (and paging). */
function listHash(params) {
  const p = new URLSearchParams();
  for (const [k, v] of params) if (v) p.set(k, v);
  const s = p.toString();
  return "#/" + (s ? "?" + s : "");
}
/** A datetime-local value (local time) as RFC 3339, and back. */
const toIso = (local) => (local ? new Date(local).toISOString() : "");
const toLocal = (iso) => {
  if (!iso) return "";
  const d = new Date(iso);
  if (isNaN(d)) return "";
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
};

async function showList(query, focusCreate) {
  const app = $("#app");
  app.replaceChildren($("#list-view").content.cloneNode(true));
  setupCreateForm();
  if (focusCreate) { $("#create-section").open = true; $("#goal").focus(); }
  // Filters: the URL is the state; the form writes the URL.
  const filters = new URLSearchParams();
  for (const k of FILTER_KEYS) if (query.get(k)) filters.set(k, query.get(k));
  $("#f-status").insertAdjacentHTML("beforeend", STATUSES.map((s) => `<option>${s}</option>`).join(""));
  $("#f-q").value = filters.get("q") || "";
  $("#f-status").value = filters.get("status") || "";
  $("#f-mode").value = filters.get("mode") || "";
  $("#f-executor").value = filters.get("executor") || "";
  $("#f-from").value = toLocal(filters.get("created_from"));
  $("#f-before").value = toLocal(filters.get("created_before"));
  $("#f-sort").value = filters.get("sort") || "created";
  $("#f-order").value = filters.get("order") || "desc";
  $("#f-root").checked = filters.get("root_only") === "true";
  $("#filter-form").onsubmit = (e) => {
    e.preventDefault();
    location.hash = listHash([["status", $("#f-status").value], ["mode", $("#f-mode").value], ["executor", $("#f-executor").value],
      ["q", $("#f-q").value.trim()], ["created_from", toIso($("#f-from").value)], ["created_before", toIso($("#f-before").value)],
      ["sort", $("#f-sort").value === "created" ? "" : $("#f-sort").value], ["order", $("#f-order").value === "desc" ? "" : $("#f-order").value],
      ["root_only", $("#f-root").checked ? "true" : ""]]);
  };
  // A toggle acts at once, keeping whatever else the form says.
  $("#f-root").onchange = () => $("#filter-form").requestSubmit();
  // Cursor pages: `cursor` is this page's start; `prev` the earlier starts, so Previous walks back.
  const cursor = query.get("cursor") || "";
  const prev = (query.get("prev") || "").split(",").filter(Boolean);
  const api_q = new URLSearchParams(filters);
  api_q.set("limit", query.get("limit") || "25");
  if (cursor) api_q.set("cursor", cursor);
  let page;
  try {
    page = await api("?" + api_q.toString());
  } catch (err) { say("#create-error", err); if (err instanceof Unauthorized) return; page = { items: [], next_cursor: null }; }
  page.items.forEach((s) => upsertRow(s, false));
  if (!page.items.length) $("#sessions").innerHTML = `<tr><td colspan="6" class="muted">No session matches.</td></tr>`;
  const base_params = [...filters];
  const keep = query.get("limit") ? [["limit", query.get("limit")]] : [];
  const nextLink = $("#next-page"), prevLink = $("#prev-page");
  nextLink.hidden = !page.next_cursor;
  if (page.next_cursor) nextLink.href = listHash([...base_params, ...keep, ["cursor", page.next_cursor], ["prev", [...prev, cursor || "first"].join(",")]]);
  prevLink.hidden = !cursor;
  if (cursor) {
    const back = prev.slice(0, -1), start = prev[prev.length - 1];
    prevLink.href = listHash([...base_params, ...keep, ["cursor", start === "first" ? "" : start], ["prev", back.join(",")]]);
  }
  $("#page-info").textContent = `page ${prev.length + 1}`;
  loadCounts(filters);
  // Live: rows change in place; new sessions join the first page of the newest-first order.
  const liveNew = !cursor && (filters.get("order") || "desc") === "desc";
  let countsTimer = null;
  stream = new KeyedStream(base + "/events");
  stream.addEventListener("session", (e) => {
    const s = JSON.parse(e.data);
    const shown = $("#sessions") && $("#sessions").querySelector(`tr[data-id="${s.id}"]`);
    if (shown || (liveNew && passes(s, filters))) {
      if (!shown && $("#sessions").querySelector("td[colspan]")) $("#sessions").innerHTML = "";
      upsertRow(s, true);
    }
    if (!countsTimer) countsTimer = setTimeout(() => { countsTimer = null; loadCounts(filters); }, 500);
  });
  loadQueues();
}

/** Live counts per status under the other filters; each a link that filters by it. */
async function loadCounts(filters) {
  const nav = $("#counts");
  if (!nav) return;
  const q = new URLSearchParams(filters);
  q.delete("status"); q.delete("sort"); q.delete("order");
  try {
    const c = await api("/counts?" + q.toString());
    const current = filters.get("status") || "";
    const link = (status, label, n) => {
      const p = new URLSearchParams(filters);
      if (status) p.set("status", status); else p.delete("status");
      return `<a class="chip" data-status="${status}" href="${listHash([...p])}" aria-current="${current === status}">${label} <b data-count>${n}</b></a>`;
    };
    nav.innerHTML = link("", "all", c.total) + STATUSES.filter((s) => c.by_status[s] || s === current).map((s) => link(s, s.replace("_", " "), c.by_status[s] || 0)).join("");
  } catch (_) { /* the list itself says what failed */ }
}

/** One scripted step's row in the steps editor. */
function stepRow(step) {
  const div = document.createElement("div");
  div.className = "step";
  div.innerHTML = `<input aria-label="Action" class="st-action" placeholder="action" required>
    <input aria-label="Tokens" class="st-tokens" type="number" min="0" placeholder="tokens">
    <input aria-label="Output" class="st-output" placeholder="output">
    <input aria-label="Delay (ms)" class="st-delay" type="number" min="0" placeholder="delay ms">
    <button type="button" class="st-remove" aria-label="Remove step">✕</button>`;
  $(".st-action", div).value = step.action || "";
  $(".st-tokens", div).value = step.tokens ?? "";
  $(".st-output", div).value = step.output || "";
  $(".st-delay", div).value = step.delay_ms ?? "";
  div.dataset.arguments = step.arguments ? JSON.stringify(step.arguments) : "";
  $(".st-remove", div).onclick = () => div.remove();
  return div;
}

/** The executor the form's fields describe, or the advanced JSON when given. */
function executorFromForm() {
  const kind = $("#executor-kind").value;
  const raw = $("#executor-config").value.trim();
  if (raw) {
    try { return { kind, ...JSON.parse(raw) }; } catch (err) { throw new Error("executor settings are not valid JSON: " + err.message); }
  }
  const spec = { kind };
  if (kind === "scripted") {
    spec.steps = [...document.querySelectorAll("#steps-editor .step")].map((row) => {
      const step = { action: $(".st-action", row).value.trim() };
      const num = (sel, key) => { const v = $(sel, row).value; if (v !== "") step[key] = Number(v); };
      num(".st-tokens", "tokens"); num(".st-delay", "delay_ms");
      if ($(".st-output", row).value) step.output = $(".st-output", row).value;
      if (row.dataset.arguments) step.arguments = JSON.parse(row.dataset.arguments);
      return step;
    });
  } else if (kind === "llm") {
    if ($("#llm-model").value.trim()) spec.model = $("#llm-model").value.trim();
    if ($("#llm-base-url").value.trim()) spec.base_url = $("#llm-base-url").value.trim();
  } else if (kind === "webhook") {
    spec.url = $("#webhook-url").value.trim();
  } else if (kind === "worker") {
    spec.queue = $("#worker-queue").value.trim();
  }
  return spec;
}

function setupCreateForm() {
  const kind = $("#executor-kind");
  const showKind = () => document.querySelectorAll(".exec-fields").forEach((el) => { el.hidden = el.dataset.kind !== kind.value; });
  kind.onchange = showKind; showKind();
  DEFAULT_STEPS.forEach((s) => $("#steps-editor").append(stepRow(s)));
  $("#add-step-btn").onclick = () => { const row = stepRow({}); $("#steps-editor").append(row); $(".st-action", row).focus(); };
  const lines = (sel) => $(sel).value.split("\n").map((l) => l.trim()).filter(Boolean);
  const createBody = () => {
    const limits = {};
    const num = (id, key) => { const v = $(id).value; if (v) limits[key] = Number(v); };
    num("#max-iterations", "max_iterations"); num("#max-tokens", "max_tokens"); num("#max-wall", "max_wall_time_ms");
    // Money stays a decimal string end to end: never a float.
    const usd = $("#max-cost").value.trim();
    if (usd) limits.max_cost_usd = usd;
    const body = { goal: $("#goal").value, limits, executor: executorFromForm() };
    if ($("#mode").value) body.mode = $("#mode").value;
    if (lines("#criteria-input").length) body.success_criteria = lines("#criteria-input");
    if (lines("#milestones-input").length) body.milestones = lines("#milestones-input");
    if (lines("#subgoals-input").length) body.subgoals = lines("#subgoals-input");
    const confirm = {};
    if ($("#confirm-cost").value.trim()) confirm.cost_usd = $("#confirm-cost").value.trim();
    if ($("#confirm-minutes").value) confirm.minutes = Number($("#confirm-minutes").value);
    if (Object.keys(confirm).length) body.confirm_if_over = confirm;
    return body;
  };
  $("#create-form").onsubmit = async (e) => {
    e.preventDefault();
    $("#create-error").textContent = "";
    try {
      const s = await api("", { method: "POST", body: JSON.stringify(createBody()) });
      location.hash = "#/s/" + s.id;
    } catch (err) { say("#create-error", err); }
  };
  // The estimate as you type: the create body sent to /estimate, at most once per pause in typing.
  let timer = null, asked = 0;
  const estimateSoon = () => {
    clearTimeout(timer);
    timer = setTimeout(async () => {
      const line = $("#estimate-line");
      if (!line) return;
      if (!$("#goal").value.trim()) { line.textContent = "Estimate: type a goal"; return; }
      const mine = ++asked;
      try {
        let body;
        try { body = createBody(); } catch (_) { return; }
        const e = await api("/estimate", { method: "POST", body: JSON.stringify(body) });
        if (mine === asked) line.textContent = "Estimate: " + estimateText(e);
      } catch (err) { if (mine === asked && !(err instanceof Unauthorized)) line.textContent = "Estimate: " + err.message; }
    }, 400);
  };
  ["#goal", "#criteria-input", "#max-iterations", "#max-tokens", "#max-wall", "#executor-kind", "#llm-model", "#confirm-cost", "#confirm-minutes"]
    .forEach((sel) => { const el = $(sel); if (el) el.addEventListener("input", estimateSoon); });
}

/** An estimate as one line: p50 – p90 of cost, time, iterations and tokens, and what it rests on. */
function estimateText(e) {
  if (!e) return "—";
  if (e.basis === "none") {
    return "no history like it yet (basis: none), so the cost is unknown; the figures would be the limits: "
      + `${e.iterations.p90} iterations, ${e.tokens.p90} tokens, ${fmtSecs(e.duration_ms.p90 / 1000)}`;
  }
  const cost = e.cost_usd ? `$${e.cost_usd.p50} – $${e.cost_usd.p90}` : "cost unknown";
  return `${cost} · ${fmtSecs(e.duration_ms.p50 / 1000)} – ${fmtSecs(e.duration_ms.p90 / 1000)} · `
    + `${e.iterations.p50} – ${e.iterations.p90} iterations · ${e.tokens.p50} – ${e.tokens.p90} tokens `
    + `(from ${e.sessions_used} past sessions, ${e.basis.replace("_", " ")})`;
}

/** Why a session waits for confirmation, as words. */
function overText(over) {
  const words = { cost_usd: "cost", minutes: "time", unknown: "unknown (no history)" };
  return (over || []).map((o) => words[o] || o).join(", ");
}
/** Worker queues: depth, oldest wait, workers seen; read again every few seconds while shown. */
async function loadQueues() {
  const body = $("#queues");
  if (!body) return;
  try {
    const res = await fetch("/api/workers/queues", { headers: authHeaders() });
    if (!res.ok) return;
    const { queues } = await res.json();
    body.innerHTML = queues.map((q) =>
      `<tr><td><code>${esc(q.queue)}</code></td><td>${q.depth}</td>` +
      `<td>${q.oldest_task_age_ms == null ? "—" : fmtSecs(q.oldest_task_age_ms / 1000)}</td>` +
      `<td>${q.workers.length ? q.workers.map((w) => esc(w.worker)).join(", ") : '<span class="muted">none</span>'}</td></tr>`).join("");
    $("#no-queues").hidden = queues.length > 0;
  } catch (_) { return; }
  setTimeout(() => { if ($("#queues") === body) loadQueues(); }, 5000);
}

/* ---------- session ---------- */
function fmtSecs(s) {
  if (s == null) return "—";
  s = Math.round(s);
  return s >= 3600 ? `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min` : s >= 60 ? `${Math.floor(s / 60)} min ${s % 60} s` : `${s} s`;
}

/** Seconds with a tenth below ten, so a short ETA or a young step does not read 0. */
function fmtShort(s) {
  if (s == null) return "—";
  return s < 10 ? `${s.toFixed(1)} s` : fmtSecs(s);
}

/* The figures of the status last shown and when it arrived: the step timer,
   running time and ETA tick on from them between reads, on the client's own
   monotonic clock (so a skewed client clock does not matter). */
let live = null;

function tickLive() {
  if (!live || !$("#step-elapsed")) return;
  const s = live.s;
  const dt = performance.now() - live.at;
  $("#elapsed").textContent = fmtSecs((s.elapsed_ms + dt) / 1000);
  const step = s.current_step;
  $("#current-step").hidden = !step;
  if (!step) return;
  const spent = step.elapsed_ms + dt;
  $("#step-n").textContent = "#" + step.iteration;
  $("#step-action").textContent = step.action || "…";
  $("#step-elapsed").textContent = fmtShort(spent / 1000);
  const b = s.eta_basis;
  if (b) {
    // The server's rule: what the step in flight has left of a median step, then a median step each.
    const ms = Math.max(0, b.median_step_ms - spent) + Math.max(0, b.steps_left - 1) * b.median_step_ms;
    $("#eta").textContent = fmtShort(ms / 1000);
    $("#eta").title = `median step ${b.median_step_ms} ms × ${b.steps_left} step(s) left (by ${b.source.replace("_", " ")})`;
  }
}
setInterval(tickLive, 200);

function renderChecklist(ul, items) {
  ul.innerHTML = items.length ? items.map((i) => `<li class="${i.done ? "done" : ""}">${esc(i.text)}${i.done_at_iteration ? ` <span class="muted">(#${i.done_at_iteration})</span>` : ""}</li>`).join("")
    : `<li class="muted none">none</li>`;
}

function renderVelocity(points) {
  const svg = $("#velocity");
  if (!svg) return;
  if (!points || !points.length) { svg.innerHTML = `<text x="10" y="60" fill="#5f6b7a" font-size="12">no iterations yet</text>`; return; }
  const max = Math.max(...points.map((p) => p.iterations), 1);
  // One bar per minute, at most 30 units wide so a young session does not look like a wall.
  const w = Math.min(300 / points.length, 30);
  svg.innerHTML = `<text x="298" y="12" text-anchor="end" fill="#5f6b7a" font-size="10">max ${max}/min</text>` + points.map((p, i) => {
    const h = (p.iterations / max) * 90;
    return `<rect x="${i * w + 1}" y="${110 - h}" width="${Math.max(w - 2, 1)}" height="${h}" fill="#2457c5"><title>${new Date(p.minute).toLocaleTimeString()}: ${p.iterations}/min</title></rect>`;
  }).join("") + `<line x1="0" y1="110" x2="300" y2="110" stroke="#d9dee5"/>`;
}

// Soft budgets: the highest threshold each budget has crossed, as a badge.
function renderBudgetWarnings(warnings) {
  const highest = new Map();
  for (const w of warnings) highest.set(w.budget, w);
  $("#budget-warnings").innerHTML = [...highest.values()].map(w =>
    `<span class="badge warn" title="${esc(w.used)} of ${esc(w.limit)}, at iteration ${w.iteration}">${esc(w.budget.replace("_", " "))} ${w.threshold}%</span>`).join("");
}

function renderSession(s) {
  // A read that was in flight when the person opened another session must not paint over it.
  if (!$("#status") || s.id !== shown.id) return;
  current = s;
  $("#status").textContent = s.status === "queued" && s.queue_position ? `queued (#${s.queue_position} in the queue)` : s.status;
  $("#status").className = "badge s-" + s.status;
  $("#reason").textContent = reasonText(s.reason);
  $("#reason").dataset.reason = s.reason || "";
  renderParentLine(s);
  renderForkedLine(s);
  renderBudgetWarnings(s.budget_warnings || []);
  $("#goal-text").textContent = s.goal;
  $("#summary").textContent = s.summary || s.question || "";
  const pct = percentOf(s);
  setBar($("#progress-bar"), pct);
  $("#percent").textContent = pct + "%";
  $("#eta").textContent = s.status === "running" ? fmtShort(s.eta_seconds) : "—";
  $("#eta").title = s.eta_basis ? "" : "from the progress rate";
  const left = Math.max(0, s.limits.max_tokens - s.tokens_used);
  const proj = $("#projection");
  proj.textContent = s.projected_tokens_to_finish == null ? "to finish —"
    : `to finish ≈ ${s.projected_tokens_to_finish} tokens` +
      (s.projected_cost_to_finish_usd == null ? "" : ` ($${s.projected_cost_to_finish_usd})`) +
      ` · ${left} left`;
  proj.classList.toggle("error", s.projected_tokens_to_finish > left);
  const b = s.projection_basis;
  proj.title = b ? `${b.percent_complete}% complete after ${b.tokens} tokens and ${b.iterations} iterations` : "";
  $("#iterations-count").textContent = s.iterations;
  $("#tokens").textContent = s.tokens_used;
  // An exact decimal string; steps no price entry priced are flagged, not 0.
  $("#cost").textContent = s.cost_usd == null ? "—"
    : "$" + s.cost_usd + (s.limits.max_cost_usd ? ` of $${s.limits.max_cost_usd}` : "") +
      (s.unpriced_steps > 0 ? ` + ${s.unpriced_steps} unpriced` : "");
  $("#elapsed").textContent = fmtSecs(s.elapsed_ms / 1000);
  live = s.status === "running" ? { s, at: performance.now() } : null;
  $("#current-step").hidden = !live || !s.current_step || !!s.waiting_for_worker;
  const ww = s.waiting_for_worker;
  $("#waiting-worker").hidden = !ww;
  if (ww) {
    $("#ww-queue").textContent = ww.queue;
    $("#ww-tenant").textContent = ww.tenant;
    $("#ww-seen").textContent = ww.last_worker_seen_at
      ? "a worker of it last polled " + fmtSecs((Date.now() - Date.parse(ww.last_worker_seen_at)) / 1000) + " ago"
      : "no worker of that tenant has polled that queue";
    $("#ww-for").textContent = fmtSecs((Date.now() - Date.parse(ww.since)) / 1000);
  }
  tickLive();
  $("#cycle").textContent = `${s.cycle} / ${s.limits.max_cycles}`;
  $("#errors").textContent = s.consecutive_errors
    + (s.attempts > 0 ? ` · ${s.attempts} attempt(s) without progress${s.last_error ? ", last: " + s.last_error : ""}` : "");
  if ($("#criteria")) renderChecklist($("#criteria"), s.success_criteria || []);
  if ($("#milestones")) renderChecklist($("#milestones"), s.milestones || []);
  if (s.velocity) renderVelocity(s.velocity);
  // The server says what the session's state allows, by the rules it applies.
  const allowed = new Set(s.allowed_actions || []);
  $("#stop-btn").disabled = !allowed.has("stop");
  $("#pause-btn").disabled = !allowed.has("pause");
  $("#resume-btn").disabled = !allowed.has("resume");
  const confirming = s.status === "awaiting_confirmation" && s.confirmation;
  $("#confirmation").hidden = !confirming;
  if (confirming) {
    $("#confirm-over").textContent = overText(s.confirmation.over);
    $("#confirm-estimate").textContent = estimateText(s.confirmation.estimate);
    $("#confirm-expires").textContent = new Date(s.confirmation.expires_at).toLocaleString();
  }
  $("#confirm-btn").disabled = !allowed.has("confirm");
  const waiting = s.status === "awaiting_refinement" && s.refinement;
  $("#refinement").hidden = !waiting;
  if (waiting) {
    $("#suggested-goal").textContent = s.refinement.suggested_goal;
    $("#matched").textContent = `(${(s.refinement.matched_patterns || []).join(", ")}; confidence ${s.refinement.confidence})`;
  }
  renderPendingCalls(s);
  renderWhyEnded(s);
  drawCharts();
}

/* ---------- approvals ---------- */
/** The arguments of a call as the editor shows them: indented JSON. */
function argumentsText(args) { return JSON.stringify(args ?? {}, null, 2); }

/** One waiting call as table cells: its arguments in an editable box (an
 *  approval runs with what it holds), a message box and Approve / Reject. */
function approvalCells(a) {
  const expires = new Date(a.expires_at).toLocaleString();
  const text = argumentsText(a.arguments);
  const rows = Math.min(12, Math.max(2, text.split("\n").length));
  return `<td><code>${esc(a.call_id)}</code></td><td><code>${esc(a.tool)}</code></td>
    <td><textarea class="approval-arguments" rows="${rows}" spellcheck="false" aria-label="Arguments of call ${esc(a.call_id)} (edit before approving to run it with yours)">${esc(text)}</textarea></td>
    <td>${esc(a.reason)}</td><td class="muted">${esc(expires)}</td>
    <td><div class="row"><input class="approval-message" placeholder="Message to the agent (optional)" aria-label="Message to the agent">
      <button class="primary approve-btn" type="button">Approve</button><button class="danger reject-btn" type="button">Reject</button></div></td>`;
}

/** Wires the buttons of a row for call `a`; `done` runs after a decision.
 *  Approve sends the edited arguments only when the box was changed. */
function wireDecision(tr, a, errorSel, done) {
  const decide = async (decision) => {
    $(errorSel).textContent = "";
    const message = tr.querySelector(".approval-message").value.trim();
    const body = { decision, ...(message ? { message } : {}) };
    const box = tr.querySelector(".approval-arguments");
    if (decision === "approve" && box.value.trim() !== argumentsText(a.arguments)) {
      let edited;
      try { edited = JSON.parse(box.value); } catch (err) { say(errorSel, new Error(`the arguments are not JSON: ${err.message}`)); return; }
      if (!edited || typeof edited !== "object" || Array.isArray(edited)) { say(errorSel, new Error("the arguments must be a JSON object")); return; }
      body.arguments = edited;
    }
    try {
      const s = await api(`/${a.session_id}/approvals/${encodeURIComponent(a.call_id)}`, { method: "POST", body: JSON.stringify(body) });
      done(s);
    } catch (err) { say(errorSel, err); }
  };
  tr.querySelector(".approve-btn").onclick = () => decide("approve");
  tr.querySelector(".reject-btn").onclick = () => decide("reject");
}

/** The session's calls waiting for a person, each with Approve / Reject. */
function renderPendingCalls(s) {
  const pending = s.pending_approvals || [];
  $("#pending-approvals").hidden = !pending.length;
  const calls = $("#pending-calls");
  const listed = [...calls.querySelectorAll("tr")].map((tr) => tr.dataset.call).join(",");
  if (listed === pending.map((a) => a.call_id).join(",")) return;
  calls.replaceChildren();
  for (const a of pending) {
    const tr = document.createElement("tr");
    tr.dataset.call = a.call_id;
    tr.innerHTML = approvalCells(a);
    wireDecision(tr, a, "#control-error", (after) => { renderSession(after); if (after.status === "running") showSession(s.id, "overview", null); });
    calls.append(tr);
  }
}

/** The approvals inbox: every call of the tenant's sessions that waits, live. */
async function showApprovals() {
  $("#app").replaceChildren($("#approvals-view").content.cloneNode(true));
  const load = async () => {
    try {
      const page = await api("/approvals?limit=200");
      const body = $("#approvals");
      if (!body) return;
      // Rows still waiting are kept as they are: a person may be editing one.
      const kept = new Map([...body.querySelectorAll("tr[data-call]")].map((tr) => [tr.dataset.call, tr]));
      body.replaceChildren();
      for (const a of page.items) {
        const key = a.session_id + "/" + a.call_id;
        let tr = kept.get(key);
        if (!tr) {
          tr = document.createElement("tr");
          tr.dataset.call = key;
          tr.innerHTML = `<td><a href="#/s/${esc(a.session_id)}">${esc(a.session_id.slice(0, 8))}</a></td>` + approvalCells(a);
          wireDecision(tr, a, "#approvals-error", () => load());
        }
        body.append(tr);
      }
      if (!page.items.length) body.innerHTML = `<tr><td colspan="7" class="muted">nothing waits</td></tr>`;
    } catch (err) { say("#approvals-error", err); }
  };
  const loadConfirmations = async () => {
    try {
      const page = await api("?status=awaiting_confirmation&limit=200&order=asc");
      const body = $("#confirmations");
      if (!body) return;
      body.replaceChildren();
      for (const s of page.items) {
        const c = s.confirmation || {};
        const tr = document.createElement("tr");
        tr.innerHTML = `<td><a href="#/s/${esc(s.id)}">${esc(s.id.slice(0, 8))}</a></td><td>${esc(s.goal)}</td>
          <td>${esc(overText(c.over))}</td><td>${esc(estimateText(c.estimate))}</td>
          <td class="no-wrap">${c.expires_at ? new Date(c.expires_at).toLocaleString() : "—"}</td>
          <td><div class="row"><button class="primary" type="button">Confirm</button><button type="button">Stop</button></div></td>`;
        const [confirm, stop] = tr.querySelectorAll("button");
        const act = async (path) => {
          confirm.disabled = stop.disabled = true;
          try { await api(`/${s.id}/${path}`, { method: "POST" }); await loadConfirmations(); }
          catch (err) { say("#confirmations-error", err); confirm.disabled = stop.disabled = false; }
        };
        confirm.onclick = () => act("confirm");
        stop.onclick = () => act("stop");
        body.append(tr);
      }
      if (!page.items.length) body.innerHTML = `<tr><td colspan="6" class="muted">nothing waits</td></tr>`;
    } catch (err) { say("#confirmations-error", err); }
  };
  await Promise.all([load(), loadConfirmations()]);
  // New requests arrive as sessions change; the inbox follows them.
  stream = new KeyedStream(base + "/events");
  let timer = null;
  stream.addEventListener("session", () => { if (!timer) timer = setTimeout(() => { timer = null; load(); loadConfirmations(); }, 300); });
}

/* The session shown, its iterations and events as read (for the charts, the timeline and "why it ended"). */
let current = null;
let shown = { id: null, iterations: [], events: [] };

/** Every page of a per-session list (at most `max` items). */
async function readAll(path, max = 5000) {
  const items = [];
  let after = 0;
  for (;;) {
    const sep = path.includes("?") ? "&" : "?";
    const page = await api(`${path}${sep}after=${after}&limit=500`);
    items.push(...page.items);
    if (page.next_after == null || items.length >= max) return items;
    after = page.next_after;
  }
}

/* ---------- why it ended ---------- */
const LIMIT_REASONS = ["max_iterations", "cost_limit", "budget_exhausted", "timeout", "step_limit", "cycle_limit", "budget_projected_overrun"];

/** The decision that ended the run: the last decision before the last end of a run. */
function endingDecision(events) {
  let end = -1;
  for (let i = events.length - 1; i >= 0; i--) {
    const e = events[i];
    if (e.kind === "status_changed" && ENDED.includes(e.data.to)) { end = i; break; }
  }
  if (end < 0) return { end: null, decision: null };
  for (let i = end - 1; i >= 0; i--) {
    const e = events[i];
    if (e.kind === "status_changed" && e.data.to === "running") break;
    if (e.kind === "gate_decision" && e.data.decision && e.data.decision.decision !== "continue") return { end: events[end], decision: e };
    if (["guardrail_tripped", "stuck_detected", "agent_signal", "completion_verified", "reflection", "stop_requested", "pause_requested"].includes(e.kind)) return { end: events[end], decision: e };
  }
  return { end: events[end], decision: null };
}

function describeDecision(e) {
  const d = e.data || {};
  switch (e.kind) {
    case "gate_decision": return `the continue gate before step ${d.step} decided ${esc(JSON.stringify(d.decision))}`;
    case "guardrail_tripped": return `the guardrail <code>${esc(d.breach)}</code> tripped`;
    case "stuck_detected": return `stuck detection after step ${d.step}: ${esc(d.description)}`;
    case "agent_signal": return `the agent signalled at step ${d.step}: ${esc(JSON.stringify(d.signal))}`;
    case "reflection": return `reflection #${d.number} after iteration ${d.after_iteration} decided ${esc(JSON.stringify(d.decision && d.decision.verdict || d.decision))}`;
    default: return `<code>${esc(e.kind)}</code>` + (e.actor ? ` by key ${esc(e.actor)}` : "");
  }
}

/** What the inputs of a decision were: its metrics, inputs, usage and limits, as a definition list. */
function decisionFacts(e) {
  const d = e.data || {};
  const parts = [];
  for (const key of ["metrics", "inputs", "usage", "limits", "pattern", "verdict", "assessment"]) {
    if (d[key] && typeof d[key] === "object") parts.push(`<dt>${key}</dt><dd>${kvTable(d[key])}</dd>`);
  }
  return parts.length ? `<dl class="kv">${parts.join("")}</dl>` : "";
}

/** A flat object as "name value" pairs; nested values as JSON. */
function kvTable(obj) {
  return `<dl class="kv">` + Object.entries(obj).map(([k, v]) =>
    `<dt>${esc(k)}</dt><dd><code>${esc(typeof v === "object" && v !== null ? JSON.stringify(v) : String(v))}</code></dd>`).join("") + `</dl>`;
}

function resumePlan(s) {
  if (!(s.allowed_actions || []).includes("resume")) return `Resume is not offered: a ${esc(s.status)} session cannot be resumed.`;
  const from = s.checkpoint_saved || s.last_checkpoint_iteration ? `the checkpoint after iteration ${s.last_checkpoint_iteration ?? s.iterations}` : `its committed state after iteration ${s.iterations}`;
  let plan = `Resume starts a new run from ${from}, keeping the ${s.iterations} iteration(s) and ${s.tokens_used} token(s) already used against its limits; guidance, if given, goes to the next step.`;
  if (LIMIT_REASONS.includes(s.reason)) plan += ` It ended on a limit (<code>${esc(s.reason)}</code>): resume with that limit raised (the resume request takes new limits), or it stops again at once.`;
  return plan;
}

function renderWhyEnded(s) {
  const box = $("#why-ended");
  if (!box) return;
  const ended = isOver(s);
  box.hidden = !ended;
  if (!ended) return;
  $("#why-reason").innerHTML = `It ended <b>${esc(s.status)}</b> because of <code>${esc(s.reason || "—")}</code>` +
    (s.reason_detail ? `: ${esc(s.reason_detail)}` : "") + ".";
  const { decision } = shown.id === s.id ? endingDecision(shown.events) : { decision: null };
  $("#why-decision").innerHTML = decision
    ? `<p>The decision that ended it (event #${decision.seq}, ${new Date(decision.created_at).toLocaleTimeString()}): ${describeDecision(decision)}</p>${decisionFacts(decision)}`
    : `<p class="muted">No decision event precedes the end (it ended on a request or an error).</p>`;
  $("#next-steps").innerHTML = (s.next_steps || []).map((n) => `<li>${esc(n)}</li>`).join("") || `<li class="muted">none given</li>`;
  $("#resume-plan").innerHTML = resumePlan(s);
}

/* ---------- charts (uPlot, vendored) ---------- */
let charts = [];
function destroyCharts() { charts.forEach((c) => c.destroy()); charts = []; }

function drawCharts() {
  const tokensEl = $("#tokens-chart"), progressEl = $("#progress-chart");
  if (!tokensEl || !progressEl || !current || typeof uPlot === "undefined") return;
  destroyCharts();
  const width = Math.max(260, tokensEl.clientWidth || 400);
  const its = shown.iterations;
  let sum = 0;
  const xs = [], per = [], cum = [], budget = [];
  for (const it of its) { sum += it.tokens; xs.push(it.number); per.push(it.tokens); cum.push(sum); budget.push(current.limits.max_tokens); }
  tokensEl.dataset.points = String(xs.length);
  if (xs.length) {
    charts.push(new uPlot({
      width, height: 200,
      scales: { x: { time: false } },
      axes: [{ label: "step", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000] }, { label: "tokens per step" }, { side: 1, scale: "cum", label: "cumulative", grid: { show: false } }],
      series: [{ label: "step" },
        { label: "per step", stroke: "#2457c5", fill: "rgba(36,87,197,.25)", paths: uPlot.paths.bars({ size: [0.6, 40] }) },
        { label: "cumulative", stroke: "#1a7f37", width: 2, scale: "cum" },
        { label: "budget", stroke: "#cf222e", dash: [6, 4], scale: "cum" }],
    }, [xs, per, cum, budget], tokensEl));
  } else tokensEl.textContent = "no iterations yet";
  // Progress after each step, from the iteration events, on a time axis.
  const pts = shown.events.filter((e) => e.kind === "iteration_completed" && e.data.percent_complete != null);
  const ts = pts.map((e) => Date.parse(e.created_at) / 1000), pc = pts.map((e) => Math.min(100, e.data.percent_complete));
  if (current.status === "completed" && ts.length) { ts.push(Date.parse(current.updated_at) / 1000); pc.push(100); }
  progressEl.dataset.points = String(ts.length);
  if (ts.length) {
    charts.push(new uPlot({
      width, height: 200,
      scales: { y: { range: [0, 100] } },
      axes: [{}, { label: "% complete" }],
      series: [{}, { label: "progress", stroke: "#2457c5", width: 2, fill: "rgba(36,87,197,.1)" }],
    }, [ts, pc], progressEl));
  } else progressEl.textContent = "no progress reported yet";
}

/* ---------- the session page: a header, controls, and a tab per view ---------- */
const TAB_VIEWS = { overview: showOverview, iterations: showOverview, decisions: showDecisions, timeline: showTimeline, checkpoints: showCheckpoints, files: showFiles };

async function showSession(id, tab, focusIteration) {
  const app = $("#app");
  app.replaceChildren($("#session-view").content.cloneNode(true));
  live = null; current = null; tree = { id: null, live: 0, html: "" }; destroyCharts();
  if (shown.id !== id) shown = { id, iterations: [], events: [] };
  for (const a of document.querySelectorAll("#tabs a")) {
    a.href = `#/s/${id}` + (a.dataset.tab === "overview" ? "" : "/" + a.dataset.tab);
    if (a.dataset.tab === tab || (tab === "iterations" && a.dataset.tab === "iterations")) a.setAttribute("aria-current", "page");
  }
  let refreshTimer = null, treeTimer = null;
  const refresh = async () => { try { renderSession(await api(`/${id}`)); } catch (err) { say("#control-error", err); } };
  // A delegation is news even before the status read says the session has children.
  const treeSoon = (delegated) => {
    if (!delegated && !(current && hasTree(current))) return;
    if (!treeTimer) treeTimer = setTimeout(() => { treeTimer = null; loadTree(id); }, 150);
  };
  const soon = () => { if (!refreshTimer) refreshTimer = setTimeout(() => { refreshTimer = null; refresh(); }, 150); };
  const follow = (after) => {
    closeStream();
    stream = new KeyedStream(`${base}/${id}/events?after=${after}`);
    stream.addEventListener("*", (e) => {
      let ev;
      try { ev = JSON.parse(e.data); } catch (_) { return; }
      if (!ev || ev.seq == null) return;
      if (!shown.events.some((x) => x.seq === ev.seq)) shown.events.push(ev);
      appendTimeline(ev);
      if (ev.kind === "iteration_completed") {
        const d = ev.data;
        if (!shown.iterations.some((x) => x.number === d.number)) shown.iterations.push({ number: d.number, action: d.action, outcome: d.outcome, tokens: d.tokens, duration_ms: d.duration_ms, record: null });
        appendIteration(shown.iterations[shown.iterations.length - 1], id);
        soon();
      } else if (ev.kind === "reflection") { loadReflections(id).catch(() => {}); soon(); }
      else if (ev.kind === "status_changed") {
        refresh(); treeSoon();
        // A parent paused for its children runs on by itself when they end: keep listening.
        if (ENDED.includes(ev.data.to) && ev.data.reason !== "waiting_for_children") closeStream();
      } else if (TREE_KINDS.includes(ev.kind)) { soon(); treeSoon(true); }
      else if (DECISION_KINDS.includes(ev.kind) || ["checkpoint_saved", "limits_changed", "goal_refined", "cycle_started", "agent_signal", "approval_requested", "approval_decided"].includes(ev.kind)) soon();
    });
  };
  const control = async (path, body) => {
    $("#control-error").textContent = "";
    try {
      const s = await api(`/${id}/${path}`, { method: "POST", body: body ? JSON.stringify(body) : undefined });
      renderSession(s);
      loadActor(id, s.last_event_seq).catch(() => {});
      treeSoon();
      if (!isOver(s)) follow(s.last_event_seq);
    } catch (err) { say("#control-error", err); }
  };
  $("#stop-btn").onclick = () => control("stop");
  $("#pause-btn").onclick = () => control("pause");
  $("#resume-btn").onclick = () => { const g = $("#guidance").value.trim(); control("resume", g ? { guidance: g } : undefined); $("#guidance").value = ""; };
  $("#confirm-btn").onclick = () => control("confirm");
  $("#accept-btn").onclick = () => control("refinement", { choice: "accept_suggestion" });
  $("#custom-btn").onclick = () => control("refinement", { choice: "custom", goal: $("#custom-goal").value });
  $("#time-btn").onclick = () => control("refinement", { choice: "proceed_with_time_limit", max_wall_time_ms: Number($("#time-limit").value) });
  try {
    const s = await api(`/${id}`);
    // History first, so the views and "why it ended" see it; the stream goes on from the status's last seq.
    const [iterations, events] = await Promise.all([readAll(`/${id}/iterations`), readAll(`/${id}/events`)]);
    shown = { id, iterations, events };
    await TAB_VIEWS[tab](id, focusIteration);
    renderSession(s);
    await loadActor(id, s.last_event_seq);
    if (!isOver(s)) follow(Math.max(s.last_event_seq, ...events.map((e) => e.seq)));
    // Read whatever the session is: forks of it leave no event here, and the tree lists them.
    await loadTree(id);
  } catch (err) { say("#control-error", err); }
  // A step in flight logs nothing: re-read now and then so a step that
  // started after the last event shows (from the owner's memory, cheap).
  const shownHash = location.hash;
  const poll = setInterval(() => {
    if (!$("#status") || location.hash !== shownHash) { clearInterval(poll); return; }
    if (live) refresh();
    // Children's steps are on their own streams: the tree is read again while any of it runs.
    if (tree.id === id && tree.live > 0) loadTree(id);
  }, 3000);
}
/** Events on a parent's or child's stream that change the tree. */
const TREE_KINDS = ["child_delegated", "child_ended", "child_needs_attention", "delegated_by"];

/* ---------- the session tree: the session, the sessions it delegated to, theirs ---------- */
/* The tree last drawn: whose, how many of its sessions were live, and its markup (redrawn only when it changes, so a click is never lost to a redraw). */
let tree = { id: null, live: 0, html: "" };
/* Reads of the tree started; only the latest one's answer is drawn. */
let treeReads = 0;
/** Whether the session is part of a tree: it has a parent or children, or is a fork (drawn under its original). */
const hasTree = (s) => !!s.parent_id || (s.children || []).length > 0 || !!s.forked_from;

/** "Part of <parent's goal>" under the title of a child session. */
function renderParentLine(s) {
  const line = $("#parent-line");
  if (!line) return;
  line.hidden = !s.parent_id;
  if (!s.parent_id) return;
  const a = $("#parent-link");
  a.href = `#/s/${s.parent_id}`;
  a.dataset.parent = s.parent_id;
  a.textContent = parentLabel(s.parent_id);
  if (!parentsAsked.has(s.parent_id)) resolveParents(line);
}

/** "Forked from <session> at iteration <n>" under the title of a fork. */
function renderForkedLine(s) {
  const line = $("#forked-line");
  if (!line) return;
  const from = s.forked_from;
  line.hidden = !from;
  if (!from) return;
  const a = $("#forked-link");
  a.href = `#/s/${from.session_id}`;
  a.textContent = from.session_id;
  $("#forked-iteration").textContent = from.iteration;
}

/** Statuses after which a child never runs again (its unspent budget went back to its parent). */
const FINISHED = ["completed", "stopped", "interrupted", "failed"];

/** A node's whole token budget: what its parent gave it; for the top of the
 *  tree, its limit now plus what its children hold or spent of it (its
 *  `max_tokens` shrinks by a child's budget and gets back what it did not spend). */
function tokenBudget(n) {
  if (n.budget_tokens != null) return n.budget_tokens;
  return (n.children || []).reduce((sum, c) => sum + (FINISHED.includes(c.status) ? Math.min(c.subtree_tokens_used, c.budget_tokens) : c.budget_tokens), n.max_tokens);
}

/** The mark of a fork's branch: where it left the session above it. */
const forkMark = (iteration) => `<div class="muted fork-mark">fork at iteration ${esc(iteration)}</div>`;

/** A fork listed by the session it was forked from: a branch marked "fork at iteration N", its status and goal (a link to its page). */
function forkBranch(f, selfId) {
  const self = f.id === selfId;
  const goal = self ? `<b class="node-goal" aria-current="page">${esc(f.goal)}</b>` : `<a class="node-goal" href="#/s/${esc(f.id)}">${esc(f.goal)}</a>`;
  return `<li class="fork-branch" data-id="${esc(f.id)}" data-status="${esc(f.status)}"><div class="node${self ? " self" : ""}">${forkMark(f.iteration)}
    <div class="node-head"><span class="badge s-${esc(f.status)}">${esc(f.status)}</span>${goal}</div></div></li>`;
}

/** Forks in a node and its descendants. */
const forkCount = (n) => (n.forks || []).length + (n.children || []).reduce((sum, c) => sum + forkCount(c), 0);

/** One node of the tree and, nested, its children, then its forks as
 *  branches: status, goal (a link to its page), reason, progress, tokens
 *  against its budget. `mark`, when given, draws the node itself as a fork's
 *  branch (the session shown, under the session it was forked from). */
function treeNode(n, selfId, mark) {
  const self = n.id === selfId;
  const budget = tokenBudget(n);
  const used = n.subtree_tokens_used ?? n.tokens_used;
  const pct = budget ? Math.min(100, Math.round((100 * used) / budget)) : 0;
  const goal = self ? `<b class="node-goal" aria-current="page">${esc(n.goal)}</b>` : `<a class="node-goal" href="#/s/${esc(n.id)}">${esc(n.goal)}</a>`;
  const reason = reasonText(n.reason);
  const kids = n.children || [];
  const branches = kids.map((c) => treeNode(c, selfId)).join("") + (n.forks || []).map((f) => forkBranch(f, selfId)).join("");
  return `<li${mark ? ` class="fork-branch"` : ""} data-id="${esc(n.id)}" data-status="${esc(n.status)}"><div class="node${self ? " self" : ""}">${mark || ""}
    <div class="node-head"><span class="badge s-${esc(n.status)}">${esc(n.status)}</span>${goal}</div>
    <div class="row node-facts">${reason ? `<span class="muted node-reason">${esc(reason)}</span>` : ""}
      <span class="node-progress">${percentOf(n)}% done</span>
      <span class="bar tokens-bar" title="${pct}% of its token budget"><span data-pct="${pct}"></span></span>
      <span class="muted node-tokens">${used} of ${budget ?? "—"} tokens${kids.length && used !== n.tokens_used ? ` (${n.tokens_used} its own)` : ""}</span></div>
    ${n.summary && ENDED.includes(n.status) && !self ? `<p class="muted node-summary">${esc(n.summary.length > 200 ? n.summary.slice(0, 199) + "…" : n.summary)}</p>` : ""}
  </div>${branches ? `<ul>${branches}</ul>` : ""}</li>`;
}

/** A fork's tree drawn under the session it was forked from, with that
 *  session's other forks beside it: the family at a glance. When the
 *  original cannot be read (deleted), the fork's line names it alone. */
async function familyOf(root, selfId) {
  const from = root.forked_from;
  const self = treeNode(root, selfId, forkMark(from.iteration));
  let origin;
  try { origin = (await api(`/${from.session_id}/tree`)).node; } catch (_) { origin = null; }
  const head = origin
    ? `<span class="badge s-${esc(origin.status)}">${esc(origin.status)}</span><a class="node-goal" href="#/s/${esc(origin.id)}">${esc(origin.goal)}</a>`
    : `<a class="node-goal" href="#/s/${esc(from.session_id)}">${esc(from.session_id)}</a>`;
  const forks = origin ? origin.forks || [] : [];
  const branches = forks.some((f) => f.id === root.id)
    ? forks.map((f) => (f.id === root.id ? self : forkBranch(f, selfId))).join("")
    : self;
  return `<li class="origin" data-id="${esc(from.session_id)}"><div class="node"><div class="muted fork-mark">forked from</div>
    <div class="node-head">${head}</div></div><ul>${branches}</ul></li>`;
}

/** Reads the session's tree and draws it, shown when the session has a parent or children. */
async function loadTree(id) {
  if (!$("#tree-section") || shown.id !== id) return;
  const read = ++treeReads;
  let t;
  try { t = await api(`/${id}/tree`); } catch (err) { say("#tree-error", err); return; }
  const section = $("#tree-section");
  if (!section || shown.id !== id || read !== treeReads) return;
  $("#tree-error").textContent = "";
  const root = t.node;
  const forks = forkCount(root);
  section.hidden = !root.parent_id && !(root.children || []).length && !root.forked_from && !forks;
  const totals = t.totals;
  $("#tree-totals").textContent = `${totals.sessions} session${totals.sessions === 1 ? "" : "s"} · ${totals.live} live · ${totals.tokens_used} tokens · ${totals.iterations} iterations`
    + (forks ? ` · ${forks} fork${forks === 1 ? "" : "s"}` : "") + (root.forked_from ? ` · a fork of the session above` : "");
  const html = root.forked_from && !root.parent_id ? await familyOf(root, id) : treeNode(root, id);
  if (shown.id !== id || read !== treeReads) return;
  if (tree.id !== id || tree.html !== html) {
    $("#tree").innerHTML = html;
    // Widths from JS: the CSP allows no inline style attribute.
    for (const fill of document.querySelectorAll("#tree .tokens-bar > span")) setBar(fill, Number(fill.dataset.pct));
  }
  tree = { id, live: totals.live, html };
}
const DECISION_KINDS = ["gate_decision", "stuck_detected", "guardrail_tripped", "reflection_interval_changed"];

/** Overview: why it ended, charts, checklists, reflections and the iteration log (one iteration opened when the URL names it). */
async function showOverview(id, focusIteration) {
  $("#tab").replaceChildren($("#overview-tab").content.cloneNode(true));
  shown.iterations.forEach((it) => appendIteration(it, id));
  await loadReflections(id);
  if (focusIteration != null) {
    const tr = $(`#iteration-log tr[data-n="${focusIteration}"]`);
    if (tr) { await toggleIteration(id, focusIteration, true); tr.scrollIntoView({ block: "center" }); $("button", tr).focus(); }
  }
}

function appendIteration(it, id) {
  const body = $("#iteration-log");
  if (!body || body.querySelector(`tr[data-n="${it.number}"]`)) return;
  const tr = document.createElement("tr");
  tr.dataset.n = it.number;
  tr.innerHTML = `<td>${it.number}</td><td><code>${esc(it.action)}</code></td><td>${esc(it.outcome)}</td><td>${it.tokens}</td><td>${it.duration_ms}</td>
    <td><button type="button" class="expander" aria-expanded="false" aria-controls="it-detail-${it.number}">Details</button></td>
    <td><button type="button" class="fork" data-iteration="${it.number}">Fork from here</button></td>`;
  // A fork from an iteration starts at its checkpoint; one without says so.
  $("button.fork", tr).onclick = () => forkFrom(id, { checkpoint_iteration: it.number }, "#iteration-fork-error");
  $("button", tr).onclick = () => {
    const open = $("button", tr).getAttribute("aria-expanded") !== "true";
    // The URL names the open iteration, so it can be linked to.
    replaceHash(open ? `#/s/${id}/iterations/${it.number}` : `#/s/${id}`);
    toggleIteration(id, it.number, open);
  };
  body.append(tr);
}

/** Changes the URL without running the router (the view already shows it). */
function replaceHash(hash) { window.history.replaceState(null, "", hash); }

async function toggleIteration(id, n, open) {
  const tr = $(`#iteration-log tr[data-n="${n}"]`);
  if (!tr) return;
  const button = $("button", tr);
  const existing = $(`#it-detail-${n}`);
  button.setAttribute("aria-expanded", String(open));
  if (!open) { if (existing) existing.remove(); return; }
  if (existing) return;
  const detail = document.createElement("tr");
  detail.className = "detail"; detail.id = `it-detail-${n}`;
  detail.innerHTML = `<td colspan="7" class="muted">loading…</td>`;
  tr.after(detail);
  try {
    const page = await api(`/${id}/iterations?after=${n - 1}&limit=1&full=true`);
    const it = page.items[0];
    if (!it) { detail.firstChild.textContent = "not found"; return; }
    const r = it.record || {};
    const files = (r.files_written || []).map((f) => `<li><code>${esc(f.path)}</code> <span class="muted">${esc((f.digest || "").slice(0, 12))}</span></li>`).join("");
    detail.innerHTML = `<td colspan="7"><dl class="kv iteration-detail">
      <dt>Action</dt><dd><code>${esc(r.action ?? it.action)}</code> · ${esc(it.outcome)} · run ${it.run}</dd>
      <dt>Arguments</dt><dd><pre>${esc(JSON.stringify(r.arguments ?? {}, null, 2))}</pre></dd>
      <dt>Tool calls</dt><dd>${r.tool_calls ?? 0}</dd>
      <dt>Result</dt><dd><pre class="it-output">${esc(r.observation ?? "")}</pre></dd>
      ${r.message ? `<dt>Message</dt><dd><pre>${esc(r.message)}</pre></dd>` : ""}
      ${r.error ? `<dt>Error</dt><dd><pre class="error">${esc(r.error)}</pre></dd>` : ""}
      <dt>Files changed</dt><dd>${files ? `<ul>${files}</ul>` : '<span class="muted">none</span>'}</dd>
      <dt>Tokens</dt><dd>${it.tokens}</dd>
      <dt>Duration</dt><dd>${it.duration_ms} ms (${new Date(it.started_at).toLocaleTimeString()} – ${new Date(it.finished_at).toLocaleTimeString()})</dd>
      ${it.effects && Object.keys(it.effects).length ? `<dt>Effects</dt><dd>${kvTable(it.effects)}</dd>` : ""}
    </dl></td>`;
  } catch (err) { detail.firstChild.textContent = err.message; }
}

async function loadReflections(id) {
  if (!$("#reflections")) return;
  const page = await api(`/${id}/reflections?limit=500`);
  if (!$("#reflections")) return;
  $("#reflections").innerHTML = page.items.map((r) => `<tr><td>${r.number}</td><td>#${r.after_iteration}</td>
    <td>${esc(r.decision && r.decision.verdict ? r.decision.verdict.action : "")}</td>
    <td>${r.ok ? esc(r.assessment.progress + " " + r.assessment.percent_complete + "%") : `<span class="error">${esc(r.error)}</span>`}</td>
    <td>${esc(r.ok ? r.assessment.reasoning : "")}</td></tr>`).join("") || `<tr><td colspan="5" class="muted">none yet</td></tr>`;
}

/** Decisions: each gate evaluation, guardrail, stuck finding and status change, with its metrics. */
async function showDecisions(id) {
  $("#tab").replaceChildren($("#decisions-tab").content.cloneNode(true));
  const load = async () => {
    const all = $("#include-continue").checked;
    const items = await readAll(`/${id}/decisions` + (all ? "?include_continue=true" : ""));
    $("#decisions").innerHTML = items.map((e) => `<tr data-seq="${e.seq}" data-kind="${esc(e.kind)}"><td>${e.seq}</td>
      <td class="no-wrap">${new Date(e.created_at).toLocaleTimeString()}</td><td><code>${esc(e.kind)}</code></td>
      <td>${decisionSummary(e)}</td><td>${decisionFacts(e)}</td></tr>`).join("") || `<tr><td colspan="5" class="muted">no decision yet</td></tr>`;
  };
  $("#include-continue").onchange = () => load().catch((err) => say("#control-error", err));
  await load();
}

function decisionSummary(e) {
  const d = e.data || {};
  if (e.kind === "gate_decision") return `step ${d.step}: <b>${esc(d.decision && d.decision.decision || JSON.stringify(d.decision))}</b>` + (d.decision && d.decision.cause ? ` (${esc(d.decision.cause)})` : "");
  if (e.kind === "status_changed") return `${esc(d.from || "—")} → <b>${esc(d.to)}</b>` + (d.reason ? ` (${esc(d.reason)})` : "");
  if (e.kind === "guardrail_tripped") return `<b>${esc(d.breach)}</b>`;
  if (e.kind === "stuck_detected") return `after step ${d.step}: ${esc(d.description)}`;
  if (e.kind === "reflection_interval_changed") return `after step ${esc(d.after_iteration)}: reflect every ${esc(d.from)} → <b>${esc(d.to)}</b> steps (${esc(d.cause)})`;
  return "";
}

/** Timeline: every event of the session, live while it runs. */
async function showTimeline() {
  $("#tab").replaceChildren($("#timeline-tab").content.cloneNode(true));
  shown.events.forEach(appendTimeline);
}

function eventWhat(e) {
  const d = e.data || {};
  switch (e.kind) {
    case "iteration_completed": return `step ${d.number} <code>${esc(d.action)}</code> ${esc(d.outcome)}, ${d.tokens} tokens, ${d.duration_ms} ms`;
    case "status_changed": case "gate_decision": case "guardrail_tripped": case "stuck_detected": return decisionSummary(e);
    case "checkpoint_saved": return `after iteration ${d.iteration} (${esc(d.reason)})`;
    case "budget_warning": return `<b>${d.threshold}%</b> of the ${esc(d.budget.replace("_", " "))} budget spent (${esc(d.used)} of ${esc(d.limit)})`;
    case "reflection": return `#${d.number} after iteration ${d.after_iteration}` + (d.ok && d.assessment ? `: ${esc(d.assessment.percent_complete)}%` : "");
    case "reflection_interval_changed": return `reflect every <b>${esc(d.to)}</b> steps (was ${esc(d.from)}): ${esc(d.cause)}`;
    case "session_created": return esc(d.goal);
    case "child_delegated": return `delegated <a href="#/s/${esc(d.child_id)}">${esc(d.goal)}</a>: ${d.budget_tokens} tokens, ${d.budget_iterations} iterations${d.wait ? ", waits for it" : ""}`;
    case "child_needs_attention": return `<a href="#/s/${esc(d.child_id)}">${esc(d.goal)}</a> waits for a person <b>${esc(d.reason)}</b>${d.summary ? `: ${esc(d.summary)}` : ""}`;
    case "child_ended": return `<a href="#/s/${esc(d.child_id)}">${esc(d.goal)}</a> ended <b>${esc(d.status)}</b>${d.reason ? ` (${esc(d.reason)})` : ""}: ${d.tokens_used} tokens used, ${d.tokens_returned} returned`;
    case "delegated_by": return `delegated by <a href="#/s/${esc(d.parent_id)}">its parent</a> (${esc(d.call)})`;
    default: return `<code>${esc(JSON.stringify(d).slice(0, 160))}</code>`;
  }
}

function appendTimeline(e) {
  const body = $("#timeline");
  if (!body || body.querySelector(`tr[data-seq="${e.seq}"]`)) return;
  const tr = document.createElement("tr");
  tr.dataset.seq = e.seq; tr.dataset.kind = e.kind;
  tr.innerHTML = `<td>${e.seq}</td><td class="no-wrap">${new Date(e.created_at).toLocaleTimeString()}</td><td class="tl-kind"><code>${esc(e.kind)}</code></td><td>${eventWhat(e)}</td><td class="hide-narrow">${esc(e.actor || "")}</td>`;
  body.append(tr);
}

/** Checkpoints: what each covers and why it was taken; its saved state on demand. */
async function showCheckpoints(id) {
  $("#tab").replaceChildren($("#checkpoints-tab").content.cloneNode(true));
  const items = await readAll(`/${id}/checkpoints`);
  $("#checkpoints").innerHTML = items.map((c) => `<tr data-id="${c.id}"><td>${c.id}</td><td>${c.iteration}</td><td>${esc(c.reason)}</td>
    <td class="no-wrap">${new Date(c.created_at).toLocaleString()}</td><td><details><summary>State</summary><pre>${esc(JSON.stringify(c.state, null, 2))}</pre></details></td>
    <td>${c.forkable ? `<button type="button" class="fork" data-checkpoint="${c.id}">Fork from here</button>` : ""}</td></tr>`).join("")
    || `<tr><td colspan="6" class="muted">no checkpoint yet</td></tr>`;
  for (const b of document.querySelectorAll("#checkpoints button.fork")) {
    b.onclick = () => forkFrom(id, { checkpoint_id: Number(b.dataset.checkpoint) }, "#fork-error");
  }
}

/** Forks session `id` from the checkpoint `body` names, with the guidance asked for, and opens the fork. */
async function forkFrom(id, body, errorAt) {
  const guidance = prompt("Guidance for the fork's first step (optional):", "");
  if (guidance === null) return;
  if (guidance.trim()) body.guidance = guidance.trim();
  try {
    const fork = await api(`/${id}/fork`, { method: "POST", body: JSON.stringify(body) });
    location.hash = `#/s/${fork.id}`;
  } catch (err) { say(errorAt, err); }
}

/** Files: the workspace as of a checkpoint (tree, viewer) and the diff between two checkpoints. */
async function showFiles(id, focus) {
  $("#tab").replaceChildren($("#files-tab").content.cloneNode(true));
  let list;
  try { list = await api(`/${id}/files` + (focus != null ? `?checkpoint=${focus}` : "")); } catch (err) { say("#files-error", err); return; }
  const options = (sel) => list.snapshots.map((n) => `<option value="${n}"${n === sel ? " selected" : ""}>${n}</option>`).join("");
  $("#files-checkpoint").innerHTML = options(list.checkpoint);
  $("#diff-from").innerHTML = options(list.snapshots[Math.max(0, list.snapshots.indexOf(list.checkpoint) - 1)]);
  $("#diff-to").innerHTML = options(list.checkpoint);
  $("#files-checkpoint").onchange = (e) => { location.hash = `#/s/${id}/files/${e.target.value}`; };
  if (list.checkpoint == null) { $("#files").innerHTML = `<tr><td colspan="3" class="muted">no workspace snapshot yet</td></tr>`; return; }
  // A tree by indentation: each path's directories once, then its file.
  const seen = new Set();
  const rows = [];
  for (const f of list.files) {
    const parts = f.path.split("/");
    for (let i = 1; i < parts.length; i++) {
      const dir = parts.slice(0, i).join("/");
      if (!seen.has(dir)) { seen.add(dir); rows.push(`<tr><td class="indent-${Math.min(i - 1, 6)}">${esc(parts[i - 1])}/</td><td></td><td></td></tr>`); }
    }
    rows.push(`<tr><td class="indent-${Math.min(parts.length - 1, 6)}"><a href="" data-path="${esc(f.path)}">${esc(parts[parts.length - 1])}</a></td><td>${f.size}</td><td>${f.modified_iteration}</td></tr>`);
  }
  $("#files").innerHTML = rows.join("") || `<tr><td colspan="3" class="muted">the workspace is empty</td></tr>`;
  for (const a of document.querySelectorAll("#files a[data-path]")) {
    a.onclick = async (e) => {
      e.preventDefault();
      const path = a.dataset.path;
      const url = `${base}/${id}/files/${path.split("/").map(encodeURIComponent).join("/")}?checkpoint=${list.checkpoint}`;
      const res = await fetch(url, { headers: { ...authHeaders(), range: "bytes=0-262143" } });
      const type = res.headers.get("content-type") || "";
      $("#file-name").textContent = path;
      $("#file-view").textContent = type.startsWith("text/") || type.includes("json") ? await res.text() : `(${type}: not shown; download it from ${url})`;
    };
  }
  $("#diff-show").onclick = async () => {
    try {
      const d = await api(`/${id}/files/diff?from=${$("#diff-from").value}&to=${$("#diff-to").value}`);
      $("#file-name").textContent = `Changes from checkpoint ${d.from} to ${d.to}`;
      $("#file-view").textContent = d.changes.map((c) => c.diff || `${c.change} ${c.path} (${c.from_sha256 || "-"} -> ${c.to_sha256 || "-"})\n`).join("\n") || "no change";
    } catch (err) { say("#files-error", err); }
  };
}

const ACTED = { stop_requested: "stopped", pause_requested: "paused", resumed: "resumed", limits_changed: "updated", goal_refined: "refined", session_created: "created" };

/** "stopped by key wdn_ab12…": the latest control event and the key that made it. */
async function loadActor(id, lastSeq) {
  const page = await api(`/${id}/events?after=${Math.max(0, lastSeq - 100)}&limit=100`);
  const last = page.items.filter((e) => ACTED[e.kind] && e.actor).pop();
  if (last && $("#control-actor")) $("#control-actor").textContent = `${ACTED[last.kind]} by key ${last.actor}`;
}

window.addEventListener("hashchange", route);
window.addEventListener("resize", () => { if (current) drawCharts(); });
route();
