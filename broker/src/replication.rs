//! Master/slave replication, asynchronous or synchronous (docs/replication.md).
//!
//! A slave pulls its master's CommitLog over an ordinary connection to the master's HA address,
//! one loop per storage shard, run on that storage shard's own executor: the bytes land in that
//! shard's store, so the socket work is done where they are appended and no copy crosses cores.
//! Each `ReplicaPullRequest` names where the slave's log ends (so it also acknowledges what it
//! holds); the master's storage shard answers with the bytes from there
//! ([`MessageStore::read_for_replica`]), holding the request while it has nothing new, and the
//! slave appends them ([`MessageStore::append_replicated`]) and, once they are written (synced
//! under sync flush), acknowledges them with its next pull; a sync master's sends wait for that
//! acknowledgement (`storage_shard.rs`). Network shard 0 of a slave copies the master's topic
//! table every 2 s and its consumer offsets every 10 s.
//!
//! Owns the slave's side and the master's storage-side answer; the master's request handler is
//! in `network::handlers`.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use shardmq_schema::{build_frame, wire, FrameDecoder, FrameEncoder, FrameHeader, VerifiedFrame};
use tracing::{error, info, warn};

use crate::config::BrokerConfig;
pub use crate::layout::COPIED_FILES;
use crate::role::{master_address, own_address, sync_wait_set};
use crate::store::epochs::{Epoch, EpochLog};
use crate::store::notify::LocalNotify;
use crate::store::{AppendStatus, MessageStore, StoreError};

/// Most bytes one replica pull asks for.
pub const REPLICA_PULL_BYTES: u32 = 4 << 20;
/// How long the master holds a replica pull that finds nothing new.
pub const REPLICA_SUSPEND_MS: u32 = 1_000;
/// Pause before reconnecting to a master that could not be reached or answered with an error.
const RECONNECT_PAUSE: Duration = Duration::from_secs(1);
/// How often a slave copies its master's topic table.
pub const TOPIC_SYNC_INTERVAL: Duration = Duration::from_secs(2);

/// A slave that has not asked for bytes for this long is not replicating: a sync master's
/// sends answer SLAVE_NOT_AVAILABLE at once instead of waiting for it. (An idle slave asks at
/// least once a second: the master holds its pulls 1 s.)
pub const SLAVE_SILENCE: Duration = Duration::from_secs(3);
/// Granularity of the append-time marks behind the lag in ms.
const MARK_EVERY: Duration = Duration::from_millis(5);
/// Most append-time marks kept (at one per `MARK_EVERY`, 20 s of history; older ones merge).
const MAX_MARKS: usize = 4096;

/// One storage shard's replication, as its broker sees it (status and metrics).
#[derive(Debug, Clone, Default)]
pub struct ShardReplication {
    pub peer: String,
    pub epoch: u64,
    pub lag_bytes: Option<u64>,
    pub lag_ms: Option<u64>,
    pub connected: bool,
}

struct SlaveState {
    acknowledged: u64,
    seen: Instant,
    peer: String,
}

/// A master storage shard's replication state: its terms, its slaves' acknowledgements, and
/// marks of when its log reached which offset (for the lag in ms).
pub struct MasterSide {
    pub epochs: Rc<RefCell<EpochLog>>,
    slaves: RefCell<BTreeMap<i64, SlaveState>>,
    progress: LocalNotify,
    marks: RefCell<VecDeque<(u64, Instant)>>,
}

impl MasterSide {
    pub fn new(epochs: Rc<RefCell<EpochLog>>) -> MasterSide {
        MasterSide {
            epochs,
            slaves: RefCell::new(BTreeMap::new()),
            progress: LocalNotify::default(),
            marks: RefCell::new(VecDeque::new()),
        }
    }

    pub fn epoch(&self) -> u64 {
        self.epochs.borrow().last().epoch
    }

    /// The highest acknowledgement of a slave heard from within [`SLAVE_SILENCE`].
    fn best_acknowledged(&self) -> Option<u64> {
        self.slaves
            .borrow()
            .values()
            .filter(|s| s.seen.elapsed() < SLAVE_SILENCE)
            .map(|s| s.acknowledged)
            .max()
    }

