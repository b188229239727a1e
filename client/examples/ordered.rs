//! Ordered messages: each order's steps (created, paid, shipped) are sent with the order id as
//! the key, so they land in one queue, and an orderly listener sees them in that order.
//!
//! Run a local cluster first (it creates topics on first send):
//!
//! ```sh
//! scripts/dev.sh                                  # name server 127.0.0.1:9876 + a broker
//! cargo run -p shardmq-client --example ordered   # sends 10 orders and consumes them in order
//! ```
//!
//! It creates `OrderTopic` (4 queues) on every master broker first, through the admin API.
//! `SHARDMQ_NAMESRV=host:port` points the example elsewhere.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardmq_client::{
    Admin, ConsumeFrom, ConsumeResult, Message, Producer, PushConsumer, TopicConfig,
};

const STEPS: [&str; 3] = ["created", "paid", "shipped"];
const ORDERS: usize = 10;

mod support;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    support::exit_code(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let namesrv = std::env::var("SHARDMQ_NAMESRV").unwrap_or_else(|_| "127.0.0.1:9876".into());
    // Ordered sends pick a queue by key among the topic's queues, so the topic must exist
    // first: create (or update) it on every master broker the name server knows.
    let admin = Admin::builder().namesrv(&namesrv).build().await?;
    let brokers = admin
        .upsert_topic_in_cluster(None, &TopicConfig::new("OrderTopic", 4), false)
        .await?;
    println!("OrderTopic is on {brokers:?}");
    let producer = Producer::builder().namesrv(&namesrv).build().await?;
    // The brokers announce the topic to the name server within a moment.
    while producer.write_queues("OrderTopic").await.is_err() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Each run uses fresh order ids, so earlier runs' messages are told apart.
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis()
        .to_string();
    for step in STEPS {
        for order in 0..ORDERS {
            let key = format!("order-{}-{order}", &run);
            let message =
                Message::new("OrderTopic", format!("{key} {step}")).with_keys([key.clone()]);
            let result = producer.send_ordered(message, &key).await?;
            println!("sent {key} {step} → {}", result.queue);
        }
    }

    let steps_seen: Arc<Mutex<BTreeMap<String, Vec<String>>>> = Arc::default();
    let sink = Arc::clone(&steps_seen);
    let consumer = PushConsumer::builder()
        .namesrv(&namesrv)
        .group("example-ordered")
        .subscribe("OrderTopic", "*")
        .consume_from(ConsumeFrom::FirstOffset)
        .listen_orderly(move |messages| {
            let sink = Arc::clone(&sink);
            async move {
                for message in messages {
                    let text = String::from_utf8_lossy(&message.body).into_owned();
                    if let Some((key, step)) = text.split_once(' ') {
                        println!(
                            "queue {} offset {}: {key} {step}",
                            message.queue_id, message.queue_offset
                        );
                        sink.lock()
                            .unwrap()
                            .entry(key.to_owned())
                            .or_default()
                            .push(step.to_owned());
                    }
                }
                ConsumeResult::Success
            }
        })
        .start()
        .await?;

    // Wait until every order of this run has all its steps (or give up after 30 s).
    for _ in 0..300 {
        let complete = steps_seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(key, steps)| key.contains(&run) && steps.len() == STEPS.len())
            .count();
        if complete == ORDERS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    consumer.shutdown().await;
    producer.shutdown().await;
    for (key, steps) in steps_seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(key, _)| key.contains(&run))
    {
        let in_order = steps.iter().map(String::as_str).eq(STEPS);
        println!(
            "{key}: {} {}",
            steps.join(" → "),
            if in_order {
                "(in order)"
            } else {
                "(OUT OF ORDER)"
            }
        );
    }
    Ok(())
}
