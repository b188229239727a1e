//! Access control between the processes of a cluster (docs/acl.md, "Name servers and
//! broker-to-broker traffic"), with real binaries: a name server run with `--acl-file` refuses
//! anonymous route lookups and registrations by brokers without an admin account; a broker
//! with `--access-key`/`--secret-key` authenticates to its name server and, as a slave, to its
//! master's HA port, and a slave without the account copies nothing. The accounts files trust
//! no loopback address, so nothing passes for being local.
//!
//! Needs the binaries: `cargo build --workspace --bins` first.

mod reliability_support;

use std::net::SocketAddr;
use std::time::Duration;

use reliability_support::{create_topic, pull_queue, send_batch, QueueEnd};
use shardmq_client::Credentials;
use shardmq_schema::wire;
use shardmq_tests::{
    free_port, http_get_body, status_of, wait_until, BrokerProcess, NamesrvProcess, TestClient,
    TestMessage,
};
use tempfile::TempDir;

const ACCOUNTS: &str = r#"
# Nothing is trusted by address: every request needs an account.
trusted_addresses = ["192.0.2.1"]

[[accounts]]
access_key = "broker-account"
secret_key = "broker-secret"
admin = true

[[accounts]]
access_key = "reader-account"
secret_key = "reader-secret"

[[accounts]]
access_key = "namesrv-account"
secret_key = "namesrv-secret"
admin = true
"#;

const BROKER_ACCOUNT: (&str, &str) = ("broker-account", "broker-secret");
const READER_ACCOUNT: (&str, &str) = ("reader-account", "reader-secret");
const NAMESRV_ACCOUNT: (&str, &str) = ("namesrv-account", "namesrv-secret");

/// Longest a registration or a replication round may take here.
const SETTLE: Duration = Duration::from_secs(20);

fn accounts_file(dir: &TempDir) -> String {
    let path = dir.path().join("acl.toml");
    std::fs::write(&path, ACCOUNTS).expect("accounts file written");
    path.to_str().expect("UTF-8 path").to_owned()
}

/// A client of `addr` past the handshake and, given an account, past the challenge (the
/// server must have sent one). Panics when the account is refused.
fn client_as(addr: SocketAddr, account: Option<(&str, &str)>) -> TestClient {
    let mut client = TestClient::connect(addr).expect("connects");
    let handshake = client.handshake().expect("handshake");
    let nonce = handshake
        .frame()
        .body_as_handshake_response()
        .and_then(|r| r.auth_nonce())
        .map(|nonce| nonce.bytes().to_vec());
    let Some((access_key, secret_key)) = account else {
        return client;
    };
    let nonce = nonce.expect("a server that enforces access control sends an auth_nonce");
    let answer = authenticate(&mut client, &nonce, access_key, secret_key);
    assert_eq!(
        status_of(&answer).0,
        wire::Status::OK,
        "{access_key} authenticates: {:?}",
        status_of(&answer)
    );
    client
}

/// Answers `nonce` as `access_key` with `secret_key`; returns the server's answer.
fn authenticate(
    client: &mut TestClient,
    nonce: &[u8],
    access_key: &str,
    secret_key: &str,
) -> shardmq_schema::VerifiedFrame {
    let credentials = Credentials::new(access_key, secret_key).expect("credentials");
    let (client_nonce, proof) = credentials.answer(nonce).expect("a 32-byte nonce");
    client
        .request(|b| {
            let access_key = b.create_string(access_key);
            let client_nonce = b.create_vector(&client_nonce);
            let proof = b.create_vector(&proof);
            let body = wire::AuthRequest::create(
                b,
                &wire::AuthRequestArgs {
                    access_key: Some(access_key),
                    client_nonce: Some(client_nonce),
                    proof: Some(proof),
                },
            );
            (wire::Body::AuthRequest, body.as_union_value())
        })
        .expect("an answer to AuthRequest")
}

/// The answer to a route lookup of `topic`.
fn route(client: &mut TestClient, topic: &str) -> shardmq_schema::VerifiedFrame {
    client
        .request(|b| {
            let topic = b.create_string(topic);
            let request =
                wire::GetRouteRequest::create(b, &wire::GetRouteRequestArgs { topic: Some(topic) });
            (wire::Body::GetRouteRequest, request.as_union_value())
        })
        .expect("an answer to GetRouteRequest")
}

