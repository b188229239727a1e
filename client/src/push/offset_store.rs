//! A push consumer's consumed offsets: kept in memory, pushed to where they persist every 5 s
//! (RocketMQ's `persistConsumerOffsetInterval`), on rebalance and on shutdown.
//!
//! Owns: the offset of each assigned queue (the next offset to consume, only ever moved
//! forward by consumption), which ones changed since the last persist, and where they persist:
//! the broker for a clustering group (RemoteBrokerOffsetStore), a local file for a
//! broadcasting consumer (LocalFileOffsetStore: every instance has its own progress). The file
//! is JSON, rewritten atomically (temp file, fsync, rename). Never: computing offsets.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::{json, Value};
use tracing::{debug, warn};

use crate::error::{Error, Result};
use crate::instance::ClientInstance;
use crate::route::MessageQueue;

#[derive(Debug, Clone, Copy)]
struct Entry {
    offset: i64,
    is_dirty: bool,
}

/// Where offsets persist.
#[derive(Debug, Clone)]
pub(crate) enum OffsetBackend {
    /// The broker hosting each queue (clustering).
    Broker,
    /// A JSON file of this instance (broadcasting).
    LocalFile(PathBuf),
}

/// Offsets of one consumer group in one client.
#[derive(Debug)]
pub(crate) struct OffsetStore {
    group: String,
    backend: OffsetBackend,
    offsets: Mutex<HashMap<MessageQueue, Entry>>,
}

impl OffsetStore {
    /// A store for `group`; a local file's offsets are loaded now.
    pub(crate) fn open(group: &str, backend: OffsetBackend) -> Result<Self> {
        let offsets = match &backend {
            OffsetBackend::Broker => HashMap::new(),
            OffsetBackend::LocalFile(path) => load_file(path)?,
        };
        Ok(Self {
            group: group.to_owned(),
            backend,
            offsets: Mutex::new(offsets),
        })
    }

    fn offsets(&self) -> std::sync::MutexGuard<'_, HashMap<MessageQueue, Entry>> {
        self.offsets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records consumption progress: moves the queue's offset forward to `offset` (never
    /// back; consume results may arrive out of order).
    pub(crate) fn advance(&self, queue: &MessageQueue, offset: i64) {
        let mut offsets = self.offsets();
        let entry = offsets.entry(queue.clone()).or_insert(Entry {
            offset,
            is_dirty: true,
        });
        if offset > entry.offset {
            entry.offset = offset;
            entry.is_dirty = true;
        }
    }

    /// Sets the queue's offset whatever it was (start position, offset reset).
    pub(crate) fn set(&self, queue: &MessageQueue, offset: i64) {
        self.offsets().insert(
            queue.clone(),
            Entry {
                offset,
                is_dirty: true,
            },
        );
    }

    /// The offset in memory, if any.
    pub(crate) fn get(&self, queue: &MessageQueue) -> Option<i64> {
        self.offsets().get(queue).map(|entry| entry.offset)
    }

    /// The offset where the group left `queue`: in memory (broadcasting: loaded from the
    /// file), else (clustering) the broker's committed one. `None` for a new group.
    pub(crate) async fn read_persisted(
        &self,
        instance: &ClientInstance,
        queue: &MessageQueue,
    ) -> Result<Option<i64>> {
        match &self.backend {
            OffsetBackend::LocalFile(_) => Ok(self.get(queue)),
            OffsetBackend::Broker => {
                // Offsets live with the master; with the master gone, the slave (RocketMQ's rule).
                let address = instance.broker_address(queue, false).await?;
                instance
                    .pool
                    .query_consumer_offset(
                        &address,
                        instance.request_timeout(),
                        &self.group,
                        &queue.topic,
                        queue.queue_id,
                    )
                    .await
            }
        }
    }

    /// Persists the changed offsets of `queues` (all queues when `None`).
    pub(crate) async fn persist(&self, instance: &ClientInstance, queues: Option<&[MessageQueue]>) {
        match &self.backend {
            OffsetBackend::LocalFile(path) => {
                if let Err(error) = self.write_file(path) {
                    warn!(%error, "cannot persist local consumer offsets");
                }
            }
            OffsetBackend::Broker => {
                let dirty: Vec<(MessageQueue, i64)> = self
                    .offsets()
                    .iter()
                    .filter(|(queue, entry)| {
                        entry.is_dirty && !matches!(queues, Some(wanted) if !wanted.contains(queue))
                    })
                    .map(|(queue, entry)| (queue.clone(), entry.offset))
                    .collect();
                for (queue, offset) in dirty {
                    match self.commit_to_broker(instance, &queue, offset).await {
                        Ok(()) => {
                            if let Some(entry) = self.offsets().get_mut(&queue) {
                                if entry.offset == offset {
                                    entry.is_dirty = false;
                                }
                            }
                        }
                        Err(error) => {
                            warn!(%queue, offset, %error, "cannot commit the consumer offset; will retry");
                        }
                    }
                }
            }
        }
    }

