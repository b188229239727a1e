//! One function per request kind: validate, ask the owning storage shard, encode the answer.
//!
//! Owns the mapping from storage outcomes and errors to wire statuses, and the per-byte work
//! of the send path (turning wire messages into stored records, body CRC included), so storage
//! cores only assign offsets and write. Every error answer names the thing and the limit.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use flatbuffers::FlatBufferBuilder;
use futures_lite::future;
use shardmq_schema::{
    build_frame, negotiate_protocol_version, wire, FrameEncoder, FrameError, FrameHeader,
    VerifiedFrame,
};
use shardmq_schema::{MIN_PROTOCOL_VERSION, PROTOCOL_VERSION};

use super::connection::Connection;
use super::{AskError, NetworkShard, Outbound};
use crate::groups::ConsumerMembership;
use crate::mesh::{PullQuery, StorageRequest};
pub use crate::msgid::{offset_message_id, parse_offset_message_id};
use crate::naming::{
    check_group_name, check_topic_name, is_system_topic, DLQ_TOPIC_PREFIX, RETRY_TOPIC_PREFIX,
};
use crate::store::record::{RecordInput, SYS_FLAG_COMPRESSED};
use crate::store::{AppendStatus, EncodedBatch, GetResult, GetStatus, StoreError, TagFilter};
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
            StoreError::Closed => wire::Status::SERVICE_NOT_AVAILABLE,
            _ => wire::Status::SYSTEM_ERROR,
        };
        refuse(status, error.to_string())
    }
}

pub(super) type Answer = Result<Outbound, Refusal>;

/// Handles one request frame; `None` for one-way frames that need no answer.
pub async fn handle(
    shard: &NetworkShard,
    connection: &Connection,
    frame: VerifiedFrame,
) -> Option<Outbound> {
    let request = frame.frame();
    let request_id = request.request_id();
    let is_one_way = request.kind() == wire::FrameKind::ONE_WAY;
    let started = std::time::Instant::now();
    let answer = dispatch(shard, connection, &frame).await;
    let metrics = crate::metrics::broker();
    if let Some(send) = request.body_as_send_request() {
        metrics
            .send_latency
            .observe(started.elapsed().as_secs_f64());
        if answer.is_ok() {
            let messages = send.messages().map(|m| m.len()).unwrap_or(0);
            let body_bytes = send
                .messages()
                .iter()
                .flat_map(|v| v.iter())
                .map(|m| m.body().map_or(0, |b| b.len()))
                .sum();
            metrics.stored(send.topic().unwrap_or_default(), messages, body_bytes);
        }
    }
    if is_one_way {
        return None;
    }
    metrics.answered(match &answer {
        Ok(_) => wire::Status::OK,
        Err(refusal) => refusal.status,
    });
    Some(match answer {
        Ok(frames) => frames,
        Err(refusal) => match shard
            .with_encoder(|e| e.encode_error_response(request_id, refusal.status, &refusal.message))
        {
            Ok(frame) => vec![frame],
            Err(_) => Vec::new(),
        },
    })
}

