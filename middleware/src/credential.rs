//! [`ForceAuth`]: which [`header::FORCE`](crate::header::FORCE) credentials force a trace.
//!
//! An operator forces a trace on one request by sending `x-cpt-force` with a
//! credential, either
//!
//! - a **keyed MAC**: the lowercase hex HMAC-SHA256 of the request's
//!   `x-request-id` under a key the service is configured with
//!   ([`ForceAuth::hmac_key`], [`ForceAuth::sign`]); a leaked credential
//!   forces only the one request id it was made for; or
//! - a **token** configured on the service ([`ForceAuth::token`]).
//!
//! Both are compared in constant time. A force without a valid credential
//! is ignored (the request is sampled as usual) and counted in
//! [`Stats::force_rejected`](crate::Stats::force_rejected). The default
//! accepts no credential: forcing is off until configured.

use std::fmt;
use std::sync::Arc;

use subtle::ConstantTimeEq;

/// The credentials a service accepts in `x-cpt-force`.
#[derive(Clone, Default)]
pub struct ForceAuth {
    keys: Vec<Arc<[u8]>>,
    tokens: Vec<Arc<[u8]>>,
}

impl ForceAuth {
    /// Accept no credential (forcing disabled). The default.
    pub fn none() -> Self {
        ForceAuth::default()
    }

    /// Also accept `hex(HMAC-SHA256(key, request_id))`.
    ///
    /// # Panics
    ///
    /// If `key` is empty.
    #[must_use]
    pub fn hmac_key(mut self, key: impl AsRef<[u8]>) -> Self {
        let key = key.as_ref();
        assert!(
            !key.is_empty(),
            "ForceAuth::hmac_key: the key must not be empty"
        );
        self.keys.push(key.into());
        self
    }

    /// Also accept this fixed token.
    ///
    /// # Panics
    ///
    /// If `token` is empty.
    #[must_use]
    pub fn token(mut self, token: impl AsRef<[u8]>) -> Self {
        let token = token.as_ref();
        assert!(
            !token.is_empty(),
            "ForceAuth::token: the token must not be empty"
        );
        self.tokens.push(token.into());
        self
    }

    /// Whether any credential is configured.
    pub fn is_enabled(&self) -> bool {
        !self.keys.is_empty() || !self.tokens.is_empty()
    }

    /// The credential an operator sends to force request `request_id`:
    /// lowercase hex HMAC-SHA256 of the id under `key`.
    ///
    /// # Examples
    ///
    /// ```
    /// use cpt_middleware::ForceAuth;
    /// let cred = ForceAuth::sign(b"ops-key", "req-42");
    /// assert!(ForceAuth::none().hmac_key(b"ops-key").verify(Some("req-42"), cred.as_bytes()));
    /// assert!(!ForceAuth::none().hmac_key(b"ops-key").verify(Some("req-43"), cred.as_bytes()));
    /// ```
    pub fn sign(key: impl AsRef<[u8]>, request_id: &str) -> String {
        cpt_sdk::force::sign(key, request_id)
    }

    /// Whether `credential` is valid for a request with this id. A MAC
    /// credential needs the request id; a token does not.
    pub fn verify(&self, request_id: Option<&str>, credential: &[u8]) -> bool {
        let mut ok = subtle::Choice::from(0);
        for token in &self.tokens {
            ok |= credential.ct_eq(token);
        }
        if let Some(id) = request_id
            && !self.keys.is_empty()
            && let Some(tag) = cpt_sdk::force::decode_hex_bytes(credential)
        {
            for key in &self.keys {
                // Compares in constant time.
                ok |= subtle::Choice::from(u8::from(cpt_sdk::force::verify(key, id, &tag)));
            }
        }
        bool::from(ok)
    }
}

impl fmt::Debug for ForceAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ForceAuth")
            .field("hmac_keys", &self.keys.len())
            .field("tokens", &self.tokens.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_accepts_nothing() {
        let a = ForceAuth::none();
        assert!(!a.is_enabled());
        assert!(!a.verify(Some("r"), b""));
        assert!(!a.verify(Some("r"), ForceAuth::sign(b"k", "r").as_bytes()));
    }

    #[rustfmt::skip]
    #[test]
    fn hmac_and_token() {
        let a = ForceAuth::none().hmac_key(b"key").token("tok");
        let good = ForceAuth::sign(b"key", "id-1");
        let upper = good.to_uppercase();
        let other_key = ForceAuth::sign(b"kex", "id-1");
        let cases: &[(&str, Option<&str>, &[u8], bool)] = &[
            ("mac ok",          Some("id-1"), good.as_bytes(), true),
            ("mac upper hex",   Some("id-1"), upper.as_bytes(), true),
            ("mac other id",    Some("id-2"), good.as_bytes(), false),
            ("mac no id",       None,         good.as_bytes(), false),
            ("mac other key",   Some("id-1"), other_key.as_bytes(), false),
            ("mac truncated",   Some("id-1"), &good.as_bytes()[..62], false),
            ("token ok",        None,         b"tok", true),
            ("token prefix",    None,         b"to", false),
            ("token longer",    None,         b"tok!", false),
            ("empty",           Some("id-1"), b"", false),
        ];
        for (name, id, cred, want) in cases {
            assert_eq!(a.verify(*id, cred), *want, "case {name}");
        }
    }
}
