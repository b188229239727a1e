//! The claim protocol around listener calls, with the in-process store (and stores that fail
//! or lose claims on purpose): duplicates skipped, failures released for retry, messages held
//! elsewhere left for later, claims extended while the listener runs, store errors never
//! skipping a message, batches processed up to the first message held elsewhere.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::*;
use crate::message::{NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR};

const TOPIC: &str = "orders";
const GROUP: &str = "order-service";

/// A message of [`TOPIC`] with `properties` as stored.
fn message(properties: &[(&str, &str)], queue_offset: i64) -> MessageExt {
    let mut stored = String::new();
    for (name, value) in properties {
        stored.push_str(name);
        stored.push(NAME_VALUE_SEPARATOR);
        stored.push_str(value);
        stored.push(PROPERTY_SEPARATOR);
    }
    MessageExt {
        topic: Bytes::from_static(TOPIC.as_bytes()),
        broker_name: Arc::from("broker-a"),
        queue_id: 0,
        queue_offset,
        commit_log_offset: queue_offset * 100,
        flag: 0,
        sys_flag: 0,
        born_timestamp_ms: 0,
        born_host: "127.0.0.1:1".parse().unwrap(),
        store_timestamp_ms: 0,
        store_host: "127.0.0.1:2".parse().unwrap(),
        reconsume_times: 0,
        properties: Bytes::from(stored),
        body: Bytes::from_static(b"body"),
    }
}

fn with_id(unique_id: &str, queue_offset: i64) -> MessageExt {
    message(&[(PROPERTY_UNIQUE_ID, unique_id)], queue_offset)
}

/// A listener that counts its calls per message id and answers `result`.
#[derive(Clone, Default)]
struct Recorder {
    calls: Arc<Mutex<Vec<String>>>,
}

