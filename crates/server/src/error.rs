//! Errors: typed, each mapped to an HTTP status and OpenAI's error body.

use crate::api::{ErrorBody, ErrorDetail};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// An error answered to a client.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// 400: the request is malformed or asks for something not allowed.
    #[error("{message}")]
    BadRequest {
        message: String,
        param: Option<String>,
        code: Option<&'static str>,
    },
    /// 401: `--api-key` is set and the bearer token is missing or wrong.
    #[error("invalid or missing API key: send `Authorization: Bearer <key>`")]
    Unauthorized,
    /// 404: no such route.
    #[error("unknown request URL: {method} {path}")]
    NotFound { method: String, path: String },
    /// 404: the route exists, the thing it names does not (a stored
    /// response's id).
    #[error("{message}")]
    NotFoundResource { message: String },
    /// 405: the route exists, the method does not.
    #[error("method {method} is not allowed for {path}")]
    MethodNotAllowed { method: String, path: String },
    /// 413: the body is over the limit.
    #[error("request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    /// 503: the queue is full.
    #[error("the server is busy: {queued} requests are queued (limit {limit}); retry later")]
    Busy { queued: usize, limit: usize },
    /// 500: something broke inside.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    /// A 400 about `param`.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError::BadRequest {
            message: message.into(),
            param: Some(param.into()),
            code: Some("invalid_value"),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::NotFound { .. } | ApiError::NotFoundResource { .. } => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Busy { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's `{"error": {"message", "type", "param", "code"}}`.
    pub fn body(&self) -> ErrorBody {
        let (kind, param, code) = match self {
            ApiError::BadRequest { param, code, .. } => (
                "invalid_request_error",
                param.clone(),
                code.map(String::from),
            ),
            ApiError::Unauthorized => (
                "invalid_request_error",
                None,
                Some("invalid_api_key".to_string()),
            ),
            ApiError::NotFound { .. } => {
                ("invalid_request_error", None, Some("unknown_url".into()))
            }
            ApiError::NotFoundResource { .. } => {
                ("invalid_request_error", None, Some("not_found".into()))
            }
            ApiError::MethodNotAllowed { .. } => (
                "invalid_request_error",
                None,
                Some("method_not_allowed".into()),
            ),
            ApiError::PayloadTooLarge { .. } => (
                "invalid_request_error",
                None,
                Some("request_too_large".into()),
            ),
            ApiError::Busy { .. } => ("server_error", None, Some("server_busy".into())),
            ApiError::Internal(_) => ("server_error", None, None),
        };
        ErrorBody {
            error: ErrorDetail {
                message: self.to_string(),
                kind: kind.to_string(),
                param,
                code,
            },
        }
    }
}

/// `Retry-After` of a 503 (queue full), in seconds.
pub const RETRY_AFTER_SECS: &str = "1";

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.body()).unwrap_or_default();
        let mut resp = (
            self.status(),
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response();
        if let ApiError::Busy { .. } = self {
            // The queue drains request by request: ask for a retry soon.
            resp.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static(RETRY_AFTER_SECS),
            );
        }
        resp
    }
}

/// Parse a JSON body into `T`; a 400 that names the offending field.
pub fn parse_json<T: serde::de::DeserializeOwned>(
    value: &serde_json::Value,
) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        // serde says "missing field `messages`" at the parent's path.
        let param = match inner.strip_prefix("missing field `") {
            Some(rest) => {
                let field = rest.split('`').next().unwrap_or("");
                if path == "." {
                    field.to_string()
                } else {
                    format!("{path}.{field}")
                }
            }
            None => path,
        };
        let message = if param == "." || param.is_empty() {
            format!("invalid request body: {inner}")
        } else {
            format!("invalid value for `{param}`: {inner}")
        };
        ApiError::BadRequest {
            message,
            param: (param != "." && !param.is_empty()).then_some(param),
            code: Some("invalid_value"),
        }
    })
}

/// Errors of starting and running the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("opening model {path}: {source}")]
    Open {
        path: String,
        source: redlite_gguf::GgufError,
    },
    #[error("loading model: {0}")]
    Model(#[from] redlite_model::ModelError),
    #[error("opening the engine: {0}")]
    Engine(#[from] redlite_engine::EngineError),
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] redlite_tokenizer::TokenizerError),
    #[error("binding {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the engine thread stopped")]
    EngineGone,
    #[error("{0}")]
    Options(String),
    #[error("model {path}: {source}")]
    Spec {
        path: String,
        source: redlite_spec::SpecError,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ChatCompletionRequest;
    use serde_json::json;

    #[test]
    fn field_errors_name_the_field() {
        let e = parse_json::<ChatCompletionRequest>(&json!({"messages": [{"role": "robot"}]}))
            .unwrap_err();
        let b = e.body();
        assert_eq!(b.error.param.as_deref(), Some("messages[0].role"));
        assert!(b.error.message.contains("robot"), "{}", b.error.message);
        assert_eq!(b.error.kind, "invalid_request_error");

        let e = parse_json::<ChatCompletionRequest>(&json!({"model": "x"})).unwrap_err();
        assert_eq!(e.body().error.param.as_deref(), Some("messages"));

        let e =
            parse_json::<crate::api::SamplingFields>(&json!({"max_tokens": "many"})).unwrap_err();
        assert_eq!(e.body().error.param.as_deref(), Some("max_tokens"));
    }

    #[test]
    fn statuses_and_shapes() {
        let cases = [
            (
                ApiError::invalid("n", "only n=1"),
                400,
                "invalid_request_error",
            ),
            (ApiError::Unauthorized, 401, "invalid_request_error"),
            (
                ApiError::NotFound {
                    method: "GET".into(),
                    path: "/x".into(),
                },
                404,
                "invalid_request_error",
            ),
            (
                ApiError::PayloadTooLarge { limit: 10 },
                413,
                "invalid_request_error",
            ),
            (
                ApiError::Busy {
                    queued: 1,
                    limit: 1,
                },
                503,
                "server_error",
            ),
            (ApiError::Internal("x".into()), 500, "server_error"),
        ];
        for (e, status, kind) in cases {
            assert_eq!(e.status().as_u16(), status);
            // Every 503, and only a 503, says when to retry.
            let resp = e.clone().into_response();
            let retry = resp.headers().get(axum::http::header::RETRY_AFTER);
            assert_eq!(retry.is_some(), status == 503, "{e}");
            let v = serde_json::to_value(e.body()).unwrap();
            let obj = v["error"].as_object().unwrap();
            for k in ["message", "type", "param", "code"] {
                assert!(obj.contains_key(k), "{k} missing in {v}");
            }
            assert_eq!(v["error"]["type"], kind);
        }
    }
}
