//! The real ShardMQ binaries as test fixtures: a name server and a broker, each on a free
//! loopback port (and the broker over a temp data dir), killed when dropped, plus the `shardmq`
//! CLI to create topics, inspect consumer groups, and send and consume as ShardMQ's own client.
//!
//! Owns: finding the binaries ([`binary_path`]), the process guards ([`ServerProcess`],
//! [`LocalCluster`]), CLI runs with a deadline ([`LocalCluster::cli`]) and condition polling
//! with a deadline ([`wait_until`], [`poll_until`]). It mirrors the main test crate's harness
//! (`tests/lib.rs`), which this workspace cannot depend on. Never: fixed sleeps, or any address
//! but loopback.
//!
//! Data enters as each server's stdout line `<binary> listening on <addr>` and its stderr log,
//! and as the CLI's output; it leaves as parsed addresses, the CLI's JSON, and, when a test
//! panics, the captured logs.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// Where the binaries are looked for instead of the main workspace's `target/debug/`.
pub const BIN_DIR_ENV: &str = "SHARDMQ_BIN_DIR";

/// How long a server may take to print its `listening on` line.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);

/// How long a new topic may take to appear in the name server's routes (the broker registers
/// right after a topic change).
pub const ROUTE_TIMEOUT: Duration = Duration::from_secs(20);

/// How long one run of the `shardmq` CLI may take before it is killed (its own
/// `--timeout-ms`, where a command has one, must be shorter).
pub const CLI_TIMEOUT: Duration = Duration::from_secs(60);

/// How often [`wait_until`] re-checks its condition.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Most stderr lines a [`ServerProcess`] keeps (the oldest are dropped).
const MAX_CAPTURED_LOG_LINES: usize = 10_000;

/// How long a killed server's log reader may take to read the log's last lines.
const LOG_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// The broker name the test broker registers under (not the default, so a route that carries
/// it came from this broker's registration).
pub const BROKER_NAME: &str = "compat-broker";

/// The cluster the test broker registers in (not the default, for the same reason).
pub const CLUSTER_NAME: &str = "CompatCluster";

// ---------------------------------------------------------------------------------------------
// Binaries and waiting

/// The built binary `name` of the main workspace: in `$SHARDMQ_BIN_DIR` when that is set (a
/// relative path is taken from `compat/`, where cargo runs the tests), else in
/// `<repo>/target/debug/`. Panics, saying how to build it, when it is not there.
#[must_use]
pub fn binary_path(name: &str) -> PathBuf {
    let file_name = format!("{name}{}", std::env::consts::EXE_SUFFIX);
    let directory = match std::env::var_os(BIN_DIR_ENV) {
        Some(directory) => PathBuf::from(directory),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join("target")
            .join("debug"),
    };
    let path = directory.join(file_name);
    assert!(
        path.is_file(),
        "binary {name} not found at {}; build it first with `cargo build --workspace --bins` at the \
         repository root (scripts/compat.sh does), or point {BIN_DIR_ENV} at the directory holding it",
        path.display()
    );
    path
}

/// Polls `check` until it returns `Some`, and returns that. Panics, naming `what`, when
/// `timeout` passes first.
pub fn wait_until<T>(timeout: Duration, what: &str, check: impl FnMut() -> Option<T>) -> T {
    poll_until(timeout, check).unwrap_or_else(|| {
        panic!(
            "timed out after {} ms waiting for {what}",
            timeout.as_millis()
        )
    })
}

/// Polls `check` until it returns `Some`, and returns that; `None` when `timeout` passes first
/// (for callers that say more than [`wait_until`] does about what did not happen).
pub fn poll_until<T>(timeout: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(POLL_INTERVAL);
    }
}

// ---------------------------------------------------------------------------------------------
// Server processes

/// A running server binary, killed when dropped. Its stdout is read until the line
/// `<binary> listening on <addr>`; its stderr (the log) is captured and printed if the test
/// panics while the guard is alive.
#[derive(Debug)]
pub struct ServerProcess {
    name: String,
    child: Child,
    addr: SocketAddr,
    log_lines: Arc<Mutex<VecDeque<String>>>,
    /// Hears once the log reader has read the log to its end (the process exited).
    log_done: mpsc::Receiver<()>,
}

impl ServerProcess {
    /// Starts the binary `name` with `args` and waits (up to [`STARTUP_TIMEOUT`]) for its
    /// `listening on` line. Panics with the server's log when it does not come, or when the
    /// address is not a loopback one.
    #[must_use]
    pub fn start(name: &str, args: &[&str]) -> Self {
        let path = binary_path(name);
        let mut child = Command::new(&path)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|spawn_error| panic!("cannot start {}: {spawn_error}", path.display()));
        let log_lines = Arc::new(Mutex::new(VecDeque::new()));
        let stderr = child.stderr.take().expect("stderr is piped");
        let log_done = capture_lines(stderr, Arc::clone(&log_lines));
        let stdout = child.stdout.take().expect("stdout is piped");
        let stdout_lines = forward_lines(stdout);

