//! Force credentials: what an operator sends in `x-cpt-force` to have one
//! request traced, defined once for the services that check it (the
//! middleware's `ForceAuth`) and the tools that mint it (`cpt force`).
//!
//! # Format (version 1)
//!
//! ```text
//! cpt1.<expires>.<nonce>.<service>.<mac>
//! ```
//!
//! - `expires`: Unix seconds after which the credential is refused;
//! - `nonce`: 32 hex digits, random, so two credentials never share a MAC
//!   (a service remembers the MACs it accepted to refuse replays);
//! - `service`: the service it forces (`ServerLayer`'s service name), or
//!   [`ANY_SERVICE`] (`*`) for any;
//! - `mac`: lowercase hex HMAC-SHA256, under the services' force key, of
//!   `cpt-force-v1`, the expiry, nonce, service and the request's
//!   `x-request-id`, each followed by a NUL byte.
//!
//! Every field is inside the MAC: a credential cannot be moved to another
//! request id or service, nor made to live longer. The version prefix lets
//! a service tell an old credential (a bare 64-digit MAC or a fixed token)
//! from a forged one and say how to mint a new one.
//!
//! ```
//! use cpt_sdk::force::{self, Minted};
//! let now = 1_800_000_000;
//! let cred = force::mint(b"ops-key", "req-42", "checkout", 300, now);
//! let parsed = force::parse(&cred).unwrap();
//! assert_eq!(parsed.service(), "checkout");
//! assert_eq!(parsed.expires_unix_secs(), now + 300);
//! assert!(parsed.mac_matches(b"ops-key", "req-42"));
//! assert!(!parsed.mac_matches(b"ops-key", "req-43"));
//! # let _: Option<Minted> = None;
//! ```

use std::hash::{BuildHasher as _, RandomState};
use std::time::{SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The version prefix of every credential this crate mints.
pub const VERSION_PREFIX: &str = "cpt1";
/// The `service` of a credential valid for every service.
pub const ANY_SERVICE: &str = "*";
/// Default lifetime of a credential (`cpt force --ttl`): five minutes.
pub const DEFAULT_TTL_SECS: u64 = 300;
/// Longest lifetime a service accepts: a credential expiring later than this
/// from now is refused (it would also outlive what a replay cache holds).
pub const MAX_TTL_SECS: u64 = 3600;
/// The label a forced record carries with its credential's nonce, so that
/// two records forced by one credential can be told (see
/// [`REPLAYED_LABEL`]).
pub const NONCE_LABEL: &str = "cpt.force.nonce";
/// The label the collector adds to a forced record whose credential's nonce
/// an earlier record of another request already carried: the credential
/// was replayed (to another replica, or to a service that forgot it).
pub const REPLAYED_LABEL: &str = "cpt.force.replayed";
/// Domain separation of the MAC input.
const MAC_DOMAIN: &[u8] = b"cpt-force-v1";

/// What `cpt force` prints: the request id and its credential.
#[derive(Clone, PartialEq, Eq)]
pub struct Minted {
    /// The `x-request-id` to send.
    pub request_id: String,
    /// The `x-cpt-force` value.
    pub credential: String,
}

impl std::fmt::Debug for Minted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Minted")
            .field("request_id", &self.request_id)
            .finish_non_exhaustive()
    }
}

fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    out
}

fn mac(key: &[u8], expires: u64, nonce: &str, service: &str, request_id: &str) -> HmacSha256 {
    let mut mac =
        HmacSha256::new_from_slice(key).expect("HMAC accepts keys of any length; this is a bug");
    for part in [
        MAC_DOMAIN,
        expires.to_string().as_bytes(),
        nonce.as_bytes(),
        service.as_bytes(),
        request_id.as_bytes(),
    ] {
        mac.update(part);
        mac.update(&[0]);
    }
    mac
}

/// Whether `service` can be named in a credential: [`ANY_SERVICE`], or
/// visible ASCII without spaces (the credential is a header value).
pub fn valid_service(service: &str) -> bool {
    !service.is_empty() && service.bytes().all(|b| b.is_ascii_graphic())
}

