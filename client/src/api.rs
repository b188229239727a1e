//! Typed requests: each server request the client makes, written as a flatbuffer and its
//! answer read back into owned Rust values (docs/protocol.md, "Requests and responses").
//!
//! Owns: the mapping between the wire tables and the client's types, and between answer
//! statuses and [`Error`]s. Never: choosing a server or retrying; every function takes the
//! address to ask and the time to wait.

use std::time::Duration;

use bytes::Bytes;
use flatbuffers::{FlatBufferBuilder, WIPOffset};
use shardmq_schema::{wire, VerifiedFrame};

use crate::admin::{QueueStats, TopicConfig};
use crate::error::{Error, Result};
use crate::message::{now_ms, Delay, Message, MessageExt};
use crate::pool::ConnectionPool;
use crate::pull_consumer::{PullResult, PullStatus};
use crate::record::decode_records;
use crate::route::{BrokerData, ClusterInfo, QueueData, TopicRoute};

/// Time a pull may take beyond its long-poll hold before the client gives up on it.
pub(crate) const PULL_TIMEOUT_MARGIN: Duration = Duration::from_secs(15);

/// One stored message of a send, as the broker reports it.
#[derive(Debug, Clone)]
pub(crate) struct StoredMessage {
    pub unique_id: String,
    pub offset_msg_id: String,
    pub queue_offset: i64,
    /// Physical offset of the stored record (names a half message when ending a transaction).
    pub commit_log_offset: i64,
}

/// A send's answer: the status (OK or one of the "stored, but" statuses) and where each
/// message went.
#[derive(Debug, Clone)]
pub(crate) struct SendAnswer {
    pub status: wire::Status,
    pub queue_id: u32,
    pub stored: Vec<StoredMessage>,
}

/// What a pull asks for.
#[derive(Debug, Clone)]
pub(crate) struct PullArgs<'a> {
    pub group: &'a str,
    pub topic: &'a str,
    pub broker_name: &'a str,
    pub queue_id: u32,
    pub offset: i64,
    pub max_messages: u32,
    /// Most record bytes (0: the broker's own limit).
    pub max_bytes: u32,
    pub tag_expression: &'a str,
    pub suspend: Duration,
    /// The group's offset to commit with the pull, if any.
    pub commit_offset: Option<i64>,
}

/// One consumer group a client declares in its heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeartbeatGroup {
    pub group: String,
    pub is_broadcasting: bool,
    pub is_orderly: bool,
    /// (topic, tag expression).
    pub subscriptions: Vec<(String, String)>,
}

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

