//! Access control on the broker's RocketMQ remoting listener (docs/acl.md, "RocketMQ clients
//! (remoting)"), against the real name server and broker started with `--acl-file`, spoken with
//! the `shardmq-remoting` codec over a plain socket: a request without an access key, with a
//! wrong signature, or from an account without the permission is answered NO_PERMISSION naming
//! the account, the resource and the permission, and counted; signed requests the account may
//! make are served; admin codes need the admin flag; a rewritten accounts file takes effect
//! while the broker runs.
//!
//! The requests are signed here with an implementation of RocketMQ's `AclClientRPCHook` of this
//! file's own (HMAC-SHA1 written out below), so the broker is checked against a signer that
//! shares no code with it. No address is trusted: 127.0.0.1 must prove who it is.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use shardmq_remoting::codes::{request, response};
use shardmq_remoting::{encode_properties, RemotingCommand};
use shardmq_tests::{http_get_body, wait_until, LocalCluster, RemotingClient};
use tempfile::TempDir;

const TOPIC: &str = "AclOrders";
/// The producer account may only subscribe to this one.
const READ_ONLY_TOPIC: &str = "AclAudit";
const GROUP: &str = "AclGroup";

const APP_KEY: &str = "orders-app";
const APP_SECRET: &str = "orders-secret";
const ADMIN_KEY: &str = "admin-app";
const ADMIN_SECRET: &str = "admin-secret";

/// How long a rewritten accounts file may take to apply: the broker polls it every 500 ms.
const RELOAD_DEADLINE: Duration = Duration::from_secs(3);

/// The accounts file, with `orders-app`'s permission on [`TOPIC`]. Its trusted list names an
/// address that is not loopback, so nothing here passes unchecked.
fn acl_toml(orders_perm: &str) -> String {
    format!(
        r#"
trusted_addresses = ["10.255.255.254"]

[[accounts]]
access_key = "{APP_KEY}"
secret_key = "{APP_SECRET}"
default_topic_perm = "DENY"
default_group_perm = "DENY"
topic_perms = {{ {TOPIC} = "{orders_perm}", {READ_ONLY_TOPIC} = "SUB" }}
group_perms = {{ {GROUP} = "SUB" }}

[[accounts]]
access_key = "{ADMIN_KEY}"
secret_key = "{ADMIN_SECRET}"
admin = true
"#
    )
}

fn start(dir: &Path, orders_perm: &str, extra: &[&str]) -> (LocalCluster, std::path::PathBuf) {
    let acl_file = dir.join("acl.toml");
    std::fs::write(&acl_file, acl_toml(orders_perm)).unwrap();
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let mut args = vec!["--acl-file", acl_file.to_str().unwrap()];
    args.extend_from_slice(extra);
    (LocalCluster::start_with_broker_args(&data, &args), acl_file)
}

// ---- RocketMQ's AclClientRPCHook, written out ----

/// Adds `AccessKey` and a `Signature` the way RocketMQ 4.9's `AclClientRPCHook` does:
/// Base64(HmacSHA1(secret, the values of every ext field but Signature in key order ‖ body)).
fn signed(mut command: RemotingCommand, access_key: &str, secret: &str) -> RemotingCommand {
    command.set_ext("AccessKey", access_key);
    let mut content = Vec::new();
    for (key, value) in &command.ext_fields {
        if key != "Signature" {
            content.extend_from_slice(value.as_bytes());
        }
    }
    content.extend_from_slice(&command.body);
    let signature = base64(&hmac_sha1(secret.as_bytes(), &content));
    command.set_ext("Signature", signature);
    command
}

