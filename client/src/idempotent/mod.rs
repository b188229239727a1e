//! Idempotent consumption: a wrapper around a push consumer's listener (concurrent or
//! orderly) so that a message is processed once per group, across redeliveries, broker
//! resends and the group's consumers, by claiming it in a shared store first (the design of
//! the seeds: a Redis "processing"/"done" state per message, a timer extending the claim,
//! `docs/idempotent-consumption.md`).
//!
//! How a listener call goes, per message of the batch, in order:
//! - its claim key `group:topic:<dedup key>` ([`DedupKey`]) is claimed with SET NX and the
//!   processing expiry, state `processing`;
//! - `done` already: the message is acknowledged without calling the listener
//!   (`duplicates_skipped`);
//! - `processing` by another owner: this message and the rest of the batch are left for a
//!   later delivery (`held_elsewhere`; the call answers `ReconsumeLater` after the messages
//!   before it are processed, so an orderly queue keeps its order);
//! - the store fails: [`StoreErrorPolicy`] decides (by default the batch is failed for retry;
//!   it is never skipped).
//!
//! The claimed messages go to the listener in one call, during which a timer extends their
//! claims every `extend_interval`. On `Success` each claim becomes `done` for `done_ttl`
//! (default 1 h); on `ReconsumeLater` (or a panic) the claims are deleted and the push
//! consumer redelivers the messages as usual.
//!
//! Owns: [`Idempotent`] (settings, the claim protocol around one listener call, the
//! counters). Never: talking to a store's server (`store.rs` and its implementations) or to
//! brokers (the push consumer does that with the listener's answer).

mod memory;
#[cfg(feature = "redis")]
mod redis_store;
mod store;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{debug, error, warn};

pub use memory::{MemoryStore, DEFAULT_MEMORY_STORE_MAX_KEYS};
#[cfg(feature = "redis")]
pub use redis_store::{RedisStore, DEFAULT_REDIS_OPERATION_TIMEOUT};
pub use store::{ClaimOutcome, ClaimStore, StoreError, StoreFuture};

use crate::error::{Error, Result};
use crate::message::{check_consumer_group_name, MessageExt, PROPERTY_UNIQUE_ID};
use crate::push::{ConsumeResult, ListenerFuture};

/// Default expiry of a `processing` claim: a consumer that dies mid-processing holds its
/// messages this long at most.
pub const DEFAULT_PROCESSING_TTL: Duration = Duration::from_secs(30);

/// Default expiry of a `done` claim: a redelivery within it is skipped (the seeds' 1 h).
pub const DEFAULT_DONE_TTL: Duration = Duration::from_secs(60 * 60);

/// Longest dedup key, in bytes (the claim key adds the group and topic).
pub const MAX_DEDUP_KEY_BYTES: usize = 1024;

/// Shortest processing expiry allowed: below it, extensions would race store round trips.
pub const MIN_PROCESSING_TTL: Duration = Duration::from_millis(100);

/// Which text of a message identifies it for deduplication.
#[derive(Clone, Default)]
pub enum DedupKey {
    /// The producer's unique id (`UNIQ_KEY`, which retry copies keep). A message without one
    /// (from a producer that sets none) uses its origin id (`ORIGIN_MESSAGE_ID`, set on retry
    /// copies), else its store position, which is not shared by copies.
    #[default]
    UniqueId,
    /// The message's first key (`Message::with_keys`), for producers that resend a business
    /// event as a new message under the same key; a message without keys uses
    /// [`UniqueId`](Self::UniqueId).
    FirstKey,
    /// Any text computed from the message (an order id read from the body, a property).
    /// An empty text, or one over [`MAX_DEDUP_KEY_BYTES`], fails the message for retry.
    Function(Arc<dyn Fn(&MessageExt) -> String + Send + Sync>),
}

