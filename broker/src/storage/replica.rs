//! The replica arms of a master storage shard (docs/replication.md): a slave's join, its pulls
//! of CommitLog bytes (held while nothing is new), the state files it copies, the view the
//! controller's in-sync computation reads; and what the rest of the shard asks of
//! replication: a sync master's wait for its slaves, and where a consumer should read next
//! under `slave_read_enable`.

use std::time::Duration;

use tracing::{error, info, warn};

use crate::mesh::{ReplicaPull, Reply};

use super::shard::StorageShard;

impl StorageShard {
    pub(super) async fn read_for_replica(&self, pull: ReplicaPull) {
        let ReplicaPull {
            from,
            acknowledged,
            max_bytes,
            suspend_ms,
            epoch,
            broker_id,
            link,
            reply,
        } = pull;
        let log_end = self.store.commitlog_offsets().1;
        if let Err(why) = self.master.on_pull(broker_id, link, acknowledged, log_end) {
            let _ = reply.send(Err(why));
            return;
        }
        self.note_replicated_term();
        self.refresh_confirmed();
        if epoch != self.master.epoch() {
            let _ = reply.send(Err(format!(
                "this master is in term {}, not {epoch}: join again",
                self.master.epoch()
            )));
            return;
        }
        let deadline = std::time::Instant::now() + Duration::from_millis(suspend_ms);
        let answer = loop {
            // Wait for the next arrival before reading, so none is missed in between.
            let arrival = self.store.arrival();
            let confirmed_moved = self.master.confirmed_moved();
            match self.store.read_for_replica(from, max_bytes).await {
                Ok(bytes)
                    if bytes.is_empty()
                        && !*self.stopping.borrow()
                        && !self.master.has_unsent_confirmed(broker_id) =>
                {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        break Ok(bytes);
                    }
                    futures_lite::future::or(
                        futures_lite::future::or(arrival, confirmed_moved),
                        glommio::timer::sleep(left),
                    )
                    .await;
                }
                other => break other,
            }
        };
        let end = self.store.commitlog_offsets().1;
        let confirmed = if self.config.role() == crate::config::BrokerRole::SyncMaster {
            self.master.confirmed_for(broker_id)
        } else {
            self.store.visible_offset()
        };
        let _ = reply.send(
            answer
                .map(|bytes| crate::replication::ReplicaChunk {
                    bytes,
                    master_end: end,
                    epoch: self.master.epoch(),
                    lag_ms: self.master.age_ms(from, end),
                    confirmed,
                })
                .map_err(|e| e.to_string()),
        );
    }

    /// Sync master: moves the confirmed offset (the replicas' acknowledgements, the
    /// SyncStateSet, the local end may have changed), lets the store dispatch the records now
    /// below it, and wakes the pulls parked on queues that grew.
    pub(super) fn refresh_confirmed(&self) {
        if self.config.role() != crate::config::BrokerRole::SyncMaster {
            return;
        }
        if let Some(confirmed) = self.master.refresh_confirmed(self.store.visible_offset()) {
            self.store.set_dispatch_limit(confirmed);
            self.notify_replicated();
        }
    }

    /// Wakes the pulls parked on `topic`/`queue_id` after an append to it; on a sync master
    /// the records become visible to pulls only once confirmed, which wakes them then.
    pub(super) fn notify_appended(&self, topic: &str, queue_id: u32) {
        if self.config.role() == crate::config::BrokerRole::SyncMaster {
            self.refresh_confirmed();
        } else {
            self.notify_arrival(topic, queue_id);
        }
    }

    pub(super) async fn read_shard_file(
        &self,
        name: &'static str,
        reply: Reply<(Option<Vec<u8>>, u64)>,
    ) {
        let end = self.store.commitlog_offsets().1;
        let path = self.store.config().shard_dir.join(name);
        let read = glommio::executor()
            .spawn_blocking(move || std::fs::read(path).ok())
            .await;
        let _ = reply.send((read, end));
    }

    pub(super) fn replica_sync_view(&self, reply: Reply<crate::replication::SyncView>) {
        let _ = reply.send(self.master.sync_view(self.store.commitlog_offsets().1));
    }

    pub(super) fn replica_progress(&self, reply: Reply<(u64, u64)>) {
        let last_epoch = self.master.epochs.borrow().last().epoch;
        let _ = reply.send((last_epoch, self.store.commitlog_offsets().1));
    }

    pub(super) fn replica_join(
        &self,
        broker_id: i64,
        peer: String,
        end: u64,
        epochs: crate::store::epochs::EpochLog,
        link: crate::replication::ReplicaLink,
        reply: Reply<crate::replication::JoinAnswer>,
    ) {
        let (log_start, log_end, _) = self.store.commitlog_offsets();
        let answer = self
            .master
            .join(broker_id, link, &epochs, end, log_start, log_end);
        self.master
            .on_join(broker_id, &peer, answer.consistent_end.min(end), link);
        match answer.tail {
            crate::replication::SlaveTail::Return { end: tail_end } => info!(
                shard = self.id,
                broker_id,
                from = log_end,
                to = tail_end,
                "a slave holds bytes of this master's previous term its log lost: taking them back before writing"
            ),
            crate::replication::SlaveTail::Keep { end: tail_end } => error!(
                shard = self.id,
                broker_id,
                from = answer.consistent_end,
                to = tail_end,
                "a slave holds bytes of this master's previous term, which a slave acknowledged, that this master lost and has written past since: the slave keeps them and does not replicate (docs/replication.md, \"A master that lost its tail\")"
            ),
            crate::replication::SlaveTail::Cut => {
                // A replica of the last term joined holding nothing this log lost: the
                // appends held for it go ahead.
                if self.store.appends_held() && self.master.knew_guarded_term(&epochs) {
                    self.release_appends("a slave of the guarded term joined holding nothing this log lost");
                }
            }
        }
        let _ = reply.send(answer);
    }

    /// Bytes a slave returns after a join answered RETURN: appended as replicated bytes (every
    /// record checked); the current term (which holds nothing of its own) then begins after
    /// them. The answer is where this log ends.
    pub(super) async fn replica_return(
        &self,
        broker_id: i64,
        link: crate::replication::ReplicaLink,
        from: u64,
        data: bytes::Bytes,
        last: bool,
        reply: Reply<Result<u64, String>>,
    ) {
        let log_end = self.store.commitlog_offsets().1;
        let until =
            match self
                .master
                .check_return(broker_id, link, from, data.len() as u64, log_end)
            {
                Ok(until) => until,
                Err(why) => {
                    let _ = reply.send(Err(why));
                    return;
                }
            };
        let appended = match self.store.append_replicated(from, &data).await {
            Ok(end) => end,
            Err(e) => {
                self.master.stop_return();
                let _ = reply.send(Err(format!("returned bytes refused: {e}")));
                return;
            }
        };
        self.store.wait_visible_to_current_end().await;
        let done = last || appended >= until;
        self.master.returned(appended, done);
        let dir = self.store.config().shard_dir.clone();
        let log = self.master.epochs.borrow().clone();
        if let Err(e) = glommio::executor()
            .spawn_blocking(move || log.save(&dir))
            .await
        {
            let _ = reply.send(Err(format!("cannot record the moved term: {e}")));
            return;
        }
        if done {
            info!(
                shard = self.id,
                broker_id,
                end = appended,
                term_start = self.master.epochs.borrow().last().start,
                "the slave returned this master's lost bytes; its term begins after them"
            );
            self.release_appends("the slave returned the bytes this log lost");
        }
        let _ = reply.send(Ok(appended));
    }

    /// Lets local appends go ahead again (see `storage::hold_for_lost_tail`).
    pub(super) fn release_appends(&self, why: &str) {
        if self.store.appends_held() {
            self.store.hold_appends(None);
            info!(shard = self.id, why, "appends go ahead");
        }
    }

    /// Sync master: records the current term once a slave first acknowledges bytes of it
    /// (`store::epochs::REPLICATED_TERM_FILE`).
    fn note_replicated_term(&self) {
        if self.config.role() != crate::config::BrokerRole::SyncMaster {
            return;
        }
        if let Some(term) = self.master.replicated_term_due() {
            let dir = self.store.config().shard_dir.clone();
            let id = self.id;
            glommio::spawn_local(async move {
                let saved = glommio::executor()
                    .spawn_blocking(move || crate::store::epochs::save_replicated_term(&dir, term))
                    .await;
                if let Err(e) = saved {
                    warn!(shard = id, error = %e, "cannot record the replicated term");
                }
            })
            .detach();
        }
    }

    /// Sync master: waits until its replicas hold every record of `outcome` (a stored append)
    /// and sets its status to what they said (OK, FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE).
    /// Other roles, and appends not stored OK, are left as they are.
    pub(super) async fn wait_replicated_outcome(&self, outcome: &mut crate::store::AppendOutcome) {
        if self.config.role() != crate::config::BrokerRole::SyncMaster
            || outcome.status != crate::store::AppendStatus::Ok
        {
            return;
        }
        let end = outcome
            .records
            .iter()
            .map(|r| r.physical_offset + u64::from(r.size))
            .max()
            .unwrap_or(0);
        outcome.status = self.wait_replicated(end).await;
    }

    /// Sync master: waits until a slave acknowledges every byte below `end`, up to
    /// `sync_flush_timeout_ms`.
    pub(super) async fn wait_replicated(&self, end: u64) -> crate::store::AppendStatus {
        let timeout = Duration::from_millis(self.config.sync_flush_timeout_ms);
        self.master
            .wait_replicated(end, timeout, self.config.min_in_sync_replicas)
            .await
    }

    /// `slave_read_enable` (RocketMQ's slaveReadEnable): where the consumer that got `records`
    /// should pull this queue next. A master sends a consumer more than `slave_read_lag_bytes`
    /// behind its log's end to the lowest-id live slave that holds everything up to where the
    /// consumer continues; a slave sends a consumer that has caught up back to the master (0).
    pub(super) fn suggest_reader(&self, records: &[bytes::Bytes]) -> i64 {
        if !self.config.slave_read_enable {
            return 0;
        }
        let Some(position) = records.last().and_then(|r| {
            shardmq_codec::RecordView::parse_unchecked(r)
                .ok()
                .map(|v| v.physical_offset() + r.len() as u64)
        }) else {
            return 0;
        };
        let end = self.store.commitlog_offsets().1;
        let is_far_behind = end.saturating_sub(position) > self.config.slave_read_lag_bytes;
        match self.config.role() {
            crate::config::BrokerRole::Slave if is_far_behind => self.config.broker_id,
            crate::config::BrokerRole::Slave => 0,
            _ if is_far_behind => self.master.reader_holding(position).unwrap_or(0),
            _ => 0,
        }
    }
}
