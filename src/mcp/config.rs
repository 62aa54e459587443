//! The operator's MCP servers (`WARDEN_MCP_CONFIG`, the common `mcpServers`
//! JSON shape) and a session's choice among them (`executor.tools`): parsed
//! and checked here, without I/O, so every rule is a unit test.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Deserialize;

/// A server's name: a letter or digit, then letters, digits or `-` (no
/// `_`, so `server__tool` splits back unambiguously), at most 32 characters.
pub const SERVER_NAME_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9-]{0,31}$";
/// An `executor.tools` item: `builtin`, a server, or `server:tool`.
pub const TOOL_ITEM_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9-]{0,31}(:[A-Za-z0-9_./-]{1,128})?$";
/// The pattern of an `executor.tools` item on a replica that declares
/// `servers`: `builtin`, one of them, or `server:tool` of one of them.
pub fn tool_item_pattern(servers: &[&str]) -> String {
    if servers.is_empty() {
        return format!("^{BUILTIN}$");
    }
    // Server names are letters, digits and `-`: nothing to escape.
    format!(
        "^({BUILTIN}|({})(:[A-Za-z0-9_./-]{{1,128}})?)$",
        servers.join("|")
    )
}

/// Most items of `executor.tools`.
pub const MAX_TOOL_ITEMS: usize = 64;
/// The item that stands for the built-in workspace tools.
pub const BUILTIN: &str = "builtin";
/// Allowed timeout of one tool call, ms.
pub const CALL_TIMEOUT_MS: std::ops::RangeInclusive<u64> = 100..=3_600_000;
/// Timeout of one tool call unless the server's `timeout_ms` says otherwise.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Variables of Warden's own environment a stdio server inherits; nothing
/// else of it (Warden's keys and database URL stay with Warden).
pub const INHERITED_ENV: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER"];
/// Longest OpenAI function name.
const MAX_FUNCTION_NAME: usize = 64;

/// The declared MCP servers, by name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct McpConfig {
    /// Servers by name.
    pub servers: BTreeMap<String, ServerConfig>,
}

/// One declared server.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// How Warden reaches it.
    pub transport: Transport,
    /// One process (or connection) per session rather than one per replica.
    pub per_session: bool,
    /// Timeout of one call.
    pub timeout: Duration,
    /// The tenants that may use it; `None`: every tenant.
    pub tenants: Option<BTreeSet<String>>,
}

/// How a server is reached.
#[derive(Clone, PartialEq)]
pub enum Transport {
    /// A child process speaking MCP on stdin/stdout.
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Its whole environment: the inherited variables, then the declared ones.
        env: BTreeMap<String, String>,
    },
    /// A Streamable HTTP endpoint.
    Http {
        /// The endpoint URL (vetted by the egress policy before connecting).
        url: String,
        /// Headers sent with every request; their values are secrets.
        headers: BTreeMap<String, String>,
    },
}

/// Names only: environment and header values often are credentials.
impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transport::Stdio { command, args, env } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("args", &args.len())
                .field("env", &env.keys().collect::<Vec<_>>())
                .finish(),
            Transport::Http { url, headers } => f
                .debug_struct("Http")
                .field("url", &crate::egress::redact_url(url))
                .field("headers", &headers.keys().collect::<Vec<_>>())
                .finish(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(rename = "mcpServers")]
    mcp_servers: BTreeMap<String, RawServer>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    #[serde(rename = "type")]
    kind: Option<String>,
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    per_session: bool,
    timeout_ms: Option<u64>,
    tenants: Option<Vec<String>>,
}

/// Whether `name` may name a server.
pub fn valid_server_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.len() <= 32
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '-')
}

fn valid_tool_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-'))
}

impl McpConfig {
    /// Parses and checks the file's text; `inherited` is Warden's own
    /// environment, of which stdio servers get [`INHERITED_ENV`]. The
    /// message names the server and field at fault.
    pub fn parse(text: &str, inherited: &BTreeMap<String, String>) -> Result<McpConfig, String> {
        let raw: RawFile = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let mut servers = BTreeMap::new();
        for (name, server) in raw.mcp_servers {
            let at = format!("mcpServers.{name}");
            if !valid_server_name(&name) || name == BUILTIN {
                return Err(format!(
                    "{at}: a server's name is 1 to 32 letters, digits or '-', starting with a letter or digit, and not `{BUILTIN}`"
                ));
            }
            servers.insert(name, server.check(&at, inherited)?);
        }
        Ok(McpConfig { servers })
    }

