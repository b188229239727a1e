//! Message queries: by offset id (one storage shard), by unique id and by key (every storage
//! shard, merged and bounded in bytes).

use bytes::{Bytes, BytesMut};
use shardmq_schema::{build_frame, wire, FrameHeader};

use super::request::{frame_error, invalid, refuse, time_range, Answer, Refusal};
use super::NetworkShard;
use crate::mesh::StorageRequest;
use crate::msgid::parse_offset_message_id;
use crate::naming::check_topic_name;

pub(super) async fn by_id(shard: &NetworkShard, id: u64, r: wire::QueryByIdRequest<'_>) -> Answer {
    let records = find_by_id(
        shard,
        r.unique_id(),
        r.offset_msg_id(),
        r.begin_ms(),
        r.end_ms(),
    )
    .await?;
    encode_query(shard, id, records)
}

/// The message an offset id names, or the messages of a unique id (every storage shard),
/// bounded as an answer is ([`bounded`]).
pub(super) async fn find_by_id(
    shard: &NetworkShard,
    unique_id: Option<&str>,
    offset_msg_id: Option<&str>,
    begin_ms: i64,
    end_ms: i64,
) -> Result<Vec<Bytes>, Refusal> {
    let (begin_ms, end_ms) = time_range(begin_ms, end_ms);
    if let Some(offset_id) = offset_msg_id.filter(|o| !o.is_empty()) {
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
            Ok(record) => Ok(vec![record]),
            Err(_) => Err(refuse(
                wire::Status::QUERY_NOT_FOUND,
                "no message at that offset id",
            )),
        };
    }
    let unique_id = unique_id
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
    bounded(found)
}

/// Records merged from every storage shard, bounded in bytes as each shard's part is; none is
/// `QUERY_NOT_FOUND`.
fn bounded(mut records: Vec<Bytes>) -> Result<Vec<Bytes>, Refusal> {
    if records.is_empty() {
        return Err(refuse(wire::Status::QUERY_NOT_FOUND, "no message matched"));
    }
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
    Ok(records)
}

fn encode_query(shard: &NetworkShard, id: u64, records: Vec<Bytes>) -> Answer {
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

/// Messages of a topic by key, from every storage shard.
pub(super) async fn by_key(
    shard: &NetworkShard,
    id: u64,
    r: wire::QueryByKeyRequest<'_>,
) -> Answer {
    let records = find_by_key(
        shard,
        r.topic().unwrap_or_default(),
        r.key(),
        (r.begin_ms(), r.end_ms()),
        r.max_results(),
    )
    .await?;
    encode_query(shard, id, records)
}

/// Messages of `topic` with `key` stored in `[begin, end]` ms, from every storage shard, at
/// most `max_results` (1..=64), bounded as an answer is.
pub(super) async fn find_by_key(
    shard: &NetworkShard,
    topic: &str,
    key: Option<&str>,
    (begin_ms, end_ms): (i64, i64),
    max_results: u32,
) -> Result<Vec<Bytes>, Refusal> {
    let topic = topic.to_owned();
    check_topic_name(&topic).map_err(invalid)?;
    let key = key
        .filter(|k| !k.is_empty())
        .ok_or_else(|| invalid("key is missing"))?
        .to_owned();
    let (begin_ms, end_ms) = time_range(begin_ms, end_ms);
    let max_results = max_results.clamp(1, 64) as usize;
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
    bounded(found)
}
