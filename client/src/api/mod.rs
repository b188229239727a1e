//! Typed requests: each server request the client makes, written as a flatbuffer and its
//! answer read back into owned Rust values (docs/protocol.md, "Requests and responses").
//!
//! Owns: the mapping between the wire tables and the client's types, and between answer
//! statuses and [`Error`]s. Never: choosing a server or retrying; every function takes the
//! address to ask and the time to wait.
//!
//! The requests are methods of [`ConnectionPool`](crate::pool::ConnectionPool) (or, where the
//! caller needs the connection itself, of `Connection`), one file per family: `send.rs` and
//! `records.rs` (a producer's run of records, protocol 2), `pull.rs`, `offsets.rs` (group and queue offsets), `clients.rs`
//! (heartbeat, membership), `topics.rs` (topic admin at one broker), `query.rs` (message
//! queries) and `namesrv.rs` (routes, clusters, topic list). This file holds the answer checks
//! they share (and other modules' requests use too).

mod clients;
mod namesrv;
mod offsets;
mod pull;
mod query;
mod records;
mod send;
mod topics;

pub(crate) use clients::HeartbeatGroup;
pub(crate) use pull::{Pending, PullArgs, UndecodedPull};
pub use pull::{PullResult, PullStatus};
pub(crate) use records::{RecordRun, RunSettings};
pub(crate) use send::{encode_message, send_answer, Stored};
pub use send::{BatchSendResult, BatchSendResults, SendResult, SendStatus};
pub use topics::{QueueStats, TopicConfig, DEFAULT_TOPIC_QUEUES, MAX_TOPIC_QUEUES};

use flatbuffers::{FlatBufferBuilder, WIPOffset};
use shardmq_schema::{wire, VerifiedFrame};

use crate::error::{Error, Result};

/// `frame` if its status is OK, else the status as an error.
pub(crate) fn require_ok(address: &str, frame: VerifiedFrame) -> Result<VerifiedFrame> {
    let header = frame.frame();
    if header.status() == wire::Status::OK {
        Ok(frame)
    } else {
        Err(Error::from_status(
            address,
            header.status(),
            header.message(),
        ))
    }
}

/// Like [`require_ok`] for an answer to a name server request: a server that does not know
/// the request is not a name server (typically a broker's address given as `--namesrv`).
pub(crate) fn require_namesrv_ok(address: &str, frame: VerifiedFrame) -> Result<VerifiedFrame> {
    if frame.frame().status() == wire::Status::UNKNOWN_REQUEST {
        return Err(Error::UnexpectedResponse {
            address: address.to_owned(),
            detail: "it does not serve name server requests, so it is not a name server (a broker's address given as the name server? name servers listen on 9876 by default)".to_owned(),
        });
    }
    require_ok(address, frame)
}

pub(crate) fn missing_body(address: &str, what: &str) -> Error {
    Error::UnexpectedResponse {
        address: address.to_owned(),
        detail: format!("the answer carries no {what}"),
    }
}

fn strings<'b>(
    builder: &mut FlatBufferBuilder<'b>,
    items: &[String],
) -> Option<WIPOffset<flatbuffers::Vector<'b, flatbuffers::ForwardsUOffset<&'b str>>>> {
    if items.is_empty() {
        return None;
    }
    let offsets: Vec<_> = items
        .iter()
        .map(|item| builder.create_string(item))
        .collect();
    Some(builder.create_vector(&offsets))
}
