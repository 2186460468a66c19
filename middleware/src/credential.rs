//! [`ForceAuth`]: which [`header::FORCE`](crate::header::FORCE) credentials force a trace.
//!
//! An operator forces a trace on one request by sending `x-cpt-force` with a
//! credential `cpt force` minted ([`cpt_sdk::force`], version 1): an
//! HMAC-SHA256 under a key the service is configured with
//! ([`ForceAuth::hmac_key`]) over the request's `x-request-id`, the service
//! it is for (or `*`), its expiry and a nonce. A service accepts it only
//!
//! - for that request id (a leaked credential forces nothing else),
//! - for itself (or a `*` credential),
//! - before it expires (at most [`MAX_TTL_SECS`] ahead; clocks must agree
//!   to within that much), and
//! - once: the MACs it accepted are remembered until they expire, in a
//!   cache of [`REPLAY_CACHE_CAPACITY`](crate::REPLAY_CACHE_CAPACITY)
//!   entries per process shared by every layer in it. When it is full of unexpired credentials, further ones
//!   are refused ([`Rejection::ReplayCacheFull`]) rather than forgetting
//!   one.
//!
//! What "once" covers, exactly:
//!
//! - **a restart** only with a state directory
//!   ([`ForceAuth::with_replay_state_dir`], `CPT_STATE_DIR`): the accepted
//!   credentials are journaled there (`DIR/force-replay`) and read back
//!   when the service starts. Without one, a
//!   credential used before a restart forces one more request after it,
//!   within its lifetime;
//! - **other processes** never: behind a load balancer, a credential
//!   replayed within its lifetime to another replica of the same service
//!   forces one more request there (keep the lifetime short).
//!
//! Either way the forced record carries the credential's nonce
//! ([`cpt_sdk::force::NONCE_LABEL`]) and the collector labels a second
//! record with the same nonce [`cpt_sdk::force::REPLAYED_LABEL`], so a
//! replay that got through is visible.
//!
//! A force without a valid credential is ignored (the request is sampled as
//! usual), counted in [`Stats`](crate::Stats) by [`Rejection`], and logged
//! once per reason per minute with the number since. The default accepts no
//! credential: forcing is off until configured.

use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use cpt_sdk::force::MAX_TTL_SECS;
use cpt_sdk::force::{FormatError, parse};

use crate::replay::{Refused, ReplayCache, journaled_cache, process_cache};

/// Why a force credential was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Rejection {
    /// Not a credential at all.
    Malformed,
    /// A credential of the format before version 1 (a bare MAC or a fixed
    /// token): `cpt force` mints the new one.
    OldFormat,
    /// The request carries no `x-request-id` to check the MAC against.
    NoRequestId,
    /// The MAC does not match (another key, request id, or edited fields).
    BadMac,
    /// Past its expiry, or expiring further ahead than [`MAX_TTL_SECS`].
    Expired,
    /// Minted for another service.
    ForeignService,
    /// Already accepted once by this process.
    Replayed,
    /// The replay cache is full of unexpired credentials.
    ReplayCacheFull,
}