impl Recorder {
    fn listener(
        &self,
        result: ConsumeResult,
    ) -> impl Fn(Vec<MessageExt>) -> std::future::Ready<ConsumeResult> + Send + Sync + 'static {
        let calls = Arc::clone(&self.calls);
        move |messages| {
            calls
                .lock()
                .unwrap()
                .extend(messages.iter().map(MessageExt::msg_id));
            std::future::ready(result)
        }
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

fn wrapper(store: Arc<dyn ClaimStore>) -> Idempotent {
    Idempotent::builder_shared(store)
        .group(GROUP)
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_second_delivery_of_a_processed_message_is_acknowledged_without_the_listener() {
    let idempotent = wrapper(Arc::new(MemoryStore::new()));
    let recorder = Recorder::default();
    let listener = idempotent.wrap(recorder.listener(ConsumeResult::Success));
    assert_eq!(
        listener(vec![with_id("A1", 0)]).await,
        ConsumeResult::Success
    );
    // The broker resent it: another offset, the same unique id.
    assert_eq!(
        listener(vec![with_id("A1", 7)]).await,
        ConsumeResult::Success
    );
    assert_eq!(recorder.calls(), ["A1"]);
    let stats = idempotent.stats();
    assert_eq!(
        (stats.claimed, stats.processed, stats.duplicates_skipped),
        (1, 1, 1)
    );
}

#[tokio::test]
async fn a_failed_message_is_released_and_processed_at_its_redelivery() {
    let store: Arc<dyn ClaimStore> = Arc::new(MemoryStore::new());
    let idempotent = wrapper(Arc::clone(&store));
    let recorder = Recorder::default();
    let failing = idempotent.wrap(recorder.listener(ConsumeResult::ReconsumeLater));
    assert_eq!(
        failing(vec![with_id("B1", 0)]).await,
        ConsumeResult::ReconsumeLater
    );
    // Nothing holds the key any more.
    let key = format!("{GROUP}:{TOPIC}:B1");
    assert_eq!(
        store
            .claim(&key, "probe", DEFAULT_PROCESSING_TTL)
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    assert!(store.release(&key, "probe").await.unwrap());
    let succeeding = idempotent.wrap(recorder.listener(ConsumeResult::Success));
    assert_eq!(
        succeeding(vec![with_id("B1", 0)]).await,
        ConsumeResult::Success
    );
    assert_eq!(recorder.calls(), ["B1", "B1"]);
    let stats = idempotent.stats();
    assert_eq!((stats.failed, stats.processed), (1, 1));
}

#[tokio::test]
async fn a_message_processing_elsewhere_is_left_for_later() {
    let store: Arc<dyn ClaimStore> = Arc::new(MemoryStore::new());
    let key = format!("{GROUP}:{TOPIC}:C1");
    assert_eq!(
        store
            .claim(&key, "other", DEFAULT_PROCESSING_TTL)
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    let idempotent = wrapper(Arc::clone(&store));
    let recorder = Recorder::default();
    let listener = idempotent.wrap(recorder.listener(ConsumeResult::Success));
    assert_eq!(
        listener(vec![with_id("C1", 0)]).await,
        ConsumeResult::ReconsumeLater
    );
    assert!(recorder.calls().is_empty());
    assert_eq!(idempotent.stats().held_elsewhere, 1);
    // The other consumer finishes: the redelivery is skipped.
    assert!(store
        .complete(&key, "other", DEFAULT_DONE_TTL)
        .await
        .unwrap());
    assert_eq!(
        listener(vec![with_id("C1", 0)]).await,
        ConsumeResult::Success
    );
    assert!(recorder.calls().is_empty());
    assert_eq!(idempotent.stats().duplicates_skipped, 1);
}

#[tokio::test]
async fn a_long_call_keeps_its_claim_past_the_processing_ttl() {
    let idempotent = Idempotent::builder(MemoryStore::new())
        .group(GROUP)
        .processing_ttl(Duration::from_millis(150))
        .extend_interval(Duration::from_millis(40))
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let listener = Arc::new(idempotent.wrap(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
        async {
            tokio::time::sleep(Duration::from_millis(600)).await;
            ConsumeResult::Success
        }
    }));
    let first = tokio::spawn({
        let listener = Arc::clone(&listener);
        async move { listener(vec![with_id("D1", 0)]).await }
    });
    // Four processing TTLs later the first call still holds the message.
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(
        listener(vec![with_id("D1", 0)]).await,
        ConsumeResult::ReconsumeLater
    );
    assert_eq!(first.await.unwrap(), ConsumeResult::Success);
    assert_eq!(
        listener(vec![with_id("D1", 0)]).await,
        ConsumeResult::Success
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let stats = idempotent.stats();
    assert_eq!(
        (
            stats.held_elsewhere,
            stats.duplicates_skipped,
            stats.claims_lost
        ),
        (1, 1, 0)
    );
}

#[tokio::test]
async fn a_panicking_listener_releases_its_claim() {
    let idempotent = wrapper(Arc::new(MemoryStore::new()));
    let panics = idempotent.wrap(|_| async { panic!("a listener bug") });
    assert_eq!(
        panics(vec![with_id("E1", 0)]).await,
        ConsumeResult::ReconsumeLater
    );
    let recorder = Recorder::default();
    let works = idempotent.wrap(recorder.listener(ConsumeResult::Success));
    assert_eq!(works(vec![with_id("E1", 0)]).await, ConsumeResult::Success);
    assert_eq!(recorder.calls(), ["E1"]);
    assert_eq!(idempotent.stats().failed, 1);
}

/// A store whose every operation fails, as a Redis that is down does.
struct DownStore;

impl ClaimStore for DownStore {
    fn claim<'a>(&'a self, _: &'a str, _: &'a str, _: Duration) -> StoreFuture<'a, ClaimOutcome> {
        Box::pin(async { Err(down("claim")) })
    }
    fn extend<'a>(&'a self, _: &'a str, _: &'a str, _: Duration) -> StoreFuture<'a, bool> {
        Box::pin(async { Err(down("extend")) })
    }
    fn complete<'a>(&'a self, _: &'a str, _: &'a str, _: Duration) -> StoreFuture<'a, bool> {
        Box::pin(async { Err(down("complete")) })
    }
    fn release<'a>(&'a self, _: &'a str, _: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(async { Err(down("release")) })
    }
    fn describe(&self) -> String {
        "down-store".to_owned()
    }
}

fn down(operation: &'static str) -> StoreError {
    StoreError::Unavailable {
        store: "down-store".to_owned(),
        operation,
        reason: "connection refused".to_owned(),
    }
}

#[tokio::test]
async fn a_store_that_is_down_fails_the_message_for_retry_by_default() {
    let idempotent = wrapper(Arc::new(DownStore));
    let recorder = Recorder::default();
    let listener = idempotent.wrap(recorder.listener(ConsumeResult::Success));
    assert_eq!(
        listener(vec![with_id("F1", 0)]).await,
        ConsumeResult::ReconsumeLater
    );
    assert!(recorder.calls().is_empty());
    assert_eq!(idempotent.stats().store_errors, 1);
    let error = idempotent.last_store_error().unwrap();
    assert!(
        error.contains("down-store") && error.contains("connection refused"),
        "{error}"
    );
}

