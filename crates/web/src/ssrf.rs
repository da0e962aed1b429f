//! The SSRF guard: only http and https, and no loopback, private,
//! link-local, shared (CGNAT) or cloud-metadata addresses, in any spelling,
//! unless the host is allowlisted (`tool_runner.web.allow_hosts`).
//!
//! Integer, octal and hex IPv4 spellings (`http://2130706433/`,
//! `http://0x7f.1/`, `http://017700000001/`) need no special care: the URL
//! parser (WHATWG rules) turns them into the dotted address before the guard
//! sees the host. IPv4-mapped and IPv4-compatible IPv6 forms
//! (`[::ffff:127.0.0.1]`, `[::ffff:7f00:1]`, `[::127.0.0.1]`), NAT64
//! (`64:ff9b::/96`) and 6to4 (`2002::/16`) addresses are judged by the IPv4
//! address they embed.
//!
//! A host name is resolved and refused if any of its addresses is refused.
//! Checking a name and then letting the HTTP client resolve it again would
//! let DNS rebinding switch the address in between, so the HTTP backend
//! resolves through [`GuardedResolver`], which applies the same rules to the
//! addresses it hands to the connector.

use super::FetchError;
use crate::WebError;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

/// Host names refused whatever they resolve to.
const METADATA_NAMES: &[&str] = &["metadata.google.internal", "metadata"];

/// Checks URLs and addresses.
#[derive(Debug, Clone, Default)]
pub struct Guard {
    allow_names: Vec<String>,
    allow_ips: Vec<IpAddr>,
}

/// Lower-cased, without a trailing dot or IPv6 brackets.
fn normalize_host(host: &str) -> String {
    let host = host.trim().trim_end_matches('.');
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    host.to_ascii_lowercase()
}

impl Guard {
    /// A guard that lets the given hosts (names or IP addresses, matched
    /// exactly as they appear in the URL) through although they are
    /// internal.
    pub fn new(allow_hosts: &[String]) -> Guard {
        let mut guard = Guard::default();
        for host in allow_hosts {
            let host = normalize_host(host);
            if host.is_empty() {
                continue;
            }
            match host.parse::<IpAddr>() {
                Ok(ip) => guard.allow_ips.push(canonical(ip)),
                Err(_) => guard.allow_names.push(host),
            }
        }
        guard
    }

    /// Whether the host name is allowlisted.
    pub fn name_allowed(&self, name: &str) -> bool {
        let name = normalize_host(name);
        if let Ok(ip) = name.parse::<IpAddr>() {
            return self.ip_allowed(ip);
        }
        self.allow_names.contains(&name)
    }

    /// Whether the literal address is allowlisted.
    pub fn ip_allowed(&self, ip: IpAddr) -> bool {
        self.allow_ips.contains(&canonical(ip))
    }

