// A real reference MCP server in the loop: @modelcontextprotocol/server-filesystem
// (pinned in package.json, run from node_modules by the `fs` server of the
// WARDEN_MCP_CONFIG that run.sh writes) serves the `llm` agent's tools, and
// a fake OpenAI-compatible model (fake-model.mjs) drives the calls: list the
// shared folder (read-only: runs at once), write a note (destructive by the
// server's own annotations: waits for a person), and finish once the write's
// result came back. A person approves the write with an edited path through
// the API; only the edited file is written, once, and the model is told.
// Then the same round for a server on the Python SDK (FastMCP,
// fastmcp/server.py), as `py` over stdio and `pyweb` over Streamable HTTP:
// a read-only echo runs at once, a destructive write waits for a person.
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import { startFakeModel, toolCall, toolResults } from "./fake-model.mjs";

const baseUrl = process.env.WARDEN_URL ?? "http://127.0.0.1:8080";
const adminToken = process.env.WARDEN_ADMIN_TOKEN ?? "";
// The folder the `fs` server may use, and the one tenant it serves (run.sh).
const folder = process.env.E2E_MCP_DIR ?? "";
const tenant = process.env.E2E_MCP_TENANT ?? "";
// Where the FastMCP servers log each call's tool name (run.sh).
const fastmcpLogs = process.env.E2E_FASTMCP_LOGS ?? "";