    async fn commit_to_broker(
        &self,
        instance: &ClientInstance,
        queue: &MessageQueue,
        offset: i64,
    ) -> Result<()> {
        // Offsets live with the master; with the master gone, the slave (RocketMQ's rule).
        let address = instance.broker_address(queue, false).await?;
        instance
            .pool
            .commit_consumer_offset(
                &address,
                instance.request_timeout(),
                &self.group,
                &queue.topic,
                queue.queue_id,
                offset,
            )
            .await?;
        debug!(%queue, offset, "consumer offset committed");
        Ok(())
    }

    /// Persists `queue`'s offset now and forgets it (the queue went to another member).
    pub(crate) async fn persist_and_remove(&self, instance: &ClientInstance, queue: &MessageQueue) {
        self.persist(instance, Some(std::slice::from_ref(queue)))
            .await;
        if matches!(self.backend, OffsetBackend::Broker) {
            self.offsets().remove(queue);
        }
    }

    fn write_file(&self, path: &Path) -> Result<()> {
        let entries: Vec<Value> = {
            let mut offsets = self.offsets();
            let mut entries: Vec<(MessageQueue, i64)> = offsets
                .iter_mut()
                .map(|(queue, entry)| {
                    entry.is_dirty = false;
                    (queue.clone(), entry.offset)
                })
                .collect();
            entries.sort();
            entries
                .into_iter()
                .map(|(queue, offset)| {
                    json!({
                        "topic": queue.topic,
                        "broker_name": queue.broker_name,
                        "queue_id": queue.queue_id,
                        "offset": offset,
                    })
                })
                .collect()
        };
        let text =
            serde_json::to_string_pretty(&json!({ "group": self.group, "offsets": entries }))
                .unwrap_or_default();
        write_atomically(path, text.as_bytes()).map_err(|source| Error::OffsetStore {
            path: path.display().to_string(),
            source,
        })
    }
}

/// Writes `bytes` to `path` so that a crash leaves the old or the new file, never a mix:
/// temp file, fsync, rename, fsync of the directory.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let directory = path.parent().unwrap_or_else(|| Path::new("."));
    std::fs::create_dir_all(directory)?;
    let temporary = path.with_extension("json.tmp");
    {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(&temporary, path)?;
    if let Ok(directory) = std::fs::File::open(directory) {
        let _ = directory.sync_all();
    }
    Ok(())
}

fn load_file(path: &Path) -> Result<HashMap<MessageQueue, Entry>> {
    let error = |source| Error::OffsetStore {
        path: path.display().to_string(),
        source,
    };
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(missing) if missing.kind() == std::io::ErrorKind::NotFound => return Ok(HashMap::new()),
        Err(other) => return Err(error(other)),
    };
    let invalid = |what: &str| {
        error(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{what}; fix or delete the file to start over"),
        ))
    };
    let document: Value =
        serde_json::from_str(&text).map_err(|e| invalid(&format!("not JSON: {e}")))?;
    let mut offsets = HashMap::new();
    for entry in document["offsets"].as_array().into_iter().flatten() {
        let (Some(topic), Some(broker_name), Some(queue_id), Some(offset)) = (
            entry["topic"].as_str(),
            entry["broker_name"].as_str(),
            entry["queue_id"].as_u64(),
            entry["offset"].as_i64(),
        ) else {
            return Err(invalid(&format!("entry {entry} lacks a field")));
        };
        let queue_id = u32::try_from(queue_id).map_err(|_| invalid("queue_id out of range"))?;
        offsets.insert(
            MessageQueue::new(topic, broker_name, queue_id),
            Entry {
                offset,
                is_dirty: false,
            },
        );
    }
    Ok(offsets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumption_only_moves_forward() {
        let store = OffsetStore::open("g", OffsetBackend::Broker).unwrap();
        let queue = MessageQueue::new("t", "b", 0);
        store.advance(&queue, 5);
        store.advance(&queue, 3);
        assert_eq!(store.get(&queue), Some(5));
        store.set(&queue, 2);
        assert_eq!(store.get(&queue), Some(2));
    }

    #[test]
    fn local_file_round_trips() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("g").join("offsets.json");
        let store = OffsetStore::open("g", OffsetBackend::LocalFile(path.clone())).unwrap();
        let queue = MessageQueue::new("t", "b", 3);
        store.advance(&queue, 42);
        store.write_file(&path).unwrap();
        let again = OffsetStore::open("g", OffsetBackend::LocalFile(path.clone())).unwrap();
        assert_eq!(again.get(&queue), Some(42));
        std::fs::write(&path, "not json").unwrap();
        let error = OffsetStore::open("g", OffsetBackend::LocalFile(path)).unwrap_err();
        assert!(error.to_string().contains("fix or delete"), "{error}");
    }
}
