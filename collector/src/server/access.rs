//! Who may read: the read token of `cpt serve --read-token-file`, and the
//! bearer-credential parsing the ingest token shares.
//!
//! Reading (`GET /v1/records`, `GET /profile`, `GET /v1/stats`) and sending
//! (`POST /v1/records`, gRPC `Export`) are separate roles with separate
//! tokens: the ingest token never reads, the read token never sends.
//! `GET /healthz` is open.
//!
//! A reader presents the read token as `Authorization: Bearer <token>` (the
//! scheme is matched case-insensitively, RFC 9110 §11.1) or, for a browser,
//! as the cookie [`READ_COOKIE`]. Tokens are compared in constant time.
//!
//! Without a read token reads are open, except for forced records: they were
//! forced on a specific request (often a specific customer's), so their
//! labels and ids are never served to a caller without the read token. An
//! open collector leaves them out of every answer, and refuses a query for
//! `trigger=forced` (see [`ReadAccess::withholds_forced`]).

use std::sync::Arc;

use http::HeaderMap;
use http::header::{AUTHORIZATION, COOKIE};

/// The cookie a browser presents the read token in.
pub(crate) const READ_COOKIE: &str = "cpt_read_token";

/// The read token, if any (see the module docs).
#[derive(Clone, Debug, Default)]
pub(crate) struct ReadAccess {
    token: Option<Arc<str>>,
}

impl ReadAccess {
    /// Reads need `token` (surrounding whitespace trimmed); `None`: reads
    /// are open (forced records withheld).
    pub(crate) fn new(token: Option<impl AsRef<str>>) -> ReadAccess {
        ReadAccess {
            token: token
                .map(|t| Arc::from(t.as_ref().trim()))
                .filter(|t: &Arc<str>| !t.is_empty()),
        }
    }

    /// No read token: anyone who can reach the port reads (sampled records
    /// only).
    pub(crate) fn is_open(&self) -> bool {
        self.token.is_none()
    }

    /// Whether forced records are left out of this caller's answers: the
    /// collector has no read token, so nobody has shown one.
    pub(crate) fn withholds_forced(&self) -> bool {
        self.is_open()
    }

    /// Whether a request with these headers may read: reads are open, or it
    /// carries the read token as a bearer credential or the
    /// [`READ_COOKIE`] cookie.
    pub(crate) fn allows(&self, headers: &HeaderMap) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let mut ok = false;
        for v in headers.get_all(AUTHORIZATION) {
            if let Some(presented) = bearer(v.as_bytes()) {
                ok |= constant_time_eq(presented, token.as_bytes());
            }
        }
        for v in headers.get_all(COOKIE) {
            for pair in v.as_bytes().split(|&b| b == b';') {
                let pair = pair.trim_ascii();
                if let Some(value) = pair
                    .strip_prefix(READ_COOKIE.as_bytes())
                    .and_then(|rest| rest.strip_prefix(b"="))
                {
                    let value = value.trim_ascii();
                    let value = value
                        .strip_prefix(b"\"")
                        .and_then(|v| v.strip_suffix(b"\""))
                        .unwrap_or(value);
                    ok |= constant_time_eq(value, token.as_bytes());
                }
            }
        }
        ok
    }
}

/// The credential of an `Authorization: Bearer <credential>` value; the
/// scheme is case-insensitive (RFC 9110 §11.1), surrounding blanks trimmed.
pub(crate) fn bearer(value: &[u8]) -> Option<&[u8]> {
    let value = value.trim_ascii_start();
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer")
        || !rest.first().is_some_and(|b| *b == b' ' || *b == b'\t')
    {
        return None;
    }
    Some(rest.trim_ascii())
}

/// Whether `a == b`, looking at every byte of `b` whatever `a` is.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for (i, &y) in b.iter().enumerate() {
        let x = a.get(i).copied().unwrap_or(!y);
        diff |= x ^ y;
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn token_comparison_needs_every_byte() {
        assert!(constant_time_eq(b"s3cret", b"s3cret"));
        assert!(!constant_time_eq(b"s3cre", b"s3cret"));
        assert!(!constant_time_eq(b"s3cret!", b"s3cret"));
        assert!(!constant_time_eq(b"s3creT", b"s3cret"));
        assert!(!constant_time_eq(b"", b"s3cret"));
    }

    #[test]
    fn bearer_scheme_is_case_insensitive_rfc9110() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"BEARER  abc "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bearerabc"), None);
        assert_eq!(bearer(b"Bear"), None);
    }

    #[test]
    fn open_access_allows_anyone_but_withholds_forced_records() {
        let open = ReadAccess::new(None::<&str>);
        assert!(open.is_open());
        assert!(open.withholds_forced());
        assert!(open.allows(&HeaderMap::new()));
        // An empty token file is no token at all.
        assert!(ReadAccess::new(Some("  ")).is_open());
    }

    #[test]
    fn read_token_is_accepted_as_bearer_or_cookie_and_nothing_else() {
        let read = ReadAccess::new(Some("r34d\n"));
        assert!(!read.is_open());
        assert!(!read.withholds_forced());
        // (case, request headers, allowed)
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], bool);
        let cases: &[Case<'_>] = &[
            ("none", &[], false),
            ("bearer", &[("authorization", "Bearer r34d")], true),
            (
                "lowercase scheme",
                &[("authorization", "bearer r34d")],
                true,
            ),
            ("wrong", &[("authorization", "Bearer r34x")], false),
            ("prefix", &[("authorization", "Bearer r34")], false),
            ("longer", &[("authorization", "Bearer r34dd")], false),
            ("no scheme", &[("authorization", "r34d")], false),
            ("basic", &[("authorization", "Basic r34d")], false),
            (
                "cookie",
                &[("cookie", "a=1; cpt_read_token=r34d; b=2")],
                true,
            ),
            (
                "quoted cookie",
                &[("cookie", "cpt_read_token=\"r34d\"")],
                true,
            ),
            ("wrong cookie", &[("cookie", "cpt_read_token=nope")], false),
            (
                "other cookie name",
                &[("cookie", "xcpt_read_token=r34d")],
                false,
            ),
            (
                "second authorization",
                &[
                    ("authorization", "Bearer x"),
                    ("authorization", "Bearer r34d"),
                ],
                true,
            ),
        ];
        for (name, h, want) in cases {
            assert_eq!(read.allows(&headers(h)), *want, "case {name}");
        }
    }
}
