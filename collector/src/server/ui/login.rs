//! `/ui/login`: the read-token form. `POST` checks the token through the
//! same [`ReadGate::allows`](super::ReadGate::allows) every page uses, and
//! on success sets the cookie [`READ_COOKIE`] (`HttpOnly`: no script reads
//! it; `SameSite=Strict`: no other site's page sends it; `Path=/`: the API
//! accepts it too; `Secure` when the pages are served over TLS, so the
//! browser never sends it over plain HTTP) and sends the browser back where
//! it was going ([`local_next`]: a path on this site, nothing else). A wrong
//! token gets the form again with 401, and nothing is set. `POST
//! /ui/logout` clears the cookie. Both POSTs are taken from this
//! collector's own pages only (the route guard's same-origin check), so
//! another site can neither sign a browser in nor out.

use axum::Extension;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::response::Response;
use http::{HeaderMap, HeaderValue, StatusCode, header};

use super::page::{self, Params, Tab, esc};
use super::{READ_COOKIE, UiState};
use crate::server::edge::authority::Origin;

/// Where to go after signing in: a path on this site, else `/`.
///
/// Accepted is one `/` followed by neither `/` nor `\`, with no control
/// character or whitespace anywhere (browsers drop a tab or a newline from
/// a URL, so `/<TAB>/host` would become `//host`, another site) and no
/// backslash (browsers read it as `/`). `next` arrives decoded once; a
/// percent-encoded `%2F` left in it is a literal in the path, harmless.
fn local_next(next: Option<&str>) -> String {
    let ok = |n: &str| {
        let b = n.as_bytes();
        b.first() == Some(&b'/')
            && !matches!(b.get(1), Some(b'/' | b'\\'))
            && !n
                .chars()
                .any(|c| c.is_control() || c.is_whitespace() || c == '\\')
    };
    match next {
        Some(n) if ok(n) => n.to_owned(),
        _ => "/".to_owned(),
    }
}

