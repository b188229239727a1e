//! Consumes `ExampleTopic` as the clustering group `idempotent-example`, processing each
//! message once per group even when it is delivered again (a retry, a resend, a second
//! consumer), with the claims in Redis (docs/idempotent-consumption.md). Runs until Ctrl-C and
//! then prints what the wrapper counted.
//!
//! ```sh
//! scripts/dev.sh                                    # name server 127.0.0.1:9876 + a broker
//! redis-server --port 6379 --save '' &              # or any Redis you have
//! cargo run -p shardmq-client --example producer    # creates ExampleTopic and fills it
//! cargo run -p shardmq-client --example idempotent_consumer
//! ```
//!
//! Start it twice: the two share the queues, and a message either of them processed is
//! skipped by the other. Settings from the environment:
//! - `SHARDMQ_NAMESRV` (default `127.0.0.1:9876`), `REDIS_URL` (default
//!   `redis://127.0.0.1:6379`), `TOPIC` (default `ExampleTopic`), `GROUP` (default
//!   `idempotent-example`);
//! - `WORK_MS`: how long "processing" one message takes (default 100), to watch a long call
//!   keep its claim;
//! - `PROCESSING_TTL_MS`: the claim's expiry while processing (default 30000): how long the
//!   messages of a consumer that was killed mid-processing wait before another takes them.
//!
//! Prints `processing <claim key>` when the listener starts on a message and
//! `processed <claim key>` when it is done.

use std::time::Duration;

use shardmq_client::{ConsumeFrom, ConsumeResult, Idempotent, PushConsumer, RedisStore};

mod support;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    support::exit_code(run().await)
}

fn setting(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

fn milliseconds(name: &str, default: u64) -> Result<Duration, String> {
    match std::env::var(name) {
        Err(_) => Ok(Duration::from_millis(default)),
        Ok(text) => text
            .parse()
            .map(Duration::from_millis)
            .map_err(|_| format!("{name}={text:?} is not a number of milliseconds")),
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let namesrv = setting("SHARDMQ_NAMESRV", "127.0.0.1:9876");
    let redis_url = setting("REDIS_URL", "redis://127.0.0.1:6379");
    let topic = setting("TOPIC", "ExampleTopic");
    let group = setting("GROUP", "idempotent-example");
    let work = milliseconds("WORK_MS", 100)?;
    let processing_ttl = milliseconds("PROCESSING_TTL_MS", 30_000)?;

    // Says now, not at the first message, when Redis is not there.
    let store = RedisStore::connect(&redis_url).await?;
    let idempotent = Idempotent::builder(store)
        .group(&group)
        .processing_ttl(processing_ttl)
        .build()?;
    let keys = idempotent.clone();
    let consumer = PushConsumer::builder()
        .namesrv(&namesrv)
        .group(&group)
        .subscribe(&topic, "*")
        .consume_from(ConsumeFrom::FirstOffset)
        .listen_concurrently(idempotent.wrap(move |messages| {
            let keys = keys.clone();
            async move {
                for message in &messages {
                    let key = keys.claim_key(message).unwrap_or_default();
                    println!(
                        "processing {key} {}",
                        String::from_utf8_lossy(&message.body)
                    );
                    // The application's work: here, a wait.
                    tokio::time::sleep(work).await;
                    println!("processed {key}");
                }
                ConsumeResult::Success
            }
        }))
        .start()
        .await?;
    let stop = support::stop_signal()?;
    println!("consuming {topic} as {group}, claims in {redis_url}; Ctrl-C to stop");
    stop.await;
    consumer.shutdown().await;
    println!("{:?}", idempotent.stats());
    Ok(())
}
