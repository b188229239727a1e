//! Which queues this instance consumes, and the pull loop of each.
//!
//! Owns: rebalancing (the subscribed topics' readable queues; in clustering the group's
//! members from a broker and [`allocate_averagely`]; in broadcasting every queue), starting a
//! queue at the group's stored offset or else where `ConsumeFrom` says, giving a lost queue
//! back (its offset persisted first, so the next owner starts there), and the per-queue pull
//! loop with flow control. Never: calling the listener (see `consume.rs`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, info, warn};

use super::allocate::allocate_averagely;
use super::consume::dispatch;
use super::process_queue::ProcessQueue;
use super::{Assigned, ConsumeFrom, ConsumerCore, Listener, MessageModel, RETRY_TOPIC_PREFIX};
use crate::api::{PullArgs, PullStatus, UndecodedPull};
use crate::error::{Error, Result};
use crate::route::MessageQueue;

/// Longest wait of a queue over its flow limits before it checks again
/// (`PULL_TIME_DELAY_MILLS_WHEN_FLOW_CONTROL`); it checks sooner when consumed messages leave
/// its cache.
const FLOW_CONTROL_PAUSE: Duration = Duration::from_millis(50);

/// How long a pull loop waits after a failed pull (`PULL_TIME_DELAY_MILLS_WHEN_EXCEPTION`).
const PULL_ERROR_PAUSE: Duration = Duration::from_secs(3);

/// Flow-control pauses between two log lines about the same queue.
const FLOW_CONTROL_LOG_EVERY: u64 = 1000;

impl ConsumerCore {
    /// Shares out the queues of every subscribed topic again and starts or stops pull loops
    /// to match. A topic whose route or members cannot be read now keeps its queues.
    pub(super) async fn rebalance(self: &Arc<Self>) {
        let _only_one = self.rebalancing.lock().await;
        if self.is_stopping() {
            return;
        }
        let held_before = self.assigned_queues();
        for topic in self.subscriptions.keys() {
            match self.queues_for(topic).await {
                Ok(Some(queues)) => self.apply_assignment(topic, queues).await,
                Ok(None) => {}
                Err(error) if topic.starts_with(RETRY_TOPIC_PREFIX) => {
                    debug!(%topic, group = %self.config.group, %error, "retry topic not routed yet");
                }
                Err(error) => {
                    warn!(%topic, group = %self.config.group, %error, "rebalance skipped")
                }
            }
        }
        if self.assigned_queues() != held_before && !self.is_stopping() {
            // The heartbeat carries the queues held: tell the brokers now rather than at the
            // next tick (a change of them alone is no membership change, so no rebalance).
            for address in self.broker_addresses() {
                self.heartbeat(&address).await;
            }
        }
    }

    /// This instance's share of `topic`'s queues; `None` when the group's members are unknown
    /// (no broker answered with any).
    async fn queues_for(&self, topic: &str) -> Result<Option<BTreeSet<MessageQueue>>> {
        let route = match self.instance.namesrv.fetch_route(topic).await {
            Ok(route) => route,
            Err(error @ Error::TopicNotFound { .. }) => return Err(error),
            // The name servers are away: keep using the cached route.
            Err(_) => self.instance.namesrv.route(topic).await?,
        };
        let queues = route.read_queues();
        if self.config.model == MessageModel::Broadcasting {
            return Ok(Some(queues.into_iter().collect()));
        }
        let Some(address) = route
            .brokers
            .keys()
            .find_map(|name| route.read_address(name))
        else {
            return Ok(None);
        };
        let members = self
            .instance
            .pool
            .consumer_list(address, self.instance.request_timeout(), &self.config.group)
            .await?;
        if members.is_empty() {
            return Ok(None);
        }
        let mine = allocate_averagely(&queues, &members, self.instance.client_id());
        Ok(Some(mine.into_iter().collect()))
    }

