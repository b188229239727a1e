//! Transactional messages, network side: storing half messages, ending transactions, and
//! asking a producer about a half message when storage shard 0's check service says so.
//!
//! Owns: validating the requests, the per-byte work (encoding the half message, and its
//! committed copy), appending the committed copy to its real queue's storage shard (with the
//! look-up that keeps a commit from storing a second copy), and the check-back call to the
//! client. The table of unresolved half messages and the op records belong to
//! `crate::transaction` on storage shard 0; every resolution goes through it
//! (`Begin` … `Finish`), so two resolutions of one half message never run at once.

use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use shardmq_schema::{build_frame, wire, FrameEncoder, FrameError, FrameHeader};
use tracing::{debug, info, warn};

use super::produce::{encode_batch, encode_send_response, Placement};
use super::request::{
    encode_status, invalid, refuse, writable_topic, write_queue, Answer, Connection, Refusal,
};
use super::{AskError, NetworkShard};
use crate::mesh::StorageRequest;
use crate::naming::check_group_name;
use crate::store::{AppendStatus, RecordView};
use crate::topics::{TopicConfig, UpsertError};
use crate::transaction::{
    self, BeginOutcome, CheckBack, CommitOutcome, HalfAppendError, Resolution, TransactionRequest,
};

/// How long the broker waits for a producer's answer to a check-back.
pub const CHECK_ANSWER_TIMEOUT: Duration = Duration::from_secs(3);

/// A resolution to apply to one half message.
#[derive(Debug, Clone)]
pub(super) struct EndTransaction {
    pub producer_group: String,
    pub half_queue_offset: u64,
    pub half_commit_log_offset: u64,
    pub resolution: Resolution,
    pub unique_id: String,
    pub is_from_check: bool,
}

/// SendHalfRequest: store a half message for a real topic and queue.
pub(super) async fn handle_send_half(
    shard: &NetworkShard,
    connection: &Connection,
    id: u64,
    r: wire::SendHalfRequest<'_>,
) -> Answer {
    let topic = r.topic().unwrap_or_default();
    let config = real_topic_config(shard, topic).await?;
    let group = r
        .producer_group()
        .filter(|g| !g.is_empty())
        .ok_or_else(|| invalid("producer_group is required: check-backs go to the group"))?;
    check_group_name(group).map_err(invalid)?;
    let messages = r
        .messages()
        .filter(|m| m.len() == 1)
        .ok_or_else(|| invalid("a half message request carries exactly one message"))?;
    let message = messages.get(0);
    let unique_id = message
        .unique_id()
        .filter(|u| !u.is_empty())
        .ok_or_else(|| {
            invalid("unique_id is required for a transactional message (commits are de-duplicated by it)")
        })?
        .to_owned();
    if message.delay_level() != 0 || message.deliver_at_ms() != 0 || message.delay_ms() != 0 {
        return Err(invalid(
            "a transactional message cannot have a delay level or delivery time",
        ));
    }
    let queue_id = write_queue(shard, &config, r.queue_id())?;
    let store_host = shard.store_host.get();
    let encoded = encode_batch(
        shard,
        connection.peer,
        store_host,
        topic,
        queue_id,
        [&message],
        &[],
    )?;
    let half = transaction::half_record(&encoded.bytes, group, shard.storage_shards())
        .map_err(|e| invalid(format!("message 0: {e}")))?;
    let producer_group = group.to_owned();
    let outcome = shard
        .ask(0, |reply| {
            StorageRequest::Transaction(TransactionRequest::AppendHalf {
                batch: half,
                producer_group,
                reply,
            })
        })
        .await?;
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(HalfAppendError::TooManyUnresolved) => {
            return Err(refuse(
                wire::Status::SYSTEM_BUSY,
                format!(
                "{} transactions are unresolved, at MAX_UNRESOLVED_HALF_MESSAGES; end some first",
                transaction::MAX_UNRESOLVED_HALF_MESSAGES
            ),
            ))
        }
        Err(HalfAppendError::Store(error)) => return Err(error.into()),
    };
    if outcome.records.len() != 1 {
        return Err(refuse(
            wire::Status::SYSTEM_ERROR,
            "the half message was not stored",
        ));
    }
    // Half messages live on storage shard 0 (next to the client registry).
    let placement = Placement {
        queue_id,
        storage: 0,
        is_scheduled: false,
    };
    encode_send_response(shard, id, &outcome, &[unique_id.as_str()], placement)
}