    /// The lowest broker id of a live slave that holds every byte below `position`.
    pub fn reader_holding(&self, position: u64) -> Option<i64> {
        self.slaves
            .borrow()
            .iter()
            .find(|(_, s)| s.seen.elapsed() < SLAVE_SILENCE && s.acknowledged >= position)
            .map(|(id, _)| *id)
    }

    /// A slave asked for bytes, acknowledging `acknowledged` (ignored past `log_end`: a slave
    /// holding bytes this master does not is not counted).
    pub fn on_pull(&self, broker_id: i64, peer: &str, acknowledged: u64, log_end: u64) {
        let mut slaves = self.slaves.borrow_mut();
        let state = slaves.entry(broker_id).or_insert_with(|| SlaveState {
            acknowledged: 0,
            seen: Instant::now(),
            peer: String::new(),
        });
        state.seen = Instant::now();
        if !peer.is_empty() && state.peer != peer {
            state.peer = peer.to_owned();
        }
        if acknowledged <= log_end && acknowledged > state.acknowledged {
            state.acknowledged = acknowledged;
            drop(slaves);
            let keep_from = self.best_acknowledged().unwrap_or(0);
            let mut marks = self.marks.borrow_mut();
            while marks.front().is_some_and(|&(end, _)| end <= keep_from) {
                marks.pop_front();
            }
            drop(marks);
            self.progress.notify_all();
        }
    }

    /// A slave (re)joined: its acknowledgement restarts from what it holds.
    pub fn on_join(&self, broker_id: i64, peer: &str, end: u64) {
        let mut slaves = self.slaves.borrow_mut();
        let state = slaves.entry(broker_id).or_insert_with(|| SlaveState {
            acknowledged: 0,
            seen: Instant::now(),
            peer: String::new(),
        });
        state.seen = Instant::now();
        state.peer = peer.to_owned();
        state.acknowledged = end;
    }

    /// Sync master: waits until a slave acknowledges every byte below `end`, up to `timeout`.
    /// In controller mode, every member of the SyncStateSet (but the master) must; with fewer
    /// than `min_in_sync_replicas` members (the master counted) the send is answered
    /// SLAVE_NOT_AVAILABLE at once, and with none but the master (and a minimum of 1) it
    /// completes at once.
    pub async fn wait_replicated(
        &self,
        end: u64,
        timeout: Duration,
        min_in_sync_replicas: u32,
    ) -> AppendStatus {
        let required = sync_wait_set();
        if required.is_none() && self.best_acknowledged().is_none() {
            return AppendStatus::SlaveNotAvailable;
        }
        if required
            .as_ref()
            .is_some_and(|set| set.len() + 1 < min_in_sync_replicas as usize)
        {
            return AppendStatus::SlaveNotAvailable;
        }
        let is_done = || match &required {
            None => self.best_acknowledged().unwrap_or(0) >= end,
            Some(_) => {
                // Read again: the controller loop changes the set as slaves join and leave.
                let required = sync_wait_set().unwrap_or_default();
                let slaves = self.slaves.borrow();
                required.iter().all(|id| {
                    slaves
                        .get(id)
                        .is_some_and(|s| s.acknowledged >= end && s.seen.elapsed() < SLAVE_SILENCE)
                })
            }
        };
        let wait = async {
            while !is_done() {
                futures_lite::future::or(
                    self.progress.notified(),
                    glommio::timer::sleep(Duration::from_millis(50)),
                )
                .await;
            }
        };
        let acknowledged = futures_lite::future::or(
            async {
                wait.await;
                true
            },
            async {
                glommio::timer::sleep(timeout).await;
                false
            },
        )
        .await;
        if acknowledged {
            AppendStatus::Ok
        } else {
            AppendStatus::FlushSlaveTimeout
        }
    }

    /// Controller mode: each slave's acknowledgement on this shard and whether it asked within
    /// [`SLAVE_SILENCE`], with this log's end.
    pub fn sync_view(&self, log_end: u64) -> SyncView {
        let slaves = self.slaves.borrow();
        (
            log_end,
            slaves
                .iter()
                .map(|(id, s)| (*id, s.acknowledged, s.seen.elapsed() < SLAVE_SILENCE))
                .collect(),
        )
    }

