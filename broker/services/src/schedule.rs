//! Delay levels: messages stored in `SCHEDULE_TOPIC_XXXX` until their level's delay has passed,
//! then delivered to their real topic by the storage shard that holds them (RocketMQ's
//! ScheduleMessageService).
//!
//! Owns: the delay level list (`delay_levels`), the placement of schedule queues, turning a
//! send's `delay_level` / `deliver_at_ms` / `delay_ms` into where the network shard stores it
//! ([`Delivery`]), one delivery task per level on every storage shard, the persisted delivery
//! progress per level (`<shard>/delay-progress`), and the record rewrite shared with the timer
//! (`timer.rs`): the delivered copy is the stored message with its real topic and queue and
//! without the scheduling properties. Never: sockets, or the topic table.
//!
//! Placement: a delayed message is stored on the storage shard that owns its real queue, so
//! delivery is a local append and never crosses the mesh. The schedule queue of level `n` for
//! storage shard `s` is `(n - 1) × shards + j`, with `j` chosen so that the queue maps to `s`
//! (`meta::storage_shard_of`); with one storage shard that is exactly RocketMQ's `n - 1`.
//!
//! Guarantee (docs/operations.md, "Delay and timer delivery"): a delayed message whose send was
//! acknowledged (and, under `flush = async`, flushed) is delivered at least once, after its due
//! time, across restarts and kill -9. Progress is persisted every
//! `schedule_persist_interval_ms`, and only once the deliveries it covers are durable in the
//! CommitLog; so a crash can deliver again at most what was delivered during the last interval,
//! never lose one.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use futures_lite::future;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

pub use crate::config::delay_levels::{
    parse_delay_levels, parse_duration_ms, DEFAULT_DELAY_LEVELS, MAX_DELAY_LEVELS,
    MAX_LEVEL_DELAY_MS,
};
use crate::config::BrokerConfig;
use crate::meta::storage_shard_of;
use crate::naming::{SCHEDULE_TOPIC, TIMER_TOPIC};
use crate::store::atomic_file::write_atomically_async;
use crate::store::notify::LocalNotify;
use crate::store::record::{
    RecordInput, RecordView, PROPERTY_CRC32, PROPERTY_DELAY, PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC, PROPERTY_TIMER_DELIVER_MS,
};
use crate::store::{EncodedBatch, GetStatus, MessageStore, TagFilter};

pub use crate::layout::DELAY_PROGRESS_FILE;
/// Messages read from a schedule queue at once.
const READ_BATCH_MESSAGES: u32 = 32;
const READ_BATCH_BYTES: u64 = 1 << 20;
/// Wait after a failed read or delivery before trying the same message again.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// The queue of `system_topic` for `slot` (a delay level minus one, or 0 for the timer) that
/// lives on storage shard `target_shard`: `slot × shards + j`, `j` chosen by the queue mapping.
pub fn colocated_queue_id(
    system_topic: &str,
    slot: u32,
    target_shard: usize,
    shards: usize,
) -> u32 {
    debug_assert!(target_shard < shards);
    let base = storage_shard_of(system_topic, 0, shards);
    let j = (target_shard + shards - base) % shards;
    let queue_id = slot * shards as u32 + j as u32;
    debug_assert_eq!(
        storage_shard_of(system_topic, queue_id, shards),
        target_shard
    );
    queue_id
}

/// When a message sent now should become visible in its topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    Now,
    /// After delay level n (1-based).
    Level(u32),
    /// At this time, ms since the epoch (timer message).
    At(i64),
}

