// The package against a real server: WARDEN_URL and an operator key in
// WARDEN_KEY (e2e/run.sh starts the server and makes the key). Without
// WARDEN_URL only the tests that need no server run.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { SETTLED, WardenClient, WardenError, settled, type Session } from "../src/index.js";

const baseUrl = process.env.WARDEN_URL;
const client = new WardenClient({ baseUrl: baseUrl ?? "http://127.0.0.1:9", apiKey: process.env.WARDEN_KEY });
const live = { skip: baseUrl ? false : "WARDEN_URL is not set (e2e/run.sh sets it)" };

function view(status: Session["status"], reason: Session["reason"] = null): Session {
  return { status, reason } as Session;
}

// package.json, as compiled to dist/test/, is two folders up; the document three more.
const read = (path: string) => JSON.parse(readFileSync(new URL(path, import.meta.url), "utf8"));

test("the package's version is the API's, from the document it was generated from", () => {
  const pkg = read("../../package.json");
  const document = read("../../../../openapi/openapi.json");
  assert.equal(pkg.version, document.info.version);
  assert.equal(pkg.license, document.info.license.identifier);
});

test("wait settles on ended and paused sessions, not on one waiting for its children", () => {
  assert.ok(settled(view("completed")));
  assert.ok(settled(view("paused", "user_pause")));
  assert.ok(!settled(view("running")));
  assert.ok(!settled(view("paused", "waiting_for_children")));
  assert.ok(settled(view("paused", "waiting_for_children"), SETTLED, true));
  assert.ok(!settled(view("completed"), ["failed"]));
});

test("create, get, list, stop, resume and wait against the server", live, async () => {
  const session = await client.create({
    goal: "Write the TypeScript package's test file",
    mode: "fixed",
    limits: { max_iterations: 20 },
    executor: {
      kind: "scripted",
      steps: [
        { action: "plan", tokens: 10, output: "planned" },
        { action: "write", tokens: 10, output: "writing", delay_ms: 3000 },
        { action: "finish", tokens: 10, output: "<<WARDEN_GOAL_DONE: written>>" },
      ],
    },
  });
  assert.equal(session.status, "running");
  assert.equal((await client.get(session.id)).id, session.id);

  const page = await client.list({ q: "TypeScript package's test file", limit: 10 });
  assert.ok(page.items.some((s) => s.id === session.id), "the new session is listed");

  const stopped = await client.stop(session.id);
  assert.equal(stopped.status, "interrupted");
  assert.equal(stopped.reason, "user_stop");
  // An interrupted session is settled: wait answers at once.
  assert.equal((await client.wait(session.id)).status, "interrupted");

  const resumed = await client.resume(session.id, { guidance: "carry on", limits: { max_iterations: 30 } });
  assert.equal(resumed.status, "running");
  assert.equal(resumed.limits.max_iterations, 30);
  const done = await client.wait(session.id, { timeoutMs: 30_000 });
  assert.equal(done.status, "completed");
  assert.equal(done.reason, "goal_achieved");
});

test("an error answer is a WardenError with the server's problem", live, async () => {
  await assert.rejects(client.get("00000000-0000-4000-8000-000000000000"), (e: unknown) => {
    assert.ok(e instanceof WardenError);
    assert.equal(e.status, 404);
    assert.equal(e.problem?.code, "session_not_found");
    return true;
  });
  const anonymous = new WardenClient({ baseUrl: baseUrl ?? "" });
  await assert.rejects(anonymous.list(), (e: unknown) => e instanceof WardenError && e.status === 401);
});

test("wait gives up after its timeout", live, async () => {
  const session = await client.create({
    goal: "A slow step to wait on",
    executor: { kind: "scripted", steps: [{ action: "slow", output: "slow", delay_ms: 10_000 }] },
  });
  await assert.rejects(client.wait(session.id, { timeoutMs: 200, pollMs: 50 }), /still running after 200 ms/);
  await client.stop(session.id);
});