/// The stored outcome of a send (or half-message) answer for `expected` messages, or the
/// broker's refusal as an error.
pub(crate) fn send_answer(
    address: &str,
    frame: &VerifiedFrame,
    expected: usize,
) -> Result<SendAnswer> {
    let header = frame.frame();
    let status = header.status();
    let is_stored = matches!(
        status,
        wire::Status::OK
            | wire::Status::FLUSH_DISK_TIMEOUT
            | wire::Status::FLUSH_SLAVE_TIMEOUT
            | wire::Status::SLAVE_NOT_AVAILABLE
    );
    if !is_stored {
        return Err(Error::from_status(address, status, header.message()));
    }
    let response = header
        .body_as_send_response()
        .ok_or_else(|| missing_body(address, "SendResponse"))?;
    let stored: Vec<StoredMessage> = response
        .results()
        .iter()
        .flat_map(|results| results.iter())
        .map(|result| StoredMessage {
            unique_id: result.unique_id().unwrap_or_default().to_owned(),
            offset_msg_id: result.offset_msg_id().unwrap_or_default().to_owned(),
            queue_offset: result.queue_offset(),
            commit_log_offset: result.commit_log_offset(),
        })
        .collect();
    if stored.len() != expected {
        return Err(Error::UnexpectedResponse {
            address: address.to_owned(),
            detail: format!("{} results for a send of {expected} messages", stored.len()),
        });
    }
    Ok(SendAnswer {
        status,
        queue_id: u32::try_from(response.queue_id()).unwrap_or(0),
        stored,
    })
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

pub(crate) fn encode_message<'b>(
    builder: &mut FlatBufferBuilder<'b>,
    message: &Message,
    born_timestamp_ms: i64,
) -> WIPOffset<wire::Message<'b>> {
    let body = builder.create_vector(message.body());
    let tags = message.tags().map(|tags| builder.create_string(tags));
    let keys = strings(builder, message.keys());
    let unique_id = builder.create_string(message.unique_id());
    let properties = if message.properties().is_empty() {
        None
    } else {
        let pairs: Vec<_> = message
            .properties()
            .iter()
            .map(|(name, value)| {
                let key = builder.create_string(name);
                let value = builder.create_string(value);
                wire::KeyValue::create(
                    builder,
                    &wire::KeyValueArgs {
                        key: Some(key),
                        value: Some(value),
                    },
                )
            })
            .collect();
        Some(builder.create_vector(&pairs))
    };
    let (delay_level, deliver_at_ms, delay_ms) = match message.delay() {
        Delay::None => (0, 0, 0),
        Delay::Level(level) => (i32::try_from(level).unwrap_or(i32::MAX), 0, 0),
        Delay::At(at_ms) => (0, at_ms, 0),
        Delay::After(delay) => (0, 0, i64::try_from(delay.as_millis()).unwrap_or(i64::MAX)),
    };
    wire::Message::create(
        builder,
        &wire::MessageArgs {
            body: Some(body),
            tags,
            keys,
            flag: message.flag(),
            born_timestamp_ms,
            unique_id: Some(unique_id),
            properties,
            delay_level,
            deliver_at_ms,
            delay_ms,
            compression: if message.is_body_compressed() {
                wire::Compression::ZLIB
            } else {
                wire::Compression::NONE
            },
        },
    )
}

fn send_request<'b>(
    builder: &mut FlatBufferBuilder<'b>,
    topic: &str,
    queue_id: Option<u32>,
    producer_group: &str,
    messages: &[Message],
) -> WIPOffset<wire::SendRequest<'b>> {
    let born_timestamp_ms = now_ms();
    let encoded: Vec<_> = messages
        .iter()
        .map(|message| encode_message(builder, message, born_timestamp_ms))
        .collect();
    let messages = builder.create_vector(&encoded);
    let topic = builder.create_string(topic);
    let group = (!producer_group.is_empty()).then(|| builder.create_string(producer_group));
    wire::SendRequest::create(
        builder,
        &wire::SendRequestArgs {
            topic: Some(topic),
            queue_id: queue_id.map_or(-1, |id| id as i32),
            producer_group: group,
            messages: Some(messages),
        },
    )
}

fn broker_data(broker: wire::BrokerData<'_>) -> BrokerData {
    BrokerData {
        cluster_name: broker.cluster_name().unwrap_or_default().to_owned(),
        broker_name: broker.broker_name().unwrap_or_default().to_owned(),
        addresses: broker
            .addresses()
            .iter()
            .flat_map(|addresses| addresses.iter())
            .filter_map(|address| Some((address.broker_id(), address.address()?.to_owned())))
            .collect(),
    }
}

fn decode_records_of(
    address: &str,
    frame: &VerifiedFrame,
    records: Option<flatbuffers::Vector<'_, u8>>,
    broker_name: &str,
) -> Result<Vec<MessageExt>> {
    let Some(records) = records.filter(|r| !r.is_empty()) else {
        return Ok(Vec::new());
    };
    let bytes = frame
        .share(records.bytes())
        .unwrap_or_else(|| Bytes::copy_from_slice(records.bytes()));
    decode_records(&bytes, broker_name).map_err(|error| Error::CorruptRecord {
        address: address.to_owned(),
        reason: error.to_string(),
    })
}