impl Delivery {
    /// Reads a message's `delay_level`, `deliver_at_ms` and `delay_ms` (at most one may be
    /// set); the error names the field and the limit. A time already past is `Now`.
    pub fn of(
        config: &BrokerConfig,
        delay_level: i32,
        deliver_at_ms: i64,
        delay_ms: i64,
        now_ms: i64,
    ) -> Result<Delivery, String> {
        let set = [delay_level != 0, deliver_at_ms != 0, delay_ms != 0];
        if set.iter().filter(|&&is_set| is_set).count() > 1 {
            return Err("set at most one of delay_level, deliver_at_ms and delay_ms".into());
        }
        if delay_level != 0 {
            let level_count = parse_delay_levels(&config.delay_levels)
                .map(|levels| levels.len())
                .unwrap_or(0);
            if delay_level < 0 || delay_level as usize > level_count {
                return Err(format!(
                    "delay_level {delay_level} is outside this broker's levels 1..={level_count}"
                ));
            }
            return Ok(Delivery::Level(delay_level as u32));
        }
        let due_ms = if delay_ms != 0 {
            if delay_ms < 0 {
                return Err(format!("delay_ms {delay_ms} is negative"));
            }
            now_ms.saturating_add(delay_ms)
        } else {
            deliver_at_ms
        };
        if due_ms == 0 || due_ms <= now_ms {
            return Ok(Delivery::Now);
        }
        let wait_ms = (due_ms - now_ms) as u64;
        if wait_ms > config.timer_max_delay_ms {
            return Err(format!(
                "delivery time is {wait_ms} ms away, over timer_max_delay_ms ({} ms)",
                config.timer_max_delay_ms
            ));
        }
        Ok(Delivery::At(due_ms))
    }
}

/// Where a send that asks for a delay stores its message: a schedule queue (delay level) or the
/// timer queue on the real queue's storage shard, with the properties that bring it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledSend {
    pub topic: &'static str,
    pub queue_id: u32,
    pub properties: Vec<(&'static str, String)>,
}

impl ScheduledSend {
    /// `delays` holds each message's `(delay_level, deliver_at_ms, delay_ms)`. `None`: deliver
    /// now, into the real queue. A delayed message must be sent alone (a batch is stored
    /// contiguously in one queue).
    pub fn for_send(
        config: &BrokerConfig,
        storage_shards: usize,
        topic: &str,
        queue_id: u32,
        delays: impl ExactSizeIterator<Item = (i32, i64, i64)>,
    ) -> Result<Option<ScheduledSend>, String> {
        let count = delays.len();
        let now = now_ms();
        let mut delivery = Delivery::Now;
        for (index, (level, deliver_at_ms, delay_ms)) in delays.enumerate() {
            let this = Delivery::of(config, level, deliver_at_ms, delay_ms, now)
                .map_err(|why| format!("message {index}: {why}"))?;
            if this != Delivery::Now && count > 1 {
                return Err(format!(
                    "message {index}: a delayed or timer message must be sent alone, not in a batch of {count}"
                ));
            }
            delivery = this;
        }
        let real_shard = storage_shard_of(topic, queue_id, storage_shards);
        let mut properties = vec![
            (PROPERTY_REAL_TOPIC, topic.to_owned()),
            (PROPERTY_REAL_QUEUE_ID, queue_id.to_string()),
        ];
        let (system_topic, slot) = match delivery {
            Delivery::Now => return Ok(None),
            Delivery::Level(level) => {
                properties.push((PROPERTY_DELAY, level.to_string()));
                (SCHEDULE_TOPIC, level - 1)
            }
            Delivery::At(due_ms) => {
                properties.push((PROPERTY_TIMER_DELIVER_MS, due_ms.to_string()));
                (TIMER_TOPIC, 0)
            }
        };
        Ok(Some(ScheduledSend {
            topic: system_topic,
            queue_id: colocated_queue_id(system_topic, slot, real_shard, storage_shards),
            properties,
        }))
    }

