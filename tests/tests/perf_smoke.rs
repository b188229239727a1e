//! Smoke runs of `shardmq-perf`'s network scenarios against a real namesrv and broker: each
//! runs the built binary with tiny counts and `--json`, and checks only correctness (message
//! counts, nothing lost, no duplicates, the JSON keys, the report files). Timings are never
//! asserted: benchmarks are programs, not assertions.
//!
//! Needs the binaries: `cargo build --workspace --bins` first.

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use shardmq_tests::{binary_path, LocalCluster};
use tempfile::TempDir;

/// Keys the `--json` line of every network scenario has.
const REQUIRED_KEYS: [&str; 12] = [
    "scenario",
    "messages",
    "msgs_per_sec",
    "mb_per_sec",
    "p50_us",
    "p90_us",
    "p99_us",
    "p999_us",
    "p9999_us",
    "max_us",
    "lost",
    "duplicates",
];

/// Runs `shardmq-perf` with `args` against `cluster`; returns its last stdout line as JSON
/// after checking that it exited successfully and has every required key.
fn perf(cluster: &LocalCluster, args: &[&str]) -> Value {
    let namesrv = cluster.namesrv_addr();
    let output = Command::new(binary_path("shardmq-perf"))
        .args(args)
        .args(["--namesrv", &namesrv, "--json", "--quiet"])
        .output()
        .expect("shardmq-perf runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "shardmq-perf {args:?} exited with {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    let last_line = stdout.lines().last().unwrap_or_default();
    let result: Value = serde_json::from_str(last_line).unwrap_or_else(|error| {
        panic!("the last stdout line is not JSON ({error}):\n{stdout}\nstderr:\n{stderr}")
    });
    for key in REQUIRED_KEYS {
        assert!(result.get(key).is_some(), "key {key} missing from {result}");
    }
    result
}

fn started_cluster(data: &TempDir) -> LocalCluster {
    let cluster = LocalCluster::start(data.path());
    cluster.create_topic("PerfSmoke", 4);
    cluster
}

fn number(result: &Value, key: &str) -> u64 {
    result[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not a count in {result}"))
}

fn assert_report(directory: &Path, scenario: &str) {
    let json_path = directory.join(format!("{scenario}.json"));
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).expect("the report's JSON file"))
            .expect("the report is JSON");
    assert_eq!(report["scenario"], scenario);
    assert!(report["latency_curves"]
        .as_array()
        .is_some_and(|curves| !curves.is_empty()));
    assert!(report["throughput_over_time"].is_array());
    let svg = std::fs::read_to_string(directory.join(format!("{scenario}.svg")))
        .expect("the report's SVG file");
    assert!(svg.starts_with("<svg ") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("Latency by percentile") && svg.contains("Throughput over time"));
}

#[test]
fn produce_sends_every_message_and_finds_each_once() {
    let data = TempDir::new().expect("temp dir");
    let cluster = started_cluster(&data);
    let reports = TempDir::new().expect("temp dir");
    let report_dir = reports.path().to_str().expect("UTF-8 path");
    for batch in ["1", "8"] {
        let result = perf(
            &cluster,
            &[
                "produce",
                "--topic",
                "PerfSmoke",
                "--messages",
                "203",
                "--producers",
                "3",
                "--batch",
                batch,
                "--size",
                "256",
                "--verify",
                "--report",
                report_dir,
            ],
        );
        assert_eq!(result["scenario"], "produce");
        assert_eq!(number(&result, "messages"), 203, "{result}");
        assert_eq!(number(&result, "failed"), 0, "{result}");
        assert_eq!(number(&result, "lost"), 0, "{result}");
        assert_eq!(number(&result, "duplicates"), 0, "{result}");
        assert_eq!(
            result["broker_flush"], "async",
            "the flush mode is asked from the broker: {result}"
        );
        assert_report(reports.path(), "produce");
    }
}

#[test]
fn produce_at_a_fixed_rate_sends_every_message() {
    let data = TempDir::new().expect("temp dir");
    let cluster = started_cluster(&data);
    let result = perf(
        &cluster,
        &[
            "produce",
            "--topic",
            "PerfSmoke",
            "--messages",
            "40",
            "--producers",
            "2",
            "--rate",
            "400",
            "--verify",
        ],
    );
    assert_eq!(number(&result, "messages"), 40, "{result}");
    assert_eq!(number(&result, "lost"), 0, "{result}");
    assert_eq!(number(&result, "duplicates"), 0, "{result}");
}

#[test]
fn a_rate_the_producers_cannot_reach_is_reported_as_missed() {
    let data = TempDir::new().expect("temp dir");
    let cluster = started_cluster(&data);
    // One producer sending one message per call cannot reach 10 million a second.
    let result = perf(
        &cluster,
        &[
            "produce",
            "--topic",
            "PerfSmoke",
            "--messages",
            "200",
            "--producers",
            "1",
            "--rate",
            "10000000",
        ],
    );
    assert_eq!(result["rate_missed"], true, "{result}");
    assert!(
        result["achieved_rate"]
            .as_f64()
            .is_some_and(|r| r < 10_000_000.0),
        "{result}"
    );
}

#[test]
fn consume_drains_a_backlog_with_a_group_and_loses_nothing() {
    let data = TempDir::new().expect("temp dir");
    let cluster = started_cluster(&data);
    let reports = TempDir::new().expect("temp dir");
    let result = perf(
        &cluster,
        &[
            "consume",
            "--topic",
            "PerfSmoke",
            "--backlog",
            "500",
            "--consumers",
            "2",
            "--size",
            "128",
            "--report",
            reports.path().to_str().expect("UTF-8 path"),
        ],
    );
    assert_eq!(result["scenario"], "consume");
    assert_eq!(number(&result, "messages"), 500, "{result}");
    assert_eq!(number(&result, "lost"), 0, "{result}");
    assert_eq!(number(&result, "duplicates"), 0, "{result}");
    assert_report(reports.path(), "consume");
}

#[test]
fn consume_through_a_sql92_filter_receives_exactly_the_matching_share() {
    let data = TempDir::new().expect("temp dir");
    let cluster = LocalCluster::start_with_broker_args(data.path(), &["--enable-property-filter"]);
    cluster.create_topic("PerfSmoke", 4);
    let result = perf(
        &cluster,
        &[
            "consume",
            "--topic",
            "PerfSmoke",
            "--backlog",
            "1000",
            "--match-percent",
            "10",
            "--fill-producers",
            "1",
            "--size",
            "128",
        ],
    );
    // One fill producer numbers the backlog 0..1000: 10 % match.
    assert_eq!(number(&result, "messages"), 100, "{result}");
    assert_eq!(number(&result, "lost"), 0, "{result}");
    assert_eq!(result["filter"], "perf_pct < 10", "{result}");
}

#[test]
fn a_backlog_run_drains_its_own_backlog_not_what_the_topic_held_before() {
    let data = TempDir::new().expect("temp dir");
    let cluster = started_cluster(&data);
    let earlier = perf(
        &cluster,
        &["produce", "--topic", "PerfSmoke", "--messages", "300"],
    );
    assert_eq!(number(&earlier, "messages"), 300, "{earlier}");
    let result = perf(
        &cluster,
        &[
            "consume",
            "--topic",
            "PerfSmoke",
            "--backlog",
            "200",
            "--consumers",
            "1",
        ],
    );
    assert_eq!(result["target"], 200, "{result}");
    assert_eq!(number(&result, "messages"), 200, "{result}");
    assert_eq!(number(&result, "lost"), 0, "{result}");
    assert_eq!(number(&result, "duplicates"), 0, "{result}");
}

#[test]
fn e2e_delivers_every_acknowledged_message_once() {
    let data = TempDir::new().expect("temp dir");
    let cluster = started_cluster(&data);
    let reports = TempDir::new().expect("temp dir");
    let result = perf(
        &cluster,
        &[
            "e2e",
            "--topic",
            "PerfSmoke",
            "--messages",
            "300",
            "--producers",
            "2",
            "--consumers",
            "2",
            "--batch",
            "4",
            "--report",
            reports.path().to_str().expect("UTF-8 path"),
        ],
    );
    assert_eq!(result["scenario"], "e2e");
    assert_eq!(number(&result, "sent"), 300, "{result}");
    assert_eq!(number(&result, "messages"), 300, "{result}");
    assert_eq!(number(&result, "lost"), 0, "{result}");
    assert_eq!(number(&result, "duplicates"), 0, "{result}");
    for key in ["born_p99_us", "send_p99_us"] {
        assert!(result[key].is_number(), "{key} missing from {result}");
    }
    assert_report(reports.path(), "e2e");
}

#[test]
fn e2e_at_a_fixed_rate_delivers_every_message() {
    let data = TempDir::new().expect("temp dir");
    let cluster = started_cluster(&data);
    let result = perf(
        &cluster,
        &[
            "e2e",
            "--topic",
            "PerfSmoke",
            "--messages",
            "30",
            "--rate",
            "200",
        ],
    );
    assert_eq!(number(&result, "messages"), 30, "{result}");
    assert_eq!(number(&result, "lost"), 0, "{result}");
    assert_eq!(number(&result, "duplicates"), 0, "{result}");
}

#[test]
fn store_appends_every_message() {
    let data = TempDir::new().expect("temp dir");
    let store_dir = data.path().join("store");
    let output = Command::new(binary_path("shardmq-perf"))
        .args(["store", "--data-dir"])
        .arg(&store_dir)
        .args([
            "--messages",
            "300",
            "--batch",
            "4",
            "--producers",
            "2",
            "--json",
        ])
        .output()
        .expect("shardmq-perf runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "shardmq-perf store exited with {}\nstdout:\n{stdout}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let result: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|error| panic!("the last stdout line is not JSON ({error}):\n{stdout}"));
    assert_eq!(result["scenario"], "store");
    assert_eq!(number(&result, "messages"), 300, "{result}");
    for key in ["msgs_per_sec", "p50_us", "p99_us", "max_us"] {
        assert!(result[key].is_number(), "{key} missing from {result}");
    }
    // What it says it appended is on disk: `shardmq-broker verify` (the real binary) finds
    // 300 records and no problem.
    let verify = Command::new(binary_path("shardmq-broker"))
        .args(["verify", "--json", "--data-dir"])
        .arg(&store_dir)
        .output()
        .expect("shardmq-broker verify runs");
    let report = String::from_utf8_lossy(&verify.stdout);
    assert!(verify.status.success(), "verify: {report}");
    let report: Value = serde_json::from_str(report.trim())
        .unwrap_or_else(|error| panic!("verify --json is not one JSON object ({error}): {report}"));
    let records: u64 = report["shards"]
        .as_array()
        .expect("shards")
        .iter()
        .map(|shard| shard["records"].as_u64().expect("records"))
        .sum();
    assert_eq!(records, 300, "{report}");
}
