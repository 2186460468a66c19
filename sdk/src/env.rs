//! [`CptEnv`]: the `CPT_*` environment variables operators configure cpt
//! with, parsed in one place (as `OTEL_*` configure OpenTelemetry).
//!
//! | variable | value | used by |
//! |---|---|---|
//! | `CPT_SAMPLE_RATE` | probability `0..=1` (e.g. `0.01`) | the sampler ([`CptEnv::sampler`]) |
//! | `CPT_SAMPLE_MAX_PER_SECOND` | non-negative integer, or `unlimited` | the sampler |
//! | `CPT_COLLECTOR_ENDPOINT` | `grpc://HOST:PORT`, `http://HOST:PORT[/path]`, or over TLS `grpcs://HOST:PORT` / `https://HOST:PORT[/path]` | the record shipper |
//! | `CPT_SPOOL_DIR` | a directory of the service's own | the record shipper's on-disk spool (off when unset) |
//! | `CPT_SPOOL_MAX_BYTES` | a whole number of bytes, optionally followed by `B`, `KiB`, `MiB` or `GiB` (1024-based; case and a space before the unit do not matter), e.g. `268435456` or `256MiB` | the spool's bound (default 64 MiB) |
//! | `CPT_TRUST_SECRET` | the shared caller secret (visible ASCII) | server trust, client caller secret |
//! | `CPT_FORCE_KEY` | the `x-cpt-force` HMAC key | server force authentication |
//! | `CPT_FORCE_KEY_FILE` | a file holding the force key (one trailing newline is dropped) | same; keeps the key out of `ps` and `/proc/PID/environ` |
//! | `CPT_STATE_DIR` | a directory of the service's own | what must outlive a restart: the force credentials accepted and not yet expired (off when unset) |
//! | `CPT_CLOCK` | `std` (always read `Instant`) or `auto` (the CPU's time-stamp counter where the kernel keeps time with it; the default) | the layer's clock ([`crate::clock::SystemClock`]) |
//!
//! An unset or empty variable is not configured (the builder's own setting
//! stays). A malformed one is an [`EnvError`] naming the variable, its value
//! (secrets elided) and what was expected. The builders read these through
//! `with_default_env()` (panics with the error's message) and
//! `try_with_default_env()` (returns it).
//!
//! Tests parse from a lookup function instead of the process environment:
//!
//! ```
//! use cpt_sdk::env::CptEnv;
//! let env = CptEnv::from_lookup(|name| (name == "CPT_SAMPLE_RATE").then(|| "0.25".to_owned()))
//!     .unwrap();
//! assert_eq!(env.sample_rate, Some(0.25));
//! let err = CptEnv::from_lookup(|name| (name == "CPT_SAMPLE_RATE").then(|| "25%".to_owned()))
//!     .unwrap_err();
//! assert!(err.to_string().contains("CPT_SAMPLE_RATE"));
//! ```

use std::fmt;
use std::path::PathBuf;

use crate::trigger::DefaultSampler;

/// Sampling probability of requests nobody forced.
pub const SAMPLE_RATE: &str = "CPT_SAMPLE_RATE";
/// At most this many sampled requests per second (`unlimited` for no cap).
pub const SAMPLE_MAX_PER_SECOND: &str = "CPT_SAMPLE_MAX_PER_SECOND";
/// Where records are shipped.
pub const COLLECTOR_ENDPOINT: &str = "CPT_COLLECTOR_ENDPOINT";
/// The record shipper's spool directory (batches the collector could not
/// take wait there and are replayed).
pub const SPOOL_DIR: &str = "CPT_SPOOL_DIR";
/// The bound on the bytes waiting in the spool.
pub const SPOOL_MAX_BYTES: &str = "CPT_SPOOL_MAX_BYTES";
/// The secret trusted callers send and servers check.
pub const TRUST_SECRET: &str = "CPT_TRUST_SECRET";
/// The key operators sign `x-cpt-force` credentials with.
pub const FORCE_KEY: &str = "CPT_FORCE_KEY";
/// A file holding the force key.
pub const FORCE_KEY_FILE: &str = "CPT_FORCE_KEY_FILE";
/// Which clock the layer reads (`std` or `auto`).
pub const CLOCK: &str = "CPT_CLOCK";
/// A directory of the service's own for what must outlive a restart (the
/// force credentials it accepted, so none is accepted twice).
pub const STATE_DIR: &str = "CPT_STATE_DIR";