/// The real topic of a half message: writable, created first when the broker auto-creates.
async fn real_topic_config(shard: &NetworkShard, topic: &str) -> Result<TopicConfig, Refusal> {
    if let Some(config) = writable_topic(shard, topic)? {
        return Ok(config);
    }
    if !shard.config.auto_create_topics {
        return Err(refuse(
            wire::Status::TOPIC_NOT_FOUND,
            format!(
                "topic {topic} does not exist on this broker (create it first; auto-create is off)"
            ),
        ));
    }
    let config = TopicConfig::new(topic, shard.config.default_topic_queues);
    let created = config.clone();
    let outcome = shard
        .ask(0, |reply| StorageRequest::UpsertTopic {
            config,
            is_create_only: true,
            reply,
        })
        .await?;
    match outcome {
        Ok(()) | Err(UpsertError::Exists) => Ok(created),
        Err(UpsertError::Invalid(why)) => Err(invalid(why)),
    }
}

/// EndTransactionRequest: commit or roll back a half message (UNKNOWN changes nothing).
pub(super) async fn handle_end_transaction(
    shard: &NetworkShard,
    id: u64,
    r: wire::EndTransactionRequest<'_>,
) -> Answer {
    let producer_group = r.producer_group().unwrap_or_default();
    check_group_name(producer_group).map_err(invalid)?;
    let half_queue_offset = u64::try_from(r.half_queue_offset())
        .map_err(|_| invalid("half_queue_offset is missing or negative"))?;
    let half_commit_log_offset = u64::try_from(r.half_commit_log_offset())
        .map_err(|_| invalid("half_commit_log_offset is missing or negative"))?;
    let resolution = match r.resolution() {
        wire::TransactionResolution::COMMIT => Resolution::Commit,
        wire::TransactionResolution::ROLLBACK => Resolution::Rollback,
        wire::TransactionResolution::UNKNOWN => {
            debug!(
                half_queue_offset,
                "transaction state unknown; it will be checked back"
            );
            return encode_status(shard, id, wire::Status::OK, "");
        }
        other => {
            return Err(invalid(format!(
                "resolution {} is not COMMIT, ROLLBACK or UNKNOWN",
                other.0
            )))
        }
    };
    end_transaction(
        shard,
        EndTransaction {
            producer_group: producer_group.to_owned(),
            half_queue_offset,
            half_commit_log_offset,
            resolution,
            unique_id: r.unique_id().unwrap_or_default().to_owned(),
            is_from_check: r.is_from_check(),
        },
    )
    .await?;
    encode_status(shard, id, wire::Status::OK, "")
}

/// Applies a resolution: a rollback is recorded by storage shard 0; a commit stores the
/// committed copy in its real queue (at most once) and is then recorded.
pub(super) async fn end_transaction(
    shard: &NetworkShard,
    end: EndTransaction,
) -> Result<(), Refusal> {
    let (half_queue_offset, half_commit_log_offset) =
        (end.half_queue_offset, end.half_commit_log_offset);
    let (producer_group, resolution) = (end.producer_group.clone(), end.resolution);
    let outcome = shard
        .ask(0, |reply| {
            StorageRequest::Transaction(TransactionRequest::Begin {
                half_queue_offset,
                half_commit_log_offset,
                producer_group,
                resolution,
                reply,
            })
        })
        .await?;
    match outcome {
        BeginOutcome::AlreadyResolved => {
            debug!(half_queue_offset, "transaction already resolved");
            Ok(())
        }
        BeginOutcome::RolledBack => {
            debug!(half_queue_offset, unique_id = %end.unique_id, is_from_check = end.is_from_check, "transaction rolled back");
            Ok(())
        }
        BeginOutcome::NotFound(why) => Err(invalid(why)),
        BeginOutcome::InProgress => Err(refuse(
            wire::Status::SYSTEM_BUSY,
            "the transaction is being resolved by another request; retry",
        )),
        BeginOutcome::Failed(error) => Err(error.into()),
        BeginOutcome::Commit {
            record,
            may_be_committed,
        } => commit(shard, &end, record, may_be_committed).await,
    }
}

