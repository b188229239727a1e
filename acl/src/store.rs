//! The current model of one accounts file, swapped whole when the file changes.
//!
//! Owns the file's path, the last seen stamp (modification time and length) and the current
//! [`Acl`] behind an `Arc`; readers take the `Arc` and keep a consistent model for as long as
//! they hold it, while a reload replaces it for later readers. Never watches the file by
//! itself: the caller calls [`AclStore::reload_if_changed`] on its own timer (RocketMQ's
//! `FileWatchService` polls every 500 ms). A file that no longer loads leaves the old model in
//! place and the error goes to the caller.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use crate::config::{AclError, AclFormat};
use crate::model::Acl;

/// What identifies a version of the file without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    bytes: u64,
}

#[derive(Debug)]
pub struct AclStore {
    path: PathBuf,
    format: AclFormat,
    current: RwLock<Arc<Acl>>,
    /// The stamp of the last version tried, loaded or not, so that a broken file is reported
    /// once rather than on every poll.
    last_stamp: Mutex<Stamp>,
}

impl AclStore {
    /// Loads the file; its shape is chosen by extension ([`AclFormat::of_path`]).
    pub fn open(path: impl Into<PathBuf>) -> Result<AclStore, AclError> {
        let path = path.into();
        let format = AclFormat::of_path(&path)
            .ok_or_else(|| AclError::UnknownFormat { path: path.clone() })?;
        let stamp = stamp(&path)?;
        let acl = Acl::load(&path)?;
        Ok(AclStore {
            path,
            format,
            current: RwLock::new(Arc::new(acl)),
            last_stamp: Mutex::new(stamp),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn format(&self) -> AclFormat {
        self.format
    }

    /// The model as of the last successful load.
    pub fn current(&self) -> Arc<Acl> {
        Arc::clone(
            &self
                .current
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        )
    }

    /// Reloads when the file's modification time or length has changed since the last try:
    /// `Ok(true)` when a new model is in place, `Ok(false)` when the file is as last seen,
    /// `Err` (old model kept) when the changed file does not load. A change that keeps both
    /// the length and the modification time (a rewrite within the file system's time
    /// granularity) is not seen until the next change.
    pub fn reload_if_changed(&self) -> Result<bool, AclError> {
        let mut last_stamp = self
            .last_stamp
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let stamp = stamp(&self.path)?;
        if stamp == *last_stamp {
            return Ok(false);
        }
        *last_stamp = stamp;
        let acl = Acl::load(&self.path)?;
        *self
            .current
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(acl);
        Ok(true)
    }
}

fn stamp(path: &Path) -> Result<Stamp, AclError> {
    let metadata = std::fs::metadata(path).map_err(|source| AclError::Io {
        path: path.to_owned(),
        source,
    })?;
    Ok(Stamp {
        modified: metadata.modified().ok(),
        bytes: metadata.len(),
    })
}
