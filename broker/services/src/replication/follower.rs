//! The slave's side of replication: one loop per storage shard, on that shard's executor, that
//! joins the master (cutting its own log where it parts from the master's, by a restart), pulls
//! CommitLog bytes from the master's HA address and appends them through the store, reconnecting
//! after any failure; and the view of the master it keeps for status and metrics.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use crate::config::BrokerConfig;
use crate::layout::COPIED_FILES;
use crate::role::{master_address, own_address};
use crate::store::epochs::EpochLog;
use crate::store::{MessageStore, StoreError};

use super::link::MasterLink;
use super::{ShardReplication, SlaveTail, REPLICA_PULL_BYTES, SLAVE_SILENCE};

/// Pause before reconnecting to a master that could not be reached or answered with an error.
const RECONNECT_PAUSE: Duration = Duration::from_secs(1);
/// Pause before asking again a master whose join said to keep bytes it lost (an operator may
/// have changed something).
const KEEP_PAUSE: Duration = Duration::from_secs(5);

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
    let credentials = crate::peer_auth::credentials(&config);
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
    let mut keep_reported = false;
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
        let mut link = match MasterLink::connect(master, &client_id, credentials.as_ref()).await {
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
        let (start, end, _) = store.commitlog_offsets();
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
        if end < joined.log_start {
            // Retention took the master's bytes from where this log ends (a new slave, or one
            // down longer than the master keeps files): it cannot copy from here. Begin the
            // log again, empty, at the master's oldest byte; the store does it as it opens.
            let dir = store.config().shard_dir.clone();
            let segment_bytes = store.config().segment_bytes;
            if !joined.log_start.is_multiple_of(segment_bytes) {
                error!(
                    storage_shard,
                    %master,
                    log_start = joined.log_start,
                    segment_bytes,
                    "the master's log begins inside one of this slave's segments: their segment sizes differ (--segment-bytes must match); replication stops"
                );
                return;
            }
            warn!(
                storage_shard,
                %master,
                our_end = end,
                master_log_start = joined.log_start,
                master_end = joined.master_end,
                "this slave's log ends before the master's oldest byte (retention ran): beginning it again there and restarting"
            );
            match crate::store::request_start_at(&dir, joined.log_start) {
                Ok(()) => crate::role::request_restart(),
                Err(e) => {
                    error!(storage_shard, error = %e, "cannot ask for the new start; replication stops")
                }
            }
            return;
        }
        match joined.tail {
            SlaveTail::Return { end: tail_end } => {
                // The master lost the end of its previous term, which this log holds, and has
                // written nothing since: give it back, then join again.
                let from = joined.consistent_end;
                match return_tail(&mut link, &store, &config, storage_shard, from, tail_end).await {
                    Ok(master_end) => info!(
                        storage_shard,
                        %master,
                        from,
                        to = master_end,
                        "returned the bytes the master lost to it"
                    ),
                    Err(error) => {
                        warn!(storage_shard, %master, %error, "returning the bytes the master lost failed; joining again");
                        glommio::timer::sleep(RECONNECT_PAUSE).await;
                    }
                }
                keep_reported = false;
                continue;
            }
            SlaveTail::Keep { end: tail_end } => {
                // Acknowledged messages may be here only: never cut them. An operator decides
                // (docs/replication.md, "A master that lost its tail").
                if !keep_reported {
                    error!(
                        storage_shard,
                        %master,
                        from = joined.consistent_end,
                        to = tail_end,
                        master_end = joined.master_end,
                        "this slave holds bytes of the master's previous term that a slave acknowledged and the master lost, and the master has written past them: keeping them and not replicating (docs/replication.md, \"A master that lost its tail\")"
                    );
                    keep_reported = true;
                }
                was_connected = false;
                glommio::timer::sleep(KEEP_PAUSE).await;
                continue;
            }
            SlaveTail::Cut => keep_reported = false,
        }
        // A log begun again at the master's oldest byte holds nothing yet (and no terms before
        // its first copied bytes): there is nothing to cut.
        if joined.consistent_end < end && end > start {
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
            // Controller mode: consumers of this slave are served only what the master has
            // confirmed (every replica its sends wait for holds it), as on the master.
            if config.controller_self_id > 0 && chunk.confirmed > store.dispatch_limit() {
                store.set_dispatch_limit(chunk.confirmed);
                if chunk.bytes.is_empty() {
                    on_appended();
                }
            }
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

/// Sends this log's bytes `[from, to)` back to the master (its join answered RETURN), a
/// segment's part or [`REPLICA_PULL_BYTES`] at a time. Returns where the master's log ends.
async fn return_tail(
    link: &mut MasterLink,
    store: &MessageStore,
    config: &BrokerConfig,
    storage_shard: usize,
    from: u64,
    to: u64,
) -> Result<u64, String> {
    let mut at = from;
    let mut master_end = from;
    while at < to {
        let max = (to - at).min(u64::from(REPLICA_PULL_BYTES));
        let bytes = store
            .read_for_replica(at, max)
            .await
            .map_err(|e| format!("reading this log at {at}: {e}"))?;
        if bytes.is_empty() {
            return Err(format!(
                "this log has no bytes at {at} to return (it ends before {to})"
            ));
        }
        let last = at + bytes.len() as u64 >= to;
        master_end = link
            .return_bytes(storage_shard, config.broker_id, at, &bytes, last)
            .await
            .map_err(|e| e.to_string())?;
        at += bytes.len() as u64;
    }
    Ok(master_end)
}
