//! The claim store: where idempotent consumption records, per dedup key, that a message is
//! being processed (and by whom) or is done.
//!
//! Owns: the [`ClaimStore`] trait every store implements, what a claim attempt can find
//! ([`ClaimOutcome`]), the store's error ([`StoreError`]) and the claim values' text (a state
//! and the owner's token, so that only the owner extends, completes or releases a claim).
//! Never: deciding what a consumer does with a message (`mod.rs`), or talking to a server
//! (`redis_store.rs`).
//!
//! Every operation is atomic in the store: claiming is one SET NX with an expiry; extending,
//! completing and releasing compare the stored owner token with the caller's and act only on
//! a match, in one step.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// A store operation's future.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// The state word of a claim being processed: `processing <owner token>`.
pub(super) const PROCESSING: &str = "processing";

/// The state word of a claim whose message was processed: `done <owner token>`.
pub(super) const DONE: &str = "done";

/// The stored value of a claim in `state` held by `owner`.
pub(super) fn claim_value(state: &str, owner: &str) -> String {
    format!("{state} {owner}")
}

/// What a claim attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The key was free: the caller holds it now, state `processing`, until the expiry.
    Claimed,
    /// The message was processed already (state `done`).
    Done,
    /// Another owner holds the key in state `processing` (the stored value is given, for
    /// logs).
    HeldByAnother(String),
}

impl ClaimOutcome {
    /// Reads a stored claim value: `done …` is [`Done`](Self::Done), anything else is held.
    pub(super) fn of_stored(value: String) -> Self {
        if value.split(' ').next() == Some(DONE) {
            Self::Done
        } else {
            Self::HeldByAnother(value)
        }
    }
}

/// A claim store: Redis ([`RedisStore`](super::RedisStore)) for consumers in several
/// processes, or in memory ([`MemoryStore`](super::MemoryStore)) for one consumer.
///
/// `owner` is a token unique to one claim; a store extends, completes or releases a key only
/// while it holds that token (answering `false` otherwise: the claim was lost).
pub trait ClaimStore: Send + Sync + 'static {
    /// Sets `key` to `processing <owner>` for `ttl` if it is absent (SET NX PX); otherwise
    /// says what holds it.
    fn claim<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> StoreFuture<'a, ClaimOutcome>;

    /// Resets the expiry of `owner`'s `processing` claim to `ttl`; `false` when the key is
    /// no longer `owner`'s.
    fn extend<'a>(&'a self, key: &'a str, owner: &'a str, ttl: Duration) -> StoreFuture<'a, bool>;

    /// Sets `key` to `done <owner>` for `ttl` if `owner` holds it or nobody does (its claim
    /// expired but nobody else took it); `false` when another owner holds it.
    fn complete<'a>(&'a self, key: &'a str, owner: &'a str, ttl: Duration)
        -> StoreFuture<'a, bool>;

    /// Deletes `owner`'s `processing` claim; `false` when the key is no longer `owner`'s.
    fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, bool>;

    /// Where the store is, for logs and errors (`redis://127.0.0.1:6379`, `memory`).
    fn describe(&self) -> String;
}

/// A claim store could not answer.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store could not be reached or refused the operation.
    #[error("claim store {store} unavailable during {operation}: {reason}")]
    Unavailable {
        store: String,
        operation: &'static str,
        reason: String,
    },
    /// No answer within the store's operation timeout.
    #[error("claim store {store} gave no answer to {operation} within {} ms", timeout.as_millis())]
    Timeout {
        store: String,
        operation: &'static str,
        timeout: Duration,
    },
    /// The store answered something a claim store never stores (another program writing
    /// the same keys?).
    #[error("claim store {store} answered {operation} with {answer}, which is not a claim")]
    Unexpected {
        store: String,
        operation: &'static str,
        answer: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_values_read_back_as_their_state() {
        let owner = "host-1-7";
        assert_eq!(
            ClaimOutcome::of_stored(claim_value(DONE, owner)),
            ClaimOutcome::Done
        );
        let processing = claim_value(PROCESSING, owner);
        assert_eq!(
            ClaimOutcome::of_stored(processing.clone()),
            ClaimOutcome::HeldByAnother(processing)
        );
        // A word merely starting with "done" is not the done state.
        assert!(matches!(
            ClaimOutcome::of_stored("doneish x".to_owned()),
            ClaimOutcome::HeldByAnother(_)
        ));
    }
}
