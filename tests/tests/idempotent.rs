//! Idempotent consumption against a real namesrv, broker and Redis: a message whose listener
//! failed is processed successfully once after its redelivery (concurrent and orderly); a
//! broker resend of the same message (same unique id, or same key) reaches the listener once;
//! two consumers racing on one message process it once; a consumer process killed (SIGKILL)
//! mid-processing leaves a claim that expires, after which another consumer processes the
//! message once; with Redis down a message fails for retry with an error naming the server,
//! and is processed once Redis is back, never skipped.
//!
//! Each test starts its own `redis-server` (Debian's package; `scripts/setup.sh` installs it)
//! on a free loopback port with persistence off and a temp dir, and kills it at the end. The
//! killed-consumer test runs the client's `idempotent_consumer` example as the child process.
//!
//! Needs the binaries: `cargo build --workspace --bins --examples` first (`cargo test
//! --workspace` builds the examples too).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shardmq_client::{
    ClaimOutcome, ClaimStore, ConsumeFrom, ConsumeResult, DedupKey, Idempotent, IdempotentStats,
    Message, MessageExt, Producer, PushConsumer, PushConsumerBuilder, RedisStore,
};
use shardmq_tests::LocalCluster;
use tempfile::TempDir;

/// How long a test waits for consumers to settle or messages to arrive.
const WAIT: Duration = Duration::from_secs(30);

/// 18 delay levels of 200 ms: a sent-back message returns after 200 ms, not RocketMQ's 10 s.
const DELAY_LEVELS: &str = "200ms 200ms 200ms 200ms 200ms 200ms 200ms 200ms 200ms 200ms 200ms \
                            200ms 200ms 200ms 200ms 200ms 200ms 200ms";

// ---------------------------------------------------------------------------------------------
// A redis-server of the test's own

/// A `redis-server` child on a loopback port, persistence off, killed on drop.
struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: TempDir,
}

impl RedisServer {
    fn start() -> Self {
        let dir = TempDir::new().expect("temp dir");
        for _ in 0..5 {
            let port = free_port();
            if let Some(child) = spawn_redis(port, &dir) {
                return Self {
                    child: Some(child),
                    port,
                    dir,
                };
            }
        }
        panic!("redis-server did not start on a free loopback port in 5 attempts");
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL: what a crashed Redis looks like to its clients).
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, empty.
    fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(child) = spawn_redis(self.port, &self.dir) {
                self.child = Some(child);
                return;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not restart on port {}",
                self.port
            );
        }
    }

    /// `GET key`.
    fn get(&self, key: &str) -> Option<String> {
        match self.command(&["GET", key]) {
            Reply::Bulk(value) => value,
            other => panic!("GET {key} answered {other:?}"),
        }
    }

    /// `PTTL key`: ms left, -2 when the key is absent.
    fn pttl(&self, key: &str) -> i64 {
        match self.command(&["PTTL", key]) {
            Reply::Integer(ms) => ms,
            other => panic!("PTTL {key} answered {other:?}"),
        }
    }

    /// One command over RESP on a fresh connection.
    fn command(&self, arguments: &[&str]) -> Reply {
        let mut stream =
            TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).expect("connect to redis");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut request = format!("*{}\r\n", arguments.len());
        for argument in arguments {
            request.push_str(&format!("${}\r\n{argument}\r\n", argument.len()));
        }
        stream
            .write_all(request.as_bytes())
            .expect("write to redis");
        read_reply(&mut BufReader::new(stream))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

#[derive(Debug)]
enum Reply {
    Simple(String),
    Integer(i64),
    Bulk(Option<String>),
}

fn read_reply(reader: &mut impl BufRead) -> Reply {
    let mut line = String::new();
    reader.read_line(&mut line).expect("read from redis");
    let line = line.trim_end();
    let (kind, rest) = line.split_at(1);
    match kind {
        "+" => Reply::Simple(rest.to_owned()),
        ":" => Reply::Integer(rest.parse().expect("an integer reply")),
        "$" => {
            let length: i64 = rest.parse().expect("a bulk length");
            if length < 0 {
                return Reply::Bulk(None);
            }
            let mut value = vec![0; length as usize + 2];
            reader.read_exact(&mut value).expect("a bulk reply");
            value.truncate(length as usize);
            Reply::Bulk(Some(String::from_utf8(value).expect("UTF-8")))
        }
        _ => panic!("redis answered {line:?}"),
    }
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port")
        .port()
}

