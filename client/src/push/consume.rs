//! Running the listener on pulled messages: concurrently (RocketMQ's
//! ConsumeMessageConcurrentlyService) or one call at a time per queue in offset order
//! (ConsumeMessageOrderlyService).
//!
//! Owns: the bounded worker pool (a semaphore of `consume_threads` permits held for each
//! listener call), turning listener results into offset progress, sending `ReconsumeLater`
//! messages back to the broker for retry (concurrent listeners in clustering mode: the broker
//! redelivers them through `%RETRY%<group>`, then `%DLQ%<group>`), and local redelivery after
//! a delay when the send-back fails, in broadcasting mode, and for orderly listeners (the
//! messages stay cached meanwhile, so the offset cannot pass them and nothing is lost). A
//! listener that panics, or a concurrent call past `consume_timeout`, counts as
//! `ReconsumeLater`. Messages from the retry topic reach the listener with their original
//! topic. Never: pulling or persisting offsets.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use tracing::{debug, warn};

use super::process_queue::ProcessQueue;
use super::{ConsumeResult, ConsumerCore, Listener, ListenerFn, MessageModel, RETRY_TOPIC_PREFIX};
use crate::message::MessageExt;
use crate::route::MessageQueue;
use crate::send_back::SendBackArgs;

/// Hands newly cached messages of `queue` to the listener.
pub(super) fn dispatch(
    core: &Arc<ConsumerCore>,
    queue: &MessageQueue,
    process_queue: &Arc<ProcessQueue>,
    messages: Vec<MessageExt>,
) {
    match &core.listener {
        Listener::Concurrently(_) => {
            let batch_max = core.config.consume_batch_max.max(1);
            let mut messages = messages.into_iter().peekable();
            while messages.peek().is_some() {
                let batch: Vec<MessageExt> = messages.by_ref().take(batch_max).collect();
                tokio::spawn(consume_concurrently(
                    Arc::clone(core),
                    queue.clone(),
                    Arc::clone(process_queue),
                    batch,
                ));
            }
        }
        Listener::Orderly(_) => {
            if process_queue.try_start_consuming() {
                tokio::spawn(consume_orderly(
                    Arc::clone(core),
                    queue.clone(),
                    Arc::clone(process_queue),
                ));
            }
        }
    }
}

fn listener_of(listener: &Listener) -> &ListenerFn {
    match listener {
        Listener::Concurrently(listener) | Listener::Orderly(listener) => listener,
    }
}

/// Calls the listener in a task of its own, so a panic is caught and counted as
/// `ReconsumeLater` instead of stalling the queue.
async fn call_listener(listener: &ListenerFn, messages: Vec<MessageExt>) -> ConsumeResult {
    let future = match std::panic::catch_unwind(AssertUnwindSafe(|| listener(messages))) {
        Ok(future) => future,
        Err(_) => {
            warn!("the listener panicked; the messages will be delivered again");
            return ConsumeResult::ReconsumeLater;
        }
    };
    match tokio::spawn(future).await {
        Ok(result) => result,
        Err(error) => {
            warn!(%error, "the listener panicked; the messages will be delivered again");
            ConsumeResult::ReconsumeLater
        }
    }
}

async fn consume_concurrently(
    core: Arc<ConsumerCore>,
    queue: MessageQueue,
    process_queue: Arc<ProcessQueue>,
    messages: Vec<MessageExt>,
) {
    // Held until the offset is updated, so shutdown (which takes every permit) sees the
    // progress of every call that ran.
    let Ok(_permit) = Arc::clone(&core.workers).acquire_owned().await else {
        return;
    };
    if process_queue.is_dropped() || core.is_stopping() {
        return;
    }
    let offsets: Vec<i64> = messages.iter().map(|m| m.queue_offset).collect();
    // The listener gets the batch itself; a send-back reads the messages from the cache,
    // where they stay until consumed.
    let call = call_listener(listener_of(&core.listener), as_originally_sent(messages));
    let result = match tokio::time::timeout(core.config.consume_timeout, call).await {
        Ok(result) => result,
        Err(_) => {
            warn!(
                %queue,
                timeout_s = core.config.consume_timeout.as_secs(),
                "listener call ran past consume_timeout; its messages are sent back for retry"
            );
            ConsumeResult::ReconsumeLater
        }
    };
    match result {
        ConsumeResult::Success => {
            let offset = process_queue.remove(&offsets);
            if !process_queue.is_dropped() {
                core.offsets.advance(&queue, offset);
            }
        }
        ConsumeResult::ReconsumeLater => {
            let messages = process_queue.cached(&offsets);
            let offsets = send_back_or_keep(&core, &queue, &process_queue, &messages).await;
            if offsets.is_empty() {
                return;
            }
            let again = process_queue.prepare_redelivery(&offsets);
            let Some(failed_deliveries) = again.iter().map(|m| m.reconsume_times).max() else {
                return;
            };
            let delay = core.config.redelivery_delay(failed_deliveries);
            let core = Arc::clone(&core);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                if !process_queue.is_dropped() && !core.is_stopping() {
                    dispatch(&core, &queue, &process_queue, again);
                }
            });
        }
    }
}