#[tokio::test]
async fn process_unclaimed_consumes_while_the_store_is_down() {
    let idempotent = Idempotent::builder(DownStore)
        .group(GROUP)
        .on_store_error(StoreErrorPolicy::ProcessUnclaimed)
        .build()
        .unwrap();
    let recorder = Recorder::default();
    let listener = idempotent.wrap(recorder.listener(ConsumeResult::Success));
    assert_eq!(
        listener(vec![with_id("G1", 0)]).await,
        ConsumeResult::Success
    );
    assert_eq!(recorder.calls(), ["G1"]);
    let stats = idempotent.stats();
    assert_eq!((stats.processed_unclaimed, stats.processed), (1, 0));
}

#[tokio::test]
async fn a_batch_is_processed_up_to_the_first_message_held_elsewhere() {
    let store: Arc<dyn ClaimStore> = Arc::new(MemoryStore::new());
    let done = format!("{GROUP}:{TOPIC}:H1");
    store
        .claim(&done, "other", DEFAULT_PROCESSING_TTL)
        .await
        .unwrap();
    store
        .complete(&done, "other", DEFAULT_DONE_TTL)
        .await
        .unwrap();
    let held = format!("{GROUP}:{TOPIC}:H3");
    store
        .claim(&held, "other", DEFAULT_PROCESSING_TTL)
        .await
        .unwrap();
    let idempotent = wrapper(Arc::clone(&store));
    let recorder = Recorder::default();
    let listener = idempotent.wrap(recorder.listener(ConsumeResult::Success));
    let batch = vec![
        with_id("H1", 0),
        with_id("H2", 1),
        with_id("H3", 2),
        with_id("H4", 3),
    ];
    // H1 is done, H2 is processed, H3 is held elsewhere: H4 waits behind it (orderly queues
    // keep their order) and the batch comes again.
    assert_eq!(listener(batch.clone()).await, ConsumeResult::ReconsumeLater);
    assert_eq!(recorder.calls(), ["H2"]);
    assert!(store
        .complete(&held, "other", DEFAULT_DONE_TTL)
        .await
        .unwrap());
    assert_eq!(listener(batch).await, ConsumeResult::Success);
    assert_eq!(recorder.calls(), ["H2", "H4"]);
    assert_eq!(idempotent.stats().duplicates_skipped, 4);
}

#[tokio::test]
async fn the_dedup_key_is_the_unique_id_a_key_or_a_function() {
    let store: Arc<dyn ClaimStore> = Arc::new(MemoryStore::new());
    let keyed = message(&[(PROPERTY_UNIQUE_ID, "U1"), ("KEYS", "order-9 other")], 0);
    let unique = wrapper(Arc::clone(&store));
    assert_eq!(unique.claim_key(&keyed).unwrap(), "order-service:orders:U1");
    let by_key = Idempotent::builder_shared(Arc::clone(&store))
        .group(GROUP)
        .dedup_key(DedupKey::FirstKey)
        .build()
        .unwrap();
    assert_eq!(
        by_key.claim_key(&keyed).unwrap(),
        "order-service:orders:order-9"
    );
    // No key: the unique id.
    assert_eq!(
        by_key.claim_key(&with_id("U2", 0)).unwrap(),
        "order-service:orders:U2"
    );
    let by_body = Idempotent::builder_shared(Arc::clone(&store))
        .group(GROUP)
        .dedup_key(DedupKey::function(|message| {
            String::from_utf8_lossy(&message.body).into_owned()
        }))
        .build()
        .unwrap();
    assert_eq!(
        by_body.claim_key(&keyed).unwrap(),
        "order-service:orders:body"
    );
    // A retry copy is claimed under the topic it was first sent to.
    let retry_copy = message(&[(PROPERTY_UNIQUE_ID, "U1"), ("RETRY_TOPIC", TOPIC)], 0);
    let mut retry_copy = retry_copy;
    retry_copy.set_topic("%RETRY%order-service");
    assert_eq!(
        unique.claim_key(&retry_copy).unwrap(),
        "order-service:orders:U1"
    );

    // Two messages with one key: processed once.
    let recorder = Recorder::default();
    let listener = by_key.wrap(recorder.listener(ConsumeResult::Success));
    let first = message(&[(PROPERTY_UNIQUE_ID, "V1"), ("KEYS", "order-10")], 0);
    let resent = message(&[(PROPERTY_UNIQUE_ID, "V2"), ("KEYS", "order-10")], 1);
    assert_eq!(listener(vec![first]).await, ConsumeResult::Success);
    assert_eq!(listener(vec![resent]).await, ConsumeResult::Success);
    assert_eq!(recorder.calls(), ["V1"]);
}

