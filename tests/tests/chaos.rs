//! Fault injection (docs/replication.md, "Fault injection"): a controller group of real
//! processes (three name servers with controllers, three brokers of one group in
//! `--broker-role auto`, sync replication) under continuous produce and consume, with faults
//! injected at seeded random moments: kill -9 of the master or of a slave, SIGSTOP of the
//! master or of the controller leader for longer than the heartbeat timeout, and the master or
//! a slave restarted after a simulated power loss (its CommitLog cut back to its last
//! checkpoint, the rest reading as zeros), a crash-looping master (killed and restarted
//! three times in quick succession), a master cut off from every controller (a network
//! partition through TCP proxies the test owns, one per broker and controller or name server)
//! while it keeps serving its clients and slaves, a master whose messages to the controllers
//! are held while their connections stay open (a one-way loss), a master whose links to the
//! controllers turn slow (0.3-1.5 s each way), a master cut off from every name server (it
//! cannot register; routes lose it), a master cut off from its slaves (the replication links
//! through the proxy its `--ha-advertise` names), a master whose slaves' acknowledgements
//! are held (a one-way loss on the replication links), one slave cut off from the master (the
//! other still replicating) or from the controllers, and both slaves stopped while the master
//! is killed and restarted (its unconfirmed tail must stay hidden from consumers).
//! A second test does the same to a manual sync-master pair (RocketMQ's classic mode: one name
//! server, a `sync-master` and its `slave`, no controller): kill -9 of either (started again),
//! SIGSTOP of either past the timeouts, a power loss of either, the replication link cut or
//! its slave-to-master direction held.
//! After the rounds a checker compares the whole history:
//! - every acknowledged message is stored on every broker (lost: 0);
//! - the consumer group consumed every acknowledged message (unconsumed: 0), and consumed every
//!   queue offset that holds one (skipped: 0);
//! - at each queue offset every broker holds the same message, and what the group consumed at an
//!   offset is what is stored there (diverged: 0): no two masters wrote different messages at
//!   the same place;
//! - duplicates (deliveries of an offset already delivered) are counted and reported.
//!
//! The seed is printed; `SHARDMQ_TEST_SEED=<seed>` replays a run's faults and moments.
//! `SHARDMQ_CHAOS_ROUNDS` sets the number of rounds (the test command runs a short run;
//! `scripts/chaos.sh --rounds N` the long one); `SHARDMQ_CHAOS_FAULTS` and
//! `SHARDMQ_CHAOS_PAIR_FAULTS` restrict the kinds of each test. When a broker lacks
//! acknowledged messages it prints which (by the order they were acknowledged in, as each
//! round's line counts them) and the end of its log, every run of it (`SHARDMQ_CHAOS_LOG_LINES`
//! lines, 40 unless set); `SHARDMQ_CHAOS_TRACE_ACKS=1` prints each acknowledgement's queue,
//! queue offset and offset message id as it comes.
//!
//! Needs the binaries: `cargo build --workspace --bins` first.

mod ha_support;
mod reliability_support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ha_support::*;
use reliability_support::{create_topic, pull_queue, QueueEnd, Rng};
use shardmq_tests::{free_port, signal, wait_until, BrokerProcess, NamesrvProcess, TestClient};

/// Rounds in the test command's run.
const DEFAULT_ROUNDS: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Fault {
    KillMaster,
    KillSlave,
    PauseMaster,
    PauseControllerLeader,
    SlavePowerLoss,
    MasterPowerLoss,
    /// A slave's power loss, then the master's kill -9 before the slave has caught up.
    SlavePowerLossThenKillMaster,
    /// The master crash-loops: killed with kill -9 and started again three times, each time
    /// after 0.2-1.5 s (finished starting or not, master again or not), then left running.
    CrashLoopMaster,
    /// The master is cut off from every controller (its links dropped, new ones refused) for
    /// longer than the broker timeout while it keeps running and serving producers, consumers
    /// and its slaves; then the links come back.
    PartitionMaster,
    /// Everything the master sends to the controllers is held (its connections stay open and
    /// answers could still arrive) for longer than the broker timeout; then it is delivered.
    StallMasterToControllers,
    /// Everything between the master and the controllers arrives 0.3-1.5 s late, each way,
    /// for 3.5 s (heartbeats every 300 ms, a 2 s broker timeout); then the link is quick again.
    SlowMasterToControllers,
    /// The master is cut off from every name server for longer than their broker timeout
    /// while it keeps running, serving and reaching the controllers.
    PartitionMasterFromNameServers,
    /// The replication links between the master and its slaves are cut (dropped, new ones
    /// refused) for longer than the broker timeout, while every broker keeps reaching the
    /// controllers, the name servers and the clients; then they come back.
    PartitionMasterFromSlaves,
    /// Everything the slaves send the master on their replication links (acknowledgements,
    /// requests) is held for longer than the broker timeout while the master's bytes still
    /// reach them; then it is delivered, late.
    StallSlavesToMaster,
    /// One slave's replication links to the master are cut (dropped, new ones refused) for
    /// longer than the broker timeout, while the other slave keeps replicating and every
    /// broker keeps reaching the controllers, the name servers and the clients.
    PartitionSlaveFromMaster,
    /// One slave is cut off from every controller for longer than the broker timeout while it
    /// keeps replicating from the master.
    PartitionSlaveFromControllers,
    /// Both slaves are stopped (SIGSTOP), so the master's last sends are stored on it alone
    /// and confirmed by no replica; 0.2-1 s later the master is killed with kill -9 and started
    /// again at once, while its SyncStateSet still names the silent slaves (its unconfirmed
    /// tail must stay hidden from consumers); the slaves resume after the pause.
    PauseSlavesThenKillMaster,
}

