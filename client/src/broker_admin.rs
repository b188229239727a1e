//! Operator queries of one broker: its runtime status and the consumer groups it knows, and
//! resetting a group's offsets by time. Used by `shardmq broker status`, `group list` and
//! `group reset-offset`.

use std::time::Duration;

use shardmq_schema::wire;

use crate::admin::Admin;
use crate::api::{missing_body, require_ok};
use crate::error::{Error, Result};
use crate::partial::{FanOut, Partial};
use crate::pool::ConnectionPool;
use crate::route::MessageQueue;

/// A broker's runtime status (`BrokerStatusResponse`). Totals count since the broker started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BrokerStatus {
    pub address: String,
    pub cluster_name: String,
    pub broker_name: String,
    pub version: String,
    pub uptime_ms: u64,
    pub storage_shards: u32,
    pub network_shards: u32,
    pub placement: String,
    pub flush: String,
    pub messages_in: u64,
    pub bytes_in: u64,
    pub messages_out: u64,
    pub bytes_out: u64,
    pub connections: u64,
    pub parked_pulls: u64,
    pub topics: u32,
    pub commitlog_bytes: u64,
    pub disk_total_bytes: u64,
    pub disk_free_bytes: u64,
    /// `async-master`, `sync-master` or `slave`.
    pub role: String,
    /// A master's replication lag in CommitLog bytes; `None` when no slave replicates from it.
    pub replica_lag_bytes: Option<u64>,
    /// Replication per storage shard, in shard order.
    pub replication: Vec<ReplicationShardStatus>,
    /// The send latency histogram since the broker started: bucket upper bounds in µs,
    /// ascending (empty from a broker that predates it).
    pub send_latency_bounds_us: Vec<u64>,
    /// Sends per bucket since the start (not cumulative over the buckets), one more entry than
    /// the bounds: the last counts sends slower than every bound.
    pub send_latency_counts: Vec<u64>,
}

/// A live member of a consumer group, with the queues it says it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerMember {
    pub client_id: String,
    /// The queues it consumes for the group, as of its last heartbeat; `None` when it does not
    /// report them (older clients, pull consumers, RocketMQ clients).
    pub held_queues: Option<Vec<MessageQueue>>,
}

/// One storage shard's replication as its broker sees it (docs/replication.md).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicationShardStatus {
    pub storage_shard: u32,
    /// A master: its slave's client address; a slave: its master's HA address.
    pub peer: String,
    /// The master term this shard writes (master) or copies (slave).
    pub epoch: u64,
    /// Bytes the peer lacks; `None` when unknown (no peer since the start).
    pub lag_bytes: Option<u64>,
    /// Age of the oldest byte the peer lacks, in ms (0 in sync); `None` when unknown.
    pub lag_ms: Option<u64>,
    /// Whether the peer was heard from in the last 3 s.
    pub connected: bool,
}

/// A consumer group as one broker knows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupSummary {
    pub group: String,
    /// Live members (clients heartbeating with the group).
    pub members: u32,
    /// Topics subscribed to or with committed offsets, sorted.
    pub topics: Vec<String>,
    /// Messages stored and not yet committed, over the queues with committed offsets.
    pub lag: u64,
}

/// Where `reset_offset` moves a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetTarget {
    /// The oldest stored message of each queue.
    First,
    /// Each queue's end: nothing stored so far is consumed.
    Last,
    /// The first message stored at or after this time (ms since the epoch).
    Timestamp(i64),
}

/// One queue's offset change made by `reset_offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetReset {
    pub queue: MessageQueue,
    /// The committed offset before, if there was one.
    pub previous: Option<i64>,
    pub offset: i64,
}

