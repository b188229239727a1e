//! Measures how late delayed and timer messages become visible: sends `RATE` messages a second
//! for `SECONDS` seconds (half with `deliver_at_ms` = now + `DELAY_MS`, half with delay level
//! `LEVEL`), consumes them with a push consumer, and prints percentiles of
//!
//! - broker lateness: the delivered copy's store time − its due time (due in the real topic), and
//! - consumer lateness: when the listener got it − its due time (includes the pull wake-up).
//!
//! For level messages the due time is taken as the born time + the level's delay, so their
//! figures also hold the send's own latency (an upper bound). Run against a broker started with
//! `--delay-levels` whose level `LEVEL` is `DELAY_MS` (the defaults below match level 2 of
//! `1s 2s 3s`):
//!
//! ```sh
//! cargo run --release --example delay_lateness -- 127.0.0.1:9876 [RATE] [SECONDS] [DELAY_MS] [LEVEL]
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardmq_client::{
    now_ms, Admin, ConsumeFrom, ConsumeResult, Message, MessageExt, Producer, PushConsumer,
    TopicConfig,
};

const TOPIC: &str = "DelayLateness";

mod support;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    support::exit_code(run().await)
}

async fn run() -> shardmq_client::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let namesrv = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "127.0.0.1:9876".into());
    let number = |index: usize, default: u64| {
        args.get(index)
            .and_then(|text| text.parse().ok())
            .unwrap_or(default)
    };
    let rate = number(2, 500);
    let seconds = number(3, 20);
    let delay_ms = number(4, 2_000) as i64;
    let level = number(5, 2) as u32;

    let admin = Admin::builder().namesrv(&namesrv).build().await?;
    admin
        .upsert_topic_in_cluster(None, &TopicConfig::new(TOPIC, 4), false)
        .await?;
    // Wait for the route, and for the broker's network shards to see the topic.
    while admin.route(TOPIC).await.is_err() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    let received: Arc<Mutex<Vec<(MessageExt, i64)>>> = Arc::default();
    let sink = Arc::clone(&received);
    let consumer = PushConsumer::builder()
        .namesrv(&namesrv)
        .group("delay-lateness")
        .subscribe(TOPIC, "*")
        .consume_from(ConsumeFrom::LastOffset)
        .listen_concurrently(move |messages| {
            let sink = Arc::clone(&sink);
            async move {
                let at = now_ms();
                sink.lock()
                    .unwrap()
                    .extend(messages.into_iter().map(|m| (m, at)));
                ConsumeResult::Success
            }
        })
        .start()
        .await?;
    let producer = Producer::builder().namesrv(&namesrv).build().await?;

    let total = rate * seconds;
    let mut due: HashMap<String, (i64, bool)> = HashMap::new();
    let mut ticks = tokio::time::interval(Duration::from_micros(1_000_000 / rate.max(1)));
    for index in 0..total {
        ticks.tick().await;
        let now = now_ms();
        let is_timer = index % 2 == 0;
        let message = Message::new(TOPIC, format!("m{index}"));
        let message = if is_timer {
            message.with_deliver_at_ms(now + delay_ms)
        } else {
            message.with_delay_level(level)
        };
        let sent = producer.send(message).await?;
        due.insert(sent.msg_id.to_string(), (now + delay_ms, is_timer));
    }
    let deadline = now_ms() + delay_ms + 30_000;
    while received.lock().unwrap().len() < total as usize && now_ms() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let received = received.lock().unwrap().clone();
    let mut broker = (Vec::new(), Vec::new());
    let mut consumer_side = (Vec::new(), Vec::new());
    for (message, at) in &received {
        let Some(&(due_ms, is_timer)) = due.get(&message.msg_id()) else {
            continue;
        };
        let (b, c) = if is_timer {
            (&mut broker.0, &mut consumer_side.0)
        } else {
            (&mut broker.1, &mut consumer_side.1)
        };
        b.push(message.store_timestamp_ms - due_ms);
        c.push(at - due_ms);
    }
    println!(
        "sent {total} ({rate}/s for {seconds} s, delay {delay_ms} ms), received {}",
        received.len()
    );
    report("timer, broker (store − due)", &mut broker.0);
    report("timer, consumer (receive − due)", &mut consumer_side.0);
    report("level, broker (store − born − delay)", &mut broker.1);
    report(
        "level, consumer (receive − born − delay)",
        &mut consumer_side.1,
    );
    consumer.shutdown().await;
    producer.shutdown().await;
    admin.shutdown().await;
    Ok(())
}

fn report(what: &str, values: &mut [i64]) {
    if values.is_empty() {
        println!("{what}: none");
        return;
    }
    values.sort_unstable();
    let at = |p: f64| values[((values.len() - 1) as f64 * p).round() as usize];
    println!(
        "{what}: n={} min={} p50={} p90={} p99={} max={} ms",
        values.len(),
        values[0],
        at(0.5),
        at(0.9),
        at(0.99),
        values[values.len() - 1]
    );
}