/// A pull answer whose records are not decoded yet.
#[derive(Debug)]
pub(crate) struct UndecodedPull {
    address: String,
    pub status: PullStatus,
    pub next_begin_offset: i64,
    pub min_offset: i64,
    pub max_offset: i64,
    /// The stored records, concatenated (a slice of the answer's frame).
    records: Bytes,
    /// Which broker id to pull this queue from next (0: the master).
    pub suggest_which_broker_id: i64,
}

impl UndecodedPull {
    /// What decoding and caching this answer will add, for flow control: its records (found by
    /// their total sizes, without decoding), their bytes and the last offset it can hold.
    pub(crate) fn pending(&self) -> crate::push::Pending {
        let mut messages = 0;
        let mut at = 0usize;
        while let Some(size) = self
            .records
            .get(at..at + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        {
            messages += 1;
            if size == 0 {
                break;
            }
            at += size;
        }
        crate::push::Pending {
            messages,
            bytes: self.records.len(),
            last_offset: Some(self.next_begin_offset - 1),
        }
    }

    /// Decodes and checks the records (`broker_name`: where they were pulled from).
    pub(crate) fn decode(self, broker_name: &str) -> Result<PullResult> {
        let messages = if self.records.is_empty() {
            Vec::new()
        } else {
            decode_records(&self.records, broker_name).map_err(|error| Error::CorruptRecord {
                address: self.address.clone(),
                reason: error.to_string(),
            })?
        };
        Ok(PullResult {
            status: self.status,
            next_begin_offset: self.next_begin_offset,
            min_offset: self.min_offset,
            max_offset: self.max_offset,
            messages,
            suggest_which_broker_id: self.suggest_which_broker_id,
        })
    }
}

impl ConnectionPool {
    /// Sends `messages` (one topic) to one queue of the broker at `address` (`None`: the
    /// broker picks one) and waits for the answer.
    pub(crate) async fn send_messages(
        &self,
        address: &str,
        timeout: Duration,
        topic: &str,
        queue_id: Option<u32>,
        producer_group: &str,
        messages: &[Message],
    ) -> Result<SendAnswer> {
        let frame = self
            .request(address, "send", timeout, |builder| {
                let request = send_request(builder, topic, queue_id, producer_group, messages);
                (wire::Body::SendRequest, request.as_union_value())
            })
            .await?;
        send_answer(address, &frame, messages.len())
    }

    /// Sends `message` as a ONE_WAY frame: no answer, so no result and no error from the
    /// broker (it stores the message or drops it).
    pub(crate) async fn send_one_way(
        &self,
        address: &str,
        timeout: Duration,
        producer_group: &str,
        message: &Message,
        queue_id: Option<u32>,
    ) -> Result<()> {
        let connection = self.get(address).await?;
        connection
            .one_way(timeout, |builder| {
                let request = send_request(
                    builder,
                    message.topic(),
                    queue_id,
                    producer_group,
                    std::slice::from_ref(message),
                );
                (wire::Body::SendRequest, request.as_union_value())
            })
            .await
    }

    /// Pulls from one queue, waiting up to `args.suspend` at the broker when nothing is there.
    pub(crate) async fn pull(&self, address: &str, args: &PullArgs<'_>) -> Result<PullResult> {
        self.pull_undecoded(address, args)
            .await?
            .decode(args.broker_name)
    }