fn sha1(data: &[u8]) -> [u8; 20] {
    let mut state: [u32; 5] = [
        0x6745_2301,
        0xEFCD_AB89,
        0x98BA_DCFE,
        0x1032_5476,
        0xC3D2_E1F0,
    ];
    let mut message = data.to_vec();
    message.push(0x80);
    while message.len() % 64 != 56 {
        message.push(0);
    }
    message.extend_from_slice(&(data.len() as u64 * 8).to_be_bytes());
    for block in message.chunks(64) {
        let mut words = [0u32; 80];
        for (i, word) in block.chunks(4).enumerate() {
            words[i] = u32::from_be_bytes(word.try_into().unwrap());
        }
        for i in 16..80 {
            words[i] = (words[i - 3] ^ words[i - 8] ^ words[i - 14] ^ words[i - 16]).rotate_left(1);
        }
        let [mut a, mut b, mut c, mut d, mut e] = state;
        for (i, word) in words.iter().enumerate() {
            let (f, k) = match i {
                0..=19 => ((b & c) | (!b & d), 0x5A82_7999),
                20..=39 => (b ^ c ^ d, 0x6ED9_EBA1),
                40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1B_BCDC),
                _ => (b ^ c ^ d, 0xCA62_C1D6),
            };
            let next = a
                .rotate_left(5)
                .wrapping_add(f)
                .wrapping_add(e)
                .wrapping_add(k)
                .wrapping_add(*word);
            (e, d, c, b, a) = (d, c, b.rotate_left(30), a, next);
        }
        for (held, added) in state.iter_mut().zip([a, b, c, d, e]) {
            *held = held.wrapping_add(added);
        }
    }
    let mut digest = [0u8; 20];
    for (bytes, word) in digest.chunks_mut(4).zip(state) {
        bytes.copy_from_slice(&word.to_be_bytes());
    }
    digest
}

fn hmac_sha1(key: &[u8], message: &[u8]) -> [u8; 20] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..20].copy_from_slice(&sha1(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let inner: Vec<u8> = block
        .iter()
        .map(|b| b ^ 0x36)
        .chain(message.iter().copied())
        .collect();
    let outer: Vec<u8> = block.iter().map(|b| b ^ 0x5c).chain(sha1(&inner)).collect();
    sha1(&outer)
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut text = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                text.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                text.push('=');
            }
        }
    }
    text
}

#[test]
fn the_test_signer_is_rocketmq_s() {
    // RocketMQ's AclSignerTest.calSignatureTest: "RocketMQ" signed with "12345678".
    assert_eq!(
        base64(&hmac_sha1(b"12345678", b"RocketMQ")),
        "IUc8rrO/0gDch8CjObLQsW2rsiA="
    );
    // rocketmq-auth's runtime test: a send by "alice" to "topic-a" signs "alicetopic-a".
    let command = signed(
        RemotingCommand::request(request::SEND_MESSAGE, 0).with_ext("topic", "topic-a"),
        "alice",
        "secret",
    );
    assert_eq!(
        command.ext("Signature"),
        Some("3yomro7y0WqWcbV+9tQa4av5w3Q=")
    );
}

// ---- requests ----

fn send(topic: &str, body: &'static [u8]) -> RemotingCommand {
    let mut properties = BytesMut::new();
    encode_properties([("TAGS", "a")], &mut properties).unwrap();
    RemotingCommand::request(request::SEND_MESSAGE_V2, 0)
        .with_ext("a", "AclProducers")
        .with_ext("b", topic)
        .with_ext("c", "TBW102")
        .with_ext("d", "1")
        .with_ext("e", "0")
        .with_ext("f", "0")
        .with_ext("g", "1700000000000")
        .with_ext("h", "0")
        .with_ext("i", String::from_utf8(properties.to_vec()).unwrap())
        .with_body(Bytes::from_static(body))
}

fn pull(topic: &str, group: &str) -> RemotingCommand {
    RemotingCommand::request(request::PULL_MESSAGE, 0)
        .with_ext("consumerGroup", group)
        .with_ext("topic", topic)
        .with_ext("queueId", "0")
        .with_ext("queueOffset", "0")
        .with_ext("maxMsgNums", "32")
        .with_ext("sysFlag", "0")
        .with_ext("commitOffset", "0")
        .with_ext("suspendTimeoutMillis", "0")
        .with_ext("subVersion", "0")
}

fn create_topic(topic: &str) -> RemotingCommand {
    RemotingCommand::request(request::UPDATE_AND_CREATE_TOPIC, 0)
        .with_ext("topic", topic)
        .with_ext("defaultTopic", "TBW102")
        .with_ext("readQueueNums", "1")
        .with_ext("writeQueueNums", "1")
        .with_ext("perm", "6")
}

fn heartbeat(group: &str, topic: &str) -> RemotingCommand {
    let body = format!(
        r#"{{"clientID":"127.0.0.1@acl-test","producerDataSet":[],
        "consumerDataSet":[{{"groupName":"{group}","consumeType":"CONSUME_ACTIVELY",
        "messageModel":"CLUSTERING","consumeFromWhere":"CONSUME_FROM_FIRST_OFFSET",
        "unitMode":false,"subscriptionDataSet":[{{"topic":"{topic}","subString":"*"}}]}}]}}"#
    );
    RemotingCommand::request(request::HEART_BEAT, 0).with_body(Bytes::from(body))
}