fn form_html(next: &str, problem: Option<&str>, open: bool) -> String {
    let problem = problem
        .map(|p| format!(r#"<p class="error" id="login-error">{}</p>"#, esc(p)))
        .unwrap_or_default();
    let open_note = if open {
        r#"<p class="note">This collector has no read token configured: every page is open, and forced requests are shown to nobody.</p>"#
    } else {
        ""
    };
    format!(
        r#"{open_note}<p>This collector's pages need its read token (the content of the file given to <code>cpt serve --read-token-file</code>). It is kept in an HttpOnly cookie for this site only.</p>
{problem}<form class="login" method="post" action="/ui/login">
<input type="hidden" name="next" value="{}">
<label>read token <input type="password" name="token" autocomplete="current-password" required autofocus></label>
<button>Sign in</button>
</form>
<form class="login" method="post" action="/ui/logout"><button class="secondary">Sign out</button></form>
"#,
        esc(next)
    )
}

fn form_page(state: &UiState, next: &str) -> Response {
    page::respond(
        StatusCode::OK,
        page::html(
            Tab::None,
            "Sign in",
            "",
            &form_html(next, None, state.gate.is_open()),
        ),
    )
}

pub(super) async fn form(State(state): State<UiState>, RawQuery(q): RawQuery) -> Response {
    let params = Params::parse(q.as_deref()).unwrap_or_default();
    let next = local_next(params.get("next"));
    form_page(&state, &next)
}

pub(super) async fn submit(
    State(state): State<UiState>,
    origin: Option<Extension<Origin>>,
    body: Bytes,
) -> Response {
    let text = String::from_utf8_lossy(&body);
    let params = Params::parse(Some(&text)).unwrap_or_default();
    let next = local_next(params.get("next"));
    let token = params.get("token").unwrap_or("").trim().to_owned();
    let refuse = |msg: &str| {
        page::respond(
            StatusCode::UNAUTHORIZED,
            page::html(
                Tab::None,
                "Sign in",
                "",
                &form_html(&next, Some(msg), state.gate.is_open()),
            ),
        )
    };
    if state.gate.is_open() {
        return page::redirect(&next);
    }
    // A token a cookie cannot carry (RFC 6265 cookie-octets) is still good
    // in the Authorization header.
    if token.is_empty()
        || !token
            .bytes()
            .all(|b| b.is_ascii_graphic() && !b"\";,\\".contains(&b))
    {
        return refuse(
            "That is not this collector's read token. (A token with quotes, commas, semicolons or backslashes cannot be kept in a cookie: send it as Authorization: Bearer instead.)",
        );
    }
    let mut presented = HeaderMap::new();
    let Ok(bearer) = HeaderValue::from_str(&format!("Bearer {token}")) else {
        return refuse("That is not this collector's read token.");
    };
    presented.insert(header::AUTHORIZATION, bearer);
    if !state.gate.allows(&presented) {
        return refuse("That is not this collector's read token.");
    }
    let mut resp = page::redirect(&next);
    if let Ok(cookie) = HeaderValue::from_str(&cookie(secure(&state, origin), &token, "")) {
        resp.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    resp
}

/// Whether the sign-in cookie is `Secure`: the pages are served over TLS,
/// or the browser reached them over HTTPS through a trusted proxy (the
/// origin the route guard found).
fn secure(state: &UiState, origin: Option<Extension<Origin>>) -> bool {
    state.tls || origin.is_some_and(|o| o.0.is_https())
}

/// The `Set-Cookie` value carrying `token`, with `extra` attributes.
fn cookie(secure: bool, token: &str, extra: &str) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{READ_COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/{secure}{extra}")
}

pub(super) async fn logout(
    State(state): State<UiState>,
    origin: Option<Extension<Origin>>,
) -> Response {
    let mut resp = page::redirect("/ui/login");
    if let Ok(cleared) = HeaderValue::from_str(&cookie(secure(&state, origin), "", "; Max-Age=0")) {
        resp.headers_mut().insert(header::SET_COOKIE, cleared);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_stays_on_this_site() {
        // (case, `next` as the form sends it, percent-encoded; where the browser goes)
        #[rustfmt::skip]
        let cases: &[(&str, &str, &str)] = &[
            ("a page",              "%2Fui%2Fprofile%3Fservice%3DA", "/ui/profile?service=A"),
            ("root",                "%2F",                  "/"),
            ("encoded slash kept",  "%2Fui%252F%252Fx",     "/ui%2F%2Fx"),
            ("scheme-relative",     "%2F%2Fevil.example",   "/"),
            ("absolute",            "https%3A%2F%2Fevil.example%2F", "/"),
            ("backslash",           "%2F%5Cevil.example",   "/"),
            ("backslash later",     "%2Fa%5C..%5C%5Cevil",  "/"),
            ("tab",                 "%2F%09%2Fevil.example", "/"),
            ("newline",             "%2F%0A%2Fevil.example", "/"),
            ("carriage return",     "%2F%0D%2Fevil.example", "/"),
            ("space",               "%2F%20%2Fevil.example", "/"),
            ("plus is a space",     "%2F+%2Fevil.example",  "/"),
            ("nul",                 "%2F%00%2Fevil.example", "/"),
            ("no-break space",      "%2F%C2%A0%2Fevil.example", "/"),
            ("line separator",      "%2F%E2%80%A8%2Fevil.example", "/"),
            ("del",                 "%2F%7F%2Fevil.example", "/"),
            ("relative",            "evil.example",         "/"),
            ("javascript",          "javascript%3Aalert(1)", "/"),
            ("raw tab",             "/\t/evil.example",     "/"),
        ];
        for (case, raw, want) in cases {
            let decoded = crate::records::query::decode(&format!("next={raw}")).unwrap();
            assert_eq!(local_next(Some(&decoded[0].1)), *want, "{case}");
        }
        assert_eq!(local_next(None), "/");
    }

    fn set_cookie(resp: &Response) -> &str {
        resp.headers()[header::SET_COOKIE].to_str().unwrap()
    }

    /// Served over TLS, the sign-in cookie and its clearing are `Secure`:
    /// a browser never sends the read token over plain HTTP. Without TLS
    /// the flag would make browsers drop the cookie, so it is left off.
    #[tokio::test]
    async fn the_sign_in_cookie_is_secure_over_tls_only() {
        let dir = tempfile::tempdir().unwrap();
        for tls in [false, true] {
            let state = UiState::new(
                dir.path().join("store.db"),
                super::super::ReadGate::new(Some("tok3n")),
            )
            .with_tls(tls);
            let signed_in = submit(
                State(state.clone()),
                None,
                Bytes::from_static(b"token=tok3n&next=%2F"),
            )
            .await;
            assert_eq!(signed_in.status(), StatusCode::SEE_OTHER);
            let cleared = logout(State(state), None).await;
            let secure = if tls { "; Secure" } else { "" };
            assert_eq!(
                set_cookie(&signed_in),
                format!("cpt_read_token=tok3n; HttpOnly; SameSite=Strict; Path=/{secure}")
            );
            assert_eq!(
                set_cookie(&cleared),
                format!("cpt_read_token=; HttpOnly; SameSite=Strict; Path=/{secure}; Max-Age=0")
            );
        }
    }
}