    /// Like [`pull`](Self::pull), leaving the records undecoded: the answer's status and
    /// offsets are known at once (a push consumer sends its next pull from them and decodes
    /// this answer while that one travels).
    pub(crate) async fn pull_undecoded(
        &self,
        address: &str,
        args: &PullArgs<'_>,
    ) -> Result<UndecodedPull> {
        let timeout = args.suspend + PULL_TIMEOUT_MARGIN;
        let frame = self
            .request(address, "pull", timeout, |builder| {
                let group = builder.create_string(args.group);
                let topic = builder.create_string(args.topic);
                let expression = builder.create_string(args.tag_expression);
                let request = wire::PullRequest::create(
                    builder,
                    &wire::PullRequestArgs {
                        consumer_group: Some(group),
                        topic: Some(topic),
                        queue_id: args.queue_id as i32,
                        queue_offset: args.offset,
                        max_messages: args.max_messages,
                        max_bytes: args.max_bytes,
                        tag_expression: Some(expression),
                        suspend_timeout_ms: u32::try_from(args.suspend.as_millis())
                            .unwrap_or(u32::MAX),
                        commit_offset: args.commit_offset.unwrap_or(-1),
                    },
                );
                (wire::Body::PullRequest, request.as_union_value())
            })
            .await?;
        let header = frame.frame();
        let status = match header.status() {
            wire::Status::OK => PullStatus::Found,
            wire::Status::PULL_NOT_FOUND => PullStatus::NoNewMessage,
            wire::Status::PULL_RETRY_IMMEDIATELY => PullStatus::NoMatchedMessage,
            wire::Status::PULL_OFFSET_MOVED => PullStatus::OffsetIllegal,
            other => return Err(Error::from_status(address, other, header.message())),
        };
        let response = header
            .body_as_pull_response()
            .ok_or_else(|| missing_body(address, "PullResponse"))?;
        let records = match response.records().filter(|r| !r.is_empty()) {
            Some(records) if status == PullStatus::Found => frame
                .share(records.bytes())
                .unwrap_or_else(|| Bytes::copy_from_slice(records.bytes())),
            _ => Bytes::new(),
        };
        Ok(UndecodedPull {
            address: address.to_owned(),
            status,
            next_begin_offset: response.next_begin_offset(),
            min_offset: response.min_offset(),
            max_offset: response.max_offset(),
            records,
            suggest_which_broker_id: response.suggest_which_broker_id(),
        })
    }

    /// The group's committed offset of a queue; `None` when it never committed one.
    pub(crate) async fn query_consumer_offset(
        &self,
        address: &str,
        timeout: Duration,
        group: &str,
        topic: &str,
        queue_id: u32,
    ) -> Result<Option<i64>> {
        let frame = self
            .request(address, "query consumer offset", timeout, |builder| {
                let group = builder.create_string(group);
                let topic = builder.create_string(topic);
                let request = wire::QueryConsumerOffsetRequest::create(
                    builder,
                    &wire::QueryConsumerOffsetRequestArgs {
                        consumer_group: Some(group),
                        topic: Some(topic),
                        queue_id: queue_id as i32,
                    },
                );
                (
                    wire::Body::QueryConsumerOffsetRequest,
                    request.as_union_value(),
                )
            })
            .await?;
        if frame.frame().status() == wire::Status::CONSUMER_GROUP_NOT_FOUND {
            return Ok(None);
        }
        let frame = require_ok(address, frame)?;
        let offset = frame
            .frame()
            .body_as_offset_response()
            .ok_or_else(|| missing_body(address, "OffsetResponse"))?
            .offset();
        Ok((offset >= 0).then_some(offset))
    }

    /// Commits the group's offset of a queue (the next offset it will consume).
    pub(crate) async fn commit_consumer_offset(
        &self,
        address: &str,
        timeout: Duration,
        group: &str,
        topic: &str,
        queue_id: u32,
        offset: i64,
    ) -> Result<()> {
        let frame = self
            .request(address, "commit consumer offset", timeout, |builder| {
                let group = builder.create_string(group);
                let topic = builder.create_string(topic);
                let request = wire::CommitConsumerOffsetRequest::create(
                    builder,
                    &wire::CommitConsumerOffsetRequestArgs {
                        consumer_group: Some(group),
                        topic: Some(topic),
                        queue_id: queue_id as i32,
                        offset,
                    },
                );
                (
                    wire::Body::CommitConsumerOffsetRequest,
                    request.as_union_value(),
                )
            })
            .await?;
        require_ok(address, frame).map(|_| ())
    }

