// Warden's client for TypeScript: the types are generated from the OpenAPI
// document (openapi/openapi.json, by openapi-typescript into schema.d.ts) and
// requests go through openapi-fetch, so a request or answer the document
// does not describe is a compile error. `WardenClient` wraps the calls most
// programs make (create, get, list, stop, resume, wait); `raw` reaches every
// other operation with the same types.
import createClient, { type Client } from "openapi-fetch";
import type { components, paths } from "./schema.js";

export type { components, paths } from "./schema.js";

/** A session as every read answers it. */
export type Session = components["schemas"]["SessionView"];
/** The body of a create: goal, executor, limits, mode, … */
export type CreateSession = components["schemas"]["CreateSession"];
/** The optional body of a resume: guidance and raised limits. */
export type ResumeSession = components["schemas"]["ResumeSession"];
/** One page of sessions, with the cursor of the next. */
export type SessionPage = components["schemas"]["SessionPage"];
/** The filters and paging of a list. */
export type ListQuery = NonNullable<paths["/api/autonomous"]["get"]["parameters"]["query"]>;
/** Where a session is in its life. */
export type Status = components["schemas"]["Status"];
/** An error answer (RFC 9457 problem details with Warden's `code`). */
export type Problem = components["schemas"]["Problem"];

/** The statuses `wait` answers by default: ended, paused for a person, or awaiting confirmation. */
export const SETTLED: readonly Status[] = [
  "completed",
  "stopped",
  "interrupted",
  "failed",
  "paused",
  "awaiting_confirmation",
];

/** An answer that is not a success: the HTTP status and the server's problem document. */
export class WardenError extends Error {
  /** The HTTP status of the answer. */
  readonly status: number;
  /** The problem document, when the server sent one. */
  readonly problem?: Problem;

  constructor(status: number, problem?: Problem) {
    super(problem ? `${status} ${problem.code}: ${problem.detail ?? problem.title}` : `HTTP ${status}`);
    this.name = "WardenError";
    this.status = status;
    this.problem = problem;
  }
}

/** How to reach a server. */
export interface ClientOptions {
  /** The server's base URL, e.g. `http://127.0.0.1:8080`. */
  baseUrl: string;
  /** A key made with POST /api/keys (sent as a bearer token); none for a fresh loopback server. */
  apiKey?: string;
  /** Another fetch (tests, proxies); default the global one. */
  fetch?: typeof globalThis.fetch;
}

/** How long `wait` polls and what it waits for. */
export interface WaitOptions {
  /** The statuses to wait for; default `SETTLED`. */
  statuses?: readonly Status[];
  /** Give up with an Error after this many milliseconds; default 60 000. */
  timeoutMs?: number;
  /** Time between polls in milliseconds; default 100. */
  pollMs?: number;
  /** Answer a `paused / waiting_for_children` too (it goes on by itself, so not by default). */
  waitingForChildren?: boolean;
}

// What openapi-fetch answers: data on success, error otherwise.
interface Answer<T> {
  data?: T;
  error?: unknown;
  response: Response;
}

function unwrap<T>({ data, error, response }: Answer<T>): T {
  if (data !== undefined && response.ok) return data;
  const problem = error && typeof error === "object" && "code" in error ? (error as Problem) : undefined;
  throw new WardenError(response.status, problem);
}

/** Whether `wait` answers with this view. */
export function settled(session: Session, statuses: readonly Status[] = SETTLED, waitingForChildren = false): boolean {
  if (!statuses.includes(session.status)) return false;
  return waitingForChildren || !(session.status === "paused" && session.reason === "waiting_for_children");
}

/** A typed client of one Warden server. */
export class WardenClient {
  /** The generated client: every operation of the document, typed. */
  readonly raw: Client<paths>;

  constructor(options: ClientOptions) {
    this.raw = createClient<paths>({
      baseUrl: options.baseUrl.replace(/\/+$/, ""),
      headers: options.apiKey ? { authorization: `Bearer ${options.apiKey}` } : {},
      fetch: options.fetch,
    });
  }

  /** Creates a session (201); a `dry_run` create answers an estimate, which this refuses: use `raw`. */
  async create(body: CreateSession): Promise<Session> {
    const created = unwrap(await this.raw.POST("/api/autonomous", { body }));
    if (!("id" in created)) throw new Error("a dry_run create answers an estimate, not a session: use raw.POST");
    return created;
  }

  /** The session's current view. */
  async get(id: string): Promise<Session> {
    return unwrap(await this.raw.GET("/api/autonomous/{id}", { params: { path: { id } } }));
  }

  /** One page of the caller's sessions; pass `next_cursor` back as `cursor` for the next. */
  async list(query: ListQuery = {}): Promise<SessionPage> {
    return unwrap(await this.raw.GET("/api/autonomous", { params: { query } }));
  }

  /** Stops the session (interrupted, checkpoint saved); a stop of a stopped session answers it again. */
  async stop(id: string): Promise<Session> {
    return unwrap(await this.raw.POST("/api/autonomous/{id}/stop", { params: { path: { id } } }));
  }

  /** Resumes from the last checkpoint, with optional guidance and raised limits. */
  async resume(id: string, body?: ResumeSession): Promise<Session> {
    return unwrap(await this.raw.POST("/api/autonomous/{id}/resume", { params: { path: { id } }, body }));
  }

  /** Polls until the session settles (see `WaitOptions`); an Error after the timeout. */
  async wait(id: string, options: WaitOptions = {}): Promise<Session> {
    const { statuses = SETTLED, timeoutMs = 60_000, pollMs = 100, waitingForChildren = false } = options;
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const session = await this.get(id);
      if (settled(session, statuses, waitingForChildren)) return session;
      if (Date.now() >= deadline) throw new Error(`session ${id} still ${session.status} after ${timeoutMs} ms`);
      await new Promise((resolve) => setTimeout(resolve, pollMs));
    }
  }
}
