//! What storage shards tell a network shard (`NetworkEvent`): readiness, topic table snapshots,
//! arrivals that wake parked pulls, and group membership changes it pushes to the clients of
//! that group. Transaction check-backs are served by the event loop itself (they wait for a
//! client's answer).

use tracing::info;

use super::{clients, NetworkShard};
use crate::mesh::NetworkEvent;

impl NetworkShard {
    pub(super) fn on_event(&self, event: NetworkEvent) {
        match event {
            NetworkEvent::StorageReady { shard } => {
                info!(
                    network_shard = self.id,
                    storage_shard = shard,
                    "storage shard ready"
                );
                self.storage_ready.set(self.storage_ready.get() + 1);
                self.changed.notify_all();
            }
            NetworkEvent::Topics(table) => {
                *self.topics.borrow_mut() = table;
                self.changed.notify_all();
            }
            NetworkEvent::Arrival { topic, queue_id } => self.parking.wake(&topic, queue_id),
            NetworkEvent::ConsumerIdsChanged { group } => self.push_consumer_ids_changed(&group),
            NetworkEvent::TransactionCheck(_) => {
                debug_assert!(false, "transaction checks are served by the event loop");
            }
        }
    }

    fn push_consumer_ids_changed(&self, group: &str) {
        let frame =
            self.with_encoder(|encoder| clients::encode_consumer_ids_changed(encoder, group));
        let Ok(frame) = frame else { return };
        for entry in self.connections.borrow().values() {
            if entry.consumer_groups.iter().any(|g| g == group) {
                // A full push channel means the client is not reading: it will rebalance on its
                // own timer.
                let _ = entry.push.try_send(vec![frame.clone()]);
            }
        }
    }
}
