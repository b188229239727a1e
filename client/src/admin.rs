//! The admin API: topics (create, update, delete, list, route, status), consumer groups
//! (members, offsets and lag) and message queries.
//!
//! Owns: the operator's view of a cluster through the same requests the CLI uses. Topic
//! changes go to a broker address the caller names, or to every master broker that already
//! hosts the topic (from its route). Never: producing or consuming.

use std::sync::Arc;

use crate::api::{QueueStats, TopicConfig};
use crate::error::{Error, Result};
use crate::instance::{check_address, client_option_setters, ClientInstance, ClientOptions};
use crate::message::{check_group_name, check_topic_name, MessageExt};
use crate::partial::{FanOut, Partial};
use crate::route::{ClusterInfo, MessageQueue, TopicRoute};

/// A consumer group's progress on one queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueProgress {
    pub queue: MessageQueue,
    /// The group's committed offset; `None` when it never committed one.
    pub committed_offset: Option<i64>,
    /// One past the queue's largest visible offset.
    pub max_offset: i64,
}

impl QueueProgress {
    /// Messages not yet consumed by the group (all of them when it never committed).
    #[must_use]
    pub fn lag(&self) -> i64 {
        (self.max_offset - self.committed_offset.unwrap_or(0)).max(0)
    }
}

/// Configures and starts an [`Admin`].
#[derive(Debug, Clone)]
pub struct AdminBuilder {
    options: ClientOptions,
}

impl AdminBuilder {
    client_option_setters!();

    /// Checks the settings and starts the admin client.
    pub async fn build(self) -> Result<Admin> {
        let (instance, _) = ClientInstance::start(self.options, false)?;
        Ok(Admin { instance })
    }
}

/// Administers topics and inspects groups.
///
/// ```no_run
/// # async fn example() -> shardmq_client::Result<()> {
/// use shardmq_client::{Admin, TopicConfig};
/// let admin = Admin::builder().namesrv("127.0.0.1:9876").build().await?;
/// admin.create_topic("127.0.0.1:10911", &TopicConfig::new("orders", 8)).await?;
/// for queue in admin.topic_stats("orders").await? {
///     println!("{}#{}: {}..{}", queue.broker_name, queue.queue_id, queue.min_offset, queue.max_offset);
/// }
/// # Ok(())
/// # }
/// ```
pub struct Admin {
    instance: Arc<ClientInstance>,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Admin")
            .field("client_id", &self.instance.client_id())
            .finish_non_exhaustive()
    }
}

impl Admin {
    #[must_use]
    pub fn builder() -> AdminBuilder {
        AdminBuilder {
            options: ClientOptions::default(),
        }
    }

    pub(crate) fn timeout(&self) -> std::time::Duration {
        self.instance.request_timeout()
    }

    pub(crate) fn pool(&self) -> &crate::pool::ConnectionPool {
        &self.instance.pool
    }

    /// Creates `config`'s topic at the broker at `broker_address`; an error with status
    /// `TOPIC_ALREADY_EXISTS` when it exists there.
    pub async fn create_topic(&self, broker_address: &str, config: &TopicConfig) -> Result<()> {
        config.validate()?;
        check_address(broker_address).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        self.instance
            .pool
            .upsert_topic(broker_address, self.timeout(), config, true)
            .await
    }

    /// Creates the topic at the broker, or updates its queue counts and permission.
    pub async fn update_topic(&self, broker_address: &str, config: &TopicConfig) -> Result<()> {
        config.validate()?;
        check_address(broker_address).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        self.instance
            .pool
            .upsert_topic(broker_address, self.timeout(), config, false)
            .await
    }

    /// Updates the topic at every master broker that hosts it now; returns their addresses.
    pub async fn update_topic_everywhere(&self, config: &TopicConfig) -> Result<Vec<String>> {
        config.validate()?;
        let addresses = self.master_addresses(&config.name).await?;
        for address in &addresses {
            self.instance
                .pool
                .upsert_topic(address, self.timeout(), config, false)
                .await?;
        }
        Ok(addresses)
    }