/// The credential forcing request `request_id` on `service` (or
/// [`ANY_SERVICE`]) until `now_unix_secs + ttl_secs`, with a fresh nonce.
///
/// # Panics
///
/// If `service` is not [`valid_service`].
pub fn mint(
    key: impl AsRef<[u8]>,
    request_id: &str,
    service: &str,
    ttl_secs: u64,
    now_unix_secs: u64,
) -> String {
    assert!(
        valid_service(service),
        "force::mint: service {service:?} must be visible ASCII without spaces, or `*`"
    );
    let expires = now_unix_secs.saturating_add(ttl_secs);
    let nonce = new_request_id();
    let tag = mac(key.as_ref(), expires, &nonce, service, request_id)
        .finalize()
        .into_bytes();
    format!("{VERSION_PREFIX}.{expires}.{nonce}.{service}.{}", hex(&tag))
}

/// Why a value is not a version-1 credential.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FormatError {
    /// A bare 64-digit MAC or a fixed token: the format before version 1.
    OldFormat,
    /// `cpt1.` but the fields are wrong, or an unknown version.
    Malformed,
}

impl std::fmt::Display for FormatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FormatError::OldFormat => {
                "a force credential in the old format (no expiry, service or nonce); \
                 mint a new one with `cpt force --service NAME`"
            }
            FormatError::Malformed => {
                "not a force credential (expected cpt1.<expires>.<nonce>.<service>.<mac>, \
                 as `cpt force` prints it)"
            }
        })
    }
}

impl std::error::Error for FormatError {}

/// A credential's fields, parsed but not yet checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parsed<'a> {
    expires: u64,
    nonce: &'a str,
    service: &'a str,
    tag: [u8; 32],
}

impl Parsed<'_> {
    /// Unix seconds after which it is refused.
    pub fn expires_unix_secs(&self) -> u64 {
        self.expires
    }

    /// The random nonce (32 hex digits), unique per minted credential.
    pub fn nonce(&self) -> &str {
        self.nonce
    }

    /// The service it forces, or [`ANY_SERVICE`].
    pub fn service(&self) -> &str {
        self.service
    }

    /// Whether it is valid for `service` (named, or the wildcard).
    pub fn is_for(&self, service: &str) -> bool {
        self.service == ANY_SERVICE || self.service == service
    }

    /// The MAC, unique per credential (what a replay cache remembers).
    pub fn tag(&self) -> &[u8; 32] {
        &self.tag
    }

    /// Whether the MAC is that of these fields and `request_id` under `key`,
    /// compared in constant time.
    pub fn mac_matches(&self, key: impl AsRef<[u8]>, request_id: &str) -> bool {
        mac(
            key.as_ref(),
            self.expires,
            self.nonce,
            self.service,
            request_id,
        )
        .verify_slice(&self.tag)
        .is_ok()
    }
}

/// Parse a credential (bytes: a header value need not be UTF-8).
///
/// # Errors
///
/// [`FormatError::OldFormat`] for a value without the version prefix,
/// [`FormatError::Malformed`] for a bad version-1 value.
pub fn parse(credential: &(impl AsRef<[u8]> + ?Sized)) -> Result<Parsed<'_>, FormatError> {
    let s = std::str::from_utf8(credential.as_ref()).map_err(|_| FormatError::Malformed)?;
    let Some(rest) = s
        .strip_prefix(VERSION_PREFIX)
        .and_then(|r| r.strip_prefix('.'))
    else {
        return Err(if s.starts_with("cpt") && s.contains('.') {
            FormatError::Malformed
        } else {
            FormatError::OldFormat
        });
    };
    let mut fields = rest.splitn(3, '.');
    let (Some(expires), Some(nonce), Some(rest)) = (fields.next(), fields.next(), fields.next())
    else {
        return Err(FormatError::Malformed);
    };
    let (service, tag) = rest.rsplit_once('.').ok_or(FormatError::Malformed)?;
    let expires = expires
        .parse::<u64>()
        .ok()
        .filter(|_| expires.bytes().all(|b| b.is_ascii_digit()))
        .ok_or(FormatError::Malformed)?;
    if nonce.len() != 32 || !nonce.bytes().all(|b| b.is_ascii_hexdigit()) || !valid_service(service)
    {
        return Err(FormatError::Malformed);
    }
    let tag = decode_hex(tag).ok_or(FormatError::Malformed)?;
    Ok(Parsed {
        expires,
        nonce,
        service,
        tag,
    })
}

