//! `shardmq-broker`: runs the broker (the default) or checks a data directory (`verify`).
//!
//! Every option can also be given in a TOML file (`--config broker.toml`, keys named like the
//! flags with `_` for `-`); flags override the file, the file overrides the defaults.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};
use shardmq_broker::config::BrokerConfig;
use shardmq_broker::store::verify::{report_json, verify_data_dir};

mod tls_args;

#[derive(Parser, Debug)]
#[command(
    name = "shardmq-broker",
    version,
    about = "ShardMQ broker: stores and serves messages, shard per core"
)]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Check every record's CRC and the derived files' consistency; exit 0 only when clean
    /// (1: problems found, 2: the directory could not be read).
    Verify {
        /// Broker data directory (or one shard directory).
        #[arg(long)]
        data_dir: PathBuf,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Flags of the serving broker; each overrides the config file's key of the same name.
#[derive(Args, Debug, Default)]
struct ServeArgs {
    /// TOML config file (keys as the long flags, with `_`).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Name servers to register with, comma separated `host:port`.
    #[arg(long, value_delimiter = ',')]
    namesrv: Option<Vec<String>>,
    /// Address clients connect to; port 0 picks a free port. [default: 127.0.0.1:10911]
    #[arg(long)]
    listen: Option<String>,
    /// Data directory. [default: data/broker]
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// When a send is acknowledged: `sync` (after fdatasync) or `async` (once its O_DIRECT write completed). [default: async]
    #[arg(long)]
    flush: Option<String>,
    /// Background flush interval under async flush, in ms. [default: 500]
    #[arg(long)]
    flush_interval_ms: Option<u64>,
    /// Longest a sync-flush send waits before answering FLUSH_DISK_TIMEOUT, in ms. [default: 5000]
    #[arg(long)]
    sync_flush_timeout_ms: Option<u64>,
    /// CommitLog segment size in bytes (multiple of 4096). [default: 1073741824]
    #[arg(long)]
    segment_bytes: Option<u64>,
    /// Pre-allocate CommitLog segment files (fallocate) this many bytes ahead of the data; 0
    /// never. [default: 67108864]
    #[arg(long)]
    preallocate_ahead_bytes: Option<u64>,
    /// Size of each storage shard's append journal: under async flush a send is acknowledged
    /// once its bytes are in it (the page cache), not after their O_DIRECT write; 0 turns it
    /// off. A multiple of 4096. [default: 67108864]
    #[arg(long)]
    journal_bytes: Option<u64>,
    /// Bytes of CommitLog spans each storage shard reads ahead for consumers draining a
    /// backlog and keeps for their next pulls; 0 turns read-ahead off. [default: 33554432]
    #[arg(long)]
    readahead_bytes: Option<u64>,
    /// Cores of the storage shards, comma separated; one shard per entry. [default: 0]
    #[arg(long, value_delimiter = ',')]
    storage_cores: Option<Vec<usize>>,
    /// Cores of the network shards, comma separated; one shard per entry. [default: 1, or 0 on one core]
    #[arg(long, value_delimiter = ',')]
    network_cores: Option<Vec<usize>>,
    /// Cluster name reported to name servers. [default: DefaultCluster]
    #[arg(long)]
    cluster_name: Option<String>,
    /// Broker name reported to name servers. [default: broker-a]
    #[arg(long)]
    broker_name: Option<String>,
    /// Create unknown topics on first send (development only). [default: off]
    #[arg(long)]
    auto_create_topics: bool,
    /// Serve pulls filtered by SQL92 expressions over message properties (RocketMQ's
    /// enablePropertyFilter). [default: off]
    #[arg(long)]
    enable_property_filter: bool,
    /// Access control (docs/acl.md): the accounts file, acl.toml or RocketMQ's plain_acl.yml,
    /// reloaded when it changes. [default: off]
    #[arg(long)]
    acl_file: Option<std::path::PathBuf>,
    /// The broker's own access key, for the connections it opens (name servers, its master,
    /// controllers) when they enforce access control. [env: SHARDMQ_ACCESS_KEY]
    #[arg(long)]
    access_key: Option<String>,
    /// The broker's own secret key (with --access-key). [env: SHARDMQ_SECRET_KEY]
    #[arg(long)]
    secret_key: Option<String>,
    /// Hours a CommitLog segment is kept. [default: 72]
    #[arg(long)]
    file_reserved_hours: Option<u64>,
    /// How often retention looks for segments to delete, in ms (RocketMQ's
    /// `cleanResourceInterval`). [default: 10000]
    #[arg(long)]
    retention_interval_ms: Option<u64>,
    /// Register with name servers every this many ms. [default: 30000]
    #[arg(long)]
    register_interval_ms: Option<u64>,
    /// Drop clients silent for this many ms. [default: 120000]
    #[arg(long)]
    client_timeout_ms: Option<u64>,
    /// Persist consumer offsets every this many ms. [default: 5000]
    #[arg(long)]
    offsets_persist_interval_ms: Option<u64>,
    /// Largest message body in bytes. [default: 4194304]
    #[arg(long)]
    max_message_bytes: Option<usize>,
    /// Largest frame in bytes. [default: 16777216]
    #[arg(long)]
    max_frame_bytes: Option<usize>,
    /// Log format: `text` or `json`. [default: text]
    #[arg(long)]
    log_format: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics (host:port). [default: off]
    #[arg(long)]
    metrics_listen: Option<String>,
    /// Broker id: 0 for a master. [default: 0]
    #[arg(long)]
    broker_id: Option<i64>,
    /// `async-master`, `sync-master` (sends wait for the slave), `slave`, or `auto` (the controller decides; needs --controller). [default: async-master]
    #[arg(long)]
    broker_role: Option<String>,
    /// A master's address for its slaves (host:port). [default: the listen port + 1]
    #[arg(long)]
    ha_listen: Option<String>,
    /// The HA address given to the controllers and name servers, where slaves connect (host:port; RocketMQ's brokerIP2 with haListenPort), for an HA listener reached through a proxy or NAT. [default: the HA listen address]
    #[arg(long)]
    ha_advertise: Option<String>,
    /// A slave's master HA address (host:port); without it, learned from the name servers.
    #[arg(long)]
    ha_master: Option<String>,
    /// A slave copies its master's consumer offsets and delivery progress every this many ms
    /// (topics every 2 s). [default: 10000]
    #[arg(long)]
    replica_metadata_interval_ms: Option<u64>,
    /// Let consumers far behind read from the slave (RocketMQ's slaveReadEnable): a pull whose
    /// position is more than slave_read_lag_bytes behind the log's end is answered with a hint
    /// to pull that queue from a slave holding it, and a slave hints back once caught up.
    #[arg(long)]
    slave_read_enable: bool,
    /// How far behind the CommitLog's end (bytes) a pull must be for slave_read_enable to send
    /// it to the slave. [default: 67108864, the hot tail kept in memory]
    #[arg(long)]
    slave_read_lag_bytes: Option<u64>,
    /// Controller addresses, comma separated, for `--broker-role auto`: the controller decides
    /// at each start whether this broker (its own --broker-id, above 0) is master or slave,
    /// and replaces a dead master (docs/replication.md, "Automatic failover").
    #[arg(long, value_delimiter = ',')]
    controller: Option<Vec<String>>,
    /// How often a broker in controller mode heartbeats the controller, ms. [default: 500]
    #[arg(long)]
    controller_heartbeat_ms: Option<u64>,
    /// Controller mode: a slave stays in the SyncStateSet while it is at most this many bytes
    /// behind (per storage shard). [default: 4194304]
    #[arg(long)]
    in_sync_max_lag_bytes: Option<u64>,
    /// Controller mode: preference among members of equal progress when a master is elected;
    /// lower is preferred. [default: 4294967295]
    #[arg(long)]
    election_priority: Option<u32>,
    /// Controller mode: a send is acknowledged SEND_OK only while the SyncStateSet (master
    /// included) has at least this many members; below, SLAVE_NOT_AVAILABLE. [default: 1]
    #[arg(long)]
    min_in_sync_replicas: Option<u32>,
    /// A sync master restarted after a slave acknowledged its writes refuses local appends up
    /// to this long, until a slave of that term joins (returning any bytes its log lost); 0
    /// does not wait. [default: 10000]
    #[arg(long)]
    lost_tail_wait_ms: Option<u64>,
    /// Entries per ConsumeQueue file. [default: 300000]
    #[arg(long)]
    consume_queue_entries_per_file: Option<u64>,
    /// Disk use (0..1) above which the oldest segments are deleted early. [default: 0.75]
    #[arg(long)]
    disk_max_used_ratio: Option<f64>,
    /// Disk use (0..1) at which sends are refused with DISK_FULL. [default: 0.95]
    #[arg(long)]
    disk_refuse_ratio: Option<f64>,
    /// Queues of an auto-created topic. [default: 8]
    #[arg(long)]
    default_topic_queues: Option<u32>,
    /// Most messages in one send. [default: 1024]
    #[arg(long)]
    max_batch_messages: Option<usize>,
    /// Most requests running at once on one connection. [default: 256]
    #[arg(long)]
    max_inflight_per_connection: Option<usize>,
    /// Bytes of received request frames a network shard holds at once; reading waits beyond
    /// it. [default: 268435456]
    #[arg(long)]
    max_request_bytes_per_shard: Option<usize>,
    /// A frame that has started arriving must be complete within this many ms, or the
    /// connection is closed. [default: 60000]
    #[arg(long)]
    frame_read_timeout_ms: Option<u64>,
    /// Most open client connections per network shard. [default: 10000]
    #[arg(long)]
    max_connections: Option<usize>,
    /// Time a new connection has to complete its handshake, in ms. [default: 10000]
    #[arg(long)]
    handshake_timeout_ms: Option<u64>,
    /// How long an idle executor polls before it sleeps, in µs (lower latency; CPU while nearly idle); above 0, sync flush also polls while a durable write is in flight. [default: 100]
    #[arg(long)]
    spin_before_park_us: Option<u64>,
    /// Age in ms at which an unresolved transaction is first checked back. [default: 6000]
    #[arg(long)]
    transaction_timeout_ms: Option<u64>,
    /// How often unresolved transactions are checked back, in ms. [default: 60000]
    #[arg(long)]
    transaction_check_interval_ms: Option<u64>,
    /// Check-backs before an unresolved transaction is discarded. [default: 15]
    #[arg(long)]
    transaction_check_max: Option<u32>,
    /// How long an orderly consumer's queue lock lasts without renewal, in ms. [default: 60000]
    #[arg(long)]
    queue_lock_expiry_ms: Option<u64>,
    /// Most pulls parked (long polling) per network shard. [default: 10000]
    #[arg(long)]
    max_parked_pulls: Option<usize>,
    /// Longest a pull is held, whatever the client asks, in ms. [default: 30000]
    #[arg(long)]
    max_suspend_timeout_ms: Option<u64>,
    /// Most messages one pull returns. [default: 1024]
    #[arg(long)]
    max_pull_messages: Option<u32>,
    /// Most record bytes one pull returns. [default: 8388608]
    #[arg(long)]
    max_pull_bytes: Option<u64>,
    /// Requests a storage shard may have queued from one network shard before SYSTEM_BUSY. [default: 4096]
    #[arg(long)]
    storage_queue_depth: Option<usize>,
    /// Delay levels 1..=N, space separated durations (ms, s, m, h, d). [default: "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"]
    #[arg(long)]
    delay_levels: Option<String>,
    /// Longest wait a timer message may ask for, in ms. [default: 259200000 (3 days)]
    #[arg(long)]
    timer_max_delay_ms: Option<u64>,
    /// Most timer messages a storage shard keeps indexed in memory. [default: 1000000]
    #[arg(long)]
    timer_max_pending: Option<usize>,
    /// How often delay/timer delivery progress is persisted, in ms. [default: 1000]
    #[arg(long)]
    schedule_persist_interval_ms: Option<u64>,
    #[command(flatten)]
    tls: tls_args::TlsArgs,
}

impl ServeArgs {
    fn into_config(self) -> Result<BrokerConfig, String> {
        let mut config = match &self.config {
            Some(path) => BrokerConfig::from_file(path)?,
            None => BrokerConfig::default(),
        };
        macro_rules! set {
            ($($field:ident),*) => { $( if let Some(value) = self.$field { config.$field = value; } )* };
        }
        set!(
            namesrv,
            listen,
            data_dir,
            flush,
            flush_interval_ms,
            sync_flush_timeout_ms,
            segment_bytes,
            preallocate_ahead_bytes,
            journal_bytes,
            readahead_bytes,
            storage_cores,
            network_cores,
            cluster_name,
            broker_name,
            file_reserved_hours,
            retention_interval_ms,
            register_interval_ms,
            client_timeout_ms,
            offsets_persist_interval_ms,
            max_message_bytes,
            max_frame_bytes,
            log_format,
            metrics_listen,
            broker_id,
            broker_role,
            ha_listen,
            ha_advertise,
            ha_master,
            replica_metadata_interval_ms,
            slave_read_lag_bytes,
            controller,
            controller_heartbeat_ms,
            in_sync_max_lag_bytes,
            election_priority,
            min_in_sync_replicas,
            lost_tail_wait_ms,
            consume_queue_entries_per_file,
            disk_max_used_ratio,
            disk_refuse_ratio,
            default_topic_queues,
            max_batch_messages,
            max_inflight_per_connection,
            max_request_bytes_per_shard,
            frame_read_timeout_ms,
            max_connections,
            handshake_timeout_ms,
            spin_before_park_us,
            transaction_timeout_ms,
            transaction_check_interval_ms,
            transaction_check_max,
            queue_lock_expiry_ms,
            max_parked_pulls,
            max_suspend_timeout_ms,
            max_pull_messages,
            max_pull_bytes,
            storage_queue_depth,
            delay_levels,
            timer_max_delay_ms,
            timer_max_pending,
            schedule_persist_interval_ms
        );
        self.tls.apply(&mut config.tls);
        if self.slave_read_enable {
            config.slave_read_enable = true;
        }
        if self.auto_create_topics {
            config.auto_create_topics = true;
        }
        if self.enable_property_filter {
            config.enable_property_filter = true;
        }
        if self.acl_file.is_some() {
            config.acl_file = self.acl_file.clone();
        }
        let from_env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        if let Some(key) = self
            .access_key
            .clone()
            .or_else(|| from_env(shardmq_acl::ACCESS_KEY_ENV))
        {
            config.access_key = Some(key);
        }
        if let Some(key) = self
            .secret_key
            .clone()
            .or_else(|| from_env(shardmq_acl::SECRET_KEY_ENV))
        {
            config.secret_key = Some(key);
        }
        Ok(config)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Verify { data_dir, json }) => run_verify(&data_dir, json),
        None => serve(cli.serve),
    }
}

