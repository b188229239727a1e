//! The route table: which brokers are alive, which topics each hosts, and the route of a topic
//! built from them (RocketMQ's `RouteInfoManager`).
//!
//! Owns: every broker instance (cluster, broker name, broker id, address, topic configs, last
//! registration time) and the rules that turn them into routes. Never: sockets, clocks or
//! logging. Callers pass `now` in, so expiry is tested without waiting, and they log what the
//! outcomes say. The table is rebuilt from registrations after a restart: nothing is persisted.
//!
//! Data enters as a [`BrokerRegistration`] (validated here: names, address, queue counts,
//! limits), an unregistration, or an expiry scan; it leaves as [`TopicRoute`]s, topic lists and
//! cluster summaries, all sorted so that answers are deterministic.
//!
//! Rules (RocketMQ's, made explicit):
//! - An instance is keyed by (broker name, broker id); id 0 is the master, > 0 a slave. One
//!   address belongs to one instance: registering an address under a new name or id replaces
//!   the old instance.
//! - A re-registration replaces the instance's topic configs whole.
//! - A broker name's queues for a topic come from its master when the master is alive. With the
//!   master gone, they come from its lowest-id live slave, without the write permission:
//!   consumers can still read from the slave, producers skip it.
//!
//! Size: about 690 lines of code and 480 of unit tests; kept whole because the table's counts
//! and limits are checked after every change by one `debug_check_counts`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use shardmq_schema::topic_permission;

/// The broker id of a master; slaves have ids above it.
pub const MASTER_BROKER_ID: i64 = 0;

/// Longest topic name, as RocketMQ allows.
pub const MAX_TOPIC_NAME_BYTES: usize = 127;

/// Longest cluster or broker name.
pub const MAX_BROKER_NAME_BYTES: usize = 255;

/// Longest `host:port` broker address.
pub const MAX_BROKER_ADDRESS_BYTES: usize = 255;

/// Most read or write queues one topic may have on one broker.
pub const MAX_QUEUES_PER_TOPIC: u32 = 65_536;

/// Every permission bit set (read, write, inherit).
const ALL_PERMISSION_BITS: u32 =
    topic_permission::READ | topic_permission::WRITE | topic_permission::INHERIT;

/// How much the table may hold, so that no sequence of registrations grows it without bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegistryLimits {
    /// Live broker instances (masters and slaves together).
    pub max_broker_instances: usize,
    /// Topics one instance may register.
    pub max_topics_per_broker: usize,
    /// Topic configs held over all instances together.
    pub max_topic_entries: usize,
}

impl Default for RegistryLimits {
    fn default() -> Self {
        Self {
            max_broker_instances: 1024,
            max_topics_per_broker: 65_536,
            // About 200 MiB of table at most.
            max_topic_entries: 2_000_000,
        }
    }
}

/// Why the table refused a registration. Each variant maps to one wire status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// A field is missing, malformed or out of range (`INVALID_ARGUMENT`).
    #[error("invalid {field}: {reason}")]
    InvalidArgument { field: &'static str, reason: String },
    /// A new instance would exceed `max_broker_instances` (`SYSTEM_BUSY`).
    #[error("{broker_instances} broker instances registered, at max_broker_instances ({max_broker_instances})")]
    TooManyBrokers {
        broker_instances: usize,
        max_broker_instances: usize,
    },
    /// The registration's topics would exceed a topic limit (`SYSTEM_BUSY` when the table as a
    /// whole is full; the per-broker limit is the sender's fault and reported as
    /// [`RegistryError::InvalidArgument`]).
    #[error("{topic_entries} topic configs would be registered, over max_topic_entries ({max_topic_entries})")]
    TooManyTopicEntries {
        topic_entries: usize,
        max_topic_entries: usize,
    },
    /// A master registration below the highest state version seen for its broker name: a
    /// deposed master that woke after another was made master (`SERVICE_NOT_AVAILABLE`).
    #[error("broker {broker_name} has a newer master (state version {current}); a master registration with state version {state_version} is refused")]
    StaleMaster {
        broker_name: String,
        state_version: u64,
        current: u64,
    },
}

/// How a broker hosts one topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicQueues {
    pub read_queues: u32,
    pub write_queues: u32,
    /// Permission bits ([`topic_permission`]).
    pub perm: u32,
    pub is_ordered: bool,
}

impl TopicQueues {
    /// `read_queues` and `write_queues` queues, readable and writable.
    #[must_use]
    pub fn read_write(read_queues: u32, write_queues: u32) -> Self {
        Self {
            read_queues,
            write_queues,
            perm: topic_permission::READ_WRITE,
            is_ordered: false,
        }
    }
}

/// What a broker instance announces in a `RegisterBrokerRequest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerRegistration {
    pub cluster_name: String,
    pub broker_name: String,
    /// [`MASTER_BROKER_ID`] for a master, above it for a slave.
    pub broker_id: i64,
    /// `host:port` clients connect to.
    pub broker_address: String,
    /// `host:port` for replication (later).
    pub ha_server_address: Option<String>,
    /// Every topic the instance hosts, by name.
    pub topics: BTreeMap<String, TopicQueues>,
    /// The broker's topic config version, for logs only: the table compares the topics
    /// themselves, which stays right across a broker restart that resets the version.
    pub topic_config_version: u64,
    /// Orders the masters of a broker name (the controller epoch; 0 outside controller mode):
    /// a master registration below the highest seen is refused.
    pub state_version: u64,
}

