//! The `clients` scenario: many idle clients that only heartbeat, to measure what the control
//! plane costs the broker.
//!
//! Starts `--clients` producers (each its own client: a name server connection and a broker
//! connection), spread over `--groups` producer groups, each sending one message to `--topic`
//! (so it knows the broker, as a producer that has sent does) and then heartbeating every
//! `--heartbeat-ms`, and holds them for `--duration` seconds. After the first messages the
//! broker's work is the heartbeats (decoded by a network shard, applied by storage
//! shard 0, which holds the client table). Run a `produce` beside it to see what that costs
//! the data path, and sample the broker's threads (`scripts/bench-control-plane.sh` does both).

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use shardmq_client::{Message, Producer};
use tokio::time::Instant;

#[derive(Args, Debug, Clone)]
pub struct ClientsArgs {
    /// Name server address(es), `host:port`, comma separated.
    #[arg(long, default_value = "127.0.0.1:9876")]
    pub namesrv: String,
    /// Topic each client sends its one message to (it must exist).
    #[arg(long, default_value = "PerfTopic")]
    pub topic: String,
    /// Clients to hold.
    #[arg(long, default_value_t = 5000)]
    pub clients: u32,
    /// Producer groups the clients are spread over.
    #[arg(long, default_value_t = 10)]
    pub groups: u32,
    /// Heartbeat interval of each client, in ms (RocketMQ's default is 30,000).
    #[arg(long, default_value_t = 30_000)]
    pub heartbeat_ms: u64,
    /// Seconds to hold the clients once all have started.
    #[arg(long, default_value_t = 30.0)]
    pub duration: f64,
    /// Also print the result as one JSON object, on the last line of stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &ClientsArgs) -> Result<()> {
    if args.clients == 0 || args.groups == 0 || args.heartbeat_ms == 0 {
        bail!("--clients, --groups and --heartbeat-ms must be positive");
    }
    let hold = Duration::try_from_secs_f64(args.duration)
        .context("--duration must be a number of seconds")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("perf-clients")
        .build()
        .context("cannot start the tokio runtime")?;
    runtime.block_on(async {
        let started = Instant::now();
        let mut clients = Vec::with_capacity(args.clients as usize);
        for index in 0..args.clients {
            let producer = Producer::builder()
                .namesrv(&args.namesrv)
                .group(format!("perf-clients-{}", index % args.groups))
                .heartbeat_interval(Duration::from_millis(args.heartbeat_ms))
                .build()
                .await
                .with_context(|| format!("client {index} did not start"))?;
            producer
                .send(Message::new(&args.topic, "hello"))
                .await
                .with_context(|| format!("client {index} could not send to {}", args.topic))?;
            clients.push(producer);
        }
        let start_s = started.elapsed().as_secs_f64();
        eprintln!(
            "clients: {} started in {start_s:.1} s; holding them {:.0} s",
            clients.len(),
            hold.as_secs_f64()
        );
        tokio::time::sleep(hold).await;
        for client in &clients {
            client.shutdown().await;
        }
        let heartbeats_per_sec = f64::from(args.clients) * 1000.0 / args.heartbeat_ms as f64;
        println!(
            "clients: {} held {:.0} s, {heartbeats_per_sec:.0} heartbeats/s expected",
            args.clients,
            hold.as_secs_f64()
        );
        if args.json {
            println!(
                "{}",
                json!({
                    "scenario": "clients",
                    "clients": args.clients,
                    "groups": args.groups,
                    "heartbeat_ms": args.heartbeat_ms,
                    "start_s": crate::report::round(start_s),
                    "heartbeats_per_sec": crate::report::round(heartbeats_per_sec),
                })
            );
        }
        Ok(())
    })
}