/// Every variable [`CptEnv`] reads.
pub const VARIABLES: [&str; 10] = [
    SAMPLE_RATE,
    SAMPLE_MAX_PER_SECOND,
    COLLECTOR_ENDPOINT,
    SPOOL_DIR,
    SPOOL_MAX_BYTES,
    TRUST_SECRET,
    FORCE_KEY,
    FORCE_KEY_FILE,
    CLOCK,
    STATE_DIR,
];

/// What `CPT_CLOCK` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClockChoice {
    /// `std`: always read [`std::time::Instant`].
    Std,
    /// `auto`: the time-stamp counter where the kernel keeps time with it,
    /// else `Instant` (the default).
    Auto,
}

/// The sampler's probability when only the cap is configured
/// ([`DefaultSampler::default`]'s).
const DEFAULT_RATE: f64 = 0.01;
/// The sampler's cap when only the rate is configured
/// ([`DefaultSampler::default`]'s).
const DEFAULT_MAX_PER_SECOND: u32 = 100;

/// The cpt configuration found in the environment; `None` is "not set".
#[derive(Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct CptEnv {
    /// `CPT_SAMPLE_RATE`.
    pub sample_rate: Option<f64>,
    /// `CPT_SAMPLE_MAX_PER_SECOND`: `Some(None)` is `unlimited`.
    pub max_per_second: Option<Option<u32>>,
    /// `CPT_COLLECTOR_ENDPOINT`, checked for its scheme only (the collector
    /// client parses it).
    pub collector_endpoint: Option<String>,
    /// `CPT_SPOOL_DIR`.
    pub spool_dir: Option<PathBuf>,
    /// `CPT_SPOOL_MAX_BYTES`, in bytes.
    pub spool_max_bytes: Option<u64>,
    /// `CPT_TRUST_SECRET`.
    pub trust_secret: Option<String>,
    /// `CPT_FORCE_KEY`, or the contents of `CPT_FORCE_KEY_FILE`.
    pub force_key: Option<Vec<u8>>,
    /// `CPT_CLOCK`.
    pub clock: Option<ClockChoice>,
    /// `CPT_STATE_DIR`.
    pub state_dir: Option<PathBuf>,
}

impl fmt::Debug for CptEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CptEnv")
            .field("sample_rate", &self.sample_rate)
            .field("max_per_second", &self.max_per_second)
            .field("collector_endpoint", &self.collector_endpoint)
            .field("spool_dir", &self.spool_dir)
            .field("spool_max_bytes", &self.spool_max_bytes)
            .field("trust_secret", &self.trust_secret.as_ref().map(|_| "…"))
            .field("force_key", &self.force_key.as_ref().map(|_| "…"))
            .field("clock", &self.clock)
            .field("state_dir", &self.state_dir)
            .finish()
    }
}

/// A `CPT_*` variable that is set but malformed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{variable}={value}: {reason}")]
pub struct EnvError {
    variable: &'static str,
    /// The value as shown (quoted; elided for secrets).
    value: String,
    reason: String,
}

impl EnvError {
    fn new(variable: &'static str, value: &str, reason: impl Into<String>) -> Self {
        EnvError {
            variable,
            value: format!("{value:?}"),
            reason: reason.into(),
        }
    }

    fn secret(variable: &'static str, reason: impl Into<String>) -> Self {
        EnvError {
            variable,
            value: "<elided>".to_owned(),
            reason: reason.into(),
        }
    }

    /// The variable that is malformed.
    pub fn variable(&self) -> &'static str {
        self.variable
    }
}

