//! Consumes `ExampleTopic` as the clustering group `example-consumer`, printing each message,
//! until Ctrl-C. Start it twice to watch the group share the queues (each instance takes half;
//! stop one and the other takes all).
//!
//! Run a local cluster and send something first:
//!
//! ```sh
//! scripts/dev.sh                                    # name server 127.0.0.1:9876 + a broker
//! cargo run -p shardmq-client --example producer    # creates ExampleTopic and fills it
//! cargo run -p shardmq-client --example consumer    # Ctrl-C to stop (offsets are committed)
//! ```
//!
//! `SHARDMQ_NAMESRV=host:port` points the example elsewhere; `TAGS="TagA || TagB"` filters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use shardmq_client::{ConsumeFrom, ConsumeResult, PushConsumer};

mod support;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    support::exit_code(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let namesrv = std::env::var("SHARDMQ_NAMESRV").unwrap_or_else(|_| "127.0.0.1:9876".into());
    let tags = std::env::var("TAGS").unwrap_or_else(|_| "*".into());
    let consumed = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&consumed);
    let consumer = PushConsumer::builder()
        .namesrv(&namesrv)
        .group("example-consumer")
        .subscribe("ExampleTopic", tags)
        // A new group starts at the oldest message (the default is only new ones).
        .consume_from(ConsumeFrom::FirstOffset)
        .listen_concurrently(move |messages| {
            let counter = Arc::clone(&counter);
            async move {
                for message in &messages {
                    println!(
                        "{}#{} offset {} id {} tags {:?} keys {:?}: {}",
                        message.broker_name(),
                        message.queue_id,
                        message.queue_offset,
                        message.msg_id(),
                        message.tags(),
                        message.keys(),
                        String::from_utf8_lossy(&message.body)
                    );
                }
                counter.fetch_add(messages.len() as u64, Ordering::Relaxed);
                ConsumeResult::Success
            }
        })
        .start()
        .await?;
    let stop = support::stop_signal()?;
    println!(
        "{} consuming queues {:?}; Ctrl-C or SIGTERM to stop",
        consumer.client_id(),
        consumer
            .assigned_queues()
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
    );
    stop.await;
    consumer.shutdown().await;
    println!("consumed {} message(s)", consumed.load(Ordering::Relaxed));
    Ok(())
}
