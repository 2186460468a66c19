//! `cpt force` and `cpt show` as an operator runs them.

use super::*;

fn forced_record(id: &str) -> Record {
    let mut r = record("A", &[&[("A", "A1")], &[("A", "A1"), ("B", "B1")]], &[]);
    r.trigger = Trigger::Forced;
    r.request_id = Some(id.into());
    r.trace_id = Some("4bf92f3577b34da6a3ce929d0e0e4736".into());
    r
}

/// The `x-cpt-force` value in `cpt force`'s plain output.
fn credential_of(out: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix("x-cpt-force: "))
        .unwrap_or_else(|| panic!("no credential in {out}"))
        .to_owned()
}

/// Whether `cred` is a version-1 credential for `request_id` on `service`
/// under `key`, expiring within `ttl_secs` from now.
fn assert_credential(cred: &str, key: &[u8], request_id: &str, service: &str, ttl_secs: u64) {
    let p = cpt_sdk::force::parse(cred).unwrap_or_else(|e| panic!("{cred}: {e}"));
    assert!(p.mac_matches(key, request_id), "{cred}");
    assert_eq!(p.service(), service);
    let now = cpt_sdk::force::now_unix_secs();
    let expires = p.expires_unix_secs();
    assert!(
        expires <= now + ttl_secs && expires + 60 >= now + ttl_secs,
        "expires {expires}, now {now}, ttl {ttl_secs}"
    );
}

#[test]
fn force_prints_the_request_id_and_its_mac_never_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let key = write(dir.path(), "force.key", b"s3cret-ops-key\n");
    let base = [
        "force",
        "--key-file",
        s(&key),
        "--request-id",
        "req-7",
        "--service",
        "A",
    ];
    let (out, err) = run(&base, true);
    assert!(
        out.starts_with("x-request-id: req-7\nx-cpt-force: cpt1."),
        "{out}"
    );
    let cred = credential_of(&out);
    assert_credential(&cred, b"s3cret-ops-key", "req-7", "A", 300);
    assert!(
        err.contains("valid for service A")
            && err.contains("once per service process")
            && err.contains("across its restarts only where it sets CPT_STATE_DIR"),
        "{err}"
    );
    let (curl, _) = run(&[&base[..], &["--curl"]].concat(), true);
    assert!(
        curl.starts_with("-H 'x-request-id: req-7' -H 'x-cpt-force: cpt1."),
        "{curl}"
    );
    let (grpcurl, _) = run(&[&base[..], &["--grpcurl"]].concat(), true);
    assert!(
        grpcurl.starts_with("-rpc-header 'x-request-id: req-7' -rpc-header 'x-cpt-force: cpt1.")
    );
    for text in [&out, &curl, &err] {
        assert!(!text.contains("s3cret"), "the key was echoed: {text}");
    }
    // Two credentials for the same request differ (a nonce each).
    let (again, _) = run(&base, true);
    assert_ne!(credential_of(&again), cred);
    // A generated request id: fresh on each run, with its own credential.
    let (a, _) = run(&["force", "--key-file", s(&key), "--service", "*"], true);
    let (b, _) = run(&["force", "--key-file", s(&key), "--service", "*"], true);
    assert_ne!(a, b);
    let id = a
        .lines()
        .next()
        .unwrap()
        .strip_prefix("x-request-id: ")
        .unwrap();
    assert_credential(&credential_of(&a), b"s3cret-ops-key", id, "*", 300);
}

#[test]
fn force_ttl_sets_the_expiry_and_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let key = write(dir.path(), "force.key", b"k");
    let base = [
        "force",
        "--key-file",
        s(&key),
        "--request-id",
        "r",
        "--service",
        "A",
    ];
    let (out, _) = run(&[&base[..], &["--ttl", "90s"]].concat(), true);
    assert_credential(&credential_of(&out), b"k", "r", "A", 90);
    let (_, err) = run(&[&base[..], &["--ttl", "2h"]].concat(), false);
    assert!(err.contains("longer than 3600s"), "{err}");
    let (_, err) = run(&[&base[..], &["--ttl", "0s"]].concat(), false);
    assert!(err.contains("at least one second"), "{err}");
    let (_, err) = run(&["force", "--key-file", s(&key)], false);
    assert!(err.contains("--service"), "{err}");
}