async fn dispatch(shard: &NetworkShard, connection: &Connection, frame: &VerifiedFrame) -> Answer {
    let request = frame.frame();
    let id = request.request_id();
    if let Some(handshake) = request.body_as_handshake_request() {
        return handshake_answer(shard, connection, id, handshake);
    }
    if !connection.is_handshaken.get() {
        return Err(refuse(
            wire::Status::HANDSHAKE_REQUIRED,
            "the first request on a connection must be a HandshakeRequest",
        ));
    }
    if shard.config.role() == crate::config::BrokerRole::Slave && is_write_request(&request) {
        return Err(refuse(
            wire::Status::SERVICE_NOT_AVAILABLE,
            format!(
                "this broker is a slave of {} (broker id {}): it takes no sends or topic changes; use the master",
                shard.config.ha_master, shard.config.broker_id
            ),
        ));
    }
    if let Some(r) = request.body_as_replica_pull_request() {
        return handle_replica_pull(shard, id, r).await;
    }
    if let Some(r) = request.body_as_replica_join_request() {
        return handle_replica_join(shard, id, r).await;
    }
    if let Some(r) = request.body_as_replica_file_request() {
        return handle_replica_file(shard, id, r).await;
    }
    if let Some(send) = request.body_as_send_request() {
        return handle_send(shard, connection, id, send).await;
    }
    if request.body_as_broker_status_request().is_some() {
        return super::admin::broker_status(shard, id).await;
    }
    if request.body_as_group_list_request().is_some() {
        return super::admin::group_list(shard, id).await;
    }
    if let Some(pull) = request.body_as_pull_request() {
        return handle_pull(shard, id, pull).await;
    }
    if let Some(r) = request.body_as_query_consumer_offset_request() {
        let (group, topic, queue_id) =
            group_queue(shard, r.consumer_group(), r.topic(), r.queue_id())?;
        let shard_id = shard.shard_of(&topic, queue_id);
        let offset = shard
            .ask(shard_id, |reply| StorageRequest::QueryConsumerOffset {
                group,
                topic,
                queue_id,
                reply,
            })
            .await?;
        return match offset {
            Some(offset) => encode_ok(shard, id, |b| {
                let body = wire::OffsetResponse::create(
                    b,
                    &wire::OffsetResponseArgs {
                        offset: offset as i64,
                    },
                );
                (wire::Body::OffsetResponse, body.as_union_value())
            }),
            None => Err(refuse(
                wire::Status::CONSUMER_GROUP_NOT_FOUND,
                "the group has no committed offset for this queue",
            )),
        };
    }
    if let Some(r) = request.body_as_commit_consumer_offset_request() {
        let (group, topic, queue_id) =
            group_queue(shard, r.consumer_group(), r.topic(), r.queue_id())?;
        let offset =
            u64::try_from(r.offset()).map_err(|_| invalid("offset must not be negative"))?;
        let shard_id = shard.shard_of(&topic, queue_id);
        shard
            .ask(shard_id, |reply| StorageRequest::CommitConsumerOffset {
                group,
                topic,
                queue_id,
                offset,
                reply,
            })
            .await?;
        return encode_status(shard, id, wire::Status::OK, "");
    }
    if let Some(r) = request.body_as_queue_offsets_request() {
        let (topic, queue_id) = readable_queue(shard, r.topic(), r.queue_id())?;
        let shard_id = shard.shard_of(&topic, queue_id);
        let offsets = shard
            .ask(shard_id, |reply| StorageRequest::QueueOffsets {
                topic,
                queue_id,
                reply,
            })
            .await?
            .unwrap_or((0, 0));
        return encode_ok(shard, id, |b| {
            let body = wire::QueueOffsetsResponse::create(
                b,
                &wire::QueueOffsetsResponseArgs {
                    min_offset: offsets.0 as i64,
                    max_offset: offsets.1 as i64,
                },
            );
            (wire::Body::QueueOffsetsResponse, body.as_union_value())
        });
    }
    if let Some(r) = request.body_as_offset_by_time_request() {
        let (topic, queue_id) = readable_queue(shard, r.topic(), r.queue_id())?;
        let timestamp_ms = r.timestamp_ms();
        let shard_id = shard.shard_of(&topic, queue_id);
        let offset = shard
            .ask(shard_id, |reply| StorageRequest::OffsetByTime {
                topic,
                queue_id,
                timestamp_ms,
                reply,
            })
            .await??;
        return encode_ok(shard, id, |b| {
            let body = wire::OffsetResponse::create(
                b,
                &wire::OffsetResponseArgs {
                    offset: offset as i64,
                },
            );
            (wire::Body::OffsetResponse, body.as_union_value())
        });
    }
    if let Some(r) = request.body_as_heartbeat_request() {
        return handle_heartbeat(shard, connection, id, r).await;
    }
    if let Some(r) = request.body_as_unregister_client_request() {
        let client_id = r.client_id().unwrap_or_default().to_owned();
        let producer_group = r
            .producer_group()
            .filter(|g| !g.is_empty())
            .map(str::to_owned);
        let consumer_group = r
            .consumer_group()
            .filter(|g| !g.is_empty())
            .map(str::to_owned);
        shard.forget_heartbeat(connection.id);
        shard
            .ask(0, |reply| StorageRequest::UnregisterClient {
                client_id,
                producer_group,
                consumer_group,
                reply,
            })
            .await?;
        return encode_status(shard, id, wire::Status::OK, "");
    }
    if let Some(r) = request.body_as_consumer_list_request() {
        let group = r.consumer_group().unwrap_or_default().to_owned();
        check_group_name(&group).map_err(invalid)?;
        let members = shard
            .ask(0, |reply| StorageRequest::ConsumerList { group, reply })
            .await?;
        return encode_ok(shard, id, |b| {
            let ids: Vec<_> = members.iter().map(|m| b.create_string(m)).collect();
            let ids = b.create_vector(&ids);
            let body = wire::ConsumerListResponse::create(
                b,
                &wire::ConsumerListResponseArgs {
                    client_ids: Some(ids),
                },
            );
            (wire::Body::ConsumerListResponse, body.as_union_value())
        });
    }
    if let Some(r) = request.body_as_upsert_topic_request() {
        let config = r.config().ok_or_else(|| invalid("config is missing"))?;
        let config = TopicConfig::from_wire(&config);
        let is_create_only = r.create_only();
        let outcome = shard
            .ask(0, |reply| StorageRequest::UpsertTopic {
                config,
                is_create_only,
                reply,
            })
            .await?;
        return match outcome {
            Ok(()) => encode_status(shard, id, wire::Status::OK, ""),
            Err(UpsertError::Exists) => Err(refuse(
                wire::Status::TOPIC_ALREADY_EXISTS,
                "the topic already exists",
            )),
            Err(UpsertError::Invalid(why)) => Err(invalid(why)),
        };
    }
    if let Some(r) = request.body_as_delete_topic_request() {
        let topic = r.topic().unwrap_or_default().to_owned();
        check_topic_name(&topic).map_err(invalid)?;
        if is_system_topic(&topic) {
            // The broker's own machinery reads them (delays, timers, transactions, retries,
            // dead letters); deleting one would lose what is parked there. Only a group's
            // retry or dead-letter topic may go, forced, once the group has no live member.
            let group = topic
                .strip_prefix(RETRY_TOPIC_PREFIX)
                .or_else(|| topic.strip_prefix(DLQ_TOPIC_PREFIX))
                .map(str::to_owned);
            let Some(group) = group.filter(|_| r.force()) else {
                return Err(refuse(
                    wire::Status::NO_PERMISSION,
                    format!("{topic} is a system topic; the broker owns it and it cannot be deleted (a group's %RETRY%/%DLQ% topic can be, forced, once the group has no live member)"),
                ));
            };
            let members = shard
                .ask(0, |reply| StorageRequest::ConsumerList {
                    group: group.clone(),
                    reply,
                })
                .await?;
            if !members.is_empty() {
                return Err(refuse(
                    wire::Status::NO_PERMISSION,
                    format!(
                        "group {group} has {} live member(s); stop its consumers before deleting {topic}",
                        members.len()
                    ),
                ));
            }
        }
        let removed = shard
            .ask(0, |reply| StorageRequest::DeleteTopic { topic, reply })
            .await?;
        return if removed {
            encode_status(shard, id, wire::Status::OK, "")
        } else {
            Err(refuse(wire::Status::TOPIC_NOT_FOUND, "no such topic"))
        };
    }
    if let Some(r) = request.body_as_broker_topics_request() {
        let include_system = r.include_system();
        let table = shard.topics();
        return encode_ok(shard, id, |b| {
            let configs: Vec<_> = table
                .topics
                .values()
                .filter(|t| include_system || !is_system_topic(&t.name))
                .map(|t| t.to_wire(b))
                .collect();
            let topics = b.create_vector(&configs);
            let body = wire::BrokerTopicsResponse::create(
                b,
                &wire::BrokerTopicsResponseArgs {
                    topics: Some(topics),
                },
            );
            (wire::Body::BrokerTopicsResponse, body.as_union_value())
        });
    }
    if request.body_as_topic_list_request().is_some() {
        let table = shard.topics();
        return encode_ok(shard, id, |b| {
            let names: Vec<_> = table
                .topics
                .keys()
                .filter(|t| !is_system_topic(t))
                .map(|t| b.create_string(t))
                .collect();
            let names = b.create_vector(&names);
            let body = wire::TopicListResponse::create(
                b,
                &wire::TopicListResponseArgs {
                    topics: Some(names),
                },
            );
            (wire::Body::TopicListResponse, body.as_union_value())
        });
    }
    if let Some(r) = request.body_as_topic_stats_request() {
        return handle_topic_stats(shard, id, r.topic().unwrap_or_default()).await;
    }
    if let Some(r) = request.body_as_query_by_key_request() {
        let topic = r.topic().unwrap_or_default().to_owned();
        check_topic_name(&topic).map_err(invalid)?;
        let key = r
            .key()
            .filter(|k| !k.is_empty())
            .ok_or_else(|| invalid("key is missing"))?
            .to_owned();
        let (begin_ms, end_ms) = time_range(r.begin_ms(), r.end_ms());
        let max_results = r.max_results().clamp(1, 64) as usize;
        let mut found: Vec<Bytes> = Vec::new();
        for storage in 0..shard.storage_shards() {
            let (topic, key) = (topic.clone(), key.clone());
            let records = shard
                .ask(storage, |reply| StorageRequest::QueryByKey {
                    topic,
                    key,
                    begin_ms,
                    end_ms,
                    max_results,
                    reply,
                })
                .await??;
            found.extend(records);
        }
        found.truncate(max_results);
        return encode_query(shard, id, found);
    }
    if let Some(r) = request.body_as_send_half_request() {
        return super::transaction::handle_send_half(shard, connection, id, r).await;
    }
    if let Some(r) = request.body_as_end_transaction_request() {
        return super::transaction::handle_end_transaction(shard, id, r).await;
    }
    if let Some(r) = request.body_as_lock_batch_request() {
        return super::queue_locks::handle_lock_batch(shard, connection, id, r).await;
    }
    if let Some(r) = request.body_as_unlock_batch_request() {
        return super::queue_locks::handle_unlock_batch(shard, connection, id, r).await;
    }
    if let Some(r) = request.body_as_query_by_id_request() {
        return handle_query_by_id(shard, id, r).await;
    }
    if let Some(r) = request.body_as_consumer_send_back_request() {
        let outcome = super::send_back::send_back(shard, r)
            .await
            .map_err(|e| refuse(e.status, e.message))?;
        return encode_ok(shard, id, |b| {
            let topic = b.create_string(&outcome.topic);
            let body = wire::ConsumerSendBackResponse::create(
                b,
                &wire::ConsumerSendBackResponseArgs {
                    topic: Some(topic),
                    reconsume_times: outcome.reconsume_times,
                    is_dead_letter: outcome.is_dead_letter,
                },
            );
            (wire::Body::ConsumerSendBackResponse, body.as_union_value())
        });
    }
    Err(refuse(
        wire::Status::UNKNOWN_REQUEST,
        format!(
            "request kind {:?} is not served by this broker",
            request.body_type()
        ),
    ))
}

