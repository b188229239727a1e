//! The in-process claim store: for a single consumer (one process) that wants redeliveries to
//! its own listener deduplicated without a Redis. Claims live in this process only: they are
//! lost when it exits and another process never sees them.
//!
//! Owns: [`MemoryStore`] (a map of key → claim value and expiry behind a mutex, expired entries
//! swept as it goes, bounded by `max_keys`). Never: anything across processes.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::store::{
    claim_value, ClaimOutcome, ClaimStore, StoreError, StoreFuture, DONE, PROCESSING,
};

/// Default most live keys a [`MemoryStore`] holds (about 100 MB of claims at 100 bytes each).
pub const DEFAULT_MEMORY_STORE_MAX_KEYS: usize = 1_000_000;

/// How many claims between sweeps of expired keys.
const SWEEP_EVERY_CLAIMS: u64 = 1024;

struct Entry {
    value: String,
    expires_at: Instant,
}

#[derive(Default)]
struct Claims {
    entries: HashMap<String, Entry>,
    claims_since_sweep: u64,
}

impl Claims {
    /// The live value of `key` (an expired one is removed).
    fn live(&mut self, key: &str, now: Instant) -> Option<&mut Entry> {
        if self.entries.get(key).is_some_and(|e| e.expires_at <= now) {
            self.entries.remove(key);
        }
        self.entries.get_mut(key)
    }

    fn sweep(&mut self, now: Instant) {
        self.entries.retain(|_, entry| entry.expires_at > now);
        self.claims_since_sweep = 0;
    }
}

/// Claims in this process's memory (see the module docs: one consumer only).
pub struct MemoryStore {
    claims: Mutex<Claims>,
    max_keys: usize,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("MemoryStore")
            .field("keys", &self.lock().entries.len())
            .field("max_keys", &self.max_keys)
            .finish()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A store of at most [`DEFAULT_MEMORY_STORE_MAX_KEYS`] live keys.
    #[must_use]
    pub fn new() -> Self {
        Self::with_max_keys(DEFAULT_MEMORY_STORE_MAX_KEYS)
    }

    /// A store of at most `max_keys` live keys: a claim beyond them (after expired keys are
    /// swept) fails with [`StoreError::Unavailable`], so the message is retried later rather
    /// than processed unguarded.
    #[must_use]
    pub fn with_max_keys(max_keys: usize) -> Self {
        Self {
            claims: Mutex::new(Claims::default()),
            max_keys: max_keys.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Claims> {
        self.claims
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn claim_now(&self, key: &str, owner: &str, ttl: Duration) -> Result<ClaimOutcome, StoreError> {
        let now = Instant::now();
        let mut claims = self.lock();
        claims.claims_since_sweep += 1;
        if claims.claims_since_sweep >= SWEEP_EVERY_CLAIMS {
            claims.sweep(now);
        }
        if let Some(entry) = claims.live(key, now) {
            return Ok(ClaimOutcome::of_stored(entry.value.clone()));
        }
        if claims.entries.len() >= self.max_keys {
            claims.sweep(now);
            if claims.entries.len() >= self.max_keys {
                return Err(StoreError::Unavailable {
                    store: self.describe(),
                    operation: "claim",
                    reason: format!("the store holds max_keys ({}) live claims", self.max_keys),
                });
            }
        }
        claims.entries.insert(
            key.to_owned(),
            Entry {
                value: claim_value(PROCESSING, owner),
                expires_at: now + ttl,
            },
        );
        Ok(ClaimOutcome::Claimed)
    }

    /// Runs `change` on `key`'s live entry if it is `owner`'s `processing` claim.
    fn if_owned(&self, key: &str, owner: &str, change: impl FnOnce(&mut Claims, Instant)) -> bool {
        let now = Instant::now();
        let mut claims = self.lock();
        let processing = claim_value(PROCESSING, owner);
        let is_owned = claims.live(key, now).is_some_and(|e| e.value == processing);
        if is_owned {
            change(&mut claims, now);
        }
        is_owned
    }
}

impl ClaimStore for MemoryStore {
    fn claim<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> StoreFuture<'a, ClaimOutcome> {
        let outcome = self.claim_now(key, owner, ttl);
        Box::pin(async move { outcome })
    }

    fn extend<'a>(&'a self, key: &'a str, owner: &'a str, ttl: Duration) -> StoreFuture<'a, bool> {
        let extended = self.if_owned(key, owner, |claims, now| {
            if let Some(entry) = claims.entries.get_mut(key) {
                entry.expires_at = now + ttl;
            }
        });
        Box::pin(async move { Ok(extended) })
    }

