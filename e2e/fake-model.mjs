// A fake OpenAI-compatible model for the end-to-end run: a tiny HTTP server
// on 127.0.0.1 answering POST /v1/chat/completions with what `answer`
// returns for each request, in the shapes Warden's client reads (the
// assistant message, tool_calls with JSON-string arguments, usage). Every
// request is kept, so a test can check what reached the model. A request
// `answer` has nothing for (it returns null) is answered 503, the way an
// unavailable model would be.
import { createServer } from "node:http";

/** A completion whose assistant message calls one tool. */
export function toolCall(id, name, args, tokens = 40) {
  return {
    id: "chatcmpl-e2e",
    object: "chat.completion",
    choices: [{
      index: 0,
      finish_reason: "tool_calls",
      message: {
        role: "assistant",
        content: null,
        tool_calls: [{ id, type: "function", function: { name, arguments: JSON.stringify(args) } }],
      },
    }],
    usage: { prompt_tokens: tokens / 2, completion_tokens: tokens / 2, total_tokens: tokens },
  };
}

/** The contents of the tool results in a chat request, in order. */
export function toolResults(request) {
  return (request.messages ?? []).filter((m) => m.role === "tool").map((m) => String(m.content ?? ""));
}

/**
 * Starts the fake model. `answer(request)` gives the completion body for a
 * request, or null for a 503. Resolves to { baseUrl, requests, close }.
 */
export async function startFakeModel(answer) {
  const requests = [];
  const server = createServer((req, res) => {
    let body = "";
    req.on("data", (d) => (body += d));
    req.on("end", () => {
      let reply = null;
      if (req.method === "POST" && req.url?.split("?")[0] === "/v1/chat/completions") {
        try {
          const request = JSON.parse(body);
          requests.push(request);
          reply = answer(request);
        } catch (err) {
          reply = null;
          requests.push({ unreadable: String(err) });
        }
      }
      if (reply === null || reply === undefined) {
        res.writeHead(503, { "content-type": "application/json" });
        res.end(JSON.stringify({ error: { message: "fake model: nothing scripted for this request" } }));
        return;
      }
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify(reply));
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    baseUrl: `http://127.0.0.1:${server.address().port}/v1`,
    requests,
    close: () => new Promise((resolve) => {
      server.close(resolve);
      server.closeAllConnections();
    }),
  };
}
