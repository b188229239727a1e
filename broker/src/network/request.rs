//! The handler kit every request family uses: the per-connection state a request sees
//! (`Connection`), an answer (`Answer`) or a refusal (`Refusal`, a status and a message that
//! names the thing and the limit), the encoders of plain answers, and the checks of names and
//! queues that many requests share. Nothing here asks a storage shard.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use flatbuffers::FlatBufferBuilder;
use shardmq_schema::{build_frame, wire, FrameError, FrameHeader};

use super::{AskError, NetworkShard, Outbound};
use crate::naming::{check_group_name, check_topic_name, is_system_topic};
use crate::store::StoreError;
use crate::topics::TopicConfig;

/// Per-connection state shared by its request tasks.
pub struct Connection {
    pub id: u64,
    pub peer: std::net::SocketAddr,
    pub is_handshaken: Cell<bool>,
    pub client_id: RefCell<Option<String>>,
    /// The account the connection proved it holds (access control; docs/acl.md), or `None`
    /// (anonymous, or access control off).
    pub account: RefCell<Option<String>>,
    /// The challenge its handshake answer carried, until an `AuthRequest` answers it.
    pub auth_nonce: Cell<Option<shardmq_acl::Nonce>>,
    pub(super) is_closing: Cell<bool>,
    pub(super) out: Rc<glommio::channels::local_channel::LocalSender<Outbound>>,
}

impl Connection {
    /// Asks the connection to close once the answers already being written are out.
    pub fn close_after_answers(&self) {
        self.is_closing.set(true);
    }

    /// Queues frames for the writer (waits when the client reads slower than we answer).
    pub async fn send(&self, frames: Outbound) {
        let _ = self.out.send(frames).await;
    }
}

/// A request's failure: a status and a message naming the thing and the limit.
pub struct Refusal {
    pub(super) status: wire::Status,
    pub(super) message: String,
}

pub(super) fn refuse(status: wire::Status, message: impl Into<String>) -> Refusal {
    Refusal {
        status,
        message: message.into(),
    }
}

pub(super) fn invalid(message: impl Into<String>) -> Refusal {
    refuse(wire::Status::INVALID_ARGUMENT, message)
}

impl From<AskError> for Refusal {
    fn from(error: AskError) -> Self {
        match error {
            AskError::Busy => refuse(
                wire::Status::SYSTEM_BUSY,
                "storage shard is busy: its request queue is full; retry later",
            ),
            AskError::Gone => refuse(
                wire::Status::SERVICE_NOT_AVAILABLE,
                "storage shard is not serving (broker stopping)",
            ),
        }
    }
}

impl From<StoreError> for Refusal {
    fn from(error: StoreError) -> Self {
        let status = match &error {
            StoreError::Busy { .. } => wire::Status::SYSTEM_BUSY,
            StoreError::DiskFull { .. } => wire::Status::DISK_FULL,
            StoreError::FlushFailing(why) if why.contains("No space") => wire::Status::DISK_FULL,
            StoreError::RecordTooLarge { .. } => wire::Status::MESSAGE_TOO_LARGE,
            StoreError::InvalidRecord(_) => wire::Status::INVALID_ARGUMENT,
            StoreError::Closed | StoreError::Held(_) => wire::Status::SERVICE_NOT_AVAILABLE,
            _ => wire::Status::SYSTEM_ERROR,
        };
        refuse(status, error.to_string())
    }
}

pub(super) type Answer = Result<Outbound, Refusal>;

pub(super) fn frame_error(error: FrameError) -> Refusal {
    refuse(
        wire::Status::SYSTEM_ERROR,
        format!("answer could not be encoded: {error}"),
    )
}

pub(super) fn encode_status(
    shard: &NetworkShard,
    id: u64,
    status: wire::Status,
    message: &str,
) -> Answer {
    shard
        .with_encoder(|e| e.encode_error_response(id, status, message))
        .map(|frame| vec![frame])
        .map_err(frame_error)
}

pub(super) fn encode_ok(
    shard: &NetworkShard,
    id: u64,
    body: impl FnOnce(
        &mut FlatBufferBuilder<'static>,
    ) -> (
        wire::Body,
        flatbuffers::WIPOffset<flatbuffers::UnionWIPOffset>,
    ),
) -> Answer {
    shard
        .with_encoder(|encoder| {
            encoder.encode(|b| {
                let (kind, value) = body(b);
                build_frame(
                    b,
                    &FrameHeader::response(id, wire::Status::OK),
                    kind,
                    Some(value),
                )
            })
        })
        .map(|frame| vec![frame])
        .map_err(frame_error)
}

/// The queue a send goes to: `requested`, checked against the topic's write queues, or the
/// shard's round-robin choice for -1.
pub(super) fn write_queue(
    shard: &NetworkShard,
    config: &TopicConfig,
    requested: i32,
) -> Result<u32, Refusal> {
    match requested {
        -1 => Ok(shard.next_queue(config.write_queues)),
        q if q >= 0 && (q as u32) < config.write_queues => Ok(q as u32),
        q => Err(invalid(format!(
            "queue_id {q} is outside topic {}'s write queues 0..{}",
            config.name, config.write_queues
        ))),
    }
}

/// The topic's config if the topic may be written by users.
pub(super) fn writable_topic(
    shard: &NetworkShard,
    topic: &str,
) -> Result<Option<TopicConfig>, Refusal> {
    check_topic_name(topic).map_err(invalid)?;
    if is_system_topic(topic) {
        return Err(refuse(
            wire::Status::NO_PERMISSION,
            format!("{topic} is a system topic; producers may not write to it directly"),
        ));
    }
    let table = shard.topics();
    match table.get(topic) {
        Some(config) if !config.is_writable() => Err(refuse(
            wire::Status::NO_PERMISSION,
            format!("topic {topic} is not writable (perm {})", config.perm),
        )),
        Some(config) => Ok(Some(config.clone())),
        None => Ok(None),
    }
}

pub(super) fn time_range(begin_ms: i64, end_ms: i64) -> (i64, i64) {
    (begin_ms.max(0), if end_ms <= 0 { i64::MAX } else { end_ms })
}

/// (topic, queue) of a request on a topic that exists and is readable.
pub(super) fn readable_queue(
    shard: &NetworkShard,
    topic: Option<&str>,
    queue_id: i32,
) -> Result<(String, u32), Refusal> {
    let topic = topic.unwrap_or_default();
    check_topic_name(topic).map_err(invalid)?;
    let table = shard.topics();
    let config = table.get(topic).ok_or_else(|| {
        refuse(
            wire::Status::TOPIC_NOT_FOUND,
            format!("topic {topic} does not exist on this broker"),
        )
    })?;
    if !config.is_readable() {
        return Err(refuse(
            wire::Status::NO_PERMISSION,
            format!("topic {topic} is not readable (perm {})", config.perm),
        ));
    }
    let queues = config.read_queues.max(config.write_queues);
    if queue_id < 0 || queue_id as u32 >= queues {
        return Err(invalid(format!(
            "queue_id {queue_id} is outside topic {topic}'s queues 0..{queues}"
        )));
    }
    Ok((topic.to_owned(), queue_id as u32))
}

pub(super) fn group_queue(
    shard: &NetworkShard,
    group: Option<&str>,
    topic: Option<&str>,
    queue_id: i32,
) -> Result<(String, String, u32), Refusal> {
    let group = group.unwrap_or_default();
    check_group_name(group).map_err(invalid)?;
    let (topic, queue_id) = readable_queue(shard, topic, queue_id)?;
    Ok((group.to_owned(), topic, queue_id))
}
