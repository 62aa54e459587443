//! MCP tools for the model agent, against a real MCP server: the fixture
//! `warden-mcp-fixture` (src/bin/warden-mcp-fixture.rs, rmcp's server side,
//! which Cargo builds for these tests), over stdio and over Streamable HTTP
//! on loopback, with the fake model driving the calls. The end-to-end run
//! (e2e/mcp.test.mjs) checks Warden against the Python and TypeScript SDKs'
//! servers as well. A build without the `mcp-fixture` feature (on by
//! default) has no fixture, and so none of these tests.
#![cfg(feature = "mcp-fixture")]

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::fake_llm::{FakeLlm, tool_calls};
use common::{TestApp, client_with_key, config_with, create_key};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The fixture server's binary, built by Cargo beside the tests.
fn fixture() -> &'static str {
    env!("CARGO_BIN_EXE_warden-mcp-fixture")
}

/// A scratch directory for one test: its MCP config and the fixture's call log.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        let dir = std::env::temp_dir().join(format!("warden-mcp-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }

    fn log(&self) -> PathBuf {
        self.0.join("calls.log")
    }

    /// The tools the fixture really ran, in order.
    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.log())
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// A stdio server declaration running the fixture, with `extra` fields.
    fn stdio(&self, extra: Value) -> Value {
        let mut server = json!({
            "command": fixture(),
            "args": [],
            "env": { "MCP_FIXTURE_LOG": self.log().to_string_lossy() },
        });
        if let (Some(s), Some(e)) = (server.as_object_mut(), extra.as_object()) {
            s.extend(e.clone());
        }
        server
    }

    /// Writes `{"mcpServers": servers}` and returns its path.
    fn config(&self, servers: Value) -> String {
        let path = self.0.join("mcp.json");
        std::fs::write(&path, json!({ "mcpServers": servers }).to_string()).expect("config");
        path.to_string_lossy().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The fixture over Streamable HTTP on a free loopback port, killed when dropped.
struct HttpFixture {
    child: std::process::Child,
    port: u16,
}

impl HttpFixture {
    async fn start(log: &Path) -> HttpFixture {
        let port = common::free_port();
        let child = std::process::Command::new(fixture())
            .args(["--http", &port.to_string()])
            .env("MCP_FIXTURE_LOG", log)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("the fixture starts");
        common::eventually(
            Duration::from_secs(30),
            "the HTTP fixture to listen",
            || async move {
                tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_ok()
            },
        )
        .await;
        HttpFixture { child, port }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}

impl Drop for HttpFixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn vars<'a>(fake_base: &'a str, config: &'a str) -> [(&'a str, &'a str); 3] {
    [
        ("WARDEN_LLM_BASE_URL", fake_base),
        ("WARDEN_LLM_MODEL", "fake-model"),
        ("WARDEN_MCP_CONFIG", config),
    ]
}

async fn app_with(fake: &FakeLlm, config: &str) -> TestApp {
    let base = fake.base_url();
    TestApp::start_with(config_with(&vars(&base, config))).await
}

fn llm_session(tools: Value) -> Value {
    json!({
        "goal": "Create README.md with a project description",
        "mode": "fixed",
        "executor": { "kind": "llm", "tools": tools }
    })
}

async fn create(app: &TestApp, tools: Value) -> String {
    app.create(llm_session(tools)).await["id"]
        .as_str()
        .expect("id")
        .to_string()
}

fn done() -> common::fake_llm::Answer {
    tool_calls(&[("task_completion", json!({ "result": "done" }))], 10)
}

/// The function names a model request offered.
fn offered(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["function"]["name"].as_str().expect("name").to_string())
        .collect()
}

fn tool_of<'a>(request: &'a Value, name: &str) -> &'a Value {
    request["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .find(|t| t["function"]["name"] == name)
        .unwrap_or_else(|| panic!("{name} not offered: {request}"))
}