    async fn apply_assignment(self: &Arc<Self>, topic: &str, wanted: BTreeSet<MessageQueue>) {
        let lost: Vec<(MessageQueue, Assigned)> = {
            let mut assigned = self.assigned();
            let lost_queues: Vec<MessageQueue> = assigned
                .keys()
                .filter(|queue| queue.topic == topic && !wanted.contains(*queue))
                .cloned()
                .collect();
            lost_queues
                .into_iter()
                .filter_map(|queue| assigned.remove(&queue).map(|entry| (queue, entry)))
                .collect()
        };
        for (queue, entry) in lost {
            entry.puller.abort();
            if self.uses_queue_locks() {
                self.hand_over(&queue, &entry.process_queue).await;
            } else {
                entry.process_queue.mark_dropped();
                self.offsets
                    .persist_and_remove(&self.instance, &queue)
                    .await;
            }
            info!(%queue, group = %self.config.group, "queue given up");
        }
        let held: BTreeSet<MessageQueue> = self.assigned().keys().cloned().collect();
        for queue in wanted.difference(&held) {
            if self.is_stopping() {
                return;
            }
            match self.start_offset(queue).await {
                Ok(offset) => self.take_queue(queue.clone(), offset),
                Err(error) => {
                    warn!(%queue, %error, "cannot find where to start the queue; will try at the next rebalance");
                }
            }
        }
    }

    /// Where consumption of `queue` starts: the stored offset, else per `ConsumeFrom`.
    async fn start_offset(&self, queue: &MessageQueue) -> Result<i64> {
        if let Some(offset) = self.offsets.read_persisted(&self.instance, queue).await? {
            return Ok(offset);
        }
        let address = self.instance.broker_address(queue, false).await?;
        let pool = &self.instance.pool;
        let timeout = self.instance.request_timeout();
        // A retry queue holds only this group's sent-back messages: always from its start.
        let consume_from = if queue.topic.starts_with(RETRY_TOPIC_PREFIX) {
            ConsumeFrom::FirstOffset
        } else {
            self.config.consume_from
        };
        match consume_from {
            ConsumeFrom::FirstOffset => Ok(pool
                .queue_offsets(&address, timeout, &queue.topic, queue.queue_id)
                .await?
                .0),
            ConsumeFrom::LastOffset => Ok(pool
                .queue_offsets(&address, timeout, &queue.topic, queue.queue_id)
                .await?
                .1),
            ConsumeFrom::Timestamp(timestamp_ms) => {
                pool.offset_by_time(
                    &address,
                    timeout,
                    &queue.topic,
                    queue.queue_id,
                    timestamp_ms,
                )
                .await
            }
        }
    }

    fn take_queue(self: &Arc<Self>, queue: MessageQueue, offset: i64) {
        info!(%queue, offset, group = %self.config.group, "queue taken");
        // A locking consumer records the offset only once it holds the queue's lock
        // (`take_lock`): committing this early read could overwrite the progress the previous
        // owner persists before it releases the queue.
        if !self.uses_queue_locks() {
            self.offsets.set(&queue, offset);
        }
        let process_queue = Arc::new(ProcessQueue::new(offset));
        let puller = tokio::spawn(pull_loop(
            Arc::clone(self),
            queue.clone(),
            Arc::clone(&process_queue),
        ));
        self.assigned().insert(
            queue,
            Assigned {
                process_queue,
                puller,
            },
        );
    }
}

