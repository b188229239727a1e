//! Long polling on the storage side: which network shards wait for a message on which queue,
//! and waking them when one is appended (or, on a slave, replicated past where their pulls
//! parked). A dropped wake-up only delays a parked pull until its timeout.

use crate::mesh::NetworkEvent;

use super::shard::StorageShard;

impl StorageShard {
    pub(super) fn notify_arrival(&self, topic: &str, queue_id: u32) {
        let mask = {
            let mut watches = self.watches.borrow_mut();
            let Some(queues) = watches.get_mut(topic) else {
                return;
            };
            let mask = queues.remove(&queue_id);
            if queues.is_empty() {
                watches.remove(topic);
            }
            mask
        };
        self.parked_at
            .borrow_mut()
            .remove(&(topic.to_owned(), queue_id));
        let Some(mask) = mask else { return };
        for (network_shard, sender) in self.events.iter().enumerate() {
            if mask & (1 << network_shard) != 0 {
                // A dropped arrival only delays a parked pull until its timeout.
                let _ = sender.try_send(NetworkEvent::Arrival {
                    topic: topic.to_owned(),
                    queue_id,
                });
            }
        }
    }

    pub(super) fn watch(&self, topic: &str, queue_id: u32, network_shard: usize) {
        let mut watches = self.watches.borrow_mut();
        *watches
            .entry(topic.to_owned())
            .or_default()
            .entry(queue_id)
            .or_default() |= 1 << network_shard;
        drop(watches);
        // Where the queue ended when the pull parked (a pull parks only at the end).
        let max = self
            .store
            .queue_offsets(topic, queue_id)
            .map_or(0, |(_, max)| max);
        self.parked_at
            .borrow_mut()
            .entry((topic.to_owned(), queue_id))
            .or_insert(max);
    }

    /// A slave appended replicated bytes: wakes the parked pulls of every watched queue that
    /// grew past where its pulls parked.
    pub(super) fn notify_replicated(&self) {
        let grown: Vec<(String, u32)> = self
            .parked_at
            .borrow()
            .iter()
            .filter(|((topic, queue_id), at)| {
                self.store
                    .queue_offsets(topic, *queue_id)
                    .is_some_and(|(_, max)| max > **at)
            })
            .map(|(key, _)| key.clone())
            .collect();
        for (topic, queue_id) in grown {
            self.notify_arrival(&topic, queue_id);
        }
    }
}
