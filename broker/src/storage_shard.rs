//! A storage shard: the executor task set that owns one `MessageStore`, the consumer offsets of
//! its queues, the long-poll watches on them, and (shard 0 only) the topic table and client
//! membership.
//!
//! Requests arrive from every network shard over bounded glommio channels; each is served on
//! its own local task, so a sync append waiting for its flush never holds up a pull. It opens
//! no sockets; it answers through the one-shot reply in each request and pushes events
//! (arrivals, topic snapshots, membership changes) back to the network shards.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use glommio::channels::shared_channel::{
    ConnectedReceiver, ConnectedSender, SharedReceiver, SharedSender,
};
use tracing::{error, info, warn};

use crate::config::BrokerConfig;
use crate::groups::ClientRegistry;
use crate::mesh::{NetworkEvent, QueueStat, StorageRequest};
use crate::offsets::{ConsumerOffsets, LoadOutcome, OFFSETS_FILE};
use crate::store::atomic_file::write_atomically_async;
use crate::store::record::RecordView;
use crate::store::{GetStatus, MessageStore, TagFilter};
use crate::topics::{TopicTable, TOPICS_FILE};

/// State only storage shard 0 has.
struct Control {
    data_dir: PathBuf,
    topics: RefCell<TopicTable>,
    clients: RefCell<ClientRegistry>,
    /// Queue locks of orderly consumer groups (in memory only).
    locks: RefCell<crate::queue_locks::QueueLocks>,
    /// Unresolved transaction half messages (their queues live on this shard).
    transactions: crate::transaction::Transactions,
}

