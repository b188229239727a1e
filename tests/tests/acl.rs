//! Access control on the broker's native protocol (docs/acl.md) against a real name server and
//! broker: the broker runs with `--acl-file`, clients authenticate in the handshake with the
//! client crate's credentials, and every request is decided by the account's permissions. The
//! accounts file trusts no loopback address, so nothing passes for being local.
//!
//! Needs the binaries: `cargo build --workspace --bins` first.

use std::net::SocketAddr;
use std::time::Duration;

use shardmq_client::{Admin, Credentials, Error, Message, Producer, PullConsumer, TopicConfig};
use shardmq_schema::wire;
use shardmq_tests::{
    eventually, http_get_body, run_cli, status_of, wait_until, BrokerProcess, NamesrvProcess,
};
use tempfile::TempDir;

const ACCOUNTS: &str = r#"
# Nothing is trusted by address: every request needs an account.
trusted_addresses = ["192.0.2.1"]

[[accounts]]
access_key = "admin-key"
secret_key = "admin-secret"
admin = true

[[accounts]]
access_key = "orders-app"
secret_key = "orders-secret"
default_topic_perm = "DENY"
default_group_perm = "SUB"
topic_perms = { orders = "PUB|SUB", audit = "PUB" }

[[accounts]]
access_key = "remote-only"
secret_key = "remote-secret"
admin = true
allowed_addresses = ["10.0.0.*"]
"#;

struct Cluster {
    namesrv: NamesrvProcess,
    broker: BrokerProcess,
    acl_file: std::path::PathBuf,
    _dir: TempDir,
}

impl Cluster {
    fn start() -> Cluster {
        let dir = TempDir::new().expect("temp dir");
        let acl_file = dir.path().join("acl.toml");
        std::fs::write(&acl_file, ACCOUNTS).expect("accounts file written");
        let namesrv = NamesrvProcess::start();
        let namesrv_addr = namesrv.addr().to_string();
        let data = dir.path().join("broker");
        let broker = BrokerProcess::start(
            &data,
            &[
                "--namesrv",
                &namesrv_addr,
                "--acl-file",
                acl_file.to_str().expect("UTF-8 path"),
                "--metrics-listen",
                "127.0.0.1:0",
            ],
        );
        Cluster {
            namesrv,
            broker,
            acl_file,
            _dir: dir,
        }
    }

    fn namesrv_addr(&self) -> String {
        self.namesrv.addr().to_string()
    }

    async fn admin(&self, credentials: Option<Credentials>) -> Admin {
        let builder = Admin::builder().namesrv(self.namesrv_addr());
        let builder = match credentials {
            Some(credentials) => builder.credentials(credentials),
            None => builder,
        };
        builder.build().await.expect("admin client")
    }

    async fn producer(&self, credentials: Option<Credentials>) -> Producer {
        let builder = Producer::builder()
            .namesrv(self.namesrv_addr())
            .group("acl-producer")
            .request_timeout(Duration::from_secs(5));
        let builder = match credentials {
            Some(credentials) => builder.credentials(credentials),
            None => builder,
        };
        builder.build().await.expect("producer")
    }

    async fn consumer(&self, credentials: Option<Credentials>) -> PullConsumer {
        let builder = PullConsumer::builder()
            .namesrv(self.namesrv_addr())
            .group("billing");
        let builder = match credentials {
            Some(credentials) => builder.credentials(credentials),
            None => builder,
        };
        builder.build().await.expect("pull consumer")
    }

    /// Creates `topic` as the admin and waits for its route.
    async fn create_topic(&self, topic: &str) {
        let admin = self.admin(Some(admin())).await;
        admin
            .create_topic(&self.broker.addr().to_string(), &TopicConfig::new(topic, 1))
            .await
            .unwrap_or_else(|error| panic!("the admin creates {topic}: {error}"));
        eventually(Duration::from_secs(20), "the topic's route", || async {
            admin.route(topic).await.is_ok()
        })
        .await;
        admin.shutdown().await;
    }

    fn metrics(&self) -> String {
        let addr: SocketAddr = wait_until(Duration::from_secs(10), "the metrics address", || {
            self.broker.all_log_lines().iter().find_map(|line| {
                let start =
                    line.find("metrics served at http://")? + "metrics served at http://".len();
                let end = line[start..].find("/metrics")? + start;
                line[start..end].parse().ok()
            })
        });
        http_get_body(addr, "/metrics")
    }
}

fn admin() -> Credentials {
    Credentials::new("admin-key", "admin-secret").expect("credentials")
}

