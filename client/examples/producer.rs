//! Sends messages to `ExampleTopic`: one at a time, many in flight at once (`send_async`), in
//! order per key while in flight (`send_ordered_async`), and as a batch, printing where each was
//! stored.
//!
//! Run a local cluster first (it creates topics on first send):
//!
//! ```sh
//! scripts/dev.sh                                   # name server 127.0.0.1:9876 + a broker
//! cargo run -p shardmq-client --example producer   # in another terminal
//! ```
//!
//! Against a broker that does not create topics, create it first:
//! `shardmq topic create ExampleTopic --queues 8 --broker 127.0.0.1:10911`.
//! `SHARDMQ_NAMESRV=host:port` points the example elsewhere.

use shardmq_client::{Message, Producer};

mod support;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    support::exit_code(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let namesrv = std::env::var("SHARDMQ_NAMESRV").unwrap_or_else(|_| "127.0.0.1:9876".into());
    let producer = Producer::builder()
        .namesrv(&namesrv)
        .group("example-producer")
        .build()
        .await?;

    // One at a time: each send waits for the broker's answer (retried on another broker when
    // one fails, within 3 s).
    for index in 0..5 {
        let message = Message::new("ExampleTopic", format!("hello {index}"))
            .with_tags(if index % 2 == 0 { "TagA" } else { "TagB" })
            .with_keys([format!("order-{index}")]);
        let result = producer.send(message).await?;
        println!(
            "{} {} → {} offset {}",
            result.status, result.msg_id, result.queue, result.queue_offset
        );
    }

    // Many in flight: each `send_async` returns as soon as the send is on its way (within the
    // producer's window of sends in flight); its future resolves to the result.
    let mut in_flight = Vec::new();
    for index in 0..20 {
        let message = Message::new("ExampleTopic", format!("async {index}")).with_tags("TagA");
        in_flight.push(producer.send_async(message).await?);
    }
    for sent in in_flight {
        let result = sent.await?;
        println!("async {} → {}", result.msg_id, result.queue);
    }

    // In flight and in order: messages of one key go to one queue, each after the one before
    // it has been stored.
    let mut in_order = Vec::new();
    for step in ["created", "paid", "shipped"] {
        let message = Message::new("ExampleTopic", format!("order-7 {step}"));
        in_order.push(producer.send_ordered_async(message, "order-7").await?);
    }
    for sent in in_order {
        let result = sent.await?;
        println!(
            "ordered {} → {} offset {}",
            result.msg_id, result.queue, result.queue_offset
        );
    }

    // A batch: stored together in one queue, all or nothing.
    let batch = (0..5)
        .map(|index| Message::new("ExampleTopic", format!("batch {index}")).with_tags("TagC"))
        .collect();
    for result in producer.send_batch(batch).await? {
        println!(
            "batch {} → {} offset {}",
            result.msg_id, result.queue, result.queue_offset
        );
    }

    producer.shutdown().await;
    Ok(())
}
