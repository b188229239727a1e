//! Topic routes as the name server gives them, and the queues they name.
//!
//! Owns: [`TopicRoute`] (RocketMQ's TopicRouteData: broker names with their instances, and each
//! broker name's queue counts and permission) and [`MessageQueue`], and the rules that turn a
//! route into the queues a producer may write ([`TopicRoute::write_queues`]: write permission,
//! master alive) and a consumer may read ([`TopicRoute::read_queues`]). Never: fetching
//! routes (see `namesrv.rs`).

use std::collections::BTreeMap;
use std::fmt;

use shardmq_schema::topic_permission;

/// One queue of a topic on one broker name. Ordered by topic, broker name, queue id: the order
/// rebalancing sorts queues in.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageQueue {
    pub topic: String,
    pub broker_name: String,
    pub queue_id: u32,
}

impl MessageQueue {
    #[must_use]
    pub fn new(topic: impl Into<String>, broker_name: impl Into<String>, queue_id: u32) -> Self {
        Self {
            topic: topic.into(),
            broker_name: broker_name.into(),
            queue_id,
        }
    }
}

impl fmt::Display for MessageQueue {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            formatter,
            "{}@{}#{}",
            self.topic, self.broker_name, self.queue_id
        )
    }
}

/// One broker name and its live instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerData {
    pub cluster_name: String,
    pub broker_name: String,
    /// Broker id (0 master, > 0 slave) → `host:port`.
    pub addresses: BTreeMap<i64, String>,
}

/// A cluster and its broker names, as the name server lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterInfo {
    pub name: String,
    /// Sorted by broker name.
    pub brokers: Vec<BrokerData>,
}

impl ClusterInfo {
    /// The master addresses of the cluster's broker names that have a live master.
    #[must_use]
    pub fn master_addresses(&self) -> Vec<&str> {
        self.brokers
            .iter()
            .filter_map(|broker| broker.addresses.get(&0).map(String::as_str))
            .collect()
    }
}

/// A broker name's queues of a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueData {
    pub read_queues: u32,
    pub write_queues: u32,
    /// Permission bits: read 4, write 2, inherit 1.
    pub perm: u32,
}

/// Where a topic lives: its broker names (sorted) and their queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicRoute {
    pub topic: String,
    /// Broker name → its instances.
    pub brokers: BTreeMap<String, BrokerData>,
    /// Broker name → its queues of this topic.
    pub queues: BTreeMap<String, QueueData>,
}

impl TopicRoute {
    /// The master's address of `broker_name`, when it is alive.
    #[must_use]
    pub fn master_address(&self, broker_name: &str) -> Option<&str> {
        self.brokers
            .get(broker_name)
            .and_then(|broker| broker.addresses.get(&0))
            .map(String::as_str)
    }

    /// Where to read `broker_name`'s queues: the master, else the lowest-id slave.
    #[must_use]
    pub fn read_address(&self, broker_name: &str) -> Option<&str> {
        self.brokers
            .get(broker_name)
            .and_then(|broker| broker.addresses.values().next())
            .map(String::as_str)
    }

    /// Every queue producers may write: broker names with write permission and a live master,
    /// queue ids `0..write_queues`; sorted.
    #[must_use]
    pub fn write_queues(&self) -> Vec<MessageQueue> {
        self.queues
            .iter()
            .filter(|(name, data)| {
                data.perm & topic_permission::WRITE != 0 && self.master_address(name).is_some()
            })
            .flat_map(|(name, data)| {
                (0..data.write_queues)
                    .map(move |queue_id| MessageQueue::new(&self.topic, name, queue_id))
            })
            .collect()
    }

    /// Every queue consumers may read: broker names with read permission and a live instance,
    /// queue ids `0..read_queues`; sorted.
    #[must_use]
    pub fn read_queues(&self) -> Vec<MessageQueue> {
        self.queues
            .iter()
            .filter(|(name, data)| {
                data.perm & topic_permission::READ != 0 && self.read_address(name).is_some()
            })
            .flat_map(|(name, data)| {
                (0..data.read_queues)
                    .map(move |queue_id| MessageQueue::new(&self.topic, name, queue_id))
            })
            .collect()
    }

    /// Every instance address of every broker name, masters first within a name.
    #[must_use]
    pub fn all_addresses(&self) -> Vec<&str> {
        self.brokers
            .values()
            .flat_map(|broker| broker.addresses.values().map(String::as_str))
            .collect()
    }
}

#[cfg(test)]
pub(crate) fn test_route(topic: &str, brokers: &[(&str, u32, u32)]) -> TopicRoute {
    let mut route = TopicRoute {
        topic: topic.to_owned(),
        brokers: BTreeMap::new(),
        queues: BTreeMap::new(),
    };
    for (index, (name, queues, perm)) in brokers.iter().enumerate() {
        route.brokers.insert(
            (*name).to_owned(),
            BrokerData {
                cluster_name: "c".to_owned(),
                broker_name: (*name).to_owned(),
                addresses: BTreeMap::from([(0, format!("127.0.0.1:{}", 10_000 + index))]),
            },
        );
        route.queues.insert(
            (*name).to_owned(),
            QueueData {
                read_queues: *queues,
                write_queues: *queues,
                perm: *perm,
            },
        );
    }
    route
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_queues_skip_read_only_brokers() {
        let route = test_route("t", &[("b", 2, 6), ("a", 1, 6), ("c", 3, 4)]);
        let queues = route.write_queues();
        let names: Vec<String> = queues.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["t@a#0", "t@b#0", "t@b#1"]);
        assert_eq!(route.read_queues().len(), 6);
    }

    #[test]
    fn a_broker_without_master_is_not_written() {
        let mut route = test_route("t", &[("a", 2, 6)]);
        let broker = route.brokers.get_mut("a").unwrap();
        let address = broker.addresses.remove(&0).unwrap();
        broker.addresses.insert(1, address.clone());
        assert!(route.write_queues().is_empty());
        assert_eq!(route.read_address("a"), Some(address.as_str()));
        assert_eq!(route.read_queues().len(), 2);
    }
}