async fn commit(
    shard: &NetworkShard,
    end: &EndTransaction,
    record: Bytes,
    may_be_committed: bool,
) -> Result<(), Refusal> {
    let stored = store_committed_copy(shard, &record, may_be_committed).await;
    let outcome = match &stored {
        Ok(()) => CommitOutcome::Stored,
        Err((_, may_be_stored)) => CommitOutcome::NotStored {
            may_be_stored: *may_be_stored,
        },
    };
    let half_queue_offset = end.half_queue_offset;
    // When shard 0 is gone the broker is stopping; the half message is recovered as
    // "may be committed" at the next start.
    let _ = shard
        .ask(0, |reply| {
            StorageRequest::Transaction(TransactionRequest::Finish {
                half_queue_offset,
                outcome,
                reply,
            })
        })
        .await;
    if stored.is_ok() {
        debug!(half_queue_offset, unique_id = %end.unique_id, is_from_check = end.is_from_check, "transaction committed");
    }
    stored.map_err(|(refusal, _)| refusal)
}

/// Appends the committed copy of the half message `record`, unless `may_be_committed` and a
/// copy is found. On failure, also says whether the copy may have been stored anyway.
async fn store_committed_copy(
    shard: &NetworkShard,
    record: &Bytes,
    may_be_committed: bool,
) -> Result<(), (Refusal, bool)> {
    let broken = |why: String| {
        (
            refuse(
                wire::Status::SYSTEM_ERROR,
                format!("the half message cannot be committed: {why}"),
            ),
            false,
        )
    };
    let half = RecordView::parse_unchecked(record).map_err(|e| broken(e.to_string()))?;
    let (batch, topic, queue_id) = transaction::committed_record(&half).map_err(broken)?;
    let storage = shard.shard_of(&topic, queue_id);
    if may_be_committed {
        if let Some(unique_id) = half.unique_key().filter(|u| !u.is_empty()) {
            let unique_id = unique_id.to_owned();
            let begin_ms = half.store_timestamp_ms();
            let found = shard
                .ask(storage, |reply| StorageRequest::QueryByUniqueId {
                    unique_id,
                    begin_ms,
                    end_ms: i64::MAX,
                    reply,
                })
                .await
                .map_err(|e| (Refusal::from(e), true))?
                .map_err(|e| (Refusal::from(e), true))?;
            if found
                .iter()
                .any(|copy| transaction::is_committed_copy_of(copy, &topic, half.physical_offset()))
            {
                info!(
                    half_commit_log_offset = half.physical_offset(),
                    %topic,
                    "committed copy already stored (before a restart or a failed attempt); not storing it again"
                );
                return Ok(());
            }
        }
    }
    match shard
        .ask(storage, |reply| StorageRequest::Append { batch, reply })
        .await
    {
        // Stored on the master, but not on the replicas a sync master waits for: not
        // committed yet. The half message stays unresolved (as "may be committed"), so the op
        // record that ends it is not written before the copy is on every replica; a later
        // end or check-back finds the copy by its unique id once it is confirmed.
        Ok(Ok(outcome))
            if matches!(
                outcome.status,
                AppendStatus::FlushSlaveTimeout | AppendStatus::SlaveNotAvailable
            ) =>
        {
            let status = if outcome.status == AppendStatus::FlushSlaveTimeout {
                wire::Status::FLUSH_SLAVE_TIMEOUT
            } else {
                wire::Status::SLAVE_NOT_AVAILABLE
            };
            Err((
                refuse(
                    status,
                    "the committed message is stored on the master but its replicas do not hold it yet; the transaction stays open and is committed again by the next end or check-back",
                ),
                true,
            ))
        }
        // FLUSH_DISK_TIMEOUT: stored, and visible once flushed.
        Ok(Ok(_)) => Ok(()),
        // An append that fails stores nothing of its batch.
        Ok(Err(error)) => Err((error.into(), false)),
        Err(error @ AskError::Busy) => Err((error.into(), false)),
        // The shard stopped while the append may have been under way.
        Err(error @ AskError::Gone) => Err((error.into(), true)),
    }
}

