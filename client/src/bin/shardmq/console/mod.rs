//! `shardmq console`: the web console, an HTTP server of pages (embedded in the binary) and of a
//! JSON API under `/api/` that the pages call.
//!
//! Owns: the listener, the route table, turning errors into JSON answers with an HTTP status,
//! and the limits of the HTTP side (request body size, results per query). Every operation is
//! the client library's admin API or a function the CLI's commands share (`commands.rs`,
//! `dlq.rs`): one implementation per operation. Never: protocol details, or state of its own
//! beyond the login sessions (`session.rs`).
//!
//! Data enters as HTTP requests (JSON bodies, query strings, a session cookie) and leaves as
//! JSON objects (`output.rs`'s formats where the CLI has one) or as the static assets.
//!
//! Modules: `assets` (the embedded pages), `session` (logins, per-session admin clients),
//! `cluster`, `metrics` (the sampler of broker counters), `topics`, `groups`, `messages`
//! (queries, resend, DLQ).

mod assets;
mod cluster;
mod groups;
mod messages;
mod metrics;
mod session;
mod topics;

use std::sync::Arc;

use anyhow::{Context, Result};
use axum::extract::{DefaultBodyLimit, FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use shardmq_client::{wire, BrokerFailure, Error};

use crate::cli::{ConsoleArgs, Settings};

/// Largest request body the API reads (every request is a small JSON object).
const MAX_REQUEST_BODY_BYTES: usize = 64 * 1024;

/// The console's shared state: the command line's settings and the login sessions.
pub struct Console {
    settings: Settings,
    /// Controller addresses for the cluster page (`--controller`).
    controllers: Vec<String>,
    sessions: session::Sessions,
    metrics: Arc<metrics::Metrics>,
}

/// Serves the console on `args.listen` until the process is stopped.
pub async fn run(settings: Settings, args: ConsoleArgs) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let address = listener.local_addr()?;
    let sessions = session::Sessions::new(&settings).await?;
    let metrics = Arc::new(metrics::Metrics::default());
    tokio::spawn(Arc::clone(&metrics).run_sampler(sessions.default_admin()));
    let console = Arc::new(Console {
        sessions,
        settings,
        controllers: args.controller,
        metrics,
    });
    // The line scripts and tests wait for; the name servers are not asked before a page is.
    println!("console listening on http://{address}");
    axum::serve(listener, router(console))
        .await
        .context("the console's HTTP server failed")
}

fn router(console: Arc<Console>) -> Router {
    let api = Router::new()
        .route("/session", get(session::current))
        .route("/login", post(session::login))
        .route("/logout", post(session::logout))
        .route("/cluster", get(cluster::cluster))
        .route("/metrics", get(metrics::metrics))
        .route("/topics", get(topics::list).post(topics::upsert))
        .route(
            "/topics/{topic}",
            get(topics::detail).delete(topics::delete),
        )
        .route("/groups", get(groups::list))
        .route("/groups/{group}", get(groups::detail))
        .route("/groups/{group}/reset", post(groups::reset))
        .route("/messages/id", get(messages::by_id))
        .route("/messages/key", get(messages::by_key))
        .route("/messages/range", get(messages::by_range))
        .route("/messages/resend", post(messages::resend))
        .route("/dlq/{group}", get(messages::dead_letters))
        .route("/dlq/{group}/resend", post(messages::resend_dead_letters))
        .fallback(|| async { ApiError::not_found("no such API path") });
    Router::new()
        .nest("/api", api)
        .merge(assets::router())
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BODY_BYTES))
        .with_state(console)
}

/// An error answer: an HTTP status and `{"error": text, "status": wire status}`.
#[derive(Debug)]
pub struct ApiError {
    http: StatusCode,
    message: String,
    /// The server's wire status name (`ACCESS_DENIED`, …) when a server refused.
    wire_status: Option<&'static str>,
}

impl ApiError {
    fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            http: StatusCode::BAD_REQUEST,
            message: message.into(),
            wire_status: None,
        }
    }

    fn not_found(message: impl Into<String>) -> Self {
        ApiError {
            http: StatusCode::NOT_FOUND,
            message: message.into(),
            wire_status: None,
        }
    }
}

