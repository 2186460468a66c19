//! Which names the HTTP port answers to, and the origin a request was sent
//! to: the first check of the route guard (`routes.rs`).
//!
//! A web page on another site can make a browser send requests to the
//! collector by resolving its own name to the collector's address (DNS
//! rebinding): the browser then treats the collector as that site's
//! origin, reads its pages and posts records to it. Such a request names
//! the attacker's host in `Host` (HTTP/1) or `:authority` (HTTP/2), so the
//! guard answers only requests whose authority names
//!
//! - an IP address literal (`127.0.0.1:7071`, `[::1]:7071`): no page can
//!   rebind an address;
//! - `localhost`;
//! - a name given with `cpt serve --allowed-host NAME`.
//!
//! Any other is refused with 421 (Misdirected Request) before any route.
//! The port is not compared: a rebinding page can name any port.
//!
//! Behind a reverse proxy that rewrites `Host`, the name the browser used
//! travels in `Forwarded: host=…;proto=…` (RFC 7239) or
//! `X-Forwarded-Host` / `X-Forwarded-Proto`. Those count only on requests
//! from a peer given with `--trusted-proxy ADDR` (and the last value, the
//! one that proxy added, is taken); from any other peer they are ignored,
//! since anyone can send them.
//!
//! The [`Origin`] found here is also what a sign-in form's `Origin` header
//! must equal (`routes::same_origin`): the scheme (`https` with TLS, or
//! the forwarded protocol) and the allowed authority.

use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

use http::{HeaderMap, Uri, header};

/// What the HTTP port answers to (see the module docs).
#[derive(Clone, Debug, Default)]
pub(crate) struct Authorities {
    /// `--allowed-host` names, lowercase, without a trailing dot.
    names: Arc<[String]>,
    /// `--trusted-proxy` addresses.
    proxies: Arc<[IpAddr]>,
    /// The port serves TLS.
    tls: bool,
}

/// Where a request was sent: its scheme and authority, lowercase, without
/// the scheme's default port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Origin {
    scheme: String,
    authority: String,
}

impl Origin {
    /// The origin `scheme://authority`.
    pub(crate) fn new(scheme: &str, authority: &str) -> Origin {
        let scheme = scheme.to_ascii_lowercase();
        let authority = authority.to_ascii_lowercase();
        let default_port = if scheme == "https" { ":443" } else { ":80" };
        let authority = authority
            .strip_suffix(default_port)
            .map_or(authority.clone(), str::to_owned);
        Origin { scheme, authority }
    }

    /// Whether the scheme is `https`.
    pub(crate) fn is_https(&self) -> bool {
        self.scheme == "https"
    }

    /// Whether an `Origin` header's value names this origin.
    pub(crate) fn is(&self, origin: &[u8]) -> bool {
        let Ok(origin) = std::str::from_utf8(origin) else {
            return false;
        };
        let Some((scheme, authority)) = origin.split_once("://") else {
            return false;
        };
        Origin::new(scheme, authority) == *self
    }
}

/// A request for a name the port does not answer to: the 421's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Misdirected(pub(crate) String);

/// The check of an `--allowed-host` value, naming what is wrong.
///
/// # Errors
///
/// A value that is not a host name (a port, a scheme, a path, spaces).
pub fn check_allowed_host(name: &str) -> Result<String, String> {
    let n = name.trim().trim_end_matches('.').to_ascii_lowercase();
    let ok = !n.is_empty()
        && n.len() <= 253
        && n.split('.')
            .all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
    if ok {
        Ok(n)
    } else {
        Err(format!(
            "{name:?} is not a host name: give the name browsers and senders use, without \
             scheme or port (e.g. --allowed-host cpt.example.com); IP addresses and localhost \
             are always allowed"
        ))
    }
}

impl Authorities {
    /// The port answers to `names` (checked with [`check_allowed_host`])
    /// and takes forwarded headers from `proxies`.
    pub(crate) fn new(names: &[String], proxies: &[IpAddr], tls: bool) -> Authorities {
        Authorities {
            names: names
                .iter()
                .filter_map(|n| check_allowed_host(n).ok())
                .collect(),
            proxies: proxies.iter().copied().map(canonical).collect(),
            tls,
        }
    }

