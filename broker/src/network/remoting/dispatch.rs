//! Where a remoting request goes: a table from its code to the family that turns it into the
//! native request it corresponds to (`send`, `consume`, `clients`), and what every answer
//! shares: the encoding of a reply or a refusal, ShardMQ's statuses as RocketMQ's response
//! codes, and the round trip through a native handler (build its request table, call it, read
//! its answer). A code without a row is answered REQUEST_CODE_NOT_SUPPORTED, naming the code.
//! Before the table, every request passes access control when it is on ([`super::access`]):
//! a refusal is NO_PERMISSION, with the reason as its remark.

use bytes::{Bytes, BytesMut};
use flatbuffers::{FlatBufferBuilder, UnionWIPOffset, WIPOffset};
use shardmq_remoting::codes::{request, response};
use shardmq_remoting::{encode_frame, encode_frame_head_with_body_bytes, RemotingCommand};
use shardmq_schema::{build_frame, wire, FrameDecoder, FrameHeader, VerifiedFrame};
use tracing::warn;

use super::{admin, clients, consume, locks, query, retry, send, transaction, RemotingSession};
use crate::network::request::{frame_error, refuse, Connection, Refusal};
use crate::network::{NetworkShard, Outbound};

/// A remoting answer: the command (ext fields, remark) and a body sent after its head as
/// slices (a pull's stored records), not copied into the frame.
pub(super) struct Reply {
    pub command: RemotingCommand,
    pub body: Vec<Bytes>,
}

impl Reply {
    /// An answer of `code` to `request` with no body.
    pub fn to(request: &RemotingCommand, code: i32) -> Reply {
        Reply {
            command: RemotingCommand::response_to(request, code),
            body: Vec::new(),
        }
    }

    pub fn with_ext(mut self, key: &str, value: impl ToString) -> Reply {
        self.command.set_ext(key, value.to_string());
        self
    }

    pub fn with_body(mut self, body: Bytes) -> Reply {
        self.body = vec![body];
        self
    }
}

pub(super) type Answer = Result<Reply, Refusal>;

/// Handles one remoting frame; `None` when it gets no answer (a oneway request, or a response:
/// the broker sends RocketMQ clients no request that waits for one).
pub(super) async fn handle(
    shard: &NetworkShard,
    connection: &Connection,
    session: &RemotingSession,
    command: RemotingCommand,
) -> Option<Outbound> {
    if command.is_response() {
        return None;
    }
    let answer = match super::access::check(connection, &command) {
        Ok(()) => dispatch(shard, connection, session, &command).await,
        Err(refusal) => Err(refusal),
    };
    tracing::trace!(
        code = command.code,
        opaque = command.opaque,
        answer = answer
            .as_ref()
            .map_or_else(|r| response_code(r.status), |r| r.command.code),
        records = answer.as_ref().map_or(0, |r| r.body.len()),
        "remoting request"
    );
    if command.is_oneway() {
        if let Err(refusal) = &answer {
            tracing::debug!(code = command.code, message = %refusal.message, "a oneway remoting request was refused");
        }
        return None;
    }
    let reply = answer.unwrap_or_else(|refusal| {
        let mut reply = Reply::to(&command, response_code(refusal.status));
        reply.command.remark = Some(refusal.message);
        reply
    });
    encode(&reply)
}

