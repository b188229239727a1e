//! The send path on a network shard: check a send (topic, group, batch limits, reserved
//! properties), place delayed and timer messages in their schedule queue, turn the wire messages
//! into stored records (the per-byte work, body CRC included, so storage cores only assign
//! offsets and write), ask the owning storage shard to append, and answer one result per record.

use std::net::SocketAddr;

use shardmq_schema::{build_frame, wire, FrameHeader};

use super::request::{
    frame_error, invalid, refuse, writable_topic, write_queue, Answer, Connection, Refusal,
};
use super::NetworkShard;
use crate::mesh::StorageRequest;
use crate::msgid::offset_message_id;
use crate::naming::check_group_name;
use crate::store::record::{RecordInput, SYS_FLAG_COMPRESSED};
use crate::store::{AppendStatus, EncodedBatch};
use crate::topics::{TopicConfig, UpsertError};

/// Property names the broker sets itself; user properties may not use them.
const RESERVED_PROPERTIES: [&str; 13] = [
    "TAGS",
    "KEYS",
    "UNIQ_KEY",
    "__CRC32#",
    "DELAY",
    "WAIT",
    // Delay, timer and retry bookkeeping (schedule.rs, timer.rs, network/send_back.rs).
    "REAL_TOPIC",
    "REAL_QID",
    "TIMER_DELIVER_MS",
    "RETRY_TOPIC",
    "ORIGIN_MESSAGE_ID",
    "RECONSUME_TIME",
    "MAX_RECONSUME_TIMES",
];

pub(super) async fn send(
    shard: &NetworkShard,
    connection: &Connection,
    id: u64,
    r: wire::SendRequest<'_>,
) -> Answer {
    let topic = r.topic().unwrap_or_default();
    let config = match writable_topic(shard, topic)? {
        Some(config) => config,
        None if shard.config.auto_create_topics => {
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
                Ok(()) | Err(UpsertError::Exists) => created,
                Err(UpsertError::Invalid(why)) => return Err(invalid(why)),
            }
        }
        None => {
            return Err(refuse(
                wire::Status::TOPIC_NOT_FOUND,
                format!(
                "topic {topic} does not exist on this broker (create it first; auto-create is off)"
            ),
            ))
        }
    };
    if let Some(group) = r.producer_group().filter(|g| !g.is_empty()) {
        check_group_name(group).map_err(invalid)?;
    }
    let messages = r
        .messages()
        .filter(|m| !m.is_empty())
        .ok_or_else(|| invalid("messages is empty"))?;
    if messages.len() > shard.config.max_batch_messages {
        return Err(invalid(format!(
            "batch has {} messages, over max_batch_messages ({})",
            messages.len(),
            shard.config.max_batch_messages
        )));
    }
    let queue_id = write_queue(shard, &config, r.queue_id())?;
    let store_host = shard.store_host.get();
    // A delayed or timer message waits in a schedule queue on its real queue's storage shard.
    let scheduled = crate::schedule::ScheduledSend::for_send(
        &shard.config,
        shard.storage_shards(),
        topic,
        queue_id,
        messages
            .iter()
            .map(|m| (m.delay_level(), m.deliver_at_ms(), m.delay_ms())),
    )
    .map_err(invalid)?;
    let (store_topic, store_queue, scheduling) = match &scheduled {
        Some(s) => (s.topic, s.queue_id, s.property_pairs()),
        None => (topic, queue_id, Vec::new()),
    };
    let batch = encode_batch(
        shard,
        connection.peer,
        store_host,
        store_topic,
        store_queue,
        messages,
        &scheduling,
    )?;
    let unique_ids: Vec<String> = messages
        .iter()
        .map(|m| m.unique_id().unwrap_or_default().to_owned())
        .collect();
    let storage = shard.shard_of(topic, queue_id);
    let outcome = shard
        .ask(storage, |reply| StorageRequest::Append { batch, reply })
        .await??;
    // A scheduled message has no position in its real queue until it is delivered there: its
    // answer says so (queue offset -1) rather than give the schedule queue's offset under the
    // real topic's name. Its offset id names the scheduled copy, which query-id finds.
    let placement = Placement {
        queue_id,
        storage,
        is_scheduled: scheduled.is_some(),
    };
    encode_send_response(shard, id, &outcome, &unique_ids, placement)
}

/// Where a stored send went, for its answer.
pub(super) struct Placement {
    /// The queue the producer sent to.
    pub queue_id: u32,
    pub storage: usize,
    /// The messages wait in a schedule queue (delay level or timer).
    pub is_scheduled: bool,
}

