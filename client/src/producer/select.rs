//! Which queue a send goes to: round-robin over a topic's write queues from a random start
//! (avoiding the broker that just failed), by key for ordered sends (Java's `String.hashCode`,
//! as RocketMQ's `SelectMessageQueueByHash`), or exactly the queue asked for.
//!
//! Owns: [`QueueChoice`], the per-topic round-robin counters and the choice itself. Never:
//! sending (`send.rs`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::ProducerInner;
use crate::error::{Error, Result};
use crate::route::{MessageQueue, TopicRoute};

/// How a send picks its queue on each attempt.
#[derive(Debug, Clone, Copy)]
pub(super) enum QueueChoice<'a> {
    /// Round-robin, avoiding the broker of the last failed attempt when another exists.
    RoundRobin,
    /// The queue `hash(key) % write queue count`.
    ByKey(&'a str),
    /// Exactly this queue.
    Fixed(&'a MessageQueue),
}

pub(super) fn master_address(route: &TopicRoute, queue: &MessageQueue) -> Result<String> {
    route
        .master_address(&queue.broker_name)
        .map(str::to_owned)
        .ok_or_else(|| Error::NoQueue {
            topic: route.topic.clone(),
            kind: "writable (live master)",
        })
}

/// Java's `String.hashCode()` of `text` (UTF-16 code units): the stable hash ordered sends
/// use, as RocketMQ's `SelectMessageQueueByHash` does.
#[must_use]
pub fn java_string_hash(text: &str) -> i32 {
    text.encode_utf16().fold(0i32, |hash, unit| {
        hash.wrapping_mul(31).wrapping_add(i32::from(unit))
    })
}

/// The index among `queue_count` queues that `key` selects: `|java_string_hash(key)| %
/// queue_count` (the absolute value taken without overflow).
#[must_use]
pub fn queue_index_for_key(key: &str, queue_count: usize) -> usize {
    debug_assert!(queue_count > 0);
    java_string_hash(key).unsigned_abs() as usize % queue_count
}

impl ProducerInner {
    /// The queue an attempt sends to and its master's address. A cached route that offers none
    /// (cached while the topic had no writable master, as in the moments of a failover between
    /// the old master leaving the routes and the new one joining) is fetched again before the
    /// attempt gives up: a producer never waits for the periodic route refresh to find a new
    /// master (RocketMQ's `tryToFindTopicPublishInfo` does the same).
    pub(super) async fn target(
        &self,
        topic: &str,
        choice: QueueChoice<'_>,
        failed_broker: Option<&str>,
    ) -> Result<(MessageQueue, String)> {
        let pick = |route: &TopicRoute| -> Result<(MessageQueue, String)> {
            let queue = self.select_queue(route, choice, failed_broker)?;
            let address = master_address(route, &queue)?;
            Ok((queue, address))
        };
        let route = self.instance.namesrv.route(topic).await?;
        match pick(&route) {
            Err(Error::NoQueue { .. }) => {
                let route = self.instance.namesrv.fetch_route(topic).await?;
                pick(&route)
            }
            picked => picked,
        }
    }

    pub(super) fn queue_counter(&self, topic: &str) -> Arc<AtomicUsize> {
        let mut counters = self
            .next_queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(
            counters
                .entry(topic.to_owned())
                .or_insert_with(|| Arc::new(AtomicUsize::new(random_start(topic)))),
        )
    }

    pub(super) fn select_queue(
        &self,
        route: &TopicRoute,
        choice: QueueChoice<'_>,
        failed_broker: Option<&str>,
    ) -> Result<MessageQueue> {
        if let QueueChoice::Fixed(queue) = choice {
            return Ok(queue.clone());
        }
        let queues = route.write_queues();
        if queues.is_empty() {
            return Err(Error::NoQueue {
                topic: route.topic.clone(),
                kind: "writable",
            });
        }
        if let QueueChoice::ByKey(key) = choice {
            return Ok(queues[queue_index_for_key(key, queues.len())].clone());
        }
        let counter = self.queue_counter(&route.topic);
        let start = counter.fetch_add(1, Ordering::Relaxed);
        if let Some(failed) = failed_broker {
            for step in 0..queues.len() {
                let queue = &queues[(start + step) % queues.len()];
                if queue.broker_name != failed {
                    return Ok(queue.clone());
                }
            }
        }
        Ok(queues[start % queues.len()].clone())
    }
}

/// Where a new producer's round-robin over a topic's queues starts: a different queue in each
/// producer (RocketMQ starts at a random index too), so one-shot senders (`shardmq send`, each
/// a new producer) spread over the queues instead of all landing on the first.
fn random_start(topic: &str) -> usize {
    use std::hash::BuildHasher;
    // A `RandomState` is seeded from the OS for each process and differs per instance.
    std::collections::hash_map::RandomState::new().hash_one(topic) as usize
}

#[cfg(test)]
#[cfg(test)]
mod tests {
    use super::*;
    use crate::producer::Producer;
    use crate::route::test_route;

    #[test]
    fn java_hash_matches_java() {
        // Values from Java's "…".hashCode().
        assert_eq!(java_string_hash(""), 0);
        assert_eq!(java_string_hash("a"), 97);
        assert_eq!(java_string_hash("hello"), 99_162_322);
        // "polygenelubricants".hashCode() is the classic Integer.MIN_VALUE.
        assert_eq!(java_string_hash("polygenelubricants"), i32::MIN);
        assert_eq!(queue_index_for_key("polygenelubricants", 8), 0);
    }

    #[test]
    fn key_selection_is_stable_and_in_range() {
        for key in ["a", "order-1", "order-2", "ключ"] {
            let index = queue_index_for_key(key, 8);
            assert!(index < 8);
            assert_eq!(index, queue_index_for_key(key, 8));
        }
        assert_eq!(queue_index_for_key("a", 8), 97 % 8);
    }

    #[test]
    fn producers_start_their_round_robin_at_different_queues() {
        let starts: std::collections::BTreeSet<usize> =
            (0..20).map(|_| random_start("t") % 8).collect();
        assert!(
            starts.len() > 1,
            "20 producers all started at queue {starts:?}"
        );
    }

    #[tokio::test]
    async fn round_robin_avoids_the_failed_broker() {
        let producer = Producer::builder()
            .namesrv("127.0.0.1:1")
            .build()
            .await
            .unwrap();
        let route = test_route("t", &[("a", 2, 6), ("b", 2, 6)]);
        let inner = &producer.inner;
        let picked: Vec<String> = (0..4)
            .map(|_| {
                inner
                    .select_queue(&route, QueueChoice::RoundRobin, None)
                    .unwrap()
                    .to_string()
            })
            .collect();
        // Consecutive picks go round the four queues, from wherever this producer started.
        let order = ["t@a#0", "t@a#1", "t@b#0", "t@b#1"];
        let start = order.iter().position(|q| *q == picked[0]).unwrap();
        let expected: Vec<&str> = (0..4).map(|i| order[(start + i) % 4]).collect();
        assert_eq!(picked, expected);
        for _ in 0..4 {
            let queue = inner
                .select_queue(&route, QueueChoice::RoundRobin, Some("a"))
                .unwrap();
            assert_eq!(queue.broker_name, "b");
        }
        let by_key = inner
            .select_queue(&route, QueueChoice::ByKey("a"), None)
            .unwrap();
        // java_string_hash("a") = 97; 97 % 4 = 1: the second of [a#0, a#1, b#0, b#1].
        assert_eq!(by_key.to_string(), "t@a#1");
    }
}
