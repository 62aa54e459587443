//! The outbound-request policy for every URL a client can choose (an `llm`
//! session's `base_url`, a webhook's `url`): without it, a session could
//! make Warden call its own loopback services, private networks or a
//! cloud's instance metadata and read the answer back (SSRF).
//!
//! A URL is vetted when it is given, and again on every connection: the
//! HTTP client resolves names through [`PolicyResolver`], which hands the
//! connector only addresses the policy allows, so a name that resolves to a
//! public address at creation and to `127.0.0.1` later (DNS rebinding) is
//! still refused. Redirects are never followed and answers are read up to a
//! cap. The operator's own `WARDEN_LLM_BASE_URL` does not go through here.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use reqwest::Url;

/// Largest answer read from a client-chosen endpoint unless configured.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

/// Why an outbound request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressError {
    /// The text is not an absolute http(s) URL.
    #[error("must be an http:// or https:// URL")]
    NotHttp,
    /// The host is an address the policy refuses.
    #[error(
        "points at a {category} address ({addr}), which Warden does not call; an operator can allow it with WARDEN_EGRESS_ALLOW"
    )]
    Refused {
        /// What kind of address it is (`loopback`, `private`, …).
        category: &'static str,
        /// The address.
        addr: IpAddr,
    },
    /// The name did not resolve, or resolved only to refused addresses.
    #[error("host {host} cannot be used: {why}")]
    Unresolvable {
        /// The host name.
        host: String,
        /// What went wrong.
        why: String,
    },
}

/// One entry of `WARDEN_EGRESS_ALLOW`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum AllowRule {
    /// A host name, any port or one port.
    Host { name: String, port: Option<u16> },
    /// An address range (a single address is a /32 or /128), any port or one port.
    Net { net: IpNet, port: Option<u16> },
}

/// Which client-chosen destinations Warden may call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    allow: Vec<AllowRule>,
    max_response_bytes: usize,
}

impl EgressPolicy {
    /// The default policy: only public addresses, answers up to 4 MiB.
    pub fn new() -> EgressPolicy {
        EgressPolicy {
            allow: Vec::new(),
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        }
    }