    pub fn property_pairs(&self) -> Vec<(&str, &str)> {
        self.properties
            .iter()
            .map(|(key, value)| (*key, value.as_str()))
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// The delivered copy

/// Properties a delivered copy does not keep: the scheduling ones, and the CRC (re-added).
const SCHEDULING_PROPERTIES: [&str; 5] = [
    PROPERTY_DELAY,
    PROPERTY_REAL_TOPIC,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_CRC32,
];

/// The record to append for a scheduled record once it is due: its real topic and queue, every
/// field and property as sent, less the scheduling properties. `None` when the record does not
/// name a valid real topic and queue (it is then skipped with a warning).
pub fn delivered_copy(view: &RecordView<'_>) -> Option<(EncodedBatch, String, u32)> {
    let topic = view.property(PROPERTY_REAL_TOPIC)?;
    let queue_id: u32 = view.property(PROPERTY_REAL_QUEUE_ID)?.parse().ok()?;
    let properties: Vec<(&str, &str)> = view
        .properties()
        .filter(|(key, _)| !SCHEDULING_PROPERTIES.contains(key))
        .collect();
    let input = RecordInput {
        topic,
        queue_id,
        flag: view.flag(),
        body: view.body(),
        properties: &properties,
        sys_flag: view.sys_flag(),
        born_timestamp_ms: view.born_timestamp_ms(),
        born_host: view.born_host(),
        store_host: view.store_host(),
        reconsume_times: view.reconsume_times(),
        prepared_transaction_offset: view.prepared_transaction_offset(),
    };
    let mut batch = EncodedBatch::new();
    batch.push(&input).ok()?;
    Some((batch, topic.to_owned(), queue_id))
}

// ---------------------------------------------------------------------------------------------
// Progress files

/// Reads a progress file (`crc32=XXXXXXXX` line, then JSON). A missing file is the default; a
/// damaged one is moved aside and reported, and the default used (which redelivers, never
/// skips).
pub fn load_progress<T: DeserializeOwned + Default>(path: &Path) -> (T, Option<String>) {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (T::default(), None),
        Err(e) => return (T::default(), Some(format!("cannot read: {e}"))),
    };
    match decode_progress(&bytes) {
        Ok(value) => (value, None),
        Err(why) => {
            let aside = path.with_extension(format!("damaged-{}", now_ms()));
            let _ = std::fs::rename(path, &aside);
            (
                T::default(),
                Some(format!("{why}; moved to {}", aside.display())),
            )
        }
    }
}

fn decode_progress<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let newline = bytes
        .iter()
        .position(|&b| b == b'\n')
        .ok_or("no CRC line")?;
    let header = std::str::from_utf8(&bytes[..newline]).map_err(|_| "CRC line is not text")?;
    let stored = header
        .strip_prefix("crc32=")
        .and_then(|hex| u32::from_str_radix(hex, 16).ok())
        .ok_or("malformed CRC line")?;
    let body = &bytes[newline + 1..];
    let computed = crc32fast::hash(body);
    if stored != computed {
        return Err(format!(
            "CRC mismatch (stored {stored:08x}, computed {computed:08x})"
        ));
    }
    serde_json::from_slice(body).map_err(|e| format!("unreadable JSON: {e}"))
}

pub fn encode_progress<T: Serialize>(value: &T) -> Vec<u8> {
    let body = serde_json::to_vec(value).expect("progress serializes");
    let mut out = format!("crc32={:08x}\n", crc32fast::hash(&body)).into_bytes();
    out.extend_from_slice(&body);
    out
}