    /// Notes that the log reached `end` now (one mark per [`MARK_EVERY`]).
    pub fn mark(&self, end: u64) {
        let now = Instant::now();
        let mut marks = self.marks.borrow_mut();
        let is_full = marks.len() >= MAX_MARKS;
        match marks.back_mut() {
            Some((last_end, _)) if *last_end >= end => {}
            Some((last_end, at)) if is_full || now.duration_since(*at) < MARK_EVERY => {
                *last_end = end;
            }
            _ => marks.push_back((end, now)),
        }
    }

    /// Keeps the marks current while the shard serves: one wake-up per arrival, at most one
    /// per [`MARK_EVERY`].
    pub async fn mark_loop(self: Rc<Self>, store: MessageStore) {
        loop {
            let arrival = store.arrival();
            self.mark(store.commitlog_offsets().1);
            arrival.await;
            glommio::timer::sleep(MARK_EVERY).await;
        }
    }

    /// Age in ms of the oldest byte at or past `offset` (0 when `offset` is the log's end).
    pub fn age_ms(&self, offset: u64, log_end: u64) -> u64 {
        if offset >= log_end {
            return 0;
        }
        self.marks
            .borrow()
            .iter()
            .find(|&&(end, _)| end > offset)
            .map_or(0, |(_, at)| at.elapsed().as_millis() as u64)
    }

    /// This shard's replication as the master sees it: its best slave's lag.
    pub fn status(&self, log_end: u64) -> ShardReplication {
        let slaves = self.slaves.borrow();
        let best = slaves
            .values()
            .filter(|s| s.seen.elapsed() < SLAVE_SILENCE)
            .max_by_key(|s| s.acknowledged)
            .or_else(|| slaves.values().max_by_key(|s| s.seen));
        match best {
            Some(slave) => ShardReplication {
                peer: slave.peer.clone(),
                epoch: self.epoch(),
                lag_bytes: Some(log_end.saturating_sub(slave.acknowledged)),
                lag_ms: Some(self.age_ms(slave.acknowledged, log_end)),
                connected: slave.seen.elapsed() < SLAVE_SILENCE,
            },
            None => ShardReplication {
                epoch: self.epoch(),
                ..ShardReplication::default()
            },
        }
    }

    /// Answers a slave's join: where the bytes it shares with this master end.
    pub fn join(&self, slave: &EpochLog, slave_end: u64, log_end: u64) -> JoinAnswer {
        let epochs = self.epochs.borrow();
        JoinAnswer {
            epoch: epochs.last().epoch,
            epochs: epochs.entries().to_vec(),
            master_end: log_end,
            consistent_end: epochs.consistent_end(log_end, slave, slave_end),
        }
    }
}

/// A storage shard's log end and, per slave, its id, acknowledgement and whether it asked
/// within [`SLAVE_SILENCE`].
pub type SyncView = (u64, Vec<(i64, u64, bool)>);

/// The master's answer to a join (see `ReplicaJoinResponse`).
#[derive(Debug, Clone)]
pub struct JoinAnswer {
    pub epoch: u64,
    pub epochs: Vec<Epoch>,
    pub master_end: u64,
    pub consistent_end: u64,
}

/// One replica pull's answer from the master's storage shard.
#[derive(Debug, Clone)]
pub struct ReplicaChunk {
    pub bytes: Bytes,
    pub master_end: u64,
    pub epoch: u64,
    /// Age of the oldest byte the slave lacks (at `from`), in ms.
    pub lag_ms: u64,
}

/// A slave storage shard's view of its master, kept by [`follow`].
#[derive(Default)]
pub struct SlaveView {
    master: RefCell<Option<SocketAddr>>,
    epoch: Cell<u64>,
    master_end: Cell<Option<u64>>,
    lag_ms: Cell<Option<u64>>,
    seen: Cell<Option<Instant>>,
}

impl SlaveView {
    pub fn status(&self, log_end: u64) -> ShardReplication {
        ShardReplication {
            peer: self
                .master
                .borrow()
                .map(|a| a.to_string())
                .unwrap_or_default(),
            epoch: self.epoch.get(),
            lag_bytes: self.master_end.get().map(|end| end.saturating_sub(log_end)),
            lag_ms: self.lag_ms.get(),
            connected: self.seen.get().is_some_and(|t| t.elapsed() < SLAVE_SILENCE),
        }
    }
}

/// One connection to the master, speaking the ordinary frame protocol.
pub struct MasterLink {
    address: SocketAddr,
    stream: TcpStream,
    decoder: FrameDecoder,
    encoder: FrameEncoder,
    buffer: BytesMut,
    next_request_id: u64,
}

