//! The broker's topic table: which topics it hosts, their queue counts and permissions.
//!
//! Owns `<data>/topics` (JSON, written atomically) and the immutable snapshots (`Arc`) that
//! network shards use to validate requests. Storage shard 0 owns the mutable table and
//! broadcasts a new snapshot after every change; nobody else writes it.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::naming::{is_system_topic, DLQ_TOPIC_PREFIX, RETRY_TOPIC_PREFIX};

pub use crate::layout::TOPICS_FILE;
pub const PERM_READ: u32 = 4;
pub const PERM_WRITE: u32 = 2;
pub const PERM_INHERIT: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicConfig {
    pub name: String,
    pub read_queues: u32,
    pub write_queues: u32,
    pub perm: u32,
    #[serde(default)]
    pub is_ordered: bool,
}

impl TopicConfig {
    pub fn new(name: &str, queues: u32) -> TopicConfig {
        TopicConfig {
            name: name.to_owned(),
            read_queues: queues,
            write_queues: queues,
            perm: PERM_READ | PERM_WRITE,
            is_ordered: false,
        }
    }

    pub fn is_readable(&self) -> bool {
        self.perm & PERM_READ != 0
    }

    pub fn is_writable(&self) -> bool {
        self.perm & PERM_WRITE != 0
    }

    /// The config as the wire's `TopicConfig` table (registration and topic listings).
    /// The config a `TopicConfig` table carries.
    pub fn from_wire(config: &shardmq_schema::wire::TopicConfig<'_>) -> TopicConfig {
        TopicConfig {
            name: config.name().unwrap_or_default().to_owned(),
            read_queues: config.read_queues(),
            write_queues: config.write_queues(),
            perm: config.perm(),
            is_ordered: config.is_ordered(),
        }
    }

    pub fn to_wire<'b>(
        &self,
        builder: &mut flatbuffers::FlatBufferBuilder<'b>,
    ) -> flatbuffers::WIPOffset<shardmq_schema::wire::TopicConfig<'b>> {
        let name = builder.create_string(&self.name);
        shardmq_schema::wire::TopicConfig::create(
            builder,
            &shardmq_schema::wire::TopicConfigArgs {
                name: Some(name),
                read_queues: self.read_queues,
                write_queues: self.write_queues,
                perm: self.perm,
                is_ordered: self.is_ordered,
            },
        )
    }

    pub fn validate(&self) -> Result<(), String> {
        crate::naming::check_topic_name(&self.name)?;
        if self.read_queues == 0
            || self.write_queues == 0
            || self.read_queues > 1024
            || self.write_queues > 1024
        {
            return Err(format!(
                "topic {}: read and write queues must be 1..=1024 (got {} and {})",
                self.name, self.read_queues, self.write_queues
            ));
        }
        if self.perm & !(PERM_READ | PERM_WRITE | PERM_INHERIT) != 0 {
            return Err(format!(
                "topic {}: perm {} has bits other than read 4, write 2, inherit 1",
                self.name, self.perm
            ));
        }
        Ok(())
    }
}

/// A snapshot of every topic; cheap to share between shards.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicTable {
    pub topics: BTreeMap<String, TopicConfig>,
    /// Bumped on every change; sent to the namesrv with registrations.
    pub version: u64,
}

impl TopicTable {
    pub fn get(&self, name: &str) -> Option<&TopicConfig> {
        self.topics.get(name)
    }

    /// Loads `<data>/topics`; an absent file is an empty table.
    pub fn load(data_dir: &Path) -> Result<TopicTable, String> {
        let path = data_dir.join(TOPICS_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text)
                .map_err(|e| format!("{} is unreadable: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(TopicTable::default()),
            Err(e) => Err(format!("cannot read {}: {e}", path.display())),
        }
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("topic table serializes")
    }

    /// Creates or updates a user topic.
    pub fn upsert(&mut self, config: TopicConfig, is_create_only: bool) -> Result<(), UpsertError> {
        config.validate().map_err(UpsertError::Invalid)?;
        if is_system_topic(&config.name) {
            return Err(UpsertError::Invalid(format!(
                "{} is a system topic and cannot be created by users",
                config.name
            )));
        }
        if is_create_only && self.topics.contains_key(&config.name) {
            return Err(UpsertError::Exists);
        }
        self.topics.insert(config.name.clone(), config);
        self.version += 1;
        Ok(())
    }

    /// Creates a system topic the broker needs (retry/DLQ of a group), if absent.
    pub fn ensure_system_topic(&mut self, name: &str, queues: u32) -> bool {
        debug_assert!(
            name.starts_with(RETRY_TOPIC_PREFIX)
                || name.starts_with(DLQ_TOPIC_PREFIX)
                || is_system_topic(name)
        );
        if self.topics.contains_key(name) {
            return false;
        }
        self.topics
            .insert(name.to_owned(), TopicConfig::new(name, queues));
        self.version += 1;
        true
    }

    pub fn delete(&mut self, name: &str) -> bool {
        let removed = self.topics.remove(name).is_some();
        if removed {
            self.version += 1;
        }
        removed
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpsertError {
    Invalid(String),
    Exists,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upsert_validates_and_versions() {
        let mut table = TopicTable::default();
        table.upsert(TopicConfig::new("orders", 8), true).unwrap();
        assert_eq!(table.version, 1);
        assert_eq!(
            table.upsert(TopicConfig::new("orders", 8), true),
            Err(UpsertError::Exists)
        );
        table.upsert(TopicConfig::new("orders", 4), false).unwrap();
        assert_eq!(table.get("orders").unwrap().write_queues, 4);
        assert!(matches!(
            table.upsert(TopicConfig::new("%DLQ%g", 1), false),
            Err(UpsertError::Invalid(_))
        ));
        assert!(matches!(
            table.upsert(TopicConfig::new("bad/name", 1), false),
            Err(UpsertError::Invalid(_))
        ));
        assert!(matches!(
            table.upsert(TopicConfig::new("zero", 0), false),
            Err(UpsertError::Invalid(_))
        ));
        let json = table.to_json();
        assert_eq!(serde_json::from_slice::<TopicTable>(&json).unwrap(), table);
        assert!(table.delete("orders"));
        assert!(!table.delete("orders"));
    }
}