impl BrokerRegistration {
    /// Checks every field against the naming rules and limits.
    pub fn validate(&self, limits: &RegistryLimits) -> Result<(), RegistryError> {
        validate_broker_name("cluster_name", &self.cluster_name)?;
        validate_broker_name("broker_name", &self.broker_name)?;
        validate_broker_id(self.broker_id)?;
        validate_address("broker_address", &self.broker_address)?;
        if let Some(ha_server_address) = &self.ha_server_address {
            validate_address("ha_server_address", ha_server_address)?;
        }
        if self.topics.len() > limits.max_topics_per_broker {
            return Err(invalid(
                "topics",
                format!(
                    "{} topics, over max_topics_per_broker ({})",
                    self.topics.len(),
                    limits.max_topics_per_broker
                ),
            ));
        }
        for (name, queues) in &self.topics {
            validate_topic_name(name)?;
            validate_topic_queues(name, queues)?;
        }
        Ok(())
    }
}

/// Identifies one broker instance, for outcomes and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerIdentity {
    pub cluster_name: String,
    pub broker_name: String,
    pub broker_id: i64,
    pub broker_address: String,
}

/// What a registration changed, for the response and the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisterOutcome {
    /// The instance was not registered before (first registration, or after expiry).
    pub is_new_instance: bool,
    /// The instance's topic configs differ from what it registered last time.
    pub is_topic_config_changed: bool,
    /// An instance that held this address under another name or id, now removed.
    pub replaced: Option<BrokerIdentity>,
    /// For a slave: its master's address, when the master is registered.
    pub master_address: Option<String>,
    /// For a slave: its master's replication address, when known.
    pub master_ha_server_address: Option<String>,
}

/// A broker instance dropped for silence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiredBroker {
    pub broker: BrokerIdentity,
    /// Time since its last registration.
    pub silent_for: Duration,
}

/// One live instance of a broker name in a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteAddress {
    pub broker_id: i64,
    pub address: String,
}

/// A broker name and its live instances (RocketMQ's `BrokerData`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteBroker {
    pub cluster_name: String,
    pub broker_name: String,
    /// Sorted by broker id: the master, when alive, first.
    pub addresses: Vec<RouteAddress>,
}

/// A topic's queues on one broker name (RocketMQ's `QueueData`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteQueues {
    pub broker_name: String,
    pub read_queues: u32,
    pub write_queues: u32,
    pub perm: u32,
}

/// Where a topic lives (RocketMQ's `TopicRouteData`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicRoute {
    pub topic: String,
    /// Each broker name hosting the topic, sorted by name.
    pub brokers: Vec<RouteBroker>,
    /// The topic's queues on each of those broker names, in the same order.
    pub queues: Vec<RouteQueues>,
}

/// A cluster and its broker names (RocketMQ's `ClusterInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSummary {
    pub cluster_name: String,
    /// Sorted by broker name.
    pub brokers: Vec<RouteBroker>,
}

#[derive(Debug, Clone)]
struct BrokerInstance {
    address: String,
    ha_server_address: Option<String>,
    topics: BTreeMap<String, TopicQueues>,
    last_registered_at: Instant,
    /// The connection its last registration came on, when the server tracks connections: the
    /// instance is dropped when that connection closes.
    connection: Option<u64>,
}

/// The instances sharing one broker name: a master and its slaves.
#[derive(Debug, Clone)]
struct BrokerGroup {
    cluster_name: String,
    instances: BTreeMap<i64, BrokerInstance>,
}

impl BrokerGroup {
    /// The instance whose topic configs speak for the broker name, and whether writes are
    /// allowed through it: the master, else the lowest-id slave, read-only.
    fn authoritative_instance(&self) -> Option<(&BrokerInstance, bool)> {
        if let Some(master) = self.instances.get(&MASTER_BROKER_ID) {
            return Some((master, true));
        }
        self.instances.values().next().map(|slave| (slave, false))
    }

    fn route_broker(&self, broker_name: &str) -> RouteBroker {
        RouteBroker {
            cluster_name: self.cluster_name.clone(),
            broker_name: broker_name.to_owned(),
            addresses: self
                .instances
                .iter()
                .map(|(&broker_id, instance)| RouteAddress {
                    broker_id,
                    address: instance.address.clone(),
                })
                .collect(),
        }
    }
}

/// The name server's whole state. Not thread-safe by itself: the server wraps it in a mutex and
/// never holds the lock across an await.
#[derive(Debug, Clone)]
pub struct RouteTable {
    limits: RegistryLimits,
    /// By broker name.
    groups: BTreeMap<String, BrokerGroup>,
    /// Instances over all groups.
    broker_instances: usize,
    /// Topic configs over all instances.
    topic_entries: usize,
    /// The highest master state version registered per broker name; kept after the master
    /// goes (so a deposed master cannot come back under an old version) for at most
    /// `max_broker_instances` names.
    master_versions: BTreeMap<String, u64>,
}

impl Default for RouteTable {
    fn default() -> Self {
        Self::new(RegistryLimits::default())
    }
}

impl RouteTable {
    /// An empty table holding at most what `limits` allows.
    #[must_use]
    pub fn new(limits: RegistryLimits) -> Self {
        Self {
            limits,
            groups: BTreeMap::new(),
            broker_instances: 0,
            topic_entries: 0,
            master_versions: BTreeMap::new(),
        }
    }

    /// The table's limits.
    #[must_use]
    pub fn limits(&self) -> &RegistryLimits {
        &self.limits
    }

    /// Live broker instances.
    #[must_use]
    pub fn broker_instances(&self) -> usize {
        self.broker_instances
    }

    /// Records `registration` as of `now`: a first registration, a heartbeat, or a change of
    /// topics, address or cluster. On error the table is unchanged.
    pub fn register(
        &mut self,
        registration: BrokerRegistration,
        now: Instant,
    ) -> Result<RegisterOutcome, RegistryError> {
        self.register_on(registration, now, None)
    }