    /// The declared server names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.servers.keys().map(String::as_str)
    }

    /// Checks a session's choice against the declared servers and what
    /// `tenant` may use. The message names the item at fault and lists only
    /// the servers `tenant` may use: a server kept for other tenants is, to
    /// this one, not configured.
    pub fn check_choice(&self, choice: &ToolChoice, tenant: &str) -> Result<(), String> {
        for (i, server) in &choice.item_servers {
            if self.servers.get(server).is_none_or(|s| !s.allows(tenant)) {
                let usable: Vec<&str> = self
                    .servers
                    .iter()
                    .filter(|(_, s)| s.allows(tenant))
                    .map(|(name, _)| name.as_str())
                    .collect();
                return Err(format!(
                    "executor.tools[{i}]: no MCP server named `{server}` is configured for this tenant (configured: {})",
                    if usable.is_empty() {
                        "none".to_string()
                    } else {
                        usable.join(", ")
                    }
                ));
            }
        }
        Ok(())
    }
}

impl ServerConfig {
    /// Whether `tenant` may use this server.
    pub fn allows(&self, tenant: &str) -> bool {
        self.tenants.as_ref().is_none_or(|t| t.contains(tenant))
    }
}

impl RawServer {
    fn check(self, at: &str, inherited: &BTreeMap<String, String>) -> Result<ServerConfig, String> {
        let timeout = call_timeout(at, self.timeout_ms)?;
        let tenants = match self.tenants {
            None => None,
            Some(list) if list.iter().any(|t| t.trim().is_empty()) => {
                return Err(format!("{at}.tenants must not hold an empty name"));
            }
            Some(list) => Some(list.into_iter().collect()),
        };
        let kind = self.kind.as_deref();
        let transport = match (self.command, self.url) {
            (Some(command), None) if matches!(kind, None | Some("stdio")) => {
                if command.trim().is_empty() {
                    return Err(format!("{at}.command must not be empty"));
                }
                if !self.headers.is_empty() {
                    return Err(format!("{at}.headers is for `url` servers only"));
                }
                Transport::Stdio {
                    command,
                    args: self.args,
                    env: stdio_env(inherited, self.env),
                }
            }
            (None, Some(url))
                if matches!(
                    kind,
                    None | Some("http" | "streamable-http" | "streamableHttp")
                ) =>
            {
                let ok = (url.starts_with("http://") || url.starts_with("https://"))
                    && url.len() > "https://".len()
                    && url.chars().all(|c| c.is_ascii_graphic());
                if !ok {
                    return Err(format!("{at}.url must be an http:// or https:// URL"));
                }
                if !self.args.is_empty() || !self.env.is_empty() {
                    return Err(format!("{at}: args and env are for `command` servers only"));
                }
                check_headers(at, &self.headers)?;
                Transport::Http {
                    url,
                    headers: self.headers,
                }
            }
            (Some(_), Some(_)) => {
                return Err(format!("{at}: give either `command` or `url`, not both"));
            }
            (None, None) => {
                return Err(format!(
                    "{at}: give `command` (a stdio server) or `url` (a Streamable HTTP server)"
                ));
            }
            _ => {
                return Err(format!(
                    "{at}.type must be `stdio` with `command`, or `http` with `url`"
                ));
            }
        };
        Ok(ServerConfig {
            transport,
            per_session: self.per_session,
            timeout,
            tenants,
        })
    }
}

/// A server's call timeout: its `timeout_ms` within bounds, else the default.
fn call_timeout(at: &str, timeout_ms: Option<u64>) -> Result<Duration, String> {
    let timeout = match timeout_ms {
        None => DEFAULT_CALL_TIMEOUT,
        Some(ms) if CALL_TIMEOUT_MS.contains(&ms) => Duration::from_millis(ms),
        Some(_) => {
            return Err(format!(
                "{at}.timeout_ms must be between {} and {}",
                CALL_TIMEOUT_MS.start(),
                CALL_TIMEOUT_MS.end()
            ));
        }
    };
    Ok(timeout)
}

