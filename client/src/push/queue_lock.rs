//! Broker-side queue locks of an orderly consumer in clustering mode (RocketMQ's
//! `lockBatchMQ` / `unlockBatchMQ` and its `RebalanceLockManager` on the broker).
//!
//! Owns: the LockBatchRequest / UnlockBatchRequest calls, taking a queue's lock before its
//! first pull, renewing every assigned queue's lock (every `orderly_lock_interval`, 20 s by
//! default) and releasing locks when queues are given up or the consumer shuts down. A queue
//! is consumed only while its lock was granted within `orderly_lock_ttl` (30 s), shorter than
//! the broker's expiry (60 s): a member that cannot renew stops before the broker gives the
//! queue to another. Never: deciding which queues this instance owns (`rebalance.rs`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use shardmq_schema::wire;
use tracing::{debug, warn};

use super::process_queue::ProcessQueue;
use super::{ConsumerCore, Listener, MessageModel};
use crate::api::{missing_body, require_ok};
use crate::error::Result;
use crate::pool::ConnectionPool;
use crate::route::MessageQueue;

/// How often an orderly consumer renews its queue locks (RocketMQ's lock interval).
pub const DEFAULT_ORDERLY_LOCK_INTERVAL: Duration = Duration::from_secs(20);

/// How long a granted lock lets this instance consume a queue without a renewal (RocketMQ's
/// client-side lock TTL). Must stay below the broker's `queue_lock_expiry_ms` (60 s).
pub const DEFAULT_ORDERLY_LOCK_TTL: Duration = Duration::from_secs(30);

/// How long a queue whose lock another member holds waits before asking again.
pub(super) const LOCK_RETRY_PAUSE: Duration = Duration::from_millis(500);

/// How long giving a queue up waits for its listener call in progress before leaving the lock
/// to expire at the broker instead of releasing it.
const HAND_OVER_WAIT: Duration = Duration::from_secs(5);

fn queue_refs<'b>(
    builder: &mut flatbuffers::FlatBufferBuilder<'b>,
    queues: &[MessageQueue],
) -> flatbuffers::WIPOffset<flatbuffers::Vector<'b, flatbuffers::ForwardsUOffset<wire::QueueRef<'b>>>>
{
    let refs: Vec<_> = queues
        .iter()
        .map(|queue| {
            let topic = builder.create_string(&queue.topic);
            wire::QueueRef::create(
                builder,
                &wire::QueueRefArgs {
                    topic: Some(topic),
                    queue_id: queue.queue_id as i32,
                },
            )
        })
        .collect();
    builder.create_vector(&refs)
}

impl ConnectionPool {
    /// Locks `queues` (of one broker) for `client_id` in `group`; returns those now held.
    pub(crate) async fn lock_batch(
        &self,
        address: &str,
        timeout: Duration,
        group: &str,
        client_id: &str,
        queues: &[MessageQueue],
    ) -> Result<Vec<(String, u32)>> {
        let frame = self
            .request(address, "lock queues", timeout, |builder| {
                let group = builder.create_string(group);
                let client_id = builder.create_string(client_id);
                let queues = queue_refs(builder, queues);
                let request = wire::LockBatchRequest::create(
                    builder,
                    &wire::LockBatchRequestArgs {
                        consumer_group: Some(group),
                        client_id: Some(client_id),
                        queues: Some(queues),
                    },
                );
                (wire::Body::LockBatchRequest, request.as_union_value())
            })
            .await?;
        let frame = require_ok(address, frame)?;
        let response = frame
            .frame()
            .body_as_lock_batch_response()
            .ok_or_else(|| missing_body(address, "LockBatchResponse"))?;
        Ok(response
            .locked()
            .iter()
            .flat_map(|locked| locked.iter())
            .filter_map(|queue| {
                Some((
                    queue.topic()?.to_owned(),
                    u32::try_from(queue.queue_id()).ok()?,
                ))
            })
            .collect())
    }

    /// Releases those of `queues` (of one broker) that `client_id` holds in `group`.
    pub(crate) async fn unlock_batch(
        &self,
        address: &str,
        timeout: Duration,
        group: &str,
        client_id: &str,
        queues: &[MessageQueue],
    ) -> Result<()> {
        let frame = self
            .request(address, "unlock queues", timeout, |builder| {
                let group = builder.create_string(group);
                let client_id = builder.create_string(client_id);
                let queues = queue_refs(builder, queues);
                let request = wire::UnlockBatchRequest::create(
                    builder,
                    &wire::UnlockBatchRequestArgs {
                        consumer_group: Some(group),
                        client_id: Some(client_id),
                        queues: Some(queues),
                    },
                );
                (wire::Body::UnlockBatchRequest, request.as_union_value())
            })
            .await?;
        require_ok(address, frame).map(|_| ())
    }
}

