//! The bytes of requests a network shard holds, bounded.
//!
//! Each frame is charged in full as soon as its length prefix has arrived (and before more of
//! it is read), and stays charged until its request has been handled. A connection whose next
//! frame does not fit waits, so the shard stops reading from it and TCP pushes back on the
//! client; the bytes it already holds are not touched. Charging at the prefix, rather than as
//! bytes arrive, means a frame that has started is never stuck waiting for room to finish (no
//! deadlock of half-received frames). Buffers still grow only with the bytes that arrive (see
//! `FrameDecoder::decode`), so the budget bounds memory and a declaration alone costs little.
//!
//! Small frames (up to [`SMALL_FRAME_BYTES`]: heartbeats, pulls, commits, most sends) may go
//! over the limit by an eighth of it, so slow senders of large frames that hold the whole budget
//! delay other large frames, never the control plane. A claim larger than the whole budget is
//! granted when nothing else is held (the configuration keeps the budget at least
//! `max_frame_bytes`, so that never happens by default). Held bytes are therefore at most 9/8 of
//! the limit.

use std::cell::Cell;
use std::rc::Rc;

use crate::store::notify::LocalNotify;

/// Frames up to this size may use the allowance over the limit.
pub const SMALL_FRAME_BYTES: usize = 64 << 10;

pub struct ByteBudget {
    /// The network shard, for the gauge.
    shard: usize,
    limit: usize,
    used: Cell<usize>,
    released: LocalNotify,
}

impl ByteBudget {
    pub fn new(shard: usize, limit: usize) -> ByteBudget {
        ByteBudget {
            shard,
            limit,
            used: Cell::new(0),
            released: LocalNotify::default(),
        }
    }

    /// Bytes charged now.
    pub fn used(&self) -> usize {
        self.used.get()
    }

    /// Charges `bytes`, waiting while they do not fit.
    pub async fn acquire(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        loop {
            let used = self.used.get();
            let limit = if bytes <= SMALL_FRAME_BYTES {
                self.limit + self.limit / 8
            } else {
                self.limit
            };
            if used == 0 || used + bytes <= limit {
                self.used.set(used + bytes);
                self.export();
                return;
            }
            self.released.notified().await;
        }
    }

    /// Gives back `bytes` charged before.
    pub fn release(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        self.used.set(self.used.get() - bytes);
        self.export();
        self.released.notify_all();
    }

    fn export(&self) {
        let metrics = crate::metrics::broker();
        crate::metrics::BrokerMetrics::shard_gauge(
            &metrics.request_bytes_held,
            self.shard,
            self.used.get() as i64,
        );
    }
}

/// Bytes charged for one request, given back when it is dropped (its handler finished).
pub struct Claim {
    budget: Rc<ByteBudget>,
    bytes: usize,
}

impl Claim {
    pub fn new(budget: Rc<ByteBudget>, bytes: usize) -> Claim {
        Claim { budget, bytes }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_waits_until_enough_is_released() {
        const K: usize = 1024;
        crate::store::run_local(|| async {
            let budget = Rc::new(ByteBudget::new(0, 1000 * K));
            budget.acquire(600 * K).await;
            let waiting = {
                let budget = budget.clone();
                glommio::spawn_local(async move {
                    budget.acquire(500 * K).await;
                    budget.used()
                })
                .detach()
            };
            futures_lite::future::yield_now().await;
            assert_eq!(budget.used(), 600 * K, "500 more do not fit in 1000");
            budget.acquire(12 * K).await;
            assert_eq!(
                budget.used(),
                612 * K,
                "a small frame may use the allowance"
            );
            budget.release(12 * K);
            drop(Claim::new(budget.clone(), 600 * K));
            assert_eq!(
                waiting.await,
                Some(500 * K),
                "granted once the 600 were released"
            );
            // Larger than the whole budget: granted only when nothing else is held.
            budget.release(500 * K);
            budget.acquire(5000 * K).await;
            assert_eq!(budget.used(), 5000 * K);
        });
    }
}