/// The broker names in `topic`'s route (empty when there is none).
fn routed_brokers(client: &mut TestClient, topic: &str) -> Vec<String> {
    let answer = route(client, topic);
    answer
        .frame()
        .body_as_route_response()
        .and_then(|r| r.brokers())
        .map(|brokers| {
            brokers
                .iter()
                .filter_map(|b| b.broker_name().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The name server's `/metrics` text (its address from its log).
fn namesrv_metrics(namesrv: &NamesrvProcess) -> String {
    let addr: SocketAddr = wait_until(Duration::from_secs(10), "the metrics address", || {
        namesrv.log_lines().iter().find_map(|line| {
            let start = line.find("metrics served at http://")? + "metrics served at http://".len();
            let end = line[start..].find("/metrics")? + start;
            line[start..end].parse().ok()
        })
    });
    http_get_body(addr, "/metrics")
}

fn acl_namesrv(acl_file: &str) -> NamesrvProcess {
    NamesrvProcess::start_with_args(&["--acl-file", acl_file, "--metrics-listen", "127.0.0.1:0"])
}

fn broker(dir: &TempDir, name: &str, namesrv: &NamesrvProcess, extra: &[&str]) -> BrokerProcess {
    let namesrv = namesrv.addr().to_string();
    let mut args = vec![
        "--namesrv",
        &namesrv,
        "--broker-name",
        name,
        "--register-interval-ms",
        "500",
    ];
    args.extend_from_slice(extra);
    BrokerProcess::start(&dir.path().join(name), &args)
}

#[test]
fn a_broker_with_an_admin_account_registers_and_brokers_without_one_are_refused() {
    let dir = TempDir::new().expect("temp dir");
    let acl_file = accounts_file(&dir);
    let namesrv = acl_namesrv(&acl_file);
    let admin = [
        "--access-key",
        BROKER_ACCOUNT.0,
        "--secret-key",
        BROKER_ACCOUNT.1,
    ];
    let good = broker(&dir, "broker-good", &namesrv, &admin);
    let wrong_secret = broker(
        &dir,
        "broker-wrong-secret",
        &namesrv,
        &[
            "--access-key",
            BROKER_ACCOUNT.0,
            "--secret-key",
            "not-the-secret",
        ],
    );
    let not_admin = broker(
        &dir,
        "broker-not-admin",
        &namesrv,
        &[
            "--access-key",
            READER_ACCOUNT.0,
            "--secret-key",
            READER_ACCOUNT.1,
        ],
    );
    let anonymous = broker(&dir, "broker-anonymous", &namesrv, &[]);
    // The brokers themselves do not enforce access control: their topics are made openly.
    for (broker, topic) in [
        (&good, "OnGood"),
        (&wrong_secret, "OnWrongSecret"),
        (&not_admin, "OnNotAdmin"),
        (&anonymous, "OnAnonymous"),
    ] {
        create_topic(&mut broker.client(), topic, 2);
    }

    let mut reader = client_as(namesrv.addr(), Some(READER_ACCOUNT));
    wait_until(SETTLE, "the admin broker's route", || {
        (routed_brokers(&mut reader, "OnGood") == ["broker-good"]).then_some(())
    });

    // The refusals are counted: a wrong proof at the challenge, registrations without the
    // admin flag or without an account.
    let expected = [
        r#"shardmq_namesrv_access_denied_total{request="AuthRequest",reason="proof"}"#,
        r#"shardmq_namesrv_access_denied_total{request="RegisterBrokerRequest",reason="not_admin"}"#,
        r#"shardmq_namesrv_access_denied_total{request="RegisterBrokerRequest",reason="no_credentials"}"#,
    ];
    let metrics = wait_until(SETTLE, "the refusals in /metrics", || {
        let metrics = namesrv_metrics(&namesrv);
        expected
            .iter()
            .all(|line| metrics.contains(line))
            .then_some(metrics)
    });
    assert!(!metrics.contains("reason=\"unknown_account\""), "{metrics}");
    // By now each refused broker has tried at least once: none of them is routed.
    for topic in ["OnWrongSecret", "OnNotAdmin", "OnAnonymous"] {
        assert_eq!(
            routed_brokers(&mut reader, topic),
            Vec::<String>::new(),
            "{topic} has no route"
        );
    }
    assert!(
        namesrv
            .log_lines()
            .iter()
            .any(|line| line.contains("authentication refused") && line.contains("broker-account")),
        "the name server logs the refused proof: {:?}",
        namesrv.log_lines()
    );
    // Each refused broker says why in its own log, naming the name server and the account.
    let says = |broker: &BrokerProcess, what: &[&str]| {
        wait_until(SETTLE, &format!("{what:?} in the broker's log"), || {
            broker
                .log_lines()
                .iter()
                .any(|line| what.iter().all(|part| line.contains(part)))
                .then_some(())
        })
    };
    says(
        &wrong_secret,
        &[
            "refused this broker's account",
            "broker-account",
            &namesrv.addr().to_string(),
        ],
    );
    says(&not_admin, &["refused the registration", "not an admin"]);
    says(&anonymous, &["refused the registration", "ACCESS_DENIED"]);
    // And the good broker still registers after all that.
    assert_eq!(routed_brokers(&mut reader, "OnGood"), ["broker-good"]);
}

#[test]
fn an_anonymous_route_lookup_on_an_access_controlled_name_server_is_access_denied() {
    let dir = TempDir::new().expect("temp dir");
    let acl_file = accounts_file(&dir);
    let namesrv = acl_namesrv(&acl_file);

    let mut anonymous = client_as(namesrv.addr(), None);
    let (status, message) = status_of(&route(&mut anonymous, "Orders"));
    assert_eq!(status, wire::Status::ACCESS_DENIED, "{message:?}");
    let message = message.unwrap_or_default();
    assert!(
        message.contains("GetRouteRequest needs a known account")
            && message.contains("no access key"),
        "{message}"
    );
    // A non-admin account reads, but may not register a broker.
    let mut reader = client_as(namesrv.addr(), Some(READER_ACCOUNT));
    let (status, _) = status_of(&route(&mut reader, "Orders"));
    assert_ne!(status, wire::Status::ACCESS_DENIED);
    let register = reader
        .request(|b| {
            let (cluster, name, address) = (
                b.create_string("DefaultCluster"),
                b.create_string("intruder"),
                b.create_string("127.0.0.1:1"),
            );
            let body = wire::RegisterBrokerRequest::create(
                b,
                &wire::RegisterBrokerRequestArgs {
                    cluster_name: Some(cluster),
                    broker_name: Some(name),
                    broker_address: Some(address),
                    ..Default::default()
                },
            );
            (wire::Body::RegisterBrokerRequest, body.as_union_value())
        })
        .expect("an answer to RegisterBrokerRequest");
    let (status, message) = status_of(&register);
    assert_eq!(status, wire::Status::ACCESS_DENIED, "{message:?}");
    let message = message.unwrap_or_default();
    assert!(
        message.contains("needs an admin account") && message.contains("reader-account"),
        "{message}"
    );
    // A wrong secret is refused at the challenge and the connection closes.
    let mut wrong = TestClient::connect(namesrv.addr()).expect("connects");
    let handshake = wrong.handshake().expect("handshake");
    let nonce = handshake
        .frame()
        .body_as_handshake_response()
        .and_then(|r| r.auth_nonce())
        .map(|nonce| nonce.bytes().to_vec())
        .expect("an auth_nonce");
    let answer = authenticate(&mut wrong, &nonce, "reader-account", "not-the-secret");
    assert_eq!(status_of(&answer).0, wire::Status::ACCESS_DENIED);
    assert!(
        wrong.read_until_closed().expect("closed").is_empty(),
        "nothing after the refusal"
    );
}

#[test]
fn replication_authenticates_as_the_broker_account_and_fails_without_it() {
    let dir = TempDir::new().expect("temp dir");
    let acl_file = accounts_file(&dir);
    let namesrv = acl_namesrv(&acl_file);
    let ha = format!("127.0.0.1:{}", free_port());
    let account = [
        "--access-key",
        BROKER_ACCOUNT.0,
        "--secret-key",
        BROKER_ACCOUNT.1,
    ];
    let with_acl = |extra: &[&'static str]| {
        let mut args = vec!["--acl-file", acl_file.as_str()];
        args.extend_from_slice(extra);
        args
    };
    let mut master_args = with_acl(&account);
    // The machine's disk is shared with builds and other tests: a send is not refused for a
    // disk fuller than the default 95 % here (this test is not about disk use).
    master_args.extend_from_slice(&["--disk-refuse-ratio", "0.999"]);
    master_args.extend_from_slice(&["--broker-role", "async-master", "--ha-listen", ha.as_str()]);
    let master = broker(&dir, "broker-m", &namesrv, &master_args);
    let slave_args = |credentials: &[&'static str]| {
        let mut args = with_acl(credentials);
        args.extend_from_slice(&["--broker-role", "slave", "--broker-id", "1", "--ha-master"]);
        args
    };
    let mut with_account = slave_args(&account);
    with_account.push(ha.as_str());
    let slave_dir = TempDir::new().expect("temp dir");
    let slave = broker(&slave_dir, "broker-m", &namesrv, &with_account);

    let mut on_master = client_as(master.addr(), Some(BROKER_ACCOUNT));
    create_topic(&mut on_master, "Replicated", 1);
    let messages: Vec<TestMessage> = (0..10)
        .map(|i| TestMessage::new(format!("message {i}")))
        .collect();
    send_batch(&mut on_master, "Replicated", 0, &messages);

    let mut on_slave = client_as(slave.addr(), Some(BROKER_ACCOUNT));
    wait_until(SETTLE, "the slave to hold the 10 messages", || {
        let (records, end) = pull_queue(&mut on_slave, "Replicated", 0);
        (end == QueueEnd::End && records.len() == 10).then_some(())
    });
    drop(on_slave);
    drop(slave);

    // The same slave without the account: the master refuses its replica requests.
    let mut without_account = slave_args(&[]);
    without_account.push(ha.as_str());
    let anonymous_dir = TempDir::new().expect("temp dir");
    let anonymous = broker(&anonymous_dir, "broker-m", &namesrv, &without_account);
    wait_until(SETTLE, "the master's refusal in the slave's log", || {
        anonymous
            .log_lines()
            .iter()
            .any(|line| {
                line.contains("the master refused the join") && line.contains("ACCESS_DENIED")
            })
            .then_some(())
    });
    let mut on_anonymous = client_as(anonymous.addr(), Some(BROKER_ACCOUNT));
    let (records, _) = pull_queue(&mut on_anonymous, "Replicated", 0);
    assert!(
        records.is_empty(),
        "the slave without the account copied nothing"
    );
    // The master keeps serving its own clients.
    let (records, _) = pull_queue(&mut on_master, "Replicated", 0);
    assert_eq!(records.len(), 10);
}

/// Three name servers running one controller group with `--acl-file`, each with `account` as
/// its own (`None`: no account), and their controller addresses.
fn controller_group(
    dir: &TempDir,
    acl_file: &str,
    account: Option<(&str, &str)>,
) -> (Vec<NamesrvProcess>, Vec<String>) {
    let addresses: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let peers: Vec<String> = addresses
        .iter()
        .enumerate()
        .map(|(i, address)| format!("{}={address}", i + 1))
        .collect();
    let peers = peers.join(",");
    let processes = addresses
        .iter()
        .enumerate()
        .map(|(i, address)| {
            let id = (i + 1).to_string();
            let data = dir.path().join(format!("controller-{id}-{}", free_port()));
            let data = data.to_str().expect("UTF-8 path").to_owned();
            let mut args = vec![
                "--acl-file",
                acl_file,
                "--metrics-listen",
                "127.0.0.1:0",
                "--controller",
                "--controller-listen",
                address,
                "--controller-peers",
                &peers,
                "--controller-id",
                &id,
                "--controller-data-dir",
                &data,
            ];
            if let Some((access_key, secret_key)) = account {
                args.extend_from_slice(&["--access-key", access_key, "--secret-key", secret_key]);
            }
            NamesrvProcess::start_with_args(&args)
        })
        .collect();
    (processes, addresses)
}

/// The controller status `address` gives `account`: (leader id, master id of the first group).
fn controller_status(address: &str, account: Option<(&str, &str)>) -> Option<(u64, i64)> {
    let mut client = client_as(address.parse().ok()?, account);
    let answer = client
        .request(|b| {
            let body =
                wire::ControllerStatusRequest::create(b, &wire::ControllerStatusRequestArgs {});
            (wire::Body::ControllerStatusRequest, body.as_union_value())
        })
        .ok()?;
    let status = answer.frame().body_as_controller_status_response()?;
    let master = status
        .groups()
        .and_then(|groups| groups.iter().next())
        .map_or(0, |group| group.master_id());
    Some((status.leader_id(), master))
}

/// A broker process whose log goes to a file, killed when dropped: a broker in `auto` role
/// prints no `listening on` line until a controller names its role.
struct UnstartedBroker {
    child: std::process::Child,
    log: std::path::PathBuf,
}

impl UnstartedBroker {
    fn start(data_dir: &std::path::Path, args: &[&str]) -> UnstartedBroker {
        std::fs::create_dir_all(data_dir).expect("data dir");
        let log = data_dir.join("broker.log");
        let child = std::process::Command::new(shardmq_tests::binary_path("shardmq-broker"))
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("the broker starts");
        UnstartedBroker { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for UnstartedBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn controllers_and_auto_brokers_authenticate_with_their_accounts() {
    let dir = TempDir::new().expect("temp dir");
    let acl_file = accounts_file(&dir);

    // Without an account the controllers refuse each other's Raft requests: no leader.
    let (unaccounted, addresses) = controller_group(&dir, &acl_file, None);
    wait_until(SETTLE, "refused Raft requests in /metrics", || {
        namesrv_metrics(&unaccounted[0])
            .contains(r#"request="ControllerRaftRequest",reason="no_credentials""#)
            .then_some(())
    });
    for address in &addresses {
        assert_eq!(
            controller_status(address, Some(READER_ACCOUNT)).map(|(leader, _)| leader),
            Some(0),
            "{address} has no leader"
        );
    }
    drop(unaccounted);

    // With the name servers' admin account they elect a leader.
    let (controllers, addresses) = controller_group(&dir, &acl_file, Some(NAMESRV_ACCOUNT));
    let controller_list = addresses.join(",");
    wait_until(SETTLE, "a controller leader", || {
        let (leader, _) = controller_status(&addresses[0], Some(READER_ACCOUNT))?;
        (leader != 0).then_some(())
    });
    // Status needs a known account.
    let mut anonymous = client_as(addresses[1].parse().unwrap(), None);
    let answer = anonymous
        .request(|b| {
            let body =
                wire::ControllerStatusRequest::create(b, &wire::ControllerStatusRequestArgs {});
            (wire::Body::ControllerStatusRequest, body.as_union_value())
        })
        .expect("an answer");
    let (status, message) = status_of(&answer);
    assert_eq!(status, wire::Status::ACCESS_DENIED, "{message:?}");
    assert!(
        message
            .unwrap_or_default()
            .contains("ControllerStatusRequest needs a known account"),
        "names the need"
    );

    // A broker in auto role asks for its role and heartbeats with its account, and becomes
    // master; registered with the name server too.
    let namesrv = controllers[0].addr().to_string();
    let ha = format!("127.0.0.1:{}", free_port());
    let auto = |ha: &str, extra: &[&'static str]| {
        let mut args = vec![
            "--namesrv".to_owned(),
            namesrv.clone(),
            "--broker-role".to_owned(),
            "auto".to_owned(),
            "--broker-id".to_owned(),
            "1".to_owned(),
            "--controller".to_owned(),
            controller_list.clone(),
            "--controller-heartbeat-ms".to_owned(),
            "300".to_owned(),
            "--ha-listen".to_owned(),
            ha.to_owned(),
            "--register-interval-ms".to_owned(),
            "500".to_owned(),
        ];
        args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        args
    };
    let account = [
        "--access-key",
        BROKER_ACCOUNT.0,
        "--secret-key",
        BROKER_ACCOUNT.1,
    ];
    let args = auto(&ha, &account);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let broker_dir = TempDir::new().expect("temp dir");
    let _master = BrokerProcess::start(broker_dir.path(), &args);
    wait_until(SETTLE, "the controllers to name broker 1 master", || {
        let (_, master) = controller_status(&addresses[0], Some(READER_ACCOUNT))?;
        (master == 1).then_some(())
    });

    // A broker of another group without an account is refused its role and never starts.
    let mut args = auto(&format!("127.0.0.1:{}", free_port()), &[]);
    args.extend(["--broker-name".to_owned(), "broker-anonymous".to_owned()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let anonymous_dir = TempDir::new().expect("temp dir");
    let refused = UnstartedBroker::start(anonymous_dir.path(), &args);
    wait_until(
        SETTLE,
        "the controllers' refusal in the broker's log",
        || {
            let log = refused.log();
            (log.contains("waiting for the controller") && log.contains("ACCESS_DENIED"))
                .then_some(())
        },
    );
    assert!(!refused.log().contains("listening on"));
}