/// Pulls `queue` into `process_queue` until the queue is dropped.
///
/// Pipelined: an answer with messages is decoded, cached and handed to the listener while the
/// next pull (from the answer's next offset, known before decoding) is already on its way, so
/// one queue's round trips overlap the client's decoding. The order of the messages is as with
/// one pull at a time; the answer waiting to be decoded counts against the flow limits, which
/// rise while the queue has a backlog ([`FlowLimits::backlog_pulls`]) so that the next pull
/// can travel while the cache still holds the previous answer.
///
/// [`FlowLimits::backlog_pulls`]: super::FlowLimits::backlog_pulls
async fn pull_loop(core: Arc<ConsumerCore>, queue: MessageQueue, process_queue: Arc<ProcessQueue>) {
    let is_span_limited = matches!(core.listener, Listener::Concurrently(_));
    let tags = core
        .subscriptions
        .get(&queue.topic)
        .cloned()
        .unwrap_or_else(crate::subscription::TagExpression::all);
    let mut flow_control_pauses: u64 = 0;
    let uses_queue_locks = core.uses_queue_locks();
    // An answer with messages, not yet decoded (taken in the next turn, beside the next pull).
    let mut undecoded: Option<UndecodedPull> = None;
    // Whether the last answer left at least one more pull at the broker: the flow limits then
    // leave room for a pull in flight beside the answer being consumed.
    let mut is_backlogged = false;
    while !process_queue.is_dropped() && !core.is_stopping() {
        if uses_queue_locks && !take_lock(&core, &queue, &process_queue).await {
            undecoded = None;
            tokio::time::sleep(super::queue_lock::LOCK_RETRY_PAUSE).await;
            continue;
        }
        // The answer waiting to be decoded counts as cached: the next pull leaves only when
        // both fit, so no more than one pull ever lies beyond the limits.
        let pending = undecoded
            .as_ref()
            .map(UndecodedPull::pending)
            .unwrap_or_default();
        let limits = core
            .config
            .flow_limits
            .in_force(core.config.pull_batch, is_backlogged);
        if let Some(reason) = process_queue.over_limit_with(&limits, is_span_limited, pending) {
            if let Some(answer) = undecoded.take() {
                // Already here: cache it, then wait for room.
                if let Err(error) = take_answer(&core, &queue, &process_queue, &tags, answer) {
                    warn!(%queue, %error, "pulled records do not decode; pulling them again in {} s", PULL_ERROR_PAUSE.as_secs());
                    tokio::time::sleep(PULL_ERROR_PAUSE).await;
                }
                continue;
            }
            if flow_control_pauses == 0 {
                debug!(%queue, %reason, "flow control: pulling paused");
            }
            flow_control_pauses = (flow_control_pauses + 1) % FLOW_CONTROL_LOG_EVERY;
            process_queue.wait_drained(FLOW_CONTROL_PAUSE).await;
            continue;
        }
        let offset = match &undecoded {
            Some(answer) => answer.next_begin_offset,
            None => process_queue.pulled_up_to(),
        };
        let pull = async {
            let address = core.instance.pull_address(&queue).await?;
            let commit_offset = match core.config.model {
                MessageModel::Clustering => core.offsets.get(&queue).filter(|o| *o > 0),
                MessageModel::Broadcasting => None,
            };
            let args = PullArgs {
                group: &core.config.group,
                topic: &queue.topic,
                broker_name: &queue.broker_name,
                queue_id: queue.queue_id,
                offset,
                max_messages: core.config.pull_batch,
                max_bytes: core.config.pull_max_bytes,
                tag_expression: tags.as_str(),
                expression_type: tags.expression_type(),
                suspend: core.config.pull_wait,
                commit_offset,
            };
            let answer = core.instance.pool.pull_undecoded(&address, &args).await;
            if let Ok(answer) = &answer {
                core.instance
                    .follow_pull_suggestion(&queue, answer.suggest_which_broker_id);
            }
            answer
        };
        // The previous answer is decoded while this pull travels (the pull is polled first, so
        // its request is out before the decoding starts).
        let previous = undecoded.take();
        let (outcome, taken) = tokio::join!(pull, async {
            match previous {
                Some(answer) => take_answer(&core, &queue, &process_queue, &tags, answer),
                None => Ok(()),
            }
        });
        if process_queue.is_dropped() {
            return;
        }
        if let Err(error) = taken {
            // The pull just made continued past records that did not decode: drop its answer
            // and pull those records again after a pause.
            warn!(%queue, %error, "pulled records do not decode; pulling them again in {} s", PULL_ERROR_PAUSE.as_secs());
            tokio::time::sleep(PULL_ERROR_PAUSE).await;
            continue;
        }
        if let Ok(answer) = &outcome {
            let backlog = answer.max_offset.saturating_sub(answer.next_begin_offset);
            is_backlogged = backlog >= i64::from(core.config.pull_batch);
        }
        match outcome {
            Ok(answer) => match answer.status {
                PullStatus::Found => undecoded = Some(answer),
                PullStatus::NoNewMessage | PullStatus::NoMatchedMessage => {
                    process_queue.advance(answer.next_begin_offset);
                    core.offsets
                        .advance(&queue, process_queue.committable_offset());
                }
                PullStatus::OffsetIllegal => {
                    warn!(
                        %queue,
                        offset,
                        next = answer.next_begin_offset,
                        min = answer.min_offset,
                        max = answer.max_offset,
                        "pull offset out of range; moving to the broker's next offset"
                    );
                    process_queue.reset(answer.next_begin_offset);
                    core.offsets.set(&queue, answer.next_begin_offset);
                }
            },
            Err(error) => {
                if core.is_stopping() {
                    return;
                }
                warn!(%queue, offset, %error, "pull failed; retrying in {} s", PULL_ERROR_PAUSE.as_secs());
                if error.is_retriable() {
                    // The broker may have moved (restarted elsewhere) or gone: look again.
                    let _ = core.instance.namesrv.fetch_route(&queue.topic).await;
                }
                tokio::time::sleep(PULL_ERROR_PAUSE).await;
            }
        }
    }
}