/// The frame of the master's answer to `what`, unless the master refused it (then an error with
/// its status and message).
fn require_ok<'a>(answer: &'a VerifiedFrame, what: &str) -> io::Result<wire::Frame<'a>> {
    let frame = answer.frame();
    if frame.status() != wire::Status::OK {
        return Err(io::Error::other(format!(
            "the master refused {what} ({:?}): {}",
            frame.status(),
            frame.message().unwrap_or_default()
        )));
    }
    Ok(frame)
}

impl MasterLink {
    /// Connects and shakes hands.
    pub async fn connect(address: SocketAddr, client_id: &str) -> io::Result<MasterLink> {
        let stream = TcpStream::connect(address).await.map_err(io::Error::from)?;
        let _ = stream.set_nodelay(true);
        let mut link = MasterLink {
            address,
            stream,
            decoder: FrameDecoder::with_max_frame_bytes(
                2 * shardmq_schema::DEFAULT_MAX_FRAME_BYTES,
            ),
            encoder: FrameEncoder::new(),
            buffer: BytesMut::with_capacity(64 << 10),
            next_request_id: 1,
        };
        let answer = link
            .request(|b, header| shardmq_schema::build_handshake_request(b, &header, client_id))
            .await?;
        require_ok(&answer, &format!("the handshake at {address}"))?;
        Ok(link)
    }

    /// Sends one request and reads its answer (the link has one request in flight at a time).
    pub async fn request(
        &mut self,
        build: impl FnOnce(
            &mut flatbuffers::FlatBufferBuilder<'static>,
            FrameHeader<'static>,
        ) -> flatbuffers::WIPOffset<wire::Frame<'static>>,
    ) -> io::Result<VerifiedFrame> {
        let id = self.next_request_id;
        self.next_request_id += 1;
        let frame = self
            .encoder
            .encode(|b| build(b, FrameHeader::request(id)))
            .map_err(io::Error::other)?;
        self.stream.write_all(&frame).await?;
        loop {
            if let Some(frame) = self
                .decoder
                .decode(&mut self.buffer)
                .map_err(io::Error::other)?
            {
                if frame.frame().request_id() == id {
                    return Ok(frame);
                }
                continue;
            }
            // Into the room the decoder reserved for a frame under way (up to 4 MiB at once).
            let start = self.buffer.len();
            let room = (self.buffer.capacity() - start).clamp(64 << 10, 4 << 20);
            self.buffer.resize(start + room, 0);
            let read = self.stream.read(&mut self.buffer[start..]).await?;
            self.buffer.truncate(start + read);
            if read == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the master at {} closed the connection", self.address),
                ));
            }
        }
    }

    /// Joins the master for one storage shard: says who this slave is and what its log holds,
    /// and learns the master's terms and where their shared bytes end.
    async fn join(
        &mut self,
        config: &BrokerConfig,
        storage_shard: usize,
        end: u64,
        epochs: &EpochLog,
    ) -> io::Result<JoinAnswer> {
        let own = own_address().map(|a| a.to_string()).unwrap_or_default();
        let answer = self
            .request(|b, header| {
                let cluster = b.create_string(&config.cluster_name);
                let broker = b.create_string(&config.broker_name);
                let address = b.create_string(&own);
                let entries: Vec<wire::EpochEntry> = epochs
                    .entries()
                    .iter()
                    .map(|e| wire::EpochEntry::new(e.epoch, e.start))
                    .collect();
                let entries = b.create_vector(&entries);
                let body = wire::ReplicaJoinRequest::create(
                    b,
                    &wire::ReplicaJoinRequestArgs {
                        cluster_name: Some(cluster),
                        broker_name: Some(broker),
                        broker_id: config.broker_id,
                        storage_shards: config.storage_cores.len() as u32,
                        storage_shard: storage_shard as u32,
                        end,
                        epochs: Some(entries),
                        slave_address: Some(address),
                    },
                );
                build_frame(
                    b,
                    &header,
                    wire::Body::ReplicaJoinRequest,
                    Some(body.as_union_value()),
                )
            })
            .await?;
        let body = require_ok(&answer, "the join")?
            .body_as_replica_join_response()
            .ok_or_else(|| io::Error::other("a ReplicaJoinResponse without its body"))?;
        Ok(JoinAnswer {
            epoch: body.epoch(),
            epochs: body
                .epochs()
                .iter()
                .flat_map(|v| v.iter())
                .map(|e| Epoch {
                    epoch: e.epoch(),
                    start: e.start(),
                })
                .collect(),
            master_end: body.master_end(),
            consistent_end: body.consistent_end(),
        })
    }

    /// The CommitLog bytes of `storage_shard` from `from`, in master term `epoch`.
    async fn pull(
        &mut self,
        storage_shard: usize,
        from: u64,
        acknowledged: u64,
        broker_id: i64,
        epoch: u64,
    ) -> io::Result<ReplicaChunk> {
        let answer = self
            .request(|b, header| {
                let body = wire::ReplicaPullRequest::create(
                    b,
                    &wire::ReplicaPullRequestArgs {
                        storage_shard: storage_shard as u32,
                        from,
                        max_bytes: REPLICA_PULL_BYTES,
                        suspend_timeout_ms: REPLICA_SUSPEND_MS,
                        broker_id,
                        slave_address: None,
                        acknowledged,
                        epoch,
                    },
                );
                build_frame(
                    b,
                    &header,
                    wire::Body::ReplicaPullRequest,
                    Some(body.as_union_value()),
                )
            })
            .await?;
        let body = require_ok(&answer, "the pull")?
            .body_as_replica_pull_response()
            .ok_or_else(|| io::Error::other("a ReplicaPullResponse without its body"))?;
        if body.from() != from {
            return Err(io::Error::other(format!(
                "the master answered for {} when asked for {from}",
                body.from()
            )));
        }
        let bytes = body
            .data()
            .and_then(|data| answer.share(data.bytes()))
            .unwrap_or_default();
        Ok(ReplicaChunk {
            bytes,
            master_end: body.master_end(),
            epoch: body.epoch(),
            lag_ms: body.lag_ms(),
        })
    }
}