struct StorageShard {
    id: usize,
    config: Rc<BrokerConfig>,
    store: MessageStore,
    offsets: RefCell<ConsumerOffsets>,
    /// topic → queue → bitmask of network shards waiting for an arrival.
    watches: RefCell<HashMap<String, HashMap<u32, u64>>>,
    /// Watched queue → its end when the first pull parked (a slave wakes them by growth).
    parked_at: RefCell<HashMap<(String, u32), u64>>,
    events: Vec<ConnectedSender<NetworkEvent>>,
    control: Option<Control>,
    stopping: RefCell<bool>,
    /// Master: its terms and slaves (replication.rs); a sync master's sends wait on it.
    master: Rc<crate::replication::MasterSide>,
    /// Slave: what its replication loop knows of the master.
    slave_view: Rc<crate::replication::SlaveView>,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Runs storage shard `id` until every network shard has closed its request channel, then
/// flushes and persists everything. Returns an error only when the shard cannot start.
pub async fn run(
    id: usize,
    config: Rc<BrokerConfig>,
    requests: Vec<SharedReceiver<StorageRequest>>,
    events: Vec<SharedSender<NetworkEvent>>,
) -> Result<(), String> {
    // Connect every channel end at once: a peer may connect its ends in any order.
    let event_tasks: Vec<_> = events
        .into_iter()
        .map(|s| glommio::spawn_local(s.connect()))
        .collect();
    let request_tasks: Vec<_> = requests
        .into_iter()
        .map(|r| glommio::spawn_local(r.connect()))
        .collect();
    let mut connected_events = Vec::with_capacity(event_tasks.len());
    for task in event_tasks {
        connected_events.push(task.await);
    }
    let mut connected_requests: Vec<ConnectedReceiver<StorageRequest>> = Vec::new();
    for task in request_tasks {
        connected_requests.push(task.await);
    }

    let store_config = config.store_config(id);
    let shard_dir = store_config.shard_dir.clone();
    let (store, report) = MessageStore::open(store_config).await.map_err(|e| {
        format!(
            "storage shard {id}: cannot open the store in {}: {e}",
            shard_dir.display()
        )
    })?;
    store.set_flush_observer(Box::new(|took| {
        crate::metrics::broker()
            .flush_latency
            .observe(took.as_secs_f64())
    }));
    info!(
        shard = id,
        end_offset = report.commitlog.end_offset,
        records_scanned = report.commitlog.records_scanned,
        records_redispatched = report.records_redispatched,
        rebuilt_derived = report.rebuilt_derived,
        "storage shard recovered"
    );
    if let Some(offset) = report.truncated_for_replica {
        warn!(
            shard = id,
            offset, "the CommitLog was cut where the master's log parts from it (replication)"
        );
    }
    if let Some((offset, why)) = &report.commitlog.truncated_at {
        warn!(shard = id, offset, why = %why, discarded_bytes = report.commitlog.discarded_bytes, "recovery cut the CommitLog");
    }
    if let Some(problem) = &report.checkpoint_problem {
        warn!(shard = id, %problem, "checkpoint was unusable; derived files were rebuilt");
    }
    let (offsets, outcome) = ConsumerOffsets::load(&shard_dir)
        .map_err(|e| format!("storage shard {id}: cannot read offsets: {e}"))?;
    if let LoadOutcome::MovedAside(path, why) = &outcome {
        warn!(shard = id, moved_to = %path.display(), %why, "consumer offsets file was damaged; consumers resume from their start point");
    }

    // The master terms of this shard's log (store/epochs.rs): a master begins one as it starts;
    // a slave forgets any its log no longer reaches.
    let epochs = {
        let mut epochs = crate::store::epochs::EpochLog::load(&shard_dir)
            .map_err(|e| format!("storage shard {id}: cannot read the epoch log: {e}"))?;
        let end = store.commitlog_offsets().1;
        if config.role() == crate::config::BrokerRole::Slave {
            epochs.truncate(end);
        } else {
            let term = epochs.begin_term(end, config.controller_epoch);
            info!(
                shard = id,
                epoch = term.epoch,
                start = term.start,
                "master term begins"
            );
        }
        epochs
            .save(&shard_dir)
            .map_err(|e| format!("storage shard {id}: cannot write the epoch log: {e}"))?;
        Rc::new(RefCell::new(epochs))
    };

    let control = if id == 0 {
        let mut topics = TopicTable::load(&config.data_dir)?;
        let storage_shards = config.storage_cores.len();
        crate::transaction::ensure_topics(&mut topics, storage_shards);
        let transactions = crate::transaction::Transactions::new(
            storage_shards,
            crate::transaction::CheckSettings::from_config(&config),
        );
        let summary = transactions
            .recover(&store)
            .await
            .map_err(|e| format!("storage shard 0: cannot read the transaction queues: {e}"))?;
        info!(
            half_messages = summary.half_messages,
            op_records = summary.op_records,
            unresolved = summary.unresolved,
            "transactions recovered"
        );
        Some(Control {
            data_dir: config.data_dir.clone(),
            topics: RefCell::new(topics),
            clients: RefCell::new(ClientRegistry::default()),
            locks: RefCell::new(crate::queue_locks::QueueLocks::new(
                config.queue_lock_expiry_ms,
            )),
            transactions,
        })
    } else {
        None
    };

    let shard = Rc::new(StorageShard {
        id,
        config,
        store,
        offsets: RefCell::new(offsets),
        watches: RefCell::new(HashMap::new()),
        parked_at: RefCell::new(HashMap::new()),
        events: connected_events,
        control,
        stopping: RefCell::new(false),
        master: Rc::new(crate::replication::MasterSide::new(epochs.clone())),
        slave_view: Rc::new(crate::replication::SlaveView::default()),
    });
    if shard.control.is_some() {
        shard.broadcast_topics();
    }
    shard.broadcast(|| NetworkEvent::StorageReady { shard: id });

    // Delay levels and timer messages of this shard's queues (schedule.rs, timer.rs).
    let on_arrival: crate::schedule::ArrivalHook = {
        let shard = shard.clone();
        Rc::new(move |topic: &str, queue_id: u32| shard.notify_arrival(topic, queue_id))
    };
    // A slave's CommitLog is its master's copy: it appends nothing of its own (no scheduled
    // deliveries), and replicates instead (replication.rs).
    let is_slave = shard.config.role() == crate::config::BrokerRole::Slave;
    let delay_service = if is_slave {
        None
    } else {
        Some(crate::schedule::DelayService::start(
            id,
            &shard.config,
            shard.store.clone(),
            &shard_dir,
            on_arrival.clone(),
        )?)
    };
    let timer_service = (!is_slave).then(|| {
        crate::timer::TimerService::start(
            id,
            &shard.config,
            shard.store.clone(),
            &shard_dir,
            on_arrival,
        )
    });
    let replication_task = if is_slave {
        glommio::spawn_local(crate::replication::follow(crate::replication::Follower {
            storage_shard: id,
            config: shard.config.clone(),
            store: shard.store.clone(),
            epochs,
            view: shard.slave_view.clone(),
            on_appended: {
                let shard = shard.clone();
                Rc::new(move || shard.notify_replicated())
            },
        }))
        .detach()
    } else {
        glommio::spawn_local(shard.master.clone().mark_loop(shard.store.clone())).detach()
    };
    let persist_task = glommio::spawn_local(persist_offsets_loop(shard.clone())).detach();
    let expiry_task = shard
        .control
        .as_ref()
        .map(|_| glommio::spawn_local(expire_clients_loop(shard.clone())).detach());
    let transaction_check_task = shard
        .control
        .as_ref()
        .filter(|_| !is_slave)
        .map(|_| glommio::spawn_local(transaction_check_loop(shard.clone())).detach());

    let loops: Vec<_> = connected_requests
        .into_iter()
        .map(|receiver| {
            let shard = shard.clone();
            glommio::spawn_local(async move {
                while let Some(request) = receiver.recv().await {
                    let shard = shard.clone();
                    glommio::spawn_local(async move { shard.handle(request).await }).detach();
                }
            })
            .detach()
        })
        .collect();
    for task in loops {
        task.await;
    }

    // Every network shard has gone: persist and close.
    *shard.stopping.borrow_mut() = true;
    if let Some(task) = expiry_task {
        task.cancel();
    }
    if let Some(task) = transaction_check_task {
        task.cancel();
    }
    persist_task.cancel();
    replication_task.cancel();
    if let Some(service) = &delay_service {
        service.stop().await;
    }
    if let Some(service) = &timer_service {
        service.stop().await;
    }
    shard.persist_offsets().await;
    if let Err(e) = shard.store.close().await {
        error!(shard = id, error = %e, "closing the store failed");
    } else {
        // Closing made every delivery durable: now the progress may say so.
        if let Some(service) = &delay_service {
            service.persist_final().await;
        }
        if let Some(service) = &timer_service {
            service.persist_final().await;
        }
    }
    info!(shard = id, "storage shard stopped");
    Ok(())
}

impl StorageShard {
    fn broadcast(&self, make: impl Fn() -> NetworkEvent) {
        for sender in &self.events {
            if sender.try_send(make()).is_err() {
                warn!(
                    shard = self.id,
                    "network shard event channel full or closed; event dropped"
                );
            }
        }
    }

