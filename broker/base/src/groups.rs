//! Client and group membership: which clients are alive, which producer and consumer groups
//! each belongs to, and with what subscriptions.
//!
//! Owned by storage shard 0 alone (DESIGN: one owner, asked over the mesh, so every network
//! shard sees the same membership). Pure bookkeeping: every change returns the consumer groups
//! whose member list changed, so the owner can tell their clients to rebalance.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// One client connection, named across the broker: which network shard holds it and its id
/// there. A client may hold several connections; it is gone when its last one closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnectionKey {
    pub network_shard: usize,
    pub connection_id: u64,
}

/// A consumer group as one client declared it in its heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerMembership {
    pub is_broadcasting: bool,
    pub is_orderly: bool,
    /// (topic, expression, whether the expression is SQL92 rather than tags).
    pub subscriptions: Vec<(String, String, bool)>,
    /// The queues the client said it holds for the group, as (topic, broker name, queue id);
    /// `None` when it does not report them. Not membership: a change of it alone is no change
    /// of the group's members.
    pub held_queues: Option<Vec<(String, String, u32)>>,
}

#[derive(Debug, Clone)]
struct ClientState {
    last_seen_ms: i64,
    producer_groups: BTreeSet<String>,
    consumer_groups: BTreeMap<String, ConsumerMembership>,
    /// Connections this client has heartbeated on and that are still open.
    connections: BTreeSet<ConnectionKey>,
}

#[derive(Debug, Default)]
pub struct ClientRegistry {
    clients: HashMap<String, ClientState>,
}

impl ClientRegistry {
    /// Records a heartbeat received on `connection`; returns consumer groups whose members
    /// changed.
    pub fn heartbeat(
        &mut self,
        client_id: &str,
        connection: ConnectionKey,
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
        let mut connections = self
            .clients
            .remove(client_id)
            .map(|c| c.connections)
            .unwrap_or_default();
        connections.insert(connection);
        self.clients.insert(
            client_id.to_owned(),
            ClientState {
                last_seen_ms: now_ms,
                producer_groups: producer_groups.into_iter().collect(),
                consumer_groups,
                connections,
            },
        );
        previous.symmetric_difference(&current).cloned().collect()
    }

    /// Refreshes the liveness of a client already registered on `connection` (a heartbeat that
    /// repeated its last full one). An unknown client is left alone: its network shard sends a
    /// full heartbeat again within `FULL_HEARTBEAT_EVERY`.
    pub fn touch(&mut self, client_id: &str, connection: ConnectionKey, now_ms: i64) {
        if let Some(client) = self.clients.get_mut(client_id) {
            if client.connections.contains(&connection) {
                client.last_seen_ms = client.last_seen_ms.max(now_ms);
            }
        }
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

    /// One of a client's connections closed. The client leaves every group only when that was
    /// its last open connection it heartbeated on; returns the consumer groups that changed.
    pub fn connection_closed(&mut self, client_id: &str, connection: ConnectionKey) -> Vec<String> {
        let Some(client) = self.clients.get_mut(client_id) else {
            return Vec::new();
        };
        if !client.connections.remove(&connection) || !client.connections.is_empty() {
            return Vec::new();
        }
        self.remove_client(client_id)
    }

    /// Live members of a producer group with the connections they can be reached on (for
    /// broker-initiated requests such as transaction check-backs), sorted by client id.
    pub fn producers_of(&self, group: &str) -> Vec<(String, Vec<ConnectionKey>)> {
        let mut producers: Vec<(String, Vec<ConnectionKey>)> = self
            .clients
            .iter()
            .filter(|(_, c)| c.producer_groups.contains(group))
            .map(|(id, c)| (id.clone(), c.connections.iter().copied().collect()))
            .collect();
        producers.sort();
        producers
    }

    /// A client leaves every group.
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

    /// A consumer group's live members with what each declared for the group in its last
    /// heartbeat (model, orderliness, subscriptions), sorted by client id.
    pub fn members_of(&self, group: &str) -> Vec<(String, ConsumerMembership)> {
        let mut members: Vec<(String, ConsumerMembership)> = self
            .clients
            .iter()
            .filter_map(|(id, c)| Some((id.clone(), c.consumer_groups.get(group)?.clone())))
            .collect();
        members.sort_by(|a, b| a.0.cmp(&b.0));
        members
    }

    /// (group, live members, subscribed topics sorted) of every consumer group with members,
    /// sorted by group.
    pub fn group_summaries(&self) -> Vec<(String, usize, Vec<String>)> {
        let mut groups: BTreeMap<String, (usize, BTreeSet<String>)> = BTreeMap::new();
        for client in self.clients.values() {
            for (group, membership) in &client.consumer_groups {
                let entry = groups.entry(group.clone()).or_default();
                entry.0 += 1;
                entry
                    .1
                    .extend(membership.subscriptions.iter().map(|(t, _, _)| t.clone()));
            }
        }
        groups
            .into_iter()
            .map(|(group, (members, topics))| (group, members, topics.into_iter().collect()))
            .collect()
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
            subscriptions: vec![("t".into(), "*".into(), false)],
            held_queues: None,
        }
    }

