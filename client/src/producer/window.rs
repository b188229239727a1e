//! The send window: how many sends a producer has in flight at once (calls, and the bytes of
//! their bodies), and the order of ordered sends to each queue.
//!
//! Owns: [`Window`] and the [`Admission`] a send holds from the moment it is admitted until
//! it ends (its share of the window and, for an ordered send, its turn in its queue's lane).
//! Never: sending (`send.rs`) or choosing queues (`select.rs`).
//!
//! **Why the order holds.** An ordered send is admitted into its queue's lane: under the lane
//! map's lock it takes the end signal of the send admitted to that queue before it and leaves
//! its own in its place. Before it goes on the wire it waits for that signal, which fires when
//! the earlier send has ended: answered (stored), or failed after its last retry, or dropped.
//! So a send to a queue is never written before the previous ordered send to that queue has
//! been answered, whatever the connection, the broker or the retries do; what the broker
//! stores for one queue is in admission order. Lanes hold one signal per queue ever ordered
//! to, so the map is bounded by the topics' queue counts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use crate::error::{Error, Result};
use crate::route::MessageQueue;

/// Default of [`ProducerBuilder::max_sends_in_flight`](super::ProducerBuilder::max_sends_in_flight).
pub const DEFAULT_MAX_SENDS_IN_FLIGHT: usize = 1024;

/// Default of [`ProducerBuilder::max_bytes_in_flight`](super::ProducerBuilder::max_bytes_in_flight):
/// 64 MiB of bodies.
pub const DEFAULT_MAX_BYTES_IN_FLIGHT: usize = 64 << 20;

/// The producer's window; see the module documentation.
pub(super) struct Window {
    calls: Arc<Semaphore>,
    bytes: Arc<Semaphore>,
    max_bytes: usize,
    /// Per queue, the end signal of the ordered send admitted to it last.
    lanes: Mutex<HashMap<MessageQueue, oneshot::Receiver<()>>>,
}

/// A send's place in the window, held until the send ends (dropping it is ending it).
pub(super) struct Admission {
    _call: OwnedSemaphorePermit,
    _bytes: Option<OwnedSemaphorePermit>,
    /// Fires (or closes) when the ordered send admitted to the same queue before this one has
    /// ended.
    after: Option<oneshot::Receiver<()>>,
    /// Dropped when this send ends, which lets the next ordered send to its queue go.
    _ends: Option<oneshot::Sender<()>>,
}

impl Admission {
    /// Waits until an ordered send's predecessor in its queue has ended (at once for others).
    /// Cancellation-safe: waiting again waits for the same predecessor.
    pub(super) async fn wait_for_turn(&mut self) {
        if let Some(after) = &mut self.after {
            // An error only says the predecessor ended without sending the signal (it never
            // does): either way it has ended.
            let _ = after.await;
            self.after = None;
        }
    }
}

impl Window {
    /// A window of `max_sends` calls and `max_bytes` body bytes (both at least 1).
    pub(super) fn new(max_sends: usize, max_bytes: usize) -> Self {
        debug_assert!(max_sends > 0 && max_bytes > 0);
        let max_bytes = max_bytes.min(u32::MAX as usize);
        Self {
            calls: Arc::new(Semaphore::new(max_sends.min(Semaphore::MAX_PERMITS))),
            bytes: Arc::new(Semaphore::new(max_bytes)),
            max_bytes,
            lanes: Mutex::new(HashMap::new()),
        }
    }

    /// Admits a send of `body_bytes` (waiting while the window is full; a send larger than the
    /// whole window takes all of it), into `queue`'s lane when it is an ordered send. Sends
    /// wait in the order they asked.
    pub(super) async fn admit(
        &self,
        body_bytes: usize,
        ordered_queue: Option<&MessageQueue>,
    ) -> Result<Admission> {
        let call = Arc::clone(&self.calls)
            .acquire_owned()
            .await
            .map_err(|_| Error::ShutDown)?;
        let share = body_bytes.min(self.max_bytes) as u32;
        let bytes = if share == 0 {
            None
        } else {
            Some(
                Arc::clone(&self.bytes)
                    .acquire_many_owned(share)
                    .await
                    .map_err(|_| Error::ShutDown)?,
            )
        };
        let (after, ends) = match ordered_queue {
            Some(queue) => {
                let (ends, ended) = oneshot::channel();
                let after = self
                    .lanes
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(queue.clone(), ended);
                (after, Some(ends))
            }
            None => (None, None),
        };
        Ok(Admission {
            _call: call,
            _bytes: bytes,
            after,
            _ends: ends,
        })
    }

    /// Refuses every admission from now on, those waiting included ([`Error::ShutDown`]).
    pub(super) fn close(&self) {
        self.calls.close();
        self.bytes.close();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn queue(id: u32) -> MessageQueue {
        MessageQueue::new("t", "b", id)
    }

    #[tokio::test]
    async fn calls_and_bytes_are_bounded() {
        let window = Window::new(2, 100);
        let first = window.admit(60, None).await.unwrap();
        // 60 + 60 bytes do not fit: the second waits until the first ends.
        let waiting = tokio::time::timeout(Duration::ZERO, window.admit(60, None));
        assert!(waiting.await.is_err());
        drop(first);
        let second = window.admit(60, None).await.unwrap();
        let third = window.admit(10, None).await.unwrap();
        // Two calls in flight: a third waits however small.
        let waiting = tokio::time::timeout(Duration::ZERO, window.admit(1, None));
        assert!(waiting.await.is_err());
        drop((second, third));
        // Larger than the whole window: admitted alone.
        let huge = window.admit(1000, None).await.unwrap();
        let waiting = tokio::time::timeout(Duration::ZERO, window.admit(1, None));
        assert!(waiting.await.is_err());
        drop(huge);
        window.close();
        assert!(matches!(window.admit(1, None).await, Err(Error::ShutDown)));
    }

    /// Whether the admission's turn has come (polled once: a waiting one is not ready).
    async fn has_turn(admission: &mut Admission) -> bool {
        tokio::time::timeout(Duration::ZERO, admission.wait_for_turn())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn an_ordered_send_waits_for_the_one_before_it_in_its_queue() {
        let window = Window::new(10, 1000);
        let mut first = window.admit(1, Some(&queue(0))).await.unwrap();
        let mut other_queue = window.admit(1, Some(&queue(1))).await.unwrap();
        let mut unordered = window.admit(1, None).await.unwrap();
        let mut second = window.admit(1, Some(&queue(0))).await.unwrap();
        let mut third = window.admit(1, Some(&queue(0))).await.unwrap();
        first.wait_for_turn().await;
        other_queue.wait_for_turn().await;
        unordered.wait_for_turn().await;
        assert!(!has_turn(&mut second).await, "second waits for first");
        assert!(!has_turn(&mut third).await, "third waits for second");
        drop(first);
        assert!(has_turn(&mut second).await);
        assert!(!has_turn(&mut third).await, "third still waits for second");
        drop(second);
        assert!(has_turn(&mut third).await);
    }
}
