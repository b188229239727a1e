//! The data directory's identity (`<data>/meta`) and the fixed queue → storage shard function.
//!
//! Owns the rule that decides which storage shard stores a (topic, queue): it is recorded in the
//! data directory at creation, and a broker started with another shard count refuses to run on
//! it (its queues would be looked for on the wrong shards).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::store::atomic_file::write_atomically;

pub use crate::layout::META_FILE;
pub const META_FORMAT_VERSION: u32 = 1;
/// The one mapping function this version knows; recorded by name so a future one can coexist.
pub const QUEUE_MAPPING: &str = "fnv1a32(topic) + queue_id mod storage_shards";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataDirMeta {
    pub format_version: u32,
    pub storage_shards: usize,
    pub queue_mapping: String,
    pub cluster_name: String,
    pub broker_name: String,
}

/// Storage shard of (topic, queue): FNV-1a (32-bit) of the topic name plus the queue id, modulo
/// the shard count. Consecutive queues of a topic land on consecutive shards.
pub fn storage_shard_of(topic: &str, queue_id: u32, storage_shards: usize) -> usize {
    let mut hash: u32 = 0x811c_9dc5;
    for &b in topic.as_bytes() {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    ((u64::from(hash) + u64::from(queue_id)) % storage_shards as u64) as usize
}

/// Creates the meta file of a new data directory, or checks an existing one against the
/// configuration.
pub fn open_or_create(
    data_dir: &Path,
    storage_shards: usize,
    cluster_name: &str,
    broker_name: &str,
) -> Result<DataDirMeta, String> {
    std::fs::create_dir_all(data_dir)
        .map_err(|e| format!("cannot create {}: {e}", data_dir.display()))?;
    let path = data_dir.join(META_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let meta: DataDirMeta = serde_json::from_str(&text)
                .map_err(|e| format!("{} is unreadable: {e}", path.display()))?;
            if meta.format_version != META_FORMAT_VERSION {
                return Err(format!(
                    "{} has format version {}; this broker reads version {META_FORMAT_VERSION}",
                    path.display(),
                    meta.format_version
                ));
            }
            if meta.queue_mapping != QUEUE_MAPPING {
                return Err(format!(
                    "{} uses queue mapping `{}`, unknown to this broker",
                    path.display(),
                    meta.queue_mapping
                ));
            }
            if meta.storage_shards != storage_shards {
                return Err(format!(
                    "{} was created with {} storage shards but the broker is configured with {storage_shards}: \
                     start it with {} storage cores (queues live on the shard the data directory assigned)",
                    data_dir.display(),
                    meta.storage_shards,
                    meta.storage_shards
                ));
            }
            Ok(meta)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let meta = DataDirMeta {
                format_version: META_FORMAT_VERSION,
                storage_shards,
                queue_mapping: QUEUE_MAPPING.into(),
                cluster_name: cluster_name.into(),
                broker_name: broker_name.into(),
            };
            let text = serde_json::to_string_pretty(&meta).expect("meta serializes");
            write_atomically(&path, text.as_bytes())
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            Ok(meta)
        }
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_is_stable_and_spreads_queues() {
        // Stable across releases: these values are part of the data directory format.
        assert_eq!(storage_shard_of("orders", 0, 1), 0);
        let shards: Vec<usize> = (0..8).map(|q| storage_shard_of("orders", q, 2)).collect();
        assert!(shards.contains(&0) && shards.contains(&1));
        assert_eq!(
            storage_shard_of("orders", 3, 4),
            storage_shard_of("orders", 3, 4)
        );
    }

    #[test]
    fn refuses_a_different_shard_count() {
        let dir = tempfile::tempdir().unwrap();
        open_or_create(dir.path(), 2, "c", "b").unwrap();
        assert!(open_or_create(dir.path(), 2, "c", "b").is_ok());
        let err = open_or_create(dir.path(), 1, "c", "b").unwrap_err();
        assert!(err.contains("2 storage shards"), "{err}");
    }
}