/// The answer to a stored send (or half message): one result per record, the status of its
/// flush. A record whose message had no unique id is named by its offset id.
pub(super) fn encode_send_response(
    shard: &NetworkShard,
    id: u64,
    outcome: &crate::store::AppendOutcome,
    unique_ids: &[String],
    placement: Placement,
) -> Answer {
    let Placement {
        queue_id,
        storage,
        is_scheduled,
    } = placement;
    let store_host = shard.store_host.get();
    let status = match outcome.status {
        AppendStatus::Ok => wire::Status::OK,
        AppendStatus::FlushDiskTimeout => {
            crate::metrics::broker().sync_flush_timeouts.inc();
            wire::Status::FLUSH_DISK_TIMEOUT
        }
        AppendStatus::FlushSlaveTimeout => wire::Status::FLUSH_SLAVE_TIMEOUT,
        AppendStatus::SlaveNotAvailable => wire::Status::SLAVE_NOT_AVAILABLE,
    };
    let message = match outcome.status {
        AppendStatus::Ok => "",
        AppendStatus::FlushDiskTimeout => {
            "stored, but the sync flush did not complete within sync_flush_timeout_ms"
        }
        AppendStatus::FlushSlaveTimeout => {
            "stored on the master, but the slave did not acknowledge it within sync_flush_timeout_ms"
        }
        AppendStatus::SlaveNotAvailable => {
            "stored on the master, but no slave is replicating from it (sync-master)"
        }
    };
    shard
        .with_encoder(|encoder| {
            encoder.encode(|b| {
                let results: Vec<_> = outcome
                    .records
                    .iter()
                    .zip(unique_ids)
                    .map(|(record, unique_id)| {
                        let offset_id =
                            offset_message_id(store_host, storage, record.physical_offset);
                        let unique = if unique_id.is_empty() {
                            &offset_id
                        } else {
                            unique_id
                        };
                        let unique = b.create_string(unique);
                        let offset_id = b.create_string(&offset_id);
                        wire::SendResult::create(
                            b,
                            &wire::SendResultArgs {
                                unique_id: Some(unique),
                                offset_msg_id: Some(offset_id),
                                queue_offset: if is_scheduled {
                                    -1
                                } else {
                                    record.queue_offset as i64
                                },
                                commit_log_offset: record.physical_offset as i64,
                            },
                        )
                    })
                    .collect();
                let results = b.create_vector(&results);
                let body = wire::SendResponse::create(
                    b,
                    &wire::SendResponseArgs {
                        queue_id: queue_id as i32,
                        results: Some(results),
                    },
                );
                let header = FrameHeader::response(id, status).with_message(message);
                build_frame(
                    b,
                    &header,
                    wire::Body::SendResponse,
                    Some(body.as_union_value()),
                )
            })
        })
        .map(|frame| vec![frame])
        .map_err(frame_error)
}

/// Turns wire messages into stored records (the per-byte work of the send path).
pub(super) fn encode_batch(
    shard: &NetworkShard,
    born_host: SocketAddr,
    store_host: SocketAddr,
    topic: &str,
    queue_id: u32,
    messages: flatbuffers::Vector<'_, flatbuffers::ForwardsUOffset<wire::Message<'_>>>,
    scheduling: &[(&str, &str)],
) -> Result<EncodedBatch, Refusal> {
    let mut batch = EncodedBatch::new();
    for (index, message) in messages.iter().enumerate() {
        let body = message.body().map(|b| b.bytes()).unwrap_or_default();
        if body.len() > shard.config.max_message_bytes {
            return Err(refuse(
                wire::Status::MESSAGE_TOO_LARGE,
                format!(
                    "message {index}: body is {} bytes, over max_message_bytes ({})",
                    body.len(),
                    shard.config.max_message_bytes
                ),
            ));
        }
        let mut keys_joined = String::new();
        if let Some(keys) = message.keys() {
            for key in keys.iter() {
                if key.is_empty() || key.contains(' ') {
                    return Err(invalid(format!(
                        "message {index}: key `{key}` is empty or contains a space"
                    )));
                }
                if !keys_joined.is_empty() {
                    keys_joined.push(' ');
                }
                keys_joined.push_str(key);
            }
        }
        let mut properties: Vec<(&str, &str)> = Vec::with_capacity(4);
        if let Some(tags) = message.tags().filter(|t| !t.is_empty()) {
            properties.push(("TAGS", tags));
        }
        if !keys_joined.is_empty() {
            properties.push(("KEYS", &keys_joined));
        }
        if let Some(unique_id) = message.unique_id().filter(|u| !u.is_empty()) {
            properties.push(("UNIQ_KEY", unique_id));
        }
        if let Some(user) = message.properties() {
            for pair in user.iter() {
                let key = pair.key().unwrap_or_default();
                if key.is_empty() || RESERVED_PROPERTIES.contains(&key) {
                    return Err(invalid(format!(
                        "message {index}: property name `{key}` is empty or reserved"
                    )));
                }
                properties.push((key, pair.value().unwrap_or_default()));
            }
        }
        properties.extend_from_slice(scheduling);
        let sys_flag = if message.compression() == wire::Compression::NONE {
            0
        } else {
            SYS_FLAG_COMPRESSED
        };
        let input = RecordInput {
            topic,
            queue_id,
            flag: message.flag(),
            body,
            properties: &properties,
            sys_flag,
            born_timestamp_ms: message.born_timestamp_ms(),
            born_host,
            store_host,
            reconsume_times: 0,
            prepared_transaction_offset: 0,
        };
        batch
            .push(&input)
            .map_err(|e| invalid(format!("message {index}: {e}")))?;
    }
    Ok(batch)
}