impl ConnectionPool {
    pub(crate) async fn broker_status(
        &self,
        address: &str,
        timeout: Duration,
    ) -> Result<BrokerStatus> {
        let frame = self
            .request(address, "broker status", timeout, |builder| {
                let request =
                    wire::BrokerStatusRequest::create(builder, &wire::BrokerStatusRequestArgs {});
                (wire::Body::BrokerStatusRequest, request.as_union_value())
            })
            .await?;
        let frame = require_ok(address, frame)?;
        let r = frame
            .frame()
            .body_as_broker_status_response()
            .ok_or_else(|| missing_body(address, "BrokerStatusResponse"))?;
        let text = |s: Option<&str>| s.unwrap_or_default().to_owned();
        Ok(BrokerStatus {
            address: address.to_owned(),
            cluster_name: text(r.cluster_name()),
            broker_name: text(r.broker_name()),
            version: text(r.version()),
            uptime_ms: r.uptime_ms(),
            storage_shards: r.storage_shards(),
            network_shards: r.network_shards(),
            placement: text(r.placement()),
            flush: text(r.flush()),
            messages_in: r.messages_in(),
            bytes_in: r.bytes_in(),
            messages_out: r.messages_out(),
            bytes_out: r.bytes_out(),
            connections: r.connections(),
            parked_pulls: r.parked_pulls(),
            topics: r.topics(),
            commitlog_bytes: r.commitlog_bytes(),
            disk_total_bytes: r.disk_total_bytes(),
            disk_free_bytes: r.disk_free_bytes(),
            role: text(r.role()),
            replica_lag_bytes: u64::try_from(r.replica_lag_bytes()).ok(),
            replication: r
                .replication()
                .iter()
                .flat_map(|v| v.iter())
                .map(|s| ReplicationShardStatus {
                    storage_shard: s.storage_shard(),
                    peer: text(s.peer()),
                    epoch: s.epoch(),
                    lag_bytes: u64::try_from(s.lag_bytes()).ok(),
                    lag_ms: u64::try_from(s.lag_ms()).ok(),
                    connected: s.connected(),
                })
                .collect(),
            send_latency_bounds_us: r
                .send_latency_bounds_us()
                .iter()
                .flat_map(|v| v.iter())
                .collect(),
            send_latency_counts: r
                .send_latency_counts()
                .iter()
                .flat_map(|v| v.iter())
                .collect(),
        })
    }

    /// A consumer group's live members at this broker, sorted by client id, with the queues
    /// each reported holding (`None` for all from a broker that predates the report).
    pub(crate) async fn consumer_members(
        &self,
        address: &str,
        timeout: Duration,
        group: &str,
    ) -> Result<Vec<ConsumerMember>> {
        let frame = self.consumer_list_answer(address, timeout, group).await?;
        let response = frame
            .frame()
            .body_as_consumer_list_response()
            .ok_or_else(|| missing_body(address, "ConsumerListResponse"))?;
        let mut members: Vec<ConsumerMember> = match response.members() {
            Some(members) => members
                .iter()
                .map(|member| ConsumerMember {
                    client_id: member.client_id().unwrap_or_default().to_owned(),
                    held_queues: member.held_queues().map(|queues| {
                        let mut queues: Vec<MessageQueue> = queues
                            .iter()
                            .map(|queue| {
                                MessageQueue::new(
                                    queue.topic().unwrap_or_default(),
                                    queue.broker_name().unwrap_or_default(),
                                    queue.queue_id(),
                                )
                            })
                            .collect();
                        queues.sort();
                        queues
                    }),
                })
                .collect(),
            None => response
                .client_ids()
                .iter()
                .flat_map(|ids| ids.iter())
                .map(|id| ConsumerMember {
                    client_id: id.to_owned(),
                    held_queues: None,
                })
                .collect(),
        };
        members.sort_by(|a, b| a.client_id.cmp(&b.client_id));
        Ok(members)
    }

    pub(crate) async fn group_list(
        &self,
        address: &str,
        timeout: Duration,
    ) -> Result<Vec<GroupSummary>> {
        let frame = self
            .request(address, "group list", timeout, |builder| {
                let request =
                    wire::GroupListRequest::create(builder, &wire::GroupListRequestArgs {});
                (wire::Body::GroupListRequest, request.as_union_value())
            })
            .await?;
        let frame = require_ok(address, frame)?;
        let r = frame
            .frame()
            .body_as_group_list_response()
            .ok_or_else(|| missing_body(address, "GroupListResponse"))?;
        Ok(r.groups()
            .iter()
            .flat_map(|v| v.iter())
            .map(|g| GroupSummary {
                group: g.group().unwrap_or_default().to_owned(),
                members: g.members(),
                topics: g
                    .topics()
                    .iter()
                    .flat_map(|v| v.iter())
                    .map(str::to_owned)
                    .collect(),
                lag: g.lag(),
            })
            .collect())
    }
}

impl Admin {
    /// `group`'s live members with the queues each reported holding, as a broker of `topic`
    /// knows them (the one `consumer_list` asks).
    pub async fn consumer_members(&self, group: &str, topic: &str) -> Result<Vec<ConsumerMember>> {
        crate::message::check_group_name(group)?;
        let address = self.group_broker(topic).await?;
        self.pool()
            .consumer_members(&address, self.timeout(), group)
            .await
    }

