//! A force credential used twice shows: the second forced record carrying
//! the same nonce is stored with `cpt.force.replayed=true`, also when the
//! collector restarted between the two.

use crate::support::*;
use cpt_collector::ingest::CONTENT_TYPE_JSON_LINES;
use cpt_collector::serve::{Collector, ServeConfig};
use cpt_sdk::Trigger;
use cpt_sdk::force::{NONCE_LABEL, REPLAYED_LABEL};
use cpt_sdk::record::Record;

/// A forced record of request `req-7` started `ago_secs` seconds ago,
/// forced by the credential with `nonce`.
fn forced(nonce: &str, ago_secs: u64) -> Record {
    let mut r = record("forced", 0);
    r.trigger = Trigger::Forced;
    r.request_id = Some("req-7".into());
    let now = cpt_sdk::force::now_unix_secs();
    r.start_unix_nanos = Some((now - ago_secs) * 1_000_000_000);
    r.labels.insert(NONCE_LABEL.into(), nonce.into());
    r
}

fn send(addr: std::net::SocketAddr, records: &[Record]) {
    let resp = post_records(addr, CONTENT_TYPE_JSON_LINES, &json_lines(records));
    assert_eq!(resp.status, 200, "{}", resp.text());
}

fn replayed(stored: &[Record]) -> Vec<bool> {
    stored
        .iter()
        .map(|r| r.labels.get(REPLAYED_LABEL).map(String::as_str) == Some("true"))
        .collect()
}

#[test]
fn a_second_forced_record_with_a_credentials_nonce_is_labelled_replayed_across_a_restart() {
    let mut c = TestCollector::start(|c| c);
    let first = forced("5d1c0e5b1f2d3c9a8b7c6d5e4f3a2b10", 60);
    send(c.http(), std::slice::from_ref(&first));
    // The same record again (a retry): not a replay.
    send(c.http(), std::slice::from_ref(&first));
    send(c.http(), &[forced("5d1c0e5b1f2d3c9a8b7c6d5e4f3a2b10", 30)]);
    assert_eq!(replayed(&c.stored()), [false, false, true]);
    // Restart the collector on the same store: it reads the nonce back.
    let served = c.collector.take().unwrap();
    c.rt.block_on(served.shutdown()).unwrap();
    let config = ServeConfig::new(&c.store).with_http("127.0.0.1:0".parse().unwrap());
    c.collector = Some(c.rt.block_on(Collector::start(config)).unwrap());
    send(
        c.http(),
        &[
            forced("5d1c0e5b1f2d3c9a8b7c6d5e4f3a2b10", 10),
            forced("0f0f0e5b1f2d3c9a8b7c6d5e4f3a2b10", 10),
        ],
    );
    assert_eq!(replayed(&c.stored()), [false, false, true, true, false]);
}
