//! A full disk: appends fail with a clear error, nothing stored is harmed, and service resumes
//! when space returns. Uses a real small tmpfs mount (the tests run as root, as CI does; glommio
//! and the kernel support O_DIRECT-style I/O there), so ENOSPC comes from the kernel, not from a
//! simulation.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use shardmq_store::verify::verify_data_dir;
use shardmq_store::{AppendStatus, FlushMode, MessageStore, StoreError};

/// A tmpfs mounted for the life of the value.
struct SmallDisk {
    _holder: tempfile::TempDir,
    mount_point: PathBuf,
}

impl SmallDisk {
    fn mount(size: &str) -> SmallDisk {
        let holder = tempfile::tempdir().unwrap();
        let mount_point = holder.path().join("disk");
        std::fs::create_dir(&mount_point).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&mount_point)
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mounting a {size} tmpfs failed: the disk-full tests need root (CI runs as root)"
        );
        SmallDisk {
            _holder: holder,
            mount_point,
        }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.mount_point)
            .status();
    }
}

/// Fills the disk with a filler file until fewer than `leave` bytes are free.
fn fill_disk(dir: &Path, leave: u64) -> PathBuf {
    let filler = dir.join("filler");
    let free = fs_free_bytes(dir);
    let len = free.saturating_sub(leave);
    std::fs::write(&filler, vec![0x5a; len as usize]).unwrap();
    filler
}

fn fs_free_bytes(dir: &Path) -> u64 {
    let output = Command::new("df")
        .args(["-B1", "--output=avail"])
        .arg(dir)
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .expect("df output")
}

#[test]
fn enospc_refuses_appends_keeps_stored_data_and_recovers_when_space_returns() {
    let disk = SmallDisk::mount("2m");
    let data_dir = disk.mount_point.join("shard-0");
    let mut config = small_config(&data_dir, FlushMode::Sync);
    config.sync_flush_timeout_ms = 300;
    config.disk_refuse_ratio = 1.0; // only the kernel's ENOSPC stops us here
    config.disk_max_used_ratio = 1.0; // and retention must not delete data to make room
    config.checkpoint_interval_ms = 60_000; // no usage checks: the kernel's ENOSPC must stop us
    let mount_point = disk.mount_point.clone();
    run(|| async move {
        let (store, _) = MessageStore::open(config).await.unwrap();
        let filler = fill_disk(&mount_point, 160 << 10);
        let mut acked = Vec::new();
        let mut appended_not_acked = Vec::new();
        let mut refused = None;
        for seq in 0..2000u64 {
            match store
                .append(batch("full", 0, &[plain("full", 0, seq, 1000)]))
                .await
            {
                Ok(outcome) if outcome.status == AppendStatus::Ok => acked.push(seq),
                Ok(_) => appended_not_acked.push(seq), // FLUSH_DISK_TIMEOUT: stored, not yet durable
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
        }
        let error = refused.expect("a 2 MiB disk must fill up");
        assert!(
            matches!(error, StoreError::FlushFailing(_)),
            "clear refusal, got: {error}"
        );
        assert!(
            error.to_string().contains("No space left"),
            "the error names the cause: {error}"
        );
        assert!(!acked.is_empty());

        // Everything acknowledged is still served, intact.
        let bodies = read_all(&store, "full", 0, 0).await;
        assert!(bodies.len() >= acked.len());
        for (i, seq) in acked.iter().enumerate() {
            assert_eq!(
                bodies[i],
                body_for("full", 0, *seq, 1000),
                "acknowledged message {seq} intact"
            );
        }

        // Space returns: the pending flush goes through and appends are accepted again.
        std::fs::remove_file(filler).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let next = acked.len() as u64 + appended_not_acked.len() as u64;
        loop {
            match store
                .append(batch("full", 0, &[plain("full", 0, next, 1000)]))
                .await
            {
                Ok(outcome) if outcome.status == AppendStatus::Ok => break,
                other => {
                    assert!(
                        Instant::now() < deadline,
                        "service did not resume: {other:?}"
                    );
                    glommio::timer::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        let bodies = read_all(&store, "full", 0, 0).await;
        assert_eq!(
            bodies.len() as u64,
            next + 1,
            "every appended message is there, once"
        );
        for (seq, body) in bodies.iter().enumerate() {
            assert_eq!(body, &body_for("full", 0, seq as u64, 1000));
        }
        store.close().await.unwrap();
    });
    let report = verify_data_dir(&data_dir).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

#[test]
fn disk_use_over_the_refuse_ratio_refuses_appends_until_it_drops() {
    let disk = SmallDisk::mount("4m");
    let data_dir = disk.mount_point.join("shard-0");
    let mut config = small_config(&data_dir, FlushMode::Async);
    config.disk_refuse_ratio = 0.5;
    config.disk_max_used_ratio = 1.0;
    let mount_point = disk.mount_point.clone();
    run(|| async move {
        let (store, _) = MessageStore::open(config).await.unwrap();
        store
            .append(batch("ratio", 0, &[plain("ratio", 0, 0, 100)]))
            .await
            .unwrap();
        let filler = fill_disk(&mount_point, 1 << 20); // ~75 % used
        assert!(store.refresh_disk_usage() >= 0.5);
        let refused = store
            .append(batch("ratio", 0, &[plain("ratio", 0, 1, 100)]))
            .await;
        match refused {
            Err(StoreError::DiskFull {
                used_percent,
                limit_percent,
            }) => {
                assert!(used_percent >= 50.0 && limit_percent == 50.0);
            }
            other => panic!("expected DiskFull, got {other:?}"),
        }
        std::fs::remove_file(filler).unwrap();
        store.refresh_disk_usage();
        let outcome = store
            .append(batch("ratio", 0, &[plain("ratio", 0, 1, 100)]))
            .await
            .unwrap();
        assert_eq!(
            outcome.records[0].queue_offset, 1,
            "the refused append left no trace"
        );
        assert_eq!(read_all(&store, "ratio", 0, 0).await.len(), 2);
        store.close().await.unwrap();
    });
}
