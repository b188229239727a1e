//! A storage shard: the executor task set that owns one `MessageStore`, the consumer offsets of
//! its queues, the long-poll watches on them, and (shard 0 only) the topic table and client
//! membership.
//!
//! Requests arrive from every network shard over bounded glommio channels; each is served on
//! its own local task, so a sync append waiting for its flush never holds up a pull. It opens
//! no sockets; it answers through the one-shot reply in each request and pushes events
//! (arrivals, topic snapshots, membership changes) back to the network shards.
//!
//! Module map: `shard` (state and the request table), `data`, `replica` and `shard_zero` (the
//! request arms by plane), `watches` (long polling). This file opens, recovers, starts the
//! services and serves until every network shard has gone. It never names the network shard:
//! the two meet in the mesh's messages.

mod data;
mod replica;
mod shard;
mod shard_zero;
mod watches;

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use glommio::channels::shared_channel::{ConnectedReceiver, SharedReceiver, SharedSender};
use tracing::{error, info, warn};

use crate::config::BrokerConfig;
use crate::mesh::{NetworkEvent, StorageRequest};
use crate::offsets::{ConsumerOffsets, LoadOutcome};
use crate::store::MessageStore;

use data::persist_offsets_loop;
use shard::StorageShard;
use shard_zero::{expire_clients_loop, transaction_check_loop, ShardZero};

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
    if let Some(offset) = report.started_over_at {
        warn!(
            shard = id,
            offset,
            "the CommitLog was begun again, empty, at the master's oldest byte (replication)"
        );
    }
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
    // a slave forgets any its log no longer reaches. A sync master whose last term was its own
    // and acknowledged by a slave guards against having lost acknowledged bytes of it.
    let mut guarded = None;
    let epochs = {
        let mut epochs = crate::store::epochs::EpochLog::load(&shard_dir)
            .map_err(|e| format!("storage shard {id}: cannot read the epoch log: {e}"))?;
        let end = store.commitlog_offsets().1;
        if config.role() == crate::config::BrokerRole::Slave {
            epochs.truncate(end);
        } else {
            let before = epochs.entries().to_vec();
            let term = epochs.begin_term(end, config.controller_epoch);
            if config.controller_self_id > 0 && term.epoch != config.controller_epoch {
                // Only when this log holds a term the controller's state does not know (its
                // data was replaced): the term still follows this log's last.
                warn!(
                    shard = id,
                    epoch = term.epoch,
                    controller_epoch = config.controller_epoch,
                    "this log holds a newer term than the controller's epoch: the master term takes the next after it"
                );
            }
            info!(
                shard = id,
                epoch = term.epoch,
                start = term.start,
                "master term begins"
            );
            if config.role() == crate::config::BrokerRole::SyncMaster {
                // The term a slave last acknowledged is guarded when it was this master's
                // last: the term before the new one, or one `begin_term` dropped because this
                // log holds none of it any more (a power loss took all of it, or the terms
                // after it wrote nothing). A promoted slave's stale file names an older term.
                let dropped = |t: &crate::store::epochs::Epoch| {
                    before.contains(t) && !epochs.entries().contains(t)
                };
                guarded = crate::store::epochs::load_replicated_term(&shard_dir)
                    .map_err(|e| format!("storage shard {id}: {e}"))?
                    .filter(|t| Some(*t) == epochs.previous() || dropped(t));
            }
        }
        epochs
            .save(&shard_dir)
            .map_err(|e| format!("storage shard {id}: cannot write the epoch log: {e}"))?;
        Rc::new(RefCell::new(epochs))
    };

    let shard_zero = if id == 0 {
        Some(ShardZero::open(&config, &store).await?)
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
        shard_zero,
        stopping: RefCell::new(false),
        master: Rc::new(crate::replication::MasterSide::new(epochs.clone())),
        slave_view: Rc::new(crate::replication::SlaveView::default()),
    });
    // The confirmed offset (docs/replication.md): a sync master dispatches records into its
    // ConsumeQueues only once every replica its sends wait for holds them; a slave in
    // controller mode only below its master's confirmed offset. Both start at what the store
    // dispatched as it opened: recovery held back every record past the checkpoint
    // (`StoreConfig::hold_unconfirmed_tail`), which is dispatched once confirmed again.
    let confirms = shard.config.role() == crate::config::BrokerRole::SyncMaster;
    let follows_confirmed = shard.config.role() == crate::config::BrokerRole::Slave
        && shard.config.controller_self_id > 0;
    if confirms || follows_confirmed {
        let end = shard.store.visible_offset();
        let start = shard.store.dispatch_limit().min(end);
        if start < end {
            info!(
                storage_shard = id,
                confirmed = start,
                end,
                "records past the checkpoint wait to be confirmed again before consumers see them"
            );
        }
        shard.master.start_confirmed(start);
        shard.store.set_dispatch_limit(start);
    }
    let confirm_task =
        confirms.then(|| glommio::spawn_local(refresh_confirmed_loop(shard.clone())).detach());
    if let Some(term) = guarded {
        shard.master.guard_lost_tail(term);
        let wait_ms = shard.config.lost_tail_wait_ms;
        if wait_ms > 0 {
            hold_for_lost_tail(shard.clone(), wait_ms);
        }
    }
    if shard.shard_zero.is_some() {
        shard.broadcast_topics();
    }
    shard.broadcast(|| NetworkEvent::StorageReady { shard: id });

    // Delay levels and timer messages of this shard's queues (schedule.rs, timer.rs).
    let on_arrival: crate::schedule::ArrivalHook = {
        let shard = shard.clone();
        Rc::new(move |topic: &str, queue_id: u32| shard.notify_appended(topic, queue_id))
    };
    // A slave's CommitLog is its master's copy: it appends nothing of its own (no scheduled
    // deliveries), and replicates instead (services `replication`).
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
        .shard_zero
        .as_ref()
        .map(|_| glommio::spawn_local(expire_clients_loop(shard.clone())).detach());
    let transaction_check_task = shard
        .shard_zero
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
    if let Some(task) = confirm_task {
        task.cancel();
    }
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