impl DedupKey {
    /// [`DedupKey::Function`] from a closure.
    pub fn function(key: impl Fn(&MessageExt) -> String + Send + Sync + 'static) -> Self {
        Self::Function(Arc::new(key))
    }

    fn of(&self, message: &MessageExt) -> String {
        match self {
            Self::UniqueId => unique_id_of(message),
            Self::FirstKey => message
                .keys()
                .first()
                .map_or_else(|| unique_id_of(message), |key| (*key).to_owned()),
            Self::Function(key) => key(message),
        }
    }
}

impl std::fmt::Debug for DedupKey {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UniqueId => formatter.write_str("UniqueId"),
            Self::FirstKey => formatter.write_str("FirstKey"),
            Self::Function(_) => formatter.write_str("Function(..)"),
        }
    }
}

fn unique_id_of(message: &MessageExt) -> String {
    message
        .property(PROPERTY_UNIQUE_ID)
        .or_else(|| message.origin_message_id())
        .map_or_else(|| message.msg_id(), str::to_owned)
}

/// What happens to a message whose claim cannot be made because the store fails (down,
/// unreachable, too slow). Either way the error is logged with the store's address and
/// counted in `store_errors`; the message is never acknowledged unprocessed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum StoreErrorPolicy {
    /// Fail the listener call (`ReconsumeLater`): the push consumer redelivers the messages
    /// later, when the store may be back (default).
    #[default]
    RetryLater,
    /// Process the message without a claim (at-least-once, as without this wrapper, while
    /// the store is down); counted in `processed_unclaimed`.
    ProcessUnclaimed,
}

/// How many messages went which way since the wrapper was built (a snapshot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IdempotentStats {
    /// Messages claimed and handed to the listener.
    pub claimed: u64,
    /// Claimed messages the listener consumed and that were marked `done`.
    pub processed: u64,
    /// Claimed messages the listener failed (or panicked on); their claims were deleted.
    pub failed: u64,
    /// Messages found `done`: acknowledged without calling the listener.
    pub duplicates_skipped: u64,
    /// Messages found `processing` by another owner: left for a later delivery.
    pub held_elsewhere: u64,
    /// Claims found no longer this consumer's when extending or completing them (the claim
    /// expired, and possibly another consumer took the message).
    pub claims_lost: u64,
    /// Store operations that failed (each logged with its error).
    pub store_errors: u64,
    /// Messages processed without a claim under [`StoreErrorPolicy::ProcessUnclaimed`].
    pub processed_unclaimed: u64,
    /// Messages whose [`DedupKey::Function`] gave an empty or too long key (failed for retry).
    pub unusable_keys: u64,
}

#[derive(Default)]
struct Counters {
    claimed: AtomicU64,
    processed: AtomicU64,
    failed: AtomicU64,
    duplicates_skipped: AtomicU64,
    held_elsewhere: AtomicU64,
    claims_lost: AtomicU64,
    store_errors: AtomicU64,
    processed_unclaimed: AtomicU64,
    unusable_keys: AtomicU64,
}

fn bump(counter: &AtomicU64, by: usize) {
    counter.fetch_add(by as u64, Ordering::Relaxed);
}

/// Configures an [`Idempotent`] wrapper.
#[derive(Debug)]
pub struct IdempotentBuilder {
    store: Arc<dyn ClaimStore>,
    group: Option<String>,
    dedup_key: DedupKey,
    processing_ttl: Duration,
    extend_interval: Option<Duration>,
    done_ttl: Duration,
    on_store_error: StoreErrorPolicy,
}

impl std::fmt::Debug for dyn ClaimStore {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(&self.describe())
    }
}

impl IdempotentBuilder {
    /// The consumer group whose consumers share the claims: the push consumer's group.
    /// Required.
    #[must_use]
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Which text identifies a message (default [`DedupKey::UniqueId`]).
    #[must_use]
    pub fn dedup_key(mut self, key: DedupKey) -> Self {
        self.dedup_key = key;
        self
    }