    /// Parses `WARDEN_EGRESS_ALLOW`: comma-separated host names, `host:port`,
    /// addresses (`10.0.0.5`, `[::1]:8080`) and CIDR ranges (`10.0.0.0/8`).
    pub fn with_allow_list(mut self, list: &str) -> Result<EgressPolicy, String> {
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            self.allow.push(parse_rule(entry)?);
        }
        Ok(self)
    }

    /// Sets the largest answer read from a client-chosen endpoint.
    pub fn with_max_response_bytes(mut self, bytes: usize) -> EgressPolicy {
        self.max_response_bytes = bytes;
        self
    }

    /// Largest answer read from a client-chosen endpoint.
    pub fn max_response_bytes(&self) -> usize {
        self.max_response_bytes
    }

    /// Checks a URL without resolving it: scheme, and the host when it is
    /// an address literal (names are checked when they resolve).
    pub fn check_url(&self, url: &str) -> Result<(), EgressError> {
        let parsed = parse_http_url(url)?;
        let port = parsed.port_or_known_default().unwrap_or(0);
        match parsed.host() {
            Some(url::Host::Ipv4(ip)) => self.check_addr(IpAddr::V4(ip), port),
            Some(url::Host::Ipv6(ip)) => self.check_addr(IpAddr::V6(ip), port),
            Some(url::Host::Domain(_)) => Ok(()),
            None => Err(EgressError::NotHttp),
        }
    }

    /// Checks a URL and, for a host name, that it resolves now to at least
    /// one address the policy allows (so a bad URL is refused when given).
    pub async fn vet_url(&self, url: &str) -> Result<(), EgressError> {
        self.check_url(url)?;
        let parsed = parse_http_url(url)?;
        if let Some(url::Host::Domain(name)) = parsed.host() {
            let port = parsed.port_or_known_default().unwrap_or(0);
            self.resolve_allowed(name, port).await?;
        }
        Ok(())
    }

    /// Whether `addr` on `port` may be called, and why not.
    pub fn check_addr(&self, addr: IpAddr, port: u16) -> Result<(), EgressError> {
        let addr = canonical(addr);
        if self.allow.iter().any(|rule| match rule {
            AllowRule::Net { net, port: p } => net.contains(&addr) && p.is_none_or(|p| p == port),
            AllowRule::Host { .. } => false,
        }) {
            return Ok(());
        }
        match refused_category(addr) {
            Some(category) => Err(EgressError::Refused { category, addr }),
            None => Ok(()),
        }
    }

    fn host_allowed(&self, name: &str, port: u16) -> bool {
        let name = name.trim_end_matches('.');
        self.allow.iter().any(|rule| match rule {
            AllowRule::Host { name: n, port: p } => {
                n.eq_ignore_ascii_case(name) && p.is_none_or(|p| p == port)
            }
            AllowRule::Net { .. } => false,
        })
    }

    /// Resolves `name` and keeps the addresses the policy allows; an error
    /// when none is left.
    async fn resolve_allowed(&self, name: &str, port: u16) -> Result<Vec<SocketAddr>, EgressError> {
        let unresolvable = |why: String| EgressError::Unresolvable {
            host: name.to_string(),
            why,
        };
        let found: Vec<SocketAddr> = tokio::net::lookup_host((name, port))
            .await
            .map_err(|e| unresolvable(format!("it does not resolve ({e})")))?
            .collect();
        if self.host_allowed(name, port) {
            return Ok(found);
        }
        let mut refused = None;
        let allowed: Vec<SocketAddr> = found
            .into_iter()
            .filter(|a| match self.check_addr(a.ip(), port) {
                Ok(()) => true,
                Err(e) => {
                    refused.get_or_insert(e);
                    false
                }
            })
            .collect();
        if allowed.is_empty() {
            return Err(match refused {
                Some(e) => unresolvable(e.to_string()),
                None => unresolvable("it resolves to no address".into()),
            });
        }
        Ok(allowed)
    }

    /// An HTTP client for calls to `url` under this policy: names resolve
    /// through the policy, no proxy, no redirects, `timeout` per request.
    pub fn client_for(
        self: &Arc<Self>,
        url: &str,
        timeout: Duration,
    ) -> Result<reqwest::Client, EgressError> {
        let parsed = parse_http_url(url)?;
        self.check_url(url)?;
        let port = parsed.port_or_known_default().unwrap_or(0);
        reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(Arc::new(PolicyResolver {
                policy: Arc::clone(self),
                port,
            }))
            .build()
            .map_err(|e| EgressError::Unresolvable {
                host: parsed.host_str().unwrap_or_default().to_string(),
                why: format!("no HTTP client could be built ({})", e.without_url()),
            })
    }
}

/// Resolves names for a client under an [`EgressPolicy`]: the connector
/// only ever sees addresses that passed the policy at connection time.
struct PolicyResolver {
    policy: Arc<EgressPolicy>,
    /// The one port this client calls (its URL's).
    port: u16,
}

impl reqwest::dns::Resolve for PolicyResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = Arc::clone(&self.policy);
        let port = self.port;
        Box::pin(async move {
            let addrs = policy.resolve_allowed(name.as_str(), port).await?;
            let addrs: reqwest::dns::Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

impl fmt::Display for EgressPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.allow.is_empty() {
            return f.write_str("public addresses only");
        }
        let rules: Vec<String> = self
            .allow
            .iter()
            .map(|r| match r {
                AllowRule::Host { name, port: None } => name.clone(),
                AllowRule::Host {
                    name,
                    port: Some(p),
                } => format!("{name}:{p}"),
                AllowRule::Net { net, port: None } => net.to_string(),
                AllowRule::Net { net, port: Some(p) } => format!("{net}:{p}"),
            })
            .collect();
        write!(f, "public addresses and {}", rules.join(", "))
    }
}