/// A stdio server's environment: the few variables it inherits from
/// Warden's, then its own `env` over them.
fn stdio_env(
    inherited: &BTreeMap<String, String>,
    own: BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = inherited
        .iter()
        .filter(|(k, _)| INHERITED_ENV.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    env.extend(own);
    env
}

/// Refuses a header whose name is not a token or whose value is not
/// visible ASCII.
fn check_headers(at: &str, headers: &BTreeMap<String, String>) -> Result<(), String> {
    for (name, value) in headers {
        let name_ok = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        let value_ok = value
            .bytes()
            .all(|b| b == b'\t' || (0x20..0x7f).contains(&b));
        if !name_ok || !value_ok {
            // The value is a secret: only the name is shown.
            return Err(format!(
                "{at}.headers.{name}: a header name is a token and its value visible ASCII"
            ));
        }
    }
    Ok(())
}

/// A session's choice of tools (`executor.tools`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolChoice {
    /// The built-in workspace tools are offered.
    pub builtin: bool,
    /// Servers chosen, each with the tools chosen of it (`None`: all).
    pub servers: BTreeMap<String, Option<BTreeSet<String>>>,
    /// Each server named, with the index of the item naming it (for messages).
    item_servers: Vec<(usize, String)>,
}

impl ToolChoice {
    /// The choice when `executor.tools` is absent: the built-in tools only.
    pub fn builtin_only() -> ToolChoice {
        ToolChoice {
            builtin: true,
            servers: BTreeMap::new(),
            item_servers: Vec::new(),
        }
    }

    /// Reads `executor.tools`; the message names the item at fault.
    pub fn parse(items: Option<&[String]>) -> Result<ToolChoice, String> {
        let Some(items) = items else {
            return Ok(ToolChoice::builtin_only());
        };
        if items.len() > MAX_TOOL_ITEMS {
            return Err(format!(
                "executor.tools may hold at most {MAX_TOOL_ITEMS} items, got {}",
                items.len()
            ));
        }
        let mut choice = ToolChoice {
            builtin: false,
            servers: BTreeMap::new(),
            item_servers: Vec::new(),
        };
        for (i, item) in items.iter().enumerate() {
            let (server, tool) = match item.split_once(':') {
                Some((server, tool)) => (server, Some(tool)),
                None => (item.as_str(), None),
            };
            if !valid_server_name(server) || tool.is_some_and(|t| !valid_tool_name(t)) {
                return Err(format!(
                    "executor.tools[{i}] must be `{BUILTIN}`, a server's name or `server:tool` (pattern {TOOL_ITEM_PATTERN}), got {item:?}"
                ));
            }
            if server == BUILTIN {
                if tool.is_some() {
                    return Err(format!(
                        "executor.tools[{i}]: `{BUILTIN}` stands for all the built-in tools and takes no `:tool`"
                    ));
                }
                choice.builtin = true;
                continue;
            }
            choice.item_servers.push((i, server.to_string()));
            let entry = choice
                .servers
                .entry(server.to_string())
                .or_insert_with(|| Some(BTreeSet::new()));
            match (entry, tool) {
                // A whole server chosen takes every tool of it.
                (entry, None) => *entry = None,
                (Some(tools), Some(tool)) => {
                    tools.insert(tool.to_string());
                }
                (None, Some(_)) => {}
            }
        }
        Ok(choice)
    }

    /// Whether `tool` of `server` is chosen.
    pub fn allows(&self, server: &str, tool: &str) -> bool {
        match self.servers.get(server) {
            Some(None) => true,
            Some(Some(tools)) => tools.contains(tool),
            None => false,
        }
    }
}