/// The table: each request code to its family.
async fn dispatch(
    shard: &NetworkShard,
    connection: &Connection,
    session: &RemotingSession,
    command: &RemotingCommand,
) -> Answer {
    let (c, s) = (connection, session);
    match command.code {
        request::SEND_MESSAGE | request::SEND_MESSAGE_V2 | request::SEND_BATCH_MESSAGE => {
            send::send(shard, c, command).await
        }
        // A lite pull consumer's pulls are pulls with the LITE_PULL sys flag.
        request::PULL_MESSAGE | request::LITE_PULL_MESSAGE => {
            consume::pull(shard, s, command).await
        }
        request::QUERY_CONSUMER_OFFSET => consume::query_consumer_offset(shard, c, command).await,
        request::UPDATE_CONSUMER_OFFSET => consume::update_consumer_offset(shard, c, command).await,
        request::GET_MAX_OFFSET | request::GET_MIN_OFFSET => {
            consume::queue_offset(shard, c, command).await
        }
        request::SEARCH_OFFSET_BY_TIMESTAMP => consume::offset_by_time(shard, c, command).await,
        request::GET_EARLIEST_MSG_STORETIME => {
            consume::earliest_store_time(shard, c, command).await
        }
        request::HEART_BEAT => clients::heartbeat(shard, c, s, command).await,
        request::CHECK_CLIENT_CONFIG => clients::check_client_config(shard, c, command).await,
        request::UNREGISTER_CLIENT => clients::unregister(shard, c, command).await,
        request::GET_CONSUMER_LIST_BY_GROUP => clients::consumer_list(shard, c, command).await,
        request::CONSUMER_SEND_MSG_BACK => retry::send_back(shard, c, command).await,
        request::END_TRANSACTION => transaction::end_transaction(shard, c, command).await,
        request::QUERY_MESSAGE => query::query_message(shard, c, command).await,
        request::VIEW_MESSAGE_BY_ID => query::view_message(shard, c, command).await,
        request::UPDATE_AND_CREATE_TOPIC => query::update_and_create_topic(shard, c, command).await,
        request::LOCK_BATCH_MQ | request::UNLOCK_BATCH_MQ => {
            locks::lock_or_unlock(shard, c, command).await
        }
        request::GET_BROKER_RUNTIME_INFO => admin::runtime_info(shard, c, command).await,
        request::GET_TOPIC_STATS_INFO => admin::topic_stats(shard, c, command).await,
        request::GET_CONSUME_STATS => admin::consume_stats(shard, c, command).await,
        request::GET_CONSUMER_CONNECTION_LIST => {
            admin::consumer_connections(shard, c, command).await
        }
        request::QUERY_TOPIC_CONSUME_BY_WHO => admin::topic_consumed_by(shard, c, command).await,
        request::DELETE_TOPIC_IN_BROKER => admin::delete_topic(shard, c, command).await,
        code => Err(refuse(
            wire::Status::UNKNOWN_REQUEST,
            format!("request code {code} is not supported by ShardMQ's broker"),
        )),
    }
}

/// The answer to a request that arrives while the broker stops (a shutdown or a role change):
/// SERVICE_NOT_AVAILABLE, so the client turns to another broker or tries again shortly; none
/// for a oneway request or a response.
pub(super) fn refuse_while_stopping(command: &RemotingCommand) -> Option<Outbound> {
    if command.is_response() || command.is_oneway() {
        return None;
    }
    let mut reply = Reply::to(command, response::SERVICE_NOT_AVAILABLE);
    reply.command.remark =
        Some("the broker is stopping; try another broker or again shortly".to_owned());
    encode(&reply)
}

fn encode(reply: &Reply) -> Option<Outbound> {
    let body_bytes = reply.body.iter().map(Bytes::len).sum();
    let mut head = BytesMut::new();
    let encoded = if reply.body.is_empty() {
        encode_frame(&reply.command, usize::MAX, &mut head)
    } else {
        encode_frame_head_with_body_bytes(&reply.command, body_bytes, usize::MAX, &mut head)
    };
    if let Err(error) = encoded {
        warn!(code = reply.command.code, %error, "cannot encode a remoting answer");
        return None;
    }
    let mut frames = Vec::with_capacity(reply.body.len() + 1);
    frames.push(head.freeze());
    frames.extend(reply.body.iter().cloned());
    Some(frames)
}

