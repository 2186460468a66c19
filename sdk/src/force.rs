//! Force credentials: what an operator sends in `x-cpt-force` to have one
//! request traced, defined once for the services that check it (the
//! middleware's `ForceAuth`) and the tools that mint it (`cpt force`).
//!
//! The keyed form is the lowercase hex HMAC-SHA256 of the request's
//! `x-request-id` under a key the services are configured with: a leaked
//! credential forces only the one request id it was made for.
//!
//! ```
//! use cpt_sdk::force;
//! let cred = force::sign(b"ops-key", "req-42");
//! assert_eq!(cred.len(), 64);
//! assert!(force::verify(b"ops-key", "req-42", &force::decode_hex(&cred).unwrap()));
//! assert!(!force::verify(b"ops-key", "req-43", &force::decode_hex(&cred).unwrap()));
//! ```

use std::hash::{BuildHasher as _, RandomState};
use std::time::{SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The credential that forces a trace on request `request_id`: lowercase hex
/// HMAC-SHA256 of the id under `key` (64 characters).
pub fn sign(key: impl AsRef<[u8]>, request_id: &str) -> String {
    let mut mac = HmacSha256::new_from_slice(key.as_ref())
        .expect("HMAC accepts keys of any length; this is a bug");
    mac.update(request_id.as_bytes());
    let tag = mac.finalize().into_bytes();
    let mut out = String::with_capacity(tag.len() * 2);
    for b in tag {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    out
}

/// Whether `tag` (the decoded credential, see [`decode_hex`]) is the MAC of
/// `request_id` under `key`, compared in constant time.
pub fn verify(key: impl AsRef<[u8]>, request_id: &str, tag: &[u8; 32]) -> bool {
    let mut mac = HmacSha256::new_from_slice(key.as_ref())
        .expect("HMAC accepts keys of any length; this is a bug");
    mac.update(request_id.as_bytes());
    mac.verify_slice(tag).is_ok()
}

/// Decode a 64-character hex credential (either case) into its 32 bytes;
/// `None` when it is not one.
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

    /// RFC 4231 test case 2 (key "Jefe").
    #[test]
    fn sign_is_hmac_sha256_in_lowercase_hex() {
        assert_eq!(
            sign(b"Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn decode_hex_accepts_64_hex_digits_only() {
        let good = sign(b"k", "r");
        assert!(decode_hex(&good).is_some());
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