fn observations(iterations: &[Value]) -> Vec<String> {
    iterations
        .iter()
        .map(|i| {
            i["record"]["observation"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

#[tokio::test]
async fn stdio_tools_are_offered_namespaced_and_their_results_reach_the_model() {
    let scratch = Scratch::new();
    let config = scratch.config(json!({ "fix": scratch.stdio(json!({})) }));
    let fake = FakeLlm::start().await;
    fake.agent(tool_calls(
        &[("fix__echo", json!({ "text": "hello over stdio" }))],
        20,
    ))
    .agent(done());
    let app = app_with(&fake, &config).await;
    let id = create(&app, json!(["builtin", "fix"])).await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["executor"]["tools"], json!(["builtin", "fix"]));

    let requests = fake.agent_requests();
    let names = offered(&requests[0]);
    for name in [
        "fix__echo",
        "fix__read",
        "fix__count",
        "read_file",
        "task_completion",
    ] {
        assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
    }
    let echo = tool_of(&requests[0], "fix__echo");
    assert_eq!(
        echo["function"]["parameters"]["properties"]["text"]["type"], "string",
        "the tool's own input schema: {echo}"
    );
    assert!(
        echo["function"]["description"]
            .as_str()
            .unwrap()
            .contains("prefixed"),
        "{echo}"
    );
    // The result went back to the model in the next request, and is stored.
    assert!(
        requests[1]["messages"]
            .to_string()
            .contains("echo: hello over stdio"),
        "{}",
        requests[1]["messages"]
    );
    let iterations = app.iterations(&id).await;
    assert_eq!(iterations[0]["action"], "fix__echo");
    assert_eq!(
        observations(&iterations)[0],
        "fix__echo: echo: hello over stdio"
    );
    assert_eq!(scratch.calls(), ["echo"]);
}

#[tokio::test]
async fn streamable_http_tools_are_called_the_same_way() {
    let scratch = Scratch::new();
    let fixture = HttpFixture::start(&scratch.log()).await;
    let config = scratch.config(json!({
        "web": { "url": fixture.url(), "headers": { "X-Fixture-Token": "s3cret-header-value" } }
    }));
    let fake = FakeLlm::start().await;
    fake.agent(tool_calls(
        &[("web__echo", json!({ "text": "hello over http" }))],
        20,
    ))
    .agent(done());
    let app = app_with(&fake, &config).await;
    let id = create(&app, json!(["web:echo"])).await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    let requests = fake.agent_requests();
    assert!(
        requests[1]["messages"]
            .to_string()
            .contains("echo: hello over http")
    );
    assert_eq!(
        observations(&app.iterations(&id).await)[0],
        "web__echo: echo: hello over http"
    );
    assert_eq!(scratch.calls(), ["echo"]);
    assert!(!s.to_string().contains("s3cret-header-value"));
}

#[tokio::test]
async fn only_the_chosen_tools_are_offered_and_callable() {
    let scratch = Scratch::new();
    let config = scratch.config(json!({ "fs": scratch.stdio(json!({})) }));
    let fake = FakeLlm::start().await;
    // The model calls a tool it was not offered, then the one it was.
    fake.agent(tool_calls(
        &[("fs__write", json!({ "name": "a", "text": "b" }))],
        20,
    ))
    .agent(tool_calls(&[("fs__read", json!({ "name": "notes" }))], 20))
    .agent(done());
    let app = app_with(&fake, &config).await;
    let id = create(&app, json!(["fs:read"])).await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    let names = offered(&fake.agent_requests()[0]);
    assert!(names.contains(&"fs__read".to_string()), "{names:?}");
    for absent in [
        "fs__write",
        "fs__echo",
        "read_file",
        "write_file",
        "list_files",
    ] {
        assert!(!names.iter().any(|n| n == absent), "{absent} in {names:?}");
    }
    // The controls are always there.
    assert!(names.contains(&"task_completion".to_string()), "{names:?}");
    let seen = observations(&app.iterations(&id).await);
    assert!(seen[0].contains("unknown tool `fs__write`"), "{seen:?}");
    assert_eq!(seen[1], "fs__read: contents of notes");
    assert_eq!(
        scratch.calls(),
        ["read"],
        "the write never reached the server"
    );
}

#[tokio::test]
async fn a_call_past_its_timeout_is_a_tool_error_and_the_session_goes_on() {
    let scratch = Scratch::new();
    let config = scratch.config(json!({ "fix": scratch.stdio(json!({ "timeout_ms": 1000 })) }));
    let fake = FakeLlm::start().await;
    fake.agent(tool_calls(&[("fix__sleep", json!({ "seconds": 30 }))], 20))
        .agent(tool_calls(&[("fix__echo", json!({ "text": "after" }))], 20))
        .agent(done());
    let app = app_with(&fake, &config).await;
    let id = create(&app, json!(["fix"])).await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    let iterations = app.iterations(&id).await;
    let seen = observations(&iterations);
    assert!(
        seen[0].contains("did not answer within 1000 ms"),
        "{seen:?}"
    );
    assert_eq!(iterations[0]["outcome"], "failure", "{}", iterations[0]);
    // The hung server was dropped and a new one answers.
    assert_eq!(seen[1], "fix__echo: echo: after");
    assert_eq!(scratch.calls(), ["sleep", "echo"]);
}

#[tokio::test]
async fn a_crashed_server_gives_a_tool_error_and_is_started_again() {
    let scratch = Scratch::new();
    let config = scratch.config(json!({ "fix": scratch.stdio(json!({ "per_session": true })) }));
    let fake = FakeLlm::start().await;
    fake.agent(tool_calls(&[("fix__crash", json!({}))], 20))
        .agent(tool_calls(&[("fix__echo", json!({ "text": "again" }))], 20))
        .agent(done());
    let app = app_with(&fake, &config).await;
    let id = create(&app, json!(["fix"])).await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    let seen = observations(&app.iterations(&id).await);
    assert!(
        seen[0].starts_with("fix__crash: error:") && seen[0].contains("fix"),
        "{seen:?}"
    );
    assert_eq!(seen[1], "fix__echo: echo: again");
    assert_eq!(scratch.calls(), ["crash", "echo"]);
}

#[tokio::test]
async fn a_journaled_call_is_not_run_again_when_the_step_is_redone() {
    let db = common::TestDb::new().await;
    let pool = db.pool.clone();
    let scratch = Scratch::new();
    let config = scratch.config(json!({ "fix": scratch.stdio(json!({})) }));
    let fake = FakeLlm::start().await;
    // Step 1 counts (journaled as done), then hangs in a second call: the
    // replica dies there, before the step is committed.
    fake.agent(tool_calls(
        &[
            ("fix__count", json!({ "label": "once" })),
            ("fix__sleep", json!({ "seconds": 20 })),
        ],
        20,
    ))
    // The new owner redoes step 1: the same first call, then completes.
    .agent(tool_calls(
        &[("fix__count", json!({ "label": "once" }))],
        20,
    ))
    .agent(done());
    let base = fake.base_url();
    let mut first = TestApp::spawn_with(pool.clone(), config_with(&vars(&base, &config))).await;
    let id = create(&first, json!(["fix"])).await;
    common::eventually(
        Duration::from_secs(30),
        "the second call of step 1 to start",
        || async { scratch.calls().contains(&"sleep".to_string()) },
    )
    .await;
    first.crash();
    let second = TestApp::spawn_with(pool, config_with(&vars(&base, &config))).await;
    let s = second.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    let seen = observations(&second.iterations(&id).await);
    assert_eq!(seen[0], "fix__count: counted once", "{seen:?}");
    let counted = scratch.calls().iter().filter(|c| *c == "count").count();
    assert_eq!(
        counted,
        1,
        "the journaled call ran once: {:?}",
        scratch.calls()
    );
}

#[tokio::test]
async fn servers_a_tenant_may_not_use_or_that_do_not_exist_are_refused_at_create() {
    let scratch = Scratch::new();
    let config = scratch.config(json!({
        "open": scratch.stdio(json!({})),
        "pay": scratch.stdio(json!({ "tenants": ["acme"] })),
    }));
    let fake = FakeLlm::start().await;
    let app = app_with(&fake, &config).await;
    for (tools, says) in [
        (json!(["pay"]), "no MCP server named `pay`"),
        (json!(["builtin", "pay:echo"]), "executor.tools[1]"),
        // Only the servers this tenant may use are named.
        (
            json!(["nope"]),
            "no MCP server named `nope` is configured for this tenant (configured: open)",
        ),
        (json!(["a_b"]), "executor.tools[0] must be"),
        (json!(["builtin:read_file"]), "takes no `:tool`"),
    ] {
        let (status, problem) = app
            .post("/api/autonomous", Some(llm_session(tools.clone())))
            .await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{tools}: {problem}"
        );
        let detail = crate::common::problem(&problem).detail;
        assert!(detail.contains(says), "{tools}: {detail}");
    }
    // The served document names the declared servers, so a value it allows is taken.
    let (_, doc) = app.get("/openapi.json").await;
    let items =
        &doc["components"]["schemas"]["ExecutorSpec"]["oneOf"][1]["properties"]["tools"]["items"];
    assert_eq!(
        items["pattern"], "^(builtin|(open|pay)(:[A-Za-z0-9_./-]{1,128})?)$",
        "{items}"
    );
    // The tenant the server is declared for may use it.
    let acme = create_key(&app.base, "acme", "operator").await;
    let res = client_with_key(acme["secret"].as_str().unwrap())
        .post(app.url("/api/autonomous"))
        .json(&llm_session(json!(["pay:echo", "open"])))
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(scratch.calls(), Vec::<String>::new());
}

#[tokio::test]
async fn a_tool_result_is_held_to_the_output_cap() {
    let scratch = Scratch::new();
    let config = scratch.config(json!({ "fix": scratch.stdio(json!({})) }));
    let fake = FakeLlm::start().await;
    fake.agent(tool_calls(&[("fix__big", json!({ "size": 50_000 }))], 20))
        .agent(done());
    let base = fake.base_url();
    let mut vars = vars(&base, &config).to_vec();
    vars.push(("WARDEN_MAX_OUTPUT_BYTES", "2048"));
    let app = TestApp::start_with(config_with(&vars)).await;
    let id = create(&app, json!(["fix"])).await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    let requests = fake.agent_requests();
    let result = requests[1]["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .find(|m| m["role"] == "tool")
        .and_then(|m| m["content"].as_str())
        .expect("the tool result went to the model")
        .to_string();
    assert!(result.len() < 2_400, "{} bytes", result.len());
    assert!(result.contains("bytes dropped"), "{result}");
}

#[tokio::test]
async fn an_http_server_the_egress_policy_refuses_offers_no_tools() {
    let scratch = Scratch::new();
    let fixture = HttpFixture::start(&scratch.log()).await;
    let config = scratch.config(json!({ "web": { "url": fixture.url() } }));
    let fake = FakeLlm::start().await;
    fake.agent(tool_calls(&[("web__echo", json!({ "text": "x" }))], 20))
        .agent(done());
    let base = fake.base_url();
    let mut vars = vars(&base, &config).to_vec();
    // Loopback is refused unless named (the model's endpoint is the operator's, trusted).
    vars.push(("WARDEN_EGRESS_ALLOW", ""));
    let app = TestApp::start_with(config_with(&vars)).await;
    let id = create(&app, json!(["web"])).await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    let names = offered(&fake.agent_requests()[0]);
    assert!(!names.iter().any(|n| n.starts_with("web__")), "{names:?}");
    let seen = observations(&app.iterations(&id).await);
    assert!(seen[0].contains("unknown tool `web__echo`"), "{seen:?}");
    assert_eq!(scratch.calls(), Vec::<String>::new());
}

#[tokio::test]
async fn an_mcp_tool_that_may_write_waits_for_approval_by_its_annotations_and_runs_once() {
    let scratch = Scratch::new();
    let config = scratch.config(json!({ "fix": scratch.stdio(json!({})) }));
    let fake = FakeLlm::start().await;
    // One step: a read-only call (runs at once) and a destructive one
    // (waits); after the approval, the agent is done.
    fake.agent(tool_calls(
        &[
            ("fix__echo", json!({ "text": "before writing" })),
            (
                "fix__write",
                json!({ "name": "notes", "text": "approved text" }),
            ),
        ],
        20,
    ))
    .agent(done());
    let app = app_with(&fake, &config).await;
    let doc = app
        .create(json!({
            "goal": "Create README.md with a project description",
            "mode": "fixed",
            "executor": { "kind": "llm", "tools": ["fix"],
                          "approvals": { "default": "when_not_read_only" } }
        }))
        .await;
    let id = doc["id"].as_str().expect("id").to_string();
    let s = app
        .wait_until(&id, Duration::from_secs(30), |s| {
            s["status"] == "paused" && s["reason"] == "approval_required"
        })
        .await;
    let pending = s["pending_approvals"].as_array().expect("pending");
    assert_eq!(pending.len(), 1, "{s}");
    assert_eq!(pending[0]["tool"], "fix__write", "{s}");
    assert_eq!(scratch.calls(), ["echo"], "the write waits, the read ran");

    let call_id = pending[0]["call_id"].as_str().expect("call id").to_string();
    let (status, body) = app
        .post(
            &format!("/api/autonomous/{id}/approvals/{call_id}"),
            Some(json!({ "decision": "approve" })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(
        scratch.calls(),
        ["echo", "write"],
        "the approved call ran exactly once"
    );
}
