//! The controller's replicated state: per broker group (cluster, broker name) its master, epoch,
//! in-sync replicas (SyncStateSet) and registered replicas; and the commands the Raft log
//! carries to change it. Pure data and rules: applying a command never does I/O, so every
//! controller that applies the same log holds the same groups.
//!
//! The rules (docs/replication.md, "Automatic failover"):
//! - the first broker of a group to register becomes its master, epoch 1;
//! - a new master is elected only from the SyncStateSet, only if the epoch the election was
//!   decided on is still current; the epoch is bumped and the set becomes the new master alone
//!   (the others rejoin as they catch up);
//! - the master alone changes the SyncStateSet, naming the epoch it runs under; a stale epoch
//!   or another broker's request is refused; the set always holds the master.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// One broker of a group, as it registered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Replica {
    pub address: String,
    pub ha_address: String,
}

/// One broker group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Group {
    pub cluster_name: String,
    pub broker_name: String,
    /// The master's broker id; 0 while none is elected.
    pub master: i64,
    pub epoch: u64,
    pub sync_state_set: BTreeSet<i64>,
    /// Bumped by every change of the SyncStateSet (RocketMQ's `syncStateSetEpoch`): a broker
    /// ignores a set older than the one it holds, and a master's change names the set epoch
    /// it was judged against (compare and set; a set that changed and changed back is still
    /// another set).
    #[serde(default)]
    pub sync_state_epoch: u64,
    pub replicas: BTreeMap<i64, Replica>,
}

impl Group {
    pub fn master_replica(&self) -> Option<&Replica> {
        self.replicas.get(&self.master)
    }
}

/// What the Raft log carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// A broker registered (or its addresses changed).
    Register {
        cluster_name: String,
        broker_name: String,
        broker_id: i64,
        replica: Replica,
    },
    /// Make `broker_id` master, if the group is still at `expected_epoch`.
    Elect {
        cluster_name: String,
        broker_name: String,
        broker_id: i64,
        expected_epoch: u64,
    },
    /// A member of the SyncStateSet that is not the master is starting again: it may hold less
    /// than it acknowledged (a power loss), so it leaves the set of `epoch` and rejoins only
    /// once its master finds it caught up.
    LeaveSyncStateSet {
        cluster_name: String,
        broker_name: String,
        broker_id: i64,
        epoch: u64,
    },
    /// The master of `epoch` names its in-sync replicas, judged against `expected` (the set as
    /// the controller last told it, the master left out): applied only while that is still the
    /// set (compare and set; `None`, from brokers before this field, skips the comparison).
    AlterSyncStateSet {
        cluster_name: String,
        broker_name: String,
        master: i64,
        epoch: u64,
        sync_state_set: BTreeSet<i64>,
        #[serde(default)]
        expected: Option<BTreeSet<i64>>,
        /// The set epoch of `expected` (`None` from brokers before set epochs).
        #[serde(default)]
        expected_set_epoch: Option<u64>,
    },
}

/// The answer to one applied command: whether it changed anything, and the group after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct CommandResult {
    pub applied: bool,
    pub why_not: String,
    pub group: Option<Group>,
}

/// Every group, keyed `cluster/broker`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Groups {
    pub groups: BTreeMap<String, Group>,
}

pub fn group_key(cluster_name: &str, broker_name: &str) -> String {
    format!("{cluster_name}/{broker_name}")
}

impl Groups {
    pub fn get(&self, cluster_name: &str, broker_name: &str) -> Option<&Group> {
        self.groups.get(&group_key(cluster_name, broker_name))
    }

