//! The master's side of replication, per storage shard: its terms (epochs), its slaves'
//! acknowledgements (what a sync master's sends wait for), the view the controller's in-sync
//! computation reads, the answer to a slave's join (where their logs agree), and marks of when
//! the log reached which offset (for the lag in ms). Runs on the storage shard's executor.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::role::sync_wait_set;
use crate::store::epochs::{Epoch, EpochLog};
use crate::store::notify::LocalNotify;
use crate::store::{AppendStatus, MessageStore};

use super::{JoinAnswer, ShardReplication, SlaveTail, SyncView, SLAVE_SILENCE};

/// Granularity of the append-time marks behind the lag in ms.
const MARK_EVERY: Duration = Duration::from_millis(5);
/// Most append-time marks kept (at one per `MARK_EVERY`, 20 s of history; older ones merge).
const MAX_MARKS: usize = 4096;

/// The connection a slave joined on: (network shard, connection id). Its acknowledgements
/// count only from that connection.
pub type ReplicaLink = (usize, u64);

/// A slave not heard from for this long is forgotten (its entry leaves the map; it joins
/// again like a new one).
pub const SLAVE_FORGET: Duration = Duration::from_secs(60);

struct SlaveState {
    acknowledged: u64,
    seen: Instant,
    peer: String,
    /// The connection it joined on.
    link: ReplicaLink,
    /// The confirmed offset the last answer to this slave carried.
    confirmed_sent: u64,
    /// It rejoined holding less than it had acknowledged (a power loss took its tail): it is
    /// not in sync, whatever its lag, until it holds everything this master has again.
    regressed: bool,
}

/// A master storage shard's replication state: its terms, its slaves' acknowledgements, and
/// marks of when its log reached which offset (for the lag in ms).
pub struct MasterSide {
    pub epochs: Rc<RefCell<EpochLog>>,
    slaves: RefCell<BTreeMap<i64, SlaveState>>,
    progress: LocalNotify,
    marks: RefCell<VecDeque<(u64, Instant)>>,
    /// The confirmed offset: the bytes every replica a sync send waits for holds (below).
    confirmed: Cell<u64>,
    /// Fires when `confirmed` moves, so a slave's held pull carries it at once.
    confirmed_moved: LocalNotify,
    /// The term a slave last acknowledged bytes of, as this (sync) master's replicated-term
    /// file named it when it started: a slave holding more of it than this log does (a power
    /// loss took the rest here, possibly the whole term) holds acknowledged messages. They are
    /// taken back ([`SlaveTail::Return`]), or kept ([`SlaveTail::Keep`]) rather than cut once
    /// this master has written past them.
    guarded: Cell<Option<Epoch>>,
    /// The term whose first acknowledgement by a slave was last noted (for
    /// [`replicated_term_due`](Self::replicated_term_due)).
    replicated_noted: Cell<Option<Epoch>>,
    /// The slave asked to return the bytes this log lost, while the return is under way.
    returning: RefCell<Option<Returning>>,
}

/// A return asked of a slave: which slave on which connection, where its bytes end, and its
/// terms (which name the terms the returned bytes cross).
struct Returning {
    broker_id: i64,
    link: ReplicaLink,
    end: u64,
    terms: EpochLog,
}

impl MasterSide {
    pub fn new(epochs: Rc<RefCell<EpochLog>>) -> MasterSide {
        MasterSide {
            epochs,
            slaves: RefCell::new(BTreeMap::new()),
            progress: LocalNotify::default(),
            marks: RefCell::new(VecDeque::new()),
            confirmed: Cell::new(0),
            confirmed_moved: LocalNotify::default(),
            guarded: Cell::new(None),
            replicated_noted: Cell::new(None),
            returning: RefCell::new(None),
        }
    }

    /// Guards `term`, the term a slave last acknowledged bytes of (see `guarded`).
    pub fn guard_lost_tail(&self, term: Epoch) {
        self.guarded.set(Some(term));
    }

