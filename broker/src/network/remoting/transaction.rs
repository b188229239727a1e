//! A RocketMQ producer's transactions. The half message itself is a send (`send.rs`);
//! END_TRANSACTION (37, oneway) becomes the native end of a transaction (commit or roll back
//! the half message it names by its half queue offset and CommitLog offset, or leave it for a
//! check-back), and the broker's check-back of an unresolved half message reaches the producer
//! as CHECK_TRANSACTION_STATE (39, oneway, as RocketMQ sends it), whose answer is the
//! producer's next END_TRANSACTION with `fromTransactionCheck` (`check_state_request`).

use bytes::Bytes;
use shardmq_remoting::codes::{message_sys_flag, request, response};
use shardmq_remoting::RemotingCommand;
use shardmq_schema::{build_frame, wire, FrameHeader, VerifiedFrame};

use super::dispatch::{native_answer, native_request, required, required_i64, Answer, Reply};
use crate::msgid::{offset_message_id, split_located_offset};
use crate::network::request::{refuse, Connection, Refusal};
use crate::network::transaction as native;
use crate::network::NetworkShard;
use crate::store::record::RecordView;

/// The storage shard that holds every half message.
const HALF_MESSAGE_SHARD: usize = 0;

pub(super) async fn end_transaction(
    shard: &NetworkShard,
    _connection: &Connection,
    command: &RemotingCommand,
) -> Answer {
    let producer_group = required(command, "producerGroup")?;
    let half_queue_offset = required_i64(command, "tranStateTableOffset")?;
    let located = u64::try_from(required_i64(command, "commitLogOffset")?).map_err(|_| {
        refuse(
            wire::Status::INVALID_ARGUMENT,
            "commitLogOffset is negative",
        )
    })?;
    let (storage, half_commit_log_offset) = split_located_offset(located);
    if storage != HALF_MESSAGE_SHARD {
        return Err(refuse(
            wire::Status::INVALID_ARGUMENT,
            format!("commitLogOffset {located} does not name a half message"),
        ));
    }
    let resolution = match command
        .ext_i32("commitOrRollback")
        .map_err(|bad| refuse(wire::Status::INVALID_ARGUMENT, bad.to_string()))?
    {
        message_sys_flag::TRANSACTION_COMMIT_TYPE => wire::TransactionResolution::COMMIT,
        message_sys_flag::TRANSACTION_ROLLBACK_TYPE => wire::TransactionResolution::ROLLBACK,
        message_sys_flag::TRANSACTION_NOT_TYPE => wire::TransactionResolution::UNKNOWN,
        other => {
            return Err(refuse(
                wire::Status::INVALID_ARGUMENT,
                format!(
                    "commitOrRollback is {other}: not 0 (unknown), 8 (commit) or 12 (rollback)"
                ),
            ))
        }
    };
    let is_from_check = command
        .ext_opt_bool("fromTransactionCheck")
        .map_err(|bad| refuse(wire::Status::INVALID_ARGUMENT, bad.to_string()))?
        .unwrap_or(false);
    let unique_id = command.ext("msgId").unwrap_or_default();
    let request = native_request(shard, |b| {
        let producer_group = b.create_string(producer_group);
        let unique_id = b.create_string(unique_id);
        let body = wire::EndTransactionRequest::create(
            b,
            &wire::EndTransactionRequestArgs {
                producer_group: Some(producer_group),
                half_queue_offset,
                half_commit_log_offset: half_commit_log_offset as i64,
                unique_id: Some(unique_id),
                resolution,
                is_from_check,
            },
        );
        (wire::Body::EndTransactionRequest, body.as_union_value())
    })?;
    let end = request
        .frame()
        .body_as_end_transaction_request()
        .expect("built as an end of transaction");
    native_answer(shard, native::handle_end_transaction(shard, 0, end).await)?;
    Ok(Reply::to(command, response::SUCCESS))
}

/// The broker's check-back `check` (a native request to the producer's connection) as
/// RocketMQ's CHECK_TRANSACTION_STATE, and the answer that ends the native call at once: the
/// producer answers a remoting check-back with an END_TRANSACTION of its own, so the call is
/// told UNKNOWN (nothing to apply) rather than left to time out. The message in the body is the
/// half message with its real topic and queue, as RocketMQ sends it; its properties keep the
/// producer group (`PGROUP`) the client picks its producer by.
pub(super) fn check_state_request(
    shard: &NetworkShard,
    check: &VerifiedFrame,
) -> Result<(RemotingCommand, VerifiedFrame), Refusal> {
    let frame = check.frame();
    let request_id = frame.request_id();
    let state = frame
        .body_as_check_transaction_state_request()
        .ok_or_else(|| refuse(wire::Status::INVALID_ARGUMENT, "not a check-back"))?;
    let record = state.records().map(|r| r.bytes()).unwrap_or_default();
    let half = RecordView::parse_unchecked(record)
        .map_err(|error| refuse(wire::Status::SYSTEM_ERROR, format!("half message: {error}")))?;
    let unique_id = half.unique_key().unwrap_or_default().to_owned();
    let real_topic = crate::transaction::real_queue_of(&half)
        .map(|(topic, _)| topic.to_owned())
        .unwrap_or_default();
    let body = match crate::transaction::committed_record(&half) {
        Ok((as_real, _, _)) => Bytes::copy_from_slice(&as_real.bytes),
        Err(_) => Bytes::copy_from_slice(record),
    };
    let half_commit_log_offset = u64::try_from(state.half_commit_log_offset()).unwrap_or(0);
    let offset_id = offset_message_id(
        shard.store_host.get(),
        HALF_MESSAGE_SHARD,
        half_commit_log_offset,
    );
    let command = RemotingCommand::request(request::CHECK_TRANSACTION_STATE, 0)
        .with_ext(
            "tranStateTableOffset",
            state.half_queue_offset().to_string(),
        )
        .with_ext("commitLogOffset", half_commit_log_offset.to_string())
        .with_ext("msgId", unique_id.clone())
        .with_ext("transactionId", unique_id)
        .with_ext("offsetMsgId", offset_id)
        .with_ext("topic", real_topic)
        .with_body(body)
        .with_oneway();
    let unknown = shard
        .with_encoder(|encoder| {
            encoder.encode(|b| {
                let body = wire::CheckTransactionStateResponse::create(
                    b,
                    &wire::CheckTransactionStateResponseArgs {
                        resolution: wire::TransactionResolution::UNKNOWN,
                    },
                );
                build_frame(
                    b,
                    &FrameHeader::response(request_id, wire::Status::OK),
                    wire::Body::CheckTransactionStateResponse,
                    Some(body.as_union_value()),
                )
            })
        })
        .map_err(crate::network::request::frame_error)?;
    let unknown = shardmq_schema::FrameDecoder::with_max_frame_bytes(shard.config.max_frame_bytes)
        .verify(unknown.slice(shardmq_schema::FRAME_LENGTH_PREFIX_BYTES..))
        .map_err(crate::network::request::frame_error)?;
    Ok((command, unknown))
}
