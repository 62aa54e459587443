// The dashboard in a real browser (Debian's headless Chromium, driven by
// Playwright) against the real server and Postgres: create a scripted session
// from the form, watch it move, stop it, resume it, see it finish; watch a
// long step tick; filter the list by deep link; create from the form's
// fields; open an iteration, the decisions, the timeline, the charts and
// "why it ended"; read it all on a phone; see a worker session wait for its
// worker; follow a parent's tree of child sessions.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { createServer } from "node:http";
import { chromium } from "playwright-core";

const baseUrl = process.env.WARDEN_URL ?? "http://127.0.0.1:8080";
// An operator key made by run.sh through POST /api/keys.
const key = process.env.WARDEN_KEY ?? "";
const executablePath = process.env.CHROMIUM_PATH ?? "/usr/bin/chromium";
const shots = new URL("./screenshots/", import.meta.url).pathname;
mkdirSync(shots, { recursive: true });

let browser;
let page;
const pageErrors = [];

before(async () => {
  browser = await chromium.launch({
    executablePath,
    headless: true,
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
  page = await browser.newPage({ viewport: { width: 1280, height: 1000 } });
  page.on("pageerror", (err) => pageErrors.push(err.message));
  page.on("console", (msg) => {
    if (msg.type() === "error") pageErrors.push(msg.text());
  });
});

after(async () => {
  await browser?.close();
});

/** Ten slow steps, then the done sentinel: long enough to watch and to stop. */
const script = {
  steps: [
    ...Array.from({ length: 10 }, (_, i) => ({
      action: `step_${i + 1}`,
      arguments: { part: i + 1 },
      tokens: 25,
      output: `finished part ${i + 1}`,
      delay_ms: 400,
    })),
    { action: "report", tokens: 10, output: "all parts done\n<<WARDEN_GOAL_DONE: eleven steps run>>" },
  ],
};

async function progressWidth() {
  return page.$eval("#progress-bar", (el) => parseFloat(el.style.width) || 0);
}

async function logNumbers() {
  return page.$$eval("#iteration-log tr[data-n]", (rows) => rows.map((r) => Number(r.dataset.n)));
}

test("a wrong key is refused; a good one logs in and stays out of the URL", async () => {
  await page.goto(baseUrl + "/");
  await page.waitForSelector("#login-form");
  await page.fill("#api-key", "wdn_00000000_" + "0".repeat(64));
  await page.click("#login-form button[type=submit]");
  await page.waitForFunction(() => /refused/.test(document.querySelector("#login-error")?.textContent ?? ""));
  assert.equal(await page.$("#create-form"), null, "nothing is shown with a wrong key");
  await page.screenshot({ path: shots + "00-key-refused.png", fullPage: true });
  await page.fill("#api-key", key);
  await page.click("#login-form button[type=submit]");
  await page.waitForSelector("#create-form");
  assert.equal(await page.evaluate(() => sessionStorage.getItem("warden.key")), key);
  assert.ok(!page.url().includes("wdn_"), "the key is never in a URL");
  // The browser logs the refused key's 401 as a console error; nothing else may be.
  const others = pageErrors.filter((e) => !/401/.test(e));
  assert.deepEqual(others, []);
  pageErrors.length = 0;
});

test("create from the form, watch it live, stop, resume, finish", async () => {
  await page.goto(baseUrl + "/");
  await page.waitForSelector("#create-form");

  await page.fill("#goal", "Write a ten-part report into report.md");
  await page.selectOption("#mode", "fixed");
  await page.fill("#max-iterations", "40");
  await page.selectOption("#executor-kind", "scripted");
  // The JSON box is the "advanced" way, behind a disclosure.
  await page.click("#advanced summary");
  await page.fill("#executor-config", JSON.stringify(script, null, 2));
  await page.screenshot({ path: shots + "01-create-form.png", fullPage: true });
  await page.click("#create-btn");

  await page.waitForURL(/#\/s\/[0-9a-f-]+$/);
  const id = page.url().split("/s/")[1];
  assert.match(id, /^[0-9a-f-]{36}$/);
  await page.waitForFunction(() => document.querySelector("#status")?.textContent === "running");
  assert.equal(await page.textContent("#goal-text"), "Write a ten-part report into report.md");

  // Live: the log grows and the bar moves without a reload.
  await page.waitForFunction(() => document.querySelectorAll("#iteration-log tr[data-n]").length >= 2);
  const early = await progressWidth();
  await page.waitForFunction(
    (w) => (parseFloat(document.querySelector("#progress-bar").style.width) || 0) > w,
    early,
    { timeout: 10_000 },
  );
  const later = await progressWidth();
  assert.ok(later > early, `progress bar moved from ${early}% to ${later}%`);
  assert.ok(later < 100, "still running when we stop it");
  await page.screenshot({ path: shots + "02-running.png", fullPage: true });

  // Stop lands while a step is in flight.
  await page.click("#stop-btn");
  await page.waitForFunction(() => document.querySelector("#status")?.textContent === "interrupted");
  assert.equal(await page.textContent("#reason"), "user_stop");
  // The control event names the key that acted, by its public prefix only.
  await page.waitForFunction(() => /^stopped by key wdn_[0-9a-f]{8}$/.test(document.querySelector("#control-actor")?.textContent ?? ""));
  assert.equal(await page.textContent("#control-actor"), `stopped by key ${key.slice(0, 12)}`);
  const summary = (await page.textContent("#summary")) ?? "";
  assert.ok(summary.length > 0, "the termination summary is shown");
  assert.ok(await page.isEnabled("#resume-btn"));
  assert.ok(await page.isDisabled("#stop-btn"));
  const atStop = await logNumbers();
  assert.ok(atStop.length >= 2 && atStop.length < 11, `stopped part-way: ${atStop}`);
  await page.screenshot({ path: shots + "03-interrupted.png", fullPage: true });

  // Resume with guidance; the same page follows it to the end.
  await page.fill("#guidance", "carry on from where you stopped");
  await page.click("#resume-btn");
  await page.waitForFunction(() => document.querySelector("#status")?.textContent === "completed", null, {
    timeout: 30_000,
  });
  await page.waitForFunction(() => document.querySelectorAll("#iteration-log tr[data-n]").length === 11);
  assert.deepEqual(await logNumbers(), Array.from({ length: 11 }, (_, i) => i + 1), "no step lost or repeated");
  assert.equal(await page.textContent("#percent"), "100%");
  // The drawn bar agrees with the number at once (no fill caught mid-animation).
  const drawn = await page.$eval("#progress-bar", (el) =>
    Math.round((100 * el.getBoundingClientRect().width) / el.parentElement.getBoundingClientRect().width),
  );
  assert.equal(drawn, 100, `a completed session draws a full bar, not ${drawn}%`);
  assert.equal(await page.textContent("#iterations-count"), "11");
  assert.equal(await page.textContent("#tokens"), String(10 * 25 + 10));
  assert.match((await page.textContent("#summary")) ?? "", /eleven steps run/);
  await page.screenshot({ path: shots + "04-completed.png", fullPage: true });

  // The list shows it finished, with a full bar.
  await page.goto(baseUrl + "/#/");
  const row = page.locator(`#sessions tr[data-id="${id}"]`);
  await row.waitFor();
  assert.equal(await row.getAttribute("data-status"), "completed");
  assert.deepEqual(pageErrors, []);
});

test("the list follows sessions it did not start", async () => {
  await page.goto(baseUrl + "/#/");
  await page.waitForSelector("#create-form");
  // Created by another client while the list is open.
  const res = await fetch(baseUrl + "/api/autonomous", {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify({
      goal: "Summarise the changelog into CHANGES.md",
      executor: {
        kind: "scripted",
        steps: [
          { action: "read", tokens: 5, output: "read it", delay_ms: 300 },
          { action: "write", tokens: 5, output: "<<WARDEN_GOAL_DONE>>", delay_ms: 300 },
        ],
      },
    }),
  });
  assert.equal(res.status, 201);
  const { id } = await res.json();
  const row = page.locator(`#sessions tr[data-id="${id}"]`);
  await row.waitFor({ timeout: 10_000 });
  await page.waitForFunction(
    (sid) => document.querySelector(`#sessions tr[data-id="${sid}"]`)?.dataset.status === "completed",
    id,
    { timeout: 15_000 },
  );
  await page.screenshot({ path: shots + "05-list.png", fullPage: true });

  // A row opens its session page.
  await row.click();
  await page.waitForURL(new RegExp(`#/s/${id}$`));
  await page.waitForFunction(() => document.querySelector("#status")?.textContent === "completed");
  assert.equal(await page.textContent("#goal-text"), "Summarise the changelog into CHANGES.md");
  assert.deepEqual(pageErrors, []);
});

test("a long step shows a moving timer and an ETA; an ended session offers no Resume", async () => {
  // Two short steps give a median; the third runs for seconds.
  const res = await fetch(baseUrl + "/api/autonomous", {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify({
      goal: "Translate the manual into docs/fr.md",
      executor: {
        kind: "scripted",
        steps: [
          { action: "outline", tokens: 5, output: "outlined", delay_ms: 500 },
          { action: "draft", tokens: 5, output: "drafted", delay_ms: 500 },
          { action: "translate", tokens: 5, output: "translated", delay_ms: 6000 },
          { action: "finish", tokens: 5, output: "<<WARDEN_GOAL_DONE: translated>>", delay_ms: 100 },
        ],
      },
    }),
  });
  assert.equal(res.status, 201);
  const { id } = await res.json();
  await page.goto(`${baseUrl}/#/s/${id}`);
  await page.waitForFunction(
    () => !document.querySelector("#current-step")?.hidden && document.querySelector("#step-n")?.textContent === "#3",
    null,
    { timeout: 15_000 },
  );
  const first = await page.textContent("#step-elapsed");
  // The timer ticks on its own: no event arrives while the step runs.
  await page.waitForFunction(
    (seen) => {
      const now = document.querySelector("#step-elapsed")?.textContent;
      return document.querySelector("#step-n")?.textContent === "#3" && now && now !== seen;
    },
    first,
    { timeout: 5_000 },
  );
  const eta = (await page.textContent("#eta")) ?? "";
  const seconds = parseFloat(eta);
  assert.ok(seconds > 0, `a nonzero ETA during the long step, not ${JSON.stringify(eta)}`);
  await page.screenshot({ path: shots + "06-long-step.png", fullPage: true });

  await page.waitForFunction(() => document.querySelector("#status")?.textContent === "completed", null, {
    timeout: 20_000,
  });
  assert.ok(await page.isHidden("#current-step"), "no step in flight once ended");
  assert.ok(await page.isDisabled("#resume-btn"), "a completed session cannot be resumed");
  assert.ok(await page.isDisabled("#stop-btn"));
  assert.deepEqual(pageErrors, []);
});

/** POST /api/autonomous with the operator key; the created session. */
async function createSession(body) {
  const res = await fetch(baseUrl + "/api/autonomous", {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify(body),
  });
  assert.equal(res.status, 201, await res.clone().text());
  return res.json();
}

/** Waits (polling the API, not sleeping) until the session has ended. */
async function ended(id, timeoutMs = 30_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const s = await (await fetch(`${baseUrl}/api/autonomous/${id}`, { headers: { authorization: `Bearer ${key}` } })).json();
    if (["completed", "stopped", "interrupted", "failed", "paused"].includes(s.status)) return s;
    assert.ok(Date.now() < deadline, `session ${id} still ${s.status}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

const quick = (n, done) => ({
  kind: "scripted",
  steps: [
    ...Array.from({ length: n }, (_, i) => ({
      action: `write_part_${i + 1}`,
      arguments: { path: `part${i + 1}.md`, content: `part ${i + 1}` },
      tokens: 10 * (i + 1),
      output: `wrote part ${i + 1}`,
    })),
    ...(done ? [{ action: "report", tokens: 5, output: "<<WARDEN_GOAL_DONE: all parts written>>" }] : []),
  ],
});

test("the list filters, sorts and pages by deep link, with live counts per status", async () => {
  const tag = "zebra" + Date.now().toString(36);
  const a = await createSession({ goal: `Write the ${tag} report`, mode: "fixed", executor: quick(1, true) });
  const b = await createSession({ goal: `Proofread the ${tag} report`, mode: "continuous", executor: quick(1, true) });
  const c = await createSession({ goal: `Draft the ${tag} notes`, mode: "fixed", executor: quick(1, true) });
  await Promise.all([a, b, c].map((s) => ended(s.id)));

  // Text and mode from the URL: only the fixed-mode reports.
  await page.goto(`${baseUrl}/#/?q=${tag}%20report&mode=fixed`);
  await page.waitForSelector(`#sessions tr[data-id="${a.id}"]`);
  const ids = await page.$$eval("#sessions tr[data-id]", (rows) => rows.map((r) => r.dataset.id));
  assert.deepEqual(ids, [a.id], "only the matching session is listed");
  assert.equal(await page.inputValue("#f-q"), `${tag} report`, "the form shows the URL's filters");
  assert.equal(await page.inputValue("#f-mode"), "fixed");
  // Counts per status under the same filters; "completed" links to the status filter.
  await page.waitForSelector('#counts a[data-status="completed"]');
  assert.equal(await page.textContent('#counts a[data-status="completed"] [data-count]'), "1");
  await page.screenshot({ path: shots + "10-list-filtered.png", fullPage: true });

  // Oldest first, one a page: next and previous walk the cursor pages.
  await page.goto(`${baseUrl}/#/?q=${tag}&status=completed&order=asc&limit=1`);
  await page.waitForSelector(`#sessions tr[data-id="${a.id}"]`);
  assert.equal(await page.inputValue("#f-order"), "asc");
  assert.equal(await page.inputValue("#f-status"), "completed");
  await page.click("#next-page");
  await page.waitForSelector(`#sessions tr[data-id="${b.id}"]`);
  await page.click("#next-page");
  await page.waitForSelector(`#sessions tr[data-id="${c.id}"]`);
  await page.click("#prev-page");
  await page.waitForSelector(`#sessions tr[data-id="${b.id}"]`);
  await page.click("#prev-page");
  await page.waitForSelector(`#sessions tr[data-id="${a.id}"]`);
  assert.ok(await page.isHidden("#prev-page"), "no previous page before the first");

  // The filter form writes the URL: newest first by update time, executor kind.
  await page.selectOption("#f-order", "desc");
  await page.selectOption("#f-sort", "updated");
  await page.selectOption("#f-executor", "scripted");
  await page.fill("#f-q", `${tag} notes`);
  await page.click("#filter-form button[type=submit]");
  await page.waitForURL(/sort=updated/);
  assert.match(page.url(), /executor=scripted/);
  await page.waitForFunction((id) => {
    const rows = [...document.querySelectorAll("#sessions tr[data-id]")];
    return rows.length === 1 && rows[0].dataset.id === id;
  }, c.id);
  assert.deepEqual(pageErrors, []);
});

test("create from the form's fields: executor steps, limits, criteria", async () => {
  await page.goto(`${baseUrl}/#/new`);
  await page.waitForSelector("#create-form");
  await page.fill("#goal", "Write CHANGELOG.md from the form fields");
  await page.selectOption("#mode", "fixed");
  await page.fill("#max-tokens", "5000");
  await page.selectOption("#executor-kind", "scripted");
  // Edit the first step, drop the others, add a last one.
  const steps = page.locator("#steps-editor .step");
  while ((await steps.count()) > 1) await steps.nth(1).locator(".st-remove").click();
  await steps.nth(0).locator(".st-action").fill("write_changelog");
  await steps.nth(0).locator(".st-tokens").fill("40");
  await steps.nth(0).locator(".st-output").fill("wrote CHANGELOG.md");
  await page.click("#add-step-btn");
  await steps.nth(1).locator(".st-action").fill("report");
  await steps.nth(1).locator(".st-tokens").fill("5");
  await steps.nth(1).locator(".st-output").fill("<<WARDEN_GOAL_DONE: changelog written>>");
  await page.fill("#criteria-input", "CHANGELOG.md exists\nIt lists every release");
  // Other kinds show their own fields.
  await page.selectOption("#executor-kind", "webhook");
  assert.ok(await page.isVisible("#webhook-url"));
  assert.ok(await page.isHidden("#steps-editor"));
  await page.selectOption("#executor-kind", "llm");
  assert.ok(await page.isVisible("#llm-model") && (await page.isVisible("#llm-base-url")));
  await page.selectOption("#executor-kind", "scripted");
  await page.screenshot({ path: shots + "11-create-fields.png", fullPage: true });
  await page.click("#create-btn");
  await page.waitForURL(/#\/s\/[0-9a-f-]{36}$/);
  const id = page.url().split("/s/")[1];
  await page.waitForFunction(() => document.querySelector("#status")?.textContent === "completed", null, { timeout: 30_000 });
  const s = await (await fetch(`${baseUrl}/api/autonomous/${id}`, { headers: { authorization: `Bearer ${key}` } })).json();
  assert.equal(s.mode, "fixed");
  assert.equal(s.limits.max_tokens, 5000);
  assert.equal(s.executor.kind, "scripted");
  assert.deepEqual(s.success_criteria.map((c) => c.text), ["CHANGELOG.md exists", "It lists every release"]);
  assert.equal(await page.textContent("#tokens"), "45");
  assert.deepEqual(pageErrors, []);
});

test("a session's views by deep link: iteration detail, decisions, timeline, charts, why it ended", async () => {
  // Five steps against a three-iteration limit: the guardrail ends it.
  const s = await createSession({ goal: "Write five chapters into book/", mode: "fixed", limits: { max_iterations: 3, max_tokens: 200 }, executor: quick(5, false) });
  await ended(s.id);

  // An iteration opened by its URL: action, arguments, result, tokens, duration.
  await page.goto(`${baseUrl}/#/s/${s.id}/iterations/2`);
  await page.waitForSelector("#it-detail-2 .iteration-detail");
  const detail = (await page.textContent("#it-detail-2")) ?? "";
  for (const part of ["write_part_2", "part2.md", "wrote part 2", "Tool calls", "Files changed", "Duration"]) {
    assert.ok(detail.includes(part), `the detail shows ${part}: ${detail}`);
  }
  assert.equal(await page.getAttribute('#iteration-log tr[data-n="2"] button', "aria-expanded"), "true");
  // Another opens with the keyboard and names itself in the URL.
  await page.focus('#iteration-log tr[data-n="3"] button');
  await page.keyboard.press("Enter");
  await page.waitForSelector("#it-detail-3 .iteration-detail");
  assert.match(page.url(), new RegExp(`#/s/${s.id}/iterations/3$`));
  // Every iteration row offers a fork from it.
  assert.equal(await page.textContent('#iteration-log tr[data-n="3"] button.fork'), "Fork from here");

  // Charts: tokens per step and cumulative against the budget, progress over time (uPlot canvases).
  await page.waitForSelector("#tokens-chart canvas");
  assert.equal(await page.getAttribute("#tokens-chart", "data-points"), "3");
  await page.waitForSelector("#progress-chart canvas, #progress-chart:not(:empty)");
  const legend = (await page.textContent("#tokens-chart")) ?? "";
  assert.ok(/cumulative/.test(legend) && /budget/.test(legend), `the chart's legend names its series: ${legend}`);

  // Why it ended: the decision (the guardrail) with its inputs, and what resume would do.
  await page.waitForSelector("#why-ended:not([hidden])");
  const why = (await page.textContent("#why-ended")) ?? "";
  assert.match(why, /max_iterations/);
  assert.match(why, /guardrail/);
  assert.match(why, /usage/, "the decision's inputs are shown");
  assert.match(await page.textContent("#resume-plan") ?? "", /new run/);
  assert.ok(await page.isEnabled("#resume-btn"));
  await page.screenshot({ path: shots + "12-session-overview.png", fullPage: true });

  // Decisions: the guardrail with its usage and limits, and the gate's evaluations on request.
  await page.goto(`${baseUrl}/#/s/${s.id}/decisions`);
  await page.waitForSelector('#decisions tr[data-kind="guardrail_tripped"]');
  assert.match((await page.textContent('#decisions tr[data-kind="guardrail_tripped"]')) ?? "", /max_iterations/);
  await page.check("#include-continue");
  await page.waitForSelector('#decisions tr[data-kind="gate_decision"]');
  assert.match((await page.textContent('#decisions tr[data-kind="gate_decision"]')) ?? "", /metrics/);
  assert.equal(await page.getAttribute('#tabs a[data-tab="decisions"]', "aria-current"), "page");
  await page.screenshot({ path: shots + "13-decisions.png", fullPage: true });

  // The timeline, reached from the tabs with the keyboard.
  await page.focus('#tabs a[data-tab="timeline"]');
  await page.keyboard.press("Enter");
  await page.waitForURL(new RegExp(`#/s/${s.id}/timeline$`));
  await page.waitForSelector('#timeline tr[data-kind="session_created"]');
  const kinds = await page.$$eval("#timeline tr[data-kind]", (rows) => rows.map((r) => r.dataset.kind));
  for (const kind of ["session_created", "iteration_completed", "guardrail_tripped", "status_changed"]) {
    assert.ok(kinds.includes(kind), `the timeline has ${kind}: ${kinds}`);
  }
  await page.screenshot({ path: shots + "14-timeline.png", fullPage: true });

  // Checkpoints: the one saved when it stopped.
  await page.goto(`${baseUrl}/#/s/${s.id}/checkpoints`);
  await page.waitForSelector("#checkpoints tr[data-id]");
  // Fork from here: the fork opens and links back to where it came from.
  page.once("dialog", (d) => d.accept("try another way"));
  await page.click("#checkpoints button.fork");
  await page.waitForSelector("#forked-line:not([hidden])");
  assert.equal(await page.getAttribute("#forked-link", "href"), `#/s/${s.id}`);
  assert.equal(await page.textContent("#forked-iteration"), "3");
  // The tree draws the family: the original on top, this fork a branch of it.
  await page.waitForSelector(`#tree li.origin[data-id="${s.id}"] li.fork-branch > .node.self`);
  assert.equal(await page.textContent("#tree li.fork-branch > .node.self .fork-mark"), "fork at iteration 3");
  // And the original's page lists its forks under it.
  const forkId = new URL(page.url()).hash.split("/")[2];
  await page.goto(`${baseUrl}/#/s/${s.id}`);
  await page.waitForSelector(`#tree li.fork-branch[data-id="${forkId}"] .fork-mark`);
  assert.deepEqual(pageErrors, []);
});

test("readable on a phone: a 390 px viewport shows the list and a session without sideways scrolling", async () => {
  const s = await createSession({ goal: "Write the phone-sized summary into SUMMARY.md", executor: quick(2, true) });
  await ended(s.id);
  const phone = await browser.newPage({ viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true });
  const errors = [];
  phone.on("pageerror", (err) => errors.push(err.message));
  // The key is in place before the page's first script runs: one load,
  // signed in (a load without it, then a hash change, raced the app's sign-in).
  await phone.addInitScript((k) => sessionStorage.setItem("warden.key", k), key);
  await phone.goto(`${baseUrl}/#/`);
  await phone.waitForSelector(`#sessions tr[data-id="${s.id}"]`);
  const listWidth = await phone.evaluate(() => document.documentElement.scrollWidth);
  assert.ok(listWidth <= 392, `the list fits the phone (${listWidth} px)`);
  await phone.screenshot({ path: shots + "15-phone-list.png", fullPage: true });
  await phone.goto(`${baseUrl}/#/s/${s.id}`);
  await phone.waitForFunction(() => document.querySelector("#status")?.textContent === "completed");
  await phone.waitForSelector("#tokens-chart canvas");
  const pageWidth = await phone.evaluate(() => document.documentElement.scrollWidth);
  assert.ok(pageWidth <= 392, `the session page fits the phone (${pageWidth} px)`);
  await phone.screenshot({ path: shots + "16-phone-session.png", fullPage: true });
  await phone.close();
  assert.deepEqual(errors, []);
});

test("a worker session waiting for a worker says so, and its queue shows the waiting task", async () => {
  const res = await fetch(baseUrl + "/api/autonomous", {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify({
      goal: "Summarise the quarterly report into summary.md",
      executor: { kind: "worker", queue: "dashboard-e2e" },
    }),
  });
  assert.equal(res.status, 201);
  const { id } = await res.json();
  await page.goto(`${baseUrl}/#/s/${id}`);
  await page.waitForFunction(
    () => !document.querySelector("#waiting-worker")?.hidden && document.querySelector("#ww-queue")?.textContent === "dashboard-e2e",
    null,
    { timeout: 15_000 },
  );
  await page.screenshot({ path: shots + "07-waiting-for-worker.png", fullPage: true });

  await page.goto(`${baseUrl}/#/`);
  await page.waitForFunction(
    () => [...document.querySelectorAll("#queues tr")].some((tr) => tr.textContent.includes("dashboard-e2e") && tr.children[1]?.textContent === "1"),
    null,
    { timeout: 15_000 },
  );
  await page.screenshot({ path: shots + "08-worker-queues.png", fullPage: true });

  const stopped = await fetch(`${baseUrl}/api/autonomous/${id}/stop`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
  });
  assert.ok([200, 202].includes(stopped.status), `stop answered ${stopped.status}`);
  assert.deepEqual(pageErrors, []);
});

test("a call waiting for approval shows in the inbox and is approved, edited, from the session page", async () => {
  // A webhook agent in this process: it asks approval to deploy, and
  // deploys in the next step only when that step says it was approved.
  const seen = [];
  const agent = createServer((req, res) => {
    let body = "";
    req.on("data", (d) => (body += d));
    req.on("end", () => {
      const step = JSON.parse(body);
      seen.push(step);
      const answer =
        step.iteration === 1
          ? { action: "build", tokens: 5, output: "built v2",
              approval: { action: "deploy", arguments: { env: "prod" }, reason: "v2 is built and tested" } }
          : step.approval?.decision === "approve"
            ? { action: "deploy", tokens: 5, output: "deployed", signal: "done", reason: "deployed v2" }
            : { action: "skip_deploy", tokens: 5, output: "not deployed", signal: "blocked", reason: "not approved" };
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify(answer));
    });
  });
  await new Promise((resolve) => agent.listen(0, "127.0.0.1", resolve));
  try {
    const res = await fetch(baseUrl + "/api/autonomous", {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
      body: JSON.stringify({
        goal: "Build and deploy v2",
        executor: { kind: "webhook", url: `http://127.0.0.1:${agent.address().port}/step` },
      }),
    });
    assert.equal(res.status, 201, await res.clone().text());
    const { id } = await res.json();

    await page.goto(`${baseUrl}/#/approvals`);
    const row = page.locator(`#approvals tr[data-call="${id}/1.0"]`);
    await row.waitFor({ timeout: 20_000 });
    assert.match(await row.textContent(), /deploy/);
    assert.match(await row.textContent(), /v2 is built and tested/);
    await page.screenshot({ path: shots + "09-approvals-inbox.png", fullPage: true });

    await row.locator("a").click();
    await page.waitForURL(new RegExp(`#/s/${id}$`));
    const call = page.locator('#pending-calls tr[data-call="1.0"]');
    await call.waitFor({ timeout: 10_000 });
    assert.equal(await page.textContent("#reason"), "approval_required");
    assert.ok(await page.isDisabled("#resume-btn"), "a plain resume waits for the decision");
    await page.screenshot({ path: shots + "10-pending-call.png", fullPage: true });
    // The person edits the arguments before approving: staging, not prod.
    const box = call.locator(".approval-arguments");
    assert.deepEqual(JSON.parse(await box.inputValue()), { env: "prod" });
    await box.fill('{ "env": "staging" }');
    await call.locator(".approval-message").fill("go ahead");
    await call.locator(".approve-btn").click();
    await page.waitForFunction(() => document.querySelector("#status")?.textContent === "completed", null, {
      timeout: 20_000,
    });
    assert.ok(await page.isHidden("#pending-approvals"), "nothing waits any more");
    assert.equal(seen.length, 2);
    assert.deepEqual(seen[1].approval, {
      action: "deploy", arguments: { env: "staging" }, arguments_edited: true, decision: "approve", message: "go ahead",
    });
    await page.screenshot({ path: shots + "11-approved.png", fullPage: true });
    assert.deepEqual(pageErrors, []);
  } finally {
    agent.close();
  }
});

test("a parent's page shows its tree of child sessions live; a child links back; the list can hide children", async () => {
  const tag = "tree" + Date.now().toString(36);
  // Two children, each a short script of its own; the parent's own step runs once both ended.
  const child = (what) => ({
    goal: `Draft the ${what} section of the ${tag} notes`,
    steps: [
      { action: `draft_${what}`, tokens: 20, output: `drafted the ${what} section`, delay_ms: 4000 },
      { action: "report", tokens: 5, output: `${what} section drafted\n<<WARDEN_GOAL_DONE: ok>>` },
    ],
  });
  const parent = await createSession({
    goal: `Write the ${tag} release notes`,
    subgoals: [child("api"), child("ui")],
    executor: {
      kind: "scripted",
      steps: [{ action: "merge", tokens: 10, output: "merged the sections\n<<WARDEN_GOAL_DONE: all done>>" }],
    },
  });
  const node = (id) => `#tree li[data-id="${id}"]`;

  await page.goto(`${baseUrl}/#/s/${parent.id}`);
  // Both children show in the tree, under the parent, with their goals.
  await page.waitForFunction(() => document.querySelectorAll("#tree li li").length === 2, null, { timeout: 15_000 });
  assert.ok(await page.isVisible("#tree-section"));
  const childIds = await page.$$eval("#tree li li", (items) => items.map((li) => li.dataset.id));
  const childGoals = await page.$$eval("#tree li li .node-goal", (links) => links.map((a) => a.textContent));
  // Made in one request, the two share a creation time: their order is not asserted.
  assert.deepEqual(childGoals.toSorted(), [child("api").goal, child("ui").goal]);
  assert.equal(await page.getAttribute("#tree > li", "data-id"), parent.id, "the parent is the tree's root");
  assert.ok(await page.isHidden("#parent-line"), "a root is part of no other session");
  // While they run the parent waits for them, and says so in words.
  await page.waitForFunction(() => document.querySelector("#reason")?.textContent === "Waiting for its delegated tasks");
  assert.equal(await page.textContent("#status"), "paused");
  assert.equal(await page.textContent(`${node(parent.id)} > .node .node-reason`), "Waiting for its delegated tasks");
  assert.ok(await page.isHidden("#why-ended"), "a parent waiting for its children has not ended");
  await page.screenshot({ path: shots + "17-tree-running.png", fullPage: true });

  // They complete, the tree follows without a reload, and the parent then runs its own step to the end.
  await page.waitForFunction(
    (ids) => ids.every((id) => document.querySelector(`#tree li[data-id="${id}"]`)?.dataset.status === "completed"),
    childIds,
    { timeout: 30_000 },
  );
  await page.waitForFunction(() => document.querySelector("#status")?.textContent === "completed", null, { timeout: 30_000 });
  await page.waitForFunction((id) => document.querySelector(`#tree li[data-id="${id}"]`)?.dataset.status === "completed", parent.id);
  for (const id of childIds) {
    assert.equal(await page.textContent(`${node(id)} .node-progress`), "100% done");
    assert.match((await page.textContent(`${node(id)} .node-tokens`)) ?? "", /^25 of \d+ tokens/);
  }
  assert.match((await page.textContent("#tree-totals")) ?? "", /^3 sessions · 0 live/);
  assert.match((await page.textContent("#summary")) ?? "", /all done/);
  await page.screenshot({ path: shots + "18-tree-completed.png", fullPage: true });

  // A child's node opens its page, which says whose part it is and links back.
  await page.click(`${node(childIds[0])} a.node-goal`);
  await page.waitForURL(new RegExp(`#/s/${childIds[0]}$`));
  // The child's own status, not the parent's page still shown before the hash change is handled.
  await page.waitForFunction((goal) => document.querySelector("#goal-text")?.textContent === goal, childGoals[0]);
  await page.waitForFunction(() => document.querySelector("#status")?.textContent === "completed");
  await page.waitForFunction((goal) => document.querySelector("#parent-link")?.textContent === goal, parent.goal);
  assert.equal(await page.getAttribute("#parent-link", "href"), `#/s/${parent.id}`);
  await page.waitForSelector(`${node(childIds[0])} .node.self`);
  await page.click("#parent-link");
  await page.waitForURL(new RegExp(`#/s/${parent.id}$`));
  await page.waitForFunction(() => document.querySelectorAll("#tree li li").length === 2);

  // The timeline names the delegations and their ends.
  await page.goto(`${baseUrl}/#/s/${parent.id}/timeline`);
  await page.waitForSelector('#timeline tr[data-kind="child_ended"]');
  const kinds = await page.$$eval("#timeline tr[data-kind]", (rows) => rows.map((r) => r.dataset.kind));
  assert.equal(kinds.filter((k) => k === "child_delegated").length, 2, `two delegations: ${kinds}`);
  assert.equal(kinds.filter((k) => k === "child_ended").length, 2, `two ends: ${kinds}`);

  // The list marks the children; "Top-level only" hides them, by deep link too.
  await page.goto(`${baseUrl}/#/?q=${tag}`);
  await page.waitForFunction(() => document.querySelectorAll("#sessions tr[data-id]").length === 3);
  for (const id of childIds) {
    await page.waitForFunction(
      ([cid, goal]) => document.querySelector(`#sessions tr[data-id="${cid}"] .child-of a`)?.textContent === goal,
      [id, parent.goal],
    );
  }
  assert.equal(await page.$(`#sessions tr[data-id="${parent.id}"] .child-of`), null, "the parent is nobody's child");
  assert.ok(!(await page.isChecked("#f-root")));
  await page.check("#f-root");
  await page.waitForURL(/root_only=true/);
  assert.match(page.url(), new RegExp(`q=${tag}`), "the toggle keeps the other filters");
  await page.waitForFunction((id) => {
    const rows = [...document.querySelectorAll("#sessions tr[data-id]")];
    return rows.length === 1 && rows[0].dataset.id === id;
  }, parent.id);
  await page.screenshot({ path: shots + "19-list-top-level.png", fullPage: true });
  await page.goto(`${baseUrl}/#/?q=${tag}&root_only=true`);
  await page.waitForSelector(`#sessions tr[data-id="${parent.id}"]`);
  assert.ok(await page.isChecked("#f-root"), "the toggle shows the URL's filter");
  assert.deepEqual(await page.$$eval("#sessions tr[data-id]", (rows) => rows.map((r) => r.dataset.id)), [parent.id]);

  // The tree reads on a phone without sideways scrolling.
  const phone = await browser.newPage({ viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true });
  const errors = [];
  phone.on("pageerror", (err) => errors.push(err.message));
  // The key is in place before the page's first script runs: one load,
  // signed in (a load without it, then a hash change, raced the app's sign-in).
  await phone.addInitScript((k) => sessionStorage.setItem("warden.key", k), key);
  await phone.goto(`${baseUrl}/#/s/${parent.id}`);
  await phone.waitForFunction(() => document.querySelectorAll("#tree li li").length === 2);
  const width = await phone.evaluate(() => document.documentElement.scrollWidth);
  assert.ok(width <= 392, `the tree fits the phone (${width} px)`);
  await phone.screenshot({ path: shots + "20-phone-tree.png", fullPage: true });
  await phone.close();
  assert.deepEqual(errors, []);
  assert.deepEqual(pageErrors, []);
});

test("the create form splits a goal into subgoals, each a child session shown in the tree", async () => {
  const tag = "split" + Date.now().toString(36);
  await page.goto(`${baseUrl}/#/new`);
  await page.waitForSelector("#create-form");
  await page.fill("#goal", `Write the ${tag} handbook into handbook.md`);
  await page.selectOption("#executor-kind", "scripted");
  // One quick step: the children run it too (they have no script of their own).
  const steps = page.locator("#steps-editor .step");
  while ((await steps.count()) > 1) await steps.nth(1).locator(".st-remove").click();
  await steps.nth(0).locator(".st-action").fill("write");
  await steps.nth(0).locator(".st-tokens").fill("10");
  await steps.nth(0).locator(".st-output").fill("<<WARDEN_GOAL_DONE: written>>");
  await steps.nth(0).locator(".st-delay").fill("");
  const goals = [`Write the ${tag} introduction into intro.md`, `Write the ${tag} glossary into glossary.md`];
  await page.fill("#subgoals-input", `${goals[0]}\n\n  ${goals[1]}  \n`);
  await page.click("#create-btn");
  await page.waitForURL(/#\/s\/[0-9a-f-]{36}$/);
  const id = page.url().split("/s/")[1];
  await page.waitForFunction(() => document.querySelectorAll("#tree li li").length === 2, null, { timeout: 15_000 });
  const shownGoals = await page.$$eval("#tree li li .node-goal", (links) => links.map((a) => a.textContent));
  assert.deepEqual(shownGoals.toSorted(), goals.toSorted(), "one child a line, trimmed, blank lines skipped");
  await page.waitForFunction(() => document.querySelector("#status")?.textContent === "completed", null, { timeout: 30_000 });
  const s = await (await fetch(`${baseUrl}/api/autonomous/${id}`, { headers: { authorization: `Bearer ${key}` } })).json();
  assert.deepEqual(s.children.map((c) => [c.goal, c.status]).toSorted(), goals.toSorted().map((g) => [g, "completed"]));
  assert.deepEqual(pageErrors, []);
});