    /// The origin a request was sent to, if the port answers to its
    /// authority (see the module docs).
    pub(crate) fn origin(
        &self,
        uri: &Uri,
        headers: &HeaderMap,
        peer: Option<IpAddr>,
    ) -> Result<Origin, Misdirected> {
        let own_scheme = if self.tls { "https" } else { "http" };
        let forwarded = peer
            .map(canonical)
            .filter(|p| self.proxies.contains(p))
            .and_then(|_| forwarded(headers));
        let (scheme, authority, via) = match forwarded {
            Some(Forwarded {
                host: Some(host),
                proto,
            }) => (
                proto.unwrap_or_else(|| own_scheme.to_owned()),
                host,
                "the forwarded host",
            ),
            found => {
                let proto = found.and_then(|f| f.proto);
                // HTTP/2's `:authority` (and an HTTP/1 absolute-form
                // target) is the URI's authority; else `Host`.
                let authority = match uri.authority() {
                    Some(a) => a.as_str().to_owned(),
                    None => match headers.get(header::HOST).map(|h| h.to_str()) {
                        Some(Ok(h)) => h.trim().to_owned(),
                        Some(Err(_)) => {
                            return Err(Misdirected(
                                "the Host header is not a host name".to_owned(),
                            ));
                        }
                        None => {
                            return Err(Misdirected(
                                "the request names no host (no Host header, no :authority): \
                                 send the host the collector was reached at"
                                    .to_owned(),
                            ));
                        }
                    },
                };
                (
                    proto.unwrap_or_else(|| own_scheme.to_owned()),
                    authority,
                    "Host",
                )
            }
        };
        if self.allows(&authority) {
            Ok(Origin::new(&scheme, &authority))
        } else {
            let shown: String = authority.chars().take(100).collect();
            Err(Misdirected(format!(
                "this collector does not answer to {via} {shown:?}: reach it by IP address or \
                 localhost, or start `cpt serve` with --allowed-host NAME for the name you use \
                 (a page of another site that resolved its own name to the collector is refused \
                 this way)"
            )))
        }
    }

    /// Whether `authority` (`host[:port]`) names an IP address,
    /// `localhost` or an allowed name.
    fn allows(&self, authority: &str) -> bool {
        if let Some(rest) = authority.strip_prefix('[') {
            // An IPv6 literal: `[::1]` or `[::1]:7071`.
            return rest.split_once(']').is_some_and(|(inside, after)| {
                inside.parse::<Ipv6Addr>().is_ok() && valid_port(after)
            });
        }
        let host = match authority.rsplit_once(':') {
            Some((host, port)) if valid_port(&format!(":{port}")) => host,
            Some(_) => return false,
            None => authority,
        };
        if host.parse::<std::net::Ipv4Addr>().is_ok() {
            return true;
        }
        let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
        host == "localhost" || self.names.contains(&host)
    }
}

/// `after` is empty or `:PORT`.
fn valid_port(after: &str) -> bool {
    after.is_empty()
        || after
            .strip_prefix(':')
            .is_some_and(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()))
}

/// An IPv4-mapped IPv6 address as its IPv4 address (a dual-stack listener
/// sees IPv4 peers so).
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// What a trusted proxy forwarded.
#[derive(Debug, Default, PartialEq, Eq)]
struct Forwarded {
    host: Option<String>,
    proto: Option<String>,
}

/// The host and protocol the last proxy forwarded: `Forwarded`'s last
/// element, else the last `X-Forwarded-Host` / `X-Forwarded-Proto` values.
fn forwarded(headers: &HeaderMap) -> Option<Forwarded> {
    let last_of = |name: &str| -> Option<String> {
        let v = headers.get_all(name).iter().next_back()?.to_str().ok()?;
        let v = v.rsplit(',').next()?.trim();
        (!v.is_empty()).then(|| v.to_owned())
    };
    let f = match headers
        .get_all(header::FORWARDED)
        .iter()
        .next_back()
        .and_then(|v| v.to_str().ok())
    {
        Some(v) => {
            let element = split_unquoted(v, ',').pop().unwrap_or_default();
            let mut f = Forwarded::default();
            for pair in split_unquoted(&element, ';') {
                let Some((k, v)) = pair.split_once('=') else {
                    continue;
                };
                let v = v.trim();
                let v = v
                    .strip_prefix('"')
                    .and_then(|v| v.strip_suffix('"'))
                    .unwrap_or(v)
                    .to_owned();
                match k.trim().to_ascii_lowercase().as_str() {
                    "host" => f.host = Some(v),
                    "proto" => f.proto = Some(v),
                    _ => {}
                }
            }
            f
        }
        None => Forwarded {
            host: last_of("x-forwarded-host"),
            proto: last_of("x-forwarded-proto"),
        },
    };
    let proto_ok = f
        .proto
        .as_deref()
        .is_none_or(|p| p.eq_ignore_ascii_case("http") || p.eq_ignore_ascii_case("https"));
    let f = Forwarded {
        host: f.host,
        proto: if proto_ok {
            f.proto.map(|p| p.to_ascii_lowercase())
        } else {
            None
        },
    };
    (f != Forwarded::default()).then_some(f)
}