fn init_logging(format: &str) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, never in files or pipes.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Set by a broker restarting itself: the address to listen on again.
const RESTART_LISTEN_ENV: &str = "SHARDMQ_BROKER_RESTART_LISTEN";
/// Set by a broker restarting itself once it has printed its `listening on` line.
const ANNOUNCED_ENV: &str = "SHARDMQ_BROKER_ANNOUNCED";

fn serve(args: ServeArgs) -> ExitCode {
    let config = match args.into_config().and_then(|c| c.validate().map(|_| c)) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("shardmq-broker: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    init_logging(&config.log_format);
    if let Err(e) = shardmq_broker::network::tls::init(&config) {
        eprintln!("shardmq-broker: {e}");
        return ExitCode::from(2);
    }
    if let Err(e) = shardmq_broker::network::access::init(&config) {
        eprintln!("shardmq-broker: {e}");
        return ExitCode::from(2);
    }
    let mut config = config;
    // A broker restarted by itself (below) runs on the address it had.
    let restarted_on = std::env::var(RESTART_LISTEN_ENV).ok();
    if let Some(address) = &restarted_on {
        config.listen = address.clone();
    }
    let announced = Arc::new(AtomicBool::new(std::env::var_os(ANNOUNCED_ENV).is_some()));
    // Signals before the run starts (while waiting for the controller) end the broker too.
    let interrupted = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let _ = signal_hook::flag::register(signal, interrupted.clone());
    }
    // Controller mode: the controller says what this run is.
    let effective = if config.is_auto() {
        match shardmq_broker::control::controller::resolve(&config, &interrupted) {
            Ok(effective) => effective,
            Err(_) if interrupted.load(std::sync::atomic::Ordering::Relaxed) => {
                return ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("shardmq-broker: {e}");
                return ExitCode::from(1);
            }
        }
    } else {
        config.clone()
    };
    let stopping = Arc::new(AtomicBool::new(false));
    let listening = Arc::new(std::sync::Mutex::new(None));
    let seen = listening.clone();
    let said = announced.clone();
    let outcome =
        shardmq_broker::runtime::run(effective, stopping, restarted_on.is_some(), move |addr| {
            *seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(addr);
            // Scripts and tests read this line to learn the address (port 0 picks one), once:
            // a run that restarted before it served has not said it.
            if !said.swap(true, std::sync::atomic::Ordering::Relaxed) {
                println!("shardmq-broker listening on {addr}");
            }
        });
    // A shard asked for a restart (a slave cutting its log, a new role from the controller):
    // the broker has stopped gracefully; it starts again as a fresh image of this program, in
    // this process (same pid), on the same address. A fresh image, not a loop: the executors'
    // io_uring instances let go of their sockets only when the process (or its image) goes,
    // and sockets of the old run left open would swallow clients' requests.
    if outcome.is_ok()
        && shardmq_broker::role::take_restart_request()
        && !interrupted.load(std::sync::atomic::Ordering::Relaxed)
    {
        use std::os::unix::process::CommandExt;
        let address = listening
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map(|a| a.to_string())
            .unwrap_or(config.listen);
        let program = std::env::current_exe().unwrap_or_else(|_| "shardmq-broker".into());
        let mut command = std::process::Command::new(program);
        command
            .args(std::env::args_os().skip(1))
            .env(RESTART_LISTEN_ENV, address);
        if announced.load(std::sync::atomic::Ordering::Relaxed) {
            command.env(ANNOUNCED_ENV, "1");
        }
        let _ = std::io::Write::flush(&mut std::io::stdout());
        let error = command.exec();
        eprintln!("shardmq-broker: cannot restart: {error}");
        return ExitCode::from(1);
    }
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shardmq-broker: {e}");
            ExitCode::from(1)
        }
    }
}

fn run_verify(data_dir: &std::path::Path, json: bool) -> ExitCode {
    let report = match verify_data_dir(data_dir) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("verify: cannot read {}: {e}", data_dir.display());
            return ExitCode::from(2);
        }
    };
    if json {
        println!("{}", report_json(&report));
    } else {
        for shard in &report.shards {
            println!(
                "shard {}: segments {}, records {}, commitlog [{}, {}), queues {}, consume queue entries {}, index entries {}",
                shard.dir.display(),
                shard.segments,
                shard.records,
                shard.first_offset,
                shard.last_valid_offset,
                shard.queues,
                shard.consume_queue_entries,
                shard.index_entries
            );
        }
        for problem in &report.problems {
            println!(
                "PROBLEM {} at offset {}: {}",
                problem.file.display(),
                problem.offset,
                problem.what
            );
        }
        if report.is_clean() {
            println!("verify: clean");
        } else {
            println!("verify: {} problem(s)", report.problems.len());
        }
    }
    if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
