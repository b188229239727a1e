//! Throughput of RocketMQ's Rust client (`rocketmq-client-rust` 1.0.0) against a running
//! ShardMQ cluster, for the comparison with ShardMQ's own client in `docs/performance.md`
//! ("RocketMQ remoting"): one producer sending 1 KiB messages one call at a time, singly
//! (SEND_MESSAGE) or in batches (SEND_BATCH_MESSAGE), or one push consumer draining a topic
//! from its first offset. Prints one JSON line: messages, seconds, msgs/s, MiB/s of bodies and
//! the client process's CPU per message (user + system, from `getrusage`).
//!
//! ```sh
//! cargo run --release --example remoting_perf -- produce NAMESRV TOPIC MESSAGES BATCH
//! cargo run --release --example remoting_perf -- consume NAMESRV TOPIC MESSAGES
//! ```
//! (from `compat/`; the topic must exist, e.g. `shardmq topic create TOPIC --queues 1`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rocketmq_client_rust::{
    ClientResult, ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus, DefaultMQProducer,
    DefaultMQPushConsumer, MQPushConsumer,
};
use rocketmq_model::common::consumer::consume_from_where::ConsumeFromWhere;
use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_model::common::message::message_single::Message;
use shardmq_compat::client::{ClientHost, SerializeType};

const BODY_BYTES: usize = 1024;

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

fn report(mode: &str, messages: u64, elapsed: Duration, cpu: f64) {
    let seconds = elapsed.as_secs_f64();
    println!(
        "{{\"client\":\"rocketmq-client-rust\",\"mode\":\"{mode}\",\"messages\":{messages},\"seconds\":{seconds:.3},\"msgs_per_sec\":{:.0},\"mib_per_sec\":{:.1},\"client_cpu_us_per_msg\":{:.3}}}",
        messages as f64 / seconds,
        messages as f64 * BODY_BYTES as f64 / seconds / (1 << 20) as f64,
        cpu * 1e6 / messages as f64
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: remoting_perf produce NAMESRV TOPIC MESSAGES BATCH | consume NAMESRV TOPIC MESSAGES";
    let (mode, namesrv, topic) = match args.get(1..4) {
        Some([mode, namesrv, topic]) => (mode.as_str(), namesrv.clone(), topic.clone()),
        _ => panic!("{usage}"),
    };
    let messages: u64 = args.get(4).and_then(|n| n.parse().ok()).expect(usage);
    let host = ClientHost::start("remoting-perf", SerializeType::JSON);
    match mode {
        "produce" => {
            let batch: u64 = args.get(5).and_then(|n| n.parse().ok()).expect(usage);
            produce(&host, &namesrv, &topic, messages, batch.max(1));
        }
        "consume" => consume(&host, &namesrv, &topic, messages),
        _ => panic!("{usage}"),
    }
}

fn produce(host: &Arc<ClientHost>, namesrv: &str, topic: &str, messages: u64, batch: u64) {
    let mut producer = DefaultMQProducer::builder(host.client_runtime())
        .producer_group("remoting-perf")
        .name_server_addr(namesrv)
        .send_msg_timeout(10_000)
        .build();
    host.call("starting the producer", producer.start())
        .expect("the producer starts");
    let body = vec![b'x'; BODY_BYTES];
    let message = || {
        Message::builder()
            .topic(topic)
            .body_slice(&body)
            .build_unchecked()
    };
    // One warm-up call: routes, connection, heartbeat.
    host.call("warming up", producer.send(message()))
        .expect("the warm-up send");
    let (started, cpu) = (Instant::now(), cpu_seconds());
    let mut sent = 0;
    while sent < messages {
        if batch == 1 {
            host.call("sending", producer.send(message()))
                .expect("a send");
        } else {
            let messages: Vec<Message> = (0..batch).map(|_| message()).collect();
            host.call("sending a batch", producer.send_batch(messages))
                .expect("a batch send");
        }
        sent += batch;
    }
    report(
        if batch == 1 {
            "produce-sync"
        } else {
            "produce-batch"
        },
        sent,
        started.elapsed(),
        cpu_seconds() - cpu,
    );
    host.shut_down("producer", async move { producer.shutdown().await });
}

/// Messages per pull of the consumer: `REMOTING_PERF_PULL_BATCH`, RocketMQ's 32 by default.
fn pull_batch() -> u32 {
    std::env::var("REMOTING_PERF_PULL_BATCH")
        .ok()
        .and_then(|batch| batch.parse().ok())
        .unwrap_or(32)
}

fn consume(host: &Arc<ClientHost>, namesrv: &str, topic: &str, messages: u64) {
    let received = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&received);
    let mut consumer = DefaultMQPushConsumer::builder(host.client_runtime())
        .consumer_group(format!("remoting-perf-{}", std::process::id()))
        .name_server_addr(namesrv)
        .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
        // The client's default hands each message to its own blocking task; a listener call
        // per pulled batch is what a draining application would choose.
        .consume_message_batch_max_size(32)
        // RocketMQ's defaults pull 32 messages (256 KiB) at a time; ShardMQ's own push
        // consumer pulls 1024 (1 MiB). REMOTING_PERF_PULL_BATCH sets it to compare at equal
        // batches.
        .pull_batch_size(pull_batch())
        .pull_batch_size_in_bytes(pull_batch() * 1024)
        .pull_threshold_for_queue(pull_batch().max(1000) * 2)
        .build();
    host.call("subscribing", consumer.subscribe(topic, "*"))
        .expect("the subscription");
    consumer.register_message_listener_concurrently(
        move |batch: &[&MessageExt],
              _context: &ConsumeConcurrentlyContext|
              -> ClientResult<ConsumeConcurrentlyStatus> {
            counter.fetch_add(batch.len() as u64, Ordering::Relaxed);
            Ok(ConsumeConcurrentlyStatus::ConsumeSuccess)
        },
    );
    let (started, cpu) = (Instant::now(), cpu_seconds());
    host.call("starting the consumer", consumer.start())
        .expect("the consumer starts");
    while received.load(Ordering::Relaxed) < messages {
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "received {} of {messages} in 600 s",
            received.load(Ordering::Relaxed)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    report(
        "consume",
        received.load(Ordering::Relaxed),
        started.elapsed(),
        cpu_seconds() - cpu,
    );
    host.shut_down("consumer", async move { consumer.shutdown().await });
}