/// Asks the producer on one of this shard's connections about a half message, on a task of
/// its own, and applies its answer.
pub fn spawn_check_back(shard: &Rc<NetworkShard>, check: CheckBack) {
    let shard = Rc::clone(shard);
    glommio::spawn_local(async move { check_back(&shard, check).await }).detach();
}

async fn check_back(shard: &NetworkShard, check: CheckBack) {
    let connection_id = check.connection.connection_id;
    let Some(push) = shard.connection_push(connection_id) else {
        debug!(
            connection_id,
            "the producer's connection closed before its check-back"
        );
        return;
    };
    let answer = shard
        .client_calls
        .call(connection_id, &push, CHECK_ANSWER_TIMEOUT, |request_id| {
            shard.with_encoder(|encoder| encode_check_request(encoder, request_id, &check))
        })
        .await;
    let frame = match answer {
        Ok(frame) => frame,
        Err(error) => {
            debug!(half_queue_offset = check.half_queue_offset, %error, "transaction check-back got no answer");
            return;
        }
    };
    let header = frame.frame();
    let resolution = header
        .body_as_check_transaction_state_response()
        .map(|r| r.resolution());
    let resolution = match (header.status(), resolution) {
        (wire::Status::OK, Some(wire::TransactionResolution::COMMIT)) => Resolution::Commit,
        (wire::Status::OK, Some(wire::TransactionResolution::ROLLBACK)) => Resolution::Rollback,
        (status, resolution) => {
            debug!(
                half_queue_offset = check.half_queue_offset,
                ?status,
                ?resolution,
                "check-back answered without a resolution"
            );
            return;
        }
    };
    let unique_id = RecordView::parse_unchecked(&check.record)
        .ok()
        .and_then(|view| view.unique_key().map(str::to_owned))
        .unwrap_or_default();
    let end = EndTransaction {
        producer_group: check.producer_group,
        half_queue_offset: check.half_queue_offset,
        half_commit_log_offset: check.half_commit_log_offset,
        resolution,
        unique_id,
        is_from_check: true,
    };
    match end_transaction(shard, end.clone()).await {
        Ok(()) => info!(
            half_queue_offset = end.half_queue_offset,
            unique_id = %end.unique_id,
            resolution = ?end.resolution,
            "transaction resolved by check-back"
        ),
        Err(refusal) => warn!(
            half_queue_offset = end.half_queue_offset,
            status = ?refusal.status,
            message = %refusal.message,
            "applying a check-back answer failed; it will be checked again"
        ),
    }
}

fn encode_check_request(
    encoder: &mut FrameEncoder,
    request_id: u64,
    check: &CheckBack,
) -> Result<Bytes, FrameError> {
    encoder.encode(|b| {
        let records = b.create_vector(&check.record[..]);
        let group = b.create_string(&check.producer_group);
        let body = wire::CheckTransactionStateRequest::create(
            b,
            &wire::CheckTransactionStateRequestArgs {
                producer_group: Some(group),
                half_queue_offset: check.half_queue_offset as i64,
                half_commit_log_offset: check.half_commit_log_offset as i64,
                records: Some(records),
            },
        );
        build_frame(
            b,
            &FrameHeader::request(request_id),
            wire::Body::CheckTransactionStateRequest,
            Some(body.as_union_value()),
        )
    })
}
