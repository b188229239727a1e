//! The pull consumer: the application chooses queues and offsets and pulls itself (RocketMQ's
//! DefaultMQPullConsumer / LitePullConsumer without automatic assignment).
//!
//! Owns: the calls a hand-driven consumer needs: the queues of a topic, pull (optionally long
//! polling), the group's committed offsets, and queue offsets by position or time. Never:
//! background pulling, rebalancing or offset commits on its own (see `push/`).

use std::sync::Arc;
use std::time::Duration;

use crate::api::{PullArgs, PullResult};
use crate::error::{Error, Result};
use crate::instance::{client_option_setters, ClientInstance, ClientOptions};
use crate::message::check_consumer_group_name;
use crate::route::MessageQueue;
use crate::subscription::TagExpression;

/// Default number of messages one pull asks for (RocketMQ's `pullBatchSize`).
pub const DEFAULT_PULL_BATCH: u32 = 32;

/// Longest long-poll hold a pull may ask for (the broker caps it at its own limit too).
pub const MAX_PULL_WAIT: Duration = Duration::from_secs(30);

/// What one pull asks for beyond the queue and offset.
#[derive(Debug, Clone)]
pub struct PullOptions {
    /// Most messages to return (default 32).
    pub max_messages: u32,
    /// Most record bytes to return (default 0: the broker's limit, `max_pull_bytes`). A
    /// record larger than this still comes, alone.
    pub max_bytes: u32,
    /// Tag expression (default `*`), or a SQL92 one ([`TagExpression::sql`]).
    pub tags: TagExpression,
    /// How long the broker may hold the pull when nothing is there (default 0: answer at
    /// once; at most [`MAX_PULL_WAIT`]).
    pub wait: Duration,
}

impl Default for PullOptions {
    fn default() -> Self {
        Self {
            max_messages: DEFAULT_PULL_BATCH,
            max_bytes: 0,
            tags: TagExpression::all(),
            wait: Duration::ZERO,
        }
    }
}

/// Configures and starts a [`PullConsumer`].
#[derive(Debug, Clone)]
pub struct PullConsumerBuilder {
    options: ClientOptions,
    group: Option<String>,
}

impl PullConsumerBuilder {
    client_option_setters!();

    /// The consumer group whose offsets this consumer reads and commits. Required.
    #[must_use]
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Checks the settings and starts the consumer.
    pub async fn build(self) -> Result<PullConsumer> {
        let group = self.group.ok_or_else(|| {
            Error::Config("a pull consumer needs a group; call .group(\"name\")".to_owned())
        })?;
        check_consumer_group_name(&group)?;
        let (instance, _) = ClientInstance::start(self.options, false)?;
        Ok(PullConsumer { instance, group })
    }
}

/// Pulls messages from queues the application chooses.
///
/// ```no_run
/// # async fn example() -> shardmq_client::Result<()> {
/// use shardmq_client::PullConsumer;
/// let consumer = PullConsumer::builder().namesrv("127.0.0.1:9876").group("audit").build().await?;
/// for queue in consumer.queues("orders").await? {
///     let offset = consumer.committed_offset(&queue).await?.unwrap_or(0);
///     let result = consumer.pull(&queue, offset, 32).await?;
///     for message in &result.messages {
///         println!("{} {}", message.queue_offset, String::from_utf8_lossy(&message.body));
///     }
///     consumer.commit_offset(&queue, result.next_begin_offset).await?;
/// }
/// # Ok(())
/// # }
/// ```
pub struct PullConsumer {
    instance: Arc<ClientInstance>,
    group: String,
}

impl std::fmt::Debug for PullConsumer {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("PullConsumer")
            .field("group", &self.group)
            .field("client_id", &self.instance.client_id())
            .finish_non_exhaustive()
    }
}

impl PullConsumer {
    #[must_use]
    pub fn builder() -> PullConsumerBuilder {
        PullConsumerBuilder {
            options: ClientOptions::default(),
            group: None,
        }
    }

    #[must_use]
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The readable queues of `topic` (fetched from the name server now), sorted.
    pub async fn queues(&self, topic: &str) -> Result<Vec<MessageQueue>> {
        let route = self.instance.namesrv.fetch_route(topic).await?;
        let queues = route.read_queues();
        if queues.is_empty() {
            return Err(Error::NoQueue {
                topic: topic.to_owned(),
                kind: "readable",
            });
        }
        Ok(queues)
    }