    fn broadcast_topics(&self) {
        if let Some(control) = &self.control {
            let snapshot = Arc::new(control.topics.borrow().clone());
            self.broadcast(|| NetworkEvent::Topics(snapshot.clone()));
        }
    }

    /// Sync master: waits until a slave acknowledges every byte below `end`, up to
    /// `sync_flush_timeout_ms`.
    async fn wait_replicated(&self, end: u64) -> crate::store::AppendStatus {
        let timeout = Duration::from_millis(self.config.sync_flush_timeout_ms);
        self.master
            .wait_replicated(end, timeout, self.config.min_in_sync_replicas)
            .await
    }

    /// `slave_read_enable` (RocketMQ's slaveReadEnable): where the consumer that got `records`
    /// should pull this queue next. A master sends a consumer more than `slave_read_lag_bytes`
    /// behind its log's end to the lowest-id live slave that holds everything up to where the
    /// consumer continues; a slave sends a consumer that has caught up back to the master (0).
    fn suggest_reader(&self, records: &[bytes::Bytes]) -> i64 {
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

    fn notify_arrival(&self, topic: &str, queue_id: u32) {
        let mask = {
            let mut watches = self.watches.borrow_mut();
            let Some(queues) = watches.get_mut(topic) else {
                return;
            };
            let mask = queues.remove(&queue_id);
            if queues.is_empty() {
                watches.remove(topic);
            }
            mask
        };
        self.parked_at
            .borrow_mut()
            .remove(&(topic.to_owned(), queue_id));
        let Some(mask) = mask else { return };
        for (network_shard, sender) in self.events.iter().enumerate() {
            if mask & (1 << network_shard) != 0 {
                // A dropped arrival only delays a parked pull until its timeout.
                let _ = sender.try_send(NetworkEvent::Arrival {
                    topic: topic.to_owned(),
                    queue_id,
                });
            }
        }
    }

    fn watch(&self, topic: &str, queue_id: u32, network_shard: usize) {
        let mut watches = self.watches.borrow_mut();
        *watches
            .entry(topic.to_owned())
            .or_default()
            .entry(queue_id)
            .or_default() |= 1 << network_shard;
        drop(watches);
        // Where the queue ended when the pull parked (a pull parks only at the end).
        let max = self
            .store
            .queue_offsets(topic, queue_id)
            .map_or(0, |(_, max)| max);
        self.parked_at
            .borrow_mut()
            .entry((topic.to_owned(), queue_id))
            .or_insert(max);
    }

    /// A slave appended replicated bytes: wakes the parked pulls of every watched queue that
    /// grew past where its pulls parked.
    fn notify_replicated(&self) {
        let grown: Vec<(String, u32)> = self
            .parked_at
            .borrow()
            .iter()
            .filter(|((topic, queue_id), at)| {
                self.store
                    .queue_offsets(topic, *queue_id)
                    .is_some_and(|(_, max)| max > **at)
            })
            .map(|(key, _)| key.clone())
            .collect();
        for (topic, queue_id) in grown {
            self.notify_arrival(&topic, queue_id);
        }
    }

    async fn handle(&self, request: StorageRequest) {
        match request {
            StorageRequest::Append { batch, reply } => {
                let target = batch_queue(&batch);
                let mut result = self.store.append(batch).await;
                if let (Ok(_), Some((topic, queue_id))) = (&result, target) {
                    self.notify_arrival(&topic, queue_id);
                }
                if let Ok(outcome) = &mut result {
                    if self.config.role() == crate::config::BrokerRole::SyncMaster
                        && outcome.status == crate::store::AppendStatus::Ok
                    {
                        let end = outcome
                            .records
                            .iter()
                            .map(|r| r.physical_offset + u64::from(r.size))
                            .max()
                            .unwrap_or(0);
                        outcome.status = self.wait_replicated(end).await;
                    }
                }
                let _ = reply.send(result);
            }
            StorageRequest::Pull {
                query,
                watch_for,
                reply,
            } => {
                let result = self
                    .store
                    .get_messages(
                        &query.topic,
                        query.queue_id,
                        query.offset,
                        query.max_messages,
                        query.max_bytes,
                        &query.filter,
                    )
                    .await;
                let mut result = result;
                if let Ok(got) = &mut result {
                    got.suggest_broker_id = self.suggest_reader(&got.records);
                }
                if let (Ok(got), Some(network_shard)) = (&result, watch_for) {
                    let is_at_end = matches!(got.status, GetStatus::NoNewMessage)
                        || (got.status == GetStatus::NoMatchedQueue && query.offset == 0);
                    if is_at_end {
                        self.watch(&query.topic, query.queue_id, network_shard);
                    }
                }
                let _ = reply.send(result);
            }
            StorageRequest::QueueOffsets {
                topic,
                queue_id,
                reply,
            } => {
                let _ = reply.send(self.store.queue_offsets(&topic, queue_id));
            }
            StorageRequest::QueueStats {
                topic,
                queue_ids,
                reply,
            } => {
                let mut stats = Vec::with_capacity(queue_ids.len());
                for queue_id in queue_ids {
                    let (min_offset, max_offset) =
                        self.store.queue_offsets(&topic, queue_id).unwrap_or((0, 0));
                    let last_update_ms = if max_offset > min_offset {
                        self.last_store_time(&topic, queue_id, max_offset - 1).await
                    } else {
                        0
                    };
                    stats.push(QueueStat {
                        queue_id,
                        min_offset,
                        max_offset,
                        last_update_ms,
                    });
                }
                let _ = reply.send(stats);
            }
            StorageRequest::OffsetByTime {
                topic,
                queue_id,
                timestamp_ms,
                reply,
            } => {
                let _ = reply.send(
                    self.store
                        .offset_by_time(&topic, queue_id, timestamp_ms)
                        .await,
                );
            }
            StorageRequest::QueryConsumerOffset {
                group,
                topic,
                queue_id,
                reply,
            } => {
                let _ = reply.send(self.offsets.borrow().get(&group, &topic, queue_id));
            }
            StorageRequest::CommitConsumerOffset {
                group,
                topic,
                queue_id,
                offset,
                reply,
            } => {
                self.offsets
                    .borrow_mut()
                    .commit(&group, &topic, queue_id, offset);
                let _ = reply.send(());
            }
            StorageRequest::QueryByKey {
                topic,
                key,
                begin_ms,
                end_ms,
                max_results,
                reply,
            } => {
                let _ = reply.send(
                    self.store
                        .query_by_key(&topic, &key, begin_ms, end_ms, max_results)
                        .await,
                );
            }
            StorageRequest::QueryByUniqueId {
                unique_id,
                begin_ms,
                end_ms,
                reply,
            } => {
                let _ = reply.send(
                    self.store
                        .query_by_unique_id(&unique_id, begin_ms, end_ms, 32)
                        .await,
                );
            }
            StorageRequest::ReadAt {
                physical_offset,
                reply,
            } => {
                let _ = reply.send(self.store.read_record_at(physical_offset).await);
            }
            StorageRequest::ReadForReplica {
                from,
                acknowledged,
                max_bytes,
                suspend_ms,
                epoch,
                broker_id,
                reply,
            } => {
                let log_end = self.store.commitlog_offsets().1;
                self.master.on_pull(broker_id, "", acknowledged, log_end);
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
                    match self.store.read_for_replica(from, max_bytes).await {
                        Ok(bytes) if bytes.is_empty() && !*self.stopping.borrow() => {
                            let left =
                                deadline.saturating_duration_since(std::time::Instant::now());
                            if left.is_zero() {
                                break Ok(bytes);
                            }
                            futures_lite::future::or(arrival, glommio::timer::sleep(left)).await;
                        }
                        other => break other,
                    }
                };
                let end = self.store.commitlog_offsets().1;
                let _ = reply.send(
                    answer
                        .map(|bytes| crate::replication::ReplicaChunk {
                            bytes,
                            master_end: end,
                            epoch: self.master.epoch(),
                            lag_ms: self.master.age_ms(from, end),
                        })
                        .map_err(|e| e.to_string()),
                );
            }
            StorageRequest::ReadShardFile { name, reply } => {
                let end = self.store.commitlog_offsets().1;
                let path = self.store.config().shard_dir.join(name);
                let read = glommio::executor()
                    .spawn_blocking(move || std::fs::read(path).ok())
                    .await;
                let _ = reply.send((read, end));
            }
            StorageRequest::StoredQueues { reply } => {
                let queues = self
                    .store
                    .queues()
                    .into_iter()
                    .map(|(topic, queue_id, _, _)| (topic, queue_id))
                    .collect();
                let _ = reply.send(queues);
            }
            StorageRequest::ReplicaSyncView { reply } => {
                let _ = reply.send(self.master.sync_view(self.store.commitlog_offsets().1));
            }
            StorageRequest::ReplicaJoin {
                broker_id,
                peer,
                end,
                epochs,
                reply,
            } => {
                let log_end = self.store.commitlog_offsets().1;
                let answer = self.master.join(&epochs, end, log_end);
                self.master
                    .on_join(broker_id, &peer, answer.consistent_end.min(end));
                let _ = reply.send(answer);
            }
            StorageRequest::UpsertTopic {
                config,
                is_create_only,
                reply,
            } => {
                let result = match &self.control {
                    Some(control) => {
                        let result = control.topics.borrow_mut().upsert(config, is_create_only);
                        if result.is_ok() {
                            self.persist_topics().await;
                            self.broadcast_topics();
                        }
                        result
                    }
                    None => Err(crate::topics::UpsertError::Invalid(
                        "topic requests go to storage shard 0".into(),
                    )),
                };
                let _ = reply.send(result);
            }
            StorageRequest::DeleteTopic { topic, reply } => {
                let removed = self
                    .control
                    .as_ref()
                    .is_some_and(|control| control.topics.borrow_mut().delete(&topic));
                if removed {
                    self.persist_topics().await;
                    self.broadcast_topics();
                }
                let _ = reply.send(removed);
            }
            StorageRequest::Heartbeat {
                client_id,
                connection,
                producer_groups,
                consumer_groups,
                reply,
            } => {
                if let Some(control) = &self.control {
                    let needs_topics = self.ensure_retry_topics(control, consumer_groups.keys());
                    let changed = control.clients.borrow_mut().heartbeat(
                        &client_id,
                        connection,
                        now_ms(),
                        producer_groups,
                        consumer_groups,
                    );
                    if needs_topics {
                        self.persist_topics().await;
                        self.broadcast_topics();
                    }
                    self.announce_changes(changed);
                }
                let _ = reply.send(());
            }
            StorageRequest::UnregisterClient {
                client_id,
                producer_group,
                consumer_group,
                reply,
            } => {
                if let Some(control) = &self.control {
                    let changed = control.clients.borrow_mut().unregister(
                        &client_id,
                        producer_group.as_deref(),
                        consumer_group.as_deref(),
                    );
                    self.announce_changes(changed);
                }
                let _ = reply.send(());
            }
            StorageRequest::ClientsAlive { clients } => {
                if let Some(control) = &self.control {
                    let now = now_ms();
                    let mut table = control.clients.borrow_mut();
                    for (client_id, connection) in clients {
                        table.touch(&client_id, connection, now);
                    }
                }
            }
            StorageRequest::ClientGone {
                client_id,
                connection,
            } => {
                if let Some(control) = &self.control {
                    let changed = control
                        .clients
                        .borrow_mut()
                        .connection_closed(&client_id, connection);
                    self.announce_changes(changed);
                }
            }
            StorageRequest::EnsureSystemTopic {
                name,
                queues,
                reply,
            } => {
                if let Some(control) = &self.control {
                    if control
                        .topics
                        .borrow_mut()
                        .ensure_system_topic(&name, queues)
                    {
                        self.persist_topics().await;
                        self.broadcast_topics();
                    }
                }
                let _ = reply.send(());
            }
            StorageRequest::ConsumerList { group, reply } => {
                let members = self
                    .control
                    .as_ref()
                    .map(|c| c.clients.borrow().consumers_of(&group))
                    .unwrap_or_default();
                let _ = reply.send(members);
            }
            StorageRequest::MetricsSnapshot { reply } => {
                let _ = reply.send(self.metrics_snapshot());
            }
            // Dropping the request unanswered tells the network shard this shard cannot serve
            // it (only shard 0 keeps transactions and locks).
            StorageRequest::Transaction(request) => {
                if let Some(control) = &self.control {
                    control.transactions.serve(&self.store, request).await;
                }
            }
            StorageRequest::QueueLock(request) => {
                if let Some(control) = &self.control {
                    control.locks.borrow_mut().serve(request, now_ms());
                }
            }
        }
    }