fn parse_http_url(url: &str) -> Result<Url, EgressError> {
    let parsed = Url::parse(url).map_err(|_| EgressError::NotHttp)?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
        return Err(EgressError::NotHttp);
    }
    Ok(parsed)
}

fn parse_rule(entry: &str) -> Result<AllowRule, String> {
    let bad =
        || format!("{entry:?} is not a host, host:port, address or CIDR range (e.g. 10.0.0.0/8)");
    if entry.contains('/') {
        return entry
            .parse::<IpNet>()
            .map(|net| AllowRule::Net {
                net: net.trunc(),
                port: None,
            })
            .map_err(|_| bad());
    }
    if let Ok(ip) = entry.parse::<IpAddr>() {
        return Ok(AllowRule::Net {
            net: IpNet::from(canonical(ip)),
            port: None,
        });
    }
    if let Ok(sock) = entry.parse::<SocketAddr>() {
        return Ok(AllowRule::Net {
            net: IpNet::from(canonical(sock.ip())),
            port: Some(sock.port()),
        });
    }
    let (name, port) = match entry.rsplit_once(':') {
        Some((name, port)) => (name, Some(port.parse::<u16>().map_err(|_| bad())?)),
        None => (entry, None),
    };
    let valid = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
    if !valid {
        return Err(bad());
    }
    Ok(AllowRule::Host {
        name: name.trim_end_matches('.').to_ascii_lowercase(),
        port,
    })
}

/// An IPv4 address written as IPv6 (`::ffff:127.0.0.1`) is that IPv4 address.
fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// The kind of address Warden refuses to call for a client, or `None` for
/// an ordinary public address.
pub fn refused_category(addr: IpAddr) -> Option<&'static str> {
    match canonical(addr) {
        IpAddr::V4(v4) => refused_v4(v4),
        IpAddr::V6(v6) => refused_v6(v6),
    }
}

/// IPv4 ranges Warden refuses, most specific first: the IANA IPv4
/// Special-Purpose Address Registry's ranges that are not globally
/// reachable, multicast, reserved, and the clouds' metadata endpoints.
const REFUSED_V4: &[([u8; 4], u8, &str)] = &[
    ([169, 254, 169, 254], 32, "cloud metadata"),
    ([169, 254, 170, 2], 32, "cloud metadata"),
    ([100, 100, 100, 200], 32, "cloud metadata"),
    ([0, 0, 0, 0], 8, "unspecified"),
    ([10, 0, 0, 0], 8, "private"),
    ([100, 64, 0, 0], 10, "shared (CGNAT)"),
    ([127, 0, 0, 0], 8, "loopback"),
    ([169, 254, 0, 0], 16, "link-local"),
    ([172, 16, 0, 0], 12, "private"),
    ([192, 0, 0, 0], 24, "special-purpose"),
    ([192, 0, 2, 0], 24, "documentation"),
    ([192, 88, 99, 0], 24, "6to4 relay anycast"),
    ([192, 168, 0, 0], 16, "private"),
    ([198, 18, 0, 0], 15, "benchmarking"),
    ([198, 51, 100, 0], 24, "documentation"),
    ([203, 0, 113, 0], 24, "documentation"),
    ([224, 0, 0, 0], 4, "multicast"),
    ([255, 255, 255, 255], 32, "broadcast"),
    ([240, 0, 0, 0], 4, "reserved"),
];