impl CptEnv {
    /// Parse the process environment.
    ///
    /// # Errors
    ///
    /// A set variable that is malformed (or not Unicode), an unreadable
    /// `CPT_FORCE_KEY_FILE`, or both `CPT_FORCE_KEY` and
    /// `CPT_FORCE_KEY_FILE` set.
    pub fn from_env() -> Result<CptEnv, EnvError> {
        for name in VARIABLES {
            if let Err(std::env::VarError::NotUnicode(_)) = std::env::var(name) {
                return Err(EnvError::secret(name, "not valid Unicode"));
            }
        }
        CptEnv::from_lookup(|name| std::env::var(name).ok())
    }

    /// Parse variables looked up with `lookup` (the process environment's
    /// `std::env::var(name).ok()`, or a map in tests).
    ///
    /// # Errors
    ///
    /// As [`CptEnv::from_env`].
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<CptEnv, EnvError> {
        let get = |name: &str| lookup(name).filter(|v| !v.is_empty());
        let sample_rate = get(SAMPLE_RATE)
            .map(|v| {
                parse_rate(&v).ok_or_else(|| {
                    EnvError::new(
                        SAMPLE_RATE,
                        &v,
                        "expected a probability between 0 and 1, e.g. 0.01 for 1 % of requests",
                    )
                })
            })
            .transpose()?;
        let max_per_second = get(SAMPLE_MAX_PER_SECOND)
            .map(|v| {
                parse_cap(&v).ok_or_else(|| {
                    EnvError::new(
                        SAMPLE_MAX_PER_SECOND,
                        &v,
                        "expected a whole number of requests per second (0 to 4294967295), \
                     or `unlimited`",
                    )
                })
            })
            .transpose()?;
        let collector_endpoint = get(COLLECTOR_ENDPOINT)
            .map(|v| {
                let rest = v
                    .strip_prefix("grpc://")
                    .or_else(|| v.strip_prefix("http://"))
                    .or_else(|| v.strip_prefix("grpcs://"))
                    .or_else(|| v.strip_prefix("https://"));
                match rest {
                    Some(host) if !host.is_empty() && !host.starts_with('/') => Ok(v),
                    _ => Err(EnvError::new(
                        COLLECTOR_ENDPOINT,
                        &v,
                        "expected grpc://HOST:PORT or http://HOST:PORT[/path], or over TLS \
                         grpcs://HOST:PORT or https://HOST:PORT[/path]",
                    )),
                }
            })
            .transpose()?;
        let spool_dir = get(SPOOL_DIR).map(PathBuf::from);
        let state_dir = get(STATE_DIR).map(PathBuf::from);
        let spool_max_bytes = get(SPOOL_MAX_BYTES)
            .map(|v| {
                parse_bytes(&v).ok_or_else(|| {
                    EnvError::new(
                        SPOOL_MAX_BYTES,
                        &v,
                        "expected a positive whole number of bytes, optionally followed by B, \
                         KiB, MiB or GiB (1024-based), e.g. 268435456 or 256MiB; decimal units \
                         (KB, MB, GB) are not accepted, since they are ambiguous",
                    )
                })
            })
            .transpose()?;
        let trust_secret = get(TRUST_SECRET)
            .map(|v| {
                if v.bytes().all(|b| (0x21..0x7f).contains(&b)) {
                    Ok(v)
                } else {
                    Err(EnvError::secret(
                        TRUST_SECRET,
                        "the secret travels in a header: use visible ASCII only \
                         (no spaces, control characters or non-ASCII)",
                    ))
                }
            })
            .transpose()?;
        let force_key = match (get(FORCE_KEY), get(FORCE_KEY_FILE)) {
            (Some(_), Some(file)) => {
                return Err(EnvError::new(
                    FORCE_KEY_FILE,
                    &file,
                    "CPT_FORCE_KEY is set too: set one of them",
                ));
            }
            (Some(key), None) => Some(key.into_bytes()),
            (None, Some(file)) => Some(read_key_file(&file)?),
            (None, None) => None,
        };
        let clock = get(CLOCK)
            .map(|v| match v.trim().to_ascii_lowercase().as_str() {
                "std" => Ok(ClockChoice::Std),
                "auto" => Ok(ClockChoice::Auto),
                _ => Err(EnvError::new(
                    CLOCK,
                    &v,
                    "expected `std` (always read Instant) or `auto` (the time-stamp counter \
                     where the kernel keeps time with it)",
                )),
            })
            .transpose()?;
        Ok(CptEnv {
            clock,
            sample_rate,
            max_per_second,
            collector_endpoint,
            spool_dir,
            spool_max_bytes,
            trust_secret,
            force_key,
            state_dir,
        })
    }