    fn connection(connection_id: u64) -> ConnectionKey {
        ConnectionKey {
            network_shard: 0,
            connection_id,
        }
    }

    #[test]
    fn members_of_a_group_carry_their_declarations() {
        let mut registry = ClientRegistry::default();
        let broadcasting = ConsumerMembership {
            is_broadcasting: true,
            ..member()
        };
        registry.heartbeat(
            "c2",
            connection(2),
            0,
            vec![],
            BTreeMap::from([("g".to_string(), broadcasting.clone())]),
        );
        registry.heartbeat(
            "c1",
            connection(1),
            0,
            vec![],
            BTreeMap::from([("g".to_string(), member()), ("h".to_string(), member())]),
        );
        assert_eq!(
            registry.members_of("g"),
            vec![
                ("c1".to_string(), member()),
                ("c2".to_string(), broadcasting)
            ]
        );
        assert!(registry.members_of("unknown").is_empty());
    }

    #[test]
    fn held_queues_are_kept_but_are_no_membership_change() {
        let mut registry = ClientRegistry::default();
        registry.heartbeat(
            "c1",
            connection(1),
            0,
            vec![],
            BTreeMap::from([("g".to_string(), member())]),
        );
        let holding = ConsumerMembership {
            held_queues: Some(vec![("t".into(), "b".into(), 3)]),
            ..member()
        };
        assert!(registry
            .heartbeat(
                "c1",
                connection(1),
                10,
                vec![],
                BTreeMap::from([("g".to_string(), holding.clone())]),
            )
            .is_empty());
        assert_eq!(registry.members_of("g"), vec![("c1".to_string(), holding)]);
    }

    #[test]
    fn membership_changes_are_reported() {
        let mut registry = ClientRegistry::default();
        let groups = BTreeMap::from([("g".to_string(), member())]);
        assert_eq!(
            registry.heartbeat("c1", connection(1), 0, vec![], groups.clone()),
            vec!["g".to_string()]
        );
        assert!(
            registry
                .heartbeat("c1", connection(1), 10, vec![], groups.clone())
                .is_empty(),
            "a repeat heartbeat changes nothing"
        );
        registry.heartbeat("c2", connection(2), 10, vec!["p".into()], groups);
        assert_eq!(
            registry.consumers_of("g"),
            vec!["c1".to_string(), "c2".to_string()]
        );
        assert_eq!(registry.expire(200_000, 120_000), vec!["g".to_string()]);
        assert!(registry.consumers_of("g").is_empty());
        registry.heartbeat(
            "c3",
            connection(3),
            0,
            vec![],
            BTreeMap::from([("g".to_string(), member())]),
        );
        assert_eq!(registry.remove_client("c3"), vec!["g".to_string()]);
    }

    #[test]
    fn a_client_stays_while_any_of_its_connections_is_open() {
        let mut registry = ClientRegistry::default();
        let groups = BTreeMap::from([("g".to_string(), member())]);
        registry.heartbeat("c1", connection(1), 0, vec!["p".into()], groups.clone());
        registry.heartbeat("c1", connection(2), 0, vec!["p".into()], groups);
        assert!(
            registry.connection_closed("c1", connection(1)).is_empty(),
            "closing one of two connections must not change the group"
        );
        assert_eq!(registry.consumers_of("g"), vec!["c1".to_string()]);
        assert_eq!(
            registry.producers_of("p"),
            vec![("c1".to_string(), vec![connection(2)])]
        );
        assert!(
            registry.connection_closed("c1", connection(9)).is_empty(),
            "a connection the client never heartbeated on changes nothing"
        );
        assert_eq!(
            registry.connection_closed("c1", connection(2)),
            vec!["g".to_string()]
        );
        assert!(registry.consumers_of("g").is_empty());
        assert!(registry.producers_of("p").is_empty());
    }
}
