//! `shardmq-namesrv`: the name server process. Parses the command line, sets up logging (to
//! stderr, so stdout carries only the `listening on` line scripts and tests read), runs the
//! server on a single-threaded tokio runtime (its work is a few map look-ups per request), and
//! shuts down gracefully on SIGINT or SIGTERM.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use shardmq_acl::Credentials;
use shardmq_namesrv::access::Access;
use shardmq_namesrv::{NamesrvServer, ServerConfig};
use tracing::info;
use tracing_subscriber::EnvFilter;

/// ShardMQ name server: brokers register their topics here; clients ask it for topic routes.
#[derive(Parser, Debug)]
#[command(name = "shardmq-namesrv", version)]
struct Cli {
    /// Address to listen on, `host:port`. Port 0 picks a free port; the chosen address is
    /// printed on stdout as `shardmq-namesrv listening on ADDR`.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9876")]
    listen: String,

    /// Drop a broker that has not registered for this many milliseconds (brokers register
    /// every 30 s).
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 120_000,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    broker_timeout_ms: u64,

    /// How often, in milliseconds, to look for brokers past --broker-timeout-ms.
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 5_000,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    scan_interval_ms: u64,

    /// Format of the log lines written to stderr. The level comes from RUST_LOG (default
    /// `info`).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,

    /// Serve Prometheus metrics at http://ADDR/metrics (`host:port`; port 0 picks one). Off
    /// unless given.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<String>,

    /// Also run a controller (docs/replication.md, "Automatic failover"): one Raft member
    /// that keeps each broker group's master, epoch and in-sync replicas, and elects a new
    /// master when the master dies.
    #[arg(long)]
    controller: bool,

    /// The controller's address (brokers, `shardmq controller`, other controllers).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9878")]
    controller_listen: String,

    /// Every controller of the group, this one included: `1=host:port,2=host:port,3=host:port`.
    #[arg(long, value_name = "PEERS")]
    controller_peers: Option<String>,

    /// Start this controller to join a running group instead of proposing one from
    /// --controller-peers: it waits until an operator adds it (`shardmq controller add-member
    /// --id ID --address ADDR`). Use it for every node added after the group first started.
    #[arg(long)]
    controller_join: bool,

    /// This controller's id among --controller-peers.
    #[arg(long, value_name = "ID", default_value_t = 1)]
    controller_id: u64,

    /// Where the controller keeps its Raft log and snapshots. [default: data/controller-ID]
    #[arg(long, value_name = "DIR")]
    controller_data_dir: Option<std::path::PathBuf>,

    /// A broker that has not heartbeated the controller for this many ms is dead; a dead
    /// master is replaced from its in-sync replicas.
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 3_000,
        value_parser = clap::value_parser!(u64).range(100..)
    )]
    controller_broker_timeout_ms: u64,

    #[command(flatten)]
    tls: shardmq_namesrv::tls::TlsArgs,
    /// Access control (docs/acl.md): the accounts file, acl.toml or RocketMQ's plain_acl.yml,
    /// reloaded when it changes. Reads (routes, topic lists, cluster info, controller status)
    /// then need a known account or a trusted address; broker registration, topic deletion and
    /// controller traffic an admin account. [default: off]
    #[arg(long, value_name = "FILE")]
    acl_file: Option<std::path::PathBuf>,

    /// This name server's own access key, for its controller's links to the other controllers
    /// when they enforce access control. [env: SHARDMQ_ACCESS_KEY]
    #[arg(long, value_name = "KEY")]
    access_key: Option<String>,

    /// This name server's own secret key (with --access-key). [env: SHARDMQ_SECRET_KEY]
    #[arg(long, value_name = "KEY")]
    secret_key: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let listener_tls = cli.tls.load().map_err(anyhow::Error::msg)?;
    if let Some(link_tls) = cli.tls.load_link().map_err(anyhow::Error::msg)? {
        shardmq_namesrv::tls::set_link_tls(link_tls);
    }
    let access = Access::open(cli.acl_file.clone()).context("access control (--acl-file)")?;
    let credentials = own_credentials(&cli)?;
    let config = ServerConfig {
        listen: cli.listen.clone(),
        broker_timeout: Duration::from_millis(cli.broker_timeout_ms),
        scan_interval: Duration::from_millis(cli.scan_interval_ms),
        metrics_listen: cli.metrics_listen.clone(),
        tls: listener_tls.clone(),
        access: Arc::clone(&access),
        ..ServerConfig::default()
    };
    let controller = if cli.controller {
        let peers = match &cli.controller_peers {
            Some(text) => shardmq_namesrv::controller::ControllerConfig::parse_peers(text)
                .map_err(anyhow::Error::msg)?,
            None => [(cli.controller_id, cli.controller_listen.clone())].into(),
        };
        let config = shardmq_namesrv::controller::ControllerConfig {
            id: cli.controller_id,
            listen: cli.controller_listen.clone(),
            peers,
            data_dir: cli.controller_data_dir.clone().unwrap_or_else(|| {
                std::path::PathBuf::from(format!("data/controller-{}", cli.controller_id))
            }),
            broker_timeout: Duration::from_millis(cli.controller_broker_timeout_ms),
            join: cli.controller_join,
            tls: listener_tls,
            access,
            credentials,
        };
        config.validate().map_err(anyhow::Error::msg)?;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let thread = shardmq_namesrv::controller::spawn(config, stopped)
            .context("cannot start the controller")?;
        Some((stop, thread))
    } else {
        None
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let outcome = runtime.block_on(serve(config));
    if let Some((stop, thread)) = controller {
        let _ = stop.send(true);
        let _ = thread.join();
    }
    outcome
}

/// The name server's own account from --access-key/--secret-key, else the environment: both
/// or neither.
fn own_credentials(cli: &Cli) -> anyhow::Result<Option<Credentials>> {
    match (&cli.access_key, &cli.secret_key) {
        (Some(access_key), Some(secret_key)) => Credentials::new(access_key, secret_key)
            .map(Some)
            .context("--access-key/--secret-key"),
        (None, None) => Credentials::from_env().context("the account in the environment"),
        _ => anyhow::bail!(
            "--access-key and --secret-key go together: give both (this name server's own account) or neither"
        ),
    }
}

async fn serve(config: ServerConfig) -> anyhow::Result<()> {
    let shutdown = shutdown_signal()?;
    let broker_timeout = config.broker_timeout;
    let scan_interval = config.scan_interval;
    let server = NamesrvServer::bind(config).await?;
    let address = server
        .local_addr()
        .context("cannot read the listener's address")?;
    info!(
        broker_timeout_ms = shardmq_namesrv::server::millis(broker_timeout),
        scan_interval_ms = shardmq_namesrv::server::millis(scan_interval),
        "shardmq-namesrv {} listening on {address}",
        env!("CARGO_PKG_VERSION")
    );
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "shardmq-namesrv listening on {address}")
        .and_then(|()| match server.metrics_addr() {
            Some(metrics) => writeln!(stdout, "shardmq-namesrv metrics on {metrics}"),
            None => Ok(()),
        })
        .and_then(|()| stdout.flush())
        .context("cannot write to stdout")?;
    drop(stdout);
    server.run(shutdown).await;
    info!("shardmq-namesrv stopped");
    Ok(())
}

/// Completes on the first SIGINT or SIGTERM. Installed before the server starts so that a
/// signal arriving at any point after the `listening` line is handled.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    Ok(async move {
        let name = tokio::select! {
            _ = interrupt.recv() => "SIGINT",
            _ = terminate.recv() => "SIGTERM",
        };
        info!("{name} received");
    })
}

fn init_logging(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,openraft=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
