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
//! `trigger=forced` (see [`Reader::restrict`]).
//!
//! # The read policy
//!
//! [`ReadAccess::decide`] is the one function that decides what a caller
//! may see: nothing (no read token shown where one is needed), or a
//! [`Reader`]. The route guard (`routes.rs`) calls it for every route the
//! table marks as a read (the API, the pages, the SVGs, the pprof download)
//! and hands the [`Reader`] to the handler as a request extension; a
//! handler without it cannot run (axum answers 500), so a read route left
//! out of the guard fails closed. Every store read a handler makes goes
//! through [`Reader::restrict`], which turns its selection into one that
//! keeps only what this caller may see.

use std::sync::Arc;

use http::HeaderMap;
use http::header::{AUTHORIZATION, COOKIE};

use crate::records::selection::{Selection, TriggerFilter};

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

    /// The read policy: what a request with these headers may see, or
    /// `None` when it needs the read token and did not show it.
    pub(crate) fn decide(&self, headers: &HeaderMap) -> Option<Reader> {
        if self.is_open() {
            return Some(Reader { forced: false });
        }
        self.allows(headers).then_some(Reader { forced: true })
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

/// What one caller may see ([`ReadAccess::decide`]): every record (it
/// showed the read token), or sampled records only (the collector has no
/// read token, so nobody has shown one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reader {
    forced: bool,
}

/// A caller without the read token asked for forced records outright.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Withheld;

impl Withheld {
    /// What the caller is told.
    pub(crate) const MESSAGE: &'static str = "forced records are only served with the read token, \
        and this collector has none: start `cpt serve` with --read-token-file FILE and read with that token";
}

impl Reader {
    /// Whether forced records are served to this caller.
    pub(crate) fn sees_forced(self) -> bool {
        self.forced
    }

    /// `sel` narrowed to what this caller may see: unchanged for a caller
    /// with the read token; sampled records only otherwise (`trigger=all`
    /// and a request or trace id become sampled-only, so a forced record's
    /// id matches nothing).
    ///
    /// # Errors
    ///
    /// [`Withheld`] for `trigger=forced` without the read token.
    pub(crate) fn restrict(self, sel: Selection) -> Result<Selection, Withheld> {
        if self.forced {
            return Ok(sel);
        }
        match sel.triggers() {
            TriggerFilter::Sampled | TriggerFilter::All => {
                Ok(sel.with_triggers(TriggerFilter::Sampled))
            }
            TriggerFilter::Forced => Err(Withheld),
        }
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
    fn the_policy_narrows_every_selection_of_a_reader_without_the_token() {
        let open = ReadAccess::new(None::<&str>)
            .decide(&HeaderMap::new())
            .unwrap();
        let token = ReadAccess::new(Some("t"));
        assert_eq!(token.decide(&HeaderMap::new()), None);
        let full = token
            .decide(&headers(&[("authorization", "Bearer t")]))
            .unwrap();
        assert!(!open.sees_forced() && full.sees_forced());
        // (case, query, what the open reader gets: Some(trigger) or refused)
        #[rustfmt::skip]
        let cases: &[(&str, &str, Option<TriggerFilter>)] = &[
            ("default",        "service=A",              Some(TriggerFilter::Sampled)),
            ("all",            "trigger=all",            Some(TriggerFilter::Sampled)),
            ("forced",         "trigger=forced",         None),
            ("request id",     "request_id=forced-1",    Some(TriggerFilter::Sampled)),
            ("trace id",       "trace_id=4bf92f3577b34da6a3ce929d0e0e4736", Some(TriggerFilter::Sampled)),
            ("id and all",     "request_id=x&trigger=all", Some(TriggerFilter::Sampled)),
        ];
        for (case, q, want) in cases {
            let sel = Selection::from_query(q).unwrap();
            assert_eq!(
                open.restrict(sel.clone()).ok().map(|s| s.triggers()),
                *want,
                "{case}"
            );
            assert_eq!(full.restrict(sel.clone()), Ok(sel), "{case}");
        }
    }

    #[test]
    fn open_access_allows_anyone_but_withholds_forced_records() {
        let open = ReadAccess::new(None::<&str>);
        assert!(open.is_open());
        assert!(!open.decide(&HeaderMap::new()).unwrap().sees_forced());
        assert!(open.allows(&HeaderMap::new()));
        // An empty token file is no token at all.
        assert!(ReadAccess::new(Some("  ")).is_open());
    }

    #[test]
    fn read_token_is_accepted_as_bearer_or_cookie_and_nothing_else() {
        let read = ReadAccess::new(Some("r34d\n"));
        assert!(!read.is_open());
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