/// What an IPv6 range holds, for the policy.
#[derive(Clone, Copy)]
enum V6Range {
    /// Refused, as this kind of address.
    Refused(&'static str),
    /// Carries an IPv4 address in the last 32 bits (NAT64), judged as that address.
    EmbedsLow32,
    /// Carries an IPv4 address in bits 16..48 (6to4), judged as that address.
    Embeds6to4,
}

/// IPv6 ranges with a rule, most specific first: the IANA IPv6
/// Special-Purpose Address Registry and the address architecture. Whatever
/// is outside them and outside global unicast `2000::/3` is refused too.
const V6_RANGES: &[(u128, u8, V6Range)] = &[
    (
        0xfd00_0ec2_0000_0000_0000_0000_0000_0254,
        128,
        V6Range::Refused("cloud metadata"),
    ),
    (0, 128, V6Range::Refused("unspecified")),
    (1, 128, V6Range::Refused("loopback")),
    (
        0x0064_ff9b_0000_0000_0000_0000_0000_0000,
        96,
        V6Range::EmbedsLow32,
    ),
    (
        0x0064_ff9b_0001_0000_0000_0000_0000_0000,
        48,
        V6Range::Refused("local-use IPv4/IPv6 translation"),
    ),
    (
        0x0000_0000_0000_0000_ffff_0000_0000_0000,
        96,
        V6Range::Refused("IPv4-translated"),
    ),
    (0, 96, V6Range::Refused("IPv4-compatible (deprecated)")),
    (
        0x0100_0000_0000_0000_0000_0000_0000_0000,
        64,
        V6Range::Refused("discard-only"),
    ),
    (
        0x2001_0000_0000_0000_0000_0000_0000_0000,
        32,
        V6Range::Refused("Teredo"),
    ),
    (
        0x2001_0002_0000_0000_0000_0000_0000_0000,
        48,
        V6Range::Refused("benchmarking"),
    ),
    (
        0x2001_0010_0000_0000_0000_0000_0000_0000,
        28,
        V6Range::Refused("ORCHID"),
    ),
    (
        0x2001_0020_0000_0000_0000_0000_0000_0000,
        28,
        V6Range::Refused("ORCHIDv2"),
    ),
    (
        0x2001_0000_0000_0000_0000_0000_0000_0000,
        23,
        V6Range::Refused("special-purpose"),
    ),
    (
        0x2001_0db8_0000_0000_0000_0000_0000_0000,
        32,
        V6Range::Refused("documentation"),
    ),
    (
        0x2002_0000_0000_0000_0000_0000_0000_0000,
        16,
        V6Range::Embeds6to4,
    ),
    (
        0x3fff_0000_0000_0000_0000_0000_0000_0000,
        20,
        V6Range::Refused("documentation"),
    ),
    (
        0xfc00_0000_0000_0000_0000_0000_0000_0000,
        7,
        V6Range::Refused("private"),
    ),
    (
        0xfe80_0000_0000_0000_0000_0000_0000_0000,
        10,
        V6Range::Refused("link-local"),
    ),
    (
        0xfec0_0000_0000_0000_0000_0000_0000_0000,
        10,
        V6Range::Refused("site-local"),
    ),
    (
        0xff00_0000_0000_0000_0000_0000_0000_0000,
        8,
        V6Range::Refused("multicast"),
    ),
];

/// Whether `addr` is in the `prefix`-bit range starting at `net`.
fn in_range<T>(addr: T, net: T, prefix: u8, bits: u32) -> bool
where
    T: Copy + std::ops::BitXor<Output = T> + std::ops::Shr<u32, Output = T> + PartialEq + From<u8>,
{
    let prefix = u32::from(prefix);
    prefix == 0 || ((addr ^ net) >> (bits - prefix)) == T::from(0)
}

fn refused_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let addr = u32::from(ip);
    REFUSED_V4
        .iter()
        .find(|(net, prefix, _)| in_range(addr, u32::from_be_bytes(*net), *prefix, 32))
        .map(|(_, _, category)| *category)
}

fn refused_v6(ip: Ipv6Addr) -> Option<&'static str> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return refused_v4(v4);
    }
    let addr = u128::from(ip);
    let rule = V6_RANGES
        .iter()
        .find(|(net, prefix, _)| in_range(addr, *net, *prefix, 128))
        .map(|(_, _, rule)| *rule);
    match rule {
        Some(V6Range::Refused(category)) => Some(category),
        // The translator or relay calls the embedded IPv4 address for us:
        // it is allowed only when that address is.
        Some(V6Range::EmbedsLow32) => refused_v4(Ipv4Addr::from(addr as u32)),
        Some(V6Range::Embeds6to4) => refused_v4(Ipv4Addr::from((addr >> 80) as u32)),
        None if (addr >> 125) != 0b001 => Some("reserved"),
        None => None,
    }
}

