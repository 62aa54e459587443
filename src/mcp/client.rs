//! One connection to an MCP server through `rmcp`: a child process over
//! stdio, or a Streamable HTTP endpoint reached under the egress policy.
//! Every request carries a timeout (rmcp sets none).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, ContentBlock};
use rmcp::service::{Peer, RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use serde_json::Value;

use super::config::{ServerConfig, Transport};
use crate::egress::EgressPolicy;

/// How long starting a server and listing its tools may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Per-request limit of the HTTP client: far above any call's timeout, so
/// only a stuck socket meets it.
const HTTP_REQUEST_LIMIT: Duration = Duration::from_secs(3_700);

/// Why a server could not be reached or a call failed.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// The server could not be started or connected to.
    #[error("MCP server `{server}` could not be started: {why}")]
    Start {
        /// The server.
        server: String,
        /// What went wrong.
        why: String,
    },
    /// The call did not answer within the server's timeout.
    #[error("MCP server `{server}` did not answer within {} ms; it is restarted on the next call", timeout.as_millis())]
    Timeout {
        /// The server.
        server: String,
        /// The timeout.
        timeout: Duration,
    },
    /// The connection broke (the process ended, the endpoint went away).
    #[error("MCP server `{server}` failed: {why}; it is restarted on the next call")]
    Broken {
        /// The server.
        server: String,
        /// What went wrong.
        why: String,
    },
    /// The server answered the call with a protocol error.
    #[error("MCP server `{server}` refused the call: {why}")]
    Refused {
        /// The server.
        server: String,
        /// The server's message.
        why: String,
    },
}

/// The query of an HTTP server's URL, when it has one.
pub fn url_query(server: &ServerConfig) -> Option<&str> {
    match &server.transport {
        Transport::Http { url, .. } => crate::egress::split_query(url).1,
        Transport::Stdio { .. } => None,
    }
    .filter(|q| !q.is_empty())
}

impl McpError {
    /// The error with `secret` (a URL's query) taken out of its text.
    pub fn without(self, secret: Option<&str>) -> McpError {
        let Some(secret) = secret else {
            return self;
        };
        let clean = |why: String| why.replace(secret, "<redacted>");
        match self {
            McpError::Broken { server, why } => McpError::Broken {
                server,
                why: clean(why),
            },
            McpError::Refused { server, why } => McpError::Refused {
                server,
                why: clean(why),
            },
            McpError::Start { server, why } => McpError::Start {
                server,
                why: clean(why),
            },
            timeout @ McpError::Timeout { .. } => timeout,
        }
    }

    /// Whether the connection should be dropped and started again.
    pub fn needs_restart(&self) -> bool {
        matches!(self, McpError::Timeout { .. } | McpError::Broken { .. })
    }
}

/// A tool a server offers, as its `tools/list` described it.
#[derive(Debug, Clone, PartialEq)]
pub struct McpTool {
    /// The server's name.
    pub server: String,
    /// The tool's own name on that server.
    pub name: String,
    /// What it does.
    pub description: String,
    /// Its arguments' JSON schema.
    pub input_schema: Value,
    /// MCP's `readOnlyHint` (a hint from a server that may not be trusted).
    pub read_only_hint: Option<bool>,
    /// MCP's `destructiveHint`.
    pub destructive_hint: Option<bool>,
}

impl McpTool {
    /// Whether the server says the tool changes nothing.
    pub fn is_read_only(&self) -> bool {
        self.read_only_hint == Some(true)
    }

    /// Whether the tool may destroy something: unless the server says it
    /// is read-only or not destructive, it is taken to be.
    pub fn may_destroy(&self) -> bool {
        !self.is_read_only() && self.destructive_hint != Some(false)
    }
}

/// What a call returned.
#[derive(Debug, Clone, PartialEq)]
pub struct CallResult {
    /// The content as text (text blocks as they are, others as JSON).
    pub text: String,
    /// The server marked the result an error (`isError`).
    pub is_error: bool,
}

/// A live connection and the tools its server listed.
pub struct Connection {
    service: RunningService<RoleClient, ()>,
    /// The tools, as listed when connecting.
    pub tools: Vec<McpTool>,
}

impl Connection {
    /// Starts (stdio) or connects to (HTTP) `server`, and lists its tools.
    pub async fn open(
        name: &str,
        server: &ServerConfig,
        egress: &Arc<EgressPolicy>,
    ) -> Result<Connection, McpError> {
        // A URL's query is often a credential: errors that quote the URL
        // (reqwest's do) are shown and logged without it.
        let query = url_query(server);
        let start = |why: String| McpError::Start {
            server: name.to_string(),
            why: match query {
                Some(q) => why.replace(q, "<redacted>"),
                None => why,
            },
        };
        let connecting = async {
            let service = match &server.transport {
                Transport::Stdio { command, args, env } => {
                    let mut cmd = tokio::process::Command::new(command);
                    cmd.args(args).env_clear().envs(env);
                    let (transport, stderr) = TokioChildProcess::builder(cmd)
                        .stderr(std::process::Stdio::piped())
                        .spawn()
                        .map_err(|e| start(format!("cannot run `{command}`: {e}")))?;
                    if let Some(stderr) = stderr {
                        tokio::spawn(log_stderr(name.to_string(), stderr));
                    }
                    ().serve(transport)
                        .await
                        .map_err(|e| start(e.to_string()))?
                }
                Transport::Http { url, headers } => {
                    egress
                        .vet_url(url)
                        .await
                        .map_err(|e| start(format!("its url {e}")))?;
                    let client = egress
                        .client_for(url, HTTP_REQUEST_LIMIT)
                        .map_err(|e| start(format!("its url {e}")))?;
                    let mut custom = HashMap::new();
                    for (k, v) in headers {
                        // Checked when the configuration was read.
                        let (Ok(k), Ok(v)) = (
                            reqwest::header::HeaderName::from_bytes(k.as_bytes()),
                            reqwest::header::HeaderValue::from_str(v),
                        ) else {
                            return Err(start(format!("header {k} is not a valid header")));
                        };
                        custom.insert(k, v);
                    }
                    let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                        .custom_headers(custom);
                    let transport = StreamableHttpClientTransport::with_client(client, config);
                    ().serve(transport)
                        .await
                        .map_err(|e| start(e.to_string()))?
                }
            };
            let listed = service
                .list_all_tools()
                .await
                .map_err(|e| start(format!("tools/list failed: {e}")))?;
            let tools = listed
                .into_iter()
                .map(|t| McpTool {
                    server: name.to_string(),
                    name: t.name.to_string(),
                    description: t.description.map(|d| d.to_string()).unwrap_or_default(),
                    input_schema: Value::Object((*t.input_schema).clone()),
                    read_only_hint: t.annotations.as_ref().and_then(|a| a.read_only_hint),
                    destructive_hint: t.annotations.as_ref().and_then(|a| a.destructive_hint),
                })
                .collect();
            Ok(Connection { service, tools })
        };
        tokio::time::timeout(CONNECT_TIMEOUT, connecting)
            .await
            .map_err(|_| start(format!("no answer within {} s", CONNECT_TIMEOUT.as_secs())))?
    }

