//! The controller's Raft storage on disk (openraft's storage v2): the log, the vote, the
//! committed id, and the state machine's snapshots, in the controller data directory.
//!
//! Files:
//! - `raft-log.jsonl`: one JSON entry per line, appended and `fdatasync`ed before openraft is
//!   told they are stored; a torn last line (a crash mid-append) is dropped on open. Truncation
//!   and purging rewrite the file (atomically, by rename).
//! - `raft-meta.json`: the vote, the committed log id and the last purged log id (atomic).
//! - `snapshot.json`: the last snapshot, metadata and the groups (atomic).
//!
//! The state machine itself lives in memory; on open it is the snapshot's, and openraft applies
//! the committed entries after it again.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Cursor, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, LogId, OptionalSend, RaftLogReader, RaftSnapshotBuilder, SnapshotMeta,
    StorageError, StorageIOError, StoredMembership, Vote,
};
use serde::{Deserialize, Serialize};

use super::state::{CommandResult, Groups};
use super::{NodeId, TypeConfig};

type StoreResult<T> = Result<T, StorageError<NodeId>>;

fn io_err(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::<NodeId>::write(&e).into()
}

/// Replaces `path` with `bytes` so that a reader sees the old or the new content.
fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let temp = path.with_extension("tmp");
    {
        let mut file = File::create(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    fs::rename(&temp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Meta {
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
    last_purged: Option<LogId<NodeId>>,
}

#[derive(Debug)]
struct LogInner {
    dir: PathBuf,
    log: BTreeMap<u64, Entry<TypeConfig>>,
    meta: Meta,
    file: File,
}

impl LogInner {
    fn log_path(dir: &Path) -> PathBuf {
        dir.join("raft-log.jsonl")
    }

    fn save_meta(&self) -> io::Result<()> {
        let bytes = serde_json::to_vec(&self.meta).map_err(io::Error::other)?;
        write_atomically(&self.dir.join("raft-meta.json"), &bytes)
    }

    /// Rewrites the log file from memory (after a truncation or purge).
    fn rewrite(&mut self) -> io::Result<()> {
        let mut text = Vec::new();
        for entry in self.log.values() {
            serde_json::to_writer(&mut text, entry).map_err(io::Error::other)?;
            text.push(b'\n');
        }
        let path = LogInner::log_path(&self.dir);
        write_atomically(&path, &text)?;
        self.file = OpenOptions::new().append(true).open(&path)?;
        Ok(())
    }
}

/// The Raft log (and vote). Cloning shares it.
#[derive(Debug, Clone)]
pub struct LogStore {
    inner: Arc<Mutex<LogInner>>,
}

impl LogStore {
    /// Opens (creating) the log in `dir`.
    pub fn open(dir: &Path) -> io::Result<LogStore> {
        fs::create_dir_all(dir)?;
        let meta: Meta = match fs::read(dir.join("raft-meta.json")) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidData, format!("raft-meta.json: {e}"))
            })?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Meta::default(),
            Err(e) => return Err(e),
        };
        let path = LogInner::log_path(dir);
        let mut log = BTreeMap::new();
        let mut valid_len = 0usize;
        if let Ok(text) = fs::read(&path) {
            for line in text.split_inclusive(|b| *b == b'\n') {
                if !line.ends_with(b"\n") {
                    break; // torn by a crash mid-append
                }
                match serde_json::from_slice::<Entry<TypeConfig>>(line) {
                    Ok(entry) => {
                        log.insert(entry.log_id.index, entry);
                        valid_len += line.len();
                    }
                    Err(_) => break,
                }
            }
        }
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        if (file.metadata()?.len() as usize) > valid_len {
            file.set_len(valid_len as u64)?;
            file.sync_all()?;
        }
        Ok(LogStore {
            inner: Arc::new(Mutex::new(LogInner {
                dir: dir.to_owned(),
                log,
                meta,
                file,
            })),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LogInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StoreResult<Vec<Entry<TypeConfig>>> {
        Ok(self
            .lock()
            .log
            .range(range)
            .map(|(_, entry)| entry.clone())
            .collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StoreResult<LogState<TypeConfig>> {
        let inner = self.lock();
        let last_purged = inner.meta.last_purged;
        let last = inner
            .log
            .values()
            .next_back()
            .map(|e| e.log_id)
            .or(last_purged);
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StoreResult<()> {
        let mut inner = self.lock();
        inner.meta.vote = Some(*vote);
        inner.save_meta().map_err(io_err)
    }

    async fn read_vote(&mut self) -> StoreResult<Option<Vote<NodeId>>> {
        Ok(self.lock().meta.vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StoreResult<()> {
        let mut inner = self.lock();
        inner.meta.committed = committed;
        inner.save_meta().map_err(io_err)
    }

    async fn read_committed(&mut self) -> StoreResult<Option<LogId<NodeId>>> {
        Ok(self.lock().meta.committed)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StoreResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut inner = self.lock();
        let mut text = Vec::new();
        let mut appended = Vec::new();
        for entry in entries {
            serde_json::to_writer(&mut text, &entry).map_err(io_err)?;
            text.push(b'\n');
            appended.push(entry);
        }
        let written = inner
            .file
            .write_all(&text)
            .and_then(|()| inner.file.sync_data());
        if written.is_ok() {
            for entry in appended {
                inner.log.insert(entry.log_id.index, entry);
            }
        }
        let outcome = written
            .as_ref()
            .map(|_| ())
            .map_err(|e| io::Error::new(e.kind(), e.to_string()));
        callback.log_io_completed(outcome);
        written.map_err(io_err)
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StoreResult<()> {
        let mut inner = self.lock();
        inner.log.split_off(&log_id.index);
        inner.rewrite().map_err(io_err)
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StoreResult<()> {
        let mut inner = self.lock();
        inner.meta.last_purged = Some(log_id);
        inner.save_meta().map_err(io_err)?;
        let keep = inner.log.split_off(&(log_id.index + 1));
        inner.log = keep;
        inner.rewrite().map_err(io_err)
    }
}

/// What a snapshot holds besides the groups.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MachineData {
    pub last_applied: Option<LogId<NodeId>>,
    pub last_membership: StoredMembership<NodeId, openraft::BasicNode>,
    pub groups: Groups,
}

#[derive(Debug, Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, openraft::BasicNode>,
    data: Vec<u8>,
}

#[derive(Debug)]
struct MachineInner {
    dir: PathBuf,
    data: MachineData,
    snapshot: Option<StoredSnapshot>,
    snapshots_built: u64,
}

/// The state machine: the groups, shared with the server (read-only there).
#[derive(Debug, Clone)]
pub struct StateMachine {
    inner: Arc<Mutex<MachineInner>>,
}

impl StateMachine {
    /// Opens the state machine from the last snapshot in `dir`, if any.
    pub fn open(dir: &Path) -> io::Result<StateMachine> {
        let snapshot: Option<StoredSnapshot> = match fs::read(dir.join("snapshot.json")) {
            Ok(bytes) => Some(serde_json::from_slice(&bytes).map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidData, format!("snapshot.json: {e}"))
            })?),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let data = match &snapshot {
            Some(s) => serde_json::from_slice(&s.data).map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidData, format!("snapshot data: {e}"))
            })?,
            None => MachineData::default(),
        };
        Ok(StateMachine {
            inner: Arc::new(Mutex::new(MachineInner {
                dir: dir.to_owned(),
                data,
                snapshot,
                snapshots_built: 0,
            })),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MachineInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of the groups as applied so far.
    pub fn groups(&self) -> Groups {
        self.lock().data.groups.clone()
    }

    pub fn last_applied_index(&self) -> u64 {
        self.lock().data.last_applied.map_or(0, |l| l.index)
    }

    fn save_snapshot(inner: &mut MachineInner, snapshot: StoredSnapshot) -> io::Result<()> {
        let bytes = serde_json::to_vec(&snapshot).map_err(io::Error::other)?;
        write_atomically(&inner.dir.join("snapshot.json"), &bytes)?;
        inner.snapshot = Some(snapshot);
        Ok(())
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> StoreResult<Snapshot<TypeConfig>> {
        let mut inner = self.lock();
        let data = serde_json::to_vec(&inner.data).map_err(io_err)?;
        inner.snapshots_built += 1;
        let last = inner.data.last_applied;
        let meta = SnapshotMeta {
            last_log_id: last,
            last_membership: inner.data.last_membership.clone(),
            snapshot_id: format!("{}-{}", last.map_or(0, |l| l.index), inner.snapshots_built),
        };
        StateMachine::save_snapshot(
            &mut inner,
            StoredSnapshot {
                meta: meta.clone(),
                data: data.clone(),
            },
        )
        .map_err(io_err)?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(
        &mut self,
    ) -> StoreResult<(
        Option<LogId<NodeId>>,
        StoredMembership<NodeId, openraft::BasicNode>,
    )> {
        let inner = self.lock();
        Ok((inner.data.last_applied, inner.data.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StoreResult<Vec<CommandResult>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut inner = self.lock();
        let mut results = Vec::new();
        for entry in entries {
            inner.data.last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => results.push(CommandResult::default()),
                EntryPayload::Normal(command) => {
                    results.push(inner.data.groups.apply(&command));
                }
                EntryPayload::Membership(membership) => {
                    inner.data.last_membership =
                        StoredMembership::new(Some(entry.log_id), membership);
                    results.push(CommandResult::default());
                }
            }
        }
        Ok(results)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> StoreResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, openraft::BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StoreResult<()> {
        let bytes = snapshot.into_inner();
        let data: MachineData = serde_json::from_slice(&bytes).map_err(io_err)?;
        let mut inner = self.lock();
        inner.data = data;
        StateMachine::save_snapshot(
            &mut inner,
            StoredSnapshot {
                meta: meta.clone(),
                data: bytes,
            },
        )
        .map_err(io_err)
    }

    async fn get_current_snapshot(&mut self) -> StoreResult<Option<Snapshot<TypeConfig>>> {
        let inner = self.lock();
        Ok(inner.snapshot.as_ref().map(|s| Snapshot {
            meta: s.meta.clone(),
            snapshot: Box::new(Cursor::new(s.data.clone())),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::state::{Command, Replica};
    use openraft::{CommittedLeaderId, EntryPayload, LogId};

    fn entry(index: u64, command: Command) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(command),
        }
    }

    fn register(id: i64) -> Command {
        Command::Register {
            cluster_name: "c".into(),
            broker_name: "b".into(),
            broker_id: id,
            replica: Replica {
                address: format!("127.0.0.1:{id}"),
                ha_address: String::new(),
            },
        }
    }

    #[tokio::test]
    async fn the_log_survives_a_reopen_and_a_torn_last_line_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut log = LogStore::open(dir.path()).unwrap();
            {
                let mut inner = log.lock();
                for index in 1..=3 {
                    let entry = entry(index, register(index as i64));
                    serde_json::to_writer(&mut inner.file, &entry).unwrap();
                    inner.file.write_all(b"\n").unwrap();
                    inner.log.insert(index, entry);
                }
            }
            log.save_vote(&Vote::new(3, 2)).await.unwrap();
        }
        // A crash mid-append leaves half a line.
        let path = dir.path().join("raft-log.jsonl");
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(br#"{"log_id":"#).unwrap();
        drop(file);
        let mut log = LogStore::open(dir.path()).unwrap();
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id.map(|l| l.index), Some(3));
        assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(3, 2)));
        let entries = log.try_get_log_entries(1..4).await.unwrap();
        assert_eq!(entries.len(), 3);
        // Truncating and purging rewrite the file; a reopen sees the same.
        log.truncate(LogId::new(CommittedLeaderId::new(1, 1), 3))
            .await
            .unwrap();
        log.purge(LogId::new(CommittedLeaderId::new(1, 1), 1))
            .await
            .unwrap();
        let mut reopened = LogStore::open(dir.path()).unwrap();
        let entries = reopened.try_get_log_entries(0..10).await.unwrap();
        assert_eq!(
            entries.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
            vec![2]
        );
        let state = reopened.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id.map(|l| l.index), Some(1));
    }

    #[tokio::test]
    async fn a_snapshot_is_kept_on_disk_and_installs_the_same_groups_elsewhere() {
        let dir = tempfile::tempdir().unwrap();
        let mut machine = StateMachine::open(dir.path()).unwrap();
        machine
            .apply([entry(1, register(1)), entry(2, register(2))])
            .await
            .unwrap();
        let snapshot = machine.build_snapshot().await.unwrap();
        assert_eq!(snapshot.meta.last_log_id.map(|l| l.index), Some(2));
        // Reopened from its directory: the snapshot's groups.
        let reopened = StateMachine::open(dir.path()).unwrap();
        assert_eq!(reopened.groups(), machine.groups());
        assert_eq!(reopened.last_applied_index(), 2);
        // Installed on another node.
        let other_dir = tempfile::tempdir().unwrap();
        let mut other = StateMachine::open(other_dir.path()).unwrap();
        other
            .install_snapshot(&snapshot.meta, snapshot.snapshot)
            .await
            .unwrap();
        assert_eq!(other.groups(), machine.groups());
        let current = other.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta, snapshot.meta);
        assert_eq!(other.groups().get("c", "b").unwrap().replicas.len(), 2);
    }
}