    /// The runtime status of the broker at `broker_address`.
    pub async fn broker_status(&self, broker_address: &str) -> Result<BrokerStatus> {
        crate::instance::check_address(broker_address)
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        self.pool()
            .broker_status(broker_address, self.timeout())
            .await
    }

    /// The consumer groups every master broker the name servers know reports, merged by name
    /// (members and lag summed, topics united), sorted; brokers that fail are listed.
    pub async fn group_list(&self) -> Result<Partial<Vec<GroupSummary>>> {
        let addresses: std::collections::BTreeSet<String> = self
            .cluster_info()
            .await?
            .iter()
            .flat_map(crate::route::ClusterInfo::master_addresses)
            .map(str::to_owned)
            .collect();
        let mut fan = FanOut::new(std::collections::BTreeMap::<String, GroupSummary>::new());
        for address in addresses {
            let answer = self.pool().group_list(&address, self.timeout()).await;
            fan.add(&address, answer, |merged, groups| {
                for group in groups {
                    let entry = merged
                        .entry(group.group.clone())
                        .or_insert_with(|| GroupSummary {
                            group: group.group.clone(),
                            ..GroupSummary::default()
                        });
                    entry.members += group.members;
                    entry.lag += group.lag;
                    entry.topics.extend(group.topics);
                    entry.topics.sort();
                    entry.topics.dedup();
                }
            });
        }
        let merged = fan.finish()?;
        Ok(Partial {
            value: merged.value.into_values().collect(),
            failures: merged.failures,
        })
    }

    /// Moves `group`'s committed offsets of every queue of `topic` to `target`. Refused unless
    /// `is_forced` while the group has live members (a running consumer keeps its own position
    /// and would commit over the reset: stop the consumers first) and when the group has no
    /// committed offset on the topic (the reset would create it).
    pub async fn reset_offset(
        &self,
        group: &str,
        topic: &str,
        target: ResetTarget,
        is_forced: bool,
    ) -> Result<Vec<OffsetReset>> {
        crate::message::check_group_name(group)?;
        if !is_forced {
            let members = self.consumer_list(group, topic).await?;
            if !members.is_empty() {
                return Err(Error::InvalidArgument(format!(
                    "group {group} has {} live member(s) ({}); stop its consumers first, or force the reset knowing they may commit over it",
                    members.len(),
                    members.join(", ")
                )));
            }
        }
        let route = self.route(topic).await?;
        let pool = self.pool();
        let mut resets = Vec::new();
        for queue in route.read_queues() {
            let Some(master) = route.master_address(&queue.broker_name) else {
                continue;
            };
            let (min, max) = pool
                .queue_offsets(master, self.timeout(), topic, queue.queue_id)
                .await?;
            let offset = match target {
                ResetTarget::First => min,
                ResetTarget::Last => max,
                ResetTarget::Timestamp(ms) => {
                    pool.offset_by_time(master, self.timeout(), topic, queue.queue_id, ms)
                        .await?
                }
            };
            let previous = pool
                .query_consumer_offset(master, self.timeout(), group, topic, queue.queue_id)
                .await?;
            resets.push(OffsetReset {
                queue,
                previous,
                offset,
            });
        }
        // A misspelt group would be created by the reset: only an existing one is reset
        // unless forced (forcing is how a new group is placed before its consumers start).
        if !is_forced && resets.iter().all(|reset| reset.previous.is_none()) {
            return Err(Error::InvalidArgument(format!(
                "group {group} has no committed offset on any queue of {topic}: a reset would create it; check the name, or force it to place a new group"
            )));
        }
        for reset in &resets {
            let Some(master) = route.master_address(&reset.queue.broker_name) else {
                continue;
            };
            pool.commit_consumer_offset(
                master,
                self.timeout(),
                group,
                topic,
                reset.queue.queue_id,
                reset.offset,
            )
            .await?;
        }
        Ok(resets)
    }
}

/// The broker address an offset id names (RocketMQ's layout, IPv4: 8 hex digits of address,
/// 8 of port, 16 of offset), or `None` when `id` is not one.
fn offset_id_address(id: &str) -> Option<String> {
    if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let ip = u32::from_str_radix(&id[0..8], 16).ok()?;
    let port = u32::from_str_radix(&id[8..16], 16).ok()?;
    let port = u16::try_from(port).ok().filter(|&p| p != 0)?;
    Some(std::net::SocketAddr::from((std::net::Ipv4Addr::from(ip), port)).to_string())
}

