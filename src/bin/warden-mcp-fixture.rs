//! A small MCP server for Warden's integration tests (tests/api/mcp.rs): a
//! test helper, not part of the service, built with rmcp's server side (the
//! `mcp-fixture` feature). Cargo builds it for the integration tests, so
//! `cargo test` needs nothing but Rust.
//!
//! Runs over stdio by default, or over Streamable HTTP on 127.0.0.1 with
//! `--http PORT` (path `/mcp`). Every tool call appends the tool's name to
//! the file named by `MCP_FIXTURE_LOG` (when set), so a test can count how
//! often a tool really ran. The same tools, annotations and answers as the
//! Python SDK's FastMCP server the end-to-end run uses (e2e/fastmcp/server.py).

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};

/// The fixture's tools: what they do is in `run`.
#[derive(Clone, Copy)]
struct Fixture;

/// One tool's declaration: name, description, parameters (name, JSON type) and annotations.
struct Spec {
    name: &'static str,
    description: &'static str,
    params: &'static [(&'static str, &'static str)],
    read_only: Option<bool>,
    destructive: Option<bool>,
}

const TOOLS: [Spec; 7] = [
    Spec {
        name: "echo",
        description: "Return the text, prefixed with `echo: `.",
        params: &[("text", "string")],
        read_only: Some(true),
        destructive: None,
    },
    Spec {
        name: "read",
        description: "Read a named note (always the same content).",
        params: &[("name", "string")],
        read_only: Some(true),
        destructive: None,
    },
    Spec {
        name: "write",
        description: "Write a named note.",
        params: &[("name", "string"), ("text", "string")],
        read_only: Some(false),
        destructive: Some(true),
    },
    Spec {
        name: "count",
        description: "Count a call with a side effect: the fixture log grows by one line.",
        params: &[("label", "string")],
        read_only: None,
        destructive: None,
    },
    Spec {
        name: "sleep",
        description: "Sleep, then answer.",
        params: &[("seconds", "number")],
        read_only: None,
        destructive: None,
    },
    Spec {
        name: "crash",
        description: "End the server process at once, mid-call.",
        params: &[],
        read_only: None,
        destructive: None,
    },
    Spec {
        name: "big",
        description: "Return `size` characters.",
        params: &[("size", "integer")],
        read_only: None,
        destructive: None,
    },
];

/// The longest sleep and the largest answer a call may ask for.
const MAX_SLEEP_SECONDS: f64 = 3600.0;
const MAX_BIG_SIZE: u64 = 16 * 1024 * 1024;

impl Spec {
    /// The tool as `tools/list` shows it: an object schema of required parameters.
    fn tool(&self) -> Tool {
        let properties: JsonObject = self
            .params
            .iter()
            .map(|(name, kind)| (name.to_string(), json!({ "type": kind })))
            .collect();
        let required: Vec<&str> = self.params.iter().map(|(name, _)| *name).collect();
        let mut schema = JsonObject::new();
        schema.insert("type".into(), json!("object"));
        schema.insert("properties".into(), Value::Object(properties));
        schema.insert("required".into(), json!(required));
        let tool = Tool::new(self.name, self.description, Arc::new(schema));
        if self.read_only.is_none() && self.destructive.is_none() {
            return tool;
        }
        tool.with_annotations(ToolAnnotations::from_raw(
            None,
            self.read_only,
            self.destructive,
            None,
            None,
        ))
    }
}

/// Appends the tool's name to `MCP_FIXTURE_LOG`, one line per call.
fn note(tool: &str) {
    let Some(path) = std::env::var_os("MCP_FIXTURE_LOG") else {
        return;
    };
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut log| log.write_all(format!("{tool}\n").as_bytes()));
    if let Err(e) = written {
        eprintln!("warden-mcp-fixture: cannot append to MCP_FIXTURE_LOG: {e}");
    }
}

fn string<'a>(args: &'a JsonObject, name: &str) -> Result<&'a str, String> {
    args.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("`{name}` must be a string"))
}

fn number(args: &JsonObject, name: &str, max: f64) -> Result<f64, String> {
    args.get(name)
        .and_then(Value::as_f64)
        .filter(|n| (0.0..=max).contains(n))
        .ok_or_else(|| format!("`{name}` must be a number from 0 to {max}"))
}

impl Fixture {
    /// Runs one call: the answer's text, or what was wrong with the arguments.
    async fn run(self, tool: &str, args: &JsonObject) -> Result<String, String> {
        match tool {
            "echo" => {
                let text = string(args, "text")?;
                note(tool);
                Ok(format!("echo: {text}"))
            }
            "read" => {
                let name = string(args, "name")?;
                note(tool);
                Ok(format!("contents of {name}"))
            }
            "write" => {
                let (name, text) = (string(args, "name")?, string(args, "text")?);
                note(tool);
                Ok(format!(
                    "wrote {} characters to {name}",
                    text.chars().count()
                ))
            }
            "count" => {
                let label = string(args, "label")?;
                note(tool);
                Ok(format!("counted {label}"))
            }
            "sleep" => {
                let seconds = number(args, "seconds", MAX_SLEEP_SECONDS)?;
                note(tool);
                tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
                Ok(format!("slept {seconds} s"))
            }
            "crash" => {
                note(tool);
                std::process::exit(3);
            }
            "big" => {
                let size = args
                    .get("size")
                    .and_then(Value::as_u64)
                    .filter(|n| *n <= MAX_BIG_SIZE)
                    .ok_or_else(|| format!("`size` must be an integer from 0 to {MAX_BIG_SIZE}"))?;
                note(tool);
                Ok("x".repeat(size as usize))
            }
            other => Err(format!("Unknown tool: {other}")),
        }
    }
}

impl ServerHandler for Fixture {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_server_info(
            Implementation::new("warden-mcp-fixture", env!("CARGO_PKG_VERSION")),
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(
            TOOLS.iter().map(Spec::tool).collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        // Like FastMCP: bad arguments are a tool error the model can read.
        let result = match self.run(&request.name, &args).await {
            Ok(text) => CallToolResult::success(vec![ContentBlock::text(text)]),
            Err(problem) => CallToolResult::error(vec![ContentBlock::text(format!(
                "Error executing tool {}: {problem}",
                request.name
            ))]),
        };
        Ok(result.into())
    }
}

async fn serve_stdio() -> Result<(), String> {
    let running = Fixture
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| format!("stdio: {e}"))?;
    running
        .waiting()
        .await
        .map(|_| ())
        .map_err(|e| format!("stdio: {e}"))
}

async fn serve_http(port: u16) -> Result<(), String> {
    let service = StreamableHttpService::new(
        || Ok(Fixture),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| format!("listen on 127.0.0.1:{port}: {e}"))?;
    axum::serve(listener, router)
        .await
        .map_err(|e| format!("http: {e}"))
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let served = match args.as_slice() {
        [] => serve_stdio().await,
        [flag, port] if flag == "--http" => match port.parse::<u16>() {
            Ok(port) => serve_http(port).await,
            Err(_) => Err(format!("--http takes a port, not `{port}`")),
        },
        _ => Err("usage: warden-mcp-fixture [--http PORT]".to_string()),
    };
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(problem) => {
            eprintln!("warden-mcp-fixture: {problem}");
            ExitCode::FAILURE
        }
    }
}