#[test]
fn force_reads_the_key_from_the_environment_or_a_token_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cpt"))
        .args(["force", "--request-id", "r1", "--service", "A"])
        .env("CPT_FORCE_KEY", "env-key")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert_credential(&credential_of(&text), b"env-key", "r1", "A", 300);
    let out = Command::new(env!("CARGO_BIN_EXE_cpt"))
        .args([
            "force",
            "--request-id",
            "r1",
            "--key-env",
            "MY_KEY",
            "--service",
            "A",
        ])
        .env("MY_KEY", "other-key")
        .env_remove("CPT_FORCE_KEY")
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert_credential(&credential_of(&text), b"other-key", "r1", "A", 300);
    // A token is a key too: the credential is minted from it, and the token
    // itself is never printed.
    let token = write(dir.path(), "token", b"tok-123\n");
    let (text, _) = run(
        &[
            "force",
            "--token-file",
            s(&token),
            "--request-id",
            "r1",
            "--service",
            "A",
        ],
        true,
    );
    assert!(!text.contains("tok-123"), "{text}");
    assert_credential(&credential_of(&text), b"tok-123", "r1", "A", 300);
}

#[test]
fn force_without_a_key_or_with_a_bad_request_id_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cpt"))
        .args(["force", "--service", "A"])
        .env_remove("CPT_FORCE_KEY")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("no force key: give --key-file FILE"), "{err}");
    let empty = write(dir.path(), "empty.key", b"");
    let (_, err) = run(&["force", "--key-file", s(&empty), "--service", "A"], false);
    assert!(err.contains("is empty"), "{err}");
    let key = write(dir.path(), "k", b"k");
    let (_, err) = run(
        &[
            "force",
            "--key-file",
            s(&key),
            "--request-id",
            "a b",
            "--service",
            "A",
        ],
        false,
    );
    assert!(err.contains("visible ASCII without spaces"), "{err}");
    let (_, err) = run(&["force", "--key-file", s(&key), "--service", "a b"], false);
    assert!(err.contains("--service"), "{err}");
}

#[test]
fn show_prints_the_tree_and_the_trace_link_from_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut other = entry("a");
    other.request_id = Some("req-other".into());
    let file = write(
        dir.path(),
        "r.jsonl",
        &jsonl(&[other, forced_record("req-1")]),
    );
    let (out, _) = run(
        &[
            "show",
            s(&file),
            "--request-id",
            "req-1",
            "--trace-url",
            "http://jaeger:16686/trace/{trace_id}",
        ],
        true,
    );
    assert!(out.contains("request req-1 · A · forced"), "{out}");
    assert!(out.contains("B1 (B)"), "{out}");
    assert!(out.contains("★ slowest #1"), "{out}");
    assert!(
        out.contains("trace: http://jaeger:16686/trace/4bf92f3577b34da6a3ce929d0e0e4736"),
        "{out}"
    );
}

#[test]
fn show_of_an_unknown_request_id_fails_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "r.jsonl", &jsonl(&[forced_record("req-1")]));
    let flame = dir.path().join("out.svg");
    let (_, err) = run(
        &[
            "show",
            s(&file),
            "--request-id",
            "nope",
            "--flame",
            s(&flame),
        ],
        false,
    );
    assert!(err.contains("no record with request id \"nope\""), "{err}");
    assert!(err.contains("try --wait"), "{err}");
    assert!(!flame.exists());
}

#[test]
fn show_on_a_store_an_older_cpt_wrote_says_how_to_upgrade_and_import_does_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("old.db");
    let r = forced_record("req-1");
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch(
            "CREATE TABLE records (id INTEGER PRIMARY KEY, service TEXT NOT NULL, endpoint TEXT,
                start_unix_nanos INTEGER, latency_ns INTEGER NOT NULL, trigger TEXT NOT NULL,
                labels TEXT NOT NULL DEFAULT '{}', record TEXT NOT NULL);
             PRAGMA user_version = 1;",
        )
        .unwrap();
        conn.execute(
            "INSERT INTO records (service, latency_ns, trigger, record) VALUES ('A', 1, 'forced', ?1)",
            [r.to_json()],
        )
        .unwrap();
    }
    let before = std::fs::read(&db).unwrap();
    let (_, err) = run(&["show", "--store", s(&db), "--request-id", "req-1"], false);
    assert!(
        err.contains("older cpt (schema version 1)") && err.contains("cpt import --store"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&db).unwrap(),
        before,
        "show wrote to the store"
    );
    let (out, _) = run(&["import", "--store", s(&db)], true);
    let migrated = format!(
        "schema version {}, 1 record",
        cpt_collector::store::SCHEMA_VERSION
    );
    assert!(out.contains(&migrated), "{out}");
    let (out, _) = run(&["show", "--store", s(&db), "--request-id", "req-1"], true);
    assert!(out.contains("B1 (B)"), "{out}");
}

#[test]
fn show_with_a_collector_that_is_down_fails_clearly() {
    // A port nobody listens on: bind, note it, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let (_, err) = run(&["show", "--collector", &url, "--request-id", "r"], false);
    assert!(err.contains("cannot reach the collector at"), "{err}");
}
