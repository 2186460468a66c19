//! `cpt force`: mint the headers that force a trace on one request.
//!
//! The credential ([`cpt_sdk::force`], version 1) is an HMAC-SHA256 under
//! the services' force key (or a token configured as one) over the request
//! id, the service it is for (`--service`, or `*`), its expiry (`--ttl`,
//! default five minutes) and a nonce: valid for that request id on that
//! service, once, until it expires. The key or token is read from a file
//! (`--key-file` / `--token-file`) or an environment variable
//! (`CPT_FORCE_KEY`, or `--key-env VAR`), never from the command line (it
//! would land in shell history and `ps`), and never printed.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context as _, bail};

/// The environment variable the key is read from when no other source is given.
pub const KEY_ENV: &str = "CPT_FORCE_KEY";

/// Print `x-request-id` and `x-cpt-force` headers that force a trace on one request. The key
/// (or token) comes from --key-file, --token-file, --key-env VAR or CPT_FORCE_KEY; it is never
/// printed. Send the request with exactly this request id to the --service named: the
/// credential is valid for that request id on that service only, once, until --ttl passes.
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
    /// The service the credential is for: the name its ServerLayer was given (usually the entry
    /// service the request is sent to), or `*` for any service that has the key.
    #[arg(long, value_name = "NAME", required = true)]
    pub service: String,
    /// How long the credential stays valid (e.g. 5m, 90s; at most 1h, what services accept).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_ttl)]
    pub ttl: std::time::Duration,
    /// Print the headers as curl flags (`-H 'x-request-id: …' -H 'x-cpt-force: …'`).
    #[arg(long, conflicts_with = "grpcurl")]
    pub curl: bool,
    /// Print the headers as grpcurl flags (`-rpc-header 'x-request-id: …' -rpc-header …`).
    #[arg(long)]
    pub grpcurl: bool,
}

fn parse_ttl(s: &str) -> Result<std::time::Duration, String> {
    let d =
        humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e} (expected e.g. 5m, 90s)"))?;
    if d.as_secs() == 0 {
        return Err(format!("{s:?}: a credential must live at least one second"));
    }
    if d.as_secs() > cpt_sdk::force::MAX_TTL_SECS {
        return Err(format!(
            "{s:?}: services refuse credentials living longer than {}s (1h); mint a new one when needed",
            cpt_sdk::force::MAX_TTL_SECS
        ));
    }
    Ok(d)
}

/// What `cpt force` prints: the request id and its credential.
pub type Forced = cpt_sdk::force::Minted;

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
    anyhow::ensure!(
        cpt_sdk::force::valid_service(&args.service),
        "--service {:?}: a service name is visible ASCII without spaces (or `*` for any service)",
        args.service
    );
    let key = match read_secret(args)? {
        Secret::Key(key) => key,
        // A token is a key: the credential is minted from it, never the
        // token itself.
        Secret::Token(token) => token.into_bytes(),
    };
    let credential = cpt_sdk::force::mint(
        &key,
        &request_id,
        &args.service,
        args.ttl.as_secs(),
        cpt_sdk::force::now_unix_secs(),
    );
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
        "cpt: valid for service {} (`*`: any), for the next {}, once per service process (across \
         its restarts only where it sets CPT_STATE_DIR; another replica accepts it once more); send \
         the request with exactly this x-request-id, then: cpt show --request-id {} --wait 10s …",
        args.service,
        humantime::format_duration(args.ttl),
        forced.request_id
    );
    Ok(())
}