/// `s` split at `sep` outside double quotes.
fn split_unquoted(s: &str, sep: char) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut quoted = false;
    for c in s.chars() {
        match c {
            '"' => quoted = !quoted,
            c if c == sep && !quoted => {
                parts.push(String::new());
                continue;
            }
            _ => {}
        }
        parts.last_mut().expect("one part at least").push(c);
    }
    parts.into_iter().map(|p| p.trim().to_owned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn h(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    }

    const PROXY: &str = "10.0.0.9";

    type Headers<'a> = &'a [(&'a str, &'a str)];

    fn ports() -> Authorities {
        Authorities::new(
            &["cpt.example.com".to_owned()],
            &[PROXY.parse().unwrap()],
            false,
        )
    }

    /// The origin of a request, or `None` when refused.
    fn origin(uri: &str, headers: &[(&str, &str)], peer: &str) -> Option<Origin> {
        ports()
            .origin(
                &uri.parse().unwrap(),
                &h(headers),
                Some(peer.parse().unwrap()),
            )
            .ok()
    }

    #[rustfmt::skip]
    #[test]
    fn only_addresses_localhost_and_allowed_names_are_answered() {
        let peer = "192.0.2.1";
        // (case, request target, headers, the origin it names, or refused)
        let cases: &[(&str, &str, Headers<'_>, Option<&str>)] = &[
            ("ipv4",             "/",  &[("host", "127.0.0.1:7071")],           Some("http://127.0.0.1:7071")),
            ("ipv6",             "/",  &[("host", "[::1]:7071")],               Some("http://[::1]:7071")),
            ("ipv4 no port",     "/",  &[("host", "10.1.2.3")],                 Some("http://10.1.2.3")),
            ("localhost",        "/",  &[("host", "LocalHost:7071")],           Some("http://localhost:7071")),
            ("allowed name",     "/",  &[("host", "cpt.example.com.:8080")],    Some("http://cpt.example.com.:8080")),
            ("default port",     "/",  &[("host", "cpt.example.com:80")],       Some("http://cpt.example.com")),
            ("rebinding",        "/",  &[("host", "rebind.attacker.example:7071")], None),
            ("suffix of a name", "/",  &[("host", "evil-cpt.example.com")],     None),
            ("localhost subdomain", "/", &[("host", "a.localhost")],            None),
            ("bad port",         "/",  &[("host", "127.0.0.1:x")],              None),
            ("bad ipv6",         "/",  &[("host", "[::g]")],                    None),
            ("no host",          "/",  &[],                                     None),
            ("http/2 authority", "http://127.0.0.1:7071/", &[],                 Some("http://127.0.0.1:7071")),
            ("authority wins",   "http://rebind.attacker.example/", &[("host", "127.0.0.1")], None),
            ("forwarded, untrusted peer", "/", &[("host", "127.0.0.1"), ("forwarded", "host=cpt.example.com;proto=https")], Some("http://127.0.0.1")),
        ];
        for (case, uri, headers, want) in cases {
            let want = want.map(|w| {
                let (s, a) = w.split_once("://").unwrap();
                Origin::new(s, a)
            });
            assert_eq!(origin(uri, headers, peer), want, "{case}");
        }
    }

    #[rustfmt::skip]
    #[test]
    fn a_trusted_proxy_forwards_the_host_and_protocol() {
        let inner = ("host", "127.0.0.1:7071");
        // (case, headers from the proxy, the origin, or refused)
        let cases: &[(&str, Headers<'_>, Option<&str>)] = &[
            ("forwarded",          &[inner, ("forwarded", "for=1.2.3.4;host=cpt.example.com;proto=https")], Some("https://cpt.example.com")),
            ("quoted, last wins",  &[inner, ("forwarded", "host=evil.example, for=\"[::1]\";host=\"cpt.example.com:8443\";proto=https")], Some("https://cpt.example.com:8443")),
            ("x-forwarded",        &[inner, ("x-forwarded-host", "evil.example, cpt.example.com"), ("x-forwarded-proto", "https")], Some("https://cpt.example.com")),
            ("forwarded rebinding", &[inner, ("x-forwarded-host", "rebind.attacker.example")], None),
            ("proto only",         &[inner, ("x-forwarded-proto", "https")], Some("https://127.0.0.1:7071")),
            ("odd proto ignored",  &[inner, ("x-forwarded-proto", "javascript")], Some("http://127.0.0.1:7071")),
            ("nothing forwarded",  &[inner], Some("http://127.0.0.1:7071")),
        ];
        for (case, headers, want) in cases {
            let want = want.map(|w| {
                let (s, a) = w.split_once("://").unwrap();
                Origin::new(s, a)
            });
            assert_eq!(origin("/", headers, PROXY), want, "{case}");
            // The same headers from the proxy's address mapped into IPv6.
            assert_eq!(origin("/", headers, "::ffff:10.0.0.9"), want, "{case} (mapped)");
        }
    }

    #[test]
    fn an_origin_matches_in_any_case_and_without_its_default_port() {
        let o = Origin::new("https", "CPT.example.com:443");
        assert!(o.is(b"https://cpt.example.com"));
        assert!(o.is(b"https://cpt.example.com:443"));
        assert!(!o.is(b"http://cpt.example.com"));
        assert!(!o.is(b"https://cpt.example.com:4430"));
        assert!(!o.is(b"null"));
    }

    #[test]
    fn an_allowed_host_is_a_bare_name() {
        assert_eq!(
            check_allowed_host("CPT.Example.com.").as_deref(),
            Ok("cpt.example.com")
        );
        for bad in [
            "",
            "cpt.example.com:7071",
            "http://cpt",
            "a b",
            "a..b",
            "*.example.com",
        ] {
            let e = check_allowed_host(bad).unwrap_err();
            assert!(e.contains("--allowed-host"), "{bad}: {e}");
        }
    }
}