    /// Whether the connection has ended (the process exited, the stream closed).
    pub fn is_closed(&self) -> bool {
        self.service.is_transport_closed()
    }

    /// A handle for calls that does not hold the connection.
    pub fn peer(&self) -> Peer<RoleClient> {
        self.service.peer().clone()
    }
}

/// Longest line of a server's stderr logged.
const STDERR_LINE_CHARS: usize = 1_000;

/// A stdio server's stderr, line by line, as debug logs of that server
/// (its own diagnostics, kept apart from Warden's output).
async fn log_stderr(server: String, stderr: tokio::process::ChildStderr) {
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let line: String = line.chars().take(STDERR_LINE_CHARS).collect();
        tracing::debug!(server = %server, "MCP server stderr: {line}");
    }
}

/// Calls `tool` on `server` through `peer`, within `timeout`.
pub async fn call(
    peer: &Peer<RoleClient>,
    server: &str,
    tool: &str,
    arguments: &Value,
    timeout: Duration,
) -> Result<CallResult, McpError> {
    let mut params = CallToolRequestParams::new(tool.to_string());
    params.arguments = arguments.as_object().cloned();
    let answer = tokio::time::timeout(timeout, peer.call_tool(params))
        .await
        .map_err(|_| McpError::Timeout {
            server: server.to_string(),
            timeout,
        })?;
    match answer {
        Ok(result) => Ok(CallResult {
            text: content_text(&result.content, result.structured_content.as_ref()),
            is_error: result.is_error.unwrap_or(false),
        }),
        Err(rmcp::ServiceError::McpError(e)) => Err(McpError::Refused {
            server: server.to_string(),
            why: e.message.to_string(),
        }),
        Err(e) => Err(McpError::Broken {
            server: server.to_string(),
            why: e.to_string(),
        }),
    }
}

/// A result's content as one text for the model.
fn content_text(content: &[ContentBlock], structured: Option<&Value>) -> String {
    if content.is_empty() {
        return structured.map(Value::to_string).unwrap_or_default();
    }
    content
        .iter()
        .map(|block| match block {
            ContentBlock::Text(t) => t.text.clone(),
            other => serde_json::to_string(other).unwrap_or_default(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(read_only: Option<bool>, destructive: Option<bool>) -> McpTool {
        McpTool {
            server: "s".into(),
            name: "t".into(),
            description: String::new(),
            input_schema: Value::Null,
            read_only_hint: read_only,
            destructive_hint: destructive,
        }
    }

    #[test]
    fn a_tool_is_destructive_unless_its_server_says_otherwise() {
        assert!(tool(None, None).may_destroy());
        assert!(tool(Some(false), None).may_destroy());
        assert!(tool(Some(false), Some(true)).may_destroy());
        assert!(!tool(Some(false), Some(false)).may_destroy());
        assert!(!tool(Some(true), None).may_destroy());
        assert!(tool(Some(true), None).is_read_only());
        assert!(!tool(None, Some(false)).is_read_only());
    }

    #[test]
    fn a_url_query_is_taken_out_of_error_texts() {
        let config = super::super::config::McpConfig::parse(
            r#"{"mcpServers": {"web": {"url": "http://h.example/mcp?token=t0ps3cret"}}}"#,
            &Default::default(),
        )
        .unwrap();
        let server = &config.servers["web"];
        assert_eq!(url_query(server), Some("token=t0ps3cret"));
        let err = McpError::Broken {
            server: "web".into(),
            why: "error sending request for url (http://h.example/mcp?token=t0ps3cret)".into(),
        }
        .without(url_query(server));
        let shown = err.to_string();
        assert!(
            !shown.contains("t0ps3cret") && shown.contains("<redacted>"),
            "{shown}"
        );
        assert!(err.needs_restart());
    }

    #[test]
    fn content_is_text_and_structured_content_stands_in_for_none() {
        let blocks = vec![ContentBlock::text("a"), ContentBlock::text("b")];
        assert_eq!(content_text(&blocks, None), "a\nb");
        let structured = serde_json::json!({ "n": 1 });
        assert_eq!(content_text(&[], Some(&structured)), r#"{"n":1}"#);
        assert_eq!(content_text(&[], None), "");
    }
}