/// Starts redis-server on `port` and waits for its PONG; `None` when it exits first (the
/// port was taken meanwhile).
fn spawn_redis(port: u16, dir: &TempDir) -> Option<Child> {
    let log = std::fs::File::create(dir.path().join(format!("redis-{port}.log"))).unwrap();
    let mut child = Command::new(redis_server())
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .arg("--dir")
        .arg(dir.path())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start redis-server");
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if child.try_wait().expect("poll redis-server").is_some() {
            return None;
        }
        if is_ponging(port) {
            return Some(child);
        }
        // Polling a starting process.
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

fn is_ponging(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    matches!(read_reply_checked(&mut BufReader::new(stream)), Some(Reply::Simple(pong)) if pong == "PONG")
}

fn read_reply_checked(reader: &mut impl BufRead) -> Option<Reply> {
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    line.strip_prefix('+')
        .map(|pong| Reply::Simple(pong.trim_end().to_owned()))
}

fn redis_server() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("redis-server"))
            .find(|path| path.is_file())
    });
    found.unwrap_or_else(|| {
        panic!("redis-server is not installed; `scripts/setup.sh` (apt-get install redis-server) installs it")
    })
}

// ---------------------------------------------------------------------------------------------
// The cluster, consumers and listeners

struct Setup {
    cluster: LocalCluster,
    _data: TempDir,
}

fn cluster_with_topic(topic: &str, queues: u32) -> Setup {
    let data = TempDir::new().expect("temp dir");
    let cluster =
        LocalCluster::start_with_broker_args(data.path(), &["--delay-levels", DELAY_LEVELS]);
    cluster.create_topic(topic, queues);
    Setup {
        cluster,
        _data: data,
    }
}

async fn eventually<F: FnMut() -> Fut, Fut: std::future::Future<Output = bool>>(
    what: &str,
    check: F,
) {
    shardmq_tests::eventually(WAIT, what, check).await;
}

fn consumer(setup: &Setup, group: &str, instance: &str, topic: &str) -> PushConsumerBuilder {
    PushConsumer::builder()
        .namesrv(setup.cluster.namesrv_addr())
        .group(group)
        .instance_name(instance)
        .subscribe(topic, "*")
        .consume_from(ConsumeFrom::FirstOffset)
        .reconsume_delay(Duration::from_millis(200))
        .orderly_suspend(Duration::from_millis(200))
        .persist_interval(Duration::from_millis(100))
        // A message retried while Redis is down must not reach the dead letters in the test.
        .max_reconsume_times(1000)
}

async fn producer(setup: &Setup) -> Producer {
    Producer::builder()
        .namesrv(setup.cluster.namesrv_addr())
        .build()
        .await
        .expect("producer")
}

async fn wrapper(redis: &RedisServer, group: &str) -> Idempotent {
    let store = RedisStore::connect(&redis.url())
        .await
        .expect("redis store");
    Idempotent::builder(store)
        .group(group)
        .build()
        .expect("wrapper")
}

fn body_of(message: &MessageExt) -> String {
    String::from_utf8_lossy(&message.body).into_owned()
}

/// Listener calls per message body: every call, and the successful ones.
#[derive(Clone, Default)]
struct Calls {
    attempts: Arc<Mutex<BTreeMap<String, u32>>>,
    successes: Arc<Mutex<Vec<String>>>,
}

impl Calls {
    /// Records a call of `message`; returns how many calls it has had, this one included.
    fn attempt(&self, message: &MessageExt) -> u32 {
        let mut attempts = self.attempts.lock().unwrap();
        let count = attempts.entry(body_of(message)).or_default();
        *count += 1;
        *count
    }

    fn succeed(&self, message: &MessageExt) {
        self.successes.lock().unwrap().push(body_of(message));
    }

    fn attempts_of(&self, body: &str) -> u32 {
        self.attempts
            .lock()
            .unwrap()
            .get(body)
            .copied()
            .unwrap_or(0)
    }

    fn successes(&self) -> Vec<String> {
        self.successes.lock().unwrap().clone()
    }
}

/// A listener that fails the first call of a message whose body starts with `fragile`.
fn failing_once(
    calls: &Calls,
) -> impl Fn(Vec<MessageExt>) -> std::future::Ready<ConsumeResult> + Send + Sync + 'static {
    let calls = calls.clone();
    move |messages| {
        for message in &messages {
            let attempt = calls.attempt(message);
            if body_of(message).starts_with("fragile") && attempt == 1 {
                return std::future::ready(ConsumeResult::ReconsumeLater);
            }
        }
        for message in &messages {
            calls.succeed(message);
        }
        std::future::ready(ConsumeResult::Success)
    }
}