/// Why an answer's body was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// The answer is larger than the cap. Permanent: asking again brings
    /// the same answer, so it is neither retried nor "unreachable".
    #[error("answer too large: {}{over} bytes over the cap of {cap} bytes", if *.exact { "" } else { "at least " })]
    TooLarge {
        /// Bytes over the cap (all of them when `exact`, else those seen before reading stopped).
        over: u64,
        /// Whether `over` is the whole excess (a `Content-Length` told it).
        exact: bool,
        /// The cap.
        cap: usize,
    },
    /// The body could not be read (connection lost, timeout): transient.
    #[error("the answer could not be read ({0})")]
    Unreadable(String),
}

impl ReadError {
    /// Whether asking again may bring another result.
    pub fn is_transient(&self) -> bool {
        matches!(self, ReadError::Unreadable(_))
    }
}

/// Whether an answer announced as `content_length` bytes, or of which
/// `read` bytes have arrived so far, is over `cap`: the error to give up with.
pub fn over_cap(content_length: Option<u64>, read: usize, cap: usize) -> Option<ReadError> {
    if let Some(len) = content_length.filter(|len| *len > cap as u64) {
        return Some(ReadError::TooLarge {
            over: len - cap as u64,
            exact: true,
            cap,
        });
    }
    (read > cap).then(|| ReadError::TooLarge {
        over: (read - cap) as u64,
        exact: false,
        cap,
    })
}

/// Reads an answer's body, refusing one larger than `cap` bytes without
/// reading the rest (and without keeping more than `cap` bytes).
pub async fn read_capped(
    mut response: reqwest::Response,
    cap: usize,
) -> Result<Vec<u8>, ReadError> {
    if let Some(err) = over_cap(response.content_length(), 0, cap) {
        return Err(err);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| ReadError::Unreadable(e.without_url().to_string()))?
    {
        if let Some(err) = over_cap(None, body.len() + chunk.len(), cap) {
            return Err(err);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// What may be shown or stored of an upstream error answer: its status and,
/// when the body is a JSON error object with a message (as OpenAI-compatible
/// servers send), that message — short and printable. Anything else in the
/// body stays out, so an error answer cannot carry data back to a client.
pub fn upstream_error_summary(status: reqwest::StatusCode, body: &[u8]) -> String {
    let message = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            let m = v.pointer("/error/message").or_else(|| v.get("error"))?;
            m.as_str().map(str::to_string)
        })
        .map(|m| sanitize(&m, 200));
    match message {
        Some(m) if !m.is_empty() => format!("{status}: {m}"),
        _ => status.to_string(),
    }
}

/// A transport error as shown: without the URL (it may carry credentials),
/// with the cause that says why (refused by the egress policy, refused
/// connection, timeout).
pub fn transport_error(e: &reqwest::Error) -> String {
    let mut text = if e.is_timeout() {
        "timed out".to_string()
    } else if e.is_connect() {
        "could not connect".to_string()
    } else {
        "request failed".to_string()
    };
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text = format!("{text}: {}", sanitize(&cause.to_string(), 200));
        source = cause.source();
    }
    text
}

/// Keeps printable characters, at most `max` of them.
pub fn sanitize(text: &str, max: usize) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(max)
        .collect::<String>()
        .trim()
        .to_string()
}

/// Splits an http(s) URL into the part before its query and the query
/// (`None` when there is none or it is empty); a fragment is dropped (it is
/// never sent). No parsing and re-printing, so the rest stays as given.
pub fn split_query(url: &str) -> (&str, Option<&str>) {
    let url = url.split_once('#').map_or(url, |(before, _)| before);
    match url.split_once('?') {
        Some((before, query)) => (before, Some(query).filter(|q| !q.is_empty())),
        None => (url, None),
    }
}

