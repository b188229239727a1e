//! What a master serves its slaves (docs/replication.md): the join (where their logs agree),
//! replica pulls of CommitLog bytes (slices of the write ring or a disk read, not copied) and the
//! per-shard state files they copy. A slave refuses them all.

use bytes::BytesMut;
use shardmq_schema::{build_frame, wire, FrameHeader};

use super::request::{encode_ok, frame_error, invalid, refuse, Answer, Refusal};
use super::NetworkShard;
use crate::mesh::{ReplicaPull, StorageRequest};

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

/// A slave joins for one storage shard (services `replication`): it must be of this cluster and
/// broker name, a slave id, with the same storage shard count; the answer says where the bytes
/// it shares with this master end (store/epochs.rs).
pub(super) async fn join(
    shard: &NetworkShard,
    id: u64,
    link: crate::replication::ReplicaLink,
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
    let incarnations = r.epoch_incarnations();
    for (index, entry) in r.epochs().iter().flat_map(|v| v.iter()).enumerate() {
        epochs
            .push(crate::store::epochs::Epoch {
                epoch: entry.epoch(),
                start: entry.start(),
                incarnation: incarnations
                    .filter(|v| index < v.len())
                    .map_or(0, |v| v.get(index)),
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
            link,
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
        let incarnations: Vec<u64> = answer.epochs.iter().map(|e| e.incarnation).collect();
        let incarnations = b.create_vector(&incarnations);
        let (tail, tail_end) = match answer.tail {
            crate::replication::SlaveTail::Cut => (wire::ReplicaTail::CUT, 0),
            crate::replication::SlaveTail::Return { end } => (wire::ReplicaTail::RETURN, end),
            crate::replication::SlaveTail::Keep { end } => (wire::ReplicaTail::KEEP, end),
        };
        let body = wire::ReplicaJoinResponse::create(
            b,
            &wire::ReplicaJoinResponseArgs {
                epoch: answer.epoch,
                epochs: Some(entries),
                master_end: answer.master_end,
                consistent_end: answer.consistent_end,
                epoch_incarnations: Some(incarnations),
                log_start: answer.log_start,
                tail,
                tail_end,
            },
        );
        (wire::Body::ReplicaJoinResponse, body.as_union_value())
    })
}

/// A slave returns bytes of this master's previous term its log lost, after a join answered
/// RETURN (store/epochs.rs, docs/replication.md "A master that lost its tail").
pub(super) async fn return_tail(
    shard: &NetworkShard,
    id: u64,
    link: crate::replication::ReplicaLink,
    r: wire::ReplicaReturnRequest<'_>,
) -> Answer {
    refuse_if_slave(shard)?;
    let storage = replica_storage_shard(shard, r.storage_shard())?;
    let data = r.data().map(|d| d.bytes()).unwrap_or_default();
    if data.len() > crate::replication::REPLICA_PULL_BYTES as usize {
        return Err(invalid(format!(
            "returned bytes come at most {} at a time, not {}",
            crate::replication::REPLICA_PULL_BYTES,
            data.len()
        )));
    }
    let data = bytes::Bytes::copy_from_slice(data);
    let (broker_id, from, last) = (r.broker_id(), r.from(), r.last());
    let end = shard
        .ask(storage, |reply| StorageRequest::ReplicaReturn {
            broker_id,
            link,
            from,
            data,
            last,
            reply,
        })
        .await?
        .map_err(invalid)?;
    encode_ok(shard, id, |b| {
        let body = wire::ReplicaReturnResponse::create(b, &wire::ReplicaReturnResponseArgs { end });
        (wire::Body::ReplicaReturnResponse, body.as_union_value())
    })
}

/// A slave copies the committed consumer offsets of one storage shard, a page at a time.
pub(super) async fn offsets(
    shard: &NetworkShard,
    id: u64,
    r: wire::ReplicaOffsetsRequest<'_>,
) -> Answer {
    refuse_if_slave(shard)?;
    let storage = replica_storage_shard(shard, r.storage_shard())?;
    let after = r.has_cursor().then(|| {
        (
            r.after_group().unwrap_or_default().to_owned(),
            r.after_topic().unwrap_or_default().to_owned(),
            r.after_queue_id(),
        )
    });
    let (rows, more) = shard
        .ask(storage, |reply| StorageRequest::ConsumerOffsetPage {
            after,
            max: crate::replication::MAX_OFFSET_ROWS_PER_PAGE,
            reply,
        })
        .await?;
    encode_ok(shard, id, |b| {
        let rows: Vec<_> = rows
            .iter()
            .map(|(group, topic, queue_id, offset)| {
                let (group, topic) = (b.create_string(group), b.create_string(topic));
                wire::ConsumerOffsetRow::create(
                    b,
                    &wire::ConsumerOffsetRowArgs {
                        group: Some(group),
                        topic: Some(topic),
                        queue_id: *queue_id,
                        offset: *offset,
                    },
                )
            })
            .collect();
        let rows = b.create_vector(&rows);
        let body = wire::ReplicaOffsetsResponse::create(
            b,
            &wire::ReplicaOffsetsResponseArgs {
                rows: Some(rows),
                more,
            },
        );
        (wire::Body::ReplicaOffsetsResponse, body.as_union_value())
    })
}

/// A slave copies one of the master's per-shard state files (`replication::COPIED_FILES`).
pub(super) async fn file(shard: &NetworkShard, id: u64, r: wire::ReplicaFileRequest<'_>) -> Answer {
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

/// A slave's replica pull (services `replication`): the CommitLog bytes of one storage shard from
/// where the slave's log ends, sent as the answer's trailing bytes (a slice of the write ring
/// or of a disk read, not copied).
pub(super) async fn pull(
    shard: &NetworkShard,
    id: u64,
    link: crate::replication::ReplicaLink,
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
        .ask(storage, |reply| {
            StorageRequest::ReadForReplica(ReplicaPull {
                from,
                acknowledged,
                max_bytes,
                suspend_ms,
                epoch,
                broker_id,
                link,
                reply,
            })
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
                        confirmed: chunk.confirmed,
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