        let prefix = format!("{name} listening on ");
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        let addr = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match stdout_lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(addr) = line.strip_prefix(&prefix) {
                        break addr
                            .trim()
                            .parse::<SocketAddr>()
                            .unwrap_or_else(|parse_error| {
                                panic!(
                                    "{name} printed an unparsable address {addr:?}: {parse_error}"
                                )
                            });
                    }
                }
                Err(wait_error) => {
                    let _ = child.kill();
                    let status = child.wait().ok();
                    let _ = log_done.recv_timeout(LOG_DRAIN_TIMEOUT);
                    panic!(
                        "{name} {args:?} did not print {prefix:?} ({wait_error:?}; exit status {status:?}); its log:\n{}",
                        joined(&log_lines)
                    );
                }
            }
        };
        assert!(
            addr.ip().is_loopback(),
            "{name} listens on {addr}, not on loopback"
        );
        Self {
            name: name.to_owned(),
            child,
            addr,
            log_lines,
            log_done,
        }
    }

    /// The address the server printed.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The log lines captured so far from stderr.
    #[must_use]
    pub fn log_lines(&self) -> Vec<String> {
        lock(&self.log_lines).iter().cloned().collect()
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if thread::panicking() {
            let _ = self.log_done.recv_timeout(LOG_DRAIN_TIMEOUT);
            eprintln!(
                "---- log of {} ({}) ----\n{}",
                self.name,
                self.addr,
                joined(&self.log_lines)
            );
        }
    }
}

/// A real `shardmq-namesrv` and a real `shardmq-broker` registered with it (as
/// [`BROKER_NAME`] in [`CLUSTER_NAME`]), each on a free loopback port, the broker over a temp
/// data dir; both killed on drop.
#[derive(Debug)]
pub struct LocalCluster {
    // Declared before the data dir so the broker is killed before its directory goes.
    pub broker: ServerProcess,
    pub namesrv: ServerProcess,
    data_dir: TempDir,
}

impl LocalCluster {
    /// Starts a name server, then a broker registered with it.
    #[must_use]
    pub fn start() -> Self {
        Self::start_with_broker_args(&[])
    }

    /// Starts a name server, then a broker registered with it and given `broker_args` besides
    /// the fixture's own (for instance a short transaction timeout).
    #[must_use]
    pub fn start_with_broker_args(broker_args: &[&str]) -> Self {
        let namesrv = ServerProcess::start("shardmq-namesrv", &["--listen", "127.0.0.1:0"]);
        let data_dir = TempDir::new().expect("a temp dir for the broker's data");
        let namesrv_addr = namesrv.addr().to_string();
        let data_dir_path = data_dir.path().to_str().expect("a UTF-8 temp dir path");
        let mut args = vec![
            "--namesrv",
            &namesrv_addr,
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data_dir_path,
            "--broker-name",
            BROKER_NAME,
            "--cluster-name",
            CLUSTER_NAME,
            // The disk is shared with builds and other tests: the broker must not delete
            // segments early because the disk is fuller than the default allows (75 %).
            "--disk-max-used-ratio",
            "0.99",
        ];
        args.extend_from_slice(broker_args);
        let broker = ServerProcess::start("shardmq-broker", &args);
        Self {
            broker,
            namesrv,
            data_dir,
        }
    }

    /// The name server's `host:port`, as clients are given it.
    #[must_use]
    pub fn namesrv_addr(&self) -> String {
        self.namesrv.addr().to_string()
    }

    /// The broker's `host:port`, as it registers it.
    #[must_use]
    pub fn broker_addr(&self) -> String {
        self.broker.addr().to_string()
    }

    /// The broker's data directory.
    #[must_use]
    pub fn data_dir(&self) -> &Path {
        self.data_dir.path()
    }

