//! Running the listener on pulled messages: concurrently (RocketMQ's
//! ConsumeMessageConcurrentlyService) or one call at a time per queue in offset order
//! (ConsumeMessageOrderlyService).
//!
//! Owns: the bounded worker pool (a semaphore of `consume_threads` permits held for each
//! listener call), turning listener results into offset progress, and local redelivery of
//! `ReconsumeLater` messages after a delay (they stay cached meanwhile, so the offset cannot
//! pass them and nothing is lost). A listener that panics counts as `ReconsumeLater`. Never:
//! pulling or persisting offsets.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use tracing::warn;

use super::process_queue::ProcessQueue;
use super::{ConsumeResult, ConsumerCore, Listener, ListenerFn};
use crate::message::MessageExt;
use crate::route::MessageQueue;

/// Hands newly cached messages of `queue` to the listener.
pub(super) fn dispatch(
    core: &Arc<ConsumerCore>,
    queue: &MessageQueue,
    process_queue: &Arc<ProcessQueue>,
    messages: Vec<MessageExt>,
) {
    match &core.listener {
        Listener::Concurrently(_) => {
            for batch in messages.chunks(core.config.consume_batch_max) {
                tokio::spawn(consume_concurrently(
                    Arc::clone(core),
                    queue.clone(),
                    Arc::clone(process_queue),
                    batch.to_vec(),
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
    match call_listener(listener_of(&core.listener), messages).await {
        ConsumeResult::Success => {
            let offset = process_queue.remove(&offsets);
            if !process_queue.is_dropped() {
                core.offsets.advance(&queue, offset);
            }
        }
        ConsumeResult::ReconsumeLater => {
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
        let messages = process_queue.first_messages(core.config.consume_batch_max);
        if messages.is_empty() {
            drop(permit);
            if process_queue.stop_consuming_if_empty() {
                return;
            }
            continue;
        }
        let offsets: Vec<i64> = messages.iter().map(|m| m.queue_offset).collect();
        match call_listener(listener_of(&core.listener), messages).await {
            ConsumeResult::Success => {
                let offset = process_queue.remove(&offsets);
                if !process_queue.is_dropped() {
                    core.offsets.advance(&queue, offset);
                }
                drop(permit);
            }
            ConsumeResult::ReconsumeLater => {
                process_queue.prepare_redelivery(&offsets);
                drop(permit);
                tokio::time::sleep(core.config.orderly_suspend).await;
            }
        }
    }
}
