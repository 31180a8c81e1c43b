//! Operations middleware: one access-log line per request and CORS.

use crate::engine::{Done, Event};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// What the access log learns about one request.
#[derive(Debug, Default, Clone)]
pub struct Access {
    pub method: String,
    pub path: String,
    pub status: u16,
    /// Seconds from arrival to the first generated text.
    pub ttft_secs: Option<f64>,
    pub total_secs: f64,
    /// The engine's counts, when the request generated.
    pub done: Option<(usize, usize, usize)>,
}

impl Access {
    /// The log line: `POST /v1/chat/completions 200 prompt=12 cached=0
    /// generated=5 ttft=0.041s total=0.120s`.
    pub fn line(&self) -> String {
        let mut s = format!("{} {} {}", self.method, self.path, self.status);
        if let Some((prompt, cached, generated)) = self.done {
            s += &format!(" prompt={prompt} cached={cached} generated={generated}");
        }
        if let Some(t) = self.ttft_secs {
            s += &format!(" ttft={t:.3}s");
        }
        s += &format!(" total={:.3}s", self.total_secs);
        s
    }
}

struct Slot {
    start: Instant,
    access: Mutex<Access>,
}

tokio::task_local! {
    static SLOT: Arc<Slot>;
}

/// Pass a job's events on, noting the first text and the final counts in
/// this request's access-log slot (when the access log runs).
pub fn observe(rx: UnboundedReceiver<Event>) -> UnboundedReceiver<Event> {
    let Ok(slot) = SLOT.try_with(|s| s.clone()) else {
        return rx;
    };
    let (tx, out) = unbounded_channel();
    let mut rx = rx;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                ev = rx.recv() => {
                    let Some(ev) = ev else { break };
                    if let Ok(mut a) = slot.access.lock() {
                        match &ev {
                            Event::Text(t) if !t.is_empty() && a.ttft_secs.is_none() => {
                                a.ttft_secs = Some(slot.start.elapsed().as_secs_f64());
                            }
                            Event::Done(Done { prompt_tokens, cached_tokens, completion_tokens, .. }) => {
                                a.done = Some((*prompt_tokens, *cached_tokens, *completion_tokens));
                            }
                            _ => {}
                        }
                    }
                    if tx.send(ev).is_err() {
                        break;
                    }
                }
                // The client went away: dropping `rx` tells the engine.
                _ = tx.closed() => break,
            }
        }
    });
    out
}

/// Writes the line when dropped: at the end of a streamed body, or when
/// the client leaves in the middle of one.
struct LogOnDrop(Arc<Slot>);

impl Drop for LogOnDrop {
    fn drop(&mut self) {
        if let Ok(mut a) = self.0.access.lock() {
            a.total_secs = self.0.start.elapsed().as_secs_f64();
            tracing::info!("{}", a.line());
        }
    }
}

/// A streamed body that logs when it ends.
struct Logged {
    inner: axum::body::BodyDataStream,
    _log: LogOnDrop,
}

impl futures_core::Stream for Logged {
    type Item = Result<axum::body::Bytes, axum::Error>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.inner).poll_next(cx)
    }
}