    /// Expiry of a `processing` claim (default 30 s, at least 100 ms): how long the messages
    /// of a consumer that died mid-processing stay claimed. Extended while the listener runs.
    #[must_use]
    pub fn processing_ttl(mut self, ttl: Duration) -> Self {
        self.processing_ttl = ttl;
        self
    }

    /// How often a running listener call's claims are extended (default a third of
    /// `processing_ttl`; must be below it).
    #[must_use]
    pub fn extend_interval(mut self, interval: Duration) -> Self {
        self.extend_interval = Some(interval);
        self
    }

    /// Expiry of a `done` claim (default 1 h): a copy of the message delivered later than
    /// this is processed again.
    #[must_use]
    pub fn done_ttl(mut self, ttl: Duration) -> Self {
        self.done_ttl = ttl;
        self
    }

    /// What a store failure does to a message (default [`StoreErrorPolicy::RetryLater`]).
    #[must_use]
    pub fn on_store_error(mut self, policy: StoreErrorPolicy) -> Self {
        self.on_store_error = policy;
        self
    }

    /// Checks the settings.
    pub fn build(self) -> Result<Idempotent> {
        let group = self.group.ok_or_else(|| {
            Error::Config(
                "idempotent consumption needs the consumer's group; call .group(\"name\")"
                    .to_owned(),
            )
        })?;
        check_consumer_group_name(&group)?;
        if self.processing_ttl < MIN_PROCESSING_TTL {
            return Err(Error::Config(format!(
                "processing_ttl is {} ms, under the minimum of {} ms",
                self.processing_ttl.as_millis(),
                MIN_PROCESSING_TTL.as_millis()
            )));
        }
        let extend_interval = self.extend_interval.unwrap_or(self.processing_ttl / 3);
        if extend_interval.is_zero() || extend_interval >= self.processing_ttl {
            return Err(Error::Config(format!(
                "extend_interval ({} ms) must be positive and below processing_ttl ({} ms)",
                extend_interval.as_millis(),
                self.processing_ttl.as_millis()
            )));
        }
        if self.done_ttl < self.processing_ttl {
            return Err(Error::Config(format!(
                "done_ttl ({} ms) must be at least processing_ttl ({} ms)",
                self.done_ttl.as_millis(),
                self.processing_ttl.as_millis()
            )));
        }
        Ok(Idempotent {
            shared: Arc::new(Shared {
                store: self.store,
                group,
                dedup_key: self.dedup_key,
                processing_ttl: self.processing_ttl,
                extend_interval,
                done_ttl: self.done_ttl,
                on_store_error: self.on_store_error,
                owner_prefix: owner_prefix(),
                next_claim: AtomicU64::new(0),
                counters: Counters::default(),
                last_store_error: Mutex::new(None),
            }),
        })
    }
}

/// A token for this wrapper, unique across processes and hosts in practice: the pid, the
/// start time in ns and the wrapper's address.
fn owner_prefix() -> String {
    static WRAPPERS: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    format!(
        "{:x}-{:x}-{:x}",
        std::process::id(),
        nanos,
        WRAPPERS.fetch_add(1, Ordering::Relaxed)
    )
}

/// Wraps push consumer listeners so that each message is processed once per group (see the
/// module docs). Cheap to clone; clones share the counters.
///
/// ```no_run
/// use shardmq_client::{ConsumeResult, Idempotent, PushConsumer, RedisStore};
///
/// # async fn example() -> shardmq_client::Result<()> {
/// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
/// let idempotent = Idempotent::builder(store).group("order-service").build()?;
/// let consumer = PushConsumer::builder()
///     .namesrv("127.0.0.1:9876")
///     .group("order-service")
///     .subscribe("orders", "*")
///     .listen_concurrently(idempotent.wrap(|messages| async move {
///         // Runs once per message and group, unless it fails.
///         ConsumeResult::Success
///     }))
///     .start()
///     .await?;
/// println!("{:?}", idempotent.stats());
/// # consumer.shutdown().await;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Idempotent {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Idempotent {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shared = &self.shared;
        formatter
            .debug_struct("Idempotent")
            .field("store", &shared.store.describe())
            .field("group", &shared.group)
            .field("dedup_key", &shared.dedup_key)
            .field("processing_ttl", &shared.processing_ttl)
            .field("extend_interval", &shared.extend_interval)
            .field("done_ttl", &shared.done_ttl)
            .field("on_store_error", &shared.on_store_error)
            .finish_non_exhaustive()
    }
}