    /// A queue's smallest stored and one-past-largest visible offsets.
    pub(crate) async fn queue_offsets(
        &self,
        address: &str,
        timeout: Duration,
        topic: &str,
        queue_id: u32,
    ) -> Result<(i64, i64)> {
        let frame = self
            .request(address, "queue offsets", timeout, |builder| {
                let topic = builder.create_string(topic);
                let request = wire::QueueOffsetsRequest::create(
                    builder,
                    &wire::QueueOffsetsRequestArgs {
                        topic: Some(topic),
                        queue_id: queue_id as i32,
                    },
                );
                (wire::Body::QueueOffsetsRequest, request.as_union_value())
            })
            .await?;
        let frame = require_ok(address, frame)?;
        let response = frame
            .frame()
            .body_as_queue_offsets_response()
            .ok_or_else(|| missing_body(address, "QueueOffsetsResponse"))?;
        Ok((response.min_offset(), response.max_offset()))
    }

    /// The first offset of a queue stored at or after `timestamp_ms`.
    pub(crate) async fn offset_by_time(
        &self,
        address: &str,
        timeout: Duration,
        topic: &str,
        queue_id: u32,
        timestamp_ms: i64,
    ) -> Result<i64> {
        let frame = self
            .request(address, "offset by time", timeout, |builder| {
                let topic = builder.create_string(topic);
                let request = wire::OffsetByTimeRequest::create(
                    builder,
                    &wire::OffsetByTimeRequestArgs {
                        topic: Some(topic),
                        queue_id: queue_id as i32,
                        timestamp_ms,
                    },
                );
                (wire::Body::OffsetByTimeRequest, request.as_union_value())
            })
            .await?;
        let frame = require_ok(address, frame)?;
        Ok(frame
            .frame()
            .body_as_offset_response()
            .ok_or_else(|| missing_body(address, "OffsetResponse"))?
            .offset())
    }

    /// Tells the broker this client is alive and which groups it belongs to.
    pub(crate) async fn heartbeat(
        &self,
        address: &str,
        timeout: Duration,
        producer_groups: &[String],
        consumer_groups: &[HeartbeatGroup],
    ) -> Result<()> {
        let client_id = self.client_id().to_owned();
        let frame = self
            .request(address, "heartbeat", timeout, |builder| {
                let groups: Vec<_> = consumer_groups
                    .iter()
                    .map(|info| {
                        let subscriptions: Vec<_> = info
                            .subscriptions
                            .iter()
                            .map(|(topic, expression)| {
                                let topic = builder.create_string(topic);
                                let expression = builder.create_string(expression);
                                wire::Subscription::create(
                                    builder,
                                    &wire::SubscriptionArgs {
                                        topic: Some(topic),
                                        expression: Some(expression),
                                    },
                                )
                            })
                            .collect();
                        let subscriptions = builder.create_vector(&subscriptions);
                        let group = builder.create_string(&info.group);
                        wire::ConsumerGroupInfo::create(
                            builder,
                            &wire::ConsumerGroupInfoArgs {
                                group: Some(group),
                                message_model: if info.is_broadcasting {
                                    wire::MessageModel::BROADCASTING
                                } else {
                                    wire::MessageModel::CLUSTERING
                                },
                                is_orderly: info.is_orderly,
                                subscriptions: Some(subscriptions),
                            },
                        )
                    })
                    .collect();
                let consumer_groups = builder.create_vector(&groups);
                let producer_groups = strings(builder, producer_groups);
                let client_id = builder.create_string(&client_id);
                let request = wire::HeartbeatRequest::create(
                    builder,
                    &wire::HeartbeatRequestArgs {
                        client_id: Some(client_id),
                        producer_groups,
                        consumer_groups: Some(consumer_groups),
                    },
                );
                (wire::Body::HeartbeatRequest, request.as_union_value())
            })
            .await?;
        require_ok(address, frame).map(|_| ())
    }