    /// Every consumer group gets its retry topic (`%RETRY%<group>`, one queue), as in RocketMQ.
    fn ensure_retry_topics<'a>(
        &self,
        control: &Control,
        groups: impl Iterator<Item = &'a String>,
    ) -> bool {
        let mut topics = control.topics.borrow_mut();
        let mut changed = false;
        for group in groups {
            changed |= topics
                .ensure_system_topic(&format!("{}{group}", crate::naming::RETRY_TOPIC_PREFIX), 1);
        }
        changed
    }

    fn announce_changes(&self, groups: Vec<String>) {
        for group in groups {
            self.broadcast(|| NetworkEvent::ConsumerIdsChanged {
                group: group.clone(),
            });
        }
    }

    async fn last_store_time(&self, topic: &str, queue_id: u32, offset: u64) -> i64 {
        match self
            .store
            .get_messages(topic, queue_id, offset, 1, 1, &TagFilter::All)
            .await
        {
            Ok(result) => result
                .records
                .first()
                .and_then(|r| {
                    RecordView::parse_unchecked(r)
                        .ok()
                        .map(|v| v.store_timestamp_ms())
                })
                .unwrap_or(0),
            Err(_) => 0,
        }
    }

    async fn persist_topics(&self) {
        let Some(control) = &self.control else { return };
        let bytes = control.topics.borrow().to_json();
        if let Err(e) = write_atomically_async(control.data_dir.join(TOPICS_FILE), bytes).await {
            error!(error = %e, "cannot persist the topic table");
        }
    }

