//! Client and group membership: which clients are alive, which producer and consumer groups
//! each belongs to, and with what subscriptions.
//!
//! Owned by storage shard 0 alone (DESIGN: one owner, asked over the mesh, so every network
//! shard sees the same membership). Pure bookkeeping: every change returns the consumer groups
//! whose member list changed, so the owner can tell their clients to rebalance.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A consumer group as one client declared it in its heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerMembership {
    pub is_broadcasting: bool,
    pub is_orderly: bool,
    /// (topic, tag expression).
    pub subscriptions: Vec<(String, String)>,
}

#[derive(Debug, Clone)]
struct ClientState {
    last_seen_ms: i64,
    producer_groups: BTreeSet<String>,
    consumer_groups: BTreeMap<String, ConsumerMembership>,
}

#[derive(Debug, Default)]
pub struct ClientRegistry {
    clients: HashMap<String, ClientState>,
}

impl ClientRegistry {
    /// Records a heartbeat; returns consumer groups whose members changed.
    pub fn heartbeat(
        &mut self,
        client_id: &str,
        now_ms: i64,
        producer_groups: Vec<String>,
        consumer_groups: BTreeMap<String, ConsumerMembership>,
    ) -> Vec<String> {
        let previous: BTreeSet<String> = self
            .clients
            .get(client_id)
            .map(|c| c.consumer_groups.keys().cloned().collect())
            .unwrap_or_default();
        let current: BTreeSet<String> = consumer_groups.keys().cloned().collect();
        self.clients.insert(
            client_id.to_owned(),
            ClientState {
                last_seen_ms: now_ms,
                producer_groups: producer_groups.into_iter().collect(),
                consumer_groups,
            },
        );
        previous.symmetric_difference(&current).cloned().collect()
    }

    /// A client leaves one producer and/or consumer group.
    pub fn unregister(
        &mut self,
        client_id: &str,
        producer_group: Option<&str>,
        consumer_group: Option<&str>,
    ) -> Vec<String> {
        let Some(client) = self.clients.get_mut(client_id) else {
            return Vec::new();
        };
        if let Some(group) = producer_group {
            client.producer_groups.remove(group);
        }
        let mut changed = Vec::new();
        if let Some(group) = consumer_group {
            if client.consumer_groups.remove(group).is_some() {
                changed.push(group.to_owned());
            }
        }
        if client.producer_groups.is_empty() && client.consumer_groups.is_empty() {
            self.clients.remove(client_id);
        }
        changed
    }

    /// A client's connection closed: it leaves every group.
    pub fn remove_client(&mut self, client_id: &str) -> Vec<String> {
        self.clients
            .remove(client_id)
            .map(|c| c.consumer_groups.into_keys().collect())
            .unwrap_or_default()
    }

    /// Drops clients silent for `timeout_ms`; returns the consumer groups that changed.
    pub fn expire(&mut self, now_ms: i64, timeout_ms: i64) -> Vec<String> {
        let expired: Vec<String> = self
            .clients
            .iter()
            .filter(|(_, c)| now_ms - c.last_seen_ms > timeout_ms)
            .map(|(id, _)| id.clone())
            .collect();
        let mut changed = BTreeSet::new();
        for id in expired {
            tracing::info!(client_id = %id, "client expired: no heartbeat within the client timeout");
            changed.extend(self.remove_client(&id));
        }
        changed.into_iter().collect()
    }

    /// Client ids of a consumer group's live members, sorted (the order rebalancing uses).
    pub fn consumers_of(&self, group: &str) -> Vec<String> {
        let mut ids: Vec<String> = self
            .clients
            .iter()
            .filter(|(_, c)| c.consumer_groups.contains_key(group))
            .map(|(id, _)| id.clone())
            .collect();
        ids.sort();
        ids
    }

    /// Consumer groups known, sorted.
    pub fn consumer_groups(&self) -> Vec<String> {
        let groups: BTreeSet<String> = self
            .clients
            .values()
            .flat_map(|c| c.consumer_groups.keys().cloned())
            .collect();
        groups.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member() -> ConsumerMembership {
        ConsumerMembership {
            is_broadcasting: false,
            is_orderly: false,
            subscriptions: vec![("t".into(), "*".into())],
        }
    }

    #[test]
    fn membership_changes_are_reported() {
        let mut registry = ClientRegistry::default();
        let groups = BTreeMap::from([("g".to_string(), member())]);
        assert_eq!(
            registry.heartbeat("c1", 0, vec![], groups.clone()),
            vec!["g".to_string()]
        );
        assert!(
            registry
                .heartbeat("c1", 10, vec![], groups.clone())
                .is_empty(),
            "a repeat heartbeat changes nothing"
        );
        registry.heartbeat("c2", 10, vec!["p".into()], groups);
        assert_eq!(
            registry.consumers_of("g"),
            vec!["c1".to_string(), "c2".to_string()]
        );
        assert_eq!(registry.expire(200_000, 120_000), vec!["g".to_string()]);
        assert!(registry.consumers_of("g").is_empty());
        registry.heartbeat(
            "c3",
            0,
            vec![],
            BTreeMap::from([("g".to_string(), member())]),
        );
        assert_eq!(registry.remove_client("c3"), vec!["g".to_string()]);
    }
}
