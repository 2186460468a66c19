//! `cpt force`: mint the headers that force a trace on one request.
//!
//! The credential is the lowercase hex HMAC-SHA256 of the request id under
//! the services' force key ([`cpt_sdk::force::sign`], the same function the
//! middleware's `ForceAuth` checks with), or a configured token. The key or
//! token is read from a file (`--key-file` / `--token-file`) or an
//! environment variable (`CPT_FORCE_KEY`, or `--key-env VAR`), never from the
//! command line (it would land in shell history and `ps`), and never printed.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context as _, bail};

/// The environment variable the key is read from when no other source is given.
pub const KEY_ENV: &str = "CPT_FORCE_KEY";

/// Print `x-request-id` and `x-cpt-force` headers that force a trace on one request. The key
/// (or token) comes from --key-file, --token-file, --key-env VAR or CPT_FORCE_KEY; it is never
/// printed. Send the request with exactly this request id: the credential is valid for it only.
#[derive(Debug, Clone, clap::Args)]
pub struct ForceArgs {
    /// File holding the services' force key (`ForceAuth::hmac_key`); one trailing newline is
    /// ignored.
    #[arg(long, value_name = "FILE", group = "secret")]
    pub key_file: Option<PathBuf>,
    /// Environment variable holding the force key (default: CPT_FORCE_KEY).
    #[arg(long, value_name = "VAR", group = "secret")]
    pub key_env: Option<String>,
    /// File holding a fixed token the services accept (`ForceAuth::token`) instead of a key.
    #[arg(long, value_name = "FILE", group = "secret")]
    pub token_file: Option<PathBuf>,
    /// The request id to force (default: a fresh random one).
    #[arg(long, value_name = "ID")]
    pub request_id: Option<String>,
    /// Print the headers as curl flags (`-H 'x-request-id: …' -H 'x-cpt-force: …'`).
    #[arg(long, conflicts_with = "grpcurl")]
    pub curl: bool,
    /// Print the headers as grpcurl flags (`-rpc-header 'x-request-id: …' -rpc-header …`).
    #[arg(long)]
    pub grpcurl: bool,
}

/// What `cpt force` prints: the request id and its credential.
#[derive(Clone, PartialEq, Eq)]
pub struct Forced {
    /// The `x-request-id` to send.
    pub request_id: String,
    /// The `x-cpt-force` value.
    pub credential: String,
}

impl std::fmt::Debug for Forced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forced")
            .field("request_id", &self.request_id)
            .finish_non_exhaustive()
    }
}

enum Secret {
    Key(Vec<u8>),
    Token(String),
}

fn trim_newline(mut v: Vec<u8>) -> Vec<u8> {
    if v.last() == Some(&b'\n') {
        v.pop();
        if v.last() == Some(&b'\r') {
            v.pop();
        }
    }
    v
}

fn read_secret(args: &ForceArgs) -> anyhow::Result<Secret> {
    if let Some(path) = &args.key_file {
        let key = trim_newline(
            std::fs::read(path)
                .with_context(|| format!("reading the force key file {}", path.display()))?,
        );
        if key.is_empty() {
            bail!("the force key file {} is empty", path.display());
        }
        return Ok(Secret::Key(key));
    }
    if let Some(path) = &args.token_file {
        let token =
            String::from_utf8(trim_newline(std::fs::read(path).with_context(|| {
                format!("reading the force token file {}", path.display())
            })?))
            .map_err(|_| {
                anyhow::anyhow!(
                    "the force token file {} is not UTF-8 text (a header value must be)",
                    path.display()
                )
            })?;
        if token.is_empty() {
            bail!("the force token file {} is empty", path.display());
        }
        if token.chars().any(|c| c.is_control()) {
            bail!(
                "the force token in {} contains control characters; a header value cannot",
                path.display()
            );
        }
        return Ok(Secret::Token(token));
    }
    let var = args.key_env.as_deref().unwrap_or(KEY_ENV);
    match std::env::var_os(var) {
        Some(v) if !v.is_empty() => Ok(Secret::Key(v.into_encoded_bytes())),
        Some(_) => bail!("the force key variable {var} is empty"),
        None => bail!(
            "no force key: give --key-file FILE (the key the services' ForceAuth::hmac_key has), \
             --token-file FILE, or set {var}"
        ),
    }
}

/// A request id goes into a header and the MAC: visible ASCII, no spaces.
fn check_request_id(id: &str) -> anyhow::Result<()> {
    if id.is_empty() {
        bail!("--request-id is empty");
    }
    if let Some(c) = id.chars().find(|c| !c.is_ascii_graphic()) {
        bail!(
            "--request-id {id:?} contains {c:?}; use visible ASCII without spaces (it is sent as a header)"
        );
    }
    Ok(())
}

/// Mint the headers `args` ask for.
///
/// # Errors
///
/// No key or token, an unreadable or empty key file, a bad request id.
pub fn mint(args: &ForceArgs) -> anyhow::Result<Forced> {
    let request_id = match &args.request_id {
        Some(id) => {
            check_request_id(id)?;
            id.clone()
        }
        None => cpt_sdk::force::new_request_id(),
    };
    let credential = match read_secret(args)? {
        Secret::Key(key) => cpt_sdk::force::sign(&key, &request_id),
        Secret::Token(token) => token,
    };
    Ok(Forced {
        request_id,
        credential,
    })
}

/// The text `cpt force` prints for `forced`.
pub fn render(args: &ForceArgs, forced: &Forced) -> String {
    let (id, cred) = (&forced.request_id, &forced.credential);
    let mut out = String::new();
    if args.curl {
        let _ = writeln!(
            out,
            "-H 'x-request-id: {id}' -H 'x-cpt-force: {}'",
            shell_quote_inner(cred)
        );
    } else if args.grpcurl {
        // -rpc-header: sent on the call only, not on reflection requests.
        let _ = writeln!(
            out,
            "-rpc-header 'x-request-id: {id}' -rpc-header 'x-cpt-force: {}'",
            shell_quote_inner(cred)
        );
    } else {
        let _ = writeln!(out, "x-request-id: {id}");
        let _ = writeln!(out, "x-cpt-force: {cred}");
    }
    out
}

/// The text inside single quotes: `'` becomes `'\''`.
fn shell_quote_inner(s: &str) -> String {
    s.replace('\'', r"'\''")
}

/// Run `cpt force`.
///
/// # Errors
///
/// As [`mint`].
pub fn run(args: ForceArgs) -> anyhow::Result<()> {
    let forced = mint(&args)?;
    print!("{}", render(&args, &forced));
    eprintln!(
        "cpt: send the request with exactly this x-request-id, then: cpt show --request-id {} --wait 10s …",
        forced.request_id
    );
    Ok(())
}