    /// Creates (`is_create_only`: an error where it exists) or updates the topic on every
    /// master broker of `cluster` (every cluster when `None`), as RocketMQ's
    /// `updateTopic -c`; returns the addresses where it was done and the brokers that failed
    /// (an error only when none succeeded).
    pub async fn upsert_topic_in_cluster(
        &self,
        cluster: Option<&str>,
        config: &TopicConfig,
        is_create_only: bool,
    ) -> Result<Partial<Vec<String>>> {
        config.validate()?;
        let clusters = self.cluster_info().await?;
        let addresses: Vec<String> = clusters
            .iter()
            .filter(|info| cluster.is_none() || cluster == Some(info.name.as_str()))
            .flat_map(ClusterInfo::master_addresses)
            .map(str::to_owned)
            .collect();
        if addresses.is_empty() {
            let known: Vec<&str> = clusters.iter().map(|info| info.name.as_str()).collect();
            return Err(Error::InvalidArgument(match cluster {
                Some(name) => {
                    format!("cluster {name} has no live master broker (clusters known: {known:?})")
                }
                None => "the name server knows no live master broker".to_owned(),
            }));
        }
        let mut fan = FanOut::new(Vec::new());
        for address in addresses {
            let answer = self
                .instance
                .pool
                .upsert_topic(&address, self.timeout(), config, is_create_only)
                .await;
            fan.add(&address, answer, |done, ()| done.push(address.clone()));
        }
        fan.finish()
    }

    /// Whether this client's account may make admin calls (create, update and delete topics)
    /// at the server at `address`, as the server said when the connection authenticated;
    /// `None` when it did not authenticate there (no access control, or no credentials).
    pub async fn account_is_admin(&self, address: &str) -> Result<Option<bool>> {
        check_address(address).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let connection = self.instance.pool.get(address).await?;
        Ok(connection
            .server()
            .and_then(|server| server.account_is_admin))
    }

    /// Every cluster the name servers know, with its broker names and live instances.
    pub async fn cluster_info(&self) -> Result<Vec<ClusterInfo>> {
        self.instance.namesrv.cluster_info().await
    }

    /// Deletes `topic` at the broker at `broker_address`.
    pub async fn delete_topic(&self, broker_address: &str, topic: &str) -> Result<()> {
        self.delete_topic_at(broker_address, topic, false).await
    }

    /// Deletes `topic` at every master broker that hosts it now; returns their addresses.
    pub async fn delete_topic_everywhere(&self, topic: &str) -> Result<Vec<String>> {
        self.delete_everywhere(topic, false).await
    }

    /// Deletes the retry (`%RETRY%<group>`) or dead-letter (`%DLQ%<group>`) topic of a group
    /// that has no live member, at `broker_address` or (when `None`) at every master broker
    /// hosting it; what waits there is lost. Other system topics are never deleted, and a
    /// group with live members is refused.
    pub async fn delete_group_topic(
        &self,
        broker_address: Option<&str>,
        topic: &str,
    ) -> Result<Vec<String>> {
        match broker_address {
            Some(address) => {
                self.delete_topic_at(address, topic, true).await?;
                Ok(vec![address.to_owned()])
            }
            None => self.delete_everywhere(topic, true).await,
        }
    }

    async fn delete_topic_at(&self, broker_address: &str, topic: &str, force: bool) -> Result<()> {
        check_topic_name(topic)?;
        check_address(broker_address).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        self.instance
            .pool
            .delete_topic(broker_address, self.timeout(), topic, force)
            .await
    }

    async fn delete_everywhere(&self, topic: &str, force: bool) -> Result<Vec<String>> {
        check_topic_name(topic)?;
        let addresses = self.master_addresses(topic).await?;
        for address in &addresses {
            self.instance
                .pool
                .delete_topic(address, self.timeout(), topic, force)
                .await?;
        }
        Ok(addresses)
    }

    async fn master_addresses(&self, topic: &str) -> Result<Vec<String>> {
        let route = self.route(topic).await?;
        Ok(route
            .brokers
            .keys()
            .filter_map(|name| route.master_address(name).map(str::to_owned))
            .collect())
    }

    /// Every topic the name servers route, sorted.
    pub async fn topic_list(&self) -> Result<Vec<String>> {
        self.instance.namesrv.topic_list().await
    }

    /// The topics one broker hosts, with their configs (system topics when asked).
    pub async fn broker_topics(
        &self,
        broker_address: &str,
        include_system: bool,
    ) -> Result<Vec<TopicConfig>> {
        check_address(broker_address).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        self.instance
            .pool
            .broker_topics(broker_address, self.timeout(), include_system)
            .await
    }

    /// The topic's route, fetched from the name servers now.
    pub async fn route(&self, topic: &str) -> Result<TopicRoute> {
        check_topic_name(topic)?;
        Ok(TopicRoute::clone(
            &*self.instance.namesrv.fetch_route(topic).await?,
        ))
    }

