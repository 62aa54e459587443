//! MCP servers for the model agent's tools: the operator declares them
//! (`config`), `client` speaks to one through `rmcp`, and the registry here
//! keeps them running: one connection per replica for shared servers, one
//! per session for `per_session` ones, each started when first needed and
//! again after it crashed or hung (at most one start per call, and none
//! within [`RESTART_PAUSE`] of a failed one, so nothing retries in a loop).

pub mod client;
pub mod config;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

pub use client::{CallResult, McpError, McpTool};
pub use config::{McpConfig, ServerConfig, ToolChoice};

use crate::egress::EgressPolicy;
use client::Connection;

/// How long a server whose start failed is left alone before the next try.
pub const RESTART_PAUSE: Duration = Duration::from_secs(2);

/// One server's connection, started when needed.
struct Slot {
    name: String,
    server: ServerConfig,
    egress: Arc<EgressPolicy>,
    state: tokio::sync::Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    live: Option<Arc<Connection>>,
    /// When the last start failed, and why.
    failed: Option<(Instant, String)>,
}

impl Slot {
    fn new(name: &str, server: &ServerConfig, egress: &Arc<EgressPolicy>) -> Slot {
        Slot {
            name: name.to_string(),
            server: server.clone(),
            egress: egress.clone(),
            state: tokio::sync::Mutex::default(),
        }
    }

    /// The live connection, started (once) when there is none or it ended.
    async fn connection(&self) -> Result<Arc<Connection>, McpError> {
        let mut state = self.state.lock().await;
        if let Some(live) = &state.live {
            if !live.is_closed() {
                return Ok(live.clone());
            }
            tracing::warn!(server = %self.name, "MCP server ended; starting it again");
            state.live = None;
        }
        if let Some((at, why)) = &state.failed
            && at.elapsed() < RESTART_PAUSE
        {
            return Err(McpError::Start {
                server: self.name.clone(),
                why: why.clone(),
            });
        }
        match Connection::open(&self.name, &self.server, &self.egress).await {
            Ok(conn) => {
                tracing::info!(server = %self.name, tools = conn.tools.len(), "MCP server started");
                let conn = Arc::new(conn);
                state.live = Some(conn.clone());
                state.failed = None;
                Ok(conn)
            }
            Err(err) => {
                tracing::warn!(server = %self.name, error = %err, "MCP server could not be started");
                if let McpError::Start { why, .. } = &err {
                    state.failed = Some((Instant::now(), why.clone()));
                }
                Err(err)
            }
        }
    }

    /// Calls `tool`; a connection that broke or hung is dropped (its
    /// process killed), so the next call starts it again.
    async fn call(&self, tool: &str, arguments: &Value) -> Result<CallResult, McpError> {
        let conn = self.connection().await?;
        let result = client::call(
            &conn.peer(),
            &self.name,
            tool,
            arguments,
            self.server.timeout,
        )
        .await
        .map_err(|e| e.without(client::url_query(&self.server)));
        if let Err(err) = &result
            && err.needs_restart()
        {
            let mut state = self.state.lock().await;
            if state.live.as_ref().is_some_and(|l| Arc::ptr_eq(l, &conn)) {
                tracing::warn!(server = %self.name, error = %err, "MCP server dropped; it starts again on the next call");
                state.live = None;
            }
        }
        result
    }
}

/// This replica's MCP servers: the declared ones and the shared connections.
pub struct McpRegistry {
    config: Arc<McpConfig>,
    egress: Arc<EgressPolicy>,
    shared: Mutex<HashMap<String, Arc<Slot>>>,
}

impl McpRegistry {
    /// A registry of the servers `config` declares (none when it is `None`).
    pub fn new(config: Option<Arc<McpConfig>>, egress: Arc<EgressPolicy>) -> McpRegistry {
        McpRegistry {
            config: config.unwrap_or_default(),
            egress,
            shared: Mutex::default(),
        }
    }

    /// The declared servers.
    pub fn config(&self) -> &McpConfig {
        &self.config
    }

    /// The tools of a session of `tenant` that chose `choice`: servers it
    /// may not use (the configuration changed since it was created) are
    /// left out.
    pub fn toolbox(&self, choice: &ToolChoice, tenant: &str) -> Toolbox {
        let mut slots = Vec::new();
        for name in choice.servers.keys() {
            let Some(server) = self.config.servers.get(name) else {
                tracing::warn!(server = %name, "a session chose an MCP server that is no longer configured");
                continue;
            };
            if !server.allows(tenant) {
                tracing::warn!(server = %name, "a session chose an MCP server its tenant may no longer use");
                continue;
            }
            let slot = if server.per_session {
                Arc::new(Slot::new(name, server, &self.egress))
            } else {
                let mut shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
                shared
                    .entry(name.clone())
                    .or_insert_with(|| Arc::new(Slot::new(name, server, &self.egress)))
                    .clone()
            };
            slots.push(slot);
        }
        Toolbox {
            choice: choice.clone(),
            slots,
            functions: HashMap::new(),
        }
    }
}

/// A tool offered to the model under its function name.
#[derive(Debug, Clone, PartialEq)]
pub struct OfferedTool {
    /// `server__tool`.
    pub function: String,
    /// The tool.
    pub tool: McpTool,
}

/// The MCP tools one session may use.
pub struct Toolbox {
    choice: ToolChoice,
    slots: Vec<Arc<Slot>>,
    /// Function name → the server's slot and the tool, as last listed.
    functions: HashMap<String, (Arc<Slot>, McpTool)>,
}

impl Toolbox {
    /// A toolbox with no servers.
    pub fn empty() -> Toolbox {
        Toolbox {
            choice: ToolChoice::builtin_only(),
            slots: Vec::new(),
            functions: HashMap::new(),
        }
    }

    /// Whether the session chose the built-in workspace tools.
    pub fn builtin(&self) -> bool {
        self.choice.builtin
    }

    /// The chosen tools of every chosen server, starting the servers that
    /// are not running; a server that cannot be started offers none this
    /// time (it is tried again at the next step).
    pub async fn offered(&mut self) -> Vec<OfferedTool> {
        let mut offered = Vec::new();
        let mut functions = HashMap::new();
        for slot in &self.slots {
            let conn = match slot.connection().await {
                Ok(conn) => conn,
                Err(err) => {
                    tracing::warn!(error = %err, "MCP server's tools are not offered this step");
                    continue;
                }
            };
            for tool in &conn.tools {
                if !self.choice.allows(&slot.name, &tool.name) {
                    continue;
                }
                let Some(function) = config::function_name(&slot.name, &tool.name) else {
                    tracing::warn!(server = %slot.name, tool = %tool.name, "MCP tool name too long for a function name; not offered");
                    continue;
                };
                if functions.contains_key(&function) {
                    continue;
                }
                functions.insert(function.clone(), (slot.clone(), tool.clone()));
                offered.push(OfferedTool {
                    function,
                    tool: tool.clone(),
                });
            }
        }
        self.functions = functions;
        offered
    }

    /// The MCP tool behind a function name, if it is one offered.
    pub fn tool(&self, function: &str) -> Option<&McpTool> {
        self.functions.get(function).map(|(_, tool)| tool)
    }

    /// Calls the tool behind `function`; `None` when it is none of the
    /// offered MCP tools.
    pub async fn call(
        &self,
        function: &str,
        arguments: &Value,
    ) -> Option<Result<CallResult, McpError>> {
        let (slot, tool) = self.functions.get(function)?;
        Some(slot.call(&tool.name, arguments).await)
    }
}
