//! The consume side: pulls (with long polling: an empty pull parks until an arrival or its
//! suspend timeout, and the answer carries stored records as slices, not copies), consumer
//! offsets (query, commit), queue offsets and the offset of a time.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_lite::future;
use shardmq_schema::{build_frame, wire, FrameHeader};

use super::request::{
    encode_ok, encode_status, frame_error, group_queue, invalid, readable_queue, refuse, Answer,
    Refusal,
};
use super::NetworkShard;
use crate::mesh::{PullQuery, StorageRequest};
use crate::naming::check_group_name;
use crate::store::{GetResult, GetStatus, TagFilter};

/// A pull as either protocol asks it (`PullRequest`'s fields).
pub(super) struct PullAsk<'a> {
    pub consumer_group: Option<&'a str>,
    pub topic: Option<&'a str>,
    pub queue_id: i32,
    pub queue_offset: i64,
    pub max_messages: u32,
    /// 0: the broker's `max_pull_bytes`.
    pub max_bytes: u32,
    /// `None`: every message.
    pub tag_expression: Option<&'a str>,
    /// `true`: `tag_expression` is a SQL92 expression over the message's properties.
    pub is_sql: bool,
    pub suspend_timeout_ms: u32,
    /// Below 0: nothing to commit.
    pub commit_offset: i64,
}

/// Whether a pull's expression type names SQL92 (absent, empty and `TAG`: tags; either
/// protocol spells them so, in any case).
pub(super) fn is_sql(expression_type: Option<&str>) -> Result<bool, Refusal> {
    match expression_type.map(str::trim) {
        None | Some("") => Ok(false),
        Some(kind) if kind.eq_ignore_ascii_case("TAG") => Ok(false),
        Some(kind) if kind.eq_ignore_ascii_case("SQL92") => Ok(true),
        Some(kind) => Err(refuse(
            wire::Status::INVALID_TAG_EXPRESSION,
            format!(
                "expression type `{}` is neither TAG nor SQL92",
                kind.escape_debug()
            ),
        )),
    }
}

pub(super) async fn pull(shard: &NetworkShard, id: u64, r: wire::PullRequest<'_>) -> Answer {
    let ask = PullAsk {
        consumer_group: r.consumer_group(),
        topic: r.topic(),
        queue_id: r.queue_id(),
        queue_offset: r.queue_offset(),
        max_messages: r.max_messages(),
        max_bytes: r.max_bytes(),
        tag_expression: r.tag_expression(),
        is_sql: is_sql(r.expression_type())?,
        suspend_timeout_ms: r.suspend_timeout_ms(),
        commit_offset: r.commit_offset(),
    };
    let (result, requested) = pull_records(shard, ask).await?;
    encode_pull(shard, id, result, requested)
}

/// Serves a pull: commits the offset it carries, reads, and when nothing is there yet parks
/// until an arrival or its suspend timeout. Returns what was read and the offset asked for.
pub(super) async fn pull_records(
    shard: &NetworkShard,
    r: PullAsk<'_>,
) -> Result<(GetResult, u64), Refusal> {
    let (topic, queue_id) = readable_queue(shard, r.topic, r.queue_id)?;
    if let Some(group) = r.consumer_group.filter(|g| !g.is_empty()) {
        check_group_name(group).map_err(invalid)?;
        if r.commit_offset >= 0 {
            let (group, topic, offset) = (group.to_owned(), topic.clone(), r.commit_offset as u64);
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
    let offset =
        u64::try_from(r.queue_offset).map_err(|_| invalid("queue_offset must not be negative"))?;
    let expression = r.tag_expression.unwrap_or("*");
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
        max_messages: r.max_messages.clamp(1, shard.config.max_pull_messages),
        max_bytes: match u64::from(r.max_bytes) {
            0 => shard.config.max_pull_bytes,
            n => n.min(shard.config.max_pull_bytes),
        },
        filter: if r.is_sql {
            TagFilter::Sql(shard.sql_filter(expression)?)
        } else {
            TagFilter::parse(expression)
        },
    };
    let metrics_topic = query.topic.clone();
    let suspend_ms = u64::from(r.suspend_timeout_ms).min(shard.config.max_suspend_timeout_ms);
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
    Ok((result, offset))
}

/// What a pull's answer says: found, nothing yet, nothing that matched, or moved.
pub(super) fn pull_status(result: &GetResult, requested: u64) -> wire::Status {
    match result.status {
        GetStatus::Found => wire::Status::OK,
        GetStatus::NoMatchedMessage => wire::Status::PULL_RETRY_IMMEDIATELY,
        GetStatus::NoNewMessage => wire::Status::PULL_NOT_FOUND,
        GetStatus::NoMatchedQueue if requested == 0 => wire::Status::PULL_NOT_FOUND,
        GetStatus::NoMatchedQueue | GetStatus::OffsetTooSmall | GetStatus::OffsetOverflow => {
            wire::Status::PULL_OFFSET_MOVED
        }
    }
}

fn encode_pull(shard: &NetworkShard, id: u64, result: GetResult, requested: u64) -> Answer {
    let status = pull_status(&result, requested);
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

/// A group's committed offset of one queue.
pub(super) async fn query_consumer_offset(
    shard: &NetworkShard,
    id: u64,
    r: wire::QueryConsumerOffsetRequest<'_>,
) -> Answer {
    let (group, topic, queue_id) = group_queue(shard, r.consumer_group(), r.topic(), r.queue_id())?;
    let shard_id = shard.shard_of(&topic, queue_id);
    let offset = shard
        .ask(shard_id, |reply| StorageRequest::QueryConsumerOffset {
            group,
            topic,
            queue_id,
            reply,
        })
        .await?;
    match offset {
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
    }
}

/// Commits a group's offset of one queue.
pub(super) async fn commit_consumer_offset(
    shard: &NetworkShard,
    id: u64,
    r: wire::CommitConsumerOffsetRequest<'_>,
) -> Answer {
    let (group, topic, queue_id) = group_queue(shard, r.consumer_group(), r.topic(), r.queue_id())?;
    let offset = u64::try_from(r.offset()).map_err(|_| invalid("offset must not be negative"))?;
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
    encode_status(shard, id, wire::Status::OK, "")
}

/// A queue's min and max offsets.
pub(super) async fn queue_offsets(
    shard: &NetworkShard,
    id: u64,
    r: wire::QueueOffsetsRequest<'_>,
) -> Answer {
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
    encode_ok(shard, id, |b| {
        let body = wire::QueueOffsetsResponse::create(
            b,
            &wire::QueueOffsetsResponseArgs {
                min_offset: offsets.0 as i64,
                max_offset: offsets.1 as i64,
            },
        );
        (wire::Body::QueueOffsetsResponse, body.as_union_value())
    })
}

/// The first offset of a queue stored at or after a time.
pub(super) async fn offset_by_time(
    shard: &NetworkShard,
    id: u64,
    r: wire::OffsetByTimeRequest<'_>,
) -> Answer {
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
    encode_ok(shard, id, |b| {
        let body = wire::OffsetResponse::create(
            b,
            &wire::OffsetResponseArgs {
                offset: offset as i64,
            },
        );
        (wire::Body::OffsetResponse, body.as_union_value())
    })
}