    /// Pulls up to `max_messages` from `queue` at `offset`, answering at once.
    pub async fn pull(
        &self,
        queue: &MessageQueue,
        offset: i64,
        max_messages: u32,
    ) -> Result<PullResult> {
        let options = PullOptions {
            max_messages,
            ..PullOptions::default()
        };
        self.pull_with(queue, offset, &options).await
    }

    /// Pulls from `queue` at `offset` with a tag filter and an optional long-poll wait.
    pub async fn pull_with(
        &self,
        queue: &MessageQueue,
        offset: i64,
        options: &PullOptions,
    ) -> Result<PullResult> {
        if offset < 0 {
            return Err(Error::InvalidArgument(format!(
                "pull offset {offset} is negative"
            )));
        }
        if options.max_messages == 0 {
            return Err(Error::InvalidArgument(
                "max_messages must be at least 1".to_owned(),
            ));
        }
        let address = self.instance.pull_address(queue).await?;
        let args = PullArgs {
            group: &self.group,
            topic: &queue.topic,
            broker_name: &queue.broker_name,
            queue_id: queue.queue_id,
            offset,
            max_messages: options.max_messages,
            max_bytes: options.max_bytes,
            tag_expression: options.tags.as_str(),
            expression_type: options.tags.expression_type(),
            suspend: options.wait.min(MAX_PULL_WAIT),
            commit_offset: None,
        };
        let mut result = match self.instance.pool.pull(&address, &args).await {
            Ok(result) => result,
            Err(error) => {
                if error.is_retriable() {
                    // The broker may have moved or gone (failover): the next pull looks again.
                    let _ = self.instance.namesrv.fetch_route(&queue.topic).await;
                }
                return Err(error);
            }
        };
        self.instance
            .follow_pull_suggestion(queue, result.suggest_which_broker_id);
        result
            .messages
            .retain(|message| options.tags.matches(message.tags()));
        Ok(result)
    }

    /// The group's committed offset of `queue`; `None` when it has never committed one.
    pub async fn committed_offset(&self, queue: &MessageQueue) -> Result<Option<i64>> {
        // Offsets live with the master; with the master gone, the slave (RocketMQ's rule).
        let address = self.instance.broker_address(queue, false).await?;
        self.instance
            .pool
            .query_consumer_offset(
                &address,
                self.instance.request_timeout(),
                &self.group,
                &queue.topic,
                queue.queue_id,
            )
            .await
    }

    /// Commits the group's offset of `queue`: the next offset it will consume.
    pub async fn commit_offset(&self, queue: &MessageQueue, offset: i64) -> Result<()> {
        if offset < 0 {
            return Err(Error::InvalidArgument(format!(
                "offset {offset} to commit is negative"
            )));
        }
        // Offsets live with the master; with the master gone, the slave (RocketMQ's rule).
        let address = self.instance.broker_address(queue, false).await?;
        self.instance
            .pool
            .commit_consumer_offset(
                &address,
                self.instance.request_timeout(),
                &self.group,
                &queue.topic,
                queue.queue_id,
                offset,
            )
            .await
    }

    /// `queue`'s smallest stored offset and one past its largest visible offset.
    pub async fn queue_offsets(&self, queue: &MessageQueue) -> Result<(i64, i64)> {
        let address = self.instance.broker_address(queue, false).await?;
        self.instance
            .pool
            .queue_offsets(
                &address,
                self.instance.request_timeout(),
                &queue.topic,
                queue.queue_id,
            )
            .await
    }

    /// The first offset of `queue` stored at or after `timestamp_ms` (ms since the epoch).
    pub async fn offset_by_time(&self, queue: &MessageQueue, timestamp_ms: i64) -> Result<i64> {
        let address = self.instance.broker_address(queue, false).await?;
        self.instance
            .pool
            .offset_by_time(
                &address,
                self.instance.request_timeout(),
                &queue.topic,
                queue.queue_id,
                timestamp_ms,
            )
            .await
    }

    /// Closes every connection; calls after this fail with [`Error::ShutDown`].
    pub async fn shutdown(&self) {
        self.instance.shut_down();
    }
}