/// Writes `bytes` to `path` once every CommitLog byte appended before this call is durable, so
/// the file never claims a delivery a crash could still undo. Gives up (false) when `stop`
/// fires first.
pub async fn persist_when_durable(
    store: &MessageStore,
    stop: &LocalNotify,
    stopping: &Cell<bool>,
    path: PathBuf,
    bytes: Vec<u8>,
) -> bool {
    let is_durable = future::or(
        async {
            store.wait_durable_to_current_end().await;
            true
        },
        async {
            while !stopping.get() {
                stop.notified().await;
            }
            false
        },
    )
    .await;
    if !is_durable {
        return false;
    }
    if let Err(e) = write_atomically_async(path.clone(), bytes).await {
        warn!(path = %path.display(), error = %e, "cannot persist delivery progress");
        return false;
    }
    true
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Sleeps `duration` unless the stop signal fires first; true when it slept the whole time.
pub async fn sleep_unless_stopped(
    duration: Duration,
    stop: &LocalNotify,
    stopping: &Cell<bool>,
) -> bool {
    if stopping.get() {
        return false;
    }
    let stopped = stop.notified();
    future::or(
        async {
            glommio::timer::sleep(duration).await;
            true
        },
        async {
            stopped.await;
            false
        },
    )
    .await
}

// ---------------------------------------------------------------------------------------------
// The delay level service

/// `<shard>/delay-progress`: per level, the next schedule queue offset to deliver.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DelayProgress {
    pub next_offsets: BTreeMap<u32, u64>,
}

/// Appends a delivered copy and tells long-polling pulls of its queue.
pub type ArrivalHook = Rc<dyn Fn(&str, u32)>;

/// The delay level delivery of one storage shard.
pub struct DelayService {
    shard: usize,
    shards: usize,
    levels_ms: Vec<u64>,
    store: MessageStore,
    progress: RefCell<DelayProgress>,
    path: PathBuf,
    on_arrival: ArrivalHook,
    stop: LocalNotify,
    stopping: Cell<bool>,
    tasks: RefCell<Vec<glommio::task::JoinHandle<()>>>,
}

impl DelayService {
    /// Loads the progress and starts one delivery task per level and the persist task.
    pub fn start(
        shard: usize,
        config: &BrokerConfig,
        store: MessageStore,
        shard_dir: &Path,
        on_arrival: ArrivalHook,
    ) -> Result<Rc<DelayService>, String> {
        let levels_ms = parse_delay_levels(&config.delay_levels)?;
        let path = shard_dir.join(DELAY_PROGRESS_FILE);
        let (progress, problem): (DelayProgress, _) = load_progress(&path);
        if let Some(problem) = problem {
            warn!(shard, %problem, "delay progress file was unusable; levels restart from their oldest message (redelivery, not loss)");
        }
        let service = Rc::new(DelayService {
            shard,
            shards: config.storage_cores.len(),
            levels_ms,
            store,
            progress: RefCell::new(progress),
            path,
            on_arrival,
            stop: LocalNotify::default(),
            stopping: Cell::new(false),
            tasks: RefCell::new(Vec::new()),
        });
        let mut tasks = Vec::new();
        for level in 1..=service.levels_ms.len() as u32 {
            tasks.push(glommio::spawn_local(service.clone().run_level(level)).detach());
        }
        let interval = Duration::from_millis(config.schedule_persist_interval_ms);
        tasks.push(glommio::spawn_local(service.clone().persist_loop(interval)).detach());
        *service.tasks.borrow_mut() = tasks;
        Ok(service)
    }

    /// Stops delivering (a delivery in progress completes first) and persists the progress.
    /// Call before the store closes; the store's close makes the deliveries durable before
    /// the caller writes anything else.
    pub async fn stop(&self) {
        self.stopping.set(true);
        self.stop.notify_all();
        let tasks: Vec<_> = self.tasks.borrow_mut().drain(..).collect();
        for task in tasks {
            task.await;
        }
    }

    /// Writes the progress file without waiting for durability: call after the store closed.
    pub async fn persist_final(&self) {
        let bytes = encode_progress(&*self.progress.borrow());
        if let Err(e) = write_atomically_async(self.path.clone(), bytes).await {
            warn!(shard = self.shard, error = %e, "cannot persist delay progress");
        }
    }

    fn queue_of(&self, level: u32) -> u32 {
        colocated_queue_id(SCHEDULE_TOPIC, level - 1, self.shard, self.shards)
    }

