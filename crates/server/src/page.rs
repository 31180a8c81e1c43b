//! `GET /`: a chat page for trying the model in a browser. One HTML file
//! with its script and styles inline, compiled into the binary, that talks
//! to `/v1/chat/completions` (streamed) on the server that served it:
//! nothing to build, nothing fetched from elsewhere at run time (its
//! Content-Security-Policy allows this origin only).
//!
//! The page is public, as `/health` is: it holds no secret, and with
//! `--api-key` it asks for the key and sends it with its API calls.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

/// The page (`src/page/chat.html`).
pub const CHAT_HTML: &str = include_str!("page/chat.html");

/// Scripts and styles only from the page itself, requests only to this
/// origin: a page that tried to load anything else would be blocked.
const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `GET /`.
pub async fn index() -> Response {
    let mut resp = CHAT_HTML.into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_is_self_contained() {
        // No script, style or image comes from a URL: everything is inline.
        for needle in [
            "<script src",
            "<link",
            "http://",
            "https://",
            "@import",
            "<img",
        ] {
            assert!(!CHAT_HTML.contains(needle), "the page has `{needle}`");
        }
        // It calls the API by a relative path (this origin, any prefix).
        assert!(CHAT_HTML.contains("fetch(\"v1/chat/completions\""));
    }
}
