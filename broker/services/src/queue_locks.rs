//! Queue locks of orderly consumer groups (RocketMQ's RebalanceLockManager): which member of a
//! group may consume each queue, so that a queue is never consumed by two members at once,
//! also while a rebalance moves it.
//!
//! Owns: the lock table, per group, of (topic, queue) → holder and the time of its last lock or
//! renewal. A lock lasts `queue_lock_expiry_ms` (60 s) from then; the holder renews it (clients
//! every 20 s) and releases it when it gives the queue up. Lives on storage shard 0, next to
//! the group membership, and is served over the mesh ([`LockRequest`]).
//!
//! In memory only, as in RocketMQ: a broker restart forgets every lock, and the clients take
//! them again at their next renewal. That is safe because a client stops consuming a queue once
//! its own record of the lock is older than its lock TTL (30 s), shorter than the broker's
//! expiry, so no old holder is still consuming when a restarted broker grants the queue anew —
//! provided the restart takes longer than the difference, or the old holder is alive and
//! renews first. Never: sockets or files.

use std::collections::HashMap;

use shardmq_base::Reply;

/// Locked queues the broker keeps at once, over every group; further locks are refused (the
/// queue is answered as not locked) until some expire or are released.
pub const MAX_LOCKED_QUEUES: usize = 1_000_000;

/// One queue of a topic.
pub type QueueId = (String, u32);