    async fn persist_loop(self: Rc<Self>, interval: Duration) {
        let mut persisted = self.progress.borrow().clone();
        while sleep_unless_stopped(interval, &self.stop, &self.stopping).await {
            let snapshot = self.progress.borrow().clone();
            if snapshot == persisted {
                continue;
            }
            let bytes = encode_progress(&snapshot);
            if persist_when_durable(
                &self.store,
                &self.stop,
                &self.stopping,
                self.path.clone(),
                bytes,
            )
            .await
            {
                persisted = snapshot;
            }
        }
    }

    /// Delivers level `level`'s messages in order as each becomes due; parks until the head is
    /// due or, when the queue is drained, until something is appended on this shard.
    async fn run_level(self: Rc<Self>, level: u32) {
        let queue_id = self.queue_of(level);
        let delay_ms = self.levels_ms[level as usize - 1] as i64;
        loop {
            if self.stopping.get() {
                return;
            }
            // Registered before the read, so an append between the read and the wait wakes us.
            let arrival = self.store.arrival();
            let offset = self
                .progress
                .borrow()
                .next_offsets
                .get(&level)
                .copied()
                .unwrap_or(0);
            let read = self
                .store
                .get_messages(
                    SCHEDULE_TOPIC,
                    queue_id,
                    offset,
                    READ_BATCH_MESSAGES,
                    READ_BATCH_BYTES,
                    &TagFilter::All,
                )
                .await;
            let got = match read {
                Ok(got) => got,
                Err(e) => {
                    warn!(shard = self.shard, level, error = %e, "reading a schedule queue failed; retrying");
                    sleep_unless_stopped(RETRY_PAUSE, &self.stop, &self.stopping).await;
                    continue;
                }
            };
            match got.status {
                GetStatus::Found => {
                    for record in &got.records {
                        if !self.deliver_when_due(level, delay_ms, record).await {
                            break;
                        }
                    }
                }
                GetStatus::NoNewMessage | GetStatus::NoMatchedQueue => {
                    let stopped = self.stop.notified();
                    future::or(arrival, stopped).await;
                }
                GetStatus::NoMatchedMessage => self.set_next(level, got.next_offset),
                GetStatus::OffsetTooSmall | GetStatus::OffsetOverflow => {
                    // Retention removed old entries, or recovery cut the queue shorter than the
                    // progress file remembers: continue from where the queue really is.
                    warn!(
                        shard = self.shard,
                        level,
                        offset,
                        next = got.next_offset,
                        min = got.min_offset,
                        max = got.max_offset,
                        "delay progress was outside the schedule queue; moving to its bounds"
                    );
                    let next = if got.status == GetStatus::OffsetTooSmall {
                        got.min_offset
                    } else {
                        got.max_offset
                    };
                    self.set_next(level, next);
                }
            }
        }
    }

    fn set_next(&self, level: u32, next: u64) {
        self.progress.borrow_mut().next_offsets.insert(level, next);
    }

    /// Waits until `record` is due, delivers it and advances the level; false when stopping or
    /// when the delivery failed (the caller reads again from the same offset).
    async fn deliver_when_due(&self, level: u32, delay_ms: i64, record: &bytes::Bytes) -> bool {
        let Ok(view) = RecordView::parse_unchecked(record) else {
            warn!(
                shard = self.shard,
                level, "unreadable schedule record; reading again"
            );
            sleep_unless_stopped(RETRY_PAUSE, &self.stop, &self.stopping).await;
            return false;
        };
        let due_ms = view.store_timestamp_ms().saturating_add(delay_ms);
        let wait_ms = due_ms - now_ms();
        if wait_ms > 0
            && !sleep_unless_stopped(
                Duration::from_millis(wait_ms as u64),
                &self.stop,
                &self.stopping,
            )
            .await
        {
            return false;
        }
        if !deliver(&self.store, &self.on_arrival, &view, self.shard).await {
            sleep_unless_stopped(RETRY_PAUSE, &self.stop, &self.stopping).await;
            return false;
        }
        self.set_next(level, view.queue_offset() + 1);
        true
    }
}

