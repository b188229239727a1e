//! The client's error type: one enum whose variants a caller can act on (retry, fix the
//! argument, create the topic, start the server), each message naming the thing and the limit.
//!
//! Owns: [`Error`], the retry classification ([`Error::is_retriable`]) and the mapping from
//! wire statuses to errors ([`Error::from_status`]). Never: logging or retrying by itself.

use std::time::Duration;

use shardmq_schema::{wire, FrameError};

/// What went wrong in a client call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A builder was given an unusable setting (or none where one is required).
    #[error("invalid client configuration: {0}")]
    Config(String),

    /// An argument failed the client's checks before anything was sent (a name, a body size, a
    /// key, a property); the message names the field and the rule.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// No TCP connection could be made to a server.
    #[error("cannot connect to {address} within {timeout_ms} ms: {source}; is the server running and is the address right?")]
    Connect {
        address: String,
        timeout_ms: u64,
        #[source]
        source: std::io::Error,
    },

    /// The TLS handshake with a server failed: its certificate is not signed by a trusted CA,
    /// has expired or is not for the address; the server wants a client certificate; or the
    /// server does not speak TLS.
    #[error("TLS handshake with {address} failed: {reason}")]
    Tls { address: String, reason: String },

    /// A socket error on an established connection (the connection is dropped and made again
    /// on the next request).
    #[error("I/O error on the connection to {address}: {source}")]
    Io {
        address: String,
        #[source]
        source: std::io::Error,
    },

    /// The server closed the connection (or it failed) while the request was in flight; the
    /// request's effect is unknown. The next request reconnects.
    #[error("the connection to {address} closed before the answer came ({reason})")]
    ConnectionClosed { address: String, reason: String },

    /// No answer within the time allowed; the request's effect is unknown.
    #[error("{operation} to {address} got no answer within {} ms", timeout.as_millis())]
    Timeout {
        operation: &'static str,
        address: String,
        timeout: Duration,
    },

    /// The server refused the version handshake (no common protocol version).
    #[error("handshake with {address} failed: {reason}")]
    Handshake { address: String, reason: String },

    /// A frame could not be encoded (over the server's `max_frame_bytes`) or the server sent
    /// bytes that are not a valid frame.
    #[error("frame error with {address}: {source}")]
    Frame {
        address: String,
        #[source]
        source: FrameError,
    },

    /// The server answered with a status other than OK.
    #[error("{address} answered {status:?}: {message}")]
    Status {
        address: String,
        status: wire::Status,
        message: String,
    },

    /// No name server knows a route for the topic (no live broker hosts it).
    #[error("topic {topic} has no route at the name server; create it first (`shardmq topic create {topic} --broker ADDR`)")]
    TopicNotFound { topic: String },

    /// The topic's route has no queue that allows the operation (all read-only, or only slaves
    /// alive for a write).
    #[error("topic {topic} has no {kind} queue in its route")]
    NoQueue { topic: String, kind: &'static str },

    /// Every name server failed; `last` is the last failure.
    #[error("no name server answered (tried {tried:?}); last error: {last}")]
    NameServerUnavailable {
        tried: Vec<String>,
        last: Box<Error>,
    },

    /// A send failed on every attempt within the send timeout; `last` is the last failure.
    #[error("send to topic {topic} failed after {attempts} attempt(s): {last}")]
    SendFailed {
        topic: String,
        attempts: u32,
        last: Box<Error>,
    },

    /// A record in a pull or query response failed its checks (CRC, layout); the message is
    /// not delivered. Pulling again re-reads it; a persisting error means a damaged store.
    #[error("corrupt stored record from {address}: {reason}")]
    CorruptRecord { address: String, reason: String },

    /// The server's answer is not the one the request calls for (a protocol mismatch).
    #[error("unexpected answer from {address}: {detail}")]
    UnexpectedResponse { address: String, detail: String },

    /// The local offset file of a broadcasting consumer could not be read or written.
    #[error("local offset store {path}: {source}")]
    OffsetStore {
        path: String,
        #[source]
        source: std::io::Error,
    },

    /// The client (producer, consumer, admin) has been shut down.
    #[error("the client has been shut down")]
    ShutDown,
}

/// The client's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The error for a response from `address` with a status other than OK.
    #[must_use]
    pub fn from_status(address: &str, status: wire::Status, message: Option<&str>) -> Self {
        Error::Status {
            address: address.to_owned(),
            status,
            message: message.unwrap_or_default().to_owned(),
        }
    }

    /// The wire status, when the server answered one.
    #[must_use]
    pub fn status(&self) -> Option<wire::Status> {
        match self {
            Error::Status { status, .. } => Some(*status),
            Error::SendFailed { last, .. } | Error::NameServerUnavailable { last, .. } => {
                last.status()
            }
            _ => None,
        }
    }

    /// Whether trying again (on another broker when possible) may succeed: transport failures,
    /// timeouts, and the statuses docs/protocol.md tells a client to retry (`SYSTEM_ERROR`,
    /// `SYSTEM_BUSY`, `SERVICE_NOT_AVAILABLE`, `DISK_FULL`).
    #[must_use]
    pub fn is_retriable(&self) -> bool {
        match self {
            Error::Connect { .. }
            | Error::Io { .. }
            | Error::ConnectionClosed { .. }
            | Error::Timeout { .. } => true,
            Error::Status { status, .. } => matches!(
                *status,
                wire::Status::SYSTEM_ERROR
                    | wire::Status::SYSTEM_BUSY
                    | wire::Status::SERVICE_NOT_AVAILABLE
                    | wire::Status::DISK_FULL
            ),
            _ => false,
        }
    }

    /// Whether the failure was on the way to or from the server (not an answer of it): the
    /// name server client moves on to the next name server on these.
    #[must_use]
    pub(crate) fn is_transport(&self) -> bool {
        matches!(
            self,
            Error::Connect { .. }
                | Error::Io { .. }
                | Error::ConnectionClosed { .. }
                | Error::Timeout { .. }
                | Error::Tls { .. }
                | Error::Handshake { .. }
                | Error::Frame { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retriable_statuses_follow_the_protocol_doc() {
        let busy = Error::from_status("b", wire::Status::SYSTEM_BUSY, Some("queue full"));
        assert!(busy.is_retriable());
        assert_eq!(busy.status(), Some(wire::Status::SYSTEM_BUSY));
        let invalid = Error::from_status("b", wire::Status::INVALID_ARGUMENT, None);
        assert!(!invalid.is_retriable());
        assert!(Error::ConnectionClosed {
            address: "b".into(),
            reason: "reset".into()
        }
        .is_retriable());
        let wrapped = Error::SendFailed {
            topic: "t".into(),
            attempts: 3,
            last: Box::new(busy),
        };
        assert_eq!(wrapped.status(), Some(wire::Status::SYSTEM_BUSY));
    }

    #[test]
    fn messages_say_what_to_do() {
        let text = Error::TopicNotFound {
            topic: "orders".into(),
        }
        .to_string();
        assert!(text.contains("shardmq topic create orders"), "{text}");
    }
}