    /// Per-queue offsets and last store time of `topic` on every broker of its route, sorted
    /// by broker name and queue id.
    pub async fn topic_stats(&self, topic: &str) -> Result<Vec<QueueStats>> {
        let route = self.route(topic).await?;
        let mut stats = Vec::new();
        for broker_name in route.brokers.keys() {
            let Some(address) = route.read_address(broker_name) else {
                continue;
            };
            let queues = self
                .instance
                .pool
                .topic_stats(address, self.timeout(), topic)
                .await?;
            stats.extend(queues.into_iter().map(|queue| QueueStats {
                broker_name: broker_name.clone(),
                ..queue
            }));
        }
        Ok(stats)
    }

    /// Client ids of `group`'s live members, as the first broker of `topic`'s route knows
    /// them.
    pub async fn consumer_list(&self, group: &str, topic: &str) -> Result<Vec<String>> {
        check_group_name(group)?;
        let address = self.group_broker(topic).await?;
        self.instance
            .pool
            .consumer_list(&address, self.timeout(), group)
            .await
    }

    /// The broker asked about a group of `topic`'s consumers: the first of its route's brokers
    /// with a readable address.
    pub(crate) async fn group_broker(&self, topic: &str) -> Result<String> {
        let route = self.route(topic).await?;
        route
            .brokers
            .keys()
            .find_map(|name| route.read_address(name))
            .map(str::to_owned)
            .ok_or_else(|| Error::NoQueue {
                topic: topic.to_owned(),
                kind: "live-broker",
            })
    }

    /// `group`'s committed offset, the queue's end and so the lag of every queue of `topic`,
    /// from every master that answers (a broker that fails is asked no more and listed).
    pub async fn group_progress(
        &self,
        group: &str,
        topic: &str,
    ) -> Result<Partial<Vec<QueueProgress>>> {
        check_group_name(group)?;
        let route = self.route(topic).await?;
        let mut fan = FanOut::new(Vec::new());
        let mut failed: Vec<String> = Vec::new();
        for queue in route.read_queues() {
            let Some(master) = route.master_address(&queue.broker_name) else {
                continue;
            };
            if failed.iter().any(|address| address == master) {
                continue;
            }
            let pool = &self.instance.pool;
            let answer = async {
                let committed_offset = pool
                    .query_consumer_offset(master, self.timeout(), group, topic, queue.queue_id)
                    .await?;
                let (_, max_offset) = pool
                    .queue_offsets(master, self.timeout(), topic, queue.queue_id)
                    .await?;
                Ok(QueueProgress {
                    queue,
                    committed_offset,
                    max_offset,
                })
            }
            .await;
            if answer.is_err() {
                failed.push(master.to_owned());
            }
            fan.add(master, answer, Vec::push);
        }
        fan.finish()
    }

    /// Messages of `topic` with `key` (stored within `[begin_ms, end_ms]`, 0 = now), from
    /// every broker of its route that answers; at most `max_results` from each.
    pub async fn query_by_key(
        &self,
        topic: &str,
        key: &str,
        begin_ms: i64,
        end_ms: i64,
        max_results: u32,
    ) -> Result<Partial<Vec<MessageExt>>> {
        let route = self.route(topic).await?;
        let mut fan = FanOut::new(Vec::new());
        for broker_name in route.brokers.keys() {
            let Some(address) = route.read_address(broker_name) else {
                continue;
            };
            let answer = self
                .instance
                .pool
                .query_by_key(
                    address,
                    self.timeout(),
                    topic,
                    key,
                    (begin_ms, end_ms),
                    max_results,
                )
                .await;
            fan.add(address, answer, |found, mut messages| {
                for message in &mut messages {
                    message.set_broker_name(broker_name);
                }
                found.extend(messages);
            });
        }
        fan.finish()
    }

    /// The message of `topic` with the unique id `msg_id`, from any broker of its route.
    pub async fn query_by_id(&self, topic: &str, msg_id: &str) -> Result<Option<MessageExt>> {
        let route = self.route(topic).await?;
        for broker_name in route.brokers.keys() {
            let Some(address) = route.read_address(broker_name) else {
                continue;
            };
            let messages = self
                .instance
                .pool
                .query_by_unique_id(address, self.timeout(), msg_id, 0, 0)
                .await?;
            if let Some(mut message) = messages.into_iter().find(|m| m.topic() == topic) {
                message.set_broker_name(broker_name);
                return Ok(Some(message));
            }
        }
        Ok(None)
    }

    /// Closes every connection.
    pub async fn shutdown(&self) {
        self.instance.shut_down();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_counts_from_zero_without_commit() {
        let progress = QueueProgress {
            queue: MessageQueue::new("t", "b", 0),
            committed_offset: None,
            max_offset: 5,
        };
        assert_eq!(progress.lag(), 5);
    }
}