/// Appends the delivered copy of a due record; true when it was appended or can never be
/// (a record without a real topic is skipped, with a warning).
pub async fn deliver(
    store: &MessageStore,
    on_arrival: &ArrivalHook,
    view: &RecordView<'_>,
    shard: usize,
) -> bool {
    let Some((batch, topic, queue_id)) = delivered_copy(view) else {
        warn!(
            shard,
            topic = view.topic(),
            queue_offset = view.queue_offset(),
            "scheduled record names no valid real topic and queue; skipped"
        );
        return true;
    };
    match store.append(batch).await {
        Ok(_) => {
            on_arrival(&topic, queue_id);
            true
        }
        Err(e) => {
            warn!(shard, %topic, queue_id, error = %e, "delivering a scheduled message failed; will retry");
            false
        }
    }
}

/// Logs the delay levels in force once per broker start (shard 0).
pub fn log_levels(config: &BrokerConfig) {
    info!(delay_levels = %config.delay_levels, timer_max_delay_ms = config.timer_max_delay_ms, "delay levels and timer horizon");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colocated_queues_land_on_the_target_shard() {
        assert_eq!(colocated_queue_id(SCHEDULE_TOPIC, 2, 0, 1), 2);
        for shards in 1..6 {
            for target in 0..shards {
                for slot in 0..18 {
                    let q = colocated_queue_id(SCHEDULE_TOPIC, slot, target, shards);
                    assert_eq!(storage_shard_of(SCHEDULE_TOPIC, q, shards), target);
                    assert_eq!(q / shards as u32, slot);
                }
            }
        }
    }

    #[test]
    fn delivery_fields_are_checked() {
        let config = BrokerConfig {
            delay_levels: "1s 2s 3s".into(),
            timer_max_delay_ms: 10_000,
            ..BrokerConfig::default()
        };
        let now = 1_000_000;
        assert_eq!(Delivery::of(&config, 0, 0, 0, now), Ok(Delivery::Now));
        assert_eq!(Delivery::of(&config, 3, 0, 0, now), Ok(Delivery::Level(3)));
        assert!(Delivery::of(&config, 4, 0, 0, now)
            .unwrap_err()
            .contains("1..=3"));
        assert!(Delivery::of(&config, -1, 0, 0, now).is_err());
        assert_eq!(
            Delivery::of(&config, 0, now + 500, 0, now),
            Ok(Delivery::At(now + 500))
        );
        assert_eq!(
            Delivery::of(&config, 0, 0, 500, now),
            Ok(Delivery::At(now + 500))
        );
        assert_eq!(Delivery::of(&config, 0, now - 5, 0, now), Ok(Delivery::Now));
        assert!(Delivery::of(&config, 0, now + 10_001, 0, now)
            .unwrap_err()
            .contains("timer_max_delay_ms"));
        assert!(Delivery::of(&config, 1, now + 5, 0, now)
            .unwrap_err()
            .contains("at most one"));
        assert!(Delivery::of(&config, 0, 0, -5, now).is_err());
    }

    #[test]
    fn progress_round_trips_and_damage_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(DELAY_PROGRESS_FILE);
        let mut progress = DelayProgress::default();
        progress.next_offsets.insert(3, 42);
        std::fs::write(&path, encode_progress(&progress)).unwrap();
        let (loaded, problem): (DelayProgress, _) = load_progress(&path);
        assert_eq!((loaded, problem), (progress, None));
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 2;
        bytes[last] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let (loaded, problem): (DelayProgress, _) = load_progress(&path);
        assert_eq!(loaded, DelayProgress::default());
        assert!(problem.unwrap().contains("CRC"));
        assert!(!path.exists(), "moved aside");
    }
}