/// The access log: one `tracing::info!` line per request.
pub async fn access_log(req: Request, next: Next) -> Response {
    let slot = Arc::new(Slot {
        start: Instant::now(),
        access: Mutex::new(Access {
            method: req.method().to_string(),
            path: req.uri().path().to_string(),
            ..Access::default()
        }),
    });
    let resp = SLOT.scope(slot.clone(), next.run(req)).await;
    if let Ok(mut a) = slot.access.lock() {
        a.status = resp.status().as_u16();
    }
    let streamed = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !streamed {
        drop(LogOnDrop(slot));
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let body = Body::from_stream(Logged {
        inner: body.into_data_stream(),
        _log: LogOnDrop(slot),
    });
    Response::from_parts(parts, body)
}

/// `--cors-origin` values (`*` for any).
#[derive(Clone, Debug, Default)]
pub struct Cors {
    pub origins: Vec<String>,
}

impl Cors {
    /// The `Access-Control-Allow-Origin` for a request's `Origin`, if any.
    fn allow(&self, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
        let origin = origin?;
        if self.origins.iter().any(|o| o == "*") {
            return Some(HeaderValue::from_static("*"));
        }
        let o = origin.to_str().ok()?;
        self.origins
            .iter()
            .any(|a| a.eq_ignore_ascii_case(o))
            .then(|| origin.clone())
    }

    /// Headers of a preflight answer (`OPTIONS` with
    /// `Access-Control-Request-Method`).
    pub fn preflight(&self, req: &HeaderMap) -> Response {
        let mut resp = StatusCode::NO_CONTENT.into_response();
        let h = resp.headers_mut();
        h.insert(header::VARY, HeaderValue::from_static("Origin"));
        if let Some(allow) = self.allow(req.get(header::ORIGIN)) {
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
            h.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static("GET, POST, OPTIONS"),
            );
            // Whatever the browser asks to send (Authorization,
            // Content-Type, the OpenAI client's own x-stainless-* ...).
            let asked = req
                .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
                .cloned()
                .unwrap_or(HeaderValue::from_static("Authorization, Content-Type"));
            h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked);
            h.insert(
                header::ACCESS_CONTROL_MAX_AGE,
                HeaderValue::from_static("86400"),
            );
        }
        resp
    }
}

/// CORS, before authentication (a preflight carries no key). Without
/// `--cors-origin` it does nothing.
pub async fn cors(State(c): State<Arc<Cors>>, req: Request, next: Next) -> Response {
    if c.origins.is_empty() {
        return next.run(req).await;
    }
    let h = req.headers();
    if req.method() == Method::OPTIONS && h.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD) {
        return c.preflight(h);
    }
    let allow = c.allow(h.get(header::ORIGIN));
    let mut resp = next.run(req).await;
    let rh = resp.headers_mut();
    rh.append(header::VARY, HeaderValue::from_static("Origin"));
    if let Some(allow) = allow {
        rh.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_line_names_what_happened() {
        let mut a = Access {
            method: "POST".into(),
            path: "/v1/chat/completions".into(),
            status: 200,
            ttft_secs: Some(0.0414),
            total_secs: 0.12,
            done: Some((12, 3, 5)),
        };
        assert_eq!(
            a.line(),
            "POST /v1/chat/completions 200 prompt=12 cached=3 generated=5 ttft=0.041s total=0.120s"
        );
        a.done = None;
        a.ttft_secs = None;
        a.status = 404;
        assert_eq!(a.line(), "POST /v1/chat/completions 404 total=0.120s");
    }

    #[test]
    fn cors_allows_only_listed_origins() {
        let c = Cors {
            origins: vec!["http://app.example".into()],
        };
        let mut h = HeaderMap::new();
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://app.example"),
        );
        h.insert(
            header::ACCESS_CONTROL_REQUEST_HEADERS,
            HeaderValue::from_static("authorization, content-type"),
        );
        let r = c.preflight(&h);
        assert_eq!(r.status(), 204);
        let rh = r.headers();
        assert_eq!(
            rh[header::ACCESS_CONTROL_ALLOW_ORIGIN],
            "http://app.example"
        );
        assert_eq!(
            rh[header::ACCESS_CONTROL_ALLOW_HEADERS],
            "authorization, content-type"
        );
        assert!(rh[header::ACCESS_CONTROL_ALLOW_METHODS]
            .to_str()
            .unwrap()
            .contains("POST"));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        let r = c.preflight(&h);
        assert_eq!(r.status(), 204);
        assert!(r
            .headers()
            .get(header::ACCESS_CONTROL_ALLOW_ORIGIN)
            .is_none());
        let any = Cors {
            origins: vec!["*".into()],
        };
        assert_eq!(
            any.allow(Some(&HeaderValue::from_static("http://x"))),
            Some(HeaderValue::from_static("*"))
        );
        assert_eq!(any.allow(None), None);
    }
}
