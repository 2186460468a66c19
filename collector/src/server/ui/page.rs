//! What every page shares: the HTML frame, escaping, query strings, the
//! selection a page's query describes, and error pages.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::response::{IntoResponse, Response};
use http::{StatusCode, header};

use crate::records::query;
use crate::records::selection::{Selection, format_time};
use crate::server::store::{Store, StoreError};

/// `s` with `& < > " '` escaped, for HTML text and attribute values, and
/// every other character as a reader is shown it
/// ([`push_visible`](crate::visible::push_visible)): control characters as
/// their control pictures (`␀`, `␛`), bidirectional and invisible ones as
/// `⟨U+202E⟩`, never written raw into the page.
pub(super) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => crate::visible::push_visible(&mut out, c),
        }
    }
    out
}

/// A decoded query string: its `key=value` pairs in order.
#[derive(Clone, Debug, Default)]
pub(super) struct Params(pub(super) Vec<(String, String)>);

impl Params {
    /// Decode `query` (`None`: empty).
    pub(super) fn parse(q: Option<&str>) -> Result<Params, String> {
        query::decode(q.unwrap_or(""))
            .map(Params)
            .map_err(|e| e.to_string())
    }

    /// The first non-empty value of `key`.
    pub(super) fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, v)| k == key && !v.is_empty())
            .map(|(_, v)| v.as_str())
    }

    /// The pairs as a query string, empty values left out.
    pub(super) fn query(&self) -> String {
        query::encode(
            self.0
                .iter()
                .filter(|(_, v)| !v.is_empty())
                .map(|(k, v)| (k, v)),
        )
    }

    /// Only the pairs whose key is not in `drop`.
    pub(super) fn without(&self, drop: &[&str]) -> Params {
        Params(
            self.0
                .iter()
                .filter(|(k, _)| !drop.contains(&k.as_str()))
                .cloned()
                .collect(),
        )
    }
}

/// Keys a selection query may have besides [`Selection::set`]'s.
pub(super) const LAST: &str = "last";

/// The selection `params` describe: [`Selection::set`]'s keys, plus
/// `last=DURATION` (since that long before now); keys in `skip` are the
/// page's own and are ignored. Empty values are ignored too (an empty form
/// field).
pub(super) fn selection(params: &Params, skip: &[&str]) -> Result<Selection, String> {
    let mut sel = Selection::new();
    for (k, v) in &params.0 {
        if v.is_empty() || skip.contains(&k.as_str()) {
            continue;
        }
        if k == LAST {
            let d = humantime::parse_duration(v)
                .map_err(|e| format!("last={v:?}: {e} (expected e.g. 15m, 1h, 7d)"))?;
            sel = sel.with_since(now_unix_nanos().saturating_sub(nanos(d)));
            continue;
        }
        sel.set(k, v).map_err(|e| e.to_string())?;
    }
    Ok(sel)
}

/// A selection as `cpt profile`'s flags (for "the same in the CLI").
pub(super) fn cli_flags(sel: &Selection) -> String {
    let mut out = String::new();
    let mut flag = |k: &str, v: &str| {
        let _ = write!(out, " --{k} {}", shell_word(v));
    };
    if let Some(s) = sel.service() {
        flag("service", s);
    }
    if let Some(e) = sel.endpoint() {
        flag("endpoint", e);
    }
    let (since, until) = sel.time_range();
    if let Some(t) = since {
        flag("since", &format_time(t));
    }
    if let Some(t) = until {
        flag("until", &format_time(t));
    }
    for (k, v) in sel.labels() {
        flag("label", &format!("{k}={v}"));
    }
    if let Some(b) = sel.percentile() {
        flag("percentile", &b.to_string());
    }
    if let Some(id) = sel.request_id() {
        flag("request-id", id);
    }
    if let Some(id) = sel.trace_id() {
        flag("trace-id", id);
    }
    if sel.triggers() != crate::records::selection::TriggerFilter::Sampled
        && sel.request_id().is_none()
        && sel.trace_id().is_none()
    {
        flag("trigger", sel.triggers().as_str());
    }
    out
}