    fn complete<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        let now = Instant::now();
        let mut claims = self.lock();
        let processing = claim_value(PROCESSING, owner);
        let is_ours_or_free =
            !matches!(claims.live(key, now), Some(entry) if entry.value != processing);
        if is_ours_or_free {
            claims.entries.insert(
                key.to_owned(),
                Entry {
                    value: claim_value(DONE, owner),
                    expires_at: now + ttl,
                },
            );
        }
        drop(claims);
        Box::pin(async move { Ok(is_ours_or_free) })
    }

    fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, bool> {
        let released = self.if_owned(key, owner, |claims, _| {
            claims.entries.remove(key);
        });
        Box::pin(async move { Ok(released) })
    }

    fn describe(&self) -> String {
        "memory".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(60);

    #[tokio::test]
    async fn a_claim_excludes_others_until_released_and_done_is_final() {
        let store = MemoryStore::new();
        assert_eq!(
            store.claim("k", "a", TTL).await.unwrap(),
            ClaimOutcome::Claimed
        );
        assert!(matches!(
            store.claim("k", "b", TTL).await.unwrap(),
            ClaimOutcome::HeldByAnother(value) if value == "processing a"
        ));
        // Only the owner extends, releases or completes.
        assert!(!store.extend("k", "b", TTL).await.unwrap());
        assert!(!store.release("k", "b").await.unwrap());
        assert!(!store.complete("k", "b", TTL).await.unwrap());
        assert!(store.extend("k", "a", TTL).await.unwrap());
        assert!(store.release("k", "a").await.unwrap());
        assert_eq!(
            store.claim("k", "b", TTL).await.unwrap(),
            ClaimOutcome::Claimed
        );
        assert!(store.complete("k", "b", TTL).await.unwrap());
        assert_eq!(
            store.claim("k", "c", TTL).await.unwrap(),
            ClaimOutcome::Done
        );
        // A done claim is no longer "processing": its owner cannot release it.
        assert!(!store.release("k", "b").await.unwrap());
    }

    #[tokio::test]
    async fn an_expired_claim_is_free_and_its_owner_has_lost_it() {
        let store = MemoryStore::new();
        let short = Duration::from_millis(20);
        assert_eq!(
            store.claim("k", "a", short).await.unwrap(),
            ClaimOutcome::Claimed
        );
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert!(!store.extend("k", "a", TTL).await.unwrap());
        // Nobody holds it: the late owner may still record that it is done.
        assert!(store.complete("k", "a", TTL).await.unwrap());
        assert_eq!(
            store.claim("k", "b", TTL).await.unwrap(),
            ClaimOutcome::Done
        );
    }

    #[tokio::test]
    async fn a_full_store_refuses_a_claim_with_an_error_naming_the_limit() {
        let store = MemoryStore::with_max_keys(2);
        store.claim("a", "o", TTL).await.unwrap();
        store.claim("b", "o", TTL).await.unwrap();
        let error = store.claim("c", "o", TTL).await.unwrap_err().to_string();
        assert!(error.contains("max_keys (2)"), "{error}");
        // An expired key makes room.
        let store = MemoryStore::with_max_keys(1);
        store
            .claim("a", "o", Duration::from_millis(10))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            store.claim("b", "o", TTL).await.unwrap(),
            ClaimOutcome::Claimed
        );
    }
}