/// The text of an error and its causes, each cause added only when the text so far does not
/// already name it (client errors name their cause in their own message).
pub fn error_text(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let part = cause.to_string();
        if text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

/// The status a server refused with, also where the library carries it inside another error:
/// a refused authentication is a failed handshake whose reason names the status.
fn refusal_status(error: &Error) -> Option<wire::Status> {
    match error {
        Error::Handshake { reason, .. } if reason.contains("(ACCESS_DENIED)") => {
            Some(wire::Status::ACCESS_DENIED)
        }
        Error::NameServerUnavailable { last, .. } | Error::SendFailed { last, .. } => {
            refusal_status(last)
        }
        _ => error.status(),
    }
}

/// The HTTP status for a client error: what the user can fix is 4xx, a server that failed or
/// could not be reached is 502.
fn http_status_of(error: &Error) -> StatusCode {
    match error {
        Error::InvalidArgument(_) => StatusCode::BAD_REQUEST,
        Error::TopicNotFound { .. } | Error::NoQueue { .. } => StatusCode::NOT_FOUND,
        _ => match refusal_status(error) {
            Some(wire::Status::ACCESS_DENIED | wire::Status::NO_PERMISSION) => {
                StatusCode::FORBIDDEN
            }
            Some(wire::Status::TOPIC_NOT_FOUND) => StatusCode::NOT_FOUND,
            Some(wire::Status::TOPIC_ALREADY_EXISTS) => StatusCode::CONFLICT,
            Some(wire::Status::INVALID_ARGUMENT) => StatusCode::BAD_REQUEST,
            _ => StatusCode::BAD_GATEWAY,
        },
    }
}

impl From<anyhow::Error> for ApiError {
    fn from(error: anyhow::Error) -> Self {
        let client_error = error
            .chain()
            .find_map(|cause| cause.downcast_ref::<Error>());
        let (http, wire_status) = match client_error {
            Some(client_error) => (
                http_status_of(client_error),
                refusal_status(client_error).and_then(|status| status.variant_name()),
            ),
            None if error
                .downcast_ref::<crate::commands::UnknownGroup>()
                .is_some() =>
            {
                (StatusCode::NOT_FOUND, None)
            }
            None => (StatusCode::BAD_REQUEST, None),
        };
        ApiError {
            http,
            message: error_text(&error),
            wire_status,
        }
    }
}

impl From<Error> for ApiError {
    fn from(error: Error) -> Self {
        ApiError::from(anyhow::Error::new(error))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": self.message, "status": self.wire_status });
        (self.http, Json(body)).into_response()
    }
}

/// A request's JSON body; a body that is not JSON, or over [`MAX_REQUEST_BODY_BYTES`], is
/// answered with a JSON error like every other.
pub struct JsonBody(pub Value);

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        match Json::<Value>::from_request(request, state).await {
            Ok(Json(value)) => Ok(JsonBody(value)),
            Err(rejection) => Err(ApiError {
                http: rejection.status(),
                message: if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    format!("the request body is over {MAX_REQUEST_BODY_BYTES} bytes")
                } else {
                    rejection.body_text()
                },
                wire_status: None,
            }),
        }
    }
}

/// What a handler answers.
pub type ApiResult = std::result::Result<Json<Value>, ApiError>;

/// The brokers that did not answer a fan-out, as the pages show them.
fn failures_json(failures: &[BrokerFailure]) -> Value {
    Value::Array(
        failures
            .iter()
            .map(|failure| {
                json!({
                    "address": failure.address,
                    "error": error_text(&anyhow::anyhow!(failure.error.to_string())),
                })
            })
            .collect(),
    )
}

/// A required text field of a JSON body.
fn text_field<'a>(body: &'a Value, name: &str) -> std::result::Result<&'a str, ApiError> {
    match body.get(name) {
        Some(Value::String(text)) if !text.is_empty() => Ok(text),
        Some(Value::String(_)) | None | Some(Value::Null) => {
            Err(ApiError::bad_request(format!("`{name}` is required")))
        }
        Some(_) => Err(ApiError::bad_request(format!("`{name}` must be a string"))),
    }
}

/// An optional text field of a JSON body (`""` counts as absent).
fn optional_text<'a>(
    body: &'a Value,
    name: &str,
) -> std::result::Result<Option<&'a str>, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) if text.is_empty() => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(_) => Err(ApiError::bad_request(format!("`{name}` must be a string"))),
    }
}

/// An optional boolean field of a JSON body (false when absent).
fn flag_field(body: &Value, name: &str) -> std::result::Result<bool, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(flag)) => Ok(*flag),
        Some(_) => Err(ApiError::bad_request(format!(
            "`{name}` must be true or false"
        ))),
    }
}