fn remark(answer: &RemotingCommand) -> &str {
    answer.remark.as_deref().unwrap_or_default()
}

#[track_caller]
fn assert_refused(answer: &RemotingCommand, words: &[&str]) {
    assert_eq!(
        answer.code,
        response::NO_PERMISSION,
        "refused with NO_PERMISSION: {:?}",
        answer.remark
    );
    for word in words {
        assert!(
            remark(answer).contains(word),
            "the remark {:?} names {word:?}",
            answer.remark
        );
    }
}

#[track_caller]
fn assert_success(answer: &RemotingCommand) {
    assert_eq!(answer.code, response::SUCCESS, "{:?}", answer.remark);
}

/// The metrics address the broker logged.
fn metrics_addr(cluster: &LocalCluster) -> SocketAddr {
    wait_until(
        Duration::from_secs(10),
        "the metrics address in the log",
        || {
            cluster.broker.all_log_lines().iter().find_map(|line| {
                let start =
                    line.find("metrics served at http://")? + "metrics served at http://".len();
                let end = line[start..].find("/metrics")? + start;
                line[start..end].parse().ok()
            })
        },
    )
}

/// `shardmq_access_denied_total` for one request kind and reason.
fn denied_count(metrics: &str, kind: &str, reason: &str) -> u64 {
    let labels = [
        format!("request=\"{kind}\""),
        format!("reason=\"{reason}\""),
    ];
    metrics
        .lines()
        .filter(|line| line.contains("access_denied") && !line.starts_with('#'))
        .filter(|line| labels.iter().all(|label| line.contains(label.as_str())))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[test]
fn remoting_requests_are_signed_and_authorized_per_account() {
    let dir = TempDir::new().unwrap();
    let (cluster, _acl_file) = start(dir.path(), "PUB|SUB", &["--metrics-listen", "127.0.0.1:0"]);
    let mut client = RemotingClient::connect(&cluster.broker_addr());

    // Admin calls need the admin flag; the admin account creates the topics.
    let by_app = client.call(signed(create_topic(TOPIC), APP_KEY, APP_SECRET));
    assert_refused(&by_app, &[APP_KEY, "admin"]);
    for topic in [TOPIC, READ_ONLY_TOPIC] {
        assert_success(&client.call(signed(create_topic(topic), ADMIN_KEY, ADMIN_SECRET)));
    }
    let delete = RemotingCommand::request(request::DELETE_TOPIC_IN_BROKER, 0)
        .with_ext("topic", READ_ONLY_TOPIC);
    assert_refused(
        &client.call(signed(delete, APP_KEY, APP_SECRET)),
        &[APP_KEY, "admin"],
    );

    // No access key: refused, naming the address that is not trusted.
    let anonymous = client.call(send(TOPIC, b"anonymous"));
    assert_refused(&anonymous, &["no access key", "127.0.0.1"]);
    // An unknown access key, and a signature made with another secret.
    let stranger = client.call(signed(send(TOPIC, b"stranger"), "nobody-app", APP_SECRET));
    assert_refused(&stranger, &["nobody-app"]);
    let forged = client.call(signed(send(TOPIC, b"forged"), APP_KEY, "not-the-secret"));
    assert_refused(&forged, &[APP_KEY, "signature"]);
    // A signed request changed after signing (another body) fails the same way.
    let mut tampered = signed(send(TOPIC, b"tampered"), APP_KEY, APP_SECRET);
    tampered.body = Bytes::from_static(b"tampereD");
    assert_refused(&client.call(tampered), &[APP_KEY, "signature"]);

    // A topic the account may only subscribe to: no PUB.
    let read_only = client.call(signed(send(READ_ONLY_TOPIC, b"x"), APP_KEY, APP_SECRET));
    assert_refused(
        &read_only,
        &[
            &format!("{APP_KEY:?}"),
            &format!("topic {READ_ONLY_TOPIC:?}"),
            "lacks PUB",
        ],
    );

    // Signed and allowed: a send and the pull that reads it back.
    let sent = client.call(signed(send(TOPIC, b"signed body"), APP_KEY, APP_SECRET));
    assert_success(&sent);
    let pulled = client.call(signed(pull(TOPIC, GROUP), APP_KEY, APP_SECRET));
    assert_success(&pulled);
    assert!(
        pulled.body.windows(11).any(|w| w == b"signed body"),
        "the pull returns the signed send"
    );
    // A pull for a group the account holds nothing on.
    let other_group = client.call(signed(pull(TOPIC, "OtherGroup"), APP_KEY, APP_SECRET));
    assert_refused(&other_group, &[APP_KEY, "group \"OtherGroup\"", "SUB"]);

    // A heartbeat needs SUB on each consumer group and subscribed topic (its JSON body).
    assert_success(&client.call(signed(heartbeat(GROUP, TOPIC), APP_KEY, APP_SECRET)));
    let foreign = client.call(signed(heartbeat("OtherGroup", TOPIC), APP_KEY, APP_SECRET));
    assert_refused(&foreign, &["group \"OtherGroup\""]);
    // Consumer offsets: SUB on the group and the topic.
    let query = RemotingCommand::request(request::QUERY_CONSUMER_OFFSET, 0)
        .with_ext("consumerGroup", GROUP)
        .with_ext("topic", TOPIC)
        .with_ext("queueId", "0");
    let queried = client.call(signed(query, APP_KEY, APP_SECRET));
    assert_ne!(
        queried.code,
        response::NO_PERMISSION,
        "{:?}",
        queried.remark
    );

    // The connection still serves after every refusal, and each refusal was counted.
    let metrics = http_get_body(metrics_addr(&cluster), "/metrics");
    assert_eq!(
        denied_count(&metrics, "SEND_MESSAGE_V2", "no_credentials"),
        1,
        "{metrics}"
    );
    assert_eq!(
        denied_count(&metrics, "SEND_MESSAGE_V2", "signature"),
        2,
        "{metrics}"
    );
    assert_eq!(
        denied_count(&metrics, "SEND_MESSAGE_V2", "unknown_account"),
        1,
        "{metrics}"
    );
    assert_eq!(
        denied_count(&metrics, "SEND_MESSAGE_V2", "permission"),
        1,
        "{metrics}"
    );
    assert_eq!(
        denied_count(&metrics, "UPDATE_AND_CREATE_TOPIC", "not_admin"),
        1,
        "{metrics}"
    );
    assert_eq!(
        denied_count(&metrics, "DELETE_TOPIC_IN_BROKER", "not_admin"),
        1,
        "{metrics}"
    );
}

#[test]
fn a_rewritten_accounts_file_applies_to_remoting_requests_while_the_broker_runs() {
    let dir = TempDir::new().unwrap();
    let (cluster, acl_file) = start(dir.path(), "SUB", &[]);
    let mut client = RemotingClient::connect(&cluster.broker_addr());
    assert_success(&client.call(signed(create_topic(TOPIC), ADMIN_KEY, ADMIN_SECRET)));
    let refused = client.call(signed(send(TOPIC, b"before"), APP_KEY, APP_SECRET));
    assert_refused(
        &refused,
        &[APP_KEY, &format!("topic {TOPIC:?}"), "lacks PUB"],
    );

    // Granted: the same signed send is stored once the broker has read the file again.
    std::fs::write(&acl_file, acl_toml("PUB|SUB")).unwrap();
    let written = Instant::now();
    let mut answer = client.call(signed(send(TOPIC, b"after"), APP_KEY, APP_SECRET));
    while answer.code == response::NO_PERMISSION && written.elapsed() < RELOAD_DEADLINE {
        std::thread::sleep(Duration::from_millis(50));
        answer = client.call(signed(send(TOPIC, b"after"), APP_KEY, APP_SECRET));
    }
    assert_success(&answer);

    // Revoked again: refused within the same bound.
    std::fs::write(&acl_file, acl_toml("DENY")).unwrap();
    let written = Instant::now();
    let mut answer = client.call(signed(send(TOPIC, b"revoked"), APP_KEY, APP_SECRET));
    while answer.code == response::SUCCESS && written.elapsed() < RELOAD_DEADLINE {
        std::thread::sleep(Duration::from_millis(50));
        answer = client.call(signed(send(TOPIC, b"revoked"), APP_KEY, APP_SECRET));
    }
    assert_refused(&answer, &[APP_KEY, "lacks PUB", "DENY"]);
}
