//! The operator commands of `shardmq` against a real namesrv and broker: `broker status`,
//! `group list`, `group progress` without a topic, `group reset-offset` (and its refusal while
//! the group has live members), and the `message query-key` alias.
//!
//! Needs the binaries: `cargo build --workspace --bins` first.

use std::process::Output;

use serde_json::Value;
use shardmq_tests::{wait_until, LocalCluster, ROUTE_TIMEOUT};
use tempfile::TempDir;

fn shardmq(namesrv: &str, args: &[&str]) -> Output {
    shardmq_tests::run_cli(namesrv, args)
}

fn json_of(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "shardmq failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout.clone()).expect("UTF-8 output");
    serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {text}"))
}

fn total_lag(namesrv: &str, group: &str) -> i64 {
    json_of(&shardmq(namesrv, &["--json", "group", "progress", group]))["total_lag"]
        .as_i64()
        .expect("total_lag")
}

#[test]
fn operators_see_status_groups_and_lag_and_can_reset_offsets() {
    const TOPIC: &str = "AdminTopic";
    const GROUP: &str = "AdminGroup";
    let data = TempDir::new().unwrap();
    let cluster = LocalCluster::start(data.path());
    let namesrv = cluster.namesrv_addr();
    let broker = cluster.broker_addr();
    cluster.create_topic(TOPIC, 2);

    let sent = shardmq(
        &namesrv,
        &[
            "send", TOPIC, "--body", "admin", "--keys", "order-7", "--count", "10",
        ],
    );
    assert!(sent.status.success(), "{sent:?}");
    let consumed = shardmq(
        &namesrv,
        &[
            "--json",
            "consume",
            TOPIC,
            "--group",
            GROUP,
            "--count",
            "10",
            "--timeout-ms",
            "10000",
        ],
    );
    assert!(consumed.status.success(), "{consumed:?}");
    let sent = shardmq(
        &namesrv,
        &[
            "send", TOPIC, "--body", "later", "--keys", "order-7", "--count", "6",
        ],
    );
    assert!(sent.status.success(), "{sent:?}");

    // The group is known by its committed offsets; the 6 later messages are still to consume.
    let groups = json_of(&shardmq(&namesrv, &["--json", "group", "list"]));
    let group = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["group"] == GROUP)
        .unwrap_or_else(|| panic!("{GROUP} missing from {groups}"));
    assert_eq!(group["lag"], 6, "{groups}");
    assert_eq!(
        group["members"], 0,
        "the consume command has exited: {groups}"
    );
    assert_eq!(total_lag(&namesrv, GROUP), 6);

    // Reset to the first message: everything is to consume again; to the last: nothing.
    let reset = json_of(&shardmq(
        &namesrv,
        &[
            "--json",
            "group",
            "reset-offset",
            GROUP,
            "--topic",
            TOPIC,
            "--to",
            "first",
        ],
    ));
    assert_eq!(reset["queues"].as_array().unwrap().len(), 2, "{reset}");
    assert_eq!(total_lag(&namesrv, GROUP), 16);
    json_of(&shardmq(
        &namesrv,
        &[
            "--json",
            "group",
            "reset-offset",
            GROUP,
            "--topic",
            TOPIC,
            "--to",
            "last",
        ],
    ));
    assert_eq!(total_lag(&namesrv, GROUP), 0);
    // A time before every message is the first message again.
    json_of(&shardmq(
        &namesrv,
        &[
            "--json",
            "group",
            "reset-offset",
            GROUP,
            "--topic",
            TOPIC,
            "--to",
            "2000-01-01T00:00:00Z",
        ],
    ));
    assert_eq!(total_lag(&namesrv, GROUP), 16);

    // Status: the 16 sends and 10+ pulled messages are counted; rates are reported.
    let status = json_of(&shardmq(
        &namesrv,
        &[
            "--json",
            "broker",
            "status",
            &broker,
            "--interval-ms",
            "200",
        ],
    ));
    assert_eq!(status["messages_in"], 16, "{status}");
    assert!(status["messages_out"].as_u64().unwrap() >= 10, "{status}");
    assert_eq!(status["storage_shards"], 1, "{status}");
    assert!(
        status["placement"].as_str().unwrap().contains("storage-0"),
        "{status}"
    );
    assert!(status["in_tps"].is_number(), "{status}");
    assert!(status["disk_free_bytes"].as_u64().unwrap() > 0, "{status}");
    let text = shardmq(
        &namesrv,
        &["broker", "status", &broker, "--interval-ms", "0"],
    );
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(
        text.contains("storage-0") && text.contains("connections"),
        "{text}"
    );

    // The mqadmin-style alias finds the messages by key.
    let found = shardmq(&namesrv, &["message", "query-key", TOPIC, "order-7"]);
    assert!(found.status.success(), "{found:?}");
    assert_eq!(
        String::from_utf8_lossy(&found.stdout)
            .matches("order-7")
            .count(),
        16,
        "every message with the key is printed once"
    );
}

