//! The shard checkpoint: how far the CommitLog is known durable and how far the derived files
//! (ConsumeQueues and index) are known durable, so recovery scans only the tail.
//!
//! Owns the `<shard>/checkpoint` file format (byte table in `docs/storage-format.md`): magic
//! `SMQCKPT1`, commitlog durable offset u64, derived durable offset u64, written-at ms i64,
//! CRC32 of the preceding 32 bytes. Written atomically. A missing or corrupt checkpoint means
//! "trust nothing": recovery scans and rebuilds from the oldest segment.

use std::io;
use std::path::Path;

pub const CHECKPOINT_MAGIC: &[u8; 8] = b"SMQCKPT1";
pub const CHECKPOINT_BYTES: usize = 36;
pub const CHECKPOINT_FILE: &str = "checkpoint";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Checkpoint {
    /// Every CommitLog byte below this was durable when the checkpoint was written.
    pub commitlog_durable_offset: u64,
    /// ConsumeQueue and index entries of every record below this were durable.
    pub derived_durable_offset: u64,
    pub written_at_ms: i64,
}

impl Checkpoint {
    pub fn encode(&self) -> [u8; CHECKPOINT_BYTES] {
        let mut out = [0u8; CHECKPOINT_BYTES];
        out[0..8].copy_from_slice(CHECKPOINT_MAGIC);
        out[8..16].copy_from_slice(&self.commitlog_durable_offset.to_be_bytes());
        out[16..24].copy_from_slice(&self.derived_durable_offset.to_be_bytes());
        out[24..32].copy_from_slice(&self.written_at_ms.to_be_bytes());
        let crc = crc32fast::hash(&out[..32]);
        out[32..36].copy_from_slice(&crc.to_be_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Checkpoint, String> {
        if bytes.len() != CHECKPOINT_BYTES {
            return Err(format!(
                "checkpoint is {} bytes, expected {CHECKPOINT_BYTES}",
                bytes.len()
            ));
        }
        if &bytes[0..8] != CHECKPOINT_MAGIC {
            return Err("checkpoint magic is wrong".into());
        }
        let stored = u32::from_be_bytes(bytes[32..36].try_into().expect("4 bytes"));
        let computed = crc32fast::hash(&bytes[..32]);
        if stored != computed {
            return Err(format!(
                "checkpoint CRC mismatch: stored {stored:#010x}, computed {computed:#010x}"
            ));
        }
        let checkpoint = Checkpoint {
            commitlog_durable_offset: u64::from_be_bytes(bytes[8..16].try_into().expect("8 bytes")),
            derived_durable_offset: u64::from_be_bytes(bytes[16..24].try_into().expect("8 bytes")),
            written_at_ms: i64::from_be_bytes(bytes[24..32].try_into().expect("8 bytes")),
        };
        if checkpoint.derived_durable_offset > checkpoint.commitlog_durable_offset {
            return Err("checkpoint says derived data is ahead of the CommitLog".into());
        }
        Ok(checkpoint)
    }

    /// Reads the checkpoint in `shard_dir`: `Ok(None)` when absent, `Err` with the reason when
    /// unreadable or corrupt.
    pub fn load(shard_dir: &Path) -> io::Result<Result<Option<Checkpoint>, String>> {
        match std::fs::read(shard_dir.join(CHECKPOINT_FILE)) {
            Ok(bytes) => Ok(Checkpoint::decode(&bytes).map(Some)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Ok(None)),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corruption() {
        let checkpoint = Checkpoint {
            commitlog_durable_offset: 1 << 40,
            derived_durable_offset: 12345,
            written_at_ms: 1_700_000_000_000,
        };
        let mut bytes = checkpoint.encode();
        assert_eq!(Checkpoint::decode(&bytes), Ok(checkpoint));
        bytes[10] ^= 0x40;
        assert!(Checkpoint::decode(&bytes).unwrap_err().contains("CRC"));
    }
}