/// A word quoted for a POSIX shell when it needs it.
fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:/=@,+".contains(&b))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

pub(super) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

pub(super) fn now_unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, nanos)
}

/// "3 min ago" for a past Unix time, RFC 3339 in the title.
pub(super) fn ago(unix_nanos: u64) -> String {
    let now = now_unix_nanos();
    let secs = now.saturating_sub(unix_nanos) / 1_000_000_000;
    let rel = match secs {
        0..=59 => format!("{secs} s ago"),
        60..=3599 => format!("{} min ago", secs / 60),
        3600..=86_399 => format!("{} h ago", secs / 3600),
        _ => format!("{} d ago", secs / 86_400),
    };
    let at = format_time(unix_nanos);
    format!(r#"<time datetime="{at}" title="{at}">{rel}</time>"#)
}

/// Which tab of the navigation is lit.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Tab {
    Services,
    Profile,
    Diff,
    Request,
    None,
}

/// A whole page: `title` in the tab and the heading, `body` inside `<main>`.
pub(super) fn html(tab: Tab, title: &str, head_extra: &str, body: &str) -> String {
    let nav = |t: Tab, href: &str, label: &str| {
        let cur = if t == tab {
            r#" aria-current="page""#
        } else {
            ""
        };
        format!(r#"<a href="{href}"{cur}>{label}</a>"#)
    };
    format!(
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="color-scheme" content="light dark">
<title>{t} · cpt</title>
<link rel="stylesheet" href="/ui/style.css">
{head_extra}</head>
<body>
<header><nav><a class="brand" href="/">cpt</a>{n1}{n2}{n3}{n4}</nav></header>
<main>
<h1>{t}</h1>
{body}
</main>
</body>
</html>
"#,
        t = esc(title),
        n1 = nav(Tab::Services, "/", "Services"),
        n2 = nav(Tab::Profile, "/ui/profile", "Profile"),
        n3 = nav(Tab::Diff, "/ui/diff", "Compare"),
        n4 = nav(Tab::Request, "/ui/request", "Request"),
    )
}

/// An HTML response. Pages are read-only views of live data: never cached.
pub(super) fn respond(status: StatusCode, body: String) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

/// A page that says what was wrong and what to do.
pub(super) fn error(status: StatusCode, tab: Tab, title: &str, msg: &str) -> Response {
    respond(
        status,
        html(
            tab,
            title,
            "",
            &format!(r#"<p class="error">{}</p>"#, esc(msg)),
        ),
    )
}

/// A 303 to `to` (a local path).
pub(super) fn redirect(to: &str) -> Response {
    crate::server::edge::routes::see_other(to)
}

/// Why a page could not be built.
pub(super) enum PageError {
    /// The query is wrong: the message says how.
    BadQuery(String),
    /// The store failed; the detail goes to the collector's log.
    Store(StoreError),
}

impl From<StoreError> for PageError {
    fn from(e: StoreError) -> Self {
        PageError::Store(e)
    }
}

impl PageError {
    pub(super) fn respond(self, tab: Tab, what: &str) -> Response {
        match self {
            PageError::BadQuery(msg) => error(StatusCode::BAD_REQUEST, tab, what, &msg),
            PageError::Store(e) => {
                eprintln!("cpt serve: page {what} failed: {e}");
                error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    tab,
                    what,
                    "the store could not be read (the collector's log has the detail); retry later",
                )
            }
        }
    }
}

/// Open the store read-only and run `f` as a read (pages read SQLite and
/// fold records: never on the async workers, and below ingest's priority).
pub(super) async fn with_store<T: Send + 'static>(
    path: &std::path::Path,
    f: impl FnOnce(&Store) -> Result<T, PageError> + Send + 'static,
) -> Result<T, PageError> {
    let path = path.to_path_buf();
    crate::server::edge::reads::run(move || {
        let store = Store::open_read_only(&path)?;
        f(&store)
    })
    .await
    .unwrap_or_else(|e| {
        Err(PageError::BadQuery(format!(
            "the page's task failed: {e}; retry"
        )))
    })
}