    /// Leaves a producer and/or consumer group at the broker (clean shutdown).
    pub(crate) async fn unregister_client(
        &self,
        address: &str,
        timeout: Duration,
        producer_group: Option<&str>,
        consumer_group: Option<&str>,
    ) -> Result<()> {
        let client_id = self.client_id().to_owned();
        let frame = self
            .request(address, "unregister client", timeout, |builder| {
                let client_id = builder.create_string(&client_id);
                let producer_group = producer_group.map(|g| builder.create_string(g));
                let consumer_group = consumer_group.map(|g| builder.create_string(g));
                let request = wire::UnregisterClientRequest::create(
                    builder,
                    &wire::UnregisterClientRequestArgs {
                        client_id: Some(client_id),
                        producer_group,
                        consumer_group,
                    },
                );
                (
                    wire::Body::UnregisterClientRequest,
                    request.as_union_value(),
                )
            })
            .await?;
        require_ok(address, frame).map(|_| ())
    }

    /// Client ids of a consumer group's live members at this broker, sorted.
    pub(crate) async fn consumer_list(
        &self,
        address: &str,
        timeout: Duration,
        group: &str,
    ) -> Result<Vec<String>> {
        let frame = self
            .request(address, "consumer list", timeout, |builder| {
                let group = builder.create_string(group);
                let request = wire::ConsumerListRequest::create(
                    builder,
                    &wire::ConsumerListRequestArgs {
                        consumer_group: Some(group),
                    },
                );
                (wire::Body::ConsumerListRequest, request.as_union_value())
            })
            .await?;
        let frame = require_ok(address, frame)?;
        let response = frame
            .frame()
            .body_as_consumer_list_response()
            .ok_or_else(|| missing_body(address, "ConsumerListResponse"))?;
        let mut ids: Vec<String> = response
            .client_ids()
            .iter()
            .flat_map(|ids| ids.iter())
            .map(str::to_owned)
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// Creates or updates a topic at one broker.
    pub(crate) async fn upsert_topic(
        &self,
        address: &str,
        timeout: Duration,
        config: &TopicConfig,
        is_create_only: bool,
    ) -> Result<()> {
        let frame = self
            .request(address, "upsert topic", timeout, |builder| {
                let name = builder.create_string(&config.name);
                let topic = wire::TopicConfig::create(
                    builder,
                    &wire::TopicConfigArgs {
                        name: Some(name),
                        read_queues: config.read_queues,
                        write_queues: config.write_queues,
                        perm: config.perm,
                        is_ordered: config.is_ordered,
                    },
                );
                let request = wire::UpsertTopicRequest::create(
                    builder,
                    &wire::UpsertTopicRequestArgs {
                        config: Some(topic),
                        create_only: is_create_only,
                    },
                );
                (wire::Body::UpsertTopicRequest, request.as_union_value())
            })
            .await?;
        require_ok(address, frame).map(|_| ())
    }

    /// Deletes a topic at one broker.
    pub(crate) async fn delete_topic(
        &self,
        address: &str,
        timeout: Duration,
        topic: &str,
        force: bool,
    ) -> Result<()> {
        let frame = self
            .request(address, "delete topic", timeout, |builder| {
                let topic = builder.create_string(topic);
                let request = wire::DeleteTopicRequest::create(
                    builder,
                    &wire::DeleteTopicRequestArgs {
                        topic: Some(topic),
                        force,
                    },
                );
                (wire::Body::DeleteTopicRequest, request.as_union_value())
            })
            .await?;
        require_ok(address, frame).map(|_| ())
    }

    /// The topics one broker hosts, with their configs.
    pub(crate) async fn broker_topics(
        &self,
        address: &str,
        timeout: Duration,
        include_system: bool,
    ) -> Result<Vec<TopicConfig>> {
        let frame = self
            .request(address, "broker topics", timeout, |builder| {
                let request = wire::BrokerTopicsRequest::create(
                    builder,
                    &wire::BrokerTopicsRequestArgs { include_system },
                );
                (wire::Body::BrokerTopicsRequest, request.as_union_value())
            })
            .await?;
        let frame = require_ok(address, frame)?;
        let response = frame
            .frame()
            .body_as_broker_topics_response()
            .ok_or_else(|| missing_body(address, "BrokerTopicsResponse"))?;
        Ok(response
            .topics()
            .iter()
            .flat_map(|topics| topics.iter())
            .map(|topic| TopicConfig {
                name: topic.name().unwrap_or_default().to_owned(),
                read_queues: topic.read_queues(),
                write_queues: topic.write_queues(),
                perm: topic.perm(),
                is_ordered: topic.is_ordered(),
            })
            .collect())
    }

    /// Per-queue offsets and last store time of a topic at one broker.
    pub(crate) async fn topic_stats(
        &self,
        address: &str,
        timeout: Duration,
        topic: &str,
    ) -> Result<Vec<QueueStats>> {
        let frame = self
            .request(address, "topic stats", timeout, |builder| {
                let topic = builder.create_string(topic);
                let request = wire::TopicStatsRequest::create(
                    builder,
                    &wire::TopicStatsRequestArgs { topic: Some(topic) },
                );
                (wire::Body::TopicStatsRequest, request.as_union_value())
            })
            .await?;
        let frame = require_ok(address, frame)?;
        let response = frame
            .frame()
            .body_as_topic_stats_response()
            .ok_or_else(|| missing_body(address, "TopicStatsResponse"))?;
        Ok(response
            .queues()
            .iter()
            .flat_map(|queues| queues.iter())
            .map(|queue| QueueStats {
                broker_name: String::new(),
                queue_id: u32::try_from(queue.queue_id()).unwrap_or(0),
                min_offset: queue.min_offset(),
                max_offset: queue.max_offset(),
                last_update_ms: queue.last_update_ms(),
            })
            .collect())
    }

    /// Messages of `topic` with `key`, stored within `[begin_ms, end_ms]` (end 0: now).
    pub(crate) async fn query_by_key(
        &self,
        address: &str,
        timeout: Duration,
        topic: &str,
        key: &str,
        (begin_ms, end_ms): (i64, i64),
        max_results: u32,
    ) -> Result<Vec<MessageExt>> {
        let frame = self
            .request(address, "query by key", timeout, |builder| {
                let topic = builder.create_string(topic);
                let key = builder.create_string(key);
                let request = wire::QueryByKeyRequest::create(
                    builder,
                    &wire::QueryByKeyRequestArgs {
                        topic: Some(topic),
                        key: Some(key),
                        begin_ms,
                        end_ms,
                        max_results,
                    },
                );
                (wire::Body::QueryByKeyRequest, request.as_union_value())
            })
            .await?;
        self.query_answer(address, frame)
    }

    /// The message with this unique id (`UNIQ_KEY`), stored within `[begin_ms, end_ms]`.
    pub(crate) async fn query_by_unique_id(
        &self,
        address: &str,
        timeout: Duration,
        unique_id: &str,
        begin_ms: i64,
        end_ms: i64,
    ) -> Result<Vec<MessageExt>> {
        let frame = self
            .request(address, "query by id", timeout, |builder| {
                let unique_id = builder.create_string(unique_id);
                let request = wire::QueryByIdRequest::create(
                    builder,
                    &wire::QueryByIdRequestArgs {
                        unique_id: Some(unique_id),
                        offset_msg_id: None,
                        begin_ms,
                        end_ms,
                    },
                );
                (wire::Body::QueryByIdRequest, request.as_union_value())
            })
            .await?;
        self.query_answer(address, frame)
    }

    pub(crate) fn query_answer(
        &self,
        address: &str,
        frame: VerifiedFrame,
    ) -> Result<Vec<MessageExt>> {
        if frame.frame().status() == wire::Status::QUERY_NOT_FOUND {
            return Ok(Vec::new());
        }
        let frame = require_ok(address, frame)?;
        let records = frame
            .frame()
            .body_as_query_response()
            .ok_or_else(|| missing_body(address, "QueryResponse"))?
            .records();
        decode_records_of(address, &frame, records, "")
    }

    /// A topic's route from the name server at `address`; [`Error::TopicNotFound`] when no
    /// live broker hosts it.
    pub(crate) async fn get_route(
        &self,
        address: &str,
        timeout: Duration,
        topic: &str,
    ) -> Result<TopicRoute> {
        let frame = self
            .request(address, "route lookup", timeout, |builder| {
                let topic = builder.create_string(topic);
                let request = wire::GetRouteRequest::create(
                    builder,
                    &wire::GetRouteRequestArgs { topic: Some(topic) },
                );
                (wire::Body::GetRouteRequest, request.as_union_value())
            })
            .await?;
        if frame.frame().status() == wire::Status::TOPIC_NOT_FOUND {
            return Err(Error::TopicNotFound {
                topic: topic.to_owned(),
            });
        }
        let frame = require_namesrv_ok(address, frame)?;
        let response = frame
            .frame()
            .body_as_route_response()
            .ok_or_else(|| missing_body(address, "RouteResponse"))?;
        let mut route = TopicRoute {
            topic: topic.to_owned(),
            brokers: Default::default(),
            queues: Default::default(),
        };
        for broker in response.brokers().iter().flat_map(|b| b.iter()) {
            let broker = broker_data(broker);
            route.brokers.insert(broker.broker_name.clone(), broker);
        }
        for queue in response.queues().iter().flat_map(|q| q.iter()) {
            route.queues.insert(
                queue.broker_name().unwrap_or_default().to_owned(),
                QueueData {
                    read_queues: queue.read_queues(),
                    write_queues: queue.write_queues(),
                    perm: queue.perm(),
                },
            );
        }
        Ok(route)
    }

    /// Every cluster the name server at `address` knows, with its broker names and their live
    /// instances (sorted by cluster, then broker name).
    pub(crate) async fn cluster_info(
        &self,
        address: &str,
        timeout: Duration,
    ) -> Result<Vec<ClusterInfo>> {
        let frame = self
            .request(address, "cluster info", timeout, |builder| {
                let request =
                    wire::ClusterInfoRequest::create(builder, &wire::ClusterInfoRequestArgs {});
                (wire::Body::ClusterInfoRequest, request.as_union_value())
            })
            .await?;
        let frame = require_namesrv_ok(address, frame)?;
        let response = frame
            .frame()
            .body_as_cluster_info_response()
            .ok_or_else(|| missing_body(address, "ClusterInfoResponse"))?;
        Ok(response
            .clusters()
            .iter()
            .flat_map(|clusters| clusters.iter())
            .map(|cluster| ClusterInfo {
                name: cluster.cluster_name().unwrap_or_default().to_owned(),
                brokers: cluster
                    .brokers()
                    .iter()
                    .flat_map(|brokers| brokers.iter())
                    .map(broker_data)
                    .collect(),
            })
            .collect())
    }

    /// Topic names known to the name server at `address`, sorted.
    pub(crate) async fn topic_list(&self, address: &str, timeout: Duration) -> Result<Vec<String>> {
        let frame = self
            .request(address, "topic list", timeout, |builder| {
                let request = wire::TopicListRequest::create(
                    builder,
                    &wire::TopicListRequestArgs { cluster_name: None },
                );
                (wire::Body::TopicListRequest, request.as_union_value())
            })
            .await?;
        let frame = require_namesrv_ok(address, frame)?;
        let response = frame
            .frame()
            .body_as_topic_list_response()
            .ok_or_else(|| missing_body(address, "TopicListResponse"))?;
        Ok(response
            .topics()
            .iter()
            .flat_map(|topics| topics.iter())
            .map(str::to_owned)
            .collect())
    }
}