/// Decodes a pull answer with messages, caches the ones the tag expression matches and hands
/// them to the listener; the queue is then pulled up to the answer's next offset.
fn take_answer(
    core: &Arc<ConsumerCore>,
    queue: &MessageQueue,
    process_queue: &Arc<ProcessQueue>,
    tags: &crate::subscription::TagExpression,
    answer: UndecodedPull,
) -> Result<()> {
    let records = answer.records().clone();
    let result = answer.decode(&queue.broker_name)?;
    if process_queue.is_dropped() {
        return Ok(());
    }
    // With `*` no message's tag needs finding among its properties.
    let mut matching: Vec<_> = if tags.is_all() {
        result.messages
    } else {
        result
            .messages
            .into_iter()
            .filter(|message| tags.matches(message.tags()))
            .collect()
    };
    let broker_name: Arc<str> = Arc::from(queue.broker_name.as_str());
    process_queue.put(
        &records,
        &broker_name,
        &mut matching,
        result.next_begin_offset,
    );
    core.offsets
        .advance(queue, process_queue.committable_offset());
    if !matching.is_empty() {
        dispatch(core, queue, process_queue, matching);
    }
    Ok(())
}

/// Orderly (clustering) mode: whether this instance holds `queue`'s broker-side lock, asking for
/// it when not. The first time it is granted, the start offset is read again: the previous
/// owner persisted its offset before it released the lock.
async fn take_lock(
    core: &ConsumerCore,
    queue: &MessageQueue,
    process_queue: &ProcessQueue,
) -> bool {
    if !process_queue.is_locked(core.config.orderly_lock_ttl)
        && !core.lock_queue(queue, process_queue).await
    {
        return false;
    }
    if process_queue.needs_offset_check() {
        match core.start_offset(queue).await {
            Ok(offset) => {
                debug!(%queue, offset, "queue locked; consuming from the group's offset");
                process_queue.reset(offset);
                core.offsets.set(queue, offset);
                process_queue.mark_offset_checked();
            }
            Err(error) => {
                warn!(%queue, %error, "cannot read the queue's offset after locking it");
                return false;
            }
        }
    }
    true
}
