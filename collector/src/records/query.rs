//! URL query strings: the one encoder and the one decoder every query the
//! collector and the command line build or read goes through (`GET
//! /profile`, `GET /v1/records`, the web pages' links and forms, `cpt show
//! --collector`).
//!
//! Encoding is `application/x-www-form-urlencoded` (WHATWG URL §5.2) by
//! [`form_urlencoded`]: a space becomes `+`, and every byte that could
//! change how the query splits (`&`, `=`, `+`, `%`, `#`, `?`) or that is not
//! ASCII is percent-encoded, so a name holding any of them comes back
//! unchanged. Decoding is the same format, but strict: bad
//! percent-encoding or bytes that are not UTF-8 are an error naming the
//! pair, where a browser would substitute and carry on, because a
//! selection read wrong would answer for other records than asked for.

use std::fmt;

/// `pairs` as a query string (no leading `?`).
pub fn encode<K, V>(pairs: impl IntoIterator<Item = (K, V)>) -> String
where
    K: AsRef<str>,
    V: AsRef<str>,
{
    let mut out = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        out.append_pair(k.as_ref(), v.as_ref());
    }
    out.finish()
}

/// One value encoded for a query (what [`encode`] writes for it).
pub fn encode_value(value: &str) -> String {
    form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

/// A query string that does not decode: the message names the pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueryError {
    msg: String,
}

impl fmt::Display for QueryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for QueryError {}

/// The `key=value` pairs of `query` (a leading `?` is ignored, empty pairs
/// skipped, a pair without `=` has an empty value), decoded.
///
/// # Errors
///
/// A `%` not followed by two hex digits, or a pair that decodes to bytes
/// that are not UTF-8.
pub fn decode(query: &str) -> Result<Vec<(String, String)>, QueryError> {
    query
        .trim_start_matches('?')
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            Ok((decode_component(k)?, decode_component(v)?))
        })
        .collect()
}

/// Parameters in `query` (what [`decode`] would return, without decoding).
pub fn count(query: &str) -> usize {
    query
        .trim_start_matches('?')
        .split('&')
        .filter(|p| !p.is_empty())
        .count()
}

/// One component: `+` is a space, `%XX` a byte.
pub(crate) fn decode_component(s: &str) -> Result<String, QueryError> {
    let b = s.as_bytes();
    for (i, _) in b.iter().enumerate().filter(|(_, c)| **c == b'%') {
        let hex = b.get(i + 1..i + 3);
        if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
            return Err(QueryError {
                msg: format!("{s:?}: bad percent-encoding at byte {i} (expected %XX)"),
            });
        }
    }
    // `+` is a space; a literal `+` arrives as `%2B`, so replacing first is safe.
    percent_encoding::percent_decode_str(&s.replace('+', " "))
        .decode_utf8()
        .map(std::borrow::Cow::into_owned)
        .map_err(|_| QueryError {
            msg: format!("{s:?}: percent-decodes to bytes that are not UTF-8"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names that break a query built by hand: each comes back unchanged.
    #[rustfmt::skip]
    const HOSTILE: &[(&str, &str)] = &[
        ("space",      "GET /quote/{item}"),
        ("braces",     "{item}"),
        ("ampersand",  "a&b=c"),
        ("percent",    "100%25 %zz"),
        ("plus",       "a+b"),
        ("hash",       "#frag"),
        ("question",   "?x=1"),
        ("non-ascii",  "Zürich 東京 🚀"),
        ("equals",     "k=v=w"),
        ("slash",      "/a/b\\c"),
        ("quote",      "'\"<>"),
    ];

    #[test]
    fn every_hostile_name_round_trips_through_encode_and_decode() {
        for (case, name) in HOSTILE {
            let q = encode([("endpoint", *name), ("label", &format!("k={name}"))]);
            assert!(!q.contains(' ') && !q.contains('#'), "{case}: {q}");
            assert_eq!(q.matches('&').count(), 1, "{case}: {q}");
            let back = decode(&q).unwrap();
            assert_eq!(back[0], ("endpoint".into(), (*name).into()), "{case}");
            assert_eq!(back[1], ("label".into(), format!("k={name}")), "{case}");
            assert_eq!(
                decode_component(&encode_value(name)).unwrap(),
                *name,
                "{case}"
            );
        }
    }

    #[test]
    fn decoding_is_strict_about_bad_escapes_and_utf8() {
        assert_eq!(
            decode("a=b+c&d=%41").unwrap(),
            [("a".into(), "b c".into()), ("d".into(), "A".into())]
        );
        assert_eq!(
            decode("?flag&&x=").unwrap(),
            [("flag".into(), String::new()), ("x".into(), String::new())]
        );
        assert!(
            decode("a=%zz")
                .unwrap_err()
                .to_string()
                .contains("bad percent-encoding")
        );
        assert!(decode("a=%4").is_err());
        assert!(
            decode("a=%ff")
                .unwrap_err()
                .to_string()
                .contains("not UTF-8")
        );
        assert_eq!(count("?a=1&&b=2&c"), 3);
    }
}
