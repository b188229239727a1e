//! The push consumer's builder: every setting with its default (RocketMQ's), the checks they
//! pass, and starting the consumer from them (the offset store, the core, the first heartbeat
//! and rebalance, the background tasks).
//!
//! Owns: [`PushConsumerBuilder`]. Never: what the running consumer does (`mod.rs` and the
//! other files of `push/`).

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};

use super::offset_store::{OffsetBackend, OffsetStore};
use super::{
    retry_topic_of, ConsumeFrom, ConsumeResult, ConsumerConfig, ConsumerCore, FlowLimits, Listener,
    ListenerFn, ListenerFuture, MessageModel, PushConsumer,
};
use crate::error::{Error, Result};
use crate::instance::{client_option_setters, ClientInstance, ClientOptions};
use crate::message::{check_consumer_group_name, check_topic_name, MessageExt};
use crate::subscription::TagExpression;

fn box_listener<F, Fut>(listener: F) -> ListenerFn
where
    F: Fn(Vec<MessageExt>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ConsumeResult> + Send + 'static,
{
    Arc::new(move |messages| Box::pin(listener(messages)) as ListenerFuture)
}

/// Configures and starts a [`PushConsumer`].
pub struct PushConsumerBuilder {
    pub(super) options: ClientOptions,
    pub(super) group: Option<String>,
    /// (topic, expression, whether the expression is SQL92).
    pub(super) subscriptions: Vec<(String, String, bool)>,
    pub(super) offset_store_dir: Option<PathBuf>,
    pub(super) listener: Option<Listener>,
    pub(super) config: ConsumerConfig,
}

impl std::fmt::Debug for PushConsumerBuilder {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("PushConsumerBuilder")
            .field("options", &self.options)
            .field("group", &self.group)
            .field("subscriptions", &self.subscriptions)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl PushConsumerBuilder {
    client_option_setters!();

    /// The consumer group. Required.
    #[must_use]
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Subscribes to `topic` with a tag expression: `*` for every message, or
    /// `TagA || TagB`. At least one subscription is required.
    #[must_use]
    pub fn subscribe(mut self, topic: impl Into<String>, expression: impl Into<String>) -> Self {
        self.subscriptions
            .push((topic.into(), expression.into(), false));
        self
    }

    /// Subscribes to `topic` with a SQL92 expression over message properties (`TAGS` among
    /// them), for example `region = 'eu' AND price > 10` (docs/sql-filter.md): the broker
    /// evaluates it and sends only the messages that match; it must run with
    /// `enable_property_filter`. A malformed expression fails [`start`](Self::start) with
    /// the error's position.
    #[must_use]
    pub fn subscribe_sql(
        mut self,
        topic: impl Into<String>,
        expression: impl Into<String>,
    ) -> Self {
        self.subscriptions
            .push((topic.into(), expression.into(), true));
        self
    }

    /// Clustering (default) or broadcasting.
    #[must_use]
    pub fn message_model(mut self, model: MessageModel) -> Self {
        self.config.model = model;
        self
    }

    /// Where a queue without a stored offset starts (default: the last offset).
    #[must_use]
    pub fn consume_from(mut self, from: ConsumeFrom) -> Self {
        self.config.consume_from = from;
        self
    }

    /// Listener calls running at once (default 20).
    #[must_use]
    pub fn consume_threads(mut self, threads: usize) -> Self {
        self.config.consume_threads = threads;
        self
    }

    /// Most messages per listener call (default 1).
    #[must_use]
    pub fn consume_batch_max(mut self, messages: usize) -> Self {
        self.config.consume_batch_max = messages;
        self
    }

    /// Most messages one pull transfers (default [`DEFAULT_PUSH_PULL_BATCH`]). The transfer
    /// size, not the listener's batch (see [`consume_batch_max`](Self::consume_batch_max)):
    /// a large pull drains a backlog in few round trips and is cut by
    /// [`pull_max_bytes`](Self::pull_max_bytes) and by the broker's own caps.
    #[must_use]
    pub fn pull_batch(mut self, messages: u32) -> Self {
        self.config.pull_batch = messages;
        self
    }

    /// Most record bytes one pull transfers (default [`DEFAULT_PUSH_PULL_MAX_BYTES`]; 0 leaves
    /// only the broker's `max_pull_bytes`). A record larger than this still comes, alone.
    #[must_use]
    pub fn pull_max_bytes(mut self, bytes: u32) -> Self {
        self.config.pull_max_bytes = bytes;
        self
    }

    /// When a queue's pulling pauses (default 1000 messages, 100 MiB, span 2000; while the
    /// queue has a backlog the message and span limits rise to two pulls of `pull_batch`, so
    /// that a pull travels while the previous answer is consumed). RocketMQ's fixed
    /// thresholds: [`FlowLimits::rocketmq`].
    #[must_use]
    pub fn flow_limits(mut self, limits: FlowLimits) -> Self {
        self.config.flow_limits = limits;
        self
    }

    /// A fixed wait before a `ReconsumeLater` message is redelivered locally: in broadcasting
    /// mode, and when sending it back to the broker failed (default: RocketMQ's retry schedule,
    /// 10 s, 30 s, 1 min, … up to 2 h). Messages sent back wait the broker's delay levels.
    #[must_use]
    pub fn reconsume_delay(mut self, delay: Duration) -> Self {
        self.config.reconsume_delay = Some(delay);
        self
    }

    /// Orderly mode: how long a queue pauses after `ReconsumeLater` before the same message is
    /// delivered again (default 1 s).
    #[must_use]
    pub fn orderly_suspend(mut self, delay: Duration) -> Self {
        self.config.orderly_suspend = delay;
        self
    }

    /// Redeliveries through `%RETRY%<group>` before a failed message goes to `%DLQ%<group>`
    /// (default 16; clustering, concurrent listeners).
    #[must_use]
    pub fn max_reconsume_times(mut self, times: u32) -> Self {
        self.config.max_reconsume_times = i32::try_from(times).unwrap_or(i32::MAX);
        self
    }

    /// How long a concurrent listener call may take before its messages are sent back for
    /// retry (default 15 min). The call itself is not interrupted; its result is ignored.
    #[must_use]
    pub fn consume_timeout(mut self, timeout: Duration) -> Self {
        self.config.consume_timeout = timeout;
        self
    }

    /// Orderly mode: how often the broker-side locks of this instance's queues are renewed
    /// (default 20 s).
    #[must_use]
    pub fn orderly_lock_interval(mut self, interval: Duration) -> Self {
        self.config.orderly_lock_interval = interval;
        self
    }

    /// Orderly mode: how long a granted queue lock lets this instance consume the queue
    /// without a renewal (default 30 s). Keep it below the broker's `queue_lock_expiry_ms`
    /// (60 s) and above `orderly_lock_interval`.
    #[must_use]
    pub fn orderly_lock_ttl(mut self, ttl: Duration) -> Self {
        self.config.orderly_lock_ttl = ttl;
        self
    }

    /// How often queues are shared out again (default 20 s; membership notices also
    /// trigger it).
    #[must_use]
    pub fn rebalance_interval(mut self, interval: Duration) -> Self {
        self.config.rebalance_interval = interval;
        self
    }

    /// How often offsets are persisted (default 5 s).
    #[must_use]
    pub fn persist_interval(mut self, interval: Duration) -> Self {
        self.config.persist_interval = interval;
        self
    }

    /// Broadcasting: the directory of the local offset file (default `~/.shardmq_offsets`);
    /// the file is `<dir>/<instance name>/<group>/offsets.json`.
    #[must_use]
    pub fn offset_store_dir(mut self, directory: impl Into<PathBuf>) -> Self {
        self.offset_store_dir = Some(directory.into());
        self
    }

    /// The listener, called concurrently (up to `consume_threads` at once) with up to
    /// `consume_batch_max` messages. It runs on the tokio runtime: move blocking work to
    /// `spawn_blocking`.
    #[must_use]
    pub fn listen_concurrently<F, Fut>(mut self, listener: F) -> Self
    where
        F: Fn(Vec<MessageExt>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ConsumeResult> + Send + 'static,
    {
        self.listener = Some(Listener::Concurrently(box_listener(listener)));
        self
    }

    /// The listener, called orderly: one call at a time per queue, messages in queue order;
    /// after `ReconsumeLater` the queue pauses (`orderly_suspend`) and the same messages come
    /// again. In clustering mode a queue is consumed only while this instance holds its
    /// broker-side lock, so no two members consume one queue at once, also while a rebalance
    /// moves it (the new owner waits until the old one releases the lock or it expires).
    #[must_use]
    pub fn listen_orderly<F, Fut>(mut self, listener: F) -> Self
    where
        F: Fn(Vec<MessageExt>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ConsumeResult> + Send + 'static,
    {
        self.listener = Some(Listener::Orderly(box_listener(listener)));
        self
    }

    fn validate(&self) -> Result<(String, BTreeMap<String, TagExpression>, Listener)> {
        let group = self.group.clone().ok_or_else(|| {
            Error::Config("a push consumer needs a group; call .group(\"name\")".to_owned())
        })?;
        check_consumer_group_name(&group)?;
        if self.subscriptions.is_empty() {
            return Err(Error::Config(
                "a push consumer needs a subscription; call .subscribe(\"topic\", \"*\")"
                    .to_owned(),
            ));
        }
        let mut subscriptions = BTreeMap::new();
        for (topic, expression, is_sql) in &self.subscriptions {
            check_topic_name(topic)?;
            let expression = if *is_sql {
                TagExpression::sql(expression)?
            } else {
                TagExpression::parse(expression)?
            };
            subscriptions.insert(topic.clone(), expression);
        }
        let listener = self.listener.clone().ok_or_else(|| {
            Error::Config(
                "a push consumer needs a listener; call .listen_concurrently(…) or .listen_orderly(…)"
                    .to_owned(),
            )
        })?;
        let config = &self.config;
        if config.consume_threads == 0 || config.consume_batch_max == 0 || config.pull_batch == 0 {
            return Err(Error::Config(
                "consume_threads, consume_batch_max and pull_batch must be at least 1".to_owned(),
            ));
        }
        if config.consume_timeout.is_zero() || config.max_reconsume_times <= 0 {
            return Err(Error::Config(
                "consume_timeout and max_reconsume_times must be positive".to_owned(),
            ));
        }
        if config.orderly_lock_interval.is_zero()
            || config.orderly_lock_ttl <= config.orderly_lock_interval
        {
            return Err(Error::Config(
                "orderly_lock_interval must be positive and below orderly_lock_ttl".to_owned(),
            ));
        }
        if config.rebalance_interval.is_zero() || config.persist_interval.is_zero() {
            return Err(Error::Config(
                "rebalance_interval and persist_interval must be positive".to_owned(),
            ));
        }
        Ok((group, subscriptions, listener))
    }

    /// Checks the settings, joins the group (heartbeat), takes this instance's share of the
    /// queues and starts consuming.
    pub async fn start(self) -> Result<PushConsumer> {
        let (group, mut subscriptions, listener) = self.validate()?;
        if self.config.model == MessageModel::Clustering {
            // Sent-back messages come back through the group's retry topic (as in RocketMQ).
            subscriptions.insert(retry_topic_of(&group), TagExpression::all());
        }
        let (instance, notices) = ClientInstance::start(self.options, true)?;
        let backend = match self.config.model {
            MessageModel::Clustering => OffsetBackend::Broker,
            MessageModel::Broadcasting => {
                let directory = self
                    .offset_store_dir
                    .unwrap_or_else(default_offset_store_dir);
                OffsetBackend::LocalFile(
                    directory
                        .join(&instance.instance_name)
                        .join(&group)
                        .join("offsets.json"),
                )
            }
        };
        let offsets = OffsetStore::open(&group, backend)?;
        let config = ConsumerConfig {
            group,
            ..self.config
        };
        let core = Arc::new(ConsumerCore {
            workers: Arc::new(Semaphore::new(config.consume_threads)),
            instance,
            config,
            subscriptions,
            listener,
            offsets,
            assigned: Mutex::new(BTreeMap::new()),
            rebalance_now: Notify::new(),
            rebalancing: tokio::sync::Mutex::new(()),
            is_stopping: AtomicBool::new(false),
            tasks: Mutex::new(Vec::new()),
        });
        core.heartbeat_all().await;
        core.rebalance().await;
        core.start_background(notices);
        Ok(PushConsumer { core })
    }
}

fn default_offset_store_dir() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join(".shardmq_offsets")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn builder_says_what_is_missing() {
        let error = PushConsumer::builder()
            .namesrv("127.0.0.1:1")
            .group("g")
            .start()
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains(".subscribe("), "{error}");
        let error = PushConsumer::builder()
            .namesrv("127.0.0.1:1")
            .group("g")
            .subscribe("t", "*")
            .start()
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains("listener"), "{error}");
        let error = PushConsumer::builder()
            .namesrv("127.0.0.1:1")
            .group("bad group")
            .start()
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains("group name"), "{error}");
    }
}
