//! The data directory a scenario writes into.
//!
//! A benchmark must start from an empty store, or recovery of old data and a half-full segment
//! skew what it measures. So the directory must be missing (it is created) or empty; a
//! non-empty one is refused unless the user passes `--force`. Even then we delete only what a
//! scenario itself creates there (`shard-0`), never anything else the user keeps in it.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The shard directory scenarios create inside the data directory (`<data>/shard-N`, as the
/// broker lays it out).
pub const SHARD_DIR_NAME: &str = "shard-0";

/// Creates `data_dir` if it is missing and returns the (absent) shard directory inside it.
/// Refuses a non-empty `data_dir` unless `is_forced`; then removes an earlier run's shard
/// directory only.
pub fn prepare(data_dir: &Path, is_forced: bool) -> Result<PathBuf> {
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create data directory {}", data_dir.display()))?;
    let is_empty = std::fs::read_dir(data_dir)
        .with_context(|| format!("cannot list data directory {}", data_dir.display()))?
        .next()
        .is_none();
    let shard_dir = data_dir.join(SHARD_DIR_NAME);
    if !is_empty {
        if !is_forced {
            bail!(
                "data directory {} is not empty; give an empty or missing directory, or pass \
                 --force to delete {SHARD_DIR_NAME}/ in it and run anyway",
                data_dir.display()
            );
        }
        if shard_dir.exists() {
            std::fs::remove_dir_all(&shard_dir).with_context(|| {
                format!("cannot remove the earlier run's {}", shard_dir.display())
            })?;
        }
    }
    Ok(shard_dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_a_missing_directory() {
        let root = tempfile::tempdir().unwrap();
        let data = root.path().join("a/b");
        let shard = prepare(&data, false).unwrap();
        assert!(data.is_dir());
        assert_eq!(shard, data.join(SHARD_DIR_NAME));
    }

    #[test]
    fn refuses_a_non_empty_directory_unless_forced() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("keep.txt"), b"mine").unwrap();
        std::fs::create_dir(root.path().join(SHARD_DIR_NAME)).unwrap();
        let error = prepare(root.path(), false).unwrap_err();
        assert!(error.to_string().contains("not empty"), "{error}");

        prepare(root.path(), true).unwrap();
        assert!(!root.path().join(SHARD_DIR_NAME).exists());
        assert!(
            root.path().join("keep.txt").exists(),
            "--force deletes only the shard directory"
        );
    }
}
