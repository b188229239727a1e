//! What a broker copies and restores of its group's metadata, on network shard 0:
//!
//! - a slave's copy of its master's topic table (every 2 s, so it serves pulls of every topic
//!   its master has) and committed consumer offsets (every `replica_metadata_interval_ms`), over
//!   one kept link to the master;
//! - a master's restore, at start, of topics its store holds messages of but its table lacks
//!   (a slave made master may not have copied a topic created just before its master died).
//!
//! Everything goes through `StorageRequest`s to storage shard 0 (topics) or the queue's shard
//! (offsets), as a client's request would.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tracing::{info, warn};

use crate::mesh::StorageRequest;
use crate::network::NetworkShard;

/// A slave's copy of its master's topic table (every 2 s, so it serves pulls of every
/// topic its master has) and committed consumer offsets (every 10 s).
pub async fn run(shard: Rc<NetworkShard>) {
    let client_id = format!(
        "{}-slave-{}-topics",
        shard.config.broker_name, shard.config.broker_id
    );
    let credentials = shardmq_services::peer_auth::credentials(&shard.config);
    // The first copy of the offsets comes with the first copy of the topics.
    let copy_interval = Duration::from_millis(shard.config.replica_metadata_interval_ms.max(100));
    let mut last_offsets_copy = std::time::Instant::now() - copy_interval;
    // One link, kept between rounds and made again after a failure.
    let mut link: Option<crate::replication::MasterLink> = None;
    let mut master = None;
    while !shard.stopping.load(Ordering::Relaxed) {
        let named = crate::role::master_address(&shard.config);
        if named != master {
            (master, link) = (named, None);
        }
        let Some(master) = master else {
            glommio::timer::sleep(crate::replication::TOPIC_SYNC_INTERVAL).await;
            continue;
        };
        if link.is_none() {
            link = crate::replication::MasterLink::connect(
                master,
                &client_id,
                credentials.as_ref(),
            )
            .await
            .map_err(|error| {
                tracing::debug!(%master, %error, "cannot reach the master for its metadata");
            })
            .ok();
        }
        if let Some(connected) = link.as_mut() {
            let mut round = copy_master_topics(&shard, connected).await;
            if round.is_ok() && last_offsets_copy.elapsed() >= copy_interval {
                last_offsets_copy = std::time::Instant::now();
                round = copy_master_offsets(&shard, connected).await;
            }
            if let Err(error) = round {
                tracing::debug!(%master, %error, "cannot copy the master's metadata");
                link = None;
            }
        }
        glommio::timer::sleep(crate::replication::TOPIC_SYNC_INTERVAL).await;
    }
}

/// A master gives every user topic its store holds messages of, and its topic table lacks,
/// a config with the queues found: a slave made master may not have copied a topic created
/// just before its master died (topics are copied every 2 s), yet holds its messages.
pub async fn restore_topics_from_store(shard: &NetworkShard) {
    let mut found: BTreeMap<String, u32> = BTreeMap::new();
    for storage in 0..shard.storage_shards() {
        let Ok(queues) = shard
            .ask(storage, |reply| StorageRequest::StoredQueues { reply })
            .await
        else {
            continue;
        };
        for (topic, queue_id) in queues {
            let queues = found.entry(topic).or_default();
            *queues = (*queues).max(queue_id + 1);
        }
    }
    let known = shard.topics();
    for (topic, queues) in found {
        if crate::naming::is_system_topic(&topic) || known.topics.contains_key(&topic) {
            continue;
        }
        warn!(%topic, queues, "a topic with stored messages has no config here: restoring it with the queues found");
        let config = crate::topics::TopicConfig::new(&topic, queues);
        let _ = shard
            .ask(0, |reply| StorageRequest::UpsertTopic {
                config,
                is_create_only: true,
                reply,
            })
            .await;
    }
}

/// Creates or updates every topic of the master's that differs here.
async fn copy_master_topics(
    shard: &NetworkShard,
    link: &mut crate::replication::MasterLink,
) -> std::io::Result<()> {
    let known = shard.topics();
    let masters = link.topics().await?;
    // A user topic the master no longer has was deleted there.
    for name in known.topics.keys() {
        if crate::naming::is_system_topic(name) || masters.iter().any(|t| &t.name == name) {
            continue;
        }
        let topic = name.clone();
        if let Ok(true) = shard
            .ask(0, |reply| StorageRequest::DeleteTopic { topic, reply })
            .await
        {
            info!(topic = %name, "topic deleted on the master: deleted here too");
        }
    }
    for config in masters {
        if known.topics.get(&config.name) == Some(&config) {
            continue;
        }
        if crate::naming::is_system_topic(&config.name) {
            let (name, queues) = (config.name, config.read_queues.max(config.write_queues));
            let _ = shard
                .ask(0, |reply| StorageRequest::EnsureSystemTopic {
                    name,
                    queues,
                    reply,
                })
                .await;
        } else {
            let _ = shard
                .ask(0, |reply| StorageRequest::UpsertTopic {
                    config,
                    is_create_only: false,
                    reply,
                })
                .await;
        }
    }
    Ok(())
}

/// Copies the master's committed consumer offsets, moving a local one only forward (a
/// group that consumed here while the master was gone is not sent back): one request per
/// storage shard of the master (`ReplicaOffsetsRequest`, paged beyond
/// `MAX_OFFSET_ROWS_PER_PAGE` rows) and one merge per local storage shard, for the queues of
/// topics this broker knows.
async fn copy_master_offsets(
    shard: &NetworkShard,
    link: &mut crate::replication::MasterLink,
) -> std::io::Result<()> {
    let topics = shard.topics();
    for master_shard in 0..shard.storage_shards() {
        let mut after: Option<(String, String, u32)> = None;
        loop {
            let (rows, more) = link.offsets_page(master_shard, after.as_ref()).await?;
            after = rows.last().map(|(g, t, q, _)| (g.clone(), t.clone(), *q));
            let mut by_shard: BTreeMap<usize, Vec<crate::replication::OffsetRow>> = BTreeMap::new();
            for row in rows {
                let Some(config) = topics.topics.get(&row.1) else {
                    continue;
                };
                if row.2 >= config.read_queues.max(config.write_queues) {
                    continue;
                }
                by_shard
                    .entry(shard.shard_of(&row.1, row.2))
                    .or_default()
                    .push(row);
            }
            for (storage, rows) in by_shard {
                let _ = shard
                    .ask(storage, |reply| StorageRequest::MergeConsumerOffsets {
                        rows,
                        reply,
                    })
                    .await;
            }
            if !more || after.is_none() {
                break;
            }
        }
    }
    Ok(())
}