    /// As [`register`](Self::register), remembering that the registration came on
    /// `connection`: [`connection_closed`](Self::connection_closed) drops the instance when
    /// that connection ends (RocketMQ's `onChannelDestroy`), unless it registered since on
    /// another connection.
    pub fn register_on(
        &mut self,
        registration: BrokerRegistration,
        now: Instant,
        connection: Option<u64>,
    ) -> Result<RegisterOutcome, RegistryError> {
        registration.validate(&self.limits)?;
        if registration.broker_id == MASTER_BROKER_ID {
            let current = self
                .master_versions
                .get(&registration.broker_name)
                .copied()
                .unwrap_or(0);
            if registration.state_version < current {
                return Err(RegistryError::StaleMaster {
                    broker_name: registration.broker_name.clone(),
                    state_version: registration.state_version,
                    current,
                });
            }
        }
        let stale_key = self
            .key_of_address(&registration.broker_address)
            .filter(|key| key.0 != registration.broker_name || key.1 != registration.broker_id);
        let previous_topics = self
            .instance(&registration.broker_name, registration.broker_id)
            .map(|instance| instance.topics.len());
        let stale_topics = stale_key
            .as_ref()
            .and_then(|(name, id)| self.instance(name, *id))
            .map_or(0, |instance| instance.topics.len());
        self.check_capacity(
            &registration,
            previous_topics,
            stale_key.is_some(),
            stale_topics,
        )?;

        let replaced = stale_key.and_then(|(name, id)| self.remove_instance(&name, id));
        if registration.broker_id == MASTER_BROKER_ID {
            self.note_master_version(&registration.broker_name, registration.state_version);
        }
        let outcome = self.insert_instance(registration, now, connection, replaced);
        self.debug_check_counts();
        Ok(outcome)
    }

    /// Removes the instance (`broker_name`, `broker_id`) if it is registered at
    /// `broker_address`; an instance that has since re-registered elsewhere stays. Returns the
    /// removed instance, `None` when nothing matched (not an error: brokers unregister blindly).
    pub fn unregister(
        &mut self,
        broker_name: &str,
        broker_id: i64,
        broker_address: &str,
    ) -> Option<BrokerIdentity> {
        let instance = self.instance(broker_name, broker_id)?;
        if instance.address != broker_address {
            return None;
        }
        let removed = self.remove_instance(broker_name, broker_id);
        self.debug_check_counts();
        removed
    }

    /// The connection `connection` ended: drops the instance (`broker_name`, `broker_id`) if
    /// its latest registration came on it. Returns the dropped instance.
    pub fn connection_closed(
        &mut self,
        broker_name: &str,
        broker_id: i64,
        connection: u64,
    ) -> Option<BrokerIdentity> {
        let instance = self.instance(broker_name, broker_id)?;
        if instance.connection != Some(connection) {
            return None;
        }
        let removed = self.remove_instance(broker_name, broker_id);
        self.debug_check_counts();
        removed
    }

    fn note_master_version(&mut self, broker_name: &str, state_version: u64) {
        if !self.master_versions.contains_key(broker_name)
            && self.master_versions.len() >= self.limits.max_broker_instances
        {
            // Forget the versions of names with no live instance first; they are the ones a
            // bounded table can drop (a deposed master of a name nobody serves any more).
            let groups = &self.groups;
            self.master_versions
                .retain(|name, _| groups.contains_key(name));
            if self.master_versions.len() >= self.limits.max_broker_instances {
                return;
            }
        }
        let entry = self
            .master_versions
            .entry(broker_name.to_owned())
            .or_insert(0);
        *entry = (*entry).max(state_version);
    }

    /// Drops every instance whose last registration is more than `broker_timeout` before `now`
    /// and returns them.
    pub fn expire_silent(&mut self, now: Instant, broker_timeout: Duration) -> Vec<ExpiredBroker> {
        let mut silent = Vec::new();
        for (broker_name, group) in &self.groups {
            for (&broker_id, instance) in &group.instances {
                let silent_for = now.saturating_duration_since(instance.last_registered_at);
                if silent_for > broker_timeout {
                    silent.push((broker_name.clone(), broker_id, silent_for));
                }
            }
        }
        let expired = silent
            .into_iter()
            .filter_map(|(broker_name, broker_id, silent_for)| {
                self.remove_instance(&broker_name, broker_id)
                    .map(|broker| ExpiredBroker { broker, silent_for })
            })
            .collect();
        self.debug_check_counts();
        expired
    }

    /// The route of `topic`, or `None` when no live broker hosts it.
    #[must_use]
    pub fn route(&self, topic: &str) -> Option<TopicRoute> {
        let mut brokers = Vec::new();
        let mut queues = Vec::new();
        for (broker_name, group) in &self.groups {
            let Some((instance, is_writable)) = group.authoritative_instance() else {
                continue;
            };
            let Some(topic_queues) = instance.topics.get(topic) else {
                continue;
            };
            let perm = if is_writable {
                topic_queues.perm
            } else {
                topic_queues.perm & !topic_permission::WRITE
            };
            brokers.push(group.route_broker(broker_name));
            queues.push(RouteQueues {
                broker_name: broker_name.clone(),
                read_queues: topic_queues.read_queues,
                write_queues: topic_queues.write_queues,
                perm,
            });
        }
        debug_assert_eq!(brokers.len(), queues.len());
        (!brokers.is_empty()).then(|| TopicRoute {
            topic: topic.to_owned(),
            brokers,
            queues,
        })
    }

