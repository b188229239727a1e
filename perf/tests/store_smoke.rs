//! Smoke test of the `store` scenario: runs the real `shardmq-perf` binary on a temporary
//! directory, checks the report's shape (never its timings: benchmarks report, they do not
//! assert) and that every message it says it stored is in the store, checked by `verify`.

use std::path::Path;
use std::process::{Command, Output};

fn perf(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shardmq-perf"))
        .args(args)
        .output()
        .expect("shardmq-perf starts")
}

fn store_json(data_dir: &Path, extra: &[&str]) -> serde_json::Value {
    let data_dir = data_dir.to_str().expect("UTF-8 temp path");
    let mut args = vec![
        "store",
        "--data-dir",
        data_dir,
        "--messages",
        "200",
        "--size",
        "1024",
        "--json",
    ];
    args.extend_from_slice(extra);
    let output = perf(&args);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "shardmq-perf failed: {}\nstdout:\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    let last_line = stdout.lines().last().expect("some output");
    serde_json::from_str(last_line).expect("the last line is one JSON object")
}

/// Every appended message is in the data directory, and `verify` finds nothing wrong.
fn check_stored(data_dir: &Path) {
    let verified = shardmq_store::verify::verify_data_dir(data_dir).expect("verify runs");
    assert!(verified.is_clean(), "{:?}", verified.problems);
    let records: u64 = verified.shards.iter().map(|shard| shard.records).sum();
    let entries: u64 = verified
        .shards
        .iter()
        .map(|shard| shard.consume_queue_entries)
        .sum();
    assert_eq!(records, 200, "records in the CommitLog");
    assert_eq!(entries, 200, "ConsumeQueue entries");
}

fn check_report(report: &serde_json::Value, flush: &str, batch: u64, producers: u64) {
    assert_eq!(report["scenario"], "store");
    assert_eq!(report["messages"], 200);
    assert_eq!(report["size"], 1024);
    assert_eq!(report["flush"], flush);
    assert_eq!(report["batch"], batch);
    assert_eq!(report["producers"], producers);
    for field in [
        "msgs_per_sec",
        "mb_per_sec",
        "p50_us",
        "p99_us",
        "p999_us",
        "max_us",
    ] {
        let value = report[field]
            .as_f64()
            .unwrap_or_else(|| panic!("{field} is a number in {report}"));
        assert!(value >= 0.0, "{field} = {value}");
    }
    let percentile = |field: &str| report[field].as_f64().expect("a number");
    assert!(percentile("p50_us") <= percentile("p99_us"));
    assert!(percentile("p99_us") <= percentile("max_us"));
    assert!(percentile("msgs_per_sec") > 0.0, "{report}");
}

#[test]
fn store_scenario_reports_json_in_a_new_directory() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = root.path().join("not-yet-there");
    let report = store_json(&data_dir, &["--flush", "async", "--batch", "7"]);
    check_report(&report, "async", 7, 1);
    assert!(data_dir.join("shard-0").is_dir());
    check_stored(&data_dir);
}

#[test]
fn store_scenario_with_sync_flush_and_producers() {
    let root = tempfile::tempdir().unwrap();
    let report = store_json(
        root.path(),
        &["--flush", "sync", "--producers", "4", "--batch", "3"],
    );
    check_report(&report, "sync", 3, 4);
    check_stored(root.path());
}

#[test]
fn store_scenario_refuses_a_non_empty_directory_unless_forced() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("precious.txt"), b"keep me").unwrap();
    let data_dir = root.path().to_str().unwrap();
    let refused = perf(&["store", "--data-dir", data_dir, "--messages", "10"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("not empty"),
        "the error names the problem"
    );

    let report = store_json(root.path(), &["--force"]);
    check_report(&report, "async", 1, 1);
    assert!(root.path().join("precious.txt").exists());
}
