//! Whole-file replacement that survives a crash at any point: the reader sees either the old
//! content or the new, never a mix.
//!
//! Owns the write-temp, fsync, rename, fsync-directory sequence used for every small file that
//! is rewritten in place (checkpoint, consumer offsets, topic config, data dir meta). It must
//! never be used for append-only data.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Replaces `path` with `contents` atomically (blocking; small files only).
pub fn write_atomically(path: &Path, contents: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let temp = temp_path(path);
    {
        let mut file = File::create(&temp)?;
        file.write_all(contents)?;
        file.sync_all()?;
    }
    fs::rename(&temp, path)?;
    File::open(dir)?.sync_all()
}

/// The same on a glommio executor, run on its blocking thread pool so the shard keeps serving.
pub async fn write_atomically_async(path: PathBuf, contents: Vec<u8>) -> io::Result<()> {
    glommio::executor()
        .spawn_blocking(move || write_atomically(&path, &contents))
        .await
}

fn temp_path(path: &Path) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".tmp");
    path.with_file_name(name)
}
