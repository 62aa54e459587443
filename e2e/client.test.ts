// The generated TypeScript client (openapi-typescript types + openapi-fetch)
// drives create / status / stop / resume against the real server. If the
// committed OpenAPI document stops describing what the server does, this
// fails to compile or to run.
import { test } from "node:test";
import assert from "node:assert/strict";
import createClient from "openapi-fetch";
import type { paths, components } from "./generated/schema.js";

type Session = components["schemas"]["SessionView"];

const baseUrl = process.env.WARDEN_URL ?? "http://127.0.0.1:8080";
// An operator key made by run.sh through POST /api/keys (the document's bearer scheme).
const key = process.env.WARDEN_KEY ?? "";
const client = createClient<paths>({ baseUrl, headers: { authorization: `Bearer ${key}` } });

test("without a key the client is refused with a problem", async () => {
  const anonymous = createClient<paths>({ baseUrl });
  const { error, response } = await anonymous.GET("/api/autonomous", {});
  assert.equal(response.status, 401);
  assert.equal(response.headers.get("content-type"), "application/problem+json");
  assert.ok(error);
});

async function status(id: string): Promise<Session> {
  const { data, error } = await client.GET("/api/autonomous/{id}", { params: { path: { id } } });
  assert.equal(error, undefined);
  assert.ok(data);
  return data;
}

async function until(id: string, done: (s: Session) => boolean): Promise<Session> {
  for (let i = 0; i < 300; i++) {
    const s = await status(id);
    if (done(s)) return s;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error("condition not reached");
}

test("create, status, stop and resume through the generated client", async () => {
  const created = await client.POST("/api/autonomous", {
    body: {
      goal: "Create README.md with a project description",
      mode: "fixed",
      limits: { max_iterations: 20 },
      executor: {
        kind: "scripted",
        steps: [
          { action: "plan", tokens: 10, output: "planned" },
          { action: "write", tokens: 10, output: "writing", delay_ms: 5000 },
          { action: "finish", tokens: 10, output: "<<WARDEN_GOAL_DONE: written>>" },
        ],
      },
    },
  });
  assert.equal(created.response.status, 201);
  // A create answers 201 with the session, or 200 with an estimate for a
  // dry run: the generated type is the union, narrowed here.
  const session = created.data && "id" in created.data ? created.data : assert.fail("no session");
  const id = session.id;
  assert.equal(session.status, "running");

  await until(id, (s) => s.iterations >= 1);
  const stopped = await client.POST("/api/autonomous/{id}/stop", { params: { path: { id } } });
  assert.equal(stopped.data!.status, "interrupted");
  assert.equal(stopped.data!.reason, "user_stop");
  assert.equal(stopped.data!.checkpoint_saved, true);

  const again = await client.POST("/api/autonomous/{id}/stop", { params: { path: { id } } });
  assert.equal(again.data!.status, "interrupted", "stop is idempotent");

  const resumed = await client.POST("/api/autonomous/{id}/resume", {
    params: { path: { id } },
    body: { guidance: "carry on", limits: { max_iterations: 30 } },
  });
  assert.equal(resumed.data!.status, "running");
  assert.equal(resumed.data!.limits.max_iterations, 30);

  const done = await until(id, (s) => s.status !== "running");
  assert.equal(done.status, "completed");
  assert.equal(done.iterations, 3);

  const conflict = await client.POST("/api/autonomous/{id}/resume", { params: { path: { id } }, body: {} });
  assert.equal(conflict.response.status, 409);
  assert.equal(conflict.error?.code, "illegal_transition");
});

test("errors come back as typed problem documents", async () => {
  const missing = await client.GET("/api/autonomous/{id}", {
    params: { path: { id: "00000000-0000-4000-8000-000000000000" } },
  });
  assert.equal(missing.response.status, 404);
  assert.equal(missing.error?.code, "session_not_found");
});

test("resume without a body, and a documented 400 as a typed problem", async () => {
  const created = await client.POST("/api/autonomous", {
    body: {
      goal: "Ask for help, then finish",
      executor: {
        kind: "scripted",
        steps: [
          { action: "ask", output: "<<WARDEN_GOAL_BLOCKED: need a hint>>" },
          { action: "finish", output: "<<WARDEN_GOAL_DONE: finished>>" },
        ],
      },
    },
  });
  assert.equal(created.response.status, 201);
  const id = created.data && "id" in created.data ? created.data.id : assert.fail("no session");
  const waiting = await until(id, (s) => s.status !== "running");
  assert.notEqual(waiting.status, "completed");

  // The request body of resume is optional in the document: no body at all.
  const resumed = await client.POST("/api/autonomous/{id}/resume", { params: { path: { id } } });
  assert.equal(resumed.response.status, 200, JSON.stringify(resumed.error));
  assert.equal(resumed.data!.run, 2);
  const done = await until(id, (s) => s.status !== "running");
  assert.equal(done.status, "completed");

  // An out-of-range page size is a documented 400 with a problem body.
  const tooBig = await client.GET("/api/autonomous/{id}/iterations", {
    params: { path: { id }, query: { limit: 501 } },
  });
  assert.equal(tooBig.response.status, 400);
  assert.equal(tooBig.error?.code, "bad_request");
  assert.match(tooBig.error?.detail ?? "", /limit/);

  // A session has one address: any other spelling of an id is no such session.
  const badId = await client.GET("/api/autonomous/{id}", { params: { path: { id: "not-a-uuid" } } });
  assert.equal(badId.response.status, 404);
  assert.equal(badId.error?.code, "session_not_found");
});