fn handshake_answer(
    shard: &NetworkShard,
    connection: &Connection,
    id: u64,
    r: wire::HandshakeRequest<'_>,
) -> Answer {
    let negotiated = negotiate_protocol_version(r.protocol_version(), r.min_protocol_version());
    let refusal_message;
    let (status, message) = match negotiated {
        Some(_) => (wire::Status::OK, None),
        None => {
            refusal_message = format!(
                "client speaks protocol versions {}..={}, this broker {MIN_PROTOCOL_VERSION}..={PROTOCOL_VERSION}",
                r.min_protocol_version(),
                r.protocol_version()
            );
            (
                wire::Status::UNSUPPORTED_VERSION,
                Some(refusal_message.as_str()),
            )
        }
    };
    match negotiated {
        Some(_) => {
            if let Some(client_id) = r.client_id().filter(|c| !c.is_empty()) {
                *connection.client_id.borrow_mut() = Some(client_id.to_owned());
                shard.set_client(connection.id, client_id.to_owned());
            }
            connection.is_handshaken.set(true);
        }
        // The answer still describes this broker, so the client can say what to upgrade; then
        // the connection closes (docs/protocol.md, handshake).
        None => connection.close_after_answers(),
    }
    let config = &shard.config;
    shard
        .with_encoder(|encoder| {
            encoder.encode(|b| {
                let name = b.create_string("shardmq-broker");
                let version_text = b.create_string(env!("CARGO_PKG_VERSION"));
                let cluster = b.create_string(&config.cluster_name);
                let broker = b.create_string(&config.broker_name);
                let server = wire::ServerInfo::create(
                    b,
                    &wire::ServerInfoArgs {
                        name: Some(name),
                        version: Some(version_text),
                        cluster_name: Some(cluster),
                        broker_name: Some(broker),
                        broker_id: config.broker_id,
                    },
                );
                let body = wire::HandshakeResponse::create(
                    b,
                    &wire::HandshakeResponseArgs {
                        protocol_version: negotiated.unwrap_or(0),
                        min_protocol_version: MIN_PROTOCOL_VERSION,
                        max_protocol_version: PROTOCOL_VERSION,
                        server: Some(server),
                        max_frame_bytes: config.max_frame_bytes as u32,
                        max_message_bytes: config.max_message_bytes as u32,
                    },
                );
                let mut header = FrameHeader::response(id, status);
                if let Some(message) = message {
                    header = header.with_message(message);
                }
                build_frame(
                    b,
                    &header,
                    wire::Body::HandshakeResponse,
                    Some(body.as_union_value()),
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

async fn handle_send(
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

async fn handle_pull(shard: &NetworkShard, id: u64, r: wire::PullRequest<'_>) -> Answer {
    let (topic, queue_id) = readable_queue(shard, r.topic(), r.queue_id())?;
    if let Some(group) = r.consumer_group().filter(|g| !g.is_empty()) {
        check_group_name(group).map_err(invalid)?;
        if r.commit_offset() >= 0 {
            let (group, topic, offset) =
                (group.to_owned(), topic.clone(), r.commit_offset() as u64);
            shard
                .ask(shard.shard_of(&topic, queue_id), |reply| {
                    StorageRequest::CommitConsumerOffset {
                        group,
                        topic,
                        queue_id,
                        offset,
                        reply,
                    }
                })
                .await?;
        }
    }
    let offset = u64::try_from(r.queue_offset())
        .map_err(|_| invalid("queue_offset must not be negative"))?;
    let expression = r.tag_expression().unwrap_or("*");
    if expression.contains('\u{1}') || expression.contains('\u{2}') {
        return Err(refuse(
            wire::Status::INVALID_TAG_EXPRESSION,
            "tag expression contains control characters",
        ));
    }
    let query = PullQuery {
        topic,
        queue_id,
        offset,
        max_messages: r.max_messages().clamp(1, shard.config.max_pull_messages),
        max_bytes: match u64::from(r.max_bytes()) {
            0 => shard.config.max_pull_bytes,
            n => n.min(shard.config.max_pull_bytes),
        },
        filter: TagFilter::parse(expression),
    };
    let metrics_topic = query.topic.clone();
    let suspend_ms = u64::from(r.suspend_timeout_ms()).min(shard.config.max_suspend_timeout_ms);
    let storage = shard.shard_of(&query.topic, queue_id);
    let slot = if suspend_ms > 0 {
        shard
            .parking
            .park(&query.topic, queue_id, shard.config.max_parked_pulls)
    } else {
        None
    };
    // Listen before asking, so an arrival between the answer and the wait is not missed.
    let arrival = slot.as_ref().map(|s| s.notify.notified());
    let watch_for = slot.as_ref().map(|_| shard.id);
    let first_query = query.clone();
    let result = shard
        .ask(storage, |reply| StorageRequest::Pull {
            query: first_query,
            watch_for,
            reply,
        })
        .await??;
    let is_empty = matches!(result.status, GetStatus::NoNewMessage)
        || (result.status == GetStatus::NoMatchedQueue && offset == 0);
    let result = match (is_empty, arrival) {
        (true, Some(arrival)) => {
            let timeout = glommio::timer::sleep(Duration::from_millis(suspend_ms));
            let woke = future::or(
                async {
                    arrival.await;
                    true
                },
                async {
                    timeout.await;
                    false
                },
            )
            .await;
            drop(slot);
            if woke {
                shard
                    .ask(storage, |reply| StorageRequest::Pull {
                        query,
                        watch_for: None,
                        reply,
                    })
                    .await??
            } else {
                result
            }
        }
        _ => result,
    };
    crate::metrics::broker().pulled(
        &metrics_topic,
        result.records.len(),
        result.records.iter().map(Bytes::len).sum(),
    );
    encode_pull(shard, id, result, offset)
}

fn encode_pull(shard: &NetworkShard, id: u64, result: GetResult, requested: u64) -> Answer {
    let status = match result.status {
        GetStatus::Found => wire::Status::OK,
        GetStatus::NoMatchedMessage => wire::Status::PULL_RETRY_IMMEDIATELY,
        GetStatus::NoNewMessage => wire::Status::PULL_NOT_FOUND,
        GetStatus::NoMatchedQueue if requested == 0 => wire::Status::PULL_NOT_FOUND,
        GetStatus::NoMatchedQueue | GetStatus::OffsetTooSmall | GetStatus::OffsetOverflow => {
            wire::Status::PULL_OFFSET_MOVED
        }
    };
    let total: usize = result.records.iter().map(Bytes::len).sum();
    let mut head = BytesMut::new();
    shard
        .with_encoder(|encoder| {
            encoder.encode_head_with_trailing_bytes(&mut head, total, |b, records| {
                let body = wire::PullResponse::create(
                    b,
                    &wire::PullResponseArgs {
                        next_begin_offset: result.next_offset as i64,
                        min_offset: result.min_offset as i64,
                        max_offset: result.max_offset as i64,
                        records: Some(records),
                        suggest_which_broker_id: result.suggest_broker_id,
                    },
                );
                build_frame(
                    b,
                    &FrameHeader::response(id, status),
                    wire::Body::PullResponse,
                    Some(body.as_union_value()),
                )
            })
        })
        .map_err(frame_error)?;
    let mut frames = Vec::with_capacity(result.records.len() + 1);
    frames.push(head.freeze());
    frames.extend(result.records);
    Ok(frames)
}

async fn handle_heartbeat(
    shard: &NetworkShard,
    connection: &Connection,
    id: u64,
    r: wire::HeartbeatRequest<'_>,
) -> Answer {
    let client_id = r
        .client_id()
        .filter(|c| !c.is_empty())
        .map(str::to_owned)
        .or_else(|| connection.client_id.borrow().clone())
        .ok_or_else(|| invalid("client_id is missing"))?;
    let mut producer_groups = Vec::new();
    for group in r.producer_groups().iter().flat_map(|v| v.iter()) {
        check_group_name(group).map_err(invalid)?;
        producer_groups.push(group.to_owned());
    }
    let mut consumer_groups = BTreeMap::new();
    for info in r.consumer_groups().iter().flat_map(|v| v.iter()) {
        let group = info.group().unwrap_or_default();
        check_group_name(group).map_err(invalid)?;
        let mut subscriptions = Vec::new();
        for sub in info.subscriptions().iter().flat_map(|v| v.iter()) {
            let topic = sub.topic().unwrap_or_default();
            check_topic_name(topic).map_err(invalid)?;
            subscriptions.push((topic.to_owned(), sub.expression().unwrap_or("*").to_owned()));
        }
        consumer_groups.insert(
            group.to_owned(),
            ConsumerMembership {
                is_broadcasting: info.message_model() == wire::MessageModel::BROADCASTING,
                is_orderly: info.is_orderly(),
                subscriptions,
            },
        );
    }
    if shard.connection_push(connection.id).is_none() {
        // The connection closed while this heartbeat waited: its client has left its groups,
        // and must not be registered again by a heartbeat nobody will follow.
        return encode_status(shard, id, wire::Status::OK, "");
    }
    let digest = heartbeat_digest(&client_id, &producer_groups, &consumer_groups);
    if shard.heartbeat_is_repeat(connection.id, digest, &client_id) {
        crate::metrics::broker().heartbeats_refreshed.inc();
        return encode_status(shard, id, wire::Status::OK, "");
    }
    crate::metrics::broker().heartbeats_applied.inc();
    shard.set_client(connection.id, client_id.clone());
    *connection.client_id.borrow_mut() = Some(client_id.clone());
    shard.set_consumer_groups(connection.id, consumer_groups.keys().cloned().collect());
    shard
        .ask(0, |reply| StorageRequest::Heartbeat {
            client_id,
            connection: shard.connection_key(connection.id),
            producer_groups,
            consumer_groups,
            reply,
        })
        .await?;
    shard.heartbeat_applied(connection.id, digest);
    encode_status(shard, id, wire::Status::OK, "")
}

/// What a heartbeat says, hashed: two heartbeats with the same digest register the same client
/// in the same groups with the same subscriptions.
fn heartbeat_digest(
    client_id: &str,
    producer_groups: &[String],
    consumer_groups: &BTreeMap<String, ConsumerMembership>,
) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    client_id.hash(&mut hasher);
    producer_groups.hash(&mut hasher);
    for (group, membership) in consumer_groups {
        group.hash(&mut hasher);
        membership.is_broadcasting.hash(&mut hasher);
        membership.is_orderly.hash(&mut hasher);
        membership.subscriptions.hash(&mut hasher);
    }
    hasher.finish()
}

async fn handle_topic_stats(shard: &NetworkShard, id: u64, topic: &str) -> Answer {
    check_topic_name(topic).map_err(invalid)?;
    let table = shard.topics();
    let config = table.get(topic).ok_or_else(|| {
        refuse(
            wire::Status::TOPIC_NOT_FOUND,
            format!("topic {topic} does not exist"),
        )
    })?;
    let queues = config.read_queues.max(config.write_queues);
    let mut by_shard: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
    for queue_id in 0..queues {
        by_shard
            .entry(shard.shard_of(topic, queue_id))
            .or_default()
            .push(queue_id);
    }
    let mut stats = Vec::new();
    for (storage, queue_ids) in by_shard {
        let topic = topic.to_owned();
        stats.extend(
            shard
                .ask(storage, |reply| StorageRequest::QueueStats {
                    topic,
                    queue_ids,
                    reply,
                })
                .await?,
        );
    }
    stats.sort_by_key(|s| s.queue_id);
    encode_ok(shard, id, |b| {
        let name = b.create_string(topic);
        let queues: Vec<_> = stats
            .iter()
            .map(|s| {
                wire::QueueStats::create(
                    b,
                    &wire::QueueStatsArgs {
                        queue_id: s.queue_id as i32,
                        min_offset: s.min_offset as i64,
                        max_offset: s.max_offset as i64,
                        last_update_ms: s.last_update_ms,
                    },
                )
            })
            .collect();
        let queues = b.create_vector(&queues);
        let body = wire::TopicStatsResponse::create(
            b,
            &wire::TopicStatsResponseArgs {
                topic: Some(name),
                queues: Some(queues),
            },
        );
        (wire::Body::TopicStatsResponse, body.as_union_value())
    })
}

async fn handle_query_by_id(
    shard: &NetworkShard,
    id: u64,
    r: wire::QueryByIdRequest<'_>,
) -> Answer {
    let (begin_ms, end_ms) = time_range(r.begin_ms(), r.end_ms());
    if let Some(offset_id) = r.offset_msg_id().filter(|o| !o.is_empty()) {
        let (_, storage, physical_offset) =
            parse_offset_message_id(offset_id).ok_or_else(|| {
                invalid(format!(
                    "offset_msg_id `{offset_id}` is not 32 hex characters"
                ))
            })?;
        if storage >= shard.storage_shards() {
            return Err(refuse(
                wire::Status::QUERY_NOT_FOUND,
                "the offset id names a storage shard this broker lacks",
            ));
        }
        let record = shard
            .ask(storage, |reply| StorageRequest::ReadAt {
                physical_offset,
                reply,
            })
            .await?;
        return match record {
            Ok(record) => encode_query(shard, id, vec![record]),
            Err(_) => Err(refuse(
                wire::Status::QUERY_NOT_FOUND,
                "no message at that offset id",
            )),
        };
    }
    let unique_id = r
        .unique_id()
        .filter(|u| !u.is_empty())
        .ok_or_else(|| invalid("either unique_id or offset_msg_id is required"))?
        .to_owned();
    let mut found = Vec::new();
    for storage in 0..shard.storage_shards() {
        let unique_id = unique_id.clone();
        found.extend(
            shard
                .ask(storage, |reply| StorageRequest::QueryByUniqueId {
                    unique_id,
                    begin_ms,
                    end_ms,
                    reply,
                })
                .await??,
        );
    }
    encode_query(shard, id, found)
}

/// Requests a slave refuses: they would write its CommitLog or topic table, which only its
/// master's replication may change.
fn is_write_request(request: &wire::Frame<'_>) -> bool {
    request.body_as_send_request().is_some()
        || request.body_as_send_half_request().is_some()
        || request.body_as_end_transaction_request().is_some()
        || request.body_as_upsert_topic_request().is_some()
        || request.body_as_delete_topic_request().is_some()
        || request.body_as_consumer_send_back_request().is_some()
}

/// Refuses replication requests to a slave (only a master serves its CommitLog).
fn refuse_if_slave(shard: &NetworkShard) -> Result<(), Refusal> {
    if shard.config.role() == crate::config::BrokerRole::Slave {
        return Err(refuse(
            wire::Status::SERVICE_NOT_AVAILABLE,
            "this broker is a slave: replicate from its master",
        ));
    }
    Ok(())
}

fn replica_storage_shard(shard: &NetworkShard, storage: u32) -> Result<usize, Refusal> {
    let storage = storage as usize;
    if storage >= shard.storage_shards() {
        return Err(invalid(format!(
            "storage shard {storage} does not exist here ({} shards): master and slave must have the same storage shard count",
            shard.storage_shards()
        )));
    }
    Ok(storage)
}

/// A slave joins for one storage shard (`replication.rs`): it must be of this cluster and
/// broker name, a slave id, with the same storage shard count; the answer says where the bytes
/// it shares with this master end (store/epochs.rs).
async fn handle_replica_join(
    shard: &NetworkShard,
    id: u64,
    r: wire::ReplicaJoinRequest<'_>,
) -> Answer {
    refuse_if_slave(shard)?;
    let config = &shard.config;
    let (cluster, broker) = (
        r.cluster_name().unwrap_or_default(),
        r.broker_name().unwrap_or_default(),
    );
    if cluster != config.cluster_name || broker != config.broker_name {
        return Err(invalid(format!(
            "this master is {} of cluster {}; a slave of {broker} in cluster {cluster} cannot replicate from it",
            config.broker_name, config.cluster_name
        )));
    }
    if r.broker_id() <= 0 {
        return Err(invalid(format!(
            "a slave has a broker id above 0, not {}",
            r.broker_id()
        )));
    }
    if r.storage_shards() as usize != shard.storage_shards() {
        return Err(invalid(format!(
            "this master has {} storage shards and the slave {}: they must match (the data directory records the count)",
            shard.storage_shards(),
            r.storage_shards()
        )));
    }
    let storage = replica_storage_shard(shard, r.storage_shard())?;
    let mut epochs = crate::store::epochs::EpochLog::default();
    for entry in r.epochs().iter().flat_map(|v| v.iter()) {
        epochs
            .push(crate::store::epochs::Epoch {
                epoch: entry.epoch(),
                start: entry.start(),
            })
            .map_err(|why| invalid(format!("the slave's epochs are out of order: {why}")))?;
    }
    let (end, broker_id) = (r.end(), r.broker_id());
    let peer = r.slave_address().unwrap_or_default().to_owned();
    let answer = shard
        .ask(storage, |reply| StorageRequest::ReplicaJoin {
            broker_id,
            peer,
            end,
            epochs,
            reply,
        })
        .await?;
    encode_ok(shard, id, |b| {
        let entries: Vec<wire::EpochEntry> = answer
            .epochs
            .iter()
            .map(|e| wire::EpochEntry::new(e.epoch, e.start))
            .collect();
        let entries = b.create_vector(&entries);
        let body = wire::ReplicaJoinResponse::create(
            b,
            &wire::ReplicaJoinResponseArgs {
                epoch: answer.epoch,
                epochs: Some(entries),
                master_end: answer.master_end,
                consistent_end: answer.consistent_end,
            },
        );
        (wire::Body::ReplicaJoinResponse, body.as_union_value())
    })
}

/// A slave copies one of the master's per-shard state files (`replication::COPIED_FILES`).
async fn handle_replica_file(
    shard: &NetworkShard,
    id: u64,
    r: wire::ReplicaFileRequest<'_>,
) -> Answer {
    refuse_if_slave(shard)?;
    let storage = replica_storage_shard(shard, r.storage_shard())?;
    let asked = r.name().unwrap_or_default();
    let Some(name) = crate::replication::COPIED_FILES
        .iter()
        .copied()
        .find(|n| *n == asked)
    else {
        return Err(invalid(format!(
            "{asked:?} is not a file a slave copies (only {})",
            crate::replication::COPIED_FILES.join(", ")
        )));
    };
    let (data, master_end) = shard
        .ask(storage, |reply| StorageRequest::ReadShardFile {
            name,
            reply,
        })
        .await?;
    encode_ok(shard, id, |b| {
        let present = data.is_some();
        let data = data.map(|d| b.create_vector(&d));
        let body = wire::ReplicaFileResponse::create(
            b,
            &wire::ReplicaFileResponseArgs {
                present,
                data,
                master_end,
            },
        );
        (wire::Body::ReplicaFileResponse, body.as_union_value())
    })
}

/// A slave's replica pull (`replication.rs`): the CommitLog bytes of one storage shard from
/// where the slave's log ends, sent as the answer's trailing bytes (a slice of the write ring
/// or of a disk read, not copied).
async fn handle_replica_pull(
    shard: &NetworkShard,
    id: u64,
    r: wire::ReplicaPullRequest<'_>,
) -> Answer {
    refuse_if_slave(shard)?;
    let storage = replica_storage_shard(shard, r.storage_shard())?;
    let from = r.from();
    let max_bytes = u64::from(
        r.max_bytes()
            .clamp(1, crate::replication::REPLICA_PULL_BYTES),
    );
    let suspend_ms = u64::from(r.suspend_timeout_ms()).min(shard.config.max_suspend_timeout_ms);
    let (acknowledged, epoch, broker_id) = (r.acknowledged(), r.epoch(), r.broker_id());
    let chunk = shard
        .ask(storage, |reply| StorageRequest::ReadForReplica {
            from,
            acknowledged,
            max_bytes,
            suspend_ms,
            epoch,
            broker_id,
            reply,
        })
        .await?
        .map_err(|e| refuse(wire::Status::INVALID_ARGUMENT, e))?;
    let mut head = BytesMut::new();
    shard
        .with_encoder(|encoder| {
            encoder.encode_head_with_trailing_bytes(&mut head, chunk.bytes.len(), |b, vector| {
                let body = wire::ReplicaPullResponse::create(
                    b,
                    &wire::ReplicaPullResponseArgs {
                        from,
                        master_end: chunk.master_end,
                        data: Some(vector),
                        epoch: chunk.epoch,
                        lag_ms: chunk.lag_ms,
                    },
                );
                build_frame(
                    b,
                    &FrameHeader::response(id, wire::Status::OK),
                    wire::Body::ReplicaPullResponse,
                    Some(body.as_union_value()),
                )
            })
        })
        .map_err(frame_error)?;
    Ok(vec![head.freeze(), chunk.bytes])
}

fn encode_query(shard: &NetworkShard, id: u64, mut records: Vec<Bytes>) -> Answer {
    if records.is_empty() {
        return Err(refuse(wire::Status::QUERY_NOT_FOUND, "no message matched"));
    }
    // Merged from every storage shard: bounded in bytes as each shard's part is.
    let mut total = 0usize;
    let keep = records
        .iter()
        .take_while(|record| {
            let is_first = total == 0;
            total += record.len();
            is_first || total <= crate::store::MAX_QUERY_ANSWER_BYTES
        })
        .count();
    records.truncate(keep);
    let total: usize = records.iter().map(Bytes::len).sum();
    let mut head = BytesMut::new();
    shard
        .with_encoder(|encoder| {
            encoder.encode_head_with_trailing_bytes(&mut head, total, |b, vector| {
                let body = wire::QueryResponse::create(
                    b,
                    &wire::QueryResponseArgs {
                        records: Some(vector),
                    },
                );
                build_frame(
                    b,
                    &FrameHeader::response(id, wire::Status::OK),
                    wire::Body::QueryResponse,
                    Some(body.as_union_value()),
                )
            })
        })
        .map_err(frame_error)?;
    let mut frames = vec![head.freeze()];
    frames.extend(records);
    Ok(frames)
}

fn time_range(begin_ms: i64, end_ms: i64) -> (i64, i64) {
    (begin_ms.max(0), if end_ms <= 0 { i64::MAX } else { end_ms })
}

/// (topic, queue) of a request on a topic that exists and is readable.
fn readable_queue(
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

fn group_queue(
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

/// The ONE_WAY notice that a consumer group's members changed.
pub fn encode_consumer_ids_changed(
    encoder: &mut FrameEncoder,
    group: &str,
) -> Result<Bytes, FrameError> {
    encoder.encode(|b| {
        let group = b.create_string(group);
        let body = wire::ConsumerIdsChangedNotice::create(
            b,
            &wire::ConsumerIdsChangedNoticeArgs {
                consumer_group: Some(group),
            },
        );
        build_frame(
            b,
            &FrameHeader::one_way(),
            wire::Body::ConsumerIdsChangedNotice,
            Some(body.as_union_value()),
        )
    })
}