#[test]
fn reset_offset_is_refused_while_the_group_has_live_members() {
    const TOPIC: &str = "Busy";
    const GROUP: &str = "BusyGroup";
    let data = TempDir::new().unwrap();
    let cluster = LocalCluster::start(data.path());
    let namesrv = cluster.namesrv_addr();
    cluster.create_topic(TOPIC, 1);
    // A push consumer (it heartbeats with its group) stays a member while the reset is tried.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let member = runtime.block_on(async {
        shardmq_client::PushConsumer::builder()
            .namesrv(namesrv.clone())
            .group(GROUP)
            .subscribe(TOPIC, "*")
            .listen_concurrently(|_messages| async { shardmq_client::ConsumeResult::Success })
            .start()
            .await
            .expect("start a push consumer")
    });
    wait_until(ROUTE_TIMEOUT, "the consumer to join its group", || {
        let output = shardmq(
            &namesrv,
            &["--json", "group", "members", GROUP, "--topic", TOPIC],
        );
        let members = json_of(&output);
        (!members["members"].as_array()?.is_empty()).then_some(())
    });
    let refused = shardmq(
        &namesrv,
        &[
            "group",
            "reset-offset",
            GROUP,
            "--topic",
            TOPIC,
            "--to",
            "first",
        ],
    );
    assert!(
        !refused.status.success(),
        "a reset under a live consumer succeeded"
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("live member") && stderr.contains("stop its consumers"),
        "the refusal does not say why: {stderr}"
    );
    let forced = shardmq(
        &namesrv,
        &[
            "group",
            "reset-offset",
            GROUP,
            "--topic",
            TOPIC,
            "--to",
            "first",
            "--force",
        ],
    );
    assert!(forced.status.success(), "{forced:?}");
    runtime.block_on(member.shutdown());
}

#[test]
fn messages_are_found_by_either_id_without_naming_the_topic() {
    const TOPIC: &str = "Findable";
    let data = TempDir::new().unwrap();
    let cluster = LocalCluster::start(data.path());
    let namesrv = cluster.namesrv_addr();
    cluster.create_topic(TOPIC, 1);
    let sent = json_of(&shardmq(
        &namesrv,
        &[
            "--json", "message", "send", TOPIC, "--body", "find me", "--keys", "k-9",
        ],
    ));
    let msg_id = sent["msg_id"].as_str().expect("msg_id").to_owned();
    let offset_id = sent["offset_msg_id"]
        .as_str()
        .expect("offset_msg_id")
        .to_owned();
    for id in [&msg_id, &offset_id] {
        let found = json_of(&shardmq(&namesrv, &["--json", "message", "query-id", id]));
        assert_eq!(found["topic"], TOPIC, "query-id {id}: {found}");
        assert_eq!(found["body"], "find me", "query-id {id}: {found}");
    }
    // `message consume` is the top-level `consume` under the mqadmin-style name.
    let consumed = shardmq(
        &namesrv,
        &[
            "message",
            "consume",
            TOPIC,
            "--group",
            "finders",
            "--count",
            "1",
            "--timeout-ms",
            "10000",
        ],
    );
    assert!(
        String::from_utf8_lossy(&consumed.stdout).contains("find me"),
        "{consumed:?}"
    );
    // A time range that ends before the message was stored finds nothing.
    let none = shardmq(
        &namesrv,
        &[
            "message",
            "query-id",
            &msg_id,
            "--end",
            "2000-01-01T00:00:00Z",
        ],
    );
    assert!(
        !none.status.success(),
        "a range before the message found it"
    );
    let missing = shardmq(
        &namesrv,
        &["message", "query-id", "0123456789ABCDEF0123456789ABCDEF"],
    );
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("no broker holds"),
        "{missing:?}"
    );
    // The topic may also be given positionally to reset-offset, and --to-time is accepted.
    let reset = json_of(&shardmq(
        &namesrv,
        &[
            "--json",
            "group",
            "reset-offset",
            "finders",
            TOPIC,
            "--to-time",
            "2000-01-01T00:00:00Z",
        ],
    ));
    assert_eq!(reset["queues"][0]["offset"], 0, "{reset}");
}