/// Network shard → storage shard 0.
pub enum LockRequest {
    /// Lock (or renew) `queues` for `client_id`; replies with the queues it holds now.
    Lock {
        group: String,
        client_id: String,
        queues: Vec<QueueId>,
        reply: Reply<Vec<QueueId>>,
    },
    /// Release those of `queues` that `client_id` holds.
    Unlock {
        group: String,
        client_id: String,
        queues: Vec<QueueId>,
        reply: Reply<()>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Holder {
    client_id: String,
    renewed_ms: i64,
}

/// The lock table.
#[derive(Debug)]
pub struct QueueLocks {
    expiry_ms: i64,
    groups: HashMap<String, HashMap<QueueId, Holder>>,
    locked: usize,
}

impl QueueLocks {
    pub fn new(expiry_ms: u64) -> QueueLocks {
        QueueLocks {
            expiry_ms: expiry_ms as i64,
            groups: HashMap::new(),
            locked: 0,
        }
    }

    /// Serves one request at time `now_ms`.
    pub fn serve(&mut self, request: LockRequest, now_ms: i64) {
        match request {
            LockRequest::Lock {
                group,
                client_id,
                queues,
                reply,
            } => {
                let _ = reply.send(self.lock_batch(&group, &client_id, queues, now_ms));
            }
            LockRequest::Unlock {
                group,
                client_id,
                queues,
                reply,
            } => {
                self.unlock_batch(&group, &client_id, &queues);
                let _ = reply.send(());
            }
        }
    }

    /// Grants each queue that is free, expired or already held by `client_id` (renewing it);
    /// returns the queues `client_id` holds among those asked.
    pub fn lock_batch(
        &mut self,
        group: &str,
        client_id: &str,
        queues: Vec<QueueId>,
        now_ms: i64,
    ) -> Vec<QueueId> {
        self.drop_expired(group, now_ms);
        let expiry_ms = self.expiry_ms;
        let table = self.groups.entry(group.to_owned()).or_default();
        let mut granted = Vec::with_capacity(queues.len());
        for queue in queues {
            match table.get_mut(&queue) {
                Some(holder) if holder.client_id == client_id => {
                    holder.renewed_ms = now_ms;
                    granted.push(queue);
                }
                Some(holder) if now_ms - holder.renewed_ms <= expiry_ms => {}
                Some(holder) => {
                    *holder = Holder {
                        client_id: client_id.to_owned(),
                        renewed_ms: now_ms,
                    };
                    granted.push(queue);
                }
                None if self.locked < MAX_LOCKED_QUEUES => {
                    table.insert(
                        queue.clone(),
                        Holder {
                            client_id: client_id.to_owned(),
                            renewed_ms: now_ms,
                        },
                    );
                    self.locked += 1;
                    granted.push(queue);
                }
                None => {}
            }
        }
        if table.is_empty() {
            self.groups.remove(group);
        }
        granted
    }

    /// Releases those of `queues` that `client_id` holds.
    pub fn unlock_batch(&mut self, group: &str, client_id: &str, queues: &[QueueId]) {
        let Some(table) = self.groups.get_mut(group) else {
            return;
        };
        for queue in queues {
            if table
                .get(queue)
                .is_some_and(|holder| holder.client_id == client_id)
            {
                table.remove(queue);
                self.locked -= 1;
            }
        }
        if table.is_empty() {
            self.groups.remove(group);
        }
    }

    /// The client holding `queue` for `group` at `now_ms`, if any.
    pub fn holder(&self, group: &str, queue: &QueueId, now_ms: i64) -> Option<&str> {
        self.groups
            .get(group)?
            .get(queue)
            .filter(|holder| now_ms - holder.renewed_ms <= self.expiry_ms)
            .map(|holder| holder.client_id.as_str())
    }

    /// Locks over every group, expired ones included until their group is next touched.
    pub fn len(&self) -> usize {
        self.locked
    }

    pub fn is_empty(&self) -> bool {
        self.locked == 0
    }

    fn drop_expired(&mut self, group: &str, now_ms: i64) {
        let Some(table) = self.groups.get_mut(group) else {
            return;
        };
        let before = table.len();
        table.retain(|_, holder| now_ms - holder.renewed_ms <= self.expiry_ms);
        self.locked -= before - table.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(id: u32) -> QueueId {
        ("orders".to_owned(), id)
    }

    #[test]
    fn one_holder_at_a_time_until_release_or_expiry() {
        let mut locks = QueueLocks::new(1_000);
        assert_eq!(
            locks.lock_batch("g", "a", vec![queue(0), queue(1)], 0),
            vec![queue(0), queue(1)]
        );
        assert!(
            locks.lock_batch("g", "b", vec![queue(0), queue(2)], 10) == vec![queue(2)],
            "b gets only the free queue"
        );
        assert!(
            locks.lock_batch("other", "b", vec![queue(0)], 10) == vec![queue(0)],
            "groups lock independently"
        );
        // a renews queue 0 at 900; b still cannot take it at 1 500, but can once it expires.
        assert_eq!(
            locks.lock_batch("g", "a", vec![queue(0)], 900),
            vec![queue(0)]
        );
        assert!(locks.lock_batch("g", "b", vec![queue(0)], 1_500).is_empty());
        assert_eq!(locks.holder("g", &queue(0), 1_500), Some("a"));
        assert_eq!(
            locks.lock_batch("g", "b", vec![queue(0)], 1_901),
            vec![queue(0)]
        );
        // Unlocking someone else's queue changes nothing; the holder's unlock frees it.
        locks.unlock_batch("g", "a", &[queue(0), queue(2)]);
        assert_eq!(locks.holder("g", &queue(0), 1_901), Some("b"));
        locks.unlock_batch("g", "b", &[queue(0)]);
        assert_eq!(locks.holder("g", &queue(0), 1_901), None);
        assert_eq!(
            locks.lock_batch("g", "a", vec![queue(0)], 1_902),
            vec![queue(0)]
        );
    }

    #[test]
    fn expired_and_released_locks_are_forgotten() {
        let mut locks = QueueLocks::new(100);
        locks.lock_batch("g", "a", vec![queue(0), queue(1)], 0);
        assert_eq!(locks.len(), 2);
        locks.unlock_batch("g", "a", &[queue(1)]);
        assert_eq!(locks.len(), 1);
        locks.lock_batch("g", "b", vec![queue(5)], 500);
        assert_eq!(
            locks.len(),
            1,
            "a's expired lock went when the group was touched"
        );
        locks.unlock_batch("g", "b", &[queue(5)]);
        assert!(locks.is_empty());
    }
}
