//! Reliability suite, full disk: the real broker with its data directory on a small tmpfs (a
//! real mount, so the full disk is the kernel's; the tests run as root, as CI does).
//!
//! What must hold: once the disk fills, sends are refused with DISK_FULL and a message that
//! says why; every message acknowledged before is still served intact (CRCs checked); after
//! space returns, sends succeed again without a restart, and the directory verifies clean.
//! Needs the binaries: `cargo build --workspace --bins`.

mod reliability_support;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use reliability_support::{assert_verify_clean, create_topic, pull_whole_queue, status};
use shardmq_schema::wire;
use shardmq_tests::{send_request_body, status_of, wait_until, BrokerProcess, TestMessage};

/// A tmpfs mounted for the life of the value.
struct SmallDisk {
    _holder: tempfile::TempDir,
    mount_point: PathBuf,
}

impl SmallDisk {
    fn mount(size: &str) -> SmallDisk {
        let holder = tempfile::tempdir().expect("a temp dir");
        let mount_point = holder.path().join("disk");
        std::fs::create_dir(&mount_point).expect("create the mount point");
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

/// Free bytes of the file system holding `dir` (as `df` reports them).
fn free_bytes(dir: &Path) -> u64 {
    let output = Command::new("df")
        .args(["-B1", "--output=avail"])
        .arg(dir)
        .output()
        .expect("run df");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .nth(1)
        .and_then(|line| line.trim().parse().ok())
        .expect("df prints the free bytes")
}

const TOPIC: &str = "Full";

/// Body of the `index`th message: unique, 4 KiB.
fn body(index: usize) -> Vec<u8> {
    let mut body = format!("disk-full-{index}|").into_bytes();
    body.resize(4096, b'x');
    body
}

#[test]
fn a_full_disk_refuses_sends_with_disk_full_keeps_what_was_acknowledged_and_recovers_with_space() {
    let disk = SmallDisk::mount("16m");
    let data_dir = disk.mount_point.join("data");
    let mut broker = BrokerProcess::start(
        &data_dir,
        &[
            "--flush",
            "sync",
            "--sync-flush-timeout-ms",
            "300",
            "--segment-bytes",
            "4194304",
            "--max-message-bytes",
            "65536",
            // Retention must not delete data to make room.
            "--disk-max-used-ratio",
            "1.0",
        ],
    );
    let mut client = broker.client();
    create_topic(&mut client, TOPIC, 1);

    // Leave about 1 MiB: room for a couple of hundred messages, then the disk is full.
    let filler = disk.mount_point.join("filler");
    let filler_bytes = free_bytes(&disk.mount_point).saturating_sub(1 << 20);
    std::fs::write(&filler, vec![0x5a; usize::try_from(filler_bytes).unwrap()])
        .expect("write the filler");

    let mut acknowledged: Vec<(u64, usize)> = Vec::new();
    let mut in_doubt: Vec<usize> = Vec::new();
    let mut refusal = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    for index in 0.. {
        assert!(
            Instant::now() < deadline,
            "sends were still accepted after {} messages on a full disk",
            acknowledged.len()
        );
        let response = client
            .request(|builder| {
                send_request_body(builder, TOPIC, 0, &[TestMessage::new(body(index))])
            })
            .expect("an answer to a send on a filling disk");
        match status(&response) {
            wire::Status::OK => {
                let offset = response
                    .frame()
                    .body_as_send_response()
                    .and_then(|body| body.results())
                    .expect("SendResponse.results")
                    .get(0)
                    .queue_offset();
                acknowledged.push((u64::try_from(offset).unwrap(), index));
            }
            // Stored, durability unconfirmed: may or may not be served later.
            wire::Status::FLUSH_DISK_TIMEOUT => in_doubt.push(index),
            wire::Status::DISK_FULL => {
                refusal = status_of(&response).1;
                break;
            }
            other => panic!(
                "a send on a filling disk answered {other:?} ({:?}), not OK, FLUSH_DISK_TIMEOUT or DISK_FULL",
                status_of(&response).1
            ),
        }
    }
    let refusal = refusal.unwrap_or_default();
    assert!(
        ["disk", "space"]
            .iter()
            .any(|word| refusal.to_lowercase().contains(word)),
        "the DISK_FULL answer does not say what is wrong: {refusal:?}"
    );
    assert!(
        acknowledged.len() >= 10,
        "only {} sends were acknowledged before the disk filled",
        acknowledged.len()
    );
    eprintln!(
        "disk full after {} acknowledged sends ({} in doubt): {refusal}",
        acknowledged.len(),
        in_doubt.len()
    );

    // Everything acknowledged is served, intact.
    let stored = pull_whole_queue(&mut client, TOPIC, 0);
    for &(offset, index) in &acknowledged {
        let record = stored.get(usize::try_from(offset).unwrap());
        assert!(
            record.is_some_and(|record| record.body == body(index)),
            "message {offset}, acknowledged before the disk filled, is not served intact while it is full"
        );
    }

    // Space returns: sends succeed again, without a restart.
    std::fs::remove_file(&filler).expect("remove the filler");
    let mut next = 1_000_000;
    let resumed_at = wait_until(
        Duration::from_secs(20),
        "a send to succeed after space returned",
        || {
            next += 1;
            let response = client
                .request(|builder| {
                    send_request_body(builder, TOPIC, 0, &[TestMessage::new(body(next))])
                })
                .expect("an answer to a send after space returned");
            match status(&response) {
                wire::Status::OK => Some(
                    response
                        .frame()
                        .body_as_send_response()
                        .and_then(|body| body.results())
                        .expect("SendResponse.results")
                        .get(0)
                        .queue_offset(),
                ),
                wire::Status::FLUSH_DISK_TIMEOUT => {
                    in_doubt.push(next);
                    None
                }
                _ => None,
            }
        },
    );
    acknowledged.push((u64::try_from(resumed_at).unwrap(), next));

    // The queue holds every acknowledged message at its place, and otherwise only messages
    // that were sent, each once.
    let stored = pull_whole_queue(&mut client, TOPIC, 0);
    for &(offset, index) in &acknowledged {
        assert!(
            stored
                .get(usize::try_from(offset).unwrap())
                .is_some_and(|record| record.body == body(index)),
            "message {offset} is not served intact after the disk had room again"
        );
    }
    let sent: HashSet<Vec<u8>> = acknowledged
        .iter()
        .map(|&(_, index)| index)
        .chain(in_doubt.iter().copied())
        .map(body)
        .collect();
    let mut seen = HashSet::new();
    for record in &stored {
        assert!(
            sent.contains(&record.body) && seen.insert(record.body.clone()),
            "after the disk was full, offset {} holds a message that was refused or is there twice",
            record.queue_offset
        );
    }
    drop(client);
    broker.stop();
    assert_verify_clean(&data_dir, "after the disk was full and had room again");
}