/// Decode a 64-character hex MAC (either case) into its 32 bytes; `None`
/// when it is not one.
pub fn decode_hex(s: &str) -> Option<[u8; 32]> {
    decode_hex_bytes(s.as_bytes())
}

/// [`decode_hex`] over bytes (a header value need not be UTF-8).
pub fn decode_hex_bytes(s: &[u8]) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in s.chunks_exact(2).enumerate() {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        out[i] = (hi << 4 | lo) as u8;
    }
    Some(out)
}

/// Seconds since the Unix epoch now (0 if the clock is before it).
pub fn now_unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A fresh request id for an operator's forced request: 32 lowercase hex
/// digits, from the clock and a randomly seeded hash (unique per call in
/// practice; not a secret, the credential is).
pub fn new_request_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let random = RandomState::new().hash_one((nanos, std::process::id()));
    format!("{nanos:016x}{random:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000;

    #[test]
    fn mac_is_hmac_sha256_over_every_field_and_the_request_id() {
        let cred = mint(b"k", "req-1", "A", 300, NOW);
        let p = parse(&cred).unwrap();
        assert_eq!(p.expires_unix_secs(), NOW + 300);
        assert_eq!(p.service(), "A");
        assert!(p.mac_matches(b"k", "req-1"));
        assert!(!p.mac_matches(b"k", "req-2"), "bound to the request id");
        assert!(!p.mac_matches(b"x", "req-1"), "bound to the key");
        // Changing any field breaks the MAC.
        let fields: Vec<&str> = cred.split('.').collect();
        for (i, changed) in [
            (1, (NOW + 9999).to_string()),
            (2, "0".repeat(32)),
            (3, "B".to_owned()),
            (3, "*".to_owned()),
        ] {
            let mut f: Vec<String> = fields.iter().map(|s| (*s).to_owned()).collect();
            f[i] = changed;
            let forged = f.join(".");
            assert!(
                !parse(&forged).unwrap().mac_matches(b"k", "req-1"),
                "{forged}"
            );
        }
    }

    #[test]
    fn two_credentials_for_the_same_request_differ() {
        assert_ne!(
            mint(b"k", "r", "A", 300, NOW),
            mint(b"k", "r", "A", 300, NOW)
        );
    }

    #[test]
    fn services_may_contain_dots_and_the_wildcard_is_explicit() {
        let p_cred = mint(b"k", "r", "api.v1", 60, NOW);
        let p = parse(&p_cred).unwrap();
        assert_eq!(p.service(), "api.v1");
        assert!(p.is_for("api.v1") && !p.is_for("api"));
        let any = mint(b"k", "r", ANY_SERVICE, 60, NOW);
        assert!(parse(&any).unwrap().is_for("whatever"));
    }

    #[test]
    fn old_and_malformed_credentials_are_told_apart() {
        let old_mac = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
        assert_eq!(parse(old_mac), Err(FormatError::OldFormat));
        assert_eq!(parse("some-fixed-token"), Err(FormatError::OldFormat));
        assert!(FormatError::OldFormat.to_string().contains("cpt force"));
        for bad in [
            "cpt1.",
            "cpt1.12.abc.A.00",
            "cpt2.1.2.3.4",
            "cpt1.x1.00000000000000000000000000000000.A.",
            &format!("cpt1.-1.{}.A.{}", "0".repeat(32), "0".repeat(64)),
            &format!("cpt1.1.{}.A B.{}", "0".repeat(32), "0".repeat(64)),
        ] {
            assert_eq!(parse(bad), Err(FormatError::Malformed), "{bad}");
        }
        assert_eq!(parse(&b"cpt1.\xff"[..]), Err(FormatError::Malformed));
    }

    #[test]
    fn decode_hex_accepts_64_hex_digits_only() {
        let good = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
        assert!(decode_hex(good).is_some());
        assert!(decode_hex(&good.to_uppercase()).is_some());
        assert!(decode_hex(&good[..62]).is_none());
        assert!(decode_hex(&format!("{}zz", &good[..62])).is_none());
    }

    #[test]
    fn new_request_ids_differ() {
        let a = new_request_id();
        let b = new_request_id();
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
    }
}
