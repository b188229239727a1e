//! Transactional messages: a payment event is published only if the local transaction that
//! records the payment commits. Three transactions: one commits, one rolls back, and one ends
//! UNKNOWN and is resolved when the broker checks back with the producer group.
//!
//! Run a local cluster first:
//!
//! ```sh
//! scripts/dev.sh                                      # name server 127.0.0.1:9876 + a broker
//! cargo run -p shardmq-client --example transaction
//! ```
//!
//! The broker checks an unresolved transaction back after `transaction_timeout_ms` (6 s) at its
//! next check round (`transaction_check_interval_ms`, 60 s by default; start the broker with
//! `--transaction-check-interval-ms 1000` to see it sooner). `SHARDMQ_NAMESRV=host:port` points
//! the example elsewhere.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardmq_client::{
    Admin, ConsumeFrom, ConsumeResult, Message, Producer, PushConsumer, TopicConfig,
    TransactionState,
};

mod support;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    support::exit_code(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let namesrv = std::env::var("SHARDMQ_NAMESRV").unwrap_or_else(|_| "127.0.0.1:9876".into());
    let admin = Admin::builder().namesrv(&namesrv).build().await?;
    admin
        .upsert_topic_in_cluster(None, &TopicConfig::new("PaymentTopic", 4), false)
        .await?;

    // The application's record of which payments committed: what the check-back consults.
    let committed_payments: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let ledger = Arc::clone(&committed_payments);
    let producer = Producer::builder()
        .namesrv(&namesrv)
        .group("payment-producer")
        .check_local_transaction(move |message| {
            let is_committed = message
                .keys()
                .iter()
                .any(|key| ledger.lock().unwrap().contains(*key));
            println!(
                "broker asks about {} (keys {:?}): {}",
                message.msg_id(),
                message.keys(),
                if is_committed { "commit" } else { "rollback" }
            );
            async move {
                if is_committed {
                    TransactionState::Commit
                } else {
                    TransactionState::Rollback
                }
            }
        })
        .build()
        .await?;
    while producer.write_queues("PaymentTopic").await.is_err() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let run = shardmq_client::now_ms();
    for (payment, outcome) in [
        ("commit", TransactionState::Commit),
        ("rollback", TransactionState::Rollback),
        ("unknown", TransactionState::Unknown),
    ] {
        let key = format!("payment-{payment}-{run}");
        let ledger = Arc::clone(&committed_payments);
        let message = Message::new("PaymentTopic", format!("payment {payment}")).with_keys([&key]);
        let result = producer
            .send_in_transaction(message, move |sent| async move {
                // The local transaction: record the payment (here, in memory).
                if outcome != TransactionState::Rollback {
                    ledger.lock().unwrap().insert(key);
                }
                println!(
                    "half message {} stored; local transaction: {outcome:?}",
                    sent.msg_id
                );
                outcome
            })
            .await?;
        println!(
            "{payment}: {:?}, end confirmed: {}",
            result.state, result.is_end_confirmed
        );
    }

    let received = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&received);
    let consumer = PushConsumer::builder()
        .namesrv(&namesrv)
        .group(format!("payment-consumer-{run}"))
        .subscribe("PaymentTopic", "*")
        .consume_from(ConsumeFrom::Timestamp(run - 1_000))
        .listen_concurrently(move |messages| {
            let sink = Arc::clone(&sink);
            async move {
                for message in messages {
                    let body = String::from_utf8_lossy(&message.body).into_owned();
                    println!("consumed: {body}");
                    sink.lock().unwrap().push(body);
                }
                ConsumeResult::Success
            }
        })
        .start()
        .await?;
    println!("waiting for the committed payment and the check-back of the unknown one…");
    for _ in 0..1_800 {
        if received.lock().unwrap().len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "consumed {:?} (never the rolled-back one)",
        received.lock().unwrap()
    );
    consumer.shutdown().await;
    producer.shutdown().await;
    Ok(())
}