/// The faults a run draws from: every kind unless `SHARDMQ_CHAOS_FAULTS` names some
/// (comma-separated, as printed), for example to replay one kind.
fn faults() -> Vec<Fault> {
    let all = [
        Fault::KillMaster,
        Fault::KillSlave,
        Fault::PauseMaster,
        Fault::PauseControllerLeader,
        Fault::SlavePowerLoss,
        Fault::MasterPowerLoss,
        Fault::SlavePowerLossThenKillMaster,
        Fault::CrashLoopMaster,
        Fault::PartitionMaster,
        Fault::StallMasterToControllers,
        Fault::SlowMasterToControllers,
        Fault::PartitionMasterFromNameServers,
        Fault::PartitionMasterFromSlaves,
        Fault::StallSlavesToMaster,
        Fault::PartitionSlaveFromMaster,
        Fault::PartitionSlaveFromControllers,
        Fault::PauseSlavesThenKillMaster,
    ];
    chosen(&all, "SHARDMQ_CHAOS_FAULTS")
}

/// The faults of `all` the environment variable `var` names (comma-separated, as printed), or
/// all of them when it is not set.
fn chosen<F: std::marker::Copy + std::fmt::Debug>(all: &[F], var: &str) -> Vec<F> {
    match std::env::var(var) {
        Ok(names) => {
            let chosen: Vec<F> = all
                .iter()
                .copied()
                .filter(|f| names.split(',').any(|n| n.trim() == format!("{f:?}")))
                .collect();
            assert!(!chosen.is_empty(), "{var} names no fault of {all:?}");
            chosen
        }
        Err(_) => all.to_vec(),
    }
}

/// One delivery to the consumer group.
#[derive(Debug, Clone)]
struct Delivery {
    queue_id: u32,
    queue_offset: i64,
    body: Vec<u8>,
}

/// Writes back after a master's kill -9 later than this (the target) print the tails
/// of every process's log.
const SLOW_WRITES_BACK: Duration = Duration::from_secs(3);
const LOG_TAIL_LINES: usize = 200;

/// Prints the last [`LOG_TAIL_LINES`] lines of each broker's and name server's log.
fn print_log_tails(group: &mut HaGroup) {
    let tail = |lines: Vec<String>| {
        let from = lines.len().saturating_sub(LOG_TAIL_LINES);
        lines[from..].join("\n")
    };
    for id in 1..=3 {
        eprintln!(
            "---- broker {id} ----\n{}",
            tail(group.broker(id).log_lines())
        );
    }
    for (i, controller) in group.controllers.iter().enumerate() {
        if let Some(controller) = controller {
            eprintln!(
                "---- name server {} ----\n{}",
                i + 1,
                tail(controller.log_lines())
            );
        }
    }
}

/// How long a paused process stays paused: longer than the controller's broker timeout
/// (2 s in `HaGroup`) and the Raft election timeout.
const PAUSE: Duration = Duration::from_millis(3500);

