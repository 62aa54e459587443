//! The HTTP client of the commands that talk to a running Warden (`warden
//! sessions`, `warden workers`): where the server is and which key to send
//! (flag, environment, config file, default), requests with a deadline, and
//! the server's problem documents as errors. Never the database.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use clap::Args;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use serde_json::Value;
use warden::config::settings;

/// Environment variable naming the server (as the Python worker reads it).
const URL_VAR: &str = "WARDEN_URL";
/// Environment variable holding the API key.
const KEY_VAR: &str = "WARDEN_API_KEY";
/// The Python worker's name for the key, read when [`KEY_VAR`] is unset.
const WORKER_KEY_VAR: &str = "WARDEN_KEY";
/// A request (not a stream) that has not been answered by then fails.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// A server that accepts no connection by then is unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes of an answer read at most (a page of 200 sessions is well below).
const MAX_ANSWER_BYTES: usize = 32 << 20;
/// How long a newline-delimited answer may take in all: the server bounds
/// its streams by a deadline of at most a minute.
const NDJSON_TIMEOUT: Duration = Duration::from_secs(120);

/// The flags every client command takes (after the command or before it).
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// The server's URL [default: $WARDEN_URL, the config file's `url`, or http://127.0.0.1:8080]
    #[arg(long, global = true, value_name = "URL")]
    pub url: Option<String>,
    /// The API key [default: $WARDEN_API_KEY, the config file's `key`]; never printed
    #[arg(long, global = true, value_name = "KEY")]
    pub key: Option<ApiKey>,
    /// Print the server's JSON answer as it is, for scripts
    #[arg(long, global = true)]
    pub json: bool,
}

/// An API key: its `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl std::str::FromStr for ApiKey {
    type Err = String;

    fn from_str(raw: &str) -> Result<ApiKey, String> {
        let raw = raw.trim();
        if raw.is_empty() || !raw.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("a key is visible ASCII characters, without spaces".into());
        }
        Ok(ApiKey(raw.to_string()))
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<hidden>)")
    }
}

/// Why a client command failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with a problem document (or another error status).
    #[error("{title} ({status}): {detail}")]
    Problem {
        /// The HTTP status.
        status: u16,
        /// The problem's title.
        title: String,
        /// The problem's detail.
        detail: String,
    },
    /// The server could not be reached, or its answer not read.
    #[error("{0}")]
    Transport(String),
    /// A setting or an answer that makes no sense.
    #[error("{0}")]
    Invalid(String),
}

/// A client of one Warden server.
pub struct Client {
    http: reqwest::Client,
    base: reqwest::Url,
    key: Option<ApiKey>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base.as_str())
            .field("key", &self.key)
            .finish()
    }
}

/// The config file's `url` and `key` (`$XDG_CONFIG_HOME/warden/cli.toml`,
/// else `~/.config/warden/cli.toml`): lines `name = "value"`, `#` comments.
fn config_file(env: &HashMap<String, String>) -> HashMap<String, String> {
    let dir = match (env.get("XDG_CONFIG_HOME"), env.get("HOME")) {
        (Some(xdg), _) if !xdg.is_empty() => std::path::PathBuf::from(xdg),
        (_, Some(home)) if !home.is_empty() => std::path::Path::new(home).join(".config"),
        _ => return HashMap::new(),
    };
    std::fs::read_to_string(dir.join("warden").join("cli.toml"))
        .map(|text| parse_config(&text))
        .unwrap_or_default()
}

/// `name = "value"` lines (quotes optional) as a map; others are skipped.
pub(super) fn parse_config(text: &str) -> HashMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split_once('='))
        .map(|(name, value)| {
            let value = value.trim();
            let unquoted = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(value);
            (name.trim().to_string(), unquoted.to_string())
        })
        .collect()
}

/// The server's default URL: its default listen address, on HTTP.
fn default_url() -> String {
    match settings::WARDEN_LISTEN_ADDR.default {
        settings::DefaultValue::Text(addr) => format!("http://{addr}"),
        _ => "http://127.0.0.1:8080".into(),
    }
}

impl ServerArgs {
    /// The client these flags, the environment and the config file name.
    pub fn client(&self) -> Result<Client, ClientError> {
        let env = settings::process_env();
        let file = config_file(&env);
        let nonempty = |v: Option<&String>| v.filter(|v| !v.trim().is_empty()).cloned();
        let url = self
            .url
            .clone()
            .or_else(|| nonempty(env.get(URL_VAR)))
            .or_else(|| nonempty(file.get("url")))
            .unwrap_or_else(default_url);
        let key = match self.key.clone() {
            Some(key) => Some(key),
            None => nonempty(env.get(KEY_VAR))
                .or_else(|| nonempty(env.get(WORKER_KEY_VAR)))
                .or_else(|| nonempty(file.get("key")))
                .map(|raw| raw.parse::<ApiKey>().map_err(ClientError::Invalid))
                .transpose()?,
        };
        Client::new(&url, key)
    }
}