impl ConnectionPool {
    pub(crate) async fn query_by_offset_id(
        &self,
        address: &str,
        timeout: Duration,
        offset_id: &str,
    ) -> Result<Vec<crate::message::MessageExt>> {
        let frame = self
            .request(address, "query by offset id", timeout, |builder| {
                let offset_id = builder.create_string(offset_id);
                let request = wire::QueryByIdRequest::create(
                    builder,
                    &wire::QueryByIdRequestArgs {
                        unique_id: None,
                        offset_msg_id: Some(offset_id),
                        begin_ms: 0,
                        end_ms: 0,
                    },
                );
                (wire::Body::QueryByIdRequest, request.as_union_value())
            })
            .await?;
        self.query_answer(address, frame)
    }
}

impl Admin {
    /// Every stored message with id `id`, whatever its topic: by offset id from the broker the
    /// id names, else by unique id from every master broker the name servers know (a unique id
    /// also finds the message's retry, schedule and dead-letter copies), stored within
    /// `[begin_ms, end_ms]` (0 = now).
    pub async fn query_by_any_id(
        &self,
        id: &str,
        begin_ms: i64,
        end_ms: i64,
    ) -> Result<Partial<Vec<crate::message::MessageExt>>> {
        let clusters = self.cluster_info().await?;
        let broker_names: std::collections::BTreeMap<&str, &str> = clusters
            .iter()
            .flat_map(|cluster| &cluster.brokers)
            .flat_map(|broker| {
                broker
                    .addresses
                    .values()
                    .map(|address| (address.as_str(), broker.broker_name.as_str()))
            })
            .collect();
        let name_of = |address: &str| {
            broker_names
                .get(address)
                .map_or_else(|| address.to_owned(), |name| (*name).to_owned())
        };
        if let Some(address) = offset_id_address(id) {
            let mut found = self
                .pool()
                .query_by_offset_id(&address, self.timeout(), id)
                .await
                .unwrap_or_default();
            if !found.is_empty() {
                for message in &mut found {
                    message.set_broker_name(&name_of(&address));
                }
                return Ok(Partial {
                    value: found,
                    failures: Vec::new(),
                });
            }
        }
        let masters: std::collections::BTreeSet<&str> = clusters
            .iter()
            .flat_map(crate::route::ClusterInfo::master_addresses)
            .collect();
        let mut fan = FanOut::new(Vec::new());
        for address in masters {
            let answer = self
                .pool()
                .query_by_unique_id(address, self.timeout(), id, begin_ms, end_ms)
                .await;
            fan.add(address, answer, |found, mut messages| {
                for message in &mut messages {
                    message.set_broker_name(&name_of(address));
                }
                found.extend(messages);
            });
        }
        fan.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::offset_id_address;

    #[test]
    fn offset_ids_name_their_broker() {
        // 127.0.0.1:10911, physical offset 0x1234.
        assert_eq!(
            offset_id_address("7F00000100002A9F0000000000001234").as_deref(),
            Some("127.0.0.1:10911")
        );
        assert_eq!(offset_id_address("C0A8000100002A9F"), None);
        assert_eq!(
            offset_id_address("A1B2C3D4E5F60718293A4B5C6D7E8F90").as_deref(),
            None
        );
    }
}

/// One broker group as a controller has it (docs/replication.md, "Automatic failover").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ControllerGroup {
    pub cluster_name: String,
    pub broker_name: String,
    /// 0 while none is elected.
    pub master_id: i64,
    pub master_address: String,
    pub master_ha_address: String,
    pub epoch: u64,
    pub sync_state_set: Vec<i64>,
    /// Bumped by every change of the SyncStateSet.
    pub sync_state_epoch: u64,
    /// Every registered broker id and its client address.
    pub replicas: Vec<(i64, String)>,
    /// Ids heard from within the broker timeout (the leader's view; empty on a follower).
    pub alive: Vec<i64>,
}

/// What one controller answers to `controller status`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ControllerStatus {
    pub address: String,
    pub node_id: u64,
    /// 0: no leader known.
    pub leader_id: u64,
    /// `id=address` of every voter.
    pub members: Vec<String>,
    pub term: u64,
    pub last_applied: u64,
    pub groups: Vec<ControllerGroup>,
    /// The controller node whose view of the brokers' heartbeats the groups' `alive` sets are
    /// (the leader's); 0: no leader could be asked, and `alive` is unknown.
    pub alive_from: u64,
}