fn sorted(mut bodies: Vec<String>) -> Vec<String> {
    bodies.sort();
    bodies
}

// ---------------------------------------------------------------------------------------------
// The tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_store_changes_only_its_own_claims() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url())
        .await
        .expect("redis store");
    let short = Duration::from_secs(5);
    let long = Duration::from_secs(60);
    let key = "g:t:k";
    assert_eq!(
        store.claim(key, "a", short).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert_eq!(redis.get(key).as_deref(), Some("processing a"));
    assert!((1..=5000).contains(&redis.pttl(key)));
    assert_eq!(
        store.claim(key, "b", short).await.unwrap(),
        ClaimOutcome::HeldByAnother("processing a".to_owned())
    );
    // Another owner can neither extend, nor release, nor complete it.
    assert!(!store.extend(key, "b", long).await.unwrap());
    assert!(!store.release(key, "b").await.unwrap());
    assert!(!store.complete(key, "b", long).await.unwrap());
    assert_eq!(redis.get(key).as_deref(), Some("processing a"));
    assert!(redis.pttl(key) <= 5000);
    assert!(store.extend(key, "a", long).await.unwrap());
    assert!(redis.pttl(key) > 5000);
    assert!(store.complete(key, "a", long).await.unwrap());
    assert_eq!(redis.get(key).as_deref(), Some("done a"));
    // Done is final: not released, and found done by every later claim.
    assert!(!store.release(key, "a").await.unwrap());
    assert_eq!(
        store.claim(key, "c", short).await.unwrap(),
        ClaimOutcome::Done
    );

    // An expired claim is free for others, and lost for its owner.
    let expiring = "g:t:expiring";
    let brief = Duration::from_millis(100);
    assert_eq!(
        store.claim(expiring, "a", brief).await.unwrap(),
        ClaimOutcome::Claimed
    );
    eventually("the claim to expire", || async {
        redis.get(expiring).is_none()
    })
    .await;
    assert_eq!(
        store.claim(expiring, "b", short).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert!(!store.extend(expiring, "a", short).await.unwrap());
    assert!(!store.complete(expiring, "a", short).await.unwrap());
    assert!(store.release(expiring, "b").await.unwrap());
    assert_eq!(redis.get(expiring), None);

    // A value no claim store writes counts as held (nothing is overwritten).
    match redis.command(&["SET", "g:t:foreign", "written by someone else"]) {
        Reply::Simple(ok) => assert_eq!(ok, "OK"),
        other => panic!("SET answered {other:?}"),
    }
    assert_eq!(
        store.claim("g:t:foreign", "a", short).await.unwrap(),
        ClaimOutcome::HeldByAnother("written by someone else".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_whose_listener_failed_is_processed_successfully_once_after_redelivery() {
    let redis = RedisServer::start();
    let setup = cluster_with_topic("IdemRetry", 2);
    let idempotent = wrapper(&redis, "idem-retry").await;
    let calls = Calls::default();
    let member = consumer(&setup, "idem-retry", "retrying", "IdemRetry")
        .listen_concurrently(idempotent.wrap(failing_once(&calls)))
        .start()
        .await
        .expect("consumer");
    let producer = producer(&setup).await;
    let mut expected = Vec::new();
    let mut fragile_id = String::new();
    for index in 0..10 {
        let body = if index == 4 {
            "fragile".to_owned()
        } else {
            format!("steady {index}")
        };
        let sent = producer
            .send(Message::new("IdemRetry", body.clone()))
            .await
            .expect("send");
        if index == 4 {
            fragile_id = sent.msg_id.to_string();
        }
        expected.push(body);
    }
    eventually("every message processed", || async {
        idempotent.stats().processed >= 10
    })
    .await;
    // The failed call released its claim; the redelivery (through %RETRY%) claimed it anew.
    assert_eq!(calls.attempts_of("fragile"), 2);
    assert_eq!(sorted(calls.successes()), sorted(expected));
    let stats = idempotent.stats();
    assert_eq!(
        (
            stats.claimed,
            stats.failed,
            stats.processed,
            stats.claims_lost
        ),
        (11, 1, 10, 0),
        "{stats:?}"
    );
    let key = format!("idem-retry:IdemRetry:{fragile_id}");
    let claim = redis.get(&key).expect("the claim is kept");
    assert!(claim.starts_with("done "), "{claim}");
    // Kept for the done expiry (1 h), not the processing one (30 s).
    assert!(redis.pttl(&key) > 60_000, "{}", redis.pttl(&key));
    member.shutdown().await;
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orderly_listener_that_failed_processes_the_message_once_in_order() {
    let redis = RedisServer::start();
    let setup = cluster_with_topic("IdemOrdered", 1);
    let idempotent = wrapper(&redis, "idem-ordered").await;
    let calls = Calls::default();
    let member = consumer(&setup, "idem-ordered", "ordered", "IdemOrdered")
        .listen_orderly(idempotent.wrap(failing_once(&calls)))
        .start()
        .await
        .expect("consumer");
    let producer = producer(&setup).await;
    let bodies: Vec<String> = (0..6)
        .map(|index| {
            if index == 2 {
                "fragile step 2".to_owned()
            } else {
                format!("step {index}")
            }
        })
        .collect();
    for body in &bodies {
        producer
            .send_ordered(Message::new("IdemOrdered", body.clone()), "order-1")
            .await
            .expect("send");
    }
    eventually("every step processed", || async {
        idempotent.stats().processed >= 6
    })
    .await;
    assert_eq!(calls.successes(), bodies, "processed once each, in order");
    assert_eq!(calls.attempts_of("fragile step 2"), 2);
    let stats = idempotent.stats();
    assert_eq!((stats.failed, stats.processed), (1, 6), "{stats:?}");
    member.shutdown().await;
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_message_reaches_the_listener_once_by_unique_id_or_by_key() {
    let redis = RedisServer::start();
    let setup = cluster_with_topic("IdemResend", 2);
    // Two groups on one topic: one deduplicates by unique id, the other by first key.
    let by_id = wrapper(&redis, "idem-by-id").await;
    let store = RedisStore::connect(&redis.url())
        .await
        .expect("redis store");
    let by_key = Idempotent::builder(store)
        .group("idem-by-key")
        .dedup_key(DedupKey::FirstKey)
        .build()
        .expect("wrapper");
    let id_calls = Calls::default();
    let key_calls = Calls::default();
    let id_member = consumer(&setup, "idem-by-id", "by-id", "IdemResend")
        .listen_concurrently(by_id.wrap(failing_once(&id_calls)))
        .start()
        .await
        .expect("consumer");
    let key_member = consumer(&setup, "idem-by-key", "by-key", "IdemResend")
        .listen_concurrently(by_key.wrap(failing_once(&key_calls)))
        .start()
        .await
        .expect("consumer");
    let producer = producer(&setup).await;
    let first = producer
        .send(Message::new("IdemResend", "pay order-42").with_keys(["order-42"]))
        .await
        .expect("send");
    // The same message again under its id (a producer retry after a lost answer, or a
    // resend from the console), then a new message for the same order, then another order.
    producer
        .send(
            Message::new("IdemResend", "pay order-42 (resent)")
                .with_keys(["order-42"])
                .with_unique_id(&first.msg_id),
        )
        .await
        .expect("resend");
    producer
        .send(Message::new("IdemResend", "pay order-42 (new id)").with_keys(["order-42"]))
        .await
        .expect("send");
    producer
        .send(Message::new("IdemResend", "pay order-43").with_keys(["order-43"]))
        .await
        .expect("send");
    let settled = |stats: IdempotentStats| stats.processed + stats.duplicates_skipped >= 4;
    eventually("both groups to see all four messages", || async {
        settled(by_id.stats()) && settled(by_key.stats())
    })
    .await;
    let id_stats = by_id.stats();
    assert_eq!(
        (id_stats.processed, id_stats.duplicates_skipped),
        (3, 1),
        "{id_stats:?}"
    );
    // The original or its resend (whichever was claimed first), not both.
    let id_successes = id_calls.successes();
    assert_eq!(id_successes.len(), 3, "{id_successes:?}");
    let copies = id_successes
        .iter()
        .filter(|body| body.as_str() == "pay order-42" || body.as_str() == "pay order-42 (resent)")
        .count();
    assert_eq!(copies, 1, "{id_successes:?}");
    let key_stats = by_key.stats();
    assert_eq!(
        (key_stats.processed, key_stats.duplicates_skipped),
        (2, 2),
        "{key_stats:?}"
    );
    // One of the three order-42 messages (whichever was claimed first: the listener calls
    // run concurrently) and order-43.
    let key_successes = sorted(key_calls.successes());
    assert_eq!(key_successes.len(), 2, "{key_successes:?}");
    assert!(
        key_successes[0].starts_with("pay order-42"),
        "{key_successes:?}"
    );
    assert_eq!(key_successes[1], "pay order-43");
    assert!(redis
        .get("idem-by-key:IdemResend:order-42")
        .is_some_and(|claim| claim.starts_with("done ")));
    id_member.shutdown().await;
    key_member.shutdown().await;
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumers_racing_on_one_message_process_it_once() {
    let redis = RedisServer::start();
    let setup = cluster_with_topic("IdemRace", 2);
    // Two members, each with its own connection to Redis, as two processes would have.
    let wrappers = [
        wrapper(&redis, "idem-race").await,
        wrapper(&redis, "idem-race").await,
    ];
    let calls = Calls::default();
    let mut members = Vec::new();
    for (index, idempotent) in wrappers.iter().enumerate() {
        let other = wrappers[1 - index].clone();
        let calls = calls.clone();
        // Holds the contested message until the other member has found it being processed,
        // so the two deliveries overlap for certain.
        let listener = idempotent.wrap(move |messages: Vec<MessageExt>| {
            let other = other.clone();
            let calls = calls.clone();
            async move {
                for message in &messages {
                    calls.attempt(message);
                    let deadline = Instant::now() + WAIT;
                    while other.stats().held_elsewhere == 0 && Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    calls.succeed(message);
                }
                ConsumeResult::Success
            }
        });
        let member = consumer(&setup, "idem-race", &format!("racer-{index}"), "IdemRace")
            .listen_concurrently(listener)
            .start()
            .await
            .expect("consumer");
        members.push(member);
    }
    eventually("a 1/1 split of the two queues", || async {
        members[0].assigned_queues().len() == 1 && members[1].assigned_queues().len() == 1
    })
    .await;
    let producer = producer(&setup).await;
    let queues = producer.write_queues("IdemRace").await.expect("queues");
    assert_eq!(queues.len(), 2);
    // One message stored twice, once in each member's queue (as a producer that retried a
    // send on another queue would store it).
    let first = producer
        .send_to_queue(Message::new("IdemRace", "contested"), &queues[0])
        .await
        .expect("send");
    producer
        .send_to_queue(
            Message::new("IdemRace", "contested").with_unique_id(&first.msg_id),
            &queues[1],
        )
        .await
        .expect("send");
    // The loser leaves its copy for later; its redelivery finds the claim done.
    eventually("the loser's copy skipped as done", || async {
        wrappers[0].stats().duplicates_skipped + wrappers[1].stats().duplicates_skipped >= 1
    })
    .await;
    assert_eq!(calls.attempts_of("contested"), 1);
    assert_eq!(calls.successes(), ["contested"]);
    let total_held = wrappers[0].stats().held_elsewhere + wrappers[1].stats().held_elsewhere;
    let total_processed = wrappers[0].stats().processed + wrappers[1].stats().processed;
    assert!(total_held >= 1, "the deliveries overlapped");
    assert_eq!(total_processed, 1);
    for member in &members {
        member.shutdown().await;
    }
    producer.shutdown().await;
}

/// The example program, consuming as a child process; its stdout lines come on a channel.
struct ExampleConsumer {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl ExampleConsumer {
    fn start(setup: &Setup, redis: &RedisServer, envs: &[(&str, &str)]) -> Self {
        let binary = shardmq_tests::binary_path("examples/idempotent_consumer");
        let mut child = Command::new(binary)
            .env("SHARDMQ_NAMESRV", setup.cluster.namesrv_addr())
            .env("REDIS_URL", redis.url())
            .envs(envs.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the idempotent_consumer example");
        let stdout = child.stdout.take().expect("its stdout");
        let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = lines_tx.send(line);
            }
        });
        Self { child, lines }
    }

    /// The next line starting with `prefix` (earlier lines are skipped).
    fn line_starting(&self, prefix: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return line,
                Ok(_) => {}
                Err(error) => panic!("the example printed no line starting {prefix:?}: {error}"),
            }
        }
    }
}

impl Drop for ExampleConsumer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_mid_processing_leaves_the_message_to_another_once_its_claim_expires() {
    const PROCESSING_TTL_MS: i64 = 1500;
    let redis = RedisServer::start();
    let setup = cluster_with_topic("IdemKilled", 1);
    let mut doomed = ExampleConsumer::start(
        &setup,
        &redis,
        &[
            ("TOPIC", "IdemKilled"),
            ("GROUP", "idem-killed"),
            // Processing one message takes ten minutes: it is killed long before.
            ("WORK_MS", "600000"),
            ("PROCESSING_TTL_MS", &PROCESSING_TTL_MS.to_string()),
        ],
    );
    doomed.line_starting("consuming");
    let producer = producer(&setup).await;
    let sent = producer
        .send(Message::new("IdemKilled", "order-7"))
        .await
        .expect("send");
    let key = format!("idem-killed:IdemKilled:{}", sent.msg_id);
    let processing = doomed.line_starting("processing ");
    assert_eq!(processing, format!("processing {key} order-7"));
    let claim = redis.get(&key).expect("the example's claim");
    assert!(claim.starts_with("processing "), "{claim}");
    // Twice the processing expiry later, the running call still holds its claim (extended).
    let started = Instant::now();
    eventually("two processing expiries to pass", || async {
        started.elapsed() > Duration::from_millis(2 * PROCESSING_TTL_MS as u64)
    })
    .await;
    assert_eq!(redis.get(&key), Some(claim.clone()));
    // The claim expires no sooner than this PTTL after it was asked (extensions only push
    // the expiry later).
    let asked_at = Instant::now();
    let ttl_ms = redis.pttl(&key);
    assert!(ttl_ms > 0 && ttl_ms <= PROCESSING_TTL_MS, "{ttl_ms}");

    // SIGKILL: no shutdown, no release of the claim, no offset commit.
    doomed.child.kill().expect("SIGKILL the example");
    doomed.child.wait().expect("reap it");

    let idempotent = wrapper(&redis, "idem-killed").await;
    let calls = Calls::default();
    let survivor = consumer(&setup, "idem-killed", "survivor", "IdemKilled")
        .listen_concurrently(idempotent.wrap(failing_once(&calls)))
        .start()
        .await
        .expect("consumer");
    eventually("the survivor to process the message", || async {
        idempotent.stats().processed >= 1
    })
    .await;
    // Not before the dead consumer's claim expired.
    assert!(
        asked_at.elapsed() >= Duration::from_millis(ttl_ms.max(0) as u64),
        "processed {:?} after the claim had {ttl_ms} ms left",
        asked_at.elapsed()
    );
    assert_eq!(calls.successes(), ["order-7"]);
    assert_eq!(calls.attempts_of("order-7"), 1);
    let claim = redis.get(&key).expect("the survivor's claim");
    assert!(claim.starts_with("done "), "{claim}");
    survivor.shutdown().await;
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_a_message_fails_for_retry_and_is_processed_once_it_is_back() {
    let mut redis = RedisServer::start();
    let setup = cluster_with_topic("IdemDown", 1);
    let store = RedisStore::connect(&redis.url())
        .await
        .expect("redis store")
        .with_operation_timeout(Duration::from_millis(500));
    let idempotent = Idempotent::builder(store)
        .group("idem-down")
        .build()
        .expect("wrapper");
    let calls = Calls::default();
    let member = consumer(&setup, "idem-down", "down", "IdemDown")
        .listen_concurrently(idempotent.wrap(failing_once(&calls)))
        .start()
        .await
        .expect("consumer");
    eventually("the queue assigned", || async {
        member.assigned_queues().len() == 1
    })
    .await;
    redis.stop();
    let producer = producer(&setup).await;
    producer
        .send(Message::new("IdemDown", "while redis is down"))
        .await
        .expect("send");
    // Failed for retry, redelivered, failed again: never handed to the listener unclaimed.
    eventually("two failed claims", || async {
        idempotent.stats().store_errors >= 2
    })
    .await;
    let error = idempotent.last_store_error().expect("the error kept");
    assert!(
        error.contains(&format!("redis at 127.0.0.1:{} db 0", redis.port))
            && error.contains("claim"),
        "{error}"
    );
    assert!(calls.successes().is_empty());
    assert_eq!(calls.attempts_of("while redis is down"), 0);

    redis.restart();
    eventually("the message processed after Redis is back", || async {
        idempotent.stats().processed >= 1
    })
    .await;
    assert_eq!(calls.successes(), ["while redis is down"]);
    assert_eq!(calls.attempts_of("while redis is down"), 1);
    let stats = idempotent.stats();
    assert_eq!(
        (stats.claimed, stats.processed, stats.processed_unclaimed),
        (1, 1, 0),
        "{stats:?}"
    );
    member.shutdown().await;
    producer.shutdown().await;
}