struct Shared {
    store: Arc<dyn ClaimStore>,
    group: String,
    dedup_key: DedupKey,
    processing_ttl: Duration,
    extend_interval: Duration,
    done_ttl: Duration,
    on_store_error: StoreErrorPolicy,
    owner_prefix: String,
    next_claim: AtomicU64,
    counters: Counters,
    last_store_error: Mutex<Option<String>>,
}

/// One message's claim during a listener call.
struct Held {
    key: String,
    /// `None`: processed without a claim (`StoreErrorPolicy::ProcessUnclaimed`).
    owner: Option<String>,
    is_lost: bool,
}

type BoxedListener = Arc<dyn Fn(Vec<MessageExt>) -> ListenerFuture + Send + Sync>;

impl Idempotent {
    /// A wrapper keeping its claims in `store` (a [`RedisStore`] for consumers in several
    /// processes, a [`MemoryStore`] for one).
    pub fn builder(store: impl ClaimStore) -> IdempotentBuilder {
        Self::builder_shared(Arc::new(store))
    }

    /// [`builder`](Self::builder) for a store shared with other wrappers.
    pub fn builder_shared(store: Arc<dyn ClaimStore>) -> IdempotentBuilder {
        IdempotentBuilder {
            store,
            group: None,
            dedup_key: DedupKey::default(),
            processing_ttl: DEFAULT_PROCESSING_TTL,
            extend_interval: None,
            done_ttl: DEFAULT_DONE_TTL,
            on_store_error: StoreErrorPolicy::default(),
        }
    }