impl ControllerGroup {
    fn from_wire(g: &wire::ControllerGroup<'_>) -> ControllerGroup {
        let text = |s: Option<&str>| s.unwrap_or_default().to_owned();
        ControllerGroup {
            cluster_name: text(g.cluster_name()),
            broker_name: text(g.broker_name()),
            master_id: g.master_id(),
            master_address: text(g.master_address()),
            master_ha_address: text(g.master_ha_address()),
            epoch: g.epoch(),
            sync_state_set: g.sync_state_set().iter().flat_map(|v| v.iter()).collect(),
            sync_state_epoch: g.sync_state_epoch(),
            replicas: g
                .replica_ids()
                .iter()
                .flat_map(|v| v.iter())
                .zip(
                    g.replica_addresses()
                        .iter()
                        .flat_map(|v| v.iter())
                        .map(str::to_owned),
                )
                .collect(),
            alive: g.alive().iter().flat_map(|v| v.iter()).collect(),
        }
    }
}

impl ConnectionPool {
    pub(crate) async fn controller_status(
        &self,
        address: &str,
        timeout: Duration,
    ) -> Result<ControllerStatus> {
        let frame = self
            .request(address, "controller status", timeout, |builder| {
                let request = wire::ControllerStatusRequest::create(
                    builder,
                    &wire::ControllerStatusRequestArgs {},
                );
                (
                    wire::Body::ControllerStatusRequest,
                    request.as_union_value(),
                )
            })
            .await?;
        let frame = require_ok(address, frame)?;
        let r = frame
            .frame()
            .body_as_controller_status_response()
            .ok_or_else(|| missing_body(address, "ControllerStatusResponse"))?;
        Ok(ControllerStatus {
            address: address.to_owned(),
            node_id: r.node_id(),
            leader_id: r.leader_id(),
            members: r
                .members()
                .iter()
                .flat_map(|v| v.iter())
                .map(str::to_owned)
                .collect(),
            term: r.term(),
            last_applied: r.last_applied(),
            groups: r
                .groups()
                .iter()
                .flat_map(|v| v.iter())
                .map(|g| ControllerGroup::from_wire(&g))
                .collect(),
            alive_from: r.alive_from(),
        })
    }
}

impl ConnectionPool {
    pub(crate) async fn controller_membership(
        &self,
        address: &str,
        timeout: Duration,
        change: &MemberChange,
    ) -> Result<Vec<String>> {
        let frame = self
            .request(address, "controller membership", timeout, |builder| {
                let (node_id, member_address, remove) = match change {
                    MemberChange::Add { id, address } => (*id, address.as_str(), false),
                    MemberChange::Remove { id } => (*id, "", true),
                };
                let member_address = builder.create_string(member_address);
                let request = wire::ControllerMembershipRequest::create(
                    builder,
                    &wire::ControllerMembershipRequestArgs {
                        node_id,
                        address: Some(member_address),
                        remove,
                    },
                );
                (
                    wire::Body::ControllerMembershipRequest,
                    request.as_union_value(),
                )
            })
            .await?;
        let frame = require_ok(address, frame)?;
        let r = frame
            .frame()
            .body_as_controller_membership_response()
            .ok_or_else(|| missing_body(address, "ControllerMembershipResponse"))?;
        Ok(r.members()
            .iter()
            .flat_map(|v| v.iter())
            .map(str::to_owned)
            .collect())
    }
}

/// A change of the controller group's voters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberChange {
    /// Make node `id` at `address` (started with `--controller-join`) a voter.
    Add { id: u64, address: String },
    /// Take voter `id` out of the group.
    Remove { id: u64 },
}

impl Admin {
    /// Changes the controller group's voters through the controller at `address` (any member;
    /// a follower asks the leader). Returns the members after the change (`id=address`,
    /// learners marked).
    pub async fn controller_membership(
        &self,
        address: &str,
        change: &MemberChange,
    ) -> Result<Vec<String>> {
        crate::instance::check_address(address)
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        // Adding waits for the new member to catch up (up to 10 s on the leader).
        let timeout = self.timeout().max(Duration::from_secs(15));
        self.pool()
            .controller_membership(address, timeout, change)
            .await
    }

    /// The status of the controller at `address` (any member answers with its view).
    pub async fn controller_status(&self, address: &str) -> Result<ControllerStatus> {
        crate::instance::check_address(address)
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        self.pool().controller_status(address, self.timeout()).await
    }
}