/// The messages as the listener sees them: a redelivery from the retry topic shows the topic
/// the message was first sent to (RocketMQ's `resetRetryTopic`).
fn as_originally_sent(mut messages: Vec<MessageExt>) -> Vec<MessageExt> {
    for message in &mut messages {
        if message.topic().starts_with(RETRY_TOPIC_PREFIX) {
            if let Some(original) = message.retry_topic().map(str::to_owned) {
                message.set_topic(&original);
            }
        }
    }
    messages
}

/// Clustering: sends each message back to its broker for retry and takes the ones the broker
/// accepted out of the cache (the offset may pass them now). Returns the offsets to redeliver
/// locally: the ones whose send-back failed, or every one in broadcasting mode.
async fn send_back_or_keep(
    core: &Arc<ConsumerCore>,
    queue: &MessageQueue,
    process_queue: &Arc<ProcessQueue>,
    messages: &[MessageExt],
) -> Vec<i64> {
    if core.config.model == MessageModel::Broadcasting {
        return messages.iter().map(|m| m.queue_offset).collect();
    }
    let mut kept = Vec::new();
    let mut sent = Vec::new();
    for message in messages {
        match send_back(core, queue, message).await {
            Ok(()) => sent.push(message.queue_offset),
            Err(error) => {
                warn!(%queue, offset = message.queue_offset, %error, "send-back failed; redelivering locally");
                kept.push(message.queue_offset);
            }
        }
    }
    if !sent.is_empty() {
        let offset = process_queue.remove(&sent);
        if !process_queue.is_dropped() {
            core.offsets.advance(queue, offset);
        }
    }
    kept
}

async fn send_back(
    core: &ConsumerCore,
    queue: &MessageQueue,
    message: &MessageExt,
) -> crate::error::Result<()> {
    let address = core.instance.broker_address(queue, false).await?;
    let unique_id = message
        .property(crate::message::PROPERTY_UNIQUE_ID)
        .unwrap_or_default();
    let args = SendBackArgs {
        group: &core.config.group,
        topic: &queue.topic,
        queue_id: queue.queue_id,
        commit_log_offset: message.commit_log_offset,
        unique_id,
        delay_level: 0,
        max_reconsume_times: core.config.max_reconsume_times,
    };
    let answer = core
        .instance
        .pool
        .send_back(&address, core.instance.request_timeout(), &args)
        .await?;
    debug!(
        %queue,
        offset = message.queue_offset,
        to = %answer.topic,
        reconsume_times = answer.reconsume_times,
        is_dead_letter = answer.is_dead_letter,
        "message sent back"
    );
    Ok(())
}

async fn consume_orderly(
    core: Arc<ConsumerCore>,
    queue: MessageQueue,
    process_queue: Arc<ProcessQueue>,
) {
    loop {
        if process_queue.is_dropped() || core.is_stopping() {
            process_queue.stop_consuming_if_empty();
            return;
        }
        let Ok(permit) = Arc::clone(&core.workers).acquire_owned().await else {
            process_queue.stop_consuming_if_empty();
            return;
        };
        // Held for the call: a rebalance giving the queue up waits for it (queue_lock.rs).
        let consuming = process_queue.consuming().lock().await;
        if process_queue.is_dropped() || core.is_stopping() {
            drop(consuming);
            drop(permit);
            process_queue.stop_consuming_if_empty();
            return;
        }
        if core.uses_queue_locks() && !process_queue.is_locked(core.config.orderly_lock_ttl) {
            // Only the holder of the queue's broker lock consumes it; the pull loop re-locks.
            drop(consuming);
            drop(permit);
            tokio::time::sleep(super::queue_lock::LOCK_RETRY_PAUSE).await;
            continue;
        }
        let messages = process_queue.first_messages(core.config.consume_batch_max);
        if messages.is_empty() {
            drop(consuming);
            drop(permit);
            if process_queue.stop_consuming_if_empty() {
                return;
            }
            continue;
        }
        let offsets: Vec<i64> = messages.iter().map(|m| m.queue_offset).collect();
        match call_listener(listener_of(&core.listener), as_originally_sent(messages)).await {
            ConsumeResult::Success => {
                let offset = process_queue.remove(&offsets);
                if !process_queue.is_dropped() {
                    core.offsets.advance(&queue, offset);
                }
                drop(consuming);
                drop(permit);
            }
            ConsumeResult::ReconsumeLater => {
                process_queue.prepare_redelivery(&offsets);
                drop(consuming);
                drop(permit);
                tokio::time::sleep(core.config.orderly_suspend).await;
            }
        }
    }
}