fn orders_app() -> Credentials {
    Credentials::new("orders-app", "orders-secret").expect("credentials")
}

/// The status and text of a refused call.
fn refusal<T: std::fmt::Debug>(outcome: Result<T, Error>) -> (Option<wire::Status>, String) {
    let error = outcome.expect_err("the call is refused");
    (error.status(), error.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_is_decided_by_the_accounts_permissions() {
    let cluster = Cluster::start();
    cluster.create_topic("orders").await;
    cluster.create_topic("audit").await;

    // No credentials: refused, and the refusal says why.
    let anonymous = cluster.producer(None).await;
    let (status, text) = refusal(anonymous.send(Message::new("orders", "x")).await);
    assert_eq!(status, Some(wire::Status::ACCESS_DENIED), "{text}");
    assert!(text.contains("no access key given"), "{text}");
    anonymous.shutdown().await;

    // The right account: PUB on both topics, SUB on orders only.
    let producer = cluster.producer(Some(orders_app())).await;
    producer
        .send(Message::new("orders", "an order"))
        .await
        .expect("orders-app may publish to orders");
    producer
        .send(Message::new("audit", "an audit record"))
        .await
        .expect("orders-app may publish to audit");
    let consumer = cluster.consumer(Some(orders_app())).await;
    let orders = consumer.queues("orders").await.expect("queues")[0].clone();
    let pulled = consumer
        .pull(&orders, 0, 32)
        .await
        .expect("orders-app may pull orders");
    assert_eq!(pulled.messages.len(), 1);
    let audit = consumer.queues("audit").await.expect("queues")[0].clone();
    let (status, text) = refusal(consumer.pull(&audit, 0, 32).await);
    assert_eq!(status, Some(wire::Status::ACCESS_DENIED), "{text}");
    assert!(
        text.contains(r#"account "orders-app" lacks SUB on topic "audit" (it holds PUB)"#),
        "{text}"
    );

    // An admin call by a non-admin.
    let not_admin = cluster.admin(Some(orders_app())).await;
    let (status, text) = refusal(
        not_admin
            .create_topic(
                &cluster.broker.addr().to_string(),
                &TopicConfig::new("sneaky", 1),
            )
            .await,
    );
    assert_eq!(status, Some(wire::Status::ACCESS_DENIED), "{text}");
    assert!(text.contains("is not an admin"), "{text}");
    not_admin.shutdown().await;

    // Refusals are counted by kind and reason.
    let metrics = cluster.metrics();
    for expected in [
        r#"shardmq_access_denied_total{request="SendRecordsRequest",reason="no_credentials"}"#,
        r#"shardmq_access_denied_total{request="PullRequest",reason="permission"}"#,
        r#"shardmq_access_denied_total{request="UpsertTopicRequest",reason="not_admin"}"#,
    ] {
        assert!(
            metrics.contains(expected),
            "{expected} missing from:\n{metrics}"
        );
    }

    // The file changes while the clients run (through `shardmq acl update`): SUB on audit is
    // granted, and the same connection may pull it within the reload interval.
    let acl_file = cluster.acl_file.to_str().expect("UTF-8").to_owned();
    let output = run_cli(
        &cluster.namesrv_addr(),
        &[
            "acl",
            "update",
            "--file",
            &acl_file,
            "--access-key",
            "orders-app",
            "--topic-perm",
            "audit=PUB|SUB",
        ],
    );
    assert!(
        output.status.success(),
        "acl update: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    eventually(
        Duration::from_secs(10),
        "the reloaded permission",
        || async { consumer.pull(&audit, 0, 32).await.is_ok() },
    )
    .await;
    producer.shutdown().await;
    consumer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_secret_an_unknown_account_and_a_disallowed_address_fail_the_handshake() {
    let cluster = Cluster::start();
    cluster.create_topic("orders").await;
    for (credentials, expected) in [
        (
            Credentials::new("orders-app", "not-the-secret").expect("credentials"),
            r#"account "orders-app": the proof of the secret does not match"#,
        ),
        (
            Credentials::new("nobody-at-all", "whatever-secret").expect("credentials"),
            r#"no account has access key "nobody-at-all""#,
        ),
        (
            Credentials::new("remote-only", "remote-secret").expect("credentials"),
            r#"account "remote-only" may not connect from 127.0.0.1"#,
        ),
    ] {
        let producer = cluster.producer(Some(credentials)).await;
        let error = producer
            .send(Message::new("orders", "x"))
            .await
            .expect_err("refused");
        let text = error.to_string();
        assert!(text.contains("ACCESS_DENIED"), "{text}");
        assert!(text.contains(expected), "{expected:?} not in {text}");
        producer.shutdown().await;
    }
    let metrics = cluster.metrics();
    for reason in ["proof", "unknown_account", "address"] {
        let expected =
            format!(r#"shardmq_access_denied_total{{request="AuthRequest",reason="{reason}"}}"#);
        assert!(
            metrics.contains(&expected),
            "{expected} missing from:\n{metrics}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_takes_credentials_from_options_a_file_and_the_environment() {
    let cluster = Cluster::start();
    let namesrv = cluster.namesrv_addr();
    let broker = cluster.broker.addr().to_string();
    let create = |extra: &[&str], topic: &str| {
        let mut args: Vec<&str> = extra.to_vec();
        args.extend([
            "topic", "create", topic, "--broker", &broker, "--queues", "1",
        ]);
        let output = run_cli(&namesrv, &args);
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (ok, stderr) = create(&[], "t-anonymous");
    assert!(!ok, "an anonymous topic create must fail");
    assert!(stderr.contains("no access key given"), "{stderr}");
    let (ok, stderr) = create(
        &["--access-key", "admin-key", "--secret-key", "admin-secret"],
        "t-options",
    );
    assert!(ok, "{stderr}");
    let file = cluster._dir.path().join("credentials.toml");
    std::fs::write(
        &file,
        "access_key = \"admin-key\"\nsecret_key = \"admin-secret\"\n",
    )
    .expect("credentials file");
    let (ok, stderr) = create(
        &["--credentials-file", file.to_str().expect("UTF-8")],
        "t-file",
    );
    assert!(ok, "{stderr}");
    let output = std::process::Command::new(shardmq_tests::binary_path("shardmq"))
        .env("SHARDMQ_ACCESS_KEY", "admin-key")
        .env("SHARDMQ_SECRET_KEY", "admin-secret")
        .args([
            "--namesrv",
            &namesrv,
            "topic",
            "create",
            "t-env",
            "--broker",
            &broker,
            "--queues",
            "1",
        ])
        .output()
        .expect("shardmq runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn acl_commands_change_the_file_and_refuse_a_change_that_would_not_load() {
    let dir = TempDir::new().expect("temp dir");
    let file = dir.path().join("acl.toml");
    let file_arg = file.to_str().expect("UTF-8");
    let cli = |args: &[&str]| {
        let output = run_cli("127.0.0.1:9876", args);
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (ok, _, stderr) = cli(&[
        "acl",
        "add",
        "--file",
        file_arg,
        "--access-key",
        "orders-app",
        "--secret-key",
        "orders-secret",
        "--topic-perm",
        "orders=PUB",
    ]);
    assert!(ok, "{stderr}");
    let (ok, _, stderr) = cli(&[
        "acl",
        "add",
        "--file",
        file_arg,
        "--access-key",
        "orders-app",
        "--secret-key",
        "orders-secret",
    ]);
    assert!(!ok && stderr.contains("exists already"), "{stderr}");
    // A permission word the loader refuses: nothing is written.
    let before = std::fs::read_to_string(&file).expect("file");
    let (ok, _, stderr) = cli(&[
        "acl",
        "update",
        "--file",
        file_arg,
        "--access-key",
        "orders-app",
        "--topic-perm",
        "orders=WRITE",
    ]);
    assert!(!ok && stderr.contains("nothing written"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&file).expect("file"), before);
    let (ok, _, stderr) = cli(&[
        "acl",
        "update",
        "--file",
        file_arg,
        "--access-key",
        "orders-app",
        "--admin",
        "true",
    ]);
    assert!(ok, "{stderr}");
    let (ok, stdout, stderr) = cli(&["acl", "list", "--file", file_arg]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("orders-app (admin)"), "{stdout}");
    assert!(stdout.contains("orders=PUB"), "{stdout}");
    assert!(
        !stdout.contains("orders-secret"),
        "the secret is not shown: {stdout}"
    );
    let (ok, _, stderr) = cli(&[
        "acl",
        "remove",
        "--file",
        file_arg,
        "--access-key",
        "orders-app",
    ]);
    assert!(ok, "{stderr}");
    let (ok, stdout, _) = cli(&["acl", "list", "--file", file_arg]);
    assert!(ok && !stdout.contains("orders-app"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_for_a_broker_without_access_control_change_nothing() {
    let data = TempDir::new().expect("temp dir");
    let cluster = shardmq_tests::LocalCluster::start(data.path());
    cluster.create_topic("open", 1);
    let producer = Producer::builder()
        .namesrv(cluster.namesrv_addr())
        .credentials(orders_app())
        .build()
        .await
        .expect("producer");
    producer
        .send(Message::new("open", "x"))
        .await
        .expect("a broker without access control serves a client with credentials");
    producer.shutdown().await;
}

/// Every request kind the protocol has, sent by a connection that did not authenticate, is
/// refused with ACCESS_DENIED before its handler runs (each body is an empty table: no name in
/// it could matter), and the connection still answers afterwards.
#[test]
fn every_request_kind_without_credentials_is_refused() {
    let cluster = Cluster::start();
    let mut client = cluster.broker.client();
    let handshake = client.handshake().expect("a second handshake is answered");
    let nonce = handshake
        .frame()
        .body_as_handshake_response()
        .and_then(|response| response.auth_nonce())
        .map(|nonce| nonce.bytes().len());
    assert_eq!(
        nonce,
        Some(32),
        "an enforcing broker challenges every handshake"
    );
    let mut refused = 0;
    for &kind in wire::Body::ENUM_VALUES {
        if matches!(
            kind,
            wire::Body::NONE | wire::Body::HandshakeRequest | wire::Body::AuthRequest
        ) {
            continue;
        }
        let answer = client
            .request(|builder| {
                let start = builder.start_table();
                let empty = builder.end_table(start);
                (kind, flatbuffers::WIPOffset::new(empty.value()))
            })
            .unwrap_or_else(|error| panic!("{kind:?}: {error}"));
        let (status, message) = status_of(&answer);
        assert_eq!(status, wire::Status::ACCESS_DENIED, "{kind:?}: {message:?}");
        assert!(
            message
                .as_deref()
                .is_some_and(|m| m.contains("no access key given")),
            "{kind:?}: {message:?}"
        );
        refused += 1;
    }
    assert!(refused > 60, "only {refused} kinds tried");
}

/// A broker account no server could accept (an empty access key, a secret with a control
/// character) stops the broker at start with the reason, as on the name server.
#[test]
fn an_unusable_broker_account_stops_the_start() {
    let dir = TempDir::new().expect("temp dir");
    for (access_key, secret_key, reason) in [
        ("", "secret", "access key is empty"),
        ("broker", "bad\nsecret", "secret"),
    ] {
        let output = std::process::Command::new(shardmq_tests::binary_path("shardmq-broker"))
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path().join("broker"))
            .args(["--access-key", access_key, "--secret-key", secret_key])
            .output()
            .expect("shardmq-broker runs");
        assert_eq!(output.status.code(), Some(2), "{output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("the broker's account") && stderr.contains(reason),
            "{stderr}"
        );
    }
}

/// The perf harness against a broker that enforces access control: refused without an account,
/// served with `--access-key`/`--secret-key` (every client it starts authenticates).
#[test]
fn the_perf_harness_takes_an_account() {
    let cluster = Cluster::start();
    let namesrv = cluster.namesrv_addr();
    let perf = |account: &[&str]| {
        std::process::Command::new(shardmq_tests::binary_path("shardmq-perf"))
            .env_remove("SHARDMQ_ACCESS_KEY")
            .env_remove("SHARDMQ_SECRET_KEY")
            .args(account)
            .args(["produce", "--namesrv", &namesrv, "--topic", "orders"])
            .args([
                "--queues",
                "1",
                "--messages",
                "200",
                "--batch",
                "10",
                "--quiet",
            ])
            .args(["--json", "--verify"])
            .output()
            .expect("shardmq-perf runs")
    };
    let anonymous = perf(&[]);
    assert!(!anonymous.status.success(), "{anonymous:?}");
    let error = String::from_utf8_lossy(&anonymous.stderr);
    assert!(error.contains("ACCESS_DENIED"), "{error}");

    let output = shardmq_tests::wait_until(shardmq_tests::ROUTE_TIMEOUT, "a route", || {
        let output = perf(&["--access-key", "admin-key", "--secret-key", "admin-secret"]);
        (output.status.success() || !String::from_utf8_lossy(&output.stderr).contains("route"))
            .then_some(output)
    });
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let result: serde_json::Value =
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("JSON");
    assert_eq!(result["messages"], serde_json::json!(200), "{result}");
    assert_eq!(result["lost"], serde_json::json!(0), "{result}");
}