    /// Checks a URL: its scheme, its host and every address the host
    /// resolves to. `Blocked` when refused; `Failed` when the host does not
    /// resolve.
    pub async fn check(&self, url: &url::Url) -> Result<(), FetchError> {
        match url.scheme() {
            "http" | "https" => {}
            other => {
                return Err(FetchError::Blocked(format!(
                    "refusing {url}: only http and https URLs can be fetched, not {other}"
                )));
            }
        }
        let port = url.port_or_known_default().unwrap_or(80);
        match url.host() {
            None => Err(FetchError::Blocked(format!(
                "refusing {url}: it has no host"
            ))),
            Some(url::Host::Ipv4(ip)) => self.check_literal(url, IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => self.check_literal(url, IpAddr::V6(ip)),
            Some(url::Host::Domain(name)) => {
                if self.name_allowed(name) {
                    return Ok(());
                }
                if let Some(reason) = name_reason(name) {
                    return Err(FetchError::Blocked(format!("refusing {url}: {reason}")));
                }
                let addrs = resolve(name, port)
                    .await
                    .map_err(|e| FetchError::Failed(format!("cannot fetch {url}: {e}")))?;
                for addr in addrs {
                    if let Some(reason) = ip_reason(addr.ip()) {
                        return Err(FetchError::Blocked(format!(
                            "refusing {url}: {name} resolves to {}, {reason}",
                            addr.ip()
                        )));
                    }
                }
                Ok(())
            }
        }
    }

    fn check_literal(&self, url: &url::Url, ip: IpAddr) -> Result<(), FetchError> {
        if self.ip_allowed(ip) {
            return Ok(());
        }
        match ip_reason(ip) {
            Some(reason) => Err(FetchError::Blocked(format!(
                "refusing {url}: {ip} is {reason}"
            ))),
            None => Ok(()),
        }
    }

    /// Resolves `name` and returns its addresses if every one is allowed
    /// (or the name is allowlisted). Used by [`GuardedResolver`].
    pub async fn resolve_checked(
        &self,
        name: &str,
        port: u16,
    ) -> Result<Vec<SocketAddr>, FetchError> {
        let allowed = self.name_allowed(name);
        if !allowed && let Some(reason) = name_reason(name) {
            return Err(FetchError::Blocked(format!("refusing {name}: {reason}")));
        }
        let addrs = resolve(name, port)
            .await
            .map_err(|e| FetchError::Failed(e.0))?;
        if !allowed {
            for addr in &addrs {
                if let Some(reason) = ip_reason(addr.ip()) {
                    return Err(FetchError::Blocked(format!(
                        "refusing {name}: it resolves to {}, {reason}",
                        addr.ip()
                    )));
                }
            }
        }
        Ok(addrs)
    }
}

async fn resolve(name: &str, port: u16) -> Result<Vec<SocketAddr>, WebError> {
    let host = normalize_host(name);
    let mut addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .collect();
    // IPv4 first, so that messages name the same address everywhere.
    addrs.sort();
    addrs.dedup();
    if addrs.is_empty() {
        return Err(WebError(format!("cannot resolve {host}: no addresses")));
    }
    Ok(addrs)
}

/// Why a host name is refused whatever it resolves to.
pub fn name_reason(name: &str) -> Option<String> {
    let name = normalize_host(name);
    if METADATA_NAMES.contains(&name.as_str()) {
        return Some(format!("{name} is a cloud metadata host"));
    }
    // The URL parser turns numeric hosts into addresses; a name that still
    // parses as one here came from elsewhere (a resolver call).
    if let Ok(ip) = name.parse::<IpAddr>() {
        return ip_reason(ip).map(|reason| format!("{ip} is {reason}"));
    }
    None
}

/// IPv4-mapped addresses as plain IPv4, so that allowlist entries match
/// either spelling.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => ip,
        },
        IpAddr::V4(_) => ip,
    }
}

/// Why an address is refused (`"a loopback address"`), or `None` when it
/// may be fetched.
pub fn ip_reason(ip: IpAddr) -> Option<String> {
    match ip {
        IpAddr::V4(v4) => ipv4_reason(v4).map(str::to_string),
        IpAddr::V6(v6) => ipv6_reason(v6),
    }
}

fn ipv4_reason(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, _, _] = ip.octets();
    if ip == Ipv4Addr::new(169, 254, 169, 254) {
        Some("the cloud metadata address")
    } else if a == 127 {
        Some("a loopback address")
    } else if a == 0 {
        Some("a \"this network\" address")
    } else if a == 10 || (a == 172 && (16..=31).contains(&b)) || (a == 192 && b == 168) {
        Some("a private address")
    } else if a == 169 && b == 254 {
        Some("a link-local address")
    } else if a == 100 && (64..=127).contains(&b) {
        Some("a shared (CGNAT) address")
    } else if ip.is_broadcast() {
        Some("the broadcast address")
    } else if ip.is_multicast() {
        Some("a multicast address")
    } else if a >= 240 {
        Some("a reserved address")
    } else {
        None
    }
}

