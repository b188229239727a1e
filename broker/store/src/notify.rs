//! A single-threaded "something changed" signal for tasks on one glommio executor.
//!
//! Owns a list of wakers and a generation counter; `notify_all` bumps the generation and wakes
//! every waiter. Waiters re-check their own condition after waking, so spurious wake-ups are
//! harmless. It must never be shared across threads (it is `!Send` by construction).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

#[derive(Default)]
pub struct LocalNotify {
    generation: Cell<u64>,
    wakers: RefCell<Vec<Waker>>,
}

impl LocalNotify {
    pub fn notify_all(&self) {
        self.generation.set(self.generation.get().wrapping_add(1));
        let wakers = std::mem::take(&mut *self.wakers.borrow_mut());
        for waker in wakers {
            waker.wake();
        }
    }

    /// Completes at the next `notify_all` after this call.
    pub fn notified(&self) -> Notified<'_> {
        Notified {
            notify: self,
            generation: self.generation.get(),
        }
    }
}

pub struct Notified<'a> {
    notify: &'a LocalNotify,
    generation: u64,
}

impl Future for Notified<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.notify.generation.get() != self.generation {
            return Poll::Ready(());
        }
        let mut wakers = self.notify.wakers.borrow_mut();
        if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
            wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}