/// What a slave storage shard's replication loop works with.
pub struct Follower {
    pub storage_shard: usize,
    pub config: Rc<BrokerConfig>,
    pub store: MessageStore,
    pub epochs: Rc<RefCell<EpochLog>>,
    pub view: Rc<SlaveView>,
    /// Called once replicated bytes are visible: wakes pulls parked on the queues that grew.
    pub on_appended: Rc<dyn Fn()>,
}

/// The slave's replication loop for one storage shard: joins the master (cutting its own log
/// where it parts from the master's, by a restart), pulls from the master's HA address and
/// appends, reconnecting after any failure, until cancelled.
pub async fn follow(follower: Follower) {
    let Follower {
        storage_shard,
        config,
        store,
        epochs,
        view,
        on_appended,
    } = follower;
    let client_id = format!(
        "{}-slave-{}-{storage_shard}",
        config.broker_name, config.broker_id
    );
    // The join names this broker's client address (the master shows it as its peer): network
    // shard 0 learns it as it binds, moments after the storage shards start.
    for _ in 0..500 {
        if own_address().is_some() {
            break;
        }
        glommio::timer::sleep(Duration::from_millis(10)).await;
    }
    let mut was_connected = true;
    let mut waiting_for_master = false;
    loop {
        let Some(master) = master_address(&config) else {
            if !waiting_for_master {
                info!(
                    storage_shard,
                    "waiting for a name server to name the master"
                );
                waiting_for_master = true;
            }
            glommio::timer::sleep(RECONNECT_PAUSE).await;
            continue;
        };
        *view.master.borrow_mut() = Some(master);
        let mut link = match MasterLink::connect(master, &client_id).await {
            Ok(link) => link,
            Err(error) => {
                if was_connected {
                    warn!(storage_shard, %master, %error, "cannot reach the master; retrying every second");
                    was_connected = false;
                }
                glommio::timer::sleep(RECONNECT_PAUSE).await;
                continue;
            }
        };
        let end = store.commitlog_offsets().1;
        let joined = {
            let ours = epochs.borrow().clone();
            link.join(&config, storage_shard, end, &ours).await
        };
        let joined = match joined {
            Ok(joined) => joined,
            Err(error) => {
                warn!(storage_shard, %master, %error, "the master refused this slave; retrying every second");
                was_connected = false;
                glommio::timer::sleep(RECONNECT_PAUSE).await;
                continue;
            }
        };
        if joined.consistent_end < end {
            // This log holds bytes the master never had (it lost its tail, or another broker
            // was master): cut them. The store does it as it opens, so the broker restarts.
            let dir = store.config().shard_dir.clone();
            error!(
                storage_shard,
                %master,
                our_end = end,
                consistent_end = joined.consistent_end,
                master_end = joined.master_end,
                "this slave holds CommitLog bytes its master does not: cutting them and restarting"
            );
            match crate::store::request_truncation(&dir, joined.consistent_end) {
                Ok(()) => crate::role::request_restart(),
                Err(e) => {
                    error!(storage_shard, error = %e, "cannot ask for the cut; replication stops")
                }
            }
            return;
        }
        info!(storage_shard, %master, epoch = joined.epoch, from = end, master_end = joined.master_end, "replicating from the master");
        was_connected = true;
        let master_epochs = {
            let mut log = EpochLog::default();
            for e in &joined.epochs {
                let _ = log.push(*e);
            }
            log
        };
        view.epoch.set(joined.epoch);
        // The master's state files, each kept once this log reaches where the master's was
        // when it read the file (so the deliveries it counts as done are here).
        let copy_interval = Duration::from_millis(config.replica_metadata_interval_ms.max(100));
        let mut last_files_copy = Instant::now() - copy_interval;
        let mut pending_files: Vec<(&'static str, Vec<u8>, u64)> = Vec::new();
        loop {
            if last_files_copy.elapsed() >= copy_interval {
                last_files_copy = Instant::now();
                for name in COPIED_FILES {
                    match link.file(storage_shard, name).await {
                        Ok(Some((data, end))) => {
                            pending_files.retain(|(n, _, _)| *n != name);
                            pending_files.push((name, data, end));
                        }
                        Ok(None) => {}
                        Err(error) => {
                            warn!(storage_shard, %master, %error, "cannot copy the master's {name}")
                        }
                    }
                }
            }
            let visible = store.visible_offset();
            for (name, data, _) in pending_files.iter().filter(|(_, _, end)| *end <= visible) {
                let path = store.config().shard_dir.join(name);
                if let Err(e) =
                    crate::store::atomic_file::write_atomically_async(path, data.clone()).await
                {
                    warn!(storage_shard, error = %e, "cannot write the copy of the master's {name}");
                }
            }
            pending_files.retain(|(_, _, end)| *end > visible);
            let from = store.commitlog_offsets().1;
            let acknowledged = store.visible_offset();
            let pull = link.pull(
                storage_shard,
                from,
                acknowledged,
                config.broker_id,
                joined.epoch,
            );
            let chunk = match pull.await {
                Ok(chunk) if chunk.epoch == joined.epoch => chunk,
                Ok(chunk) => {
                    info!(storage_shard, %master, epoch = chunk.epoch, "the master began a new term; joining again");
                    break;
                }
                Err(error) => {
                    // What the master held past this log when last heard from: under
                    // async-master, acknowledged messages in it exist only on the master.
                    let lag_bytes = view.master_end.get().map(|end| end.saturating_sub(from));
                    warn!(storage_shard, %master, %error, ?lag_bytes, "replication from the master stopped; reconnecting");
                    break;
                }
            };
            view.seen.set(Some(Instant::now()));
            view.master_end.set(Some(chunk.master_end));
            view.lag_ms.set(Some(chunk.lag_ms));
            if chunk.bytes.is_empty() {
                continue;
            }
            match store.append_replicated(from, &chunk.bytes).await {
                // Acknowledged with the next pull once written (synced under sync flush): a
                // sync master's sends wait for that.
                Ok(_) => {
                    let to = from + chunk.bytes.len() as u64;
                    let changed = epochs.borrow_mut().record_crossed(&master_epochs, from, to);
                    if changed {
                        let dir = store.config().shard_dir.clone();
                        let log = epochs.borrow().clone();
                        let saved = glommio::executor()
                            .spawn_blocking(move || log.save(&dir))
                            .await;
                        if let Err(e) = saved {
                            warn!(storage_shard, error = %e, "cannot record the master's term");
                        }
                    }
                    store.wait_visible_to_current_end().await;
                    on_appended();
                }
                Err(StoreError::Busy { .. }) => {
                    // The disk is behind: let it catch up, then ask again from the same end.
                    glommio::timer::sleep(Duration::from_millis(10)).await;
                }
                Err(error) => {
                    warn!(storage_shard, %master, %error, "replicated bytes refused");
                    glommio::timer::sleep(RECONNECT_PAUSE).await;
                    break;
                }
            }
        }
        view.seen.set(None);
        glommio::timer::sleep(RECONNECT_PAUSE).await;
    }
}

impl MasterLink {
    /// One of the master's state files of `storage_shard` (`None`: it has none) and the
    /// master's CommitLog end when it read it.
    async fn file(
        &mut self,
        storage_shard: usize,
        name: &str,
    ) -> io::Result<Option<(Vec<u8>, u64)>> {
        let answer = self
            .request(|b, header| {
                let name = b.create_string(name);
                let body = wire::ReplicaFileRequest::create(
                    b,
                    &wire::ReplicaFileRequestArgs {
                        storage_shard: storage_shard as u32,
                        name: Some(name),
                    },
                );
                build_frame(
                    b,
                    &header,
                    wire::Body::ReplicaFileRequest,
                    Some(body.as_union_value()),
                )
            })
            .await?;
        let body = require_ok(&answer, name)?
            .body_as_replica_file_response()
            .ok_or_else(|| io::Error::other("a ReplicaFileResponse without its body"))?;
        Ok(body.present().then(|| {
            (
                body.data().map(|d| d.bytes().to_vec()).unwrap_or_default(),
                body.master_end(),
            )
        }))
    }

    /// The master's topic configs, user and system topics.
    pub async fn topics(&mut self) -> io::Result<Vec<crate::topics::TopicConfig>> {
        let answer = self
            .request(|b, header| {
                let body = wire::BrokerTopicsRequest::create(
                    b,
                    &wire::BrokerTopicsRequestArgs {
                        include_system: true,
                    },
                );
                build_frame(
                    b,
                    &header,
                    wire::Body::BrokerTopicsRequest,
                    Some(body.as_union_value()),
                )
            })
            .await?;
        let topics = answer
            .frame()
            .body_as_broker_topics_response()
            .and_then(|r| r.topics())
            .ok_or_else(|| io::Error::other("a BrokerTopicsResponse without topics"))?;
        Ok(topics
            .iter()
            .map(|t| crate::topics::TopicConfig::from_wire(&t))
            .collect())
    }

    /// The master's consumer groups and the topics each has offsets for or subscribes to.
    pub async fn groups(&mut self) -> io::Result<Vec<(String, Vec<String>)>> {
        let answer = self
            .request(|b, header| {
                let body = wire::GroupListRequest::create(b, &wire::GroupListRequestArgs {});
                build_frame(
                    b,
                    &header,
                    wire::Body::GroupListRequest,
                    Some(body.as_union_value()),
                )
            })
            .await?;
        let groups = answer
            .frame()
            .body_as_group_list_response()
            .and_then(|r| r.groups())
            .ok_or_else(|| io::Error::other("a GroupListResponse without groups"))?;
        Ok(groups
            .iter()
            .map(|g| {
                let topics = g
                    .topics()
                    .iter()
                    .flat_map(|t| t.iter())
                    .map(str::to_owned)
                    .collect();
                (g.group().unwrap_or_default().to_owned(), topics)
            })
            .collect())
    }

    /// The master's committed offset of `group` for one queue, if it has one.
    pub async fn committed_offset(
        &mut self,
        group: &str,
        topic: &str,
        queue_id: u32,
    ) -> io::Result<Option<u64>> {
        let answer = self
            .request(|b, header| {
                let (group, topic) = (b.create_string(group), b.create_string(topic));
                let body = wire::QueryConsumerOffsetRequest::create(
                    b,
                    &wire::QueryConsumerOffsetRequestArgs {
                        consumer_group: Some(group),
                        topic: Some(topic),
                        queue_id: queue_id as i32,
                    },
                );
                build_frame(
                    b,
                    &header,
                    wire::Body::QueryConsumerOffsetRequest,
                    Some(body.as_union_value()),
                )
            })
            .await?;
        Ok(answer
            .frame()
            .body_as_offset_response()
            .and_then(|r| u64::try_from(r.offset()).ok()))
    }
}