impl Client {
    /// A client of the server at `url` sending `key`.
    pub fn new(url: &str, key: Option<ApiKey>) -> Result<Client, ClientError> {
        let mut base = reqwest::Url::parse(url.trim())
            .map_err(|e| ClientError::Invalid(format!("server URL {url:?}: {e}")))?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err(ClientError::Invalid(format!(
                "server URL {url:?}: http or https only"
            )));
        }
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(|e| ClientError::Transport(format!("cannot make an HTTP client: {e}")))?;
        Ok(Client { http, base, key })
    }

    /// The URL of `path` (relative, e.g. `api/autonomous`) under the base.
    fn url(&self, path: &str) -> Result<reqwest::Url, ClientError> {
        self.base
            .join(path.trim_start_matches('/'))
            .map_err(|e| ClientError::Invalid(format!("{path}: {e}")))
    }

    /// A request to `url` with the key, as sensitive so no log shows it.
    fn request(
        &self,
        method: reqwest::Method,
        url: reqwest::Url,
    ) -> Result<reqwest::RequestBuilder, ClientError> {
        let mut request = self.http.request(method, url);
        if let Some(ApiKey(key)) = &self.key {
            let mut value = HeaderValue::from_str(&format!("Bearer {key}"))
                .map_err(|_| ClientError::Invalid("the key is not a valid header".into()))?;
            value.set_sensitive(true);
            request = request.header(AUTHORIZATION, value);
        }
        Ok(request)
    }

    /// `GET path?query`: the answer's JSON.
    pub async fn get(&self, path: &str, query: &[(&str, String)]) -> Result<Value, ClientError> {
        let mut url = self.url(path)?;
        if !query.is_empty() {
            url.query_pairs_mut()
                .extend_pairs(query.iter().map(|(k, v)| (*k, v.as_str())));
        }
        let request = self
            .request(reqwest::Method::GET, url)?
            .timeout(REQUEST_TIMEOUT);
        json_answer(send(request).await?).await
    }

    /// `POST path` with `body` (JSON; `None` sends none, still as JSON).
    pub async fn post(&self, path: &str, body: Option<&Value>) -> Result<Value, ClientError> {
        let mut request = self
            .request(reqwest::Method::POST, self.url(path)?)?
            .header(CONTENT_TYPE, "application/json")
            .timeout(REQUEST_TIMEOUT);
        if let Some(body) = body {
            request = request.body(body.to_string());
        }
        json_answer(send(request).await?).await
    }

    /// `POST path` with `body` (JSON), asking for newline-delimited JSON:
    /// the response once its status is a success (its body is the lines).
    pub async fn post_ndjson(
        &self,
        path: &str,
        body: &Value,
    ) -> Result<reqwest::Response, ClientError> {
        let request = self
            .request(reqwest::Method::POST, self.url(path)?)?
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/x-ndjson")
            .timeout(NDJSON_TIMEOUT)
            .body(body.to_string());
        let response = send(request).await?;
        if response.status().is_success() {
            Ok(response)
        } else {
            Err(problem_of(response).await)
        }
    }

    /// `GET path` as an event stream, resuming after `last_event_id`: the
    /// response once its status is a success (its body is the stream).
    pub async fn stream(
        &self,
        path: &str,
        last_event_id: Option<i64>,
    ) -> Result<reqwest::Response, ClientError> {
        let mut request = self
            .request(reqwest::Method::GET, self.url(path)?)?
            .header(ACCEPT, "text/event-stream");
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id.to_string());
        }
        let response = send(request).await?;
        if response.status().is_success() {
            Ok(response)
        } else {
            Err(problem_of(response).await)
        }
    }
}

/// Sends `request`; a connection or timeout failure is a transport error.
async fn send(request: reqwest::RequestBuilder) -> Result<reqwest::Response, ClientError> {
    request.send().await.map_err(|e| transport(&e))
}

/// A transport error as one line (reqwest's chain of sources included).
pub fn transport(err: &reqwest::Error) -> ClientError {
    use std::error::Error;
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    ClientError::Transport(text)
}

/// Up to [`MAX_ANSWER_BYTES`] of `response`'s body.
async fn body_of(mut response: reqwest::Response) -> Result<Vec<u8>, ClientError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| transport(&e))? {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(ClientError::Invalid(format!(
                "the answer is over {MAX_ANSWER_BYTES} bytes"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A success's JSON body, or the problem an error status carries.
async fn json_answer(response: reqwest::Response) -> Result<Value, ClientError> {
    if !response.status().is_success() {
        return Err(problem_of(response).await);
    }
    let body = body_of(response).await?;
    serde_json::from_slice(&body)
        .map_err(|e| ClientError::Invalid(format!("the answer is not JSON: {e}")))
}

/// The problem document of an error answer; its status alone when the body
/// is not one.
async fn problem_of(response: reqwest::Response) -> ClientError {
    let status = response.status();
    let body = body_of(response).await.unwrap_or_default();
    problem_from(status.as_u16(), status.canonical_reason(), &body)
}

/// [`problem_of`] from the parts of the answer.
pub(super) fn problem_from(status: u16, reason: Option<&str>, body: &[u8]) -> ClientError {
    let doc: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let text = |name: &str| doc.get(name).and_then(Value::as_str).map(str::to_string);
    ClientError::Problem {
        status,
        title: text("title").unwrap_or_else(|| reason.unwrap_or("error").to_string()),
        detail: text("detail").unwrap_or_else(|| {
            String::from_utf8_lossy(&body[..body.len().min(300)])
                .trim()
                .to_string()
        }),
    }
}
