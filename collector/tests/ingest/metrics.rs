//! `GET /metrics`: the Prometheus text format (`promtool check metrics`
//! accepts it), behind the read token unless `--metrics-open`, and its
//! counters are the collector's own.

use cpt_collector::ingest::CONTENT_TYPE_JSON_LINES;
use cpt_collector::serve::RetentionConfig;

use crate::support::*;

fn get(addr: std::net::SocketAddr, auth: Option<&str>) -> HttpResponse {
    let mut headers = vec![];
    let bearer;
    if let Some(t) = auth {
        bearer = format!("Bearer {t}");
        headers.push(("Authorization", bearer.as_str()));
    }
    http_with_headers(addr, "GET", "/metrics", &headers, b"").unwrap()
}

/// `name{labels} value` of the first sample whose name and labels start
/// with `series`.
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (s, v) = l.rsplit_once(' ')?;
            (s == series).then(|| v.parse().ok()).flatten()
        })
        .unwrap_or_else(|| panic!("{series} missing from\n{text}"))
}

/// `promtool check metrics` on `text`: `None` when promtool is not
/// installed (CI installs it and sets CPT_REQUIRE_PROMTOOL=1, which turns a
/// missing promtool into a failure).
pub(crate) fn promtool(text: &str) -> Option<(bool, String)> {
    use std::io::Write;
    let child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                std::env::var_os("CPT_REQUIRE_PROMTOOL").is_none(),
                "CPT_REQUIRE_PROMTOOL is set but promtool is not installed (Debian: prometheus)"
            );
            return None;
        }
        Err(e) => panic!("promtool: {e}"),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    Some((
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    ))
}

#[test]
fn metrics_are_prometheus_text_behind_the_read_token_and_count_what_happened() {
    let c = TestCollector::start(|c| {
        c.with_read_token("s3cret")
            .with_retention(RetentionConfig::default())
    });
    let addr = c.http();
    let ok = records("m", 30);
    assert_eq!(
        post_records(addr, CONTENT_TYPE_JSON_LINES, &json_lines(&ok)).status,
        200
    );
    assert_eq!(
        post_records(addr, CONTENT_TYPE_JSON_LINES, b"{not json\n").status,
        400
    );
    let mut old = records("old", 5);
    for r in &mut old {
        r.start_unix_nanos = Some(an_hour_ago() - 30 * 86_400_000_000_000);
    }
    // Two of them forced: never rolled up, so not kept, and counted apart.
    for r in &mut old[..2] {
        r.trigger = cpt_sdk::Trigger::Forced;
    }
    assert_eq!(
        post_records(addr, CONTENT_TYPE_JSON_LINES, &json_lines(&old)).status,
        200
    );
    assert_eq!(
        get(addr, None).status,
        401,
        "the read token guards /metrics"
    );
    // The gauges follow the writer's upkeep (at least once a second).
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let resp = get(addr, Some("s3cret"));
    assert_eq!(resp.status, 200);
    assert_eq!(
        resp.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let text = resp.text();
    assert_eq!(value(&text, "cpt_records_accepted_total"), 35.0);
    assert_eq!(value(&text, "cpt_batches_accepted_total"), 2.0);
    assert_eq!(
        value(&text, r#"cpt_batches_rejected_total{reason="malformed"}"#),
        1.0
    );
    assert_eq!(value(&text, "cpt_records_too_old_total"), 5.0);
    assert_eq!(value(&text, "cpt_forced_records_too_old_total"), 2.0);
    assert_eq!(
        value(&text, "cpt_forced_records_deleted_by_retention_total"),
        0.0
    );
    assert_eq!(value(&text, "cpt_rollups_deleted_for_size_total"), 0.0);
    assert_eq!(value(&text, "cpt_ingest_ack_seconds_count"), 2.0);
    assert_eq!(
        value(&text, r#"cpt_ingest_ack_seconds_bucket{le="+Inf"}"#),
        2.0
    );
    assert!(value(&text, "cpt_store_used_bytes") > 0.0);
    assert!(value(&text, "cpt_oldest_raw_record_age_seconds") >= 3_600.0);
    assert!(value(&text, "cpt_open_connections") >= 1.0);
    if let Some((ok, out)) = promtool(&text) {
        assert!(ok, "promtool check metrics refused it:\n{out}\n{text}");
    }
}

#[test]
fn metrics_open_answers_without_the_read_token() {
    let c = TestCollector::start(|mut c| {
        c.metrics_open = true;
        c.with_read_token("s3cret")
    });
    let resp = get(c.http(), None);
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert!(resp.text().contains("cpt_records_accepted_total 0"));
    // Only /metrics: the records stay behind the token.
    let records = http(c.http(), "GET", "/v1/records?limit=1", "text/plain", b"").unwrap();
    assert_eq!(records.status, 401);
}

/// The operations page's scrape configuration and alert rules are what
/// promtool accepts (`docs/src/operations/retention.md`).
#[test]
fn the_books_scrape_config_and_alert_rules_pass_promtool() {
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/src/operations/retention.md"
    ))
    .unwrap();
    let blocks: Vec<&str> = page
        .split("```yaml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .collect();
    assert_eq!(blocks.len(), 2, "a scrape config and the alert rules");
    if !promtool_installed() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "t").unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        blocks[0].replace("/etc/prometheus/cpt-read-token", token.to_str().unwrap()),
    )
    .unwrap();
    let rules = dir.path().join("cpt-alerts.yml");
    std::fs::write(&rules, blocks[1]).unwrap();
    for (what, file) in [("config", &config), ("rules", &rules)] {
        let out = std::process::Command::new("promtool")
            .args(["check", what])
            .arg(file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool check {what}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