#[tokio::test]
async fn an_empty_dedup_key_fails_the_message_with_a_clear_error() {
    let idempotent = Idempotent::builder(MemoryStore::new())
        .group(GROUP)
        .dedup_key(DedupKey::function(|_| String::new()))
        .build()
        .unwrap();
    let error = idempotent
        .claim_key(&with_id("K1", 0))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("dedup key of message K1 is 0 bytes"),
        "{error}"
    );
    let recorder = Recorder::default();
    let listener = idempotent.wrap(recorder.listener(ConsumeResult::Success));
    assert_eq!(
        listener(vec![with_id("K1", 0)]).await,
        ConsumeResult::ReconsumeLater
    );
    assert!(recorder.calls().is_empty());
    assert_eq!(idempotent.stats().unusable_keys, 1);
}

/// The in-process store, but every extension finds the claim gone (as when it expired).
struct LosingStore(MemoryStore);

impl ClaimStore for LosingStore {
    fn claim<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> StoreFuture<'a, ClaimOutcome> {
        self.0.claim(key, owner, ttl)
    }
    fn extend<'a>(&'a self, _: &'a str, _: &'a str, _: Duration) -> StoreFuture<'a, bool> {
        Box::pin(async { Ok(false) })
    }
    fn complete<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        self.0.complete(key, owner, ttl)
    }
    fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, bool> {
        self.0.release(key, owner)
    }
    fn describe(&self) -> String {
        "losing".to_owned()
    }
}

#[tokio::test]
async fn a_lost_claim_is_counted_once() {
    let store = Arc::new(LosingStore(MemoryStore::new()));
    let idempotent = Idempotent::builder_shared(Arc::clone(&store) as Arc<dyn ClaimStore>)
        .group(GROUP)
        .processing_ttl(Duration::from_millis(100))
        .extend_interval(Duration::from_millis(30))
        .build()
        .unwrap();
    let key = format!("{GROUP}:{TOPIC}:L1");
    let thief = Arc::clone(&store);
    let listener = idempotent.wrap(move |_| {
        let thief = Arc::clone(&thief);
        let key = key.clone();
        async move {
            // The claim expires unextended and another consumer takes the message.
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert_eq!(
                thief
                    .claim(&key, "thief", Duration::from_secs(60))
                    .await
                    .unwrap(),
                ClaimOutcome::Claimed
            );
            ConsumeResult::Success
        }
    });
    assert_eq!(
        listener(vec![with_id("L1", 0)]).await,
        ConsumeResult::Success
    );
    let stats = idempotent.stats();
    assert_eq!((stats.claims_lost, stats.processed), (1, 0));
}

#[test]
fn the_builder_says_what_is_wrong() {
    let error = Idempotent::builder(MemoryStore::new())
        .build()
        .unwrap_err()
        .to_string();
    assert!(error.contains(".group("), "{error}");
    let error = Idempotent::builder(MemoryStore::new())
        .group(GROUP)
        .processing_ttl(Duration::from_millis(10))
        .build()
        .unwrap_err()
        .to_string();
    assert!(error.contains("processing_ttl is 10 ms"), "{error}");
    let error = Idempotent::builder(MemoryStore::new())
        .group(GROUP)
        .processing_ttl(Duration::from_secs(1))
        .extend_interval(Duration::from_secs(1))
        .build()
        .unwrap_err()
        .to_string();
    assert!(error.contains("extend_interval (1000 ms)"), "{error}");
    let error = Idempotent::builder(MemoryStore::new())
        .group(GROUP)
        .done_ttl(Duration::from_secs(1))
        .build()
        .unwrap_err()
        .to_string();
    assert!(error.contains("done_ttl (1000 ms)"), "{error}");
    let error = Idempotent::builder(MemoryStore::new())
        .group("bad group")
        .build()
        .unwrap_err()
        .to_string();
    assert!(error.contains("group"), "{error}");
    let error = Idempotent::builder(MemoryStore::new())
        .group("%RETRY%order-service")
        .build()
        .unwrap_err()
        .to_string();
    assert!(error.contains("%RETRY%"), "{error}");
}