#[test]
fn faults_at_random_moments_lose_skip_and_diverge_nothing() {
    let rounds = std::env::var("SHARDMQ_CHAOS_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(DEFAULT_ROUNDS);
    let mut rng = Rng::for_test("chaos");
    let kinds = faults();
    let mut group = HaGroup::start_partitionable();
    create_topic(&mut group.master_client(), TOPIC, QUEUES);

    let consumer = GroupConsumer::start(&group.namesrv_list);
    // Paced (at most about 1,000 sends a second in all), so that a slave restarted by a fault
    // can catch up and rejoin the SyncStateSet while the load goes on.
    let load = Load::start_paced(&group.namesrv_list, 2, Duration::from_millis(2));
    wait_until(SETTLE, "the first acknowledged sends", || {
        (load.count() >= 50).then_some(())
    });

    let mut injected: BTreeMap<Fault, usize> = BTreeMap::new();
    let mut write_resume: Vec<Duration> = Vec::new();
    let mut partition_elections: Vec<Duration> = Vec::new();
    for round in 0..rounds {
        // Under load for a random moment before each fault.
        std::thread::sleep(Duration::from_millis(rng.in_range(200..=1500)));
        let fault = kinds[rng.below(kinds.len())];
        // Each fault hits a whole group: the last round's "whole again" may have been read
        // just before a late change (a slow link's heartbeats arrive behind each other, and
        // an election can follow the read).
        let before = wait_until(SETTLE, "the group whole before the fault", || {
            group
                .status()
                .filter(|s| s.master_id > 0 && s.in_sync.len() == 3 && s.leader > 0)
        });
        eprintln!(
            "chaos round {round}: {fault:?} (master {}, epoch {}, in sync {:?}, acknowledged {})",
            before.master_id,
            before.epoch,
            before.in_sync,
            load.count()
        );
        match fault {
            Fault::KillMaster | Fault::SlavePowerLossThenKillMaster => {
                if fault == Fault::SlavePowerLossThenKillMaster {
                    let slave = pick_slave(&before, &mut rng);
                    power_loss(group.broker(slave));
                    std::thread::sleep(Duration::from_millis(rng.in_range(0..=500)));
                }
                let master = before.master_id;
                group.broker(master).kill9();
                let killed_at = Instant::now();
                wait_until(SETTLE, "a new master", || {
                    let status = group.status()?;
                    (status.master_id > 0 && status.master_id != master).then_some(())
                });
                let at_election = load.count();
                wait_until(SETTLE, "writes on the new master", || {
                    (load.count() > at_election).then_some(())
                });
                if let Some(first) = load.first_ack_after(killed_at) {
                    eprintln!(
                        "chaos round {round}: writes back {} ms after the master's kill -9",
                        (first - killed_at).as_millis()
                    );
                    write_resume.push(first - killed_at);
                    if first - killed_at > SLOW_WRITES_BACK {
                        // Kept for the next reader: such a kill is intermittent, and the
                        // processes' logs are gone once the run ends.
                        eprintln!(
                            "chaos round {round}: writes back took over {SLOW_WRITES_BACK:?}; \
                             the last {LOG_TAIL_LINES} lines of each process's log follow"
                        );
                        print_log_tails(&mut group);
                    }
                }
                std::thread::sleep(Duration::from_millis(rng.in_range(0..=1000)));
                group.broker(master).restart();
            }
            Fault::CrashLoopMaster => {
                let master = before.master_id;
                for _ in 0..3 {
                    group.broker(master).kill9();
                    std::thread::sleep(Duration::from_millis(rng.in_range(0..=300)));
                    group.broker(master).restart();
                    std::thread::sleep(Duration::from_millis(rng.in_range(200..=1500)));
                }
            }
            Fault::KillSlave => {
                let slave = pick_slave(&before, &mut rng);
                group.broker(slave).kill9();
                std::thread::sleep(Duration::from_millis(rng.in_range(100..=1500)));
                group.broker(slave).restart();
            }
            Fault::SlavePowerLoss => {
                let slave = pick_slave(&before, &mut rng);
                power_loss(group.broker(slave));
            }
            Fault::MasterPowerLoss => {
                let master = before.master_id;
                power_loss(group.broker(master));
            }
            Fault::PartitionMaster | Fault::StallMasterToControllers => {
                let master = before.master_id;
                let isolate = |on: bool| {
                    if fault == Fault::PartitionMaster {
                        group.cut_from_controllers(master, on);
                    } else {
                        group.stall_to_controllers(master, on);
                    }
                };
                isolate(true);
                let cut_at = Instant::now();
                let mut elected_after = None;
                while cut_at.elapsed() < PAUSE {
                    if elected_after.is_none()
                        && group
                            .status()
                            .is_some_and(|s| s.master_id > 0 && s.master_id != master)
                    {
                        elected_after = Some(cut_at.elapsed());
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                isolate(false);
                if let Some(after) = elected_after {
                    eprintln!(
                        "chaos round {round}: another master elected {} ms after the {}",
                        after.as_millis(),
                        if fault == Fault::PartitionMaster {
                            "partition"
                        } else {
                            "one-way loss"
                        }
                    );
                    partition_elections.push(after);
                }
            }
            Fault::SlowMasterToControllers => {
                let master = before.master_id;
                let delay = Duration::from_millis(rng.in_range(300..=1500));
                eprintln!(
                    "chaos round {round}: the master's controller links {} ms late each way",
                    delay.as_millis()
                );
                group.delay_controller_links(master, delay);
                std::thread::sleep(PAUSE);
                group.delay_controller_links(master, Duration::ZERO);
            }
            Fault::PartitionMasterFromNameServers => {
                let master = before.master_id;
                group.cut_from_name_servers(master, true);
                std::thread::sleep(PAUSE);
                group.cut_from_name_servers(master, false);
                let healed_at = Instant::now();
                let at_heal = load.count();
                wait_until(
                    SETTLE,
                    "writes after the name servers are reachable again",
                    || (load.count() > at_heal).then_some(()),
                );
                if let Some(first) = load.first_ack_after(healed_at) {
                    eprintln!(
                        "chaos round {round}: writes {} ms after the name servers are reachable again",
                        (first - healed_at).as_millis()
                    );
                }
            }
            Fault::PartitionMasterFromSlaves | Fault::StallSlavesToMaster => {
                let master = before.master_id;
                let isolate = |on: bool| {
                    if fault == Fault::PartitionMasterFromSlaves {
                        group.cut_from_slaves(master, on);
                    } else {
                        group.stall_from_slaves(master, on);
                    }
                };
                let at_cut = load.count();
                isolate(true);
                std::thread::sleep(PAUSE);
                let during = load.count() - at_cut;
                isolate(false);
                eprintln!(
                    "chaos round {round}: {during} sends acknowledged while the master {} its slaves",
                    if fault == Fault::PartitionMasterFromSlaves {
                        "was cut off from"
                    } else {
                        "heard nothing from"
                    }
                );
            }
            Fault::PartitionSlaveFromMaster => {
                let master = before.master_id;
                let slave = pick_slave(&before, &mut rng);
                let at_cut = load.count();
                let links = group.cut_slave_from_master(master, slave, true);
                let cut_at = Instant::now();
                // The cut must take: the master stops hearing the slave (silent for 3 s) and
                // the controller drops it from the SyncStateSet while the other slave stays
                // in; the cut then lasts a little longer, with the set shrunk.
                while !group
                    .status()
                    .is_some_and(|s| s.master_id == master && !s.in_sync.contains(&slave))
                {
                    if cut_at.elapsed() > SETTLE {
                        eprintln!(
                            "chaos round {round}: slave {slave} still in sync {SETTLE:?} after its cut \
                             ({links} live links cut; the group now: {:?})",
                            group.status()
                        );
                        print_log_tails(&mut group);
                        panic!("round {round}: the cut slave never left the SyncStateSet");
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                let dropped_after = cut_at.elapsed();
                std::thread::sleep(Duration::from_millis(rng.in_range(0..=1500)));
                let during = load.count() - at_cut;
                group.cut_slave_from_master(master, slave, false);
                eprintln!(
                    "chaos round {round}: slave {slave} out of sync {} ms after its cut from the master \
                     ({links} live links cut); {during} sends acknowledged meanwhile",
                    dropped_after.as_millis()
                );
            }
            Fault::PauseSlavesThenKillMaster => {
                let master = before.master_id;
                let slaves: Vec<u32> = (1..=3)
                    .filter(|&id| id != master)
                    .map(|id| group.broker(id).pid())
                    .collect();
                for &pid in &slaves {
                    signal(pid, "STOP");
                }
                std::thread::sleep(Duration::from_millis(rng.in_range(200..=1000)));
                group.broker(master).kill9();
                // The slaves resume on their own clock: the restarted master may wait for them
                // (the controller can have elected one of them before they went silent).
                let resume = std::thread::spawn(move || {
                    std::thread::sleep(PAUSE);
                    for pid in slaves {
                        signal(pid, "CONT");
                    }
                });
                group.broker(master).restart();
                resume.join().expect("the slaves resumed");
            }
            Fault::PartitionSlaveFromControllers => {
                let slave = pick_slave(&before, &mut rng);
                group.cut_from_controllers(slave, true);
                std::thread::sleep(PAUSE);
                group.cut_from_controllers(slave, false);
            }
            Fault::PauseMaster => {
                let master = before.master_id;
                signal(group.broker(master).pid(), "STOP");
                std::thread::sleep(PAUSE);
                signal(group.broker(master).pid(), "CONT");
            }
            Fault::PauseControllerLeader => {
                // The node the answering controller names as leader (one is elected by the
                // time the group is whole, but a status may be read mid-election).
                let leader = wait_until(SETTLE, "a controller leader", || {
                    group
                        .status()
                        .map(|s| s.leader as usize)
                        .filter(|l| *l >= 1)
                });
                let pid = group.controllers[leader - 1]
                    .as_ref()
                    .expect("the leader runs")
                    .pid();
                signal(pid, "STOP");
                std::thread::sleep(PAUSE);
                signal(pid, "CONT");
            }
        }
        *injected.entry(fault).or_default() += 1;
        let waiting_since = Instant::now();
        let deadline = waiting_since + SETTLE;
        while !group
            .status()
            .is_some_and(|s| s.master_id > 0 && s.in_sync.len() == 3 && s.leader > 0)
        {
            if Instant::now() >= deadline {
                let views: Vec<_> = group
                    .controller_addresses
                    .iter()
                    .map(|address| controller_group(address))
                    .collect();
                panic!(
                    "round {round} ({fault:?}): the group is not whole again after {SETTLE:?}; \
                     each controller says {views:?}"
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!(
            "chaos round {round}: whole again after {} ms",
            waiting_since.elapsed().as_millis()
        );
    }

    let acknowledged = load.finish();
    let verdict = check_history(
        &acknowledged,
        || {
            (1..=3)
                .map(|id| (id, copy_of(&group.brokers[id as usize - 1], id)))
                .collect()
        },
        |id| group.brokers[id as usize - 1].all_log_lines(),
        consumer,
    );
    write_resume.sort();
    partition_elections.sort();
    let millis = |list: &[Duration]| list.iter().map(Duration::as_millis).collect::<Vec<_>>();
    eprintln!(
        "chaos: {rounds} rounds {injected:?}; {verdict}; writes back after a master's kill -9 \
         (ms): {:?}; another master elected after a master's partition or one-way loss (ms): \
         {:?}",
        millis(&write_resume),
        millis(&partition_elections),
    );
    verdict.assert_clean();
}

/// Faults of the manual sync-master pair (no controller: the master stays master).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum PairFault {
    /// kill -9 of the master, started again 0-1.5 s later (meanwhile the group reads from the
    /// slave and sends are refused).
    KillMaster,
    /// kill -9 of the slave, started again 0.1-1.5 s later.
    KillSlave,
    PauseMaster,
    PauseSlave,
    /// The master restarted after a power loss: it takes what it lost back from the slave.
    MasterPowerLoss,
    SlavePowerLoss,
    /// The replication link cut for 3.5 s (dropped, new connections refused).
    PartitionMasterFromSlave,
    /// Everything the slave sends the master held for 3.5 s, then delivered late.
    StallSlaveToMaster,
}

/// The pair's faults a run draws from: every kind unless `SHARDMQ_CHAOS_PAIR_FAULTS` names
/// some (comma-separated, as printed).
fn pair_faults() -> Vec<PairFault> {
    let all = [
        PairFault::KillMaster,
        PairFault::KillSlave,
        PairFault::PauseMaster,
        PairFault::PauseSlave,
        PairFault::MasterPowerLoss,
        PairFault::SlavePowerLoss,
        PairFault::PartitionMasterFromSlave,
        PairFault::StallSlaveToMaster,
    ];
    chosen(&all, "SHARDMQ_CHAOS_PAIR_FAULTS")
}

/// A manual sync-master pair (RocketMQ's classic mode, no controller): one name server, a
/// `sync-master` and its `slave`, the slave reaching the master's HA listener through a proxy
/// the test owns.
struct ManualPair {
    namesrv: NamesrvProcess,
    /// The master, then the slave.
    brokers: Vec<BrokerProcess>,
    ha_link: TcpProxy,
    _dirs: Vec<tempfile::TempDir>,
}

impl ManualPair {
    fn start() -> ManualPair {
        let namesrv = NamesrvProcess::start_with_args(&[
            "--broker-timeout-ms",
            "2000",
            "--scan-interval-ms",
            "100",
        ]);
        let namesrv_address = namesrv.addr().to_string();
        let ha = format!("127.0.0.1:{}", free_port());
        let ha_link = TcpProxy::start(&ha);
        let common = [
            "--namesrv",
            &namesrv_address,
            "--broker-name",
            "pair",
            "--register-interval-ms",
            "500",
            "--sync-flush-timeout-ms",
            "3000",
        ];
        let roles: [&[&str]; 2] = [
            &[
                "--broker-role",
                "sync-master",
                "--broker-id",
                "0",
                "--ha-listen",
                &ha,
            ],
            &[
                "--broker-role",
                "slave",
                "--broker-id",
                "1",
                "--ha-master",
                ha_link.address(),
            ],
        ];
        let mut dirs = Vec::new();
        let mut brokers = Vec::new();
        for role in roles {
            let dir = tempfile::tempdir().unwrap();
            brokers.push(BrokerProcess::start(
                dir.path(),
                &[&common[..], role].concat(),
            ));
            dirs.push(dir);
        }
        let pair = ManualPair {
            namesrv,
            brokers,
            ha_link,
            _dirs: dirs,
        };
        wait_until(SETTLE, "the slave replicating", || {
            pair.replicating().then_some(())
        });
        pair
    }

    fn master(&mut self) -> &mut BrokerProcess {
        &mut self.brokers[0]
    }

    fn slave(&mut self) -> &mut BrokerProcess {
        &mut self.brokers[1]
    }

    /// Whether the master answers and every storage shard of it has its slave connected.
    fn replicating(&self) -> bool {
        let Ok(mut client) = TestClient::connect(self.brokers[0].addr()) else {
            return false;
        };
        if client.handshake().is_err() {
            return false;
        }
        let Ok(answer) = shardmq_tests::broker_status(&mut client) else {
            return false;
        };
        let Some(status) = answer.frame().body_as_broker_status_response() else {
            return false;
        };
        let shards: Vec<bool> = status
            .replication()
            .iter()
            .flat_map(|v| v.iter())
            .map(|s| s.connected())
            .collect();
        !shards.is_empty() && shards.iter().all(|c| *c)
    }
}

#[test]
fn faults_in_a_manual_sync_master_pair_lose_skip_and_diverge_nothing() {
    let rounds = std::env::var("SHARDMQ_CHAOS_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(DEFAULT_ROUNDS);
    let mut rng = Rng::for_test("chaos-pair");
    let kinds = pair_faults();
    let mut pair = ManualPair::start();
    let namesrv = pair.namesrv.addr().to_string();
    create_topic(&mut pair.master().client(), TOPIC, QUEUES);
    let consumer = GroupConsumer::start(&namesrv);
    let load = Load::start_paced(&namesrv, 2, Duration::from_millis(2));
    wait_until(SETTLE, "the first acknowledged sends", || {
        (load.count() >= 50).then_some(())
    });

    let mut injected: BTreeMap<PairFault, usize> = BTreeMap::new();
    for round in 0..rounds {
        std::thread::sleep(Duration::from_millis(rng.in_range(200..=1500)));
        let fault = kinds[rng.below(kinds.len())];
        eprintln!(
            "chaos pair round {round}: {fault:?} (acknowledged {})",
            load.count()
        );
        match fault {
            PairFault::KillMaster => {
                pair.master().kill9();
                std::thread::sleep(Duration::from_millis(rng.in_range(0..=1500)));
                pair.master().restart();
            }
            PairFault::KillSlave => {
                pair.slave().kill9();
                std::thread::sleep(Duration::from_millis(rng.in_range(100..=1500)));
                pair.slave().restart();
            }
            PairFault::PauseMaster | PairFault::PauseSlave => {
                let pid = if fault == PairFault::PauseMaster {
                    pair.master().pid()
                } else {
                    pair.slave().pid()
                };
                signal(pid, "STOP");
                std::thread::sleep(PAUSE);
                signal(pid, "CONT");
            }
            PairFault::MasterPowerLoss => power_loss(pair.master()),
            PairFault::SlavePowerLoss => power_loss(pair.slave()),
            PairFault::PartitionMasterFromSlave => {
                pair.ha_link.set_cut(true);
                std::thread::sleep(PAUSE);
                pair.ha_link.set_cut(false);
            }
            PairFault::StallSlaveToMaster => {
                pair.ha_link.set_stalled(Direction::ToTarget, true);
                std::thread::sleep(PAUSE);
                pair.ha_link.set_stalled(Direction::ToTarget, false);
            }
        }
        *injected.entry(fault).or_default() += 1;
        // Whole again: the slave replicating on every shard and sends acknowledged again
        // (a sync master acknowledges only what its slave holds).
        let waiting_since = Instant::now();
        let at_heal = load.count();
        wait_until(SETTLE, "the pair whole again", || {
            (pair.replicating() && load.count() > at_heal).then_some(())
        });
        eprintln!(
            "chaos pair round {round}: whole again after {} ms",
            waiting_since.elapsed().as_millis()
        );
    }

    let acknowledged = load.finish();
    let verdict = check_history(
        &acknowledged,
        || {
            (0..2)
                .map(|i| (i as i64, copy_of(&pair.brokers[i], i as i64)))
                .collect()
        },
        |id| pair.brokers[id as usize].all_log_lines(),
        consumer,
    );
    eprintln!("chaos pair: {rounds} rounds {injected:?}; {verdict}");
    verdict.assert_clean();
}

/// The consumer group of a run: one push consumer recording every delivery.
struct GroupConsumer {
    runtime: tokio::runtime::Runtime,
    consumer: shardmq_client::PushConsumer,
    deliveries: Arc<Mutex<Vec<Delivery>>>,
}

impl GroupConsumer {
    fn start(namesrv: &str) -> GroupConsumer {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let deliveries: Arc<Mutex<Vec<Delivery>>> = Arc::default();
        let sink = deliveries.clone();
        let consumer = runtime
            .block_on(
                shardmq_client::PushConsumer::builder()
                    .namesrv(namesrv)
                    .group("Chaos")
                    .subscribe(TOPIC, "*")
                    .consume_from(shardmq_client::ConsumeFrom::FirstOffset)
                    .persist_interval(Duration::from_millis(200))
                    .listen_concurrently(move |messages| {
                        let sink = sink.clone();
                        async move {
                            sink.lock()
                                .unwrap()
                                .extend(messages.iter().map(|m| Delivery {
                                    queue_id: m.queue_id,
                                    queue_offset: m.queue_offset,
                                    body: m.body.to_vec(),
                                }));
                            shardmq_client::ConsumeResult::Success
                        }
                    })
                    .start(),
            )
            .expect("a push consumer");
        GroupConsumer {
            runtime,
            consumer,
            deliveries,
        }
    }
}

/// What the checker found over a run's whole history.
struct Verdict {
    acknowledged: usize,
    deliveries: usize,
    lost: usize,
    unconsumed: usize,
    skipped: usize,
    diverged: Vec<String>,
    duplicates: usize,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} acknowledged, {} deliveries; lost {}, unconsumed {}, skipped {}, diverged {}, \
             duplicates {}",
            self.acknowledged,
            self.deliveries,
            self.lost,
            self.unconsumed,
            self.skipped,
            self.diverged.len(),
            self.duplicates
        )
    }
}

impl Verdict {
    fn assert_clean(&self) {
        assert!(self.acknowledged > 0);
        assert_eq!(self.lost, 0, "acknowledged messages lost");
        assert!(
            self.diverged.is_empty(),
            "{:?}",
            &self.diverged[..self.diverged.len().min(10)]
        );
        assert_eq!(
            self.unconsumed, 0,
            "acknowledged messages never consumed by the group"
        );
        assert_eq!(
            self.skipped, 0,
            "queue offsets holding acknowledged messages skipped"
        );
    }
}

/// Compares a run's whole history: `copies()` reads every broker's copy of every queue (again
/// until each holds everything acknowledged, or [`SETTLE`] has passed); the group is waited
/// for until it consumed everything acknowledged (or [`SETTLE`] has passed), then stopped.
fn check_history(
    acknowledged: &[Vec<u8>],
    copies: impl Fn() -> Vec<(i64, Copy)>,
    log_of: impl Fn(i64) -> Vec<String>,
    consumer: GroupConsumer,
) -> Verdict {
    let acknowledged_set: HashSet<&Vec<u8>> = acknowledged.iter().collect();
    // Every broker's copy of every queue, by offset, once each holds everything acknowledged
    // (a slave may still be catching up, or copying the topic table, every 2 s) or the time
    // to settle has passed.
    let deadline = Instant::now() + SETTLE;
    let copies = loop {
        let copies = copies();
        let complete = copies.iter().all(|(_, queues)| {
            let bodies: HashSet<&Vec<u8>> = queues.iter().flat_map(|q| q.values()).collect();
            acknowledged_set.iter().all(|b| bodies.contains(*b))
        });
        if complete || Instant::now() >= deadline {
            break copies;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let mut lost = 0usize;
    let mut diverged: Vec<String> = Vec::new();
    let (_, reference) = &copies[0];
    for (id, queues) in &copies {
        let bodies: HashSet<&Vec<u8>> = queues.iter().flat_map(|q| q.values()).collect();
        // Which acknowledgements (by their order, as each round's line counts them) it lacks.
        let lacking: Vec<usize> = acknowledged
            .iter()
            .enumerate()
            .filter(|(_, b)| !bodies.contains(*b))
            .map(|(i, _)| i)
            .collect();
        let missing = lacking.len();
        if missing > 0 {
            let log = log_of(*id);
            let first: Vec<String> = lacking
                .iter()
                .take(10)
                .map(|&i| String::from_utf8_lossy(&acknowledged[i]).into_owned())
                .collect();
            eprintln!(
                "broker {id} lacks {missing} acknowledged messages, acknowledged {} (the first \
                 {first:?}); its log ends:\n{}",
                ranges(&lacking),
                log[log.len().saturating_sub(lacking_log_lines())..].join("\n")
            );
        }
        lost = lost.max(missing);
        for (queue, (mine, theirs)) in queues.iter().zip(reference).enumerate() {
            for (offset, body) in mine {
                if theirs.get(offset).is_some_and(|other| other != body) {
                    diverged.push(format!(
                        "queue {queue} offset {offset} differs on broker {id}"
                    ));
                }
            }
        }
    }

    // The group catches up with everything acknowledged, or the checker says what it lacks.
    let deadline = Instant::now() + SETTLE;
    let unconsumed = loop {
        let unconsumed = {
            let seen: HashSet<Vec<u8>> = consumer
                .deliveries
                .lock()
                .unwrap()
                .iter()
                .map(|d| d.body.clone())
                .collect();
            acknowledged.iter().filter(|b| !seen.contains(*b)).count()
        };
        if unconsumed == 0 || Instant::now() >= deadline {
            break unconsumed;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    consumer.runtime.block_on(consumer.consumer.shutdown());
    let deliveries = consumer.deliveries.lock().unwrap().clone();
    let mut delivered: HashMap<(u32, u64), usize> = HashMap::new();
    for d in &deliveries {
        let place = (d.queue_id, d.queue_offset as u64);
        *delivered.entry(place).or_default() += 1;
        let stored = reference
            .get(d.queue_id as usize)
            .and_then(|queue| queue.get(&place.1));
        if stored.is_some_and(|body| *body != d.body) {
            diverged.push(format!(
                "the group consumed another message at queue {} offset {} than is stored there",
                place.0, place.1
            ));
        }
    }
    let skipped = reference
        .iter()
        .enumerate()
        .flat_map(|(queue, records)| {
            records
                .iter()
                .map(move |(offset, body)| ((queue as u32, *offset), body))
        })
        .filter(|(place, body)| acknowledged_set.contains(body) && !delivered.contains_key(place))
        .count();
    Verdict {
        acknowledged: acknowledged.len(),
        deliveries: deliveries.len(),
        lost,
        unconsumed,
        skipped,
        diverged,
        duplicates: delivered.values().map(|n| n - 1).sum(),
    }
}

/// How many of its last log lines a broker that lacks acknowledged messages prints:
/// `SHARDMQ_CHAOS_LOG_LINES`, else 40.
fn lacking_log_lines() -> usize {
    std::env::var("SHARDMQ_CHAOS_LOG_LINES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(40)
}

/// Sorted indices as ranges: `3-5, 9` (the first ten ranges, and how many more).
fn ranges(sorted: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut at = 0;
    while at < sorted.len() {
        let mut end = at;
        while end + 1 < sorted.len() && sorted[end + 1] == sorted[end] + 1 {
            end += 1;
        }
        out.push(if end == at {
            format!("#{}", sorted[at])
        } else {
            format!("#{}-{}", sorted[at], sorted[end])
        });
        at = end + 1;
    }
    let more = out.len().saturating_sub(10);
    out.truncate(10);
    if more > 0 {
        out.push(format!("and {more} more ranges"));
    }
    out.join(", ")
}

/// A broker's copy of every queue of the topic: each queue's bodies by queue offset.
type Copy = Vec<BTreeMap<u64, Vec<u8>>>;

/// Broker `id`'s copy of every queue of the topic.
fn copy_of(broker: &BrokerProcess, id: i64) -> Copy {
    let mut client = broker.client();
    (0..QUEUES as i32)
        .map(|queue| {
            let (records, end) = pull_queue(&mut client, TOPIC, queue);
            if let QueueEnd::Refused {
                status, message, ..
            } = end
            {
                eprintln!("broker {id} queue {queue}: pull refused, {status:?} {message:?}");
            }
            records
                .into_iter()
                .map(|r| (r.queue_offset, r.body))
                .collect()
        })
        .collect()
}

/// A member of the SyncStateSet other than the master.
fn pick_slave(status: &GroupStatus, rng: &mut Rng) -> i64 {
    let slaves: Vec<i64> = status
        .in_sync
        .iter()
        .copied()
        .filter(|&id| id != status.master_id)
        .collect();
    assert!(!slaves.is_empty(), "a slave in sync: {status:?}");
    slaves[rng.below(slaves.len())]
}

/// A power loss of `broker`: killed, its CommitLogs cut back as [`cut_to_checkpoints`] says,
/// started again.
fn power_loss(broker: &mut shardmq_tests::BrokerProcess) {
    broker.kill9();
    cut_to_checkpoints(broker.data_dir());
    broker.restart();
}

/// A power loss under async flush on a stopped broker: every storage shard's CommitLog is cut
/// back to the offset its checkpoint says is durable, and the page-cache journal that would
/// restore the rest is gone.
fn cut_to_checkpoints(data_dir: &std::path::Path) {
    for entry in std::fs::read_dir(data_dir).unwrap() {
        let shard_dir = entry.unwrap().path();
        let checkpoint = shard_dir.join("checkpoint");
        let Ok(bytes) = std::fs::read(&checkpoint) else {
            continue;
        };
        let durable = u64::from_be_bytes(bytes[8..16].try_into().unwrap());
        match std::fs::remove_file(shard_dir.join("journal")) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                panic!("removing the journal: {e}")
            }
            _ => {}
        }
        let Ok(segments) = std::fs::read_dir(shard_dir.join("commitlog")) else {
            continue;
        };
        for segment in segments {
            let path = segment.unwrap().path();
            let Some(base) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            if base >= durable {
                std::fs::remove_file(&path).unwrap();
            } else {
                // The segment keeps its (preallocated) size; what was not durable reads back
                // as zeros, as unwritten extents do after a power loss: a hole is punched
                // there. That also waits for the killed process's O_DIRECT writes still in
                // flight (its io_uring outlives it by a moment) and leaves no dirty page in the
                // cache. Zeros written through the cache instead raced those writes: a write
                // that completed over cached pages could not drop them, and the kernel then
                // failed the restarted broker's first fsync of the segment with EIO.
                let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                let len = file.metadata().unwrap().len();
                let from = durable - base;
                if len > from {
                    use std::os::fd::AsRawFd;
                    // SAFETY: a plain system call on a descriptor this function owns.
                    let punched = unsafe {
                        libc::fallocate(
                            file.as_raw_fd(),
                            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                            i64::try_from(from).unwrap(),
                            i64::try_from(len - from).unwrap(),
                        )
                    };
                    assert_eq!(
                        punched,
                        0,
                        "punching a hole in {}: {}",
                        path.display(),
                        std::io::Error::last_os_error()
                    );
                    file.sync_all().unwrap();
                }
            }
        }
    }
}