    /// Applies one command (see the module documentation for the rules).
    pub fn apply(&mut self, command: &Command) -> CommandResult {
        let refuse = |group: Option<&Group>, why: String| CommandResult {
            applied: false,
            why_not: why,
            group: group.cloned(),
        };
        match command {
            Command::Register {
                cluster_name,
                broker_name,
                broker_id,
                replica,
            } => {
                let group = self
                    .groups
                    .entry(group_key(cluster_name, broker_name))
                    .or_insert_with(|| Group {
                        cluster_name: cluster_name.clone(),
                        broker_name: broker_name.clone(),
                        ..Group::default()
                    });
                let changed = group.replicas.get(broker_id) != Some(replica);
                group.replicas.insert(*broker_id, replica.clone());
                CommandResult {
                    applied: changed,
                    why_not: String::new(),
                    group: Some(group.clone()),
                }
            }
            Command::Elect {
                cluster_name,
                broker_name,
                broker_id,
                expected_epoch,
            } => {
                let Some(group) = self.groups.get_mut(&group_key(cluster_name, broker_name)) else {
                    return refuse(None, "no such group".into());
                };
                if group.epoch != *expected_epoch {
                    return refuse(
                        Some(group),
                        format!("epoch is {}, not {expected_epoch}", group.epoch),
                    );
                }
                if !group.replicas.contains_key(broker_id) {
                    return refuse(Some(group), format!("broker {broker_id} never registered"));
                }
                // The first master may be anyone; later ones only an in-sync replica.
                if group.master != 0 && !group.sync_state_set.contains(broker_id) {
                    return refuse(
                        Some(group),
                        format!("broker {broker_id} is not in the SyncStateSet"),
                    );
                }
                group.master = *broker_id;
                group.epoch += 1;
                group.sync_state_set = BTreeSet::from([*broker_id]);
                group.sync_state_epoch += 1;
                CommandResult {
                    applied: true,
                    why_not: String::new(),
                    group: Some(group.clone()),
                }
            }
            Command::LeaveSyncStateSet {
                cluster_name,
                broker_name,
                broker_id,
                epoch,
            } => {
                let Some(group) = self.groups.get_mut(&group_key(cluster_name, broker_name)) else {
                    return refuse(None, "no such group".into());
                };
                if group.epoch != *epoch || group.master == *broker_id {
                    return refuse(
                        Some(group),
                        format!(
                            "broker {broker_id} is the master or the epoch is {}, not {epoch}",
                            group.epoch
                        ),
                    );
                }
                let changed = group.sync_state_set.remove(broker_id);
                if changed {
                    group.sync_state_epoch += 1;
                }
                CommandResult {
                    applied: changed,
                    why_not: String::new(),
                    group: Some(group.clone()),
                }
            }
            Command::AlterSyncStateSet {
                cluster_name,
                broker_name,
                master,
                epoch,
                sync_state_set,
                expected,
                expected_set_epoch,
            } => {
                let Some(group) = self.groups.get_mut(&group_key(cluster_name, broker_name)) else {
                    return refuse(None, "no such group".into());
                };
                if group.master != *master || group.epoch != *epoch {
                    return refuse(
                        Some(group),
                        format!(
                            "the master is {} in epoch {}, not {master} in {epoch}",
                            group.master, group.epoch
                        ),
                    );
                }
                if let Some(expected_set_epoch) = expected_set_epoch {
                    if *expected_set_epoch != group.sync_state_epoch {
                        return refuse(
                            Some(group),
                            format!(
                                "the set was judged against set epoch {expected_set_epoch}, but it is {} now",
                                group.sync_state_epoch
                            ),
                        );
                    }
                }
                if let Some(expected) = expected {
                    let mut others = group.sync_state_set.clone();
                    others.remove(master);
                    if *expected != others {
                        return refuse(
                            Some(group),
                            format!(
                                "the set was judged against {expected:?}, but it is {:?} now",
                                group.sync_state_set
                            ),
                        );
                    }
                }
                let mut set = sync_state_set.clone();
                set.retain(|id| group.replicas.contains_key(id));
                set.insert(*master);
                let changed = set != group.sync_state_set;
                if changed {
                    group.sync_state_set = set;
                    group.sync_state_epoch += 1;
                }
                CommandResult {
                    applied: changed,
                    why_not: String::new(),
                    group: Some(group.clone()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn register(groups: &mut Groups, id: i64) {
        groups.apply(&Command::Register {
            cluster_name: "c".into(),
            broker_name: "b".into(),
            broker_id: id,
            replica: Replica {
                address: format!("127.0.0.1:{id}"),
                ha_address: format!("127.0.0.1:{}", id + 1),
            },
        });
    }

    fn elect(groups: &mut Groups, id: i64, expected_epoch: u64) -> CommandResult {
        groups.apply(&Command::Elect {
            cluster_name: "c".into(),
            broker_name: "b".into(),
            broker_id: id,
            expected_epoch,
        })
    }

    fn alter(groups: &mut Groups, master: i64, epoch: u64, set: &[i64]) -> CommandResult {
        groups.apply(&Command::AlterSyncStateSet {
            cluster_name: "c".into(),
            broker_name: "b".into(),
            master,
            epoch,
            sync_state_set: set.iter().copied().collect(),
            expected: None,
            expected_set_epoch: None,
        })
    }

    #[test]
    fn the_first_master_is_anyone_and_later_ones_come_from_the_sync_state_set() {
        let mut groups = Groups::default();
        for id in [1, 2, 3] {
            register(&mut groups, id);
        }
        assert!(elect(&mut groups, 1, 0).applied);
        let group = groups.get("c", "b").unwrap();
        assert_eq!((group.master, group.epoch), (1, 1));
        // Broker 3 never caught up: it cannot be elected.
        assert!(alter(&mut groups, 1, 1, &[2]).applied);
        assert!(!elect(&mut groups, 3, 1).applied);
        // A decision made on an old epoch is refused.
        assert!(!elect(&mut groups, 2, 0).applied);
        let result = elect(&mut groups, 2, 1);
        assert!(result.applied);
        let group = result.group.unwrap();
        assert_eq!((group.master, group.epoch), (2, 2));
        assert_eq!(group.sync_state_set, BTreeSet::from([2]));
    }

    #[test]
    fn a_starting_slave_leaves_the_set_but_the_master_never_does() {
        let mut groups = Groups::default();
        for id in 1..=3 {
            register(&mut groups, id);
        }
        let elect = groups.apply(&Command::Elect {
            cluster_name: "c".into(),
            broker_name: "b".into(),
            broker_id: 1,
            expected_epoch: 0,
        });
        assert!(elect.applied);
        let alter = groups.apply(&Command::AlterSyncStateSet {
            cluster_name: "c".into(),
            broker_name: "b".into(),
            master: 1,
            epoch: 1,
            sync_state_set: BTreeSet::from([1, 2, 3]),
            expected: None,
            expected_set_epoch: None,
        });
        assert!(alter.applied);
        let leave = |groups: &mut Groups, id: i64, epoch: u64| {
            groups.apply(&Command::LeaveSyncStateSet {
                cluster_name: "c".into(),
                broker_name: "b".into(),
                broker_id: id,
                epoch,
            })
        };
        assert!(!leave(&mut groups, 1, 1).applied, "the master stays");
        assert!(
            !leave(&mut groups, 2, 0).applied,
            "a stale epoch changes nothing"
        );
        let left = leave(&mut groups, 2, 1);
        assert!(left.applied);
        assert_eq!(left.group.unwrap().sync_state_set, BTreeSet::from([1, 3]));
        assert!(!leave(&mut groups, 2, 1).applied, "gone already");
        // A heartbeat the master judged against the set before the leave does not bring the
        // slave back; one judged against the set as it is now does.
        let alter = |groups: &mut Groups, expected: &[i64]| {
            groups.apply(&Command::AlterSyncStateSet {
                cluster_name: "c".into(),
                broker_name: "b".into(),
                master: 1,
                epoch: 1,
                sync_state_set: BTreeSet::from([1, 2, 3]),
                expected: Some(expected.iter().copied().collect()),
                expected_set_epoch: None,
            })
        };
        let stale = alter(&mut groups, &[2, 3]);
        assert!(!stale.applied);
        assert_eq!(stale.group.unwrap().sync_state_set, BTreeSet::from([1, 3]));
        assert!(alter(&mut groups, &[3]).applied);
    }

    #[test]
    fn every_set_change_bumps_the_set_epoch_and_a_change_judged_against_an_older_one_is_refused() {
        let mut groups = Groups::default();
        for id in [1, 2, 3] {
            register(&mut groups, id);
        }
        let set_epoch = |groups: &Groups| groups.get("c", "b").unwrap().sync_state_epoch;
        assert_eq!(set_epoch(&groups), 0);
        elect(&mut groups, 1, 0);
        assert_eq!(set_epoch(&groups), 1, "an election makes a new set");
        let alter = |groups: &mut Groups, set: &[i64], judged: &[i64], set_epoch: u64| {
            groups.apply(&Command::AlterSyncStateSet {
                cluster_name: "c".into(),
                broker_name: "b".into(),
                master: 1,
                epoch: 1,
                sync_state_set: set.iter().copied().collect(),
                expected: Some(judged.iter().copied().collect()),
                expected_set_epoch: Some(set_epoch),
            })
        };
        assert!(alter(&mut groups, &[1, 2], &[], 1).applied);
        assert_eq!(set_epoch(&groups), 2);
        assert!(!alter(&mut groups, &[1, 2], &[2], 2).applied, "no change");
        assert_eq!(set_epoch(&groups), 2, "nothing changed, no new epoch");
        // Slave 2 restarts and leaves, then rejoins: the set has its old value again...
        groups.apply(&Command::LeaveSyncStateSet {
            cluster_name: "c".into(),
            broker_name: "b".into(),
            broker_id: 2,
            epoch: 1,
        });
        assert_eq!(set_epoch(&groups), 3);
        assert!(alter(&mut groups, &[1, 2], &[], 3).applied);
        assert_eq!(set_epoch(&groups), 4);
        // ...but a change the master judged before all that (set epoch 2, the same value) is
        // refused: comparing values alone would have let it through.
        let stale = alter(&mut groups, &[1, 2, 3], &[2], 2);
        assert!(!stale.applied);
        assert!(stale.why_not.contains("set epoch 2"), "{}", stale.why_not);
        assert!(alter(&mut groups, &[1, 2, 3], &[2], 4).applied);
        assert_eq!(set_epoch(&groups), 5);
    }

    #[test]
    fn only_the_current_master_changes_the_set_and_it_always_holds_the_master() {
        let mut groups = Groups::default();
        for id in [1, 2, 3] {
            register(&mut groups, id);
        }
        elect(&mut groups, 1, 0);
        assert!(!alter(&mut groups, 2, 1, &[2, 3]).applied, "not the master");
        assert!(!alter(&mut groups, 1, 0, &[2, 3]).applied, "stale epoch");
        assert!(alter(&mut groups, 1, 1, &[2, 3, 9]).applied);
        assert_eq!(
            groups.get("c", "b").unwrap().sync_state_set,
            BTreeSet::from([1, 2, 3]),
            "unknown ids dropped, the master kept"
        );
        assert!(!alter(&mut groups, 1, 1, &[3, 2]).applied, "no change");
    }
}