    /// `listener`, wrapped: give the result to
    /// [`listen_concurrently`](crate::PushConsumerBuilder::listen_concurrently) or
    /// [`listen_orderly`](crate::PushConsumerBuilder::listen_orderly).
    pub fn wrap<F, Fut>(
        &self,
        listener: F,
    ) -> impl Fn(Vec<MessageExt>) -> ListenerFuture + Send + Sync + 'static
    where
        F: Fn(Vec<MessageExt>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ConsumeResult> + Send + 'static,
    {
        let listener: BoxedListener =
            Arc::new(move |messages| Box::pin(listener(messages)) as ListenerFuture);
        let shared = Arc::clone(&self.shared);
        move |messages| {
            let shared = Arc::clone(&shared);
            let listener = Arc::clone(&listener);
            Box::pin(async move { shared.consume(&listener, messages).await }) as ListenerFuture
        }
    }

    /// The counters so far.
    #[must_use]
    pub fn stats(&self) -> IdempotentStats {
        let counters = &self.shared.counters;
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        IdempotentStats {
            claimed: read(&counters.claimed),
            processed: read(&counters.processed),
            failed: read(&counters.failed),
            duplicates_skipped: read(&counters.duplicates_skipped),
            held_elsewhere: read(&counters.held_elsewhere),
            claims_lost: read(&counters.claims_lost),
            store_errors: read(&counters.store_errors),
            processed_unclaimed: read(&counters.processed_unclaimed),
            unusable_keys: read(&counters.unusable_keys),
        }
    }

    /// The latest store error's message, if any happened (also logged when it happened).
    #[must_use]
    pub fn last_store_error(&self) -> Option<String> {
        self.shared
            .last_store_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The claim key of `message`: `group:topic:<dedup key>` (the topic the message was
    /// first sent to, also for retry copies).
    pub fn claim_key(&self, message: &MessageExt) -> Result<String> {
        self.shared.claim_key(message)
    }
}

impl Shared {
    fn claim_key(&self, message: &MessageExt) -> Result<String> {
        let key = self.dedup_key.of(message);
        if key.is_empty() || key.len() > MAX_DEDUP_KEY_BYTES {
            return Err(Error::InvalidArgument(format!(
                "the dedup key of message {} is {} bytes; it must be 1..={MAX_DEDUP_KEY_BYTES}",
                message.msg_id(),
                key.len()
            )));
        }
        let topic = message.retry_topic().unwrap_or_else(|| message.topic());
        Ok(format!("{}:{topic}:{key}", self.group))
    }

    fn next_owner(&self) -> String {
        let claim = self.next_claim.fetch_add(1, Ordering::Relaxed);
        format!("{}-{claim:x}", self.owner_prefix)
    }

    fn store_failed(&self, error: &StoreError) {
        bump(&self.counters.store_errors, 1);
        *self
            .last_store_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(error.to_string());
    }

    async fn consume(&self, listener: &BoxedListener, messages: Vec<MessageExt>) -> ConsumeResult {
        let (mut held, batch, mut must_retry) = self.claim_batch(messages).await;
        if batch.is_empty() {
            return if must_retry {
                ConsumeResult::ReconsumeLater
            } else {
                ConsumeResult::Success
            };
        }
        let result = self.call_extending(listener, batch, &mut held).await;
        match result {
            ConsumeResult::Success => self.complete(&mut held).await,
            ConsumeResult::ReconsumeLater => {
                let claimed = held.iter().filter(|claim| claim.owner.is_some()).count();
                bump(&self.counters.failed, claimed);
                self.release(&held).await;
                must_retry = true;
            }
        }
        if must_retry {
            ConsumeResult::ReconsumeLater
        } else {
            ConsumeResult::Success
        }
    }

    /// Claims the batch's messages in order, up to the first one that cannot be processed
    /// now. Returns the claims, the messages for the listener, and whether the call must
    /// answer `ReconsumeLater` (some message was left for later). A store failure under
    /// `RetryLater` releases the claims made and leaves the whole batch for later.
    async fn claim_batch(&self, messages: Vec<MessageExt>) -> (Vec<Held>, Vec<MessageExt>, bool) {
        let mut held = Vec::new();
        let mut batch = Vec::new();
        for message in messages {
            let key = match self.claim_key(&message) {
                Ok(key) => key,
                Err(key_error) => {
                    bump(&self.counters.unusable_keys, 1);
                    error!(group = %self.group, error = %key_error, "message failed for retry");
                    return (held, batch, true);
                }
            };
            let owner = self.next_owner();
            match self.store.claim(&key, &owner, self.processing_ttl).await {
                Ok(ClaimOutcome::Claimed) => {
                    bump(&self.counters.claimed, 1);
                    held.push(Held {
                        key,
                        owner: Some(owner),
                        is_lost: false,
                    });
                    batch.push(message);
                }
                Ok(ClaimOutcome::Done) => {
                    bump(&self.counters.duplicates_skipped, 1);
                    debug!(%key, msg_id = %message.msg_id(), "already processed; skipped");
                }
                Ok(ClaimOutcome::HeldByAnother(holder)) => {
                    bump(&self.counters.held_elsewhere, 1);
                    debug!(%key, %holder, "being processed elsewhere; delivered again later");
                    return (held, batch, true);
                }
                Err(store_error) => {
                    self.store_failed(&store_error);
                    match self.on_store_error {
                        StoreErrorPolicy::RetryLater => {
                            warn!(
                                %key,
                                msg_id = %message.msg_id(),
                                error = %store_error,
                                "cannot claim the message; it fails for retry (on_store_error = RetryLater)"
                            );
                            self.release(&held).await;
                            return (Vec::new(), Vec::new(), true);
                        }
                        StoreErrorPolicy::ProcessUnclaimed => {
                            warn!(
                                %key,
                                msg_id = %message.msg_id(),
                                error = %store_error,
                                "cannot claim the message; processing it unclaimed (on_store_error = ProcessUnclaimed)"
                            );
                            bump(&self.counters.processed_unclaimed, 1);
                            held.push(Held {
                                key,
                                owner: None,
                                is_lost: false,
                            });
                            batch.push(message);
                        }
                    }
                }
            }
        }
        (held, batch, false)
    }

    /// Runs the listener in a task of its own (a panic counts as `ReconsumeLater` and the
    /// claims are still released) while extending the claims every `extend_interval`.
    async fn call_extending(
        &self,
        listener: &BoxedListener,
        batch: Vec<MessageExt>,
        held: &mut [Held],
    ) -> ConsumeResult {
        let future = match std::panic::catch_unwind(AssertUnwindSafe(|| listener(batch))) {
            Ok(future) => future,
            Err(_) => {
                warn!(group = %self.group, "the listener panicked; its messages fail for retry");
                return ConsumeResult::ReconsumeLater;
            }
        };
        let mut call = tokio::spawn(future);
        let first_tick = tokio::time::Instant::now() + self.extend_interval;
        let mut ticks = tokio::time::interval_at(first_tick, self.extend_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                joined = &mut call => {
                    return joined.unwrap_or_else(|panic| {
                        warn!(group = %self.group, %panic, "the listener panicked; its messages fail for retry");
                        ConsumeResult::ReconsumeLater
                    });
                }
                _ = ticks.tick() => self.extend(held).await,
            }
        }
    }

    async fn extend(&self, held: &mut [Held]) {
        for claim in held.iter_mut().filter(|claim| !claim.is_lost) {
            let Some(owner) = &claim.owner else { continue };
            match self
                .store
                .extend(&claim.key, owner, self.processing_ttl)
                .await
            {
                Ok(true) => {}
                Ok(false) => {
                    claim.is_lost = true;
                    bump(&self.counters.claims_lost, 1);
                    warn!(
                        key = %claim.key,
                        "claim lost while the listener runs (it expired); another consumer may process the message too"
                    );
                }
                Err(store_error) => {
                    self.store_failed(&store_error);
                    warn!(
                        key = %claim.key,
                        error = %store_error,
                        "cannot extend the claim; it expires unless a later extension succeeds"
                    );
                }
            }
        }
    }

    async fn complete(&self, held: &mut [Held]) {
        for claim in held.iter_mut() {
            let Some(owner) = &claim.owner else {
                // Unclaimed: recorded as done if the store is back, so copies are skipped.
                let owner = self.next_owner();
                let _ = self.store.complete(&claim.key, &owner, self.done_ttl).await;
                continue;
            };
            match self.store.complete(&claim.key, owner, self.done_ttl).await {
                Ok(true) => bump(&self.counters.processed, 1),
                Ok(false) => {
                    if !claim.is_lost {
                        claim.is_lost = true;
                        bump(&self.counters.claims_lost, 1);
                    }
                    warn!(
                        key = %claim.key,
                        "processed, but another consumer holds the claim now (ours expired); it may process the message too"
                    );
                }
                Err(store_error) => {
                    self.store_failed(&store_error);
                    warn!(
                        key = %claim.key,
                        error = %store_error,
                        "processed, but cannot mark it done; its claim expires and a later copy would be processed again"
                    );
                }
            }
        }
    }

    async fn release(&self, held: &[Held]) {
        for claim in held {
            let Some(owner) = &claim.owner else { continue };
            if let Err(store_error) = self.store.release(&claim.key, owner).await {
                self.store_failed(&store_error);
                warn!(
                    key = %claim.key,
                    error = %store_error,
                    "cannot delete the claim of a failed message; a redelivery waits until it expires"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests;