    /// Drops `topic` from every instance (of `cluster_name`'s brokers when given), so it has no
    /// route until a broker registers it again (RocketMQ's `deleteTopic`): a broker that still
    /// hosts it puts it back with its next registration, one that deleted it has already
    /// registered without it. Returns how many instances held it.
    pub fn delete_topic(&mut self, topic: &str, cluster_name: Option<&str>) -> usize {
        let mut removed = 0;
        for group in self.groups.values_mut() {
            if cluster_name.is_some_and(|cluster| cluster != group.cluster_name) {
                continue;
            }
            for instance in group.instances.values_mut() {
                if instance.topics.remove(topic).is_some() {
                    removed += 1;
                }
            }
        }
        self.topic_entries -= removed;
        self.debug_check_counts();
        removed
    }

    /// Names of the topics that have a route, sorted, each once; only `cluster_name`'s when
    /// given.
    #[must_use]
    pub fn topic_names(&self, cluster_name: Option<&str>) -> Vec<String> {
        let mut names = BTreeSet::new();
        for group in self.groups.values() {
            if cluster_name.is_some_and(|cluster| cluster != group.cluster_name) {
                continue;
            }
            if let Some((instance, _)) = group.authoritative_instance() {
                names.extend(instance.topics.keys().map(String::as_str));
            }
        }
        names.into_iter().map(str::to_owned).collect()
    }

    /// Every cluster with its broker names and their live instances, sorted by name.
    #[must_use]
    pub fn clusters(&self) -> Vec<ClusterSummary> {
        let mut clusters: BTreeMap<&str, Vec<RouteBroker>> = BTreeMap::new();
        for (broker_name, group) in &self.groups {
            clusters
                .entry(&group.cluster_name)
                .or_default()
                .push(group.route_broker(broker_name));
        }
        clusters
            .into_iter()
            .map(|(cluster_name, brokers)| ClusterSummary {
                cluster_name: cluster_name.to_owned(),
                brokers,
            })
            .collect()
    }

    fn instance(&self, broker_name: &str, broker_id: i64) -> Option<&BrokerInstance> {
        self.groups.get(broker_name)?.instances.get(&broker_id)
    }

    /// The (broker name, broker id) registered at `address`. A linear scan: it runs once per
    /// registration, over at most `max_broker_instances` instances.
    fn key_of_address(&self, address: &str) -> Option<(String, i64)> {
        self.groups.iter().find_map(|(broker_name, group)| {
            group
                .instances
                .iter()
                .find(|(_, instance)| instance.address == address)
                .map(|(&broker_id, _)| (broker_name.clone(), broker_id))
        })
    }

    fn check_capacity(
        &self,
        registration: &BrokerRegistration,
        previous_topics: Option<usize>,
        is_replacing_stale: bool,
        stale_topics: usize,
    ) -> Result<(), RegistryError> {
        let broker_instances = self.broker_instances - usize::from(is_replacing_stale)
            + usize::from(previous_topics.is_none());
        if broker_instances > self.limits.max_broker_instances {
            return Err(RegistryError::TooManyBrokers {
                broker_instances: self.broker_instances,
                max_broker_instances: self.limits.max_broker_instances,
            });
        }
        let topic_entries = self.topic_entries - previous_topics.unwrap_or(0) - stale_topics
            + registration.topics.len();
        if topic_entries > self.limits.max_topic_entries {
            return Err(RegistryError::TooManyTopicEntries {
                topic_entries,
                max_topic_entries: self.limits.max_topic_entries,
            });
        }
        Ok(())
    }

    fn insert_instance(
        &mut self,
        registration: BrokerRegistration,
        now: Instant,
        connection: Option<u64>,
        replaced: Option<BrokerIdentity>,
    ) -> RegisterOutcome {
        let group = self
            .groups
            .entry(registration.broker_name)
            .or_insert_with(|| BrokerGroup {
                cluster_name: registration.cluster_name.clone(),
                instances: BTreeMap::new(),
            });
        // A broker name belongs to one cluster; the latest registration says which.
        group.cluster_name = registration.cluster_name;
        let new_topic_count = registration.topics.len();
        let instance = BrokerInstance {
            address: registration.broker_address,
            ha_server_address: registration.ha_server_address,
            topics: registration.topics,
            last_registered_at: now,
            connection,
        };
        let previous = group.instances.insert(registration.broker_id, instance);
        let is_topic_config_changed = match &previous {
            Some(previous) => previous.topics != group.instances[&registration.broker_id].topics,
            None => true,
        };
        let master = (registration.broker_id != MASTER_BROKER_ID)
            .then(|| group.instances.get(&MASTER_BROKER_ID))
            .flatten();
        let outcome = RegisterOutcome {
            is_new_instance: previous.is_none(),
            is_topic_config_changed,
            replaced,
            master_address: master.map(|master| master.address.clone()),
            master_ha_server_address: master.and_then(|master| master.ha_server_address.clone()),
        };
        match previous {
            Some(previous) => self.topic_entries -= previous.topics.len(),
            None => self.broker_instances += 1,
        }
        self.topic_entries += new_topic_count;
        outcome
    }

    fn remove_instance(&mut self, broker_name: &str, broker_id: i64) -> Option<BrokerIdentity> {
        let group = self.groups.get_mut(broker_name)?;
        let instance = group.instances.remove(&broker_id)?;
        let identity = BrokerIdentity {
            cluster_name: group.cluster_name.clone(),
            broker_name: broker_name.to_owned(),
            broker_id,
            broker_address: instance.address,
        };
        if group.instances.is_empty() {
            self.groups.remove(broker_name);
        }
        self.broker_instances -= 1;
        self.topic_entries -= instance.topics.len();
        Some(identity)
    }

