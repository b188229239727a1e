//! Broadcasting: two consumers of one group in broadcasting mode each receive every message
//! (clustering would split them). Each instance keeps its own offsets in a local file under
//! `~/.shardmq_offsets/<instance>/<group>/offsets.json`, so a restarted instance resumes.
//!
//! Run a local cluster first (it creates topics on first send):
//!
//! ```sh
//! scripts/dev.sh                                    # name server 127.0.0.1:9876 + a broker
//! cargo run -p shardmq-client --example broadcast   # sends 10 notices; both instances get all
//! ```
//!
//! `SHARDMQ_NAMESRV=host:port` points the example elsewhere.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use shardmq_client::{ConsumeFrom, ConsumeResult, Message, MessageModel, Producer, PushConsumer};

const NOTICES: usize = 10;

async fn start_instance(
    namesrv: &str,
    instance: &str,
) -> Result<(PushConsumer, Arc<AtomicUsize>), shardmq_client::Error> {
    let received = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&received);
    let name = instance.to_owned();
    let consumer = PushConsumer::builder()
        .namesrv(namesrv)
        .group("example-broadcast")
        .instance_name(instance)
        .subscribe("NoticeTopic", "*")
        .message_model(MessageModel::Broadcasting)
        // Only notices sent from now on.
        .consume_from(ConsumeFrom::LastOffset)
        .listen_concurrently(move |messages| {
            let counter = Arc::clone(&counter);
            let name = name.clone();
            async move {
                for message in &messages {
                    println!("{name} got: {}", String::from_utf8_lossy(&message.body));
                }
                counter.fetch_add(messages.len(), Ordering::Relaxed);
                ConsumeResult::Success
            }
        })
        .start()
        .await?;
    Ok((consumer, received))
}

mod support;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    support::exit_code(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let namesrv = std::env::var("SHARDMQ_NAMESRV").unwrap_or_else(|_| "127.0.0.1:9876".into());
    let producer = Producer::builder().namesrv(&namesrv).build().await?;
    // Make sure the topic exists (a dev broker creates it on first send) before the
    // consumers look for its queues.
    producer
        .send(Message::new("NoticeTopic", "warm-up"))
        .await?;

    let (first, first_count) = start_instance(&namesrv, "screen-1").await?;
    let (second, second_count) = start_instance(&namesrv, "screen-2").await?;
    for index in 0..NOTICES {
        producer
            .send(Message::new("NoticeTopic", format!("notice {index}")))
            .await?;
    }
    for _ in 0..100 {
        if first_count.load(Ordering::Relaxed) >= NOTICES
            && second_count.load(Ordering::Relaxed) >= NOTICES
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "screen-1 got {}, screen-2 got {} of {NOTICES} notices",
        first_count.load(Ordering::Relaxed),
        second_count.load(Ordering::Relaxed)
    );
    first.shutdown().await;
    second.shutdown().await;
    producer.shutdown().await;
    Ok(())
}