    /// Consumer lag per (group, topic) over this shard's queues, and the CommitLog's size.
    fn metrics_snapshot(&self) -> crate::mesh::StorageSnapshot {
        let mut lag: std::collections::BTreeMap<(String, String), u64> = Default::default();
        for (group, topic, queue_id, committed) in self.offsets.borrow().rows() {
            let max = self
                .store
                .queue_offsets(&topic, queue_id)
                .map_or(0, |(_, max)| max);
            *lag.entry((group, topic)).or_default() += max.saturating_sub(committed);
        }
        let live_groups = self
            .control
            .as_ref()
            .map(|control| control.clients.borrow().group_summaries())
            .unwrap_or_default();
        crate::mesh::StorageSnapshot {
            consumer_lag: lag.into_iter().map(|((g, t), n)| (g, t, n)).collect(),
            commitlog_bytes: self.store.commitlog_disk_bytes(),
            live_groups,
            replication: {
                let end = self.store.commitlog_offsets().1;
                if self.config.role() == crate::config::BrokerRole::Slave {
                    self.slave_view.status(end)
                } else {
                    self.master.status(end)
                }
            },
        }
    }

    async fn persist_offsets(&self) {
        if !self.offsets.borrow().is_dirty() {
            return;
        }
        let bytes = self.offsets.borrow_mut().snapshot();
        let path = self
            .config
            .store_config(self.id)
            .shard_dir
            .join(OFFSETS_FILE);
        if let Err(e) = write_atomically_async(path, bytes).await {
            error!(shard = self.id, error = %e, "cannot persist consumer offsets");
        }
    }
}