#[test]
fn cluster_wide_commands_answer_from_live_brokers_and_name_a_dead_one() {
    const TOPIC: &str = "Split";
    const GROUP: &str = "SplitGroup";
    let data_a = TempDir::new().unwrap();
    let data_b = TempDir::new().unwrap();
    let cluster = LocalCluster::start(data_a.path());
    let namesrv = cluster.namesrv_addr();
    let broker_b = shardmq_tests::BrokerProcess::start(
        data_b.path(),
        &["--namesrv", &namesrv, "--broker-name", "broker-b"],
    );
    let dead = broker_b.addr().to_string();
    wait_until(ROUTE_TIMEOUT, "both brokers registered", || {
        let clusters = json_of(&shardmq(&namesrv, &["--json", "cluster", "list"]));
        clusters.to_string().contains(&dead).then_some(())
    });
    let created = json_of(&shardmq(
        &namesrv,
        &["--json", "topic", "create", TOPIC, "--queues", "2"],
    ));
    assert_eq!(
        created["brokers"].as_array().map(Vec::len),
        Some(2),
        "{created}"
    );
    wait_until(ROUTE_TIMEOUT, "the topic routed to both", || {
        let route = shardmq(&namesrv, &["--json", "topic", "route", TOPIC]);
        let text = String::from_utf8_lossy(&route.stdout).into_owned();
        (route.status.success() && text.contains("broker-a") && text.contains("broker-b"))
            .then_some(())
    });
    // One message on broker-a's queues, found later by its id.
    let mut on_a = None;
    for _ in 0..20 {
        let sent = json_of(&shardmq(
            &namesrv,
            &["--json", "send", TOPIC, "--body", "kept"],
        ));
        if sent["broker_name"] == "broker-a" {
            on_a = Some(sent["msg_id"].as_str().expect("msg_id").to_owned());
            break;
        }
    }
    let on_a = on_a.expect("a send landed on broker-a");
    let consumed = shardmq(
        &namesrv,
        &[
            "consume",
            TOPIC,
            "--group",
            GROUP,
            "--count",
            "1",
            "--timeout-ms",
            "10000",
        ],
    );
    assert!(consumed.status.success(), "{consumed:?}");

    // Paused (alive to TCP, answering nothing): the name server still routes to broker-b until
    // its registration expires (a killed broker would leave the routes at once, its
    // registration connection closed).
    shardmq_tests::signal(broker_b.pid(), "STOP");
    let partial = |args: &[&str]| {
        let output = shardmq(&namesrv, args);
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(
            output.status.code(),
            Some(3),
            "`shardmq {}` with a dead broker: {output:?}",
            args.join(" ")
        );
        assert!(
            stderr.contains(&dead) && stderr.contains("did not answer"),
            "`shardmq {}` does not name the dead broker: {stderr}",
            args.join(" ")
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let groups = partial(&["group", "list"]);
    assert!(groups.contains(GROUP), "{groups}");
    let progress = partial(&["group", "progress", GROUP, "--topic", TOPIC]);
    assert!(progress.contains("broker-a"), "{progress}");
    let found = partial(&["message", "query-id", &on_a]);
    assert!(found.contains("body=kept"), "{found}");
    let created = partial(&["topic", "create", "AfterDeath", "--queues", "2"]);
    assert!(
        created.contains("created topic") && created.contains(&cluster.broker_addr()),
        "{created}"
    );
}

#[test]
fn misspelt_names_and_system_topics_get_clear_answers() {
    const TOPIC: &str = "Plain";
    let data = TempDir::new().unwrap();
    let cluster = LocalCluster::start(data.path());
    let namesrv = cluster.namesrv_addr();
    cluster.create_topic(TOPIC, 2);

    // A reset of a group that has never committed on the topic would create it.
    let refused = shardmq(
        &namesrv,
        &[
            "group",
            "reset-offset",
            "NoSuchGroup",
            TOPIC,
            "--to",
            "first",
        ],
    );
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("no committed offset") && stderr.contains("NoSuchGroup"),
        "{stderr}"
    );
    let forced = json_of(&shardmq(
        &namesrv,
        &[
            "--json",
            "group",
            "reset-offset",
            "NewGroup",
            TOPIC,
            "--to",
            "last",
            "--force",
        ],
    ));
    assert_eq!(
        forced["queues"].as_array().map(Vec::len),
        Some(2),
        "{forced}"
    );
    // Once it has offsets, it is reset without forcing.
    let again = shardmq(
        &namesrv,
        &["group", "reset-offset", "NewGroup", TOPIC, "--to", "first"],
    );
    assert!(again.status.success(), "{again:?}");

    // The broker's own topics (schedule, transaction) are routed; `topic list` hides them.
    let with_system = |system: bool| -> Vec<String> {
        let mut args = vec!["--json", "topic", "list"];
        if system {
            args.push("--system");
        }
        json_of(&shardmq(&namesrv, &args))["topics"]
            .as_array()
            .expect("topics")
            .iter()
            .map(|t| t.as_str().unwrap().to_owned())
            .collect()
    };
    wait_until(ROUTE_TIMEOUT, "a system topic routed", || {
        with_system(true)
            .iter()
            .any(|t| shardmq_client::system_topics::is_system_topic(t))
            .then_some(())
    });
    let user = with_system(false);
    assert!(user.contains(&TOPIC.to_owned()), "{user:?}");
    assert!(
        !user
            .iter()
            .any(|t| shardmq_client::system_topics::is_system_topic(t)),
        "system topics listed without --system: {user:?}"
    );

    // Deleting a topic that does not exist says so, without suggesting to create it.
    let missing = shardmq(&namesrv, &["topic", "delete", "NoSuchTopic"]);
    assert_eq!(missing.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(
        stderr.contains("does not exist") && !stderr.contains("create it"),
        "{stderr}"
    );

    // The names the README uses are in the help.
    let help = shardmq(&namesrv, &["message", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("query-key") && help.contains("query-id"),
        "{help}"
    );
}