    /// The running counts match the table (debug builds only: it walks everything).
    fn debug_check_counts(&self) {
        if cfg!(debug_assertions) {
            let instances = self.groups.values().map(|group| group.instances.len());
            let topics = self
                .groups
                .values()
                .flat_map(|group| group.instances.values())
                .map(|instance| instance.topics.len());
            debug_assert_eq!(self.broker_instances, instances.sum::<usize>());
            debug_assert_eq!(self.topic_entries, topics.sum::<usize>());
            debug_assert!(self
                .groups
                .values()
                .all(|group| !group.instances.is_empty()));
            debug_assert!(self.broker_instances <= self.limits.max_broker_instances);
        }
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> RegistryError {
    RegistryError::InvalidArgument {
        field,
        reason: reason.into(),
    }
}

/// Cluster and broker names: 1 to [`MAX_BROKER_NAME_BYTES`] of `[a-zA-Z0-9_.-]`.
fn validate_broker_name(field: &'static str, name: &str) -> Result<(), RegistryError> {
    if name.is_empty() {
        return Err(invalid(field, "missing or empty"));
    }
    if name.len() > MAX_BROKER_NAME_BYTES {
        return Err(invalid(
            field,
            format!("{} bytes, over {MAX_BROKER_NAME_BYTES}", name.len()),
        ));
    }
    if !name
        .bytes()
        .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-' | b'.'))
    {
        return Err(invalid(
            field,
            format!("{name:?} has characters outside [a-zA-Z0-9_.-]"),
        ));
    }
    Ok(())
}

fn validate_broker_id(broker_id: i64) -> Result<(), RegistryError> {
    if broker_id < MASTER_BROKER_ID {
        return Err(invalid(
            "broker_id",
            format!("{broker_id} is negative (0 is a master, above 0 a slave)"),
        ));
    }
    Ok(())
}

/// `host:port` with a non-empty host and a port in 1..=65535.
fn validate_address(field: &'static str, address: &str) -> Result<(), RegistryError> {
    if address.len() > MAX_BROKER_ADDRESS_BYTES {
        return Err(invalid(
            field,
            format!("{} bytes, over {MAX_BROKER_ADDRESS_BYTES}", address.len()),
        ));
    }
    let is_valid = address.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty()
            && !host.chars().any(char::is_whitespace)
            && port.parse::<u16>().is_ok_and(|port| port != 0)
    });
    if !is_valid {
        return Err(invalid(field, format!("{address:?} is not host:port")));
    }
    Ok(())
}

/// RocketMQ's topic rule: 1 to [`MAX_TOPIC_NAME_BYTES`] of `[%|a-zA-Z0-9_-]`.
pub fn validate_topic_name(name: &str) -> Result<(), RegistryError> {
    if name.is_empty() {
        return Err(invalid("topics.name", "missing or empty"));
    }
    if name.len() > MAX_TOPIC_NAME_BYTES {
        return Err(invalid(
            "topics.name",
            format!("{} bytes, over {MAX_TOPIC_NAME_BYTES}", name.len()),
        ));
    }
    if !name
        .bytes()
        .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'%' | b'|' | b'_' | b'-'))
    {
        return Err(invalid(
            "topics.name",
            format!("{name:?} has characters outside [%|a-zA-Z0-9_-]"),
        ));
    }
    Ok(())
}