fn ipv6_reason(ip: Ipv6Addr) -> Option<String> {
    let seg = ip.segments();
    if let Some(v4) = ip.to_ipv4_mapped() {
        return ipv4_reason(v4).map(|r| format!("an IPv4-mapped form of {v4}, {r}"));
    }
    if ip.is_loopback() {
        return Some("a loopback address".into());
    }
    if ip.is_unspecified() {
        return Some("the unspecified address".into());
    }
    if seg[..6] == [0, 0, 0, 0, 0, 0] {
        // IPv4-compatible (::a.b.c.d, deprecated).
        let v4 = embedded_v4(seg[6], seg[7]);
        return ipv4_reason(v4).map(|r| format!("an IPv4-compatible form of {v4}, {r}"));
    }
    if seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        let v4 = embedded_v4(seg[6], seg[7]);
        return ipv4_reason(v4).map(|r| format!("a NAT64 form of {v4}, {r}"));
    }
    if seg[0] == 0x2002 {
        let v4 = embedded_v4(seg[1], seg[2]);
        return ipv4_reason(v4).map(|r| format!("a 6to4 form of {v4}, {r}"));
    }
    if seg[0] & 0xfe00 == 0xfc00 {
        return Some("a unique local (private) address".into());
    }
    if seg[0] & 0xffc0 == 0xfe80 {
        return Some("a link-local address".into());
    }
    if seg[0] & 0xffc0 == 0xfec0 {
        return Some("a site-local address".into());
    }
    if ip.is_multicast() {
        return Some("a multicast address".into());
    }
    None
}

fn embedded_v4(hi: u16, lo: u16) -> Ipv4Addr {
    let [a, b] = hi.to_be_bytes();
    let [c, d] = lo.to_be_bytes();
    Ipv4Addr::new(a, b, c, d)
}

/// A DNS resolver for reqwest that refuses names resolving to addresses the
/// guard refuses, so that the connection goes to a checked address.
#[derive(Debug, Clone)]
pub struct GuardedResolver {
    guard: Arc<Guard>,
}

impl GuardedResolver {
    /// A resolver applying `guard`.
    pub fn new(guard: Arc<Guard>) -> GuardedResolver {
        GuardedResolver { guard }
    }
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let guard = self.guard.clone();
        let name = name.as_str().to_string();
        Box::pin(async move {
            let addrs = guard
                .resolve_checked(&name, 0)
                .await
                .map_err(|e| -> Box<dyn std::error::Error + Send + Sync> { Box::new(e) })?;
            let addrs: reqwest::dns::Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn boundaries() {
        let refused = |s: &str| ip_reason(s.parse().unwrap());
        assert_eq!(refused("172.15.255.255"), None);
        assert_eq!(refused("172.32.0.1"), None);
        assert_eq!(refused("100.63.255.255"), None);
        assert_eq!(refused("100.128.0.0"), None);
        assert_eq!(refused("169.253.255.255"), None);
        assert_eq!(refused("8.8.8.8"), None);
        assert_eq!(refused("2606:4700::1111"), None);
        assert_eq!(refused("::ffff:8.8.8.8"), None);
        assert_eq!(refused("172.16.0.0"), Some("a private address".into()));
        assert_eq!(refused("172.31.255.255"), Some("a private address".into()));
        assert_eq!(
            refused("100.127.255.255"),
            Some("a shared (CGNAT) address".into())
        );
        assert_eq!(
            refused("fbff::1"),
            None,
            "just below fc00::/7 is not unique local"
        );
        assert_eq!(
            refused("febf::1"),
            Some("a link-local address".into()),
            "fe80::/10 ends at febf"
        );
    }

    #[test]
    fn allowlist_matches_either_ipv4_spelling() {
        let guard = Guard::new(&["::ffff:127.0.0.1".to_string(), "Example.Test.".into()]);
        assert!(guard.ip_allowed("127.0.0.1".parse().unwrap()));
        assert!(guard.name_allowed("example.test"));
        assert!(!guard.name_allowed("localhost"));
    }
}