    /// Creates `topic` with `queues` read and write queues (perm read|write) on the broker with
    /// the `shardmq` CLI, then waits (up to [`ROUTE_TIMEOUT`]) until the name server routes it
    /// with that many queues over ShardMQ's own protocol (`shardmq topic route`): from then on
    /// a RocketMQ client must see the route at once.
    pub fn create_topic(&self, topic: &str, queues: u32) {
        let queues_arg = queues.to_string();
        let broker_addr = self.broker_addr();
        let created = self.cli(&[
            "topic",
            "create",
            topic,
            "--queues",
            &queues_arg,
            "--broker",
            &broker_addr,
        ]);
        assert!(
            created.status.success(),
            "shardmq topic create {topic} failed ({}): {}",
            created.status,
            String::from_utf8_lossy(&created.stderr)
        );
        wait_until(ROUTE_TIMEOUT, &format!("a route for {topic}"), || {
            let route = self.cli(&["--json", "topic", "route", topic]);
            if !route.status.success() {
                return None;
            }
            let route: serde_json::Value = serde_json::from_slice(&route.stdout).ok()?;
            let routed_write_queues: u64 = route["brokers"]
                .as_array()?
                .iter()
                .filter_map(|broker| broker["write_queues"].as_u64())
                .sum();
            (routed_write_queues == u64::from(queues)).then_some(())
        });
    }

    /// Runs the built `shardmq` CLI against this cluster's name server with `args`, and
    /// returns its exit status and output. Panics when it runs past [`CLI_TIMEOUT`] (it is
    /// killed then).
    #[must_use]
    pub fn cli(&self, args: &[&str]) -> Output {
        let mut child = Command::new(binary_path("shardmq"))
            .arg("--namesrv")
            .arg(self.namesrv_addr())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("shardmq runs");
        // Read both pipes on threads so that a chatty command never blocks on a full pipe.
        let stdout = read_to_end(child.stdout.take().expect("stdout is piped"));
        let stderr = read_to_end(child.stderr.take().expect("stderr is piped"));
        let status = poll_until(CLI_TIMEOUT, || child.try_wait().expect("shardmq's status"));
        let Some(status) = status else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "shardmq {args:?} did not finish within {} ms",
                CLI_TIMEOUT.as_millis()
            );
        };
        Output {
            status,
            stdout: stdout.join().expect("the stdout reader"),
            stderr: stderr.join().expect("the stderr reader"),
        }
    }

    /// Runs the CLI with `args` (which include `--json`), asserts that it succeeded, and
    /// returns the JSON objects it printed, one a line.
    #[must_use]
    pub fn cli_json_lines(&self, args: &[&str]) -> Vec<serde_json::Value> {
        let output = self.cli(args);
        assert!(
            output.status.success(),
            "shardmq {args:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter(|line| !line.trim().is_empty())
            .map(|line| {
                serde_json::from_str(line).unwrap_or_else(|parse_error| {
                    panic!("shardmq {args:?} printed {line:?}, not JSON: {parse_error}")
                })
            })
            .collect()
    }

    /// Waits (up to `timeout`) until `group` has committed, in every queue of `topic` that holds
    /// messages, the queue's end (`shardmq group progress`): from then on nothing the group has
    /// consumed can be delivered to it again.
    pub fn wait_until_group_caught_up(&self, group: &str, topic: &str, timeout: Duration) {
        wait_until(
            timeout,
            &format!("group {group} to commit the end of every queue of {topic}"),
            || {
                let output = self.cli(&["--json", "group", "progress", group, "--topic", topic]);
                if !output.status.success() {
                    return None;
                }
                let progress: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
                let queues = progress["queues"].as_array()?;
                let is_caught_up = queues.iter().all(|queue| {
                    let end = queue["max_offset"].as_u64().unwrap_or(0);
                    let committed = queue["committed_offset"].as_u64().unwrap_or(0);
                    committed >= end
                });
                (!queues.is_empty() && is_caught_up).then_some(())
            },
        );
    }
}

/// Reads `source` to its end on a thread.
fn read_to_end(mut source: impl Read + Send + 'static) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = source.read_to_end(&mut bytes);
        bytes
    })
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn joined(lines: &Mutex<VecDeque<String>>) -> String {
    lock(lines).iter().cloned().collect::<Vec<_>>().join("\n")
}

/// Reads `source` into `lines` on a thread; the receiver hears once it has read to the end.
fn capture_lines(
    source: impl Read + Send + 'static,
    lines: Arc<Mutex<VecDeque<String>>>,
) -> mpsc::Receiver<()> {
    let (done, done_receiver) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(source).lines() {
            let Ok(line) = line else { break };
            let mut lines = lock(&lines);
            if lines.len() == MAX_CAPTURED_LOG_LINES {
                lines.pop_front();
            }
            lines.push_back(line);
        }
        let _ = done.send(());
    });
    done_receiver
}

/// Reads `source` line by line into a channel until it closes (the reader keeps draining after
/// the receiver is gone, so the child never blocks on a full pipe).
fn forward_lines(source: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (sender, receiver) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(source).lines() {
            let Ok(line) = line else { break };
            let _ = sender.send(line);
        }
    });
    receiver
}