    /// The sampler `CPT_SAMPLE_RATE` and `CPT_SAMPLE_MAX_PER_SECOND`
    /// describe, when either is set; the other takes
    /// [`DefaultSampler::default`]'s value (1 %, at most 100 per second).
    pub fn sampler(&self) -> Option<DefaultSampler> {
        if self.sample_rate.is_none() && self.max_per_second.is_none() {
            return None;
        }
        let sampler = DefaultSampler::new(self.sample_rate.unwrap_or(DEFAULT_RATE));
        Some(match self.max_per_second {
            None => sampler.with_max_per_second(DEFAULT_MAX_PER_SECOND),
            Some(Some(n)) => sampler.with_max_per_second(n),
            Some(None) => sampler,
        })
    }
}

fn parse_rate(v: &str) -> Option<f64> {
    let p: f64 = v.trim().parse().ok()?;
    (0.0..=1.0).contains(&p).then_some(p)
}

/// `1234`, `1234B`, `64KiB`, `256MiB`, `2GiB` (1024-based; any case, a
/// space before the unit allowed); more than zero. Decimal-looking units
/// (`KB`, `MB`, `GB`, `K`, `M`, `G`) are refused: whether they mean 1000 or
/// 1024 is a guess.
fn parse_bytes(v: &str) -> Option<u64> {
    let v = v.trim();
    let digits = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (n, unit) = v.split_at(digits);
    let n: u64 = n.parse().ok()?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "kib" => 10,
        "mib" => 20,
        "gib" => 30,
        _ => return None,
    };
    n.checked_mul(1 << shift).filter(|&b| b > 0)
}

fn parse_cap(v: &str) -> Option<Option<u32>> {
    let v = v.trim();
    if v.eq_ignore_ascii_case("unlimited") {
        return Some(None);
    }
    v.parse().ok().map(Some)
}