async function call(key, method, path, body) {
  const res = await fetch(baseUrl + path, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(body ? { "content-type": "application/json" } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : null };
}

/** Polls the session until `done` holds, failing after `ms` with its last state. */
async function until(key, id, what, done, ms = 30_000) {
  const deadline = Date.now() + ms;
  let last;
  while (Date.now() < deadline) {
    const { status, body } = await call(key, "GET", `/api/autonomous/${id}`);
    assert.equal(status, 200, JSON.stringify(body));
    last = body;
    if (done(body)) return body;
    if (["completed", "failed", "stopped", "interrupted"].includes(body.status)) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.fail(`${what}: not reached; the session is ${JSON.stringify(last)}`);
}

test("a real MCP server's tools run for the llm agent, and a person approves a write with edited arguments", async () => {
  assert.ok(folder && tenant, "run.sh sets E2E_MCP_DIR and E2E_MCP_TENANT");
  // A key of the tenant the server is declared for.
  const made = await call(adminToken, "POST", "/api/keys", { tenant, role: "operator" });
  assert.equal(made.status, 201, JSON.stringify(made.body));
  const key = made.body.secret;

  // Only the real server can list this file back to the model.
  const seed = `seed-${randomBytes(6).toString("hex")}.txt`;
  writeFileSync(join(folder, seed), "planted by the test\n");
  const asked = join(folder, "draft.md");
  const edited = join(folder, "approved.md");
  const content = `approved by a person ${randomBytes(4).toString("hex")}`;

  const model = await startFakeModel((request) => {
    const offered = (request.tools ?? []).map((t) => t.function?.name);
    // Reflections and summaries (no tools) are not scripted: 503.
    if (!offered.includes("fs__list_directory") || !offered.includes("fs__write_file")) return null;
    const results = toolResults(request);
    const last = results.at(-1) ?? "";
    if (results.length === 0) return toolCall("call_list", "fs__list_directory", { path: folder });
    if (results.length === 1 && last.includes(`[FILE] ${seed}`)) {
      return toolCall("call_write", "fs__write_file", { path: asked, content: "the agent's draft" });
    }
    if (results.length === 2 && last.includes("Successfully wrote") && last.includes("edited the arguments")) {
      return toolCall("call_done", "task_completion", { result: "the note is written", deliverables: [] });
    }
    return null;
  });
  try {
    const created = await call(key, "POST", "/api/autonomous", {
      goal: "List the shared folder, then leave a note in it",
      executor: {
        kind: "llm",
        base_url: model.baseUrl,
        model: "e2e-fake",
        tools: ["fs"],
        approvals: { default: "never", tools: { "fs__*": "when_not_read_only" } },
      },
    });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    const id = created.body.id;

    const waiting = await until(key, id, "the write waits for approval",
      (s) => s.status === "paused" && s.reason === "approval_required");
    assert.equal(waiting.pending_approvals.length, 1, JSON.stringify(waiting));
    const pending = waiting.pending_approvals[0];
    assert.equal(pending.tool, "fs__write_file");
    assert.equal(pending.arguments.path, asked);
    assert.equal(existsSync(asked), false, "nothing was written before the decision");

    const decided = await call(key, "POST", `/api/autonomous/${id}/approvals/${pending.call_id}`, {
      decision: "approve",
      arguments: { path: edited, content },
    });
    assert.equal(decided.status, 200, JSON.stringify(decided.body));
    const done = await until(key, id, "the session completes", (s) => s.status === "completed");
    assert.equal(done.status, "completed");

    // The server wrote the person's file, not the agent's.
    assert.equal(readFileSync(edited, "utf8"), content);
    assert.equal(existsSync(asked), false, "the agent's own arguments never ran");

    // What reached the model: the listing from the real server, then the
    // write's result with the note that a person edited it.
    const steps = model.requests.filter((r) => (r.tools ?? []).length > 0);
    assert.equal(steps.length, 3, "one model call per step, none repeated");
    assert.ok(toolResults(steps[1]).some((r) => r.includes(`[FILE] ${seed}`)), JSON.stringify(steps[1].messages));
    const writeResult = toolResults(steps[2]).at(-1);
    assert.match(writeResult, /^Successfully wrote to /);
    assert.ok(writeResult.includes(edited) && writeResult.includes("edited the arguments"), writeResult);

    // And from the API: the iterations' observations, and the record of the edit.
    const iterations = await call(key, "GET", `/api/autonomous/${id}/iterations`);
    assert.equal(iterations.status, 200);
    const observations = iterations.body.items.map((i) => i.record?.observation ?? "");
    assert.ok(observations.some((o) => o.startsWith("fs__list_directory: ") && o.includes(`[FILE] ${seed}`)), JSON.stringify(observations));
    assert.equal(
      observations.filter((o) => o.includes("fs__write_file: Successfully wrote")).length, 1,
      `the approved write ran exactly once: ${JSON.stringify(observations)}`,
    );
    const events = await call(key, "GET", `/api/autonomous/${id}/events?limit=500`);
    assert.equal(events.status, 200);
    const approvals = events.body.items.filter((e) => e.kind === "approval_decided");
    assert.equal(approvals.length, 1, JSON.stringify(approvals));
    assert.equal(approvals[0].data.decision, "approve");
    assert.deepEqual(approvals[0].data.edited_arguments, { path: edited, content });
  } finally {
    await model.close();
  }
});

/** The tools a FastMCP server really ran, in order (its MCP_FIXTURE_LOG). */
function fastmcpCalls(server) {
  const log = join(fastmcpLogs, `${server}.log`);
  return existsSync(log) ? readFileSync(log, "utf8").split("\n").filter(Boolean) : [];
}

for (const [server, transport] of [["py", "stdio"], ["pyweb", "Streamable HTTP"]]) {
  test(`the Python SDK's FastMCP server over ${transport} serves the llm agent, and a write waits for a person`, async () => {
    assert.ok(fastmcpLogs && tenant, "run.sh sets E2E_FASTMCP_LOGS and E2E_MCP_TENANT");
    const made = await call(adminToken, "POST", "/api/keys", { tenant, role: "operator" });
    assert.equal(made.status, 201, JSON.stringify(made.body));
    const key = made.body.secret;
    const token = randomBytes(6).toString("hex");
    const content = `approved text ${token}`;

    const echo = `${server}__echo`;
    const write = `${server}__write`;
    const model = await startFakeModel((request) => {
      const offered = (request.tools ?? []).map((t) => t.function?.name);
      if (!offered.includes(echo) || !offered.includes(write)) return null;
      const results = toolResults(request);
      const last = results.at(-1) ?? "";
      if (results.length === 0) return toolCall("call_echo", echo, { text: token });
      if (results.length === 1 && last.includes(`echo: ${token}`)) {
        return toolCall("call_write", write, { name: "draft", text: "the agent's draft" });
      }
      if (results.length === 2 && last.includes(`wrote ${content.length} characters to approved`)) {
        return toolCall("call_done", "task_completion", { result: "the note is written", deliverables: [] });
      }
      return null;
    });
    try {
      const created = await call(key, "POST", "/api/autonomous", {
        goal: "Echo a token, then leave a note",
        executor: {
          kind: "llm",
          base_url: model.baseUrl,
          model: "e2e-fake",
          tools: [server],
          approvals: { default: "never", tools: { [`${server}__*`]: "when_not_read_only" } },
        },
      });
      assert.equal(created.status, 201, JSON.stringify(created.body));
      const id = created.body.id;

      // The server's own annotations: echo is read-only (ran), write is destructive (waits).
      const waiting = await until(key, id, "the write waits for approval",
        (s) => s.status === "paused" && s.reason === "approval_required");
      assert.equal(waiting.pending_approvals.length, 1, JSON.stringify(waiting));
      const pending = waiting.pending_approvals[0];
      assert.equal(pending.tool, write);
      assert.deepEqual(fastmcpCalls(server), ["echo"], "the echo ran, the write waits");

      const decided = await call(key, "POST", `/api/autonomous/${id}/approvals/${pending.call_id}`, {
        decision: "approve",
        arguments: { name: "approved", text: content },
      });
      assert.equal(decided.status, 200, JSON.stringify(decided.body));
      const done = await until(key, id, "the session completes", (s) => s.status === "completed");
      assert.equal(done.status, "completed");
      assert.deepEqual(fastmcpCalls(server), ["echo", "write"], "the approved write ran once");

      const iterations = await call(key, "GET", `/api/autonomous/${id}/iterations`);
      assert.equal(iterations.status, 200);
      const observations = iterations.body.items.map((i) => i.record?.observation ?? "");
      assert.ok(observations.some((o) => o.includes(`${echo}: echo: ${token}`)), JSON.stringify(observations));
      assert.ok(
        observations.some((o) => o.includes(`${write}: wrote ${content.length} characters to approved`)),
        JSON.stringify(observations),
      );
    } finally {
      await model.close();
    }
  });
}