/// RocketMQ's response code for a ShardMQ status (docs/protocol.md, "RocketMQ remoting").
pub(super) fn response_code(status: wire::Status) -> i32 {
    match status {
        wire::Status::OK => response::SUCCESS,
        wire::Status::SYSTEM_BUSY => response::SYSTEM_BUSY,
        wire::Status::SERVICE_NOT_AVAILABLE | wire::Status::DISK_FULL => {
            response::SERVICE_NOT_AVAILABLE
        }
        wire::Status::UNKNOWN_REQUEST => response::REQUEST_CODE_NOT_SUPPORTED,
        wire::Status::INVALID_ARGUMENT | wire::Status::MESSAGE_TOO_LARGE => {
            response::MESSAGE_ILLEGAL
        }
        wire::Status::NO_PERMISSION | wire::Status::ACCESS_DENIED => response::NO_PERMISSION,
        wire::Status::TOPIC_NOT_FOUND => response::TOPIC_NOT_EXIST,
        wire::Status::CONSUMER_GROUP_NOT_FOUND => response::SUBSCRIPTION_GROUP_NOT_EXIST,
        wire::Status::INVALID_TAG_EXPRESSION => response::SUBSCRIPTION_PARSE_FAILED,
        wire::Status::FLUSH_DISK_TIMEOUT => response::FLUSH_DISK_TIMEOUT,
        wire::Status::FLUSH_SLAVE_TIMEOUT => response::FLUSH_SLAVE_TIMEOUT,
        wire::Status::SLAVE_NOT_AVAILABLE => response::SLAVE_NOT_AVAILABLE,
        wire::Status::PULL_NOT_FOUND => response::PULL_NOT_FOUND,
        wire::Status::PULL_RETRY_IMMEDIATELY => response::PULL_RETRY_IMMEDIATELY,
        wire::Status::PULL_OFFSET_MOVED => response::PULL_OFFSET_MOVED,
        wire::Status::QUERY_NOT_FOUND => response::QUERY_NOT_FOUND,
        _ => response::SYSTEM_ERROR,
    }
}

/// An ext field the request must carry, or the refusal that names it.
pub(super) fn required<'a>(command: &'a RemotingCommand, field: &str) -> Result<&'a str, Refusal> {
    command
        .ext_str(field)
        .map_err(|missing| refuse(wire::Status::INVALID_ARGUMENT, missing.to_string()))
}

/// An integer ext field the request must carry.
pub(super) fn required_i64(command: &RemotingCommand, field: &str) -> Result<i64, Refusal> {
    command
        .ext_i64(field)
        .map_err(|bad| refuse(wire::Status::INVALID_ARGUMENT, bad.to_string()))
}

/// A queue id ext field.
pub(super) fn queue_id(command: &RemotingCommand, field: &str) -> Result<i32, Refusal> {
    command
        .ext_i32(field)
        .map_err(|bad| refuse(wire::Status::INVALID_ARGUMENT, bad.to_string()))
}

/// A native request table built by `build`, verified as a frame the way a native connection's
/// frames are, so the family handler reads it as it reads a native client's.
pub(super) fn native_request<F>(shard: &NetworkShard, build: F) -> Result<VerifiedFrame, Refusal>
where
    F: FnOnce(&mut FlatBufferBuilder<'static>) -> (wire::Body, WIPOffset<UnionWIPOffset>),
{
    let bytes = shard
        .with_encoder(|encoder| {
            encoder.encode(|b| {
                let (body_type, body) = build(b);
                build_frame(b, &FrameHeader::request(0), body_type, Some(body))
            })
        })
        .map_err(frame_error)?;
    verify(shard, bytes)
}

/// The native answer a family handler gave: its frame, with a status other than the ones a
/// success shares (`is_stored`) turned into the refusal it is.
pub(super) fn native_answer(
    shard: &NetworkShard,
    answer: Result<Outbound, Refusal>,
) -> Result<VerifiedFrame, Refusal> {
    let frames = answer?;
    let first = frames.into_iter().next().ok_or_else(|| {
        refuse(
            wire::Status::SYSTEM_ERROR,
            "the broker's handler gave no answer",
        )
    })?;
    let frame = verify(shard, first)?;
    let status = frame.frame().status();
    if !is_stored(status) && status != wire::Status::QUERY_NOT_FOUND {
        return Err(refuse(
            status,
            frame.frame().message().unwrap_or_default().to_owned(),
        ));
    }
    Ok(frame)
}

fn verify(shard: &NetworkShard, frame_with_prefix: Bytes) -> Result<VerifiedFrame, Refusal> {
    let decoder = FrameDecoder::with_max_frame_bytes(shard.config.max_frame_bytes);
    let frame = frame_with_prefix
        .slice(shardmq_schema::FRAME_LENGTH_PREFIX_BYTES.min(frame_with_prefix.len())..);
    decoder.verify(frame).map_err(frame_error)
}

/// Whether a native status is one a remoting answer shares with a success (a send stored with
/// a flush or replication shortfall is answered with its header, as RocketMQ does).
fn is_stored(status: wire::Status) -> bool {
    matches!(
        status,
        wire::Status::OK
            | wire::Status::FLUSH_DISK_TIMEOUT
            | wire::Status::FLUSH_SLAVE_TIMEOUT
            | wire::Status::SLAVE_NOT_AVAILABLE
    )
}
