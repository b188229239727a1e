//! TLS against the real name server and broker (docs/tls.md): each mode of the listeners, the
//! `shardmq` CLI sending and consuming over TLS, the errors a client meets (a CA it does not
//! trust, an expired certificate, a server that wants a client certificate), RocketMQ remoting
//! over TLS, certificate files replaced while the broker runs, and replication over TLS.
//!
//! Certificates come from `scripts/make-certs.sh` (openssl). Needs the binaries: `cargo build
//! --workspace --bins` first.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use shardmq_remoting::codes::{request, response};
use shardmq_remoting::RemotingCommand;
use shardmq_tests::{BrokerProcess, NamesrvProcess};
use tempfile::TempDir;

/// The certificates of `scripts/make-certs.sh`, in a directory the test owns.
struct Certs {
    dir: TempDir,
}

impl Certs {
    fn make() -> Self {
        let dir = TempDir::new().unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/make-certs.sh");
        let output = std::process::Command::new(script)
            .arg(dir.path())
            .output()
            .expect("scripts/make-certs.sh runs (needs openssl)");
        assert!(
            output.status.success(),
            "make-certs.sh: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Self { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_owned()
    }
}

/// Listener flags: `mode` with the certificate `name` (`server`, `expired`, …).
fn listener_args(certs: &Certs, mode: &str, name: &str) -> Vec<String> {
    vec![
        "--tls-mode".into(),
        mode.into(),
        "--tls-cert".into(),
        certs.path(&format!("{name}.pem")),
        "--tls-key".into(),
        certs.path(&format!("{name}.key")),
    ]
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// A name server and a broker (auto-creating topics) with `namesrv_args` and `broker_args`.
fn cluster(
    data: &Path,
    namesrv_args: &[String],
    broker_args: &[String],
) -> (NamesrvProcess, BrokerProcess) {
    let namesrv = NamesrvProcess::start_with_args(&strs(namesrv_args));
    let namesrv_addr = namesrv.addr().to_string();
    let mut args = vec![
        "--namesrv".to_owned(),
        namesrv_addr,
        "--auto-create-topics".to_owned(),
    ];
    args.extend_from_slice(broker_args);
    let broker = BrokerProcess::start(data, &strs(&args));
    (namesrv, broker)
}

/// The CLI against `namesrv` with the TLS options `tls` (empty: plain, and no SHARDMQ_TLS_*
/// from the environment).
fn cli(namesrv: &NamesrvProcess, tls: &[String], args: &[&str]) -> Output {
    std::process::Command::new(shardmq_tests::binary_path("shardmq"))
        .env_remove("SHARDMQ_TLS_CA")
        .env_remove("SHARDMQ_TLS_CERT")
        .env_remove("SHARDMQ_TLS_KEY")
        .arg("--namesrv")
        .arg(namesrv.addr().to_string())
        .args(tls)
        .args(args)
        .output()
        .expect("shardmq runs")
}

fn trusting(certs: &Certs, ca: &str) -> Vec<String> {
    vec!["--tls-ca".into(), certs.path(&format!("{ca}.pem"))]
}

fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn assert_ok(output: &Output) -> String {
    assert!(
        output.status.success(),
        "shardmq failed ({}): {}",
        output.status,
        stderr_of(output)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Sends `count` messages to `topic` and consumes them back as a fresh group, over `tls`.
fn round_trip(namesrv: &NamesrvProcess, tls: &[String], topic: &str, group: &str, count: usize) {
    let count_text = count.to_string();
    // Until the broker has registered, the name server has no route to create the topic by.
    let sent = shardmq_tests::wait_until(shardmq_tests::ROUTE_TIMEOUT, "a route", || {
        let output = cli(
            namesrv,
            tls,
            &["send", topic, "--body", "over tls", "--count", &count_text],
        );
        (output.status.success() || !stderr_of(&output).contains("has no route")).then_some(output)
    });
    let sent = assert_ok(&sent);
    assert_eq!(sent.matches("SEND_OK").count(), count, "{sent}");
    let consumed = assert_ok(&cli(
        namesrv,
        tls,
        &[
            "consume",
            topic,
            "--group",
            group,
            "--from",
            "first",
            "--count",
            &count_text,
        ],
    ));
    assert_eq!(
        consumed.matches("body=over tls").count(),
        count,
        "{consumed}"
    );
}

/// Whether `addr` closes a plain connection without answering its handshake: what an
/// enforcing listener does.
fn closes_plain_unanswered(addr: std::net::SocketAddr) -> bool {
    let mut client = shardmq_tests::TestClient::connect(addr).unwrap();
    client.set_read_timeout(Duration::from_secs(10)).unwrap();
    client.handshake().is_err()
}

#[test]
fn disabled_serves_plain_and_a_tls_client_is_told_the_server_does_not_speak_tls() {
    let certs = Certs::make();
    let data = TempDir::new().unwrap();
    let (namesrv, _broker) = cluster(data.path(), &[], &[]);
    round_trip(&namesrv, &[], "PlainTopic", "plain-readers", 2);
    let refused = cli(&namesrv, &trusting(&certs, "ca"), &["topic", "list"]);
    assert!(!refused.status.success());
    let error = stderr_of(&refused);
    assert!(error.contains("TLS handshake with"), "{error}");
}

#[test]
fn permissive_serves_tls_and_plain_clients_on_one_port() {
    let certs = Certs::make();
    let data = TempDir::new().unwrap();
    let mut broker_args = listener_args(&certs, "permissive", "server");
    broker_args.extend(trusting(&certs, "ca"));
    let (namesrv, broker) = cluster(
        data.path(),
        &listener_args(&certs, "permissive", "server"),
        &broker_args,
    );
    round_trip(&namesrv, &trusting(&certs, "ca"), "Mixed", "tls-readers", 3);
    round_trip(&namesrv, &[], "Mixed", "plain-readers", 6);
    // A plain native handshake straight to each port is answered.
    let _answered = broker.client();
    let _answered = namesrv.client();
}

#[test]
fn enforcing_refuses_plain_clients_and_serves_tls_ones() {
    let certs = Certs::make();
    let data = TempDir::new().unwrap();
    let mut broker_args = listener_args(&certs, "enforcing", "server");
    broker_args.extend(trusting(&certs, "ca"));
    let (namesrv, broker) = cluster(
        data.path(),
        &listener_args(&certs, "enforcing", "server"),
        &broker_args,
    );
    // The broker registered over TLS: its topics are routed.
    round_trip(
        &namesrv,
        &trusting(&certs, "ca"),
        "Sealed",
        "tls-readers",
        5,
    );
    let plain = cli(&namesrv, &[], &["topic", "list"]);
    assert!(!plain.status.success(), "a plain CLI got through");
    assert!(closes_plain_unanswered(broker.addr()));
    assert!(closes_plain_unanswered(namesrv.addr()));
    let warned = |lines: Vec<String>| {
        lines
            .iter()
            .any(|line| line.contains("refusing a plain connection"))
    };
    assert!(warned(broker.log_lines()), "the broker logs the refusal");
    assert!(
        warned(namesrv.log_lines()),
        "the name server logs the refusal"
    );
}

#[test]
fn a_client_trusting_another_ca_gets_an_error_naming_the_reason() {
    let certs = Certs::make();
    let data = TempDir::new().unwrap();
    let (namesrv, _broker) = cluster(
        data.path(),
        &listener_args(&certs, "enforcing", "server"),
        &[],
    );
    let refused = cli(&namesrv, &trusting(&certs, "other-ca"), &["topic", "list"]);
    assert!(!refused.status.success());
    let error = stderr_of(&refused);
    assert!(
        error.contains(&format!("TLS handshake with {} failed", namesrv.addr())),
        "{error}"
    );
    assert!(error.contains("UnknownIssuer"), "{error}");
}

#[test]
fn an_expired_server_certificate_is_refused_by_the_client() {
    let certs = Certs::make();
    let data = TempDir::new().unwrap();
    let (namesrv, _broker) = cluster(
        data.path(),
        &listener_args(&certs, "enforcing", "expired"),
        &[],
    );
    let refused = cli(&namesrv, &trusting(&certs, "ca"), &["topic", "list"]);
    assert!(!refused.status.success());
    let error = stderr_of(&refused);
    assert!(error.contains("TLS handshake with"), "{error}");
    assert!(error.contains("expired"), "{error}");
}

#[test]
fn mutual_tls_refuses_a_client_without_a_certificate() {
    let certs = Certs::make();
    let data = TempDir::new().unwrap();
    let mut mutual = listener_args(&certs, "enforcing", "server");
    mutual.extend(["--tls-client-ca".to_owned(), certs.path("ca.pem")]);
    let mut broker_args = mutual.clone();
    broker_args.extend(trusting(&certs, "ca"));
    broker_args.extend([
        "--tls-client-cert".to_owned(),
        certs.path("client.pem"),
        "--tls-client-key".to_owned(),
        certs.path("client.key"),
    ]);
    let (namesrv, _broker) = cluster(data.path(), &mutual, &broker_args);
    let anonymous = cli(&namesrv, &trusting(&certs, "ca"), &["topic", "list"]);
    assert!(
        !anonymous.status.success(),
        "a client without a certificate got through"
    );
    // TLS 1.3: the client finishes its side of the handshake before the server refuses it,
    // so the refusal arrives as an alert on the first read.
    let error = stderr_of(&anonymous);
    assert!(error.contains(&namesrv.addr().to_string()), "{error}");
    assert!(error.contains("CertificateRequired"), "{error}");

    let mut with_cert = trusting(&certs, "ca");
    with_cert.extend([
        "--tls-cert".to_owned(),
        certs.path("client.pem"),
        "--tls-key".to_owned(),
        certs.path("client.key"),
    ]);
    // The broker registered with its own client certificate; the CLI sends and consumes with
    // its certificate.
    round_trip(&namesrv, &with_cert, "Mutual", "cert-readers", 2);
}

/// A blocking TLS client of the remoting protocol: one request, its answer.
fn remoting_call(
    addr: std::net::SocketAddr,
    certs: &Certs,
    command: RemotingCommand,
) -> RemotingCommand {
    let tls = shardmq_tls::ClientTlsFiles::new(certs.path("ca.pem"))
        .load()
        .unwrap();
    let name = tls.server_name_for(&addr.to_string()).unwrap();
    let connection = rustls::ClientConnection::new(tls.config(), name).unwrap();
    let socket = TcpStream::connect(addr).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut stream = rustls::StreamOwned::new(connection, socket);
    let mut frame = BytesMut::new();
    shardmq_remoting::encode_frame(
        &command,
        shardmq_remoting::DEFAULT_MAX_FRAME_BYTES,
        &mut frame,
    )
    .unwrap();
    stream.write_all(&frame).unwrap();
    stream.flush().unwrap();
    let decoder = shardmq_remoting::FrameDecoder::default();
    let mut buffer = BytesMut::new();
    loop {
        if let Some(answer) = decoder.decode(&mut buffer).unwrap() {
            if answer.is_response() {
                return answer;
            }
            continue;
        }
        let mut chunk = [0u8; 16 << 10];
        let read = stream.read(&mut chunk).expect("an answer");
        assert!(read > 0, "closed before the answer");
        buffer.extend_from_slice(&chunk[..read]);
    }
}

#[test]
fn rocketmq_remoting_is_served_over_tls_by_both_servers() {
    let certs = Certs::make();
    let data = TempDir::new().unwrap();
    let mut broker_args = listener_args(&certs, "enforcing", "server");
    broker_args.extend(trusting(&certs, "ca"));
    let (namesrv, broker) = cluster(
        data.path(),
        &listener_args(&certs, "enforcing", "server"),
        &broker_args,
    );
    round_trip(
        &namesrv,
        &trusting(&certs, "ca"),
        "Remote",
        "tls-readers",
        1,
    );
    let mut route = RemotingCommand::request(request::GET_ROUTEINFO_BY_TOPIC, 0);
    route = route.with_ext("topic", "Remote");
    let answer = remoting_call(namesrv.addr(), &certs, route);
    assert_eq!(answer.code, response::SUCCESS, "{:?}", answer.remark);
    let body = String::from_utf8_lossy(answer.body.as_ref()).into_owned();
    assert!(body.contains(&broker.addr().to_string()), "{body}");

    let heartbeat = RemotingCommand::request(request::HEART_BEAT, 0).with_body(Bytes::from(
        r#"{"clientID":"127.0.0.1@tls-test","producerDataSet":[{"groupName":"P"}],"consumerDataSet":[]}"#,
    ));
    let answer = remoting_call(broker.addr(), &certs, heartbeat);
    assert_eq!(answer.code, response::SUCCESS, "{:?}", answer.remark);
}

#[test]
fn replaced_certificate_files_are_used_by_new_connections() {
    let certs = Certs::make();
    let live = TempDir::new().unwrap();
    let cert: PathBuf = live.path().join("broker.pem");
    let key: PathBuf = live.path().join("broker.key");
    std::fs::copy(certs.path("server.pem"), &cert).unwrap();
    std::fs::copy(certs.path("server.key"), &key).unwrap();
    let data = TempDir::new().unwrap();
    let namesrv =
        NamesrvProcess::start_with_args(&strs(&listener_args(&certs, "permissive", "server")));
    let broker = BrokerProcess::start(
        data.path(),
        &[
            "--namesrv",
            &namesrv.addr().to_string(),
            "--auto-create-topics",
            "--tls-mode",
            "enforcing",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    let trusts_first = Arc::new(
        shardmq_tls::ClientTlsFiles::new(certs.path("ca.pem"))
            .load()
            .unwrap(),
    );
    let trusts_second = Arc::new(
        shardmq_tls::ClientTlsFiles::new(certs.path("other-ca.pem"))
            .load()
            .unwrap(),
    );
    let handshake = |tls: &shardmq_tls::ClientTls| -> Result<(), rustls::Error> {
        let name = tls.server_name_for("127.0.0.1:1").unwrap();
        let connection = rustls::ClientConnection::new(tls.config(), name).unwrap();
        let socket = TcpStream::connect(broker.addr()).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut stream = rustls::StreamOwned::new(connection, socket);
        while stream.conn.is_handshaking() {
            stream.conn.complete_io(&mut stream.sock).map_err(|error| {
                match error.into_inner() {
                    Some(inner) => match inner.downcast::<rustls::Error>() {
                        Ok(tls_error) => *tls_error,
                        Err(other) => rustls::Error::General(other.to_string()),
                    },
                    None => rustls::Error::General("i/o".into()),
                }
            })?;
        }
        Ok(())
    };
    handshake(&trusts_first).expect("the first certificate is served");
    assert!(handshake(&trusts_second).is_err());

    // The key first, then the certificate: in between, the pair does not match and the old
    // one stays in use.
    std::fs::copy(certs.path("other-server.key"), &key).unwrap();
    std::fs::copy(certs.path("other-server.pem"), &cert).unwrap();
    shardmq_tests::wait_until(
        Duration::from_secs(10),
        "new connections to get the new certificate",
        || handshake(&trusts_second).ok(),
    );
    assert!(
        handshake(&trusts_first).is_err(),
        "the old certificate is no longer served"
    );
    assert!(
        broker
            .log_lines()
            .iter()
            .any(|line| line.contains("TLS certificate files changed")),
        "the reload is logged"
    );
    // Messages flow through the new certificate (the name server still has the first one).
    let bundle = live.path().join("both-cas.pem");
    let mut pem = std::fs::read(certs.path("ca.pem")).unwrap();
    pem.extend(std::fs::read(certs.path("other-ca.pem")).unwrap());
    std::fs::write(&bundle, pem).unwrap();
    let both = vec!["--tls-ca".to_owned(), bundle.to_str().unwrap().to_owned()];
    round_trip(&namesrv, &both, "Renewed", "renewed-readers", 2);
}

#[test]
fn a_slave_replicates_from_its_master_over_tls() {
    let certs = Certs::make();
    let namesrv =
        NamesrvProcess::start_with_args(&strs(&listener_args(&certs, "permissive", "server")));
    let namesrv_addr = namesrv.addr().to_string();
    let ha = format!("127.0.0.1:{}", shardmq_tests::free_port());
    let mut tls = listener_args(&certs, "enforcing", "server");
    tls.extend(trusting(&certs, "ca"));
    let broker = |dir: &Path, role: &[&str]| {
        let mut args = vec![
            "--namesrv".to_owned(),
            namesrv_addr.clone(),
            "--register-interval-ms".to_owned(),
            "500".to_owned(),
        ];
        args.extend(role.iter().map(|&arg| arg.to_owned()));
        args.extend(tls.iter().cloned());
        BrokerProcess::start(dir, &strs(&args))
    };
    let master_dir = TempDir::new().unwrap();
    let slave_dir = TempDir::new().unwrap();
    // A sync master answers SEND_OK only once its slave holds the message, and its HA port
    // (like its client port) takes TLS only.
    let _master = broker(
        master_dir.path(),
        &[
            "--broker-role",
            "sync-master",
            "--ha-listen",
            &ha,
            "--auto-create-topics",
        ],
    );
    let _slave = broker(
        slave_dir.path(),
        &[
            "--broker-role",
            "slave",
            "--broker-id",
            "1",
            "--ha-master",
            &ha,
        ],
    );
    let client_tls = trusting(&certs, "ca");
    shardmq_tests::wait_until(
        Duration::from_secs(30),
        "a send acknowledged by the master and its slave",
        || {
            let sent = cli(
                &namesrv,
                &client_tls,
                &["send", "Replicated", "--body", "over tls", "--count", "1"],
            );
            String::from_utf8_lossy(&sent.stdout)
                .contains("SEND_OK")
                .then_some(())
        },
    );
}

#[test]
fn the_controller_serves_brokers_and_the_cli_over_tls() {
    let certs = Certs::make();
    let controller_dir = TempDir::new().unwrap();
    let controller = format!("127.0.0.1:{}", shardmq_tests::free_port());
    let mut namesrv_args = listener_args(&certs, "enforcing", "server");
    namesrv_args.extend([
        "--controller".to_owned(),
        "--controller-listen".to_owned(),
        controller.clone(),
        "--controller-data-dir".to_owned(),
        controller_dir.path().to_str().unwrap().to_owned(),
        "--tls-ca".to_owned(),
        certs.path("ca.pem"),
    ]);
    let namesrv = NamesrvProcess::start_with_args(&strs(&namesrv_args));
    let data = TempDir::new().unwrap();
    let mut broker_args = vec![
        "--namesrv".to_owned(),
        namesrv.addr().to_string(),
        "--broker-role".to_owned(),
        "auto".to_owned(),
        "--controller".to_owned(),
        controller.clone(),
        "--broker-id".to_owned(),
        "1".to_owned(),
        "--ha-listen".to_owned(),
        format!("127.0.0.1:{}", shardmq_tests::free_port()),
        "--auto-create-topics".to_owned(),
    ];
    broker_args.extend(listener_args(&certs, "enforcing", "server"));
    broker_args.extend(trusting(&certs, "ca"));
    // A broker in controller mode serves only once the controller (enforcing TLS) told it its
    // role over a heartbeat.
    let _broker = BrokerProcess::start(data.path(), &strs(&broker_args));
    let status = shardmq_tests::wait_until(
        Duration::from_secs(30),
        "the controller to report the broker's group",
        || {
            let output = cli(
                &namesrv,
                &trusting(&certs, "ca"),
                &["controller", "status", "--controller", &controller],
            );
            let text = String::from_utf8_lossy(&output.stdout).into_owned();
            (output.status.success() && text.contains("broker-a")).then_some(text)
        },
    );
    assert!(status.contains("broker-a"), "{status}");
    let plain = cli(
        &namesrv,
        &[],
        &["controller", "status", "--controller", &controller],
    );
    assert!(
        !plain.status.success(),
        "a plain CLI got through to the controller"
    );
    round_trip(
        &namesrv,
        &trusting(&certs, "ca"),
        "Controlled",
        "tls-readers",
        2,
    );
}

/// Access control inside TLS sessions: both servers enforcing TLS and an accounts file; the
/// broker registers with its admin account over TLS, a client with TLS and an account sends and
/// consumes, one with TLS and no account, or a wrong secret, is refused by the account check.
#[test]
fn access_control_is_checked_inside_tls_sessions() {
    let certs = Certs::make();
    let data = TempDir::new().unwrap();
    let acl_file = data.path().join("acl.toml");
    std::fs::write(
        &acl_file,
        r#"
trusted_addresses = ["192.0.2.1"]

[[accounts]]
access_key = "admin-key"
secret_key = "admin-secret"
admin = true
"#,
    )
    .unwrap();
    let acl = acl_file.to_str().unwrap().to_owned();
    let mut namesrv_args = listener_args(&certs, "enforcing", "server");
    namesrv_args.extend(["--acl-file".into(), acl.clone()]);
    let mut broker_args = listener_args(&certs, "enforcing", "server");
    broker_args.extend(trusting(&certs, "ca"));
    broker_args.extend([
        "--acl-file".into(),
        acl,
        "--access-key".into(),
        "admin-key".into(),
        "--secret-key".into(),
        "admin-secret".into(),
    ]);
    let broker_data = data.path().join("broker");
    let (namesrv, _broker) = cluster(&broker_data, &namesrv_args, &broker_args);

    let with_account = |secret: &str| {
        let mut args = trusting(&certs, "ca");
        args.extend([
            "--access-key".into(),
            "admin-key".into(),
            "--secret-key".into(),
            secret.to_owned(),
        ]);
        args
    };
    round_trip(
        &namesrv,
        &with_account("admin-secret"),
        "Guarded",
        "guarded-readers",
        3,
    );

    let anonymous = cli(&namesrv, &trusting(&certs, "ca"), &["topic", "list"]);
    assert!(
        !anonymous.status.success(),
        "an anonymous TLS client got through"
    );
    let error = stderr_of(&anonymous);
    assert!(error.contains("ACCESS_DENIED"), "{error}");

    let wrong = cli(
        &namesrv,
        &with_account("not-the-secret"),
        &["topic", "list"],
    );
    assert!(!wrong.status.success(), "a wrong secret got through");
    let error = stderr_of(&wrong);
    assert!(error.contains("refused"), "{error}");
}