impl Rejection {
    /// Every reason, in [`Stats`](crate::Stats) order.
    pub const ALL: [Rejection; 8] = [
        Rejection::Malformed,
        Rejection::OldFormat,
        Rejection::NoRequestId,
        Rejection::BadMac,
        Rejection::Expired,
        Rejection::ForeignService,
        Rejection::Replayed,
        Rejection::ReplayCacheFull,
    ];

    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// What the log says about it.
    pub fn describe(self) -> &'static str {
        match self {
            Rejection::Malformed => {
                "not a force credential (expected cpt1.<expires>.<nonce>.<service>.<mac> as `cpt force` prints it)"
            }
            Rejection::OldFormat => {
                "a force credential in the old format (no expiry, service or nonce); mint a new one with `cpt force --service NAME`"
            }
            Rejection::NoRequestId => "a force credential on a request without x-request-id",
            Rejection::BadMac => {
                "a force credential whose MAC does not match (another key or request id, or edited)"
            }
            Rejection::Expired => {
                "an expired force credential (or one expiring too far ahead; check the clocks); mint a new one with `cpt force --ttl`"
            }
            Rejection::ForeignService => {
                "a force credential minted for another service (`cpt force --service` names the service that checks it)"
            }
            Rejection::Replayed => "a force credential this process already accepted once",
            Rejection::ReplayCacheFull => {
                "a force credential while the replay cache is full of unexpired credentials"
            }
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// The credentials a service accepts in `x-cpt-force`.
#[derive(Clone, Default)]
pub struct ForceAuth {
    keys: Vec<Arc<[u8]>>,
    /// `None`: the process-wide cache.
    cache: Option<Arc<Mutex<ReplayCache>>>,
    /// The state directory the cache is journaled in, if any.
    state_dir: Option<Arc<Path>>,
}

impl ForceAuth {
    /// Accept no credential (forcing disabled). The default.
    pub fn none() -> Self {
        ForceAuth::default()
    }

    /// Also accept credentials minted under `key` ([`cpt_sdk::force::mint`],
    /// `cpt force --key-file`).
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

    /// Also accept credentials minted under `token` used as a key (`cpt
    /// force --token-file`). The token itself is never sent: a request
    /// carrying it verbatim is refused ([`Rejection::OldFormat`]), since a
    /// fixed token would force any request, any number of times.
    ///
    /// # Panics
    ///
    /// If `token` is empty.
    #[must_use]
    pub fn token(self, token: impl AsRef<[u8]>) -> Self {
        self.hmac_key(token)
    }

    /// Remember accepted credentials in a cache of `capacity` entries of
    /// this `ForceAuth` and its clones only, instead of the process-wide
    /// one of [`REPLAY_CACHE_CAPACITY`](crate::REPLAY_CACHE_CAPACITY).
    ///
    /// The cache is in memory only: a state directory given before is
    /// dropped.
    #[must_use]
    pub fn with_replay_cache_capacity(mut self, capacity: usize) -> Self {
        self.cache = Some(Arc::new(Mutex::new(ReplayCache::new(capacity))));
        self.state_dir = None;
        self
    }

    /// Journal the accepted credentials in `dir` (a directory of this
    /// service's own, made if missing), so that a restart within a
    /// credential's lifetime does not accept it again: the process-wide
    /// cache of [`REPLAY_CACHE_CAPACITY`](crate::REPLAY_CACHE_CAPACITY)
    /// entries for that directory, loaded from it when first made (here,
    /// not on a request). What `CPT_STATE_DIR` sets through
    /// `ServerLayer::with_env`.
    ///
    /// A journal that cannot be read or written is logged once and never
    /// fails or blocks a request: the cache then goes on in memory. Two
    /// processes must not share `dir` (each reads it only when it starts).
    /// See the module docs for what "once" covers.
    ///
    /// # Examples
    ///
    /// ```
    /// use cpt_middleware::ForceAuth;
    /// # let dir = std::env::temp_dir().join(format!("cpt-doc-{}", std::process::id()));
    /// let auth = ForceAuth::none()
    ///     .hmac_key(b"ops-key")
    ///     .with_replay_state_dir(&dir);
    /// let cred = ForceAuth::sign(b"ops-key", "req-42", "checkout", 300);
    /// assert!(auth.verify("checkout", Some("req-42"), cred.as_bytes()).is_ok());
    /// // `dir/force-replay` now holds it: a restarted service refuses it too.
    /// assert!(auth.verify("checkout", Some("req-42"), cred.as_bytes()).is_err());
    /// # let _ = std::fs::remove_dir_all(&dir);
    /// ```
    #[must_use]
    pub fn with_replay_state_dir(mut self, dir: impl AsRef<Path>) -> Self {
        let dir = dir.as_ref();
        self.cache = Some(journaled_cache(dir));
        self.state_dir = Some(dir.into());
        self
    }

    /// Whether any key is configured.
    pub fn is_enabled(&self) -> bool {
        !self.keys.is_empty()
    }

    /// The credential an operator sends to force request `request_id` on
    /// `service` (or `*`) for the next `ttl_secs` seconds.
    ///
    /// # Examples
    ///
    /// ```
    /// use cpt_middleware::ForceAuth;
    /// let auth = ForceAuth::none().hmac_key(b"ops-key");
    /// let cred = ForceAuth::sign(b"ops-key", "req-42", "checkout", 300);
    /// assert!(auth.verify("checkout", Some("req-43"), cred.as_bytes()).is_err());
    /// assert!(auth.verify("search", Some("req-42"), cred.as_bytes()).is_err());
    /// assert!(auth.verify("checkout", Some("req-42"), cred.as_bytes()).is_ok());
    /// // Once only.
    /// assert!(auth.verify("checkout", Some("req-42"), cred.as_bytes()).is_err());
    /// ```
    pub fn sign(key: impl AsRef<[u8]>, request_id: &str, service: &str, ttl_secs: u64) -> String {
        cpt_sdk::force::mint(
            key,
            request_id,
            service,
            ttl_secs,
            cpt_sdk::force::now_unix_secs(),
        )
    }

    /// Check `credential` for a request to `service` with this id, now, and
    /// remember it when accepted.
    ///
    /// # Errors
    ///
    /// Why it is refused.
    pub fn verify(
        &self,
        service: &str,
        request_id: Option<&str>,
        credential: &[u8],
    ) -> Result<(), Rejection> {
        self.verify_at(
            service,
            request_id,
            credential,
            cpt_sdk::force::now_unix_secs(),
        )
    }

    /// [`ForceAuth::verify`] at `now` (Unix seconds).
    ///
    /// # Errors
    ///
    /// Why it is refused.
    pub fn verify_at(
        &self,
        service: &str,
        request_id: Option<&str>,
        credential: &[u8],
        now: u64,
    ) -> Result<(), Rejection> {
        if self.keys.is_empty() {
            return Err(Rejection::BadMac);
        }
        let parsed = parse(credential).map_err(|e| match e {
            FormatError::OldFormat => Rejection::OldFormat,
            FormatError::Malformed => Rejection::Malformed,
        })?;
        let request_id = request_id.ok_or(Rejection::NoRequestId)?;
        // The MAC first: nothing about an unauthenticated credential (its
        // service, its expiry) is worth telling apart.
        let mut ok = subtle::Choice::from(0);
        for key in &self.keys {
            ok |= subtle::Choice::from(u8::from(parsed.mac_matches(key, request_id)));
        }
        if !bool::from(ok) {
            return Err(Rejection::BadMac);
        }
        let expires = parsed.expires_unix_secs();
        if expires < now || expires > now.saturating_add(MAX_TTL_SECS) {
            return Err(Rejection::Expired);
        }
        if !parsed.is_for(service) {
            return Err(Rejection::ForeignService);
        }
        let cache = self.cache.clone().unwrap_or_else(process_cache);
        let mut cache = cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        cache
            .insert(*parsed.tag(), expires, now)
            .map_err(|refused| match refused {
                Refused::Replayed => Rejection::Replayed,
                Refused::Full => Rejection::ReplayCacheFull,
            })
    }
}

impl fmt::Debug for ForceAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ForceAuth")
            .field("hmac_keys", &self.keys.len())
            .field("own_replay_cache", &self.cache.is_some())
            .field("replay_state_dir", &self.state_dir)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpt_sdk::force::mint;

    const NOW: u64 = 1_800_000_000;

    #[test]
    fn none_accepts_nothing() {
        let a = ForceAuth::none();
        assert!(!a.is_enabled());
        assert!(a.verify_at("A", Some("r"), b"", NOW).is_err());
        let cred = mint(b"k", "r", "A", 60, NOW);
        assert!(a.verify_at("A", Some("r"), cred.as_bytes(), NOW).is_err());
    }

    #[rustfmt::skip]
    #[test]
    fn each_refusal_has_its_reason() {
        let a = ForceAuth::none().hmac_key(b"key").with_replay_cache_capacity(16);
        let good = mint(b"key", "id-1", "A", 300, NOW);
        let any = mint(b"key", "id-1", "*", 300, NOW);
        let other_key = mint(b"kex", "id-1", "A", 300, NOW);
        let for_b = mint(b"key", "id-1", "B", 300, NOW);
        let expired = mint(b"key", "id-1", "A", 300, NOW - 301);
        let too_long = mint(b"key", "id-1", "A", MAX_TTL_SECS + 60, NOW);
        let old_mac = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
        // (case, service, request id, credential, outcome)
        type Case<'a> = (&'a str, &'a str, Option<&'a str>, &'a [u8], Result<(), Rejection>);
        let cases: &[Case<'_>] = &[
            ("other id",        "A", Some("id-2"), good.as_bytes(),      Err(Rejection::BadMac)),
            ("no id",           "A", None,         good.as_bytes(),      Err(Rejection::NoRequestId)),
            ("other key",       "A", Some("id-1"), other_key.as_bytes(), Err(Rejection::BadMac)),
            ("other service",   "A", Some("id-1"), for_b.as_bytes(),     Err(Rejection::ForeignService)),
            ("expired",         "A", Some("id-1"), expired.as_bytes(),   Err(Rejection::Expired)),
            ("too long",        "A", Some("id-1"), too_long.as_bytes(),  Err(Rejection::Expired)),
            ("old mac",         "A", Some("id-1"), old_mac.as_bytes(),   Err(Rejection::OldFormat)),
            ("fixed token",     "A", Some("id-1"), b"key",               Err(Rejection::OldFormat)),
            ("truncated",       "A", Some("id-1"), &good.as_bytes()[..good.len() - 2], Err(Rejection::Malformed)),
            ("empty",           "A", Some("id-1"), b"",                  Err(Rejection::OldFormat)),
            ("ok",              "A", Some("id-1"), good.as_bytes(),      Ok(())),
            ("replayed",        "A", Some("id-1"), good.as_bytes(),      Err(Rejection::Replayed)),
            ("wildcard",        "C", Some("id-1"), any.as_bytes(),       Ok(())),
            ("wildcard again",  "D", Some("id-1"), any.as_bytes(),       Err(Rejection::Replayed)),
        ];
        for (name, service, id, cred, want) in cases {
            assert_eq!(a.verify_at(service, *id, cred, NOW), *want, "case {name}");
        }
    }

    #[test]
    fn a_token_is_a_key_and_never_a_credential_for_any_request() {
        let a = ForceAuth::none()
            .token("tok")
            .with_replay_cache_capacity(16);
        for id in [Some("r1"), Some("r2"), None] {
            assert_eq!(a.verify_at("A", id, b"tok", NOW), Err(Rejection::OldFormat));
        }
        let cred = mint(b"tok", "r1", "A", 60, NOW);
        assert_eq!(
            a.verify_at("A", Some("r2"), cred.as_bytes(), NOW),
            Err(Rejection::BadMac)
        );
        assert_eq!(a.verify_at("A", Some("r1"), cred.as_bytes(), NOW), Ok(()));
    }

    #[test]
    fn force_auths_given_one_state_dir_share_one_cache_whatever_its_spelling() {
        let tmp = tempfile::tempdir().unwrap();
        // Spelled with `..`, and missing until the first one is made.
        let dir = tmp.path().join("a/../state");
        let now = cpt_sdk::force::now_unix_secs();
        let first = ForceAuth::none().hmac_key(b"k").with_replay_state_dir(&dir);
        let one = mint(b"k", "r1", "A", 60, now);
        assert_eq!(
            first.verify_at("A", Some("r1"), one.as_bytes(), now),
            Ok(())
        );
        let second = ForceAuth::none()
            .hmac_key(b"k")
            .with_replay_state_dir(tmp.path().join("state"));
        // A `*` credential: once for the process, whichever layer sees it.
        let any = mint(b"k", "r2", "*", 60, now);
        assert_eq!(
            first.verify_at("A", Some("r2"), any.as_bytes(), now),
            Ok(())
        );
        assert_eq!(
            second.verify_at("B", Some("r2"), any.as_bytes(), now),
            Err(Rejection::Replayed)
        );
    }

    #[test]
    fn a_full_replay_cache_refuses_until_entries_expire() {
        let a = ForceAuth::none()
            .hmac_key(b"k")
            .with_replay_cache_capacity(2);
        let creds: Vec<String> = (0..3)
            .map(|i| mint(b"k", &format!("r{i}"), "A", 10, NOW))
            .collect();
        assert_eq!(
            a.verify_at("A", Some("r0"), creds[0].as_bytes(), NOW),
            Ok(())
        );
        assert_eq!(
            a.verify_at("A", Some("r1"), creds[1].as_bytes(), NOW),
            Ok(())
        );
        assert_eq!(
            a.verify_at("A", Some("r2"), creds[2].as_bytes(), NOW),
            Err(Rejection::ReplayCacheFull)
        );
        // Once the first two expired, there is room; the third is still valid.
        let later = mint(b"k", "r3", "A", 10, NOW + 11);
        assert_eq!(
            a.verify_at("A", Some("r3"), later.as_bytes(), NOW + 11),
            Ok(())
        );
    }
}