/// (topic, queue) of a batch: all its records share them (one send = one queue).
fn batch_queue(batch: &crate::store::EncodedBatch) -> Option<(String, u32)> {
    batch
        .first_queue()
        .map(|(topic, queue_id)| (topic.to_owned(), queue_id))
}

async fn persist_offsets_loop(shard: Rc<StorageShard>) {
    let interval = Duration::from_millis(shard.config.offsets_persist_interval_ms.max(10));
    loop {
        glommio::timer::sleep(interval).await;
        if *shard.stopping.borrow() {
            return;
        }
        shard.persist_offsets().await;
    }
}

async fn expire_clients_loop(shard: Rc<StorageShard>) {
    let timeout = shard.config.client_timeout_ms as i64;
    let interval = Duration::from_millis((shard.config.client_timeout_ms / 4).clamp(50, 10_000));
    loop {
        glommio::timer::sleep(interval).await;
        let Some(control) = &shard.control else {
            return;
        };
        let changed = control.clients.borrow_mut().expire(now_ms(), timeout);
        shard.announce_changes(changed);
    }
}

/// Checks back unresolved transactions every `transaction_check_interval_ms` (shard 0).
async fn transaction_check_loop(shard: Rc<StorageShard>) {
    let interval = Duration::from_millis(shard.config.transaction_check_interval_ms.max(10));
    loop {
        glommio::timer::sleep(interval).await;
        let Some(control) = &shard.control else {
            return;
        };
        if *shard.stopping.borrow() {
            return;
        }
        control
            .transactions
            .check_round(&shard.store, &control.clients, |check| {
                shard
                    .events
                    .get(check.connection.network_shard)
                    .is_some_and(|sender| {
                        sender
                            .try_send(NetworkEvent::TransactionCheck(check))
                            .is_ok()
                    })
            })
            .await;
    }
}