fn validate_topic_queues(name: &str, queues: &TopicQueues) -> Result<(), RegistryError> {
    for (field, count) in [
        ("topics.read_queues", queues.read_queues),
        ("topics.write_queues", queues.write_queues),
    ] {
        if count > MAX_QUEUES_PER_TOPIC {
            return Err(invalid(
                field,
                format!("topic {name}: {count}, over {MAX_QUEUES_PER_TOPIC}"),
            ));
        }
    }
    if queues.perm & !ALL_PERMISSION_BITS != 0 {
        return Err(invalid(
            "topics.perm",
            format!(
                "topic {name}: {:#x} has bits outside read 4, write 2, inherit 1",
                queues.perm
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(120);

    fn registration(
        broker_name: &str,
        broker_id: i64,
        address: &str,
        topics: &[(&str, TopicQueues)],
    ) -> BrokerRegistration {
        BrokerRegistration {
            cluster_name: "DefaultCluster".to_owned(),
            broker_name: broker_name.to_owned(),
            broker_id,
            broker_address: address.to_owned(),
            ha_server_address: None,
            topics: topics
                .iter()
                .map(|(name, queues)| ((*name).to_owned(), *queues))
                .collect(),
            topic_config_version: 1,
            state_version: 0,
        }
    }

    fn queues(read_queues: u32, write_queues: u32) -> TopicQueues {
        TopicQueues::read_write(read_queues, write_queues)
    }

    fn addresses(route: &TopicRoute, broker_name: &str) -> Vec<(i64, String)> {
        route
            .brokers
            .iter()
            .find(|broker| broker.broker_name == broker_name)
            .expect("broker in route")
            .addresses
            .iter()
            .map(|address| (address.broker_id, address.address.clone()))
            .collect()
    }

    #[test]
    fn a_deleted_topic_loses_its_route_until_a_broker_registers_it_again() {
        let mut table = RouteTable::default();
        let now = Instant::now();
        let topics = [("orders", queues(4, 4)), ("audit", queues(1, 1))];
        let broker_a = registration("broker-a", 0, "10.0.0.1:10911", &topics);
        let mut broker_b = registration("broker-b", 0, "10.0.0.2:10911", &topics);
        broker_b.cluster_name = "OtherCluster".to_owned();
        table.register(broker_a.clone(), now).expect("registers");
        table.register(broker_b, now).expect("registers");

        assert_eq!(table.delete_topic("orders", Some("DefaultCluster")), 1);
        let route = table
            .route("orders")
            .expect("the other cluster still routes it");
        assert_eq!(route.brokers.len(), 1);
        assert_eq!(route.brokers[0].broker_name, "broker-b");
        assert_eq!(table.delete_topic("orders", None), 1);
        assert!(table.route("orders").is_none());
        assert!(table.route("audit").is_some());
        assert_eq!(table.delete_topic("orders", None), 0, "already gone");

        // A broker that still hosts it brings it back with its next registration.
        table.register(broker_a, now).expect("registers");
        assert!(table.route("orders").is_some());
    }

    #[test]
    fn registered_topic_has_route() {
        let mut table = RouteTable::default();
        let now = Instant::now();
        let outcome = table
            .register(
                registration("broker-a", 0, "10.0.0.1:10911", &[("orders", queues(8, 4))]),
                now,
            )
            .unwrap();
        assert!(outcome.is_new_instance);
        assert!(outcome.is_topic_config_changed);
        assert_eq!(outcome.master_address, None);

        let route = table.route("orders").expect("route");
        assert_eq!(route.topic, "orders");
        assert_eq!(route.brokers.len(), 1);
        assert_eq!(route.brokers[0].cluster_name, "DefaultCluster");
        assert_eq!(
            addresses(&route, "broker-a"),
            [(0, "10.0.0.1:10911".to_owned())]
        );
        assert_eq!(
            route.queues,
            [RouteQueues {
                broker_name: "broker-a".to_owned(),
                read_queues: 8,
                write_queues: 4,
                perm: 6,
            }]
        );
        assert_eq!(table.route("payments"), None);
        assert_eq!(table.topic_names(None), ["orders"]);
    }

    #[test]
    fn heartbeat_with_same_topics_is_not_a_change() {
        let mut table = RouteTable::default();
        let now = Instant::now();
        let first = registration("broker-a", 0, "10.0.0.1:10911", &[("orders", queues(8, 8))]);
        table.register(first.clone(), now).unwrap();
        let outcome = table
            .register(first, now + Duration::from_secs(30))
            .unwrap();
        assert!(!outcome.is_new_instance);
        assert!(!outcome.is_topic_config_changed);
        assert_eq!(table.broker_instances(), 1);
    }

    #[test]
    fn re_registration_replaces_topics() {
        let mut table = RouteTable::default();
        let now = Instant::now();
        table
            .register(
                registration(
                    "broker-a",
                    0,
                    "10.0.0.1:10911",
                    &[("orders", queues(8, 8)), ("payments", queues(4, 4))],
                ),
                now,
            )
            .unwrap();
        let outcome = table
            .register(
                registration(
                    "broker-a",
                    0,
                    "10.0.0.1:10911",
                    &[("orders", queues(16, 16)), ("refunds", queues(2, 2))],
                ),
                now,
            )
            .unwrap();
        assert!(!outcome.is_new_instance);
        assert!(outcome.is_topic_config_changed);
        assert_eq!(table.route("orders").unwrap().queues[0].read_queues, 16);
        assert_eq!(
            table.route("payments"),
            None,
            "dropped topic keeps no route"
        );
        assert!(table.route("refunds").is_some());
        assert_eq!(table.topic_names(None), ["orders", "refunds"]);
    }

    #[test]
    fn route_merges_broker_names_and_instances() {
        let mut table = RouteTable::default();
        let now = Instant::now();
        table
            .register(
                registration("broker-b", 0, "10.0.0.2:10911", &[("orders", queues(4, 4))]),
                now,
            )
            .unwrap();
        table
            .register(
                registration("broker-a", 0, "10.0.0.1:10911", &[("orders", queues(8, 8))]),
                now,
            )
            .unwrap();
        let slave = table
            .register(
                registration("broker-a", 1, "10.0.0.3:10911", &[("orders", queues(8, 8))]),
                now,
            )
            .unwrap();
        assert_eq!(slave.master_address.as_deref(), Some("10.0.0.1:10911"));
        table
            .register(
                registration("broker-c", 0, "10.0.0.4:10911", &[("other", queues(1, 1))]),
                now,
            )
            .unwrap();

        let route = table.route("orders").unwrap();
        let names: Vec<_> = route
            .brokers
            .iter()
            .map(|b| b.broker_name.as_str())
            .collect();
        assert_eq!(names, ["broker-a", "broker-b"], "sorted, broker-c absent");
        assert_eq!(
            addresses(&route, "broker-a"),
            [
                (0, "10.0.0.1:10911".to_owned()),
                (1, "10.0.0.3:10911".to_owned())
            ]
        );
        let queue_counts: Vec<_> = route
            .queues
            .iter()
            .map(|q| {
                (
                    q.broker_name.as_str(),
                    q.read_queues,
                    q.write_queues,
                    q.perm,
                )
            })
            .collect();
        assert_eq!(queue_counts, [("broker-a", 8, 8, 6), ("broker-b", 4, 4, 6)]);
    }

    #[test]
    fn an_instance_leaves_when_the_connection_it_registered_on_closes() {
        let mut table = RouteTable::default();
        let now = Instant::now();
        let master = registration("broker-a", 0, "10.0.0.1:10911", &[("orders", queues(4, 4))]);
        let slave = registration("broker-a", 1, "10.0.0.2:10911", &[("orders", queues(4, 4))]);
        table.register_on(master.clone(), now, Some(7)).unwrap();
        table.register_on(slave, now, Some(8)).unwrap();
        // Another connection's end, or another instance's, changes nothing.
        assert_eq!(table.connection_closed("broker-a", 0, 8), None);
        assert_eq!(table.connection_closed("broker-b", 0, 7), None);
        assert_eq!(table.broker_instances(), 2);
        let dropped = table.connection_closed("broker-a", 0, 7).unwrap();
        assert_eq!(dropped.broker_address, "10.0.0.1:10911");
        // The slave serves reads alone.
        assert_eq!(
            addresses(&table.route("orders").unwrap(), "broker-a"),
            [(1, "10.0.0.2:10911".to_owned())]
        );
        // An instance that registered since on another connection stays when the old one ends.
        table.register_on(master.clone(), now, Some(9)).unwrap();
        table.register_on(master, now, Some(10)).unwrap();
        assert_eq!(table.connection_closed("broker-a", 0, 9), None);
        assert_eq!(table.broker_instances(), 2);
    }

    #[test]
    fn a_master_registration_below_the_newest_state_version_is_refused() {
        let mut table = RouteTable::default();
        let now = Instant::now();
        let old_master = BrokerRegistration {
            state_version: 3,
            ..registration("broker-a", 0, "10.0.0.1:10911", &[("orders", queues(4, 4))])
        };
        let new_master = BrokerRegistration {
            state_version: 4,
            ..registration("broker-a", 0, "10.0.0.2:10911", &[("orders", queues(4, 4))])
        };
        table.register(old_master.clone(), now).unwrap();
        table.register(new_master.clone(), now).unwrap();
        let refused = table.register(old_master.clone(), now).unwrap_err();
        assert!(
            matches!(
                refused,
                RegistryError::StaleMaster {
                    state_version: 3,
                    current: 4,
                    ..
                }
            ),
            "{refused:?}"
        );
        assert_eq!(
            addresses(&table.route("orders").unwrap(), "broker-a"),
            [(0, "10.0.0.2:10911".to_owned())]
        );
        // Even once the new master has gone, the old one cannot come back under version 3; it
        // may register as a slave (the role it restarts in).
        table.unregister("broker-a", 0, "10.0.0.2:10911").unwrap();
        assert!(table.register(old_master.clone(), now).is_err());
        let as_slave = BrokerRegistration {
            broker_id: 2,
            ..old_master
        };
        table.register(as_slave, now).unwrap();
        table.register(new_master, now).unwrap();
    }

    #[test]
    fn slave_without_master_serves_reads_only() {
        let mut table = RouteTable::default();
        let now = Instant::now();
        table
            .register(
                registration("broker-a", 0, "10.0.0.1:10911", &[("orders", queues(8, 8))]),
                now,
            )
            .unwrap();
        table
            .register(
                registration("broker-a", 1, "10.0.0.3:10911", &[("orders", queues(8, 8))]),
                now,
            )
            .unwrap();
        assert!(table.unregister("broker-a", 0, "10.0.0.1:10911").is_some());
        let route = table.route("orders").unwrap();
        assert_eq!(
            addresses(&route, "broker-a"),
            [(1, "10.0.0.3:10911".to_owned())]
        );
        assert_eq!(route.queues[0].perm, topic_permission::READ);
    }

    #[test]
    fn unregister_removes_only_the_matching_instance() {
        let mut table = RouteTable::default();
        let now = Instant::now();
        table
            .register(
                registration("broker-a", 0, "10.0.0.1:10911", &[("orders", queues(8, 8))]),
                now,
            )
            .unwrap();
        assert_eq!(table.unregister("broker-a", 0, "10.0.0.9:10911"), None);
        assert_eq!(table.unregister("broker-z", 0, "10.0.0.1:10911"), None);
        assert!(table.route("orders").is_some());

        let removed = table.unregister("broker-a", 0, "10.0.0.1:10911").unwrap();
        assert_eq!(removed.cluster_name, "DefaultCluster");
        assert_eq!(table.route("orders"), None);
        assert!(table.topic_names(None).is_empty());
        assert_eq!(table.broker_instances(), 0);
        assert_eq!(table.unregister("broker-a", 0, "10.0.0.1:10911"), None);
    }

    #[test]
    fn silent_brokers_expire() {
        let mut table = RouteTable::default();
        let start = Instant::now();
        table
            .register(
                registration("broker-a", 0, "10.0.0.1:10911", &[("orders", queues(8, 8))]),
                start,
            )
            .unwrap();
        table
            .register(
                registration("broker-b", 0, "10.0.0.2:10911", &[("orders", queues(8, 8))]),
                start,
            )
            .unwrap();
        // broker-b keeps registering; broker-a goes silent.
        table
            .register(
                registration("broker-b", 0, "10.0.0.2:10911", &[("orders", queues(8, 8))]),
                start + Duration::from_secs(100),
            )
            .unwrap();

        assert!(
            table.expire_silent(start + TIMEOUT, TIMEOUT).is_empty(),
            "not yet"
        );
        let expired = table.expire_silent(start + TIMEOUT + Duration::from_millis(1), TIMEOUT);
        assert_eq!(expired.len(), 1);
        assert_eq!(expired[0].broker.broker_name, "broker-a");
        assert!(expired[0].silent_for > TIMEOUT);

        let route = table.route("orders").unwrap();
        assert_eq!(route.brokers.len(), 1);
        assert_eq!(route.brokers[0].broker_name, "broker-b");
    }

    #[test]
    fn address_moving_to_another_name_replaces_the_old_instance() {
        let mut table = RouteTable::default();
        let now = Instant::now();
        table
            .register(
                registration("broker-a", 0, "10.0.0.1:10911", &[("orders", queues(8, 8))]),
                now,
            )
            .unwrap();
        let outcome = table
            .register(
                registration(
                    "broker-b",
                    0,
                    "10.0.0.1:10911",
                    &[("payments", queues(8, 8))],
                ),
                now,
            )
            .unwrap();
        assert_eq!(outcome.replaced.unwrap().broker_name, "broker-a");
        assert_eq!(table.route("orders"), None);
        assert_eq!(table.broker_instances(), 1);
    }

    #[test]
    fn topic_list_filters_by_cluster() {
        let mut table = RouteTable::default();
        let now = Instant::now();
        let mut other = registration("broker-b", 0, "10.0.0.2:10911", &[("b", queues(1, 1))]);
        other.cluster_name = "OtherCluster".to_owned();
        table.register(other, now).unwrap();
        table
            .register(
                registration(
                    "broker-a",
                    0,
                    "10.0.0.1:10911",
                    &[("c", queues(1, 1)), ("a", queues(1, 1))],
                ),
                now,
            )
            .unwrap();
        assert_eq!(table.topic_names(None), ["a", "b", "c"]);
        assert_eq!(table.topic_names(Some("DefaultCluster")), ["a", "c"]);
        assert_eq!(table.topic_names(Some("OtherCluster")), ["b"]);
        assert!(table.topic_names(Some("Nowhere")).is_empty());
        let clusters: Vec<_> = table
            .clusters()
            .into_iter()
            .map(|cluster| (cluster.cluster_name, cluster.brokers.len()))
            .collect();
        assert_eq!(
            clusters,
            [
                ("DefaultCluster".to_owned(), 1),
                ("OtherCluster".to_owned(), 1)
            ]
        );
    }

    #[test]
    fn invalid_registrations_are_refused_without_effect() {
        let mut table = RouteTable::default();
        let now = Instant::now();
        let valid = registration("broker-a", 0, "10.0.0.1:10911", &[("orders", queues(8, 8))]);
        let cases: Vec<(&str, BrokerRegistration)> = vec![
            (
                "broker_name",
                BrokerRegistration {
                    broker_name: String::new(),
                    ..valid.clone()
                },
            ),
            (
                "cluster_name",
                BrokerRegistration {
                    cluster_name: "a b".to_owned(),
                    ..valid.clone()
                },
            ),
            (
                "broker_id",
                BrokerRegistration {
                    broker_id: -1,
                    ..valid.clone()
                },
            ),
            (
                "broker_address",
                BrokerRegistration {
                    broker_address: "10.0.0.1".to_owned(),
                    ..valid.clone()
                },
            ),
            (
                "broker_address",
                BrokerRegistration {
                    broker_address: "10.0.0.1:0".to_owned(),
                    ..valid.clone()
                },
            ),
            (
                "topics.name",
                registration(
                    "broker-a",
                    0,
                    "10.0.0.1:10911",
                    &[("bad topic", queues(1, 1))],
                ),
            ),
            (
                "topics.name",
                registration(
                    "broker-a",
                    0,
                    "10.0.0.1:10911",
                    &[(&"t".repeat(128), queues(1, 1))],
                ),
            ),
            (
                "topics.read_queues",
                registration(
                    "broker-a",
                    0,
                    "10.0.0.1:10911",
                    &[("orders", queues(MAX_QUEUES_PER_TOPIC + 1, 1))],
                ),
            ),
            (
                "topics.perm",
                registration(
                    "broker-a",
                    0,
                    "10.0.0.1:10911",
                    &[(
                        "orders",
                        TopicQueues {
                            perm: 8,
                            ..queues(1, 1)
                        },
                    )],
                ),
            ),
        ];
        for (field, case) in cases {
            match table.register(case, now) {
                Err(RegistryError::InvalidArgument { field: actual, .. }) => {
                    assert_eq!(actual, field);
                }
                other => panic!("{field}: expected InvalidArgument, got {other:?}"),
            }
        }
        assert_eq!(table.broker_instances(), 0);
        table.register(valid, now).unwrap();
    }

    #[test]
    fn limits_hold() {
        let limits = RegistryLimits {
            max_broker_instances: 2,
            max_topics_per_broker: 2,
            max_topic_entries: 3,
        };
        let mut table = RouteTable::new(limits);
        let now = Instant::now();
        let two = [("a", queues(1, 1)), ("b", queues(1, 1))];
        let three = [
            ("a", queues(1, 1)),
            ("b", queues(1, 1)),
            ("c", queues(1, 1)),
        ];
        assert!(matches!(
            table.register(registration("broker-a", 0, "h:1", &three), now),
            Err(RegistryError::InvalidArgument {
                field: "topics",
                ..
            })
        ));
        table
            .register(registration("broker-a", 0, "h:1", &two), now)
            .unwrap();
        assert!(matches!(
            table.register(registration("broker-b", 0, "h:2", &two), now),
            Err(RegistryError::TooManyTopicEntries { .. })
        ));
        table
            .register(registration("broker-b", 0, "h:2", &two[..1]), now)
            .unwrap();
        assert!(matches!(
            table.register(registration("broker-c", 0, "h:3", &[]), now),
            Err(RegistryError::TooManyBrokers { .. })
        ));
        // Re-registering an existing instance is not a new one, and its old topics are freed.
        table
            .register(registration("broker-a", 0, "h:1", &two), now)
            .unwrap();
        // An address moving to a new name frees the old instance first.
        table
            .register(registration("broker-c", 0, "h:2", &two[..1]), now)
            .unwrap();
        assert_eq!(table.broker_instances(), 2);
    }
}