impl ConsumerCore {
    /// Whether this consumer takes broker-side queue locks: orderly listeners in clustering
    /// mode (broadcasting members each consume every queue on their own).
    pub(super) fn uses_queue_locks(&self) -> bool {
        matches!(self.listener, Listener::Orderly(_))
            && self.config.model == MessageModel::Clustering
    }

    /// The master address of each broker among `queues`, with its queues.
    async fn by_broker(&self, queues: &[MessageQueue]) -> BTreeMap<String, Vec<MessageQueue>> {
        let mut by_address: BTreeMap<String, Vec<MessageQueue>> = BTreeMap::new();
        for queue in queues {
            match self.instance.broker_address(queue, true).await {
                Ok(address) => by_address.entry(address).or_default().push(queue.clone()),
                Err(error) => debug!(%queue, %error, "no broker to lock the queue at"),
            }
        }
        by_address
    }

    /// Asks the broker for `queue`'s lock; records and returns whether it was granted.
    pub(super) async fn lock_queue(
        &self,
        queue: &MessageQueue,
        process_queue: &ProcessQueue,
    ) -> bool {
        let asked_at = Instant::now();
        let granted = async {
            let address = self.instance.broker_address(queue, true).await?;
            self.instance
                .pool
                .lock_batch(
                    &address,
                    self.instance.request_timeout(),
                    &self.config.group,
                    self.instance.client_id(),
                    std::slice::from_ref(queue),
                )
                .await
        }
        .await;
        match granted {
            Ok(locked) => {
                let is_locked = locked
                    .iter()
                    .any(|(topic, queue_id)| *topic == queue.topic && *queue_id == queue.queue_id);
                // The TTL counts from the request, not the answer: the broker's expiry started
                // no earlier than that.
                process_queue.set_locked(is_locked.then_some(asked_at));
                is_locked
            }
            Err(error) => {
                debug!(%queue, %error, "locking the queue failed");
                false
            }
        }
    }

    /// Renews the lock of every assigned queue (one request per broker).
    pub(super) async fn renew_locks(&self) {
        let assigned: Vec<(MessageQueue, std::sync::Arc<ProcessQueue>)> = self
            .assigned()
            .iter()
            .map(|(queue, entry)| (queue.clone(), std::sync::Arc::clone(&entry.process_queue)))
            .collect();
        let queues: Vec<MessageQueue> = assigned.iter().map(|(queue, _)| queue.clone()).collect();
        for (address, queues) in self.by_broker(&queues).await {
            let asked_at = Instant::now();
            let locked = match self
                .instance
                .pool
                .lock_batch(
                    &address,
                    self.instance.request_timeout(),
                    &self.config.group,
                    self.instance.client_id(),
                    &queues,
                )
                .await
            {
                Ok(locked) => locked,
                Err(error) => {
                    // The locks age out locally (TTL) unless a later renewal gets through.
                    warn!(%address, %error, "renewing queue locks failed");
                    continue;
                }
            };
            for queue in &queues {
                let is_locked = locked
                    .iter()
                    .any(|(topic, queue_id)| *topic == queue.topic && *queue_id == queue.queue_id);
                if let Some((_, process_queue)) = assigned.iter().find(|(q, _)| q == queue) {
                    if !is_locked && process_queue.is_locked(self.config.orderly_lock_ttl) {
                        warn!(%queue, "the broker gave this queue's lock to another member; consumption pauses");
                    }
                    process_queue.set_locked(is_locked.then_some(asked_at));
                }
            }
        }
    }

    /// Releases the locks of `queues` (best effort: an unreleased lock expires at the broker).
    pub(super) async fn unlock_queues(&self, queues: &[MessageQueue]) {
        for (address, queues) in self.by_broker(queues).await {
            if let Err(error) = self
                .instance
                .pool
                .unlock_batch(
                    &address,
                    self.instance.request_timeout(),
                    &self.config.group,
                    self.instance.client_id(),
                    &queues,
                )
                .await
            {
                debug!(%address, %error, "releasing queue locks failed; they expire at the broker");
            }
        }
    }

    /// Gives up an orderly queue: waits for its listener call in progress (up to
    /// [`HAND_OVER_WAIT`]), marks it dropped so no call starts after, persists its offset, and
    /// releases its lock, so that the next owner starts right after the last message consumed
    /// here. A call still running after the wait keeps the lock (it expires at the broker).
    pub(super) async fn hand_over(&self, queue: &MessageQueue, process_queue: &ProcessQueue) {
        let consuming =
            tokio::time::timeout(HAND_OVER_WAIT, process_queue.consuming().lock()).await;
        process_queue.mark_dropped();
        self.offsets.persist_and_remove(&self.instance, queue).await;
        match consuming {
            Ok(_consuming) => self.unlock_queues(std::slice::from_ref(queue)).await,
            Err(_) => warn!(
                %queue,
                "a listener call is still running; the queue's lock is left to expire at the broker"
            ),
        }
    }
}
