//! Parked pulls: long-poll waiters of one network shard, per (topic, queue).
//!
//! Owns the waiter lists and their limit. A parked pull costs a waker and nothing else: it is
//! woken by an arrival event from the queue's storage shard or by its own timeout, never by
//! polling.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use crate::store::notify::LocalNotify;

#[derive(Default)]
pub struct Parking {
    queues: RefCell<HashMap<String, HashMap<u32, Rc<LocalNotify>>>>,
    parked: Cell<usize>,
    /// The owning network shard, for the `parked_pulls` metric.
    pub network_shard: Cell<usize>,
}

/// Holds a parked slot; releases it when dropped.
pub struct ParkedSlot<'a> {
    parking: &'a Parking,
    pub notify: Rc<LocalNotify>,
}

impl Drop for ParkedSlot<'_> {
    fn drop(&mut self) {
        self.parking.parked.set(self.parking.parked.get() - 1);
        crate::metrics::broker().parked_changed(self.parking.network_shard.get(), -1);
    }
}

impl Parking {
    /// A slot to wait on for (topic, queue), or `None` when `limit` pulls are already parked.
    pub fn park(&self, topic: &str, queue_id: u32, limit: usize) -> Option<ParkedSlot<'_>> {
        if self.parked.get() >= limit {
            return None;
        }
        self.parked.set(self.parked.get() + 1);
        crate::metrics::broker().parked_changed(self.network_shard.get(), 1);
        let notify = self
            .queues
            .borrow_mut()
            .entry(topic.to_owned())
            .or_default()
            .entry(queue_id)
            .or_default()
            .clone();
        Some(ParkedSlot {
            parking: self,
            notify,
        })
    }

    /// Wakes every pull parked on (topic, queue).
    pub fn wake(&self, topic: &str, queue_id: u32) {
        let notify = {
            let mut queues = self.queues.borrow_mut();
            let Some(by_queue) = queues.get_mut(topic) else {
                return;
            };
            let notify = by_queue.remove(&queue_id);
            if by_queue.is_empty() {
                queues.remove(topic);
            }
            notify
        };
        if let Some(notify) = notify {
            notify.notify_all();
        }
    }

    /// Wakes every parked pull (the broker is stopping: each answers at once).
    pub fn wake_all(&self) {
        let queues = std::mem::take(&mut *self.queues.borrow_mut());
        for notify in queues.into_values().flat_map(|q| q.into_values()) {
            notify.notify_all();
        }
    }

    /// Pulls parked right now.
    pub fn parked(&self) -> usize {
        self.parked.get()
    }
}