/// How often a sync master re-reads what its confirmed offset depends on without an event: the
/// SyncStateSet (changed by the controller loop on network shard 0) and slaves falling silent.
const CONFIRMED_REFRESH: std::time::Duration = std::time::Duration::from_millis(50);

async fn refresh_confirmed_loop(shard: Rc<StorageShard>) {
    loop {
        glommio::timer::sleep(CONFIRMED_REFRESH).await;
        shard.refresh_confirmed();
    }
}

/// A sync master restarted after a slave acknowledged bytes of its last term: its log may have
/// lost some of them (a power loss under async flush), which a slave holds. Local appends wait
/// (SERVICE_NOT_AVAILABLE) until a slave of that term joins and returns any such bytes
/// (`storage::replica`), or for `wait_ms` at most; the new term begins after what came back.
fn hold_for_lost_tail(shard: Rc<StorageShard>, wait_ms: u64) {
    shard.store.hold_appends(Some(format!(
        "this sync master restarted after a slave acknowledged its writes: it waits up to {wait_ms} ms for a slave of that term to return anything its log lost"
    )));
    info!(
        shard = shard.id,
        wait_ms, "appends wait for a slave of the last term to join (its log may have lost acknowledged bytes)"
    );
    glommio::spawn_local(async move {
        glommio::timer::sleep(std::time::Duration::from_millis(wait_ms)).await;
        if shard.store.appends_held() {
            shard.master.stop_return();
            warn!(
                shard = shard.id,
                wait_ms,
                "no slave of the last term joined in time: appends go ahead (a slave holding bytes this log lost keeps them and stops replicating)"
            );
            shard.release_appends("the wait for a slave of the last term is over");
        }
    })
    .detach();
}