fn read_key_file(file: &str) -> Result<Vec<u8>, EnvError> {
    let path = PathBuf::from(file);
    let mut key = std::fs::read(&path).map_err(|e| {
        EnvError::new(
            FORCE_KEY_FILE,
            file,
            format!("cannot read the key file: {e}"),
        )
    })?;
    if key.last() == Some(&b'\n') {
        key.pop();
        if key.last() == Some(&b'\r') {
            key.pop();
        }
    }
    if key.is_empty() {
        return Err(EnvError::new(
            FORCE_KEY_FILE,
            file,
            "the key file is empty: write the key into it",
        ));
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::trigger::{Sampler, SamplingContext, Trigger};

    fn parse(vars: &[(&str, &str)]) -> Result<CptEnv, EnvError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        CptEnv::from_lookup(|name| map.get(name).cloned())
    }

    fn err(vars: &[(&str, &str)]) -> String {
        parse(vars).expect_err("malformed").to_string()
    }

    /// A file under the temp dir unique to this test.
    fn temp_file(name: &str, contents: &[u8]) -> PathBuf {
        let path = std::env::temp_dir().join(format!("cpt-env-{}-{name}", std::process::id()));
        std::fs::write(&path, contents).expect("write a temp file");
        path
    }

    #[test]
    fn nothing_set_configures_nothing() {
        let env = parse(&[]).unwrap();
        assert_eq!(env, CptEnv::default());
        assert!(env.sampler().is_none());
        // Empty is unset.
        let env = parse(&VARIABLES.map(|v| (v, ""))).unwrap();
        assert_eq!(env, CptEnv::default());
    }

    #[test]
    fn sample_rate() {
        assert_eq!(
            parse(&[(SAMPLE_RATE, "0.25")]).unwrap().sample_rate,
            Some(0.25)
        );
        assert_eq!(parse(&[(SAMPLE_RATE, "1")]).unwrap().sample_rate, Some(1.0));
        assert_eq!(parse(&[(SAMPLE_RATE, "0")]).unwrap().sample_rate, Some(0.0));
        for bad in ["1.5", "-0.1", "1%", "NaN", "abc"] {
            let e = err(&[(SAMPLE_RATE, bad)]);
            assert!(
                e.starts_with(&format!(
                    "CPT_SAMPLE_RATE=\"{bad}\": expected a probability"
                )),
                "{e}"
            );
        }
    }

    #[test]
    fn sample_max_per_second() {
        let cap = |v| parse(&[(SAMPLE_MAX_PER_SECOND, v)]).unwrap().max_per_second;
        assert_eq!(cap("50"), Some(Some(50)));
        assert_eq!(cap("0"), Some(Some(0)));
        assert_eq!(cap("unlimited"), Some(None));
        for bad in ["-1", "1.5", "10/s", "4294967296"] {
            let e = err(&[(SAMPLE_MAX_PER_SECOND, bad)]);
            assert!(e.starts_with("CPT_SAMPLE_MAX_PER_SECOND="), "{e}");
            assert!(e.contains("`unlimited`"), "{e}");
        }
    }

    #[test]
    fn the_sampler_follows_rate_and_cap() {
        let cx = SamplingContext::new(None);
        let sampler =
            |vars: &[(&str, &str)]| format!("{:?}", parse(vars).unwrap().sampler().unwrap());
        let capped = sampler(&[(SAMPLE_RATE, "1"), (SAMPLE_MAX_PER_SECOND, "2")]);
        assert!(capped.contains("max_per_second: Some(2)"), "{capped}");
        assert!(capped.contains("always: true"), "{capped}");
        let default_cap = sampler(&[(SAMPLE_RATE, "0.5")]);
        assert!(
            default_cap.contains("max_per_second: Some(100)"),
            "{default_cap}"
        );
        let uncapped = sampler(&[(SAMPLE_MAX_PER_SECOND, "unlimited")]);
        assert!(uncapped.contains("max_per_second: None"), "{uncapped}");
        let none = parse(&[(SAMPLE_RATE, "0")]).unwrap().sampler().unwrap();
        assert!((0..100).all(|_| none.sample(&cx).is_none()));
        let all = parse(&[(SAMPLE_RATE, "1"), (SAMPLE_MAX_PER_SECOND, "unlimited")])
            .unwrap()
            .sampler()
            .unwrap();
        assert!((0..500).all(|_| all.sample(&cx) == Some(Trigger::Sampled)));
    }

    #[test]
    fn collector_endpoint() {
        for ok in [
            "grpc://127.0.0.1:4317",
            "http://collector:7070/v1/records",
            "grpcs://collector:7070",
            "https://collector:7071/v1/records",
        ] {
            assert_eq!(
                parse(&[(COLLECTOR_ENDPOINT, ok)])
                    .unwrap()
                    .collector_endpoint
                    .as_deref(),
                Some(ok)
            );
        }
        for bad in [
            "127.0.0.1:4317",
            "ftp://collector:443",
            "grpc://",
            "https://",
            "http:///x",
        ] {
            let e = err(&[(COLLECTOR_ENDPOINT, bad)]);
            assert!(e.starts_with("CPT_COLLECTOR_ENDPOINT="), "{e}");
            assert!(e.contains("grpc://HOST:PORT"), "{e}");
        }
    }

    #[test]
    fn state_dir_is_a_path_and_unset_when_empty() {
        let env = parse(&[(STATE_DIR, "/var/lib/checkout/cpt")]).unwrap();
        assert_eq!(env.state_dir, Some(PathBuf::from("/var/lib/checkout/cpt")));
        assert_eq!(parse(&[(STATE_DIR, "")]).unwrap().state_dir, None);
    }

    #[test]
    fn spool_dir_and_max_bytes() {
        let env = parse(&[(SPOOL_DIR, "/var/spool/cpt"), (SPOOL_MAX_BYTES, "256MiB")]).unwrap();
        assert_eq!(env.spool_dir, Some(PathBuf::from("/var/spool/cpt")));
        assert_eq!(env.spool_max_bytes, Some(256 << 20));
        for (v, want) in [
            ("1234", 1234),
            ("1234B", 1234),
            ("64 KiB", 64 << 10),
            ("2gib", 2 << 30),
        ] {
            assert_eq!(
                parse(&[(SPOOL_MAX_BYTES, v)]).unwrap().spool_max_bytes,
                Some(want)
            );
        }
        for bad in [
            "0",
            "-5",
            "64TB",
            "64MB",
            "64M",
            "2g",
            "lots",
            "99999999999999999999GiB",
        ] {
            let e = err(&[(SPOOL_MAX_BYTES, bad)]);
            assert!(e.starts_with("CPT_SPOOL_MAX_BYTES="), "{e}");
            assert!(e.contains("256MiB"), "{e}");
        }
    }

    #[test]
    fn trust_secret_must_be_a_header_value_and_is_never_shown() {
        let env = parse(&[(TRUST_SECRET, "s3cr3t-value")]).unwrap();
        assert_eq!(env.trust_secret.as_deref(), Some("s3cr3t-value"));
        assert!(!format!("{env:?}").contains("s3cr3t"));
        for bad in ["has space", "tab\there", "naïve"] {
            let e = err(&[(TRUST_SECRET, bad)]);
            assert!(e.starts_with("CPT_TRUST_SECRET=<elided>: "), "{e}");
            assert!(!e.contains(bad), "{e}");
        }
    }

    #[test]
    fn force_key_from_the_variable() {
        let env = parse(&[(FORCE_KEY, "ops-key")]).unwrap();
        assert_eq!(env.force_key.as_deref(), Some(&b"ops-key"[..]));
        assert!(!format!("{env:?}").contains("ops-key"));
    }

    #[test]
    fn force_key_from_a_file_drops_one_trailing_newline() {
        let path = temp_file("key", b"file-key\n");
        let env = parse(&[(FORCE_KEY_FILE, path.to_str().unwrap())]).unwrap();
        assert_eq!(env.force_key.as_deref(), Some(&b"file-key"[..]));
        let crlf = temp_file("crlf", b"file-key\r\n");
        let env = parse(&[(FORCE_KEY_FILE, crlf.to_str().unwrap())]).unwrap();
        assert_eq!(env.force_key.as_deref(), Some(&b"file-key"[..]));
        std::fs::remove_file(path).ok();
        std::fs::remove_file(crlf).ok();
    }

    #[test]
    fn force_key_file_errors() {
        let e = err(&[(FORCE_KEY_FILE, "/nonexistent/cpt-force-key")]);
        assert!(
            e.starts_with(
                "CPT_FORCE_KEY_FILE=\"/nonexistent/cpt-force-key\": cannot read the key file"
            ),
            "{e}"
        );
        let empty = temp_file("empty", b"\n");
        let e = err(&[(FORCE_KEY_FILE, empty.to_str().unwrap())]);
        assert!(e.contains("the key file is empty"), "{e}");
        std::fs::remove_file(empty).ok();
        let e = err(&[(FORCE_KEY, "k"), (FORCE_KEY_FILE, "/some/file")]);
        assert!(e.contains("CPT_FORCE_KEY is set too"), "{e}");
    }

    #[test]
    fn clock_is_std_or_auto_and_anything_else_is_an_error() {
        assert_eq!(
            parse(&[(CLOCK, "std")]).unwrap().clock,
            Some(ClockChoice::Std)
        );
        assert_eq!(
            parse(&[(CLOCK, "AUTO")]).unwrap().clock,
            Some(ClockChoice::Auto)
        );
        assert_eq!(parse(&[]).unwrap().clock, None);
        let e = err(&[(CLOCK, "fast")]);
        assert!(e.starts_with("CPT_CLOCK=\"fast\""), "{e}");
        assert!(e.contains("`std`") && e.contains("`auto`"), "{e}");
    }

    #[test]
    fn error_names_the_variable() {
        let e = parse(&[(SAMPLE_RATE, "2")]).unwrap_err();
        assert_eq!(e.variable(), SAMPLE_RATE);
    }
}