/// The OpenAI function name of `tool` of `server`: `server__tool`, any
/// character a function name may not hold made `_`; `None` when longer
/// than a function name may be.
pub fn function_name(server: &str, tool: &str) -> Option<String> {
    let name: String = format!("{server}__{tool}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    (name.len() <= MAX_FUNCTION_NAME).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<McpConfig, String> {
        let inherited: BTreeMap<String, String> = [
            ("PATH", "/usr/bin"),
            ("HOME", "/root"),
            ("DATABASE_URL", "postgres://secret@db/warden"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        McpConfig::parse(text, &inherited)
    }

    #[test]
    fn both_kinds_of_server_are_read_with_their_options() {
        let config = parse(
            r#"{"mcpServers": {
                "fs": {"command": "python3", "args": ["server.py"], "env": {"TOKEN": "t0k"}, "per_session": true, "timeout_ms": 500},
                "web": {"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer h3ad3r"}, "tenants": ["acme"]}
            }}"#,
        )
        .unwrap();
        let fs = &config.servers["fs"];
        assert!(fs.per_session);
        assert_eq!(fs.timeout, Duration::from_millis(500));
        assert!(fs.allows("anyone"));
        let Transport::Stdio { command, args, env } = &fs.transport else {
            panic!("stdio expected")
        };
        assert_eq!((command.as_str(), args.len()), ("python3", 1));
        // Warden's own environment reaches the server only through the list.
        assert_eq!(env.get("PATH").map(String::as_str), Some("/usr/bin"));
        assert_eq!(env.get("TOKEN").map(String::as_str), Some("t0k"));
        assert!(!env.contains_key("DATABASE_URL"));
        let web = &config.servers["web"];
        assert!(!web.per_session);
        assert_eq!(web.timeout, DEFAULT_CALL_TIMEOUT);
        assert!(web.allows("acme") && !web.allows("other"));
        let shown = format!("{config:?}");
        assert!(
            !shown.contains("h3ad3r") && !shown.contains("t0k"),
            "{shown}"
        );
        assert!(
            shown.contains("Authorization") && shown.contains("TOKEN"),
            "{shown}"
        );
    }

    #[test]
    fn a_bad_server_is_refused_naming_it() {
        for (text, says) in [
            (
                r#"{"mcpServers": {"a_b": {"command": "x"}}}"#,
                "mcpServers.a_b",
            ),
            (
                r#"{"mcpServers": {"builtin": {"command": "x"}}}"#,
                "not `builtin`",
            ),
            (r#"{"mcpServers": {"a": {}}}"#, "give `command`"),
            (
                r#"{"mcpServers": {"a": {"command": "x", "url": "http://h/"}}}"#,
                "not both",
            ),
            (r#"{"mcpServers": {"a": {"command": " "}}}"#, "a.command"),
            (r#"{"mcpServers": {"a": {"url": "ftp://h/"}}}"#, "a.url"),
            (
                r#"{"mcpServers": {"a": {"command": "x", "timeout_ms": 5}}}"#,
                "a.timeout_ms",
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x", "tenants": [""]}}}"#,
                "a.tenants",
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x", "headers": {"h": "v"}}}}"#,
                "a.headers",
            ),
            (
                r#"{"mcpServers": {"a": {"url": "http://h/", "env": {"A": "1"}}}}"#,
                "args and env",
            ),
            (
                r#"{"mcpServers": {"a": {"url": "http://h/", "type": "stdio"}}}"#,
                "a.type",
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x", "per_sesion": true}}}"#,
                "per_sesion",
            ),
            (r#"{"servers": {}}"#, "servers"),
            ("not json", "expected"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(says), "{text}: {err}");
        }
        let err = parse(
            r#"{"mcpServers": {"a": {"url": "http://h/", "headers": {"X-Key": "s3cret\n"}}}}"#,
        )
        .unwrap_err();
        assert!(err.contains("X-Key") && !err.contains("s3cret"), "{err}");
    }

    #[test]
    fn the_common_type_field_is_understood() {
        let config = parse(
            r#"{"mcpServers": {"a": {"type": "stdio", "command": "x"}, "b": {"type": "http", "url": "http://h/mcp"}}}"#,
        )
        .unwrap();
        assert_eq!(config.names().collect::<Vec<_>>(), ["a", "b"]);
    }

    fn items(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn absent_tools_mean_the_builtin_ones_only() {
        let choice = ToolChoice::parse(None).unwrap();
        assert!(choice.builtin && choice.servers.is_empty());
        let none = ToolChoice::parse(Some(&[])).unwrap();
        assert!(!none.builtin && none.servers.is_empty());
    }

    #[test]
    fn servers_and_single_tools_are_chosen() {
        let choice = ToolChoice::parse(Some(&items(&[
            "fs:read",
            "everything",
            "builtin",
            "fs:list.dir",
        ])))
        .unwrap();
        assert!(choice.builtin);
        assert!(choice.allows("fs", "read") && choice.allows("fs", "list.dir"));
        assert!(!choice.allows("fs", "write"));
        assert!(choice.allows("everything", "echo"));
        assert!(!choice.allows("other", "echo"));
        // A whole server wins over single tools of it, in either order.
        let both = ToolChoice::parse(Some(&items(&["fs", "fs:read"]))).unwrap();
        assert!(both.allows("fs", "write"));
        let both = ToolChoice::parse(Some(&items(&["fs:read", "fs"]))).unwrap();
        assert!(both.allows("fs", "write"));
    }

    #[test]
    fn malformed_items_are_refused_naming_them() {
        for bad in [
            "",
            ":x",
            "fs:",
            "fs:a b",
            "a_b",
            "-a",
            "builtin:read",
            "fs:x:y",
        ] {
            let err = ToolChoice::parse(Some(&items(&["builtin", bad]))).unwrap_err();
            assert!(err.starts_with("executor.tools[1]"), "{bad}: {err}");
        }
        let many = vec!["fs".to_string(); MAX_TOOL_ITEMS + 1];
        assert!(
            ToolChoice::parse(Some(&many))
                .unwrap_err()
                .contains("at most")
        );
    }

    #[test]
    fn the_item_pattern_and_the_parser_agree() {
        // The document's pattern is checked by hand here: no regex crate.
        let long_tool = "t".repeat(128);
        let ok = ["builtin", "fs", "a-b", "A9", "fs:read", "fs:a.b/c-d_e"];
        for item in ok {
            assert!(ToolChoice::parse(Some(&items(&[item]))).is_ok(), "{item}");
        }
        assert!(ToolChoice::parse(Some(&[format!("fs:{long_tool}")])).is_ok());
        assert!(ToolChoice::parse(Some(&[format!("fs:{long_tool}t")])).is_err());
        assert!(ToolChoice::parse(Some(&["a".repeat(33)])).is_err());
        assert!(TOOL_ITEM_PATTERN.contains("{0,31}") && TOOL_ITEM_PATTERN.contains("{1,128}"));
        assert_eq!(tool_item_pattern(&[]), "^builtin$");
        assert_eq!(
            tool_item_pattern(&["fs", "web-2"]),
            "^(builtin|(fs|web-2)(:[A-Za-z0-9_./-]{1,128})?)$"
        );
        // The served pattern's `:tool` part is the generic one.
        let open = TOOL_ITEM_PATTERN.find('(').unwrap();
        let tool_part = &TOOL_ITEM_PATTERN[open..TOOL_ITEM_PATTERN.len() - 1];
        assert!(tool_item_pattern(&["fs"]).contains(tool_part));
    }

    #[test]
    fn choices_are_checked_against_the_servers_and_the_tenant() {
        let config = parse(
            r#"{"mcpServers": {"fs": {"command": "x"}, "pay": {"command": "y", "tenants": ["acme"]}}}"#,
        )
        .unwrap();
        let choice = |list: &[&str]| ToolChoice::parse(Some(&items(list))).unwrap();
        assert_eq!(
            config.check_choice(&choice(&["fs:read", "pay"]), "acme"),
            Ok(())
        );
        let err = config
            .check_choice(&choice(&["builtin", "pay"]), "other")
            .unwrap_err();
        assert!(
            err.starts_with("executor.tools[1]") && err.contains("`pay`"),
            "{err}"
        );
        let err = config
            .check_choice(&choice(&["nope:x"]), "acme")
            .unwrap_err();
        assert!(
            err.contains("no MCP server named `nope`") && err.contains("fs, pay"),
            "{err}"
        );
        // Another tenant is told of the servers it may use, and of no other.
        for asked in ["nope:x", "pay"] {
            let err = config.check_choice(&choice(&[asked]), "other").unwrap_err();
            assert!(err.contains("(configured: fs)"), "{err}");
            assert!(!err.contains("pay") || asked == "pay", "{err}");
            assert!(!err.contains("fs, pay"), "{err}");
        }
        let err = McpConfig::default()
            .check_choice(&choice(&["fs"]), "acme")
            .unwrap_err();
        assert!(err.contains("configured: none"), "{err}");
    }

    #[test]
    fn function_names_are_namespaced_and_fit_openai() {
        assert_eq!(function_name("fs", "read").as_deref(), Some("fs__read"));
        assert_eq!(function_name("fs", "a.b/c").as_deref(), Some("fs__a_b_c"));
        assert_eq!(
            function_name("fs", &"x".repeat(60)).map(|n| n.len()),
            Some(64)
        );
        assert_eq!(function_name("fs", &"x".repeat(61)), None);
    }
}