/// A small SVG whose filled width shows a share (0..=1) as a bar. (An
/// attribute, not an inline style: the pages' policy allows no inline
/// style.)
pub(super) fn bar(share: f64) -> String {
    let pct = (share.clamp(0.0, 1.0) * 100.0).max(0.0);
    format!(
        r#"<svg class="bar" viewBox="0 0 100 1" preserveAspectRatio="none" aria-hidden="true"><rect width="{pct:.1}" height="1"/></svg>"#
    )
}

/// A selection's form fields (service, endpoint, range, percentile, label,
/// trigger), filled from `params`, with field names prefixed by `prefix`
/// (`""` for a profile; diff arms use whole query strings instead).
pub(super) fn selection_fields(params: &Params) -> String {
    let v = |k: &str| esc(params.get(k).unwrap_or(""));
    let trig = params.get("trigger").unwrap_or("sampled");
    let opt = |x: &str| {
        let sel = if trig == x { " selected" } else { "" };
        format!(r#"<option{sel}>{x}</option>"#)
    };
    format!(
        r#"<label>service <input name="service" value="{}" placeholder="any"></label>
<label>endpoint <input name="endpoint" value="{}" placeholder="any"></label>
<label>last <input name="last" value="{}" placeholder="e.g. 1h" size="6"></label>
<label>since <input name="since" value="{}" placeholder="RFC 3339 or Unix ns" size="22"></label>
<label>until <input name="until" value="{}" placeholder="RFC 3339 or Unix ns" size="22"></label>
<label>percentile <input name="percentile" value="{}" placeholder="e.g. p99-p100" size="10"></label>
<label>label <input name="label" value="{}" placeholder="key=value" size="14"></label>
<label>trigger <select name="trigger">{}{}{}</select></label>"#,
        v("service"),
        v("endpoint"),
        v(LAST),
        v("since"),
        v("until"),
        v("percentile"),
        v("label"),
        opt("sampled"),
        opt("forced"),
        opt("all"),
    )
}

/// The selection as a `GET /profile` query (absolute times, every key
/// explicit): a permanent link to the same records.
pub(super) fn selection_query(sel: &Selection) -> String {
    sel.to_query()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            esc(r#"<a href="x">&'"#),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }

    #[test]
    fn params_round_trip_through_a_query() {
        let p = Params::parse(Some("service=A&label=arm%3Db&endpoint=&x=a+b")).unwrap();
        assert_eq!(p.get("label"), Some("arm=b"));
        assert_eq!(p.get("endpoint"), None);
        assert_eq!(p.get("x"), Some("a b"));
        assert_eq!(p.query(), "service=A&label=arm%3Db&x=a+b");
        assert!(Params::parse(Some("a=%zz")).is_err());
    }

    #[test]
    fn control_characters_never_reach_the_page_raw() {
        assert_eq!(
            esc("a\0b\x1bc\x7fd\u{85}e\tf\u{202e}<"),
            "a\u{2400}b\u{241b}c\u{2421}d⟨U+0085⟩e\u{2409}f⟨U+202E⟩&lt;"
        );
    }

    #[test]
    fn selection_takes_last_and_skips_page_keys() {
        let p = Params::parse(Some("service=A&last=1h&top=5&trigger=")).unwrap();
        let sel = selection(&p, &["top"]).unwrap();
        assert_eq!(sel.service(), Some("A"));
        let since = sel.time_range().0.unwrap();
        let hour = 3_600_000_000_000;
        assert!(now_unix_nanos() - since >= hour && now_unix_nanos() - since < 2 * hour);
        let e = selection(&Params::parse(Some("last=soon")).unwrap(), &[]).unwrap_err();
        assert!(e.contains("last=\"soon\""), "{e}");
        let e = selection(&Params::parse(Some("colour=red")).unwrap(), &[]).unwrap_err();
        assert!(e.contains("colour"), "{e}");
    }

    #[test]
    fn cli_flags_quote_what_a_shell_would_split() {
        let sel = Selection::from_query("service=A&label=arm%3Db%20c").unwrap();
        assert_eq!(cli_flags(&sel), " --service A --label 'arm=b c'");
    }
}
