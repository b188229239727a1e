//! The shard's format file: the on-disk format version and the settings that the files' layout
//! depends on, fixed when the shard is created.
//!
//! Owns `<shard>/format`, a small text file (`version=3`, `segment_bytes=N`) written atomically
//! once. A store opened later with another configured segment size keeps the recorded one, since
//! segment names and blank fillers depend on it.

use std::io;
use std::path::Path;

use super::atomic_file::write_atomically;

pub const FORMAT_FILE: &str = "format";
/// Version 3: the record CRC is the CRC of the fields the storage shard fills (queue id, queue
/// offset, physical offset, store timestamp, store host) XOR the CRC of the rest but the body,
/// which the body CRC covers (version 2 hashed the body in the record CRC too, and left the
/// queue id and store host to the producer part; version 1 hashed the record in one pass). An
/// older store is refused rather than misread as damaged.
pub const FORMAT_VERSION: u32 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreFormat {
    pub version: u32,
    pub segment_bytes: u64,
}

impl StoreFormat {
    pub fn encode(&self) -> String {
        format!(
            "version={}\nsegment_bytes={}\n",
            self.version, self.segment_bytes
        )
    }

    pub fn decode(text: &str) -> Result<StoreFormat, String> {
        let mut version = None;
        let mut segment_bytes = None;
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let (key, value) = line
                .split_once('=')
                .ok_or_else(|| format!("format line `{line}` is not key=value"))?;
            match key {
                "version" => version = value.parse::<u32>().ok(),
                "segment_bytes" => segment_bytes = value.parse::<u64>().ok(),
                _ => {}
            }
        }
        let format = StoreFormat {
            version: version.ok_or("format file lacks a valid `version`")?,
            segment_bytes: segment_bytes.ok_or("format file lacks a valid `segment_bytes`")?,
        };
        if format.version != FORMAT_VERSION {
            return Err(format!(
                "store format version {} is not supported (this build reads version {FORMAT_VERSION})",
                format.version
            ));
        }
        Ok(format)
    }

    /// `Ok(None)` when the file does not exist.
    pub fn load(shard_dir: &Path) -> io::Result<Option<StoreFormat>> {
        match std::fs::read_to_string(shard_dir.join(FORMAT_FILE)) {
            Ok(text) => StoreFormat::decode(&text)
                .map(Some)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn save(&self, shard_dir: &Path) -> io::Result<()> {
        write_atomically(&shard_dir.join(FORMAT_FILE), self.encode().as_bytes())
    }
}
