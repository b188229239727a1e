//! The `shardmq` command line against a real namesrv and broker: create a topic, send, consume
//! as a group (offsets committed, so a second run continues where the first stopped), text and
//! JSON output, and the errors an operator meets.
//!
//! Needs the binaries: `cargo build --workspace --bins` first.

use std::process::Output;

use serde_json::Value;
use shardmq_tests::LocalCluster;
use tempfile::TempDir;

fn shardmq(namesrv: &str, args: &[&str]) -> Output {
    shardmq_tests::run_cli(namesrv, args)
}

fn stdout_of(output: &Output) -> String {
    assert!(
        output.status.success(),
        "shardmq failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).expect("UTF-8 output")
}

fn json_lines(output: &Output) -> Vec<Value> {
    stdout_of(output)
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
        .collect()
}

#[test]
fn send_and_consume_round_trip() {
    let data = TempDir::new().unwrap();
    let cluster = LocalCluster::start(data.path());
    let namesrv = cluster.namesrv_addr();
    let broker = cluster.broker_addr();

    let created = stdout_of(&shardmq(
        &namesrv,
        &[
            "topic", "create", "CliTopic", "--queues", "2", "--broker", &broker,
        ],
    ));
    assert!(created.contains("created topic CliTopic"), "{created}");
    // The topic is routed once the broker has re-registered.
    shardmq_tests::wait_until(shardmq_tests::ROUTE_TIMEOUT, "the route", || {
        let output = shardmq(&namesrv, &["--json", "topic", "route", "CliTopic"]);
        output.status.success().then_some(())
    });
    let list = json_lines(&shardmq(&namesrv, &["--json", "topic", "list"]));
    assert!(list[0]["topics"]
        .as_array()
        .unwrap()
        .contains(&Value::from("CliTopic")));

    let sent = stdout_of(&shardmq(
        &namesrv,
        &[
            "send",
            "CliTopic",
            "--body",
            "hello cli",
            "--tags",
            "TagA",
            "--keys",
            "k1 k2",
            "--count",
            "3",
        ],
    ));
    let lines: Vec<&str> = sent.lines().collect();
    assert_eq!(lines.len(), 3, "{sent}");
    assert!(lines.iter().all(|line| line.starts_with("SEND_OK msg_id=")));
    let sent_json = json_lines(&shardmq(
        &namesrv,
        &["--json", "send", "CliTopic", "--body", "as json"],
    ));
    assert_eq!(sent_json[0]["status"], "SEND_OK");
    let json_id = sent_json[0]["msg_id"].as_str().unwrap().to_owned();

    // The first run takes two messages and commits past them; the second takes the rest.
    let first = stdout_of(&shardmq(
        &namesrv,
        &[
            "consume",
            "CliTopic",
            "--group",
            "cli-group",
            "--count",
            "2",
        ],
    ));
    // Each one-shot send starts its round-robin at a random queue, so which two come first
    // depends on where they landed; together the two runs see all four, each once.
    let first_lines: Vec<&str> = first.lines().collect();
    assert_eq!(first_lines.len(), 2, "{first}");
    for line in &first_lines {
        assert!(line.contains("queue=CliTopic@broker-a#"), "{line}");
        if !line.contains("body=as json") {
            assert!(line.contains("tags=TagA"), "{line}");
            assert!(line.contains("keys=k1,k2"), "{line}");
            assert!(line.contains("body=hello cli"), "{line}");
        }
    }
    let rest = json_lines(&shardmq(
        &namesrv,
        &[
            "--json",
            "consume",
            "CliTopic",
            "--group",
            "cli-group",
            "--timeout-ms",
            "1000",
        ],
    ));
    assert_eq!(rest.len(), 2, "{rest:?}");
    let json_in_first = first_lines
        .iter()
        .filter(|l| l.contains("body=as json"))
        .count();
    let json_in_rest = rest
        .iter()
        .filter(|m| m["msg_id"] == json_id.as_str())
        .count();
    assert_eq!(json_in_first + json_in_rest, 1, "{first}\n{rest:?}");
    for message in &rest {
        if message["msg_id"] != json_id.as_str() {
            assert_eq!(message["body"], "hello cli", "{message}");
            assert_eq!(message["tags"], "TagA", "{message}");
        }
    }
    let mut offsets: Vec<(u64, i64)> = rest
        .iter()
        .map(|m| {
            (
                m["queue_id"].as_u64().unwrap(),
                m["queue_offset"].as_i64().unwrap(),
            )
        })
        .collect();
    offsets.sort_unstable();
    offsets.dedup();
    assert_eq!(offsets.len(), 2);

    let progress = json_lines(&shardmq(
        &namesrv,
        &[
            "--json",
            "group",
            "progress",
            "cli-group",
            "--topic",
            "CliTopic",
        ],
    ));
    assert_eq!(progress[0]["total_lag"], 0);
    let status = stdout_of(&shardmq(&namesrv, &["topic", "status", "CliTopic"]));
    assert!(status.contains("broker-a"), "{status}");
    let clusters = json_lines(&shardmq(&namesrv, &["--json", "cluster", "list"]));
    assert_eq!(clusters[0]["clusters"][0]["cluster_name"], "DefaultCluster");
    assert_eq!(
        clusters[0]["clusters"][0]["brokers"][0]["addresses"][0]["address"],
        broker.as_str()
    );

    // Another group starting from the last offset sees nothing old.
    let latest = json_lines(&shardmq(
        &namesrv,
        &[
            "--json",
            "consume",
            "CliTopic",
            "--group",
            "late-group",
            "--from",
            "last",
            "--timeout-ms",
            "300",
        ],
    ));
    assert!(latest.is_empty());
    // ... and does see what is sent after it started: keep sending until it prints one.
    let tail = std::process::Command::new(shardmq_tests::binary_path("shardmq"))
        .args([
            "--namesrv",
            &namesrv,
            "--json",
            "consume",
            "CliTopic",
            "--group",
            "late-group-2",
            "--from",
            "last",
            "--count",
            "1",
            "--timeout-ms",
            "20000",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start a tailing consume");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sender = {
        let (namesrv, stop) = (namesrv.clone(), std::sync::Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut sent = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && sent < 100 {
                shardmq(&namesrv, &["send", "CliTopic", "--body", "fresh"]);
                sent += 1;
                // Pacing the sends while the tail starts up.
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        })
    };
    let tailed = tail.wait_with_output().expect("the tailing consume");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    sender.join().unwrap();
    let tailed = json_lines(&tailed);
    assert_eq!(tailed.len(), 1, "{tailed:?}");
    assert_eq!(tailed[0]["body"], "fresh", "{tailed:?}");
}

#[test]
fn operator_errors_are_explained() {
    let data = TempDir::new().unwrap();
    let cluster = LocalCluster::start(data.path());
    let namesrv = cluster.namesrv_addr();

    let missing = shardmq(&namesrv, &["send", "Nowhere", "--body", "x"]);
    assert_eq!(missing.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(stderr.contains("has no route"), "{stderr}");

    // Without --broker, a topic goes to every master broker of the cluster(s).
    let everywhere = stdout_of(&shardmq(
        &namesrv,
        &["topic", "create", "Fresh", "--queues", "2"],
    ));
    assert!(everywhere.contains(&cluster.broker_addr()), "{everywhere}");
    let exists = shardmq(&namesrv, &["topic", "create", "Fresh", "--queues", "2"]);
    assert_eq!(exists.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&exists.stderr);
    assert!(stderr.contains("TOPIC_ALREADY_EXISTS"), "{stderr}");
    let updated = stdout_of(&shardmq(
        &namesrv,
        &["topic", "update", "Fresh", "--queues", "3"],
    ));
    assert!(updated.contains("write_queues=3"), "{updated}");
    let no_cluster = shardmq(
        &namesrv,
        &["topic", "create", "Fresh2", "--cluster", "NoSuchCluster"],
    );
    assert_eq!(no_cluster.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&no_cluster.stderr);
    assert!(
        stderr.contains("cluster NoSuchCluster has no live master"),
        "{stderr}"
    );

    let usage = shardmq(&namesrv, &["consume", "T"]);
    assert_eq!(usage.status.code(), Some(2), "--group is required");

    let bad_name = shardmq(
        &namesrv,
        &[
            "topic",
            "create",
            "bad name",
            "--broker",
            &cluster.broker_addr(),
        ],
    );
    assert_eq!(bad_name.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad_name.stderr).contains("topic name"));

    let unreachable = shardmq("127.0.0.1:1", &["topic", "list"]);
    assert_eq!(unreachable.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&unreachable.stderr);
    assert!(stderr.contains("no name server answered"), "{stderr}");

    for command in [
        vec!["--help"],
        vec!["topic", "--help"],
        vec!["topic", "create", "--help"],
        vec!["send", "--help"],
        vec!["consume", "--help"],
        vec!["group", "progress", "--help"],
    ] {
        let help = shardmq(&namesrv, &command);
        assert!(help.status.success(), "{command:?}");
        assert!(String::from_utf8_lossy(&help.stdout).contains("Usage"));
    }
}

#[test]
fn one_shot_sends_spread_over_the_queues_and_bodies_come_from_files_or_stdin() {
    let data = TempDir::new().unwrap();
    let cluster = LocalCluster::start(data.path());
    let namesrv = cluster.namesrv_addr();

    // Each `shardmq send` is a new producer; they start their round-robin at different queues
    // (12 sends landing on one of 8 queues by chance: 8 / 8^12, about 1 in 10^10).
    cluster.create_topic("Spread", 8);
    let mut queues = std::collections::BTreeSet::new();
    for _ in 0..12 {
        let sent = json_lines(&shardmq(
            &namesrv,
            &["--json", "send", "Spread", "--body", "x"],
        ));
        queues.insert(sent[0]["queue_id"].as_u64().expect("a queue id"));
    }
    assert!(
        queues.len() >= 2,
        "12 one-shot sends all went to queue {queues:?}"
    );

    // A body from a file, larger than one argument may be (128 KiB), and one from stdin.
    cluster.create_topic("Files", 1);
    let text: String = (0..40_000).map(|n| format!("line {n:06}\n")).collect();
    let path = data.path().join("body.txt");
    std::fs::write(&path, &text).unwrap();
    stdout_of(&shardmq(
        &namesrv,
        &["send", "Files", "--body-file", path.to_str().unwrap()],
    ));
    let mut piped = std::process::Command::new(shardmq_tests::binary_path("shardmq"))
        .args(["--namesrv", &namesrv, "send", "Files", "--body-file", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("shardmq runs");
    std::io::Write::write_all(&mut piped.stdin.take().unwrap(), b"from stdin").unwrap();
    stdout_of(&piped.wait_with_output().unwrap());
    let got = json_lines(&shardmq(
        &namesrv,
        &[
            "--json",
            "consume",
            "Files",
            "--group",
            "files-group",
            "--count",
            "2",
        ],
    ));
    let bodies: Vec<&str> = got.iter().map(|m| m["body"].as_str().unwrap()).collect();
    assert_eq!(bodies, [text.as_str(), "from stdin"]);

    // Neither or both is refused before anything is sent.
    let neither = shardmq(&namesrv, &["send", "Files"]);
    assert!(!neither.status.success());
    let missing = shardmq(&namesrv, &["send", "Files", "--body-file", "/no/such/file"]);
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr)
            .contains("cannot read the body from /no/such/file"),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );
}

#[test]
fn a_closed_output_pipe_ends_the_cli_quietly() {
    use std::io::BufRead;
    use std::os::unix::process::ExitStatusExt;
    let data = TempDir::new().unwrap();
    let cluster = LocalCluster::start(data.path());
    let namesrv = cluster.namesrv_addr();
    cluster.create_topic("Piped", 1);
    let body = "b".repeat(200);
    stdout_of(&shardmq(
        &namesrv,
        &["send", "Piped", "--body", &body, "--count", "2000"],
    ));
    // About 500 KB of output, far over a pipe's buffer: the writes after the reader is gone
    // fail (`shardmq consume … | head -1`).
    let mut consume = std::process::Command::new(shardmq_tests::binary_path("shardmq"))
        .args([
            "--namesrv",
            &namesrv,
            "consume",
            "Piped",
            "--group",
            "piped",
            "--count",
            "2000",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("shardmq runs");
    let mut first = String::new();
    std::io::BufReader::new(consume.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.contains("queue=Piped@"), "{first}");
    // The reader is dropped here, closing the pipe.
    let output = consume.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        output.status.success() || output.status.signal() == Some(13),
        "ended by SIGPIPE like other tools, not {}: {stderr}",
        output.status
    );
    assert_ne!(output.status.code(), Some(101));
}

#[test]
fn a_connection_error_names_its_cause_once_and_a_broker_given_as_namesrv_is_named() {
    // A port nothing listens on: bind one, note it, close it.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let output = shardmq(&closed, &["topic", "list"]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(stderr.contains(&closed), "{stderr}");
    assert_eq!(
        stderr.matches("Connection refused").count(),
        1,
        "the cause is repeated: {stderr}"
    );

    // A broker's address given as the name server.
    let data = TempDir::new().unwrap();
    let cluster = LocalCluster::start(data.path());
    let output = shardmq(&cluster.broker_addr(), &["topic", "route", "Anything"]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        stderr.contains("not a name server"),
        "no hint that --namesrv names a broker: {stderr}"
    );
}