/// A URL as shown back to clients: without userinfo, query or fragment.
pub fn redact_url(url: &str) -> String {
    match Url::parse(url) {
        Ok(mut u) => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.set_query(None);
            u.set_fragment(None);
            u.to_string()
        }
        Err(_) => "<invalid url>".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }

    #[test]
    fn an_answer_over_the_cap_is_a_permanent_too_large_error() {
        assert_eq!(over_cap(Some(100), 0, 100), None);
        assert_eq!(over_cap(None, 100, 100), None);
        let announced = over_cap(Some(150), 0, 100).unwrap();
        assert_eq!(
            announced.to_string(),
            "answer too large: 50 bytes over the cap of 100 bytes"
        );
        assert!(!announced.is_transient());
        let streamed = over_cap(None, 130, 100).unwrap();
        assert_eq!(
            streamed.to_string(),
            "answer too large: at least 30 bytes over the cap of 100 bytes"
        );
        assert!(!streamed.is_transient());
        assert!(ReadError::Unreadable("reset".into()).is_transient());
    }

    /// Every range the policy refuses, as the IANA special-purpose
    /// registries (and the address architecture) list them.
    const REFUSED_RANGES: &[(&str, &str)] = &[
        ("0.0.0.0/8", "unspecified"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "shared (CGNAT)"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "special-purpose"),
        ("192.0.2.0/24", "documentation"),
        ("192.88.99.0/24", "6to4 relay anycast"),
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "benchmarking"),
        ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/5", "reserved"),
        ("255.255.255.255/32", "broadcast"),
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("::2/127", "IPv4-compatible (deprecated)"),
        ("::ffff:0:0:0/96", "IPv4-translated"),
        ("64:ff9b:1::/48", "local-use IPv4/IPv6 translation"),
        ("100::/64", "discard-only"),
        ("2001::/32", "Teredo"),
        ("2001:2::/48", "benchmarking"),
        ("2001:10::/28", "ORCHID"),
        ("2001:20::/28", "ORCHIDv2"),
        ("2001:1::/32", "special-purpose"),
        ("2001:db8::/32", "documentation"),
        ("3fff::/20", "documentation"),
        ("fc00::/7", "private"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local"),
        ("ff00::/8", "multicast"),
        ("4000::/3", "reserved"),
        ("5f00::/16", "reserved"),
        ("fe00::/9", "reserved"),
    ];

    #[test]
    fn every_special_purpose_range_is_refused_first_to_last() {
        for (range, category) in REFUSED_RANGES {
            let net: IpNet = range.parse().expect("test range");
            for addr in [net.network(), net.broadcast()] {
                assert_eq!(refused_category(addr), Some(*category), "{addr} in {range}");
            }
        }
    }

    #[test]
    fn addresses_just_outside_the_ranges_are_judged_on_their_own() {
        for (addr, expected) in [
            // Public neighbours of the refused IPv4 ranges.
            ("1.0.0.0", None),
            ("9.255.255.255", None),
            ("11.0.0.0", None),
            ("100.63.255.255", None),
            ("100.128.0.0", None),
            ("126.255.255.255", None),
            ("128.0.0.0", None),
            ("169.253.255.255", None),
            ("169.255.0.0", None),
            ("172.15.255.255", None),
            ("172.32.0.0", None),
            ("191.255.255.255", None),
            ("192.0.1.0", None),
            ("192.0.3.0", None),
            ("192.88.98.255", None),
            ("192.88.100.0", None),
            ("192.167.255.255", None),
            ("192.169.0.0", None),
            ("198.17.255.255", None),
            ("198.20.0.0", None),
            ("198.51.99.255", None),
            ("198.51.101.0", None),
            ("203.0.112.255", None),
            ("203.0.114.0", None),
            ("223.255.255.255", None),
            ("255.255.255.254", Some("reserved")),
            // Cloud metadata inside link-local and CGNAT.
            ("169.254.169.254", Some("cloud metadata")),
            ("169.254.170.2", Some("cloud metadata")),
            ("100.100.100.200", Some("cloud metadata")),
            ("fd00:ec2::254", Some("cloud metadata")),
            // Public neighbours of the refused IPv6 ranges.
            ("2000::", None),
            ("2001:200::", None),
            ("2001:db7:ffff:ffff:ffff:ffff:ffff:ffff", None),
            ("2001:db9::", None),
            ("2003::", None),
            ("3ffe:ffff:ffff:ffff:ffff:ffff:ffff:ffff", None),
            ("3fff:1000::", None),
            ("2606:4700:4700::1111", None),
            (
                "3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff",
                Some("documentation"),
            ),
            ("1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Some("reserved")),
            ("100:0:0:1::", Some("reserved")),
            ("64:ff9a:ffff:ffff:ffff:ffff:ffff:ffff", Some("reserved")),
            ("64:ff9b::1:0:0", Some("reserved")),
            ("fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Some("reserved")),
            ("::ffff:1:0:0", Some("reserved")),
            ("::1:0:0:0", Some("reserved")),
            ("::fffe:ffff:ffff", Some("reserved")),
            ("::1:0:0:0:0", Some("reserved")),
        ] {
            assert_eq!(refused_category(ip(addr)), expected, "{addr}");
        }
    }

    #[test]
    fn an_embedded_ipv4_address_is_judged_as_itself() {
        for (addr, expected) in [
            // IPv4-mapped (::ffff:0:0/96).
            ("::ffff:0.0.0.0", Some("unspecified")),
            ("::ffff:127.0.0.1", Some("loopback")),
            ("::ffff:169.254.169.254", Some("cloud metadata")),
            ("::ffff:255.255.255.255", Some("broadcast")),
            ("::ffff:8.8.8.8", None),
            // NAT64 (64:ff9b::/96): the last 32 bits.
            ("64:ff9b::", Some("unspecified")),
            ("64:ff9b::7f00:1", Some("loopback")),
            ("64:ff9b::a00:1", Some("private")),
            ("64:ff9b::a9fe:a9fe", Some("cloud metadata")),
            ("64:ff9b::ffff:ffff", Some("broadcast")),
            ("64:ff9b::808:808", None),
            // 6to4 (2002::/16): bits 16 to 48.
            ("2002::", Some("unspecified")),
            ("2002:7f00:1::1", Some("loopback")),
            ("2002:c0a8:101::1", Some("private")),
            ("2002:a9fe:a9fe::", Some("cloud metadata")),
            ("2002:6440:1::", Some("shared (CGNAT)")),
            ("2002:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Some("broadcast")),
            ("2002:808:808::1", None),
            ("2002:808:808:ffff:ffff:ffff:ffff:ffff", None),
        ] {
            assert_eq!(refused_category(ip(addr)), expected, "{addr}");
        }
    }

    #[test]
    fn allows_public_addresses() {
        for addr in ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2a00:1450:4001::1"] {
            assert_eq!(refused_category(ip(addr)), None, "{addr}");
        }
    }

    #[test]
    fn url_literals_are_checked_in_every_spelling() {
        let policy = EgressPolicy::new();
        for url in [
            "http://127.0.0.1/",
            "http://2130706433/",
            "http://0x7f000001/",
            "http://017700000001/",
            "http://127.1/",
            "http://[::1]:8080/",
            "http://[::ffff:127.0.0.1]/",
            "http://169.254.169.254/latest/meta-data/",
            "http://10.0.0.1/",
        ] {
            assert!(
                matches!(policy.check_url(url), Err(EgressError::Refused { .. })),
                "{url} should be refused"
            );
        }
        assert_eq!(policy.check_url("https://api.example.com/v1"), Ok(()));
        assert_eq!(policy.check_url("http://93.184.216.34/"), Ok(()));
        for bad in [
            "ftp://example.com/",
            "file:///etc/passwd",
            "example.com",
            "",
        ] {
            assert_eq!(policy.check_url(bad), Err(EgressError::NotHttp), "{bad}");
        }
    }

    #[test]
    fn allow_list_opens_exactly_what_it_names() {
        let policy = EgressPolicy::new()
            .with_allow_list("10.0.0.0/8, 127.0.0.1:11434, [::1]:9000, ollama.internal, gpu:8000")
            .expect("valid list");
        assert_eq!(policy.check_addr(ip("10.1.2.3"), 80), Ok(()));
        assert_eq!(policy.check_addr(ip("127.0.0.1"), 11434), Ok(()));
        assert!(policy.check_addr(ip("127.0.0.1"), 11435).is_err());
        assert_eq!(policy.check_addr(ip("::1"), 9000), Ok(()));
        assert!(policy.check_addr(ip("::1"), 9001).is_err());
        assert!(policy.check_addr(ip("192.168.0.1"), 80).is_err());
        assert!(policy.check_addr(ip("169.254.169.254"), 80).is_err());
        assert!(policy.host_allowed("ollama.internal", 1234));
        assert!(policy.host_allowed("OLLAMA.internal.", 1234));
        assert!(policy.host_allowed("gpu", 8000));
        assert!(!policy.host_allowed("gpu", 8001));
        assert!(!policy.host_allowed("localhost", 80));
        assert_eq!(
            policy.check_url("http://127.0.0.1:11434/v1"),
            Ok(()),
            "an allowed address literal"
        );
    }

    #[test]
    fn a_single_allowed_address_covers_its_mapped_form() {
        let policy = EgressPolicy::new()
            .with_allow_list("127.0.0.1")
            .expect("valid list");
        assert_eq!(policy.check_url("http://[::ffff:127.0.0.1]:8/"), Ok(()));
        assert!(policy.check_url("http://127.0.0.2/").is_err());
    }

    #[test]
    fn bad_allow_entries_are_refused() {
        for bad in ["10.0.0.0/33", "host:notaport", "bad host", "a/b", "x:70000"] {
            assert!(
                EgressPolicy::new().with_allow_list(bad).is_err(),
                "{bad} should not parse"
            );
        }
        assert_eq!(
            EgressPolicy::new().with_allow_list(" , ,"),
            Ok(EgressPolicy::new())
        );
    }

    #[tokio::test]
    async fn names_resolving_to_internal_addresses_are_refused() {
        let policy = EgressPolicy::new();
        let err = policy
            .vet_url("http://localhost:8080/step")
            .await
            .expect_err("localhost is loopback");
        assert!(err.to_string().contains("loopback"), "{err}");
        let open = EgressPolicy::new()
            .with_allow_list("localhost")
            .expect("valid list");
        assert_eq!(open.vet_url("http://localhost:8080/step").await, Ok(()));
    }

    #[test]
    fn error_answers_are_summarised_not_echoed() {
        let status = reqwest::StatusCode::BAD_REQUEST;
        assert_eq!(
            upstream_error_summary(status, br#"{"error":{"message":"bad\nmodel"}}"#),
            "400 Bad Request: bad model"
        );
        assert_eq!(
            upstream_error_summary(status, b"ami-id\ninstance-id\nsecret-token"),
            "400 Bad Request"
        );
        assert_eq!(
            upstream_error_summary(status, br#"{"error":"no such model"}"#),
            "400 Bad Request: no such model"
        );
        let long = format!(r#"{{"error":{{"message":"{}"}}}}"#, "x".repeat(1000));
        assert!(upstream_error_summary(status, long.as_bytes()).len() < 230);
    }

    #[test]
    fn shown_urls_drop_credentials_and_query() {
        assert_eq!(
            redact_url("https://user:pw@agent.example/step?token=abc#frag"),
            "https://agent.example/step"
        );
        assert_eq!(redact_url("not a url"), "<invalid url>");
    }
}