    /// The current term, once a live slave first acknowledges bytes of it: the caller records
    /// it (`store::epochs::save_replicated_term`). `None` otherwise, and after that once.
    pub fn replicated_term_due(&self) -> Option<Epoch> {
        let current = self.epochs.borrow().last();
        if self.replicated_noted.get() == Some(current)
            || self
                .best_acknowledged()
                .is_none_or(|ack| ack <= current.start)
        {
            return None;
        }
        self.replicated_noted.set(Some(current));
        Some(current)
    }

    /// A slave returns bytes from `from` (this log's end `log_end`), `len` of them: `Ok` with
    /// where the return ends when it was asked for them on `link` and they continue this log
    /// without passing that end.
    pub fn check_return(
        &self,
        broker_id: i64,
        link: ReplicaLink,
        from: u64,
        len: u64,
        log_end: u64,
    ) -> Result<u64, String> {
        let returning = self.returning.borrow();
        let Some(&Returning {
            broker_id: asked,
            link: asked_link,
            end,
            ..
        }) = returning.as_ref()
        else {
            return Err("this master asked for no returned bytes: join again".into());
        };
        if asked != broker_id || asked_link != link {
            return Err(format!(
                "this master asked broker {asked} on another connection for its bytes: join again"
            ));
        }
        if from != log_end || from.saturating_add(len) > end {
            return Err(format!(
                "returned bytes [{from}, {}) do not continue this log (it ends at {log_end}) within [{log_end}, {end})",
                from.saturating_add(len)
            ));
        }
        Ok(end)
    }

    /// Returned bytes were appended up to `log_end`: the terms they cross (as the returning
    /// slave names them) are recorded and the current term (which holds nothing of its own)
    /// now begins there; with `done`, the return is over.
    pub fn returned(&self, log_end: u64, done: bool) {
        if let Some(returning) = self.returning.borrow().as_ref() {
            self.epochs
                .borrow_mut()
                .take_back(&returning.terms, log_end);
        }
        if done {
            self.stop_return();
        }
    }

    /// Forgets a return under way (the wait for it is over).
    pub fn stop_return(&self) {
        *self.returning.borrow_mut() = None;
    }

    /// The confirmed offset (RocketMQ 5's `confirmOffset`): consumers are served only records
    /// below it, so a consumer never moves past a message that a newly elected master could
    /// lack. See [`refresh_confirmed`](Self::refresh_confirmed).
    pub fn confirmed(&self) -> u64 {
        self.confirmed.get()
    }

    /// Completes when the confirmed offset next moves.
    pub fn confirmed_moved(&self) -> impl std::future::Future<Output = ()> + '_ {
        self.confirmed_moved.notified()
    }

    /// Whether the confirmed offset moved past what the last answer to slave `broker_id`
    /// carried (so its pull is answered at once, without new bytes).
    pub fn has_unsent_confirmed(&self, broker_id: i64) -> bool {
        self.slaves
            .borrow()
            .get(&broker_id)
            .is_some_and(|s| s.confirmed_sent < self.confirmed.get())
    }

    /// The confirmed offset, noted as sent to slave `broker_id`.
    pub fn confirmed_for(&self, broker_id: i64) -> u64 {
        let confirmed = self.confirmed.get();
        if let Some(state) = self.slaves.borrow_mut().get_mut(&broker_id) {
            state.confirmed_sent = confirmed;
        }
        confirmed
    }

    /// Starts the confirmed offset at `end` (what the store had dispatched when it opened).
    pub fn start_confirmed(&self, end: u64) {
        self.confirmed.set(end);
    }

    /// Computes the confirmed offset of a sync master whose bytes are visible below
    /// `local_end`, the same rule its sends wait by: in controller mode the least
    /// acknowledgement of the SyncStateSet's other members (a member not heard from yet holds
    /// it where it is), `local_end` when the master is alone in the set; otherwise the best
    /// acknowledgement of a live slave, `local_end` when no slave is live (sends are then
    /// answered SLAVE_NOT_AVAILABLE: the producer is told they are on the master only). It
    /// only moves forward. Returns the new value when it moved.
    pub fn refresh_confirmed(&self, local_end: u64) -> Option<u64> {
        let computed = match sync_wait_set() {
            Some(set) if set.is_empty() => Some(local_end),
            Some(set) => {
                let slaves = self.slaves.borrow();
                set.iter()
                    .map(|id| slaves.get(id).map(|s| s.acknowledged))
                    .collect::<Option<Vec<u64>>>()
                    .and_then(|acks| acks.into_iter().min())
            }
            None => Some(self.best_acknowledged().unwrap_or(local_end)),
        };
        let previous = self.confirmed.get();
        let next = computed.unwrap_or(previous).min(local_end).max(previous);
        if next == previous {
            return None;
        }
        self.confirmed.set(next);
        self.confirmed_moved.notify_all();
        Some(next)
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

    /// A slave asked for bytes on `link`, acknowledging `acknowledged` (ignored past
    /// `log_end`: a slave holding bytes this master does not is not counted). `Err` when
    /// `broker_id` has not joined on that connection (a pull on another connection, a
    /// client's, or one forgotten): nothing it says is counted, and it must join first.
    pub fn on_pull(
        &self,
        broker_id: i64,
        link: ReplicaLink,
        acknowledged: u64,
        log_end: u64,
    ) -> Result<(), String> {
        let mut slaves = self.slaves.borrow_mut();
        let Some(state) = slaves.get_mut(&broker_id).filter(|s| s.link == link) else {
            return Err(format!(
                "broker {broker_id} has not joined on this connection: join first"
            ));
        };
        state.seen = Instant::now();
        if state.regressed && acknowledged >= log_end {
            state.regressed = false;
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
        Ok(())
    }

    /// A slave (re)joined: its acknowledgement restarts from what it holds. One that holds less
    /// than it had acknowledged lost bytes the sends it acknowledged counted on: it is no
    /// longer in sync until it has caught up whole ([`sync_view`](Self::sync_view)).
    /// From now on its acknowledgements count only from `link`, the connection it joined on.
    /// Slaves not heard from for [`SLAVE_FORGET`] are forgotten.
    pub fn on_join(&self, broker_id: i64, peer: &str, end: u64, link: ReplicaLink) {
        let mut slaves = self.slaves.borrow_mut();
        slaves.retain(|id, s| *id == broker_id || s.seen.elapsed() < SLAVE_FORGET);
        let state = slaves.entry(broker_id).or_insert_with(|| SlaveState {
            acknowledged: 0,
            seen: Instant::now(),
            peer: String::new(),
            link,
            confirmed_sent: 0,
            regressed: false,
        });
        state.seen = Instant::now();
        state.link = link;
        state.peer = peer.to_owned();
        state.confirmed_sent = 0;
        state.regressed |= end < state.acknowledged;
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

    /// Controller mode: each slave's acknowledgement on this shard and whether it counts as
    /// alive (it asked within [`SLAVE_SILENCE`] and has not rejoined behind what it had
    /// acknowledged without catching up since), with this log's end.
    pub fn sync_view(&self, log_end: u64) -> SyncView {
        let slaves = self.slaves.borrow();
        (
            log_end,
            slaves
                .iter()
                .map(|(id, s)| {
                    let alive = s.seen.elapsed() < SLAVE_SILENCE && !s.regressed;
                    (*id, s.acknowledged, alive)
                })
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

    /// Answers a slave's join on `link`: where the bytes it shares with this master end, and
    /// what it does with the rest ([`SlaveTail`]). A slave asked to return bytes is noted.
    pub fn join(
        &self,
        broker_id: i64,
        link: ReplicaLink,
        slave: &EpochLog,
        slave_end: u64,
        log_start: u64,
        log_end: u64,
    ) -> JoinAnswer {
        let epochs = self.epochs.borrow();
        let consistent_end = epochs.consistent_end(log_end, slave, slave_end);
        // The slave holds bytes this log lost: of its previous term, or of the guarded term
        // (which this log may no longer know: a power loss took all of it).
        let guarded = self.guarded.get();
        let guarded_end = guarded
            .filter(|term| slave.entries().contains(term))
            .and_then(|term| slave.end_of(term.epoch, slave_end))
            .filter(|&end| end > log_end);
        let lost_end = epochs.lost_tail_end(slave, slave_end).max(guarded_end);
        let tail = match lost_end {
            Some(end) if log_end == epochs.last().start && consistent_end == log_end => {
                SlaveTail::Return { end }
            }
            Some(end) if guarded.is_some() => SlaveTail::Keep { end },
            _ => SlaveTail::Cut,
        };
        if let SlaveTail::Return { end } = tail {
            *self.returning.borrow_mut() = Some(Returning {
                broker_id,
                link,
                end,
                terms: slave.clone(),
            });
        }
        JoinAnswer {
            epoch: epochs.last().epoch,
            epochs: epochs.entries().to_vec(),
            master_end: log_end,
            consistent_end,
            log_start,
            tail,
        }
    }

    /// Whether `slave` holds the guarded term (it was a replica then): its join tells whether
    /// this master lost acknowledged bytes of it.
    pub fn knew_guarded_term(&self, slave: &EpochLog) -> bool {
        self.guarded
            .get()
            .is_some_and(|term| slave.entries().contains(&term))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn master() -> MasterSide {
        let dir = tempfile::tempdir().unwrap();
        let epochs = EpochLog::load(dir.path()).unwrap();
        MasterSide::new(Rc::new(RefCell::new(epochs)))
    }

    fn alive(view: &SyncView, id: i64) -> bool {
        view.1.iter().any(|(i, _, alive)| *i == id && *alive)
    }

    #[test]
    fn a_slave_that_rejoins_behind_its_acknowledgement_is_out_of_sync_until_caught_up() {
        let master = master();
        let link = (0, 7);
        master.on_join(2, "p", 0, link);
        master.on_pull(2, link, 1000, 1000).unwrap();
        assert!(alive(&master.sync_view(1000), 2));
        // A plain reconnect where it was: still in sync.
        master.on_join(2, "p", 1000, link);
        assert!(alive(&master.sync_view(1000), 2));
        // Back after a power loss with less than it acknowledged: out, however small the gap.
        master.on_join(2, "p", 900, link);
        assert!(!alive(&master.sync_view(1000), 2));
        master.on_pull(2, link, 990, 1200).unwrap();
        assert!(!alive(&master.sync_view(1200), 2));
        // Caught up whole: in again.
        master.on_pull(2, link, 1200, 1200).unwrap();
        assert!(alive(&master.sync_view(1200), 2));
    }

    fn term(epoch: u64, start: u64, incarnation: u64) -> crate::store::epochs::Epoch {
        crate::store::epochs::Epoch {
            epoch,
            start,
            incarnation,
        }
    }

    #[test]
    fn a_slave_holding_the_lost_end_of_the_last_term_returns_it_keeps_it_or_cuts_it() {
        let master = master();
        master.epochs.borrow_mut().push(term(1, 0, 11)).unwrap();
        // The master restarted with its log cut at 500; the slave holds term 1 to 800.
        master.epochs.borrow_mut().push(term(2, 500, 12)).unwrap();
        let mut slave = EpochLog::default();
        slave.push(term(1, 0, 11)).unwrap();
        let link = (0, 3);
        let answer = master.join(4, link, &slave, 800, 0, 500);
        assert_eq!(answer.tail, SlaveTail::Return { end: 800 });
        assert_eq!(answer.consistent_end, 500);
        assert!(!master.knew_guarded_term(&slave), "nothing is guarded yet");
        // Only that slave, on that connection, from the log's end, within what it holds.
        assert!(master.check_return(5, link, 500, 100, 500).is_err());
        assert!(master.check_return(4, (0, 4), 500, 100, 500).is_err());
        assert!(master.check_return(4, link, 400, 100, 500).is_err());
        assert!(master.check_return(4, link, 500, 301, 500).is_err());
        assert_eq!(master.check_return(4, link, 500, 300, 500), Ok(800));
        master.returned(800, true);
        assert!(master.returning.borrow().is_none());
        assert_eq!(master.epochs.borrow().last(), term(2, 800, 12));
        assert_eq!(
            master.join(4, link, &slave, 800, 0, 800).tail,
            SlaveTail::Cut
        );

        // Had the master written past 500 first, the bytes are cut, unless a slave
        // acknowledged that term (a sync master that guards its lost tail): then kept.
        let master = self::master();
        master.epochs.borrow_mut().push(term(1, 0, 11)).unwrap();
        master.epochs.borrow_mut().push(term(2, 500, 12)).unwrap();
        assert_eq!(
            master.join(4, link, &slave, 800, 0, 600).tail,
            SlaveTail::Cut
        );
        master.guard_lost_tail(term(1, 0, 11));
        assert!(master.knew_guarded_term(&slave));
        assert_eq!(
            master.join(4, link, &slave, 800, 0, 600).tail,
            SlaveTail::Keep { end: 800 }
        );
        assert!(master.returning.borrow().is_none());
        // A slave that never had term 1 (a new one) holds nothing lost.
        assert_eq!(
            master.join(4, link, &EpochLog::default(), 0, 0, 600).tail,
            SlaveTail::Cut
        );
        assert!(!master.knew_guarded_term(&EpochLog::default()));
    }

    #[test]
    fn a_slave_holding_a_term_this_log_lost_whole_returns_it_and_the_term_is_known_again() {
        use crate::store::epochs::Epoch;
        // Term 2 began at 500 and a slave acknowledged its bytes (the replicated-term file
        // names it); a power loss cut the master's log to 400, below where term 2 began, and
        // the master began term 3 there, dropping term 2 from its log.
        let master = master();
        let current = {
            let mut epochs = master.epochs.borrow_mut();
            epochs.push(term(1, 0, 11)).unwrap();
            epochs.push(term(2, 500, 12)).unwrap();
            epochs.begin_term(400, 0)
        };
        assert_eq!((current.epoch, current.start), (3, 400));
        master.guard_lost_tail(term(2, 500, 12));
        let mut slave = EpochLog::default();
        slave.push(term(1, 0, 11)).unwrap();
        slave.push(term(2, 500, 12)).unwrap();
        assert!(master.knew_guarded_term(&slave));
        let link = (0, 3);
        let answer = master.join(4, link, &slave, 900, 0, 400);
        assert_eq!(answer.tail, SlaveTail::Return { end: 900 });
        assert_eq!(answer.consistent_end, 400);
        assert_eq!(master.check_return(4, link, 400, 500, 400), Ok(900));
        master.returned(900, true);
        assert_eq!(
            master.epochs.borrow().entries()[1..],
            [
                term(1, 0, 11),
                term(2, 500, 12),
                Epoch {
                    start: 900,
                    ..current
                }
            ]
        );
        // The two logs agree now: nothing more is returned, and nothing is cut.
        let answer = master.join(4, link, &slave, 900, 0, 900);
        assert_eq!(answer.tail, SlaveTail::Cut);
        assert_eq!(answer.consistent_end, 900);

        // Had the master written past 400 first, the slave keeps term 2's bytes.
        let master = self::master();
        {
            let mut epochs = master.epochs.borrow_mut();
            epochs.push(term(1, 0, 11)).unwrap();
            epochs.push(term(2, 500, 12)).unwrap();
            epochs.begin_term(400, 0);
        }
        master.guard_lost_tail(term(2, 500, 12));
        assert_eq!(
            master.join(4, link, &slave, 900, 0, 450).tail,
            SlaveTail::Keep { end: 900 }
        );
    }

    #[test]
    fn acknowledgements_count_only_from_the_connection_the_slave_joined_on() {
        let master = master();
        // Never joined: refused, and nothing counted.
        assert!(master.on_pull(3, (0, 1), 5_000, 5_000).is_err());
        assert!(master.sync_view(5_000).1.is_empty());
        master.on_join(3, "slave", 100, (0, 1));
        // The same broker id on another connection (a client's, or a stale one) is refused.
        assert!(master.on_pull(3, (0, 2), 5_000, 5_000).is_err());
        assert!(master.on_pull(3, (1, 1), 5_000, 5_000).is_err());
        assert_eq!(master.sync_view(5_000).1, vec![(3, 100, true)]);
        master.on_pull(3, (0, 1), 4_000, 5_000).unwrap();
        assert_eq!(master.sync_view(5_000).1, vec![(3, 4_000, true)]);
        // Joining again on a new connection moves the binding there.
        master.on_join(3, "slave", 4_000, (0, 9));
        assert!(master.on_pull(3, (0, 1), 5_000, 5_000).is_err());
        master.on_pull(3, (0, 9), 5_000, 5_000).unwrap();
    }
}
