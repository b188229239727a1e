//! Integration-test support: start the real binaries and talk to them over the real protocol
//! (the tests themselves are in `tests/`).
//!
//! Owns: locating the built binaries ([`binary_path`]), process guards that start a server,
//! learn its address from its `listening on` line and kill it on drop ([`ServerProcess`],
//! [`NamesrvProcess`], [`BrokerProcess`]), a blocking wire client ([`TestClient`]) with
//! builders for the broker's requests ([`send_request_body`], [`pull_request_body`], ...) and
//! condition polling with a deadline ([`wait_until`]). Never: building the binaries (run
//! `cargo build --workspace --bins` first), or anything that needs a runtime: everything here
//! is std threads and blocking sockets, so it works the same against the tokio namesrv and the
//! glommio broker.
//!
//! Data enters as the servers' stdout/stderr lines and response frames; it leaves as parsed
//! addresses, [`VerifiedFrame`]s and captured log lines (printed when a test fails).
//!
//! Size: over 800 lines because it is the one harness every integration test shares (process
//! guards, the blocking wire client, wait helpers); splitting it would scatter what a test author
//! looks up together.

use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use flatbuffers::{FlatBufferBuilder, UnionWIPOffset, WIPOffset};
use shardmq_schema::wire;
use shardmq_schema::{
    build_frame, FrameDecoder, FrameEncoder, FrameError, FrameHeader, VerifiedFrame,
    MIN_PROTOCOL_VERSION, PROTOCOL_VERSION,
};

/// How long a [`TestClient`] waits for one read before giving up.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a server may take to print its `listening on` line.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);

/// How often [`wait_until`] re-checks its condition.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Most stderr lines a [`ServerProcess`] keeps (the oldest are dropped).
const MAX_CAPTURED_LOG_LINES: usize = 10_000;

/// Bytes a [`TestClient`] reads at once.
const READ_CHUNK_BYTES: usize = 16 * 1024;

/// The client id test clients announce in their handshake.
pub const TEST_CLIENT_ID: &str = "shardmq-tests";

// ---------------------------------------------------------------------------------------------
// Binaries and waiting

/// The built binary `name` of this workspace: looked for next to the running test executable
/// (`<target>/<profile>/`), then in `$CARGO_TARGET_DIR/debug/`, then in
/// `<workspace>/target/debug/`. Panics, saying how to build it, when none exists.
#[must_use]
pub fn binary_path(name: &str) -> PathBuf {
    let candidates = binary_candidates(name);
    if let Some(found) = candidates.iter().find(|path| path.is_file()) {
        return found.clone();
    }
    let looked_in: Vec<String> = candidates
        .iter()
        .map(|path| path.display().to_string())
        .collect();
    panic!(
        "binary {name} not found (looked for {}); build it first with `cargo build --workspace --bins`",
        looked_in.join(", ")
    );
}

fn binary_candidates(name: &str) -> Vec<PathBuf> {
    let file_name = format!("{name}{}", std::env::consts::EXE_SUFFIX);
    let mut candidates = Vec::new();
    // Test executables live in <target>/<profile>/deps/; the binaries in <target>/<profile>/.
    if let Ok(test_executable) = std::env::current_exe() {
        if let Some(profile_dir) = test_executable.parent().and_then(Path::parent) {
            candidates.push(profile_dir.join(&file_name));
        }
    }
    let workspace_root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    if let Some(target_dir) = std::env::var_os("CARGO_TARGET_DIR") {
        // A relative CARGO_TARGET_DIR is relative to where cargo ran: the workspace, usually.
        candidates.push(
            workspace_root
                .join(target_dir)
                .join("debug")
                .join(&file_name),
        );
    }
    candidates.push(workspace_root.join("target").join("debug").join(&file_name));
    candidates
}

/// Polls `check` until it returns `Some`, and returns that. Panics, naming `what`, when
/// `timeout` passes first.
pub fn wait_until<T>(timeout: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {} ms waiting for {what}",
            timeout.as_millis()
        );
        thread::sleep(POLL_INTERVAL);
    }
}

/// Async [`wait_until`] for tests on a tokio runtime: awaits `check` every 20 ms until it
/// yields `Some`, and returns that. Panics, naming `what`, when `timeout` passes first.
pub async fn eventually_some<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {} ms waiting for {what}",
            timeout.as_millis()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// [`eventually_some`] for a condition: awaits `check` until it holds.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let check = || {
        let condition = check();
        async move { condition.await.then_some(()) }
    };
    eventually_some(timeout, what, check).await;
}

/// Commits `offset` for `group` on (`topic`, `queue_id`) over the raw protocol; the answer
/// must be OK.
pub fn commit_offset(
    client: &mut TestClient,
    group: &str,
    topic: &str,
    queue_id: i32,
    offset: i64,
) {
    let response = client
        .request(|builder| {
            let group = builder.create_string(group);
            let topic = builder.create_string(topic);
            let request = wire::CommitConsumerOffsetRequest::create(
                builder,
                &wire::CommitConsumerOffsetRequestArgs {
                    consumer_group: Some(group),
                    topic: Some(topic),
                    queue_id,
                    offset,
                },
            );
            (
                wire::Body::CommitConsumerOffsetRequest,
                request.as_union_value(),
            )
        })
        .expect("an answer to CommitConsumerOffsetRequest");
    assert_eq!(
        status_of(&response).0,
        wire::Status::OK,
        "committing a consumer offset: {:?}",
        status_of(&response)
    );
}

/// The offset `group` committed on (`topic`, `queue_id`); `None` when the broker knows none.
pub fn committed_offset(
    client: &mut TestClient,
    group: &str,
    topic: &str,
    queue_id: i32,
) -> Option<i64> {
    let response = client
        .request(|builder| {
            let group = builder.create_string(group);
            let topic = builder.create_string(topic);
            let request = wire::QueryConsumerOffsetRequest::create(
                builder,
                &wire::QueryConsumerOffsetRequestArgs {
                    consumer_group: Some(group),
                    topic: Some(topic),
                    queue_id,
                },
            );
            (
                wire::Body::QueryConsumerOffsetRequest,
                request.as_union_value(),
            )
        })
        .expect("an answer to QueryConsumerOffsetRequest");
    if status_of(&response).0 == wire::Status::CONSUMER_GROUP_NOT_FOUND {
        return None;
    }
    assert_eq!(
        status_of(&response).0,
        wire::Status::OK,
        "querying a consumer offset: {:?}",
        status_of(&response)
    );
    Some(
        response
            .frame()
            .body_as_offset_response()
            .expect("an OffsetResponse")
            .offset(),
    )
}

/// Sends signal `name` (`STOP`, `CONT`, …) to process `pid` with `kill`; panics if it fails.
pub fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{name} {pid}");
}

/// Runs the built `shardmq` command line against the name server `namesrv` with `args`.
#[must_use]
pub fn run_cli(namesrv: &str, args: &[&str]) -> std::process::Output {
    Command::new(binary_path("shardmq"))
        .arg("--namesrv")
        .arg(namesrv)
        .args(args)
        .output()
        .expect("shardmq runs")
}

// ---------------------------------------------------------------------------------------------
// Server processes

/// A running server binary, killed when dropped. Its stdout is read until the line
/// `<binary> listening on <addr>`; its stderr (the log) is captured and printed if the test
/// fails while the guard is alive.
#[derive(Debug)]
pub struct ServerProcess {
    name: String,
    child: Child,
    addr: SocketAddr,
    log_lines: Arc<Mutex<VecDeque<String>>>,
    /// Signalled when the log reader has read the log to its end (the process exited).
    log_done: Mutex<mpsc::Receiver<()>>,
}

impl ServerProcess {
    /// Starts the workspace binary `name` with `args` and waits (up to [`STARTUP_TIMEOUT`]) for
    /// its `listening on` line. Panics with the server's log when it does not come.
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
                    // Give the stderr thread a moment to collect the last lines.
                    thread::sleep(Duration::from_millis(100));
                    panic!(
                        "{name} {args:?} did not print {prefix:?} ({wait_error:?}; exit status {status:?}); its log:\n{}",
                        joined(&log_lines)
                    );
                }
            }
        };
        Self {
            name: name.to_owned(),
            child,
            addr,
            log_lines,
            log_done: Mutex::new(log_done),
        }
    }

    /// The address the server printed.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server's process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The log lines captured so far from stderr.
    #[must_use]
    pub fn log_lines(&self) -> Vec<String> {
        lock(&self.log_lines).iter().cloned().collect()
    }

    /// Whether the process has not exited yet.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends `signal` (`TERM`, `INT`, `KILL`) with the system's `kill` command and waits up to
    /// `timeout` for the process to exit. Returns its exit status, `None` if it is still
    /// running.
    pub fn signal_and_wait(&mut self, signal: &str, timeout: Duration) -> Option<ExitStatus> {
        let sent = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("the kill command runs");
        assert!(sent.success(), "kill -{signal} {} failed", self.child.id());
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                // Its last log lines are read before the caller looks at them.
                if let Ok(log_done) = self.log_done.get_mut() {
                    let _ = log_done.recv_timeout(LOG_DRAIN_TIMEOUT);
                }
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(POLL_INTERVAL);
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if thread::panicking() {
            eprintln!(
                "---- log of {} ({}) ----\n{}",
                self.name,
                self.addr,
                joined(&self.log_lines)
            );
        }
    }
}

/// The real `shardmq-namesrv`, started on `127.0.0.1:0` and killed on drop.
#[derive(Debug)]
pub struct NamesrvProcess {
    process: ServerProcess,
    args: Vec<String>,
}

impl NamesrvProcess {
    /// The program name, also the prefix of its `listening on` line.
    pub const BINARY: &'static str = "shardmq-namesrv";

    /// Starts a namesrv with default options on a free loopback port.
    #[must_use]
    pub fn start() -> Self {
        Self::start_with_args(&[])
    }

    /// Starts a namesrv on a free loopback port with extra command-line `args` (for example
    /// `["--broker-timeout-ms", "300"]`).
    #[must_use]
    pub fn start_with_args(args: &[&str]) -> Self {
        let mut all_args = vec!["--listen", "127.0.0.1:0"];
        all_args.extend_from_slice(args);
        Self {
            process: ServerProcess::start(Self::BINARY, &all_args),
            args: args.iter().map(|&a| a.to_owned()).collect(),
        }
    }

    /// Starts the name server again with the same options (on a new free port; a running one
    /// is killed first).
    pub fn restart(&mut self) {
        if self.process.is_running() {
            let _ = self.process.signal_and_wait("KILL", STOP_TIMEOUT);
        }
        let mut all_args = vec!["--listen", "127.0.0.1:0"];
        all_args.extend(self.args.iter().map(String::as_str));
        self.process = ServerProcess::start(Self::BINARY, &all_args);
    }

    /// A connected client that has completed the handshake.
    #[must_use]
    pub fn client(&self) -> TestClient {
        let mut client = TestClient::connect(self.addr()).unwrap_or_else(|connect_error| {
            panic!("cannot connect to {}: {connect_error}", self.addr())
        });
        client.handshake().expect("handshake with the namesrv");
        client
    }
}

impl Deref for NamesrvProcess {
    type Target = ServerProcess;

    fn deref(&self) -> &ServerProcess {
        &self.process
    }
}

impl std::ops::DerefMut for NamesrvProcess {
    fn deref_mut(&mut self) -> &mut ServerProcess {
        &mut self.process
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn joined(lines: &Mutex<VecDeque<String>>) -> String {
    lock(lines).iter().cloned().collect::<Vec<_>>().join("\n")
}

/// Reads `source` line by line into `lines` until it closes.
/// How long a stopped server's log reader may take to read the log's last lines.
const LOG_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

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

// ---------------------------------------------------------------------------------------------
// The wire client

/// Why a [`TestClient`] call failed.
#[derive(Debug)]
pub enum ClientError {
    /// A socket error (a read past [`IO_TIMEOUT`] is `WouldBlock` or `TimedOut`).
    Io(io::Error),
    /// The server's bytes are not a valid frame.
    Frame(FrameError),
    /// The server closed the connection (end of stream or reset).
    Closed,
    /// A frame arrived that is not the response awaited.
    UnexpectedFrame {
        awaited_request_id: u64,
        frame: VerifiedFrame,
    },
    /// The response's status is not `OK` (only from calls that require `OK`).
    Status {
        status: wire::Status,
        message: Option<String>,
    },
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Io(io_error) => write!(formatter, "socket error: {io_error}"),
            Self::Frame(frame_error) => {
                write!(formatter, "bad frame from the server: {frame_error}")
            }
            Self::Closed => formatter.write_str("the server closed the connection"),
            Self::UnexpectedFrame {
                awaited_request_id,
                frame,
            } => write!(
                formatter,
                "awaiting the response to request {awaited_request_id}, got {frame:?}"
            ),
            Self::Status { status, message } => {
                write!(
                    formatter,
                    "status {status:?}: {}",
                    message.as_deref().unwrap_or("")
                )
            }
        }
    }
}

impl std::error::Error for ClientError {}

impl From<io::Error> for ClientError {
    fn from(io_error: io::Error) -> Self {
        if matches!(
            io_error.kind(),
            io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
        ) {
            Self::Closed
        } else {
            Self::Io(io_error)
        }
    }
}

impl From<FrameError> for ClientError {
    fn from(frame_error: FrameError) -> Self {
        Self::Frame(frame_error)
    }
}

/// A blocking client for any ShardMQ server (namesrv or broker): one TCP connection, frames
/// encoded and decoded with the schema crate's codec, request ids numbered from 1. Reads time
/// out after [`IO_TIMEOUT`] so a test fails instead of hanging.
#[derive(Debug)]
pub struct TestClient {
    stream: TcpStream,
    decoder: FrameDecoder,
    encoder: FrameEncoder,
    read_buffer: BytesMut,
    next_request_id: u64,
}

impl TestClient {
    /// Connects to `addr`. No handshake yet: see [`handshake`](Self::handshake).
    pub fn connect(addr: SocketAddr) -> io::Result<Self> {
        let stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
        stream.set_read_timeout(Some(IO_TIMEOUT))?;
        stream.set_write_timeout(Some(IO_TIMEOUT))?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            decoder: FrameDecoder::new(),
            encoder: FrameEncoder::new(),
            read_buffer: BytesMut::with_capacity(READ_CHUNK_BYTES),
            next_request_id: 1,
        })
    }

    /// Changes how long one read may wait.
    pub fn set_read_timeout(&self, timeout: Duration) -> io::Result<()> {
        self.stream.set_read_timeout(Some(timeout))
    }

    /// Changes how long one write may wait (for a server that stopped reading).
    pub fn set_write_timeout(&self, timeout: Duration) -> io::Result<()> {
        self.stream.set_write_timeout(Some(timeout))
    }

    /// Shakes hands with this build's protocol version; the response must be `OK`.
    pub fn handshake(&mut self) -> Result<VerifiedFrame, ClientError> {
        let response = self.handshake_with_versions(PROTOCOL_VERSION, MIN_PROTOCOL_VERSION)?;
        require_ok(response)
    }

    /// Sends a `HandshakeRequest` offering `min_protocol_version..=protocol_version` and
    /// returns the response whatever its status.
    pub fn handshake_with_versions(
        &mut self,
        protocol_version: u32,
        min_protocol_version: u32,
    ) -> Result<VerifiedFrame, ClientError> {
        self.request(|builder| {
            let client_id = builder.create_string(TEST_CLIENT_ID);
            let client_version =
                builder.create_string(concat!("shardmq-tests ", env!("CARGO_PKG_VERSION")));
            let request = wire::HandshakeRequest::create(
                builder,
                &wire::HandshakeRequestArgs {
                    protocol_version,
                    min_protocol_version,
                    client_id: Some(client_id),
                    client_version: Some(client_version),
                },
            );
            (wire::Body::HandshakeRequest, request.as_union_value())
        })
    }

    /// Sends a REQUEST whose body `build` writes (returning the body's type and offset) and
    /// returns its response, which must be the next frame the server sends.
    pub fn request<F>(&mut self, build: F) -> Result<VerifiedFrame, ClientError>
    where
        F: FnOnce(&mut FlatBufferBuilder<'static>) -> (wire::Body, WIPOffset<UnionWIPOffset>),
    {
        let request_id = self.send_request(build)?;
        self.read_response(request_id)
    }

    /// Sends a REQUEST without waiting for its response (for pipelining); returns its id.
    pub fn send_request<F>(&mut self, build: F) -> Result<u64, ClientError>
    where
        F: FnOnce(&mut FlatBufferBuilder<'static>) -> (wire::Body, WIPOffset<UnionWIPOffset>),
    {
        let request_id = self.take_request_id();
        let bytes = self.encode_request(request_id, build)?;
        self.send_bytes(&bytes)?;
        Ok(request_id)
    }

    /// Encodes a REQUEST with id `request_id` without sending it (to send it in pieces, cut
    /// it, or send several in one write).
    pub fn encode_request<F>(&mut self, request_id: u64, build: F) -> Result<Bytes, ClientError>
    where
        F: FnOnce(&mut FlatBufferBuilder<'static>) -> (wire::Body, WIPOffset<UnionWIPOffset>),
    {
        Ok(self.encoder.encode(|builder| {
            let (body_type, body) = build(builder);
            build_frame(
                builder,
                &FrameHeader::request(request_id),
                body_type,
                Some(body),
            )
        })?)
    }

    /// Encodes a whole frame written by `build` (which ends with `build_frame` or
    /// `wire::Frame::create`), for frames no well-behaved client sends: odd kinds, a body
    /// without a type, a chosen request id.
    pub fn encode_frame<F>(&mut self, build: F) -> Result<Bytes, ClientError>
    where
        F: FnOnce(&mut FlatBufferBuilder<'static>) -> WIPOffset<wire::Frame<'static>>,
    {
        Ok(self.encoder.encode(build)?)
    }

    /// The next request id, consumed.
    pub fn take_request_id(&mut self) -> u64 {
        let request_id = self.next_request_id;
        self.next_request_id += 1;
        request_id
    }

    /// Writes `bytes` to the socket as they are.
    pub fn send_bytes(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.stream.write_all(bytes)?;
        Ok(())
    }

    /// Closes the sending direction: the server sees end of stream, and its answers can still
    /// be read.
    pub fn shutdown_write(&self) -> io::Result<()> {
        self.stream.shutdown(Shutdown::Write)
    }

    /// Reads frames until the RESPONSE to `request_id`; any other frame first is an error.
    pub fn read_response(&mut self, request_id: u64) -> Result<VerifiedFrame, ClientError> {
        let frame = self.read_frame()?;
        let header = frame.frame();
        if header.kind() == wire::FrameKind::RESPONSE && header.request_id() == request_id {
            Ok(frame)
        } else {
            Err(ClientError::UnexpectedFrame {
                awaited_request_id: request_id,
                frame,
            })
        }
    }

    /// The next frame from the server.
    pub fn read_frame(&mut self) -> Result<VerifiedFrame, ClientError> {
        loop {
            if let Some(frame) = self.decoder.decode(&mut self.read_buffer)? {
                return Ok(frame);
            }
            let mut chunk = [0u8; READ_CHUNK_BYTES];
            let read_bytes = self.stream.read(&mut chunk)?;
            if read_bytes == 0 {
                return Err(ClientError::Closed);
            }
            self.read_buffer.extend_from_slice(&chunk[..read_bytes]);
        }
    }

    /// Every frame the server sends until it closes the connection. An error if it does not
    /// close within the read timeout or sends something that is not a frame.
    pub fn read_until_closed(&mut self) -> Result<Vec<VerifiedFrame>, ClientError> {
        let mut frames = Vec::new();
        loop {
            match self.read_frame() {
                Ok(frame) => frames.push(frame),
                Err(ClientError::Closed) => return Ok(frames),
                Err(other) => return Err(other),
            }
        }
    }
}

/// `frame` if its status is `OK`, else [`ClientError::Status`].
pub fn require_ok(frame: VerifiedFrame) -> Result<VerifiedFrame, ClientError> {
    let header = frame.frame();
    if header.status() == wire::Status::OK {
        Ok(frame)
    } else {
        Err(ClientError::Status {
            status: header.status(),
            message: header.message().map(str::to_owned),
        })
    }
}

/// A frame's status and message, for assertions.
#[must_use]
pub fn status_of(frame: &VerifiedFrame) -> (wire::Status, Option<String>) {
    let header = frame.frame();
    (header.status(), header.message().map(str::to_owned))
}

// ---------------------------------------------------------------------------------------------
// The broker

/// How long a stopping server may take to exit (a graceful stop waits up to 5 s for in-flight
/// requests, then flushes).
pub const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// The real `shardmq-broker`, started on `127.0.0.1:0` over a data directory the test owns
/// (a tempdir it keeps for the test's length), killed on drop. It can be stopped (SIGTERM),
/// killed (SIGKILL) and started again on the same directory with the same options; each start
/// picks a new free port.
#[derive(Debug)]
pub struct BrokerProcess {
    process: ServerProcess,
    data_dir: PathBuf,
    args: Vec<String>,
    /// The logs of the runs before [`restart`](Self::restart)s, oldest first.
    earlier_logs: Vec<String>,
}

impl BrokerProcess {
    /// The program name, also the prefix of its `listening on` line.
    pub const BINARY: &'static str = "shardmq-broker";

    /// Starts a broker on a free loopback port over `data_dir` with extra command-line `args`
    /// (for example `["--storage-cores", "0,1", "--network-cores", "1"]`).
    #[must_use]
    pub fn start(data_dir: &Path, args: &[&str]) -> Self {
        let args: Vec<String> = args.iter().map(|&arg| arg.to_owned()).collect();
        Self {
            process: Self::spawn(data_dir, &args),
            data_dir: data_dir.to_owned(),
            args,
            earlier_logs: Vec::new(),
        }
    }

    fn spawn(data_dir: &Path, args: &[String]) -> ServerProcess {
        let data_dir = data_dir
            .to_str()
            .unwrap_or_else(|| panic!("data dir {} is not UTF-8", data_dir.display()));
        let mut all_args = vec!["--listen", "127.0.0.1:0", "--data-dir", data_dir];
        // The machine's disk is shared with everything else the tests and builds write: unless a
        // test is about disk use, its broker does not delete segments early because the disk is
        // fuller than the default allows (75 %); tests with small segments would see their
        // oldest messages go.
        let flag = "--disk-max-used-ratio";
        let uses_config_file = args.iter().any(|arg| arg == "--config");
        if !uses_config_file && !args.iter().any(|arg| arg == flag) {
            all_args.extend([flag, "0.99"]);
        }
        all_args.extend(args.iter().map(String::as_str));
        ServerProcess::start(Self::BINARY, &all_args)
    }

    /// The data directory the broker runs on.
    #[must_use]
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// A connected client that has completed the handshake.
    #[must_use]
    pub fn client(&self) -> TestClient {
        let mut client = TestClient::connect(self.addr()).unwrap_or_else(|connect_error| {
            panic!(
                "cannot connect to the broker at {}: {connect_error}",
                self.addr()
            )
        });
        client.handshake().expect("handshake with the broker");
        client
    }

    /// Stops the broker with SIGTERM and waits for it to exit; panics unless it exits with
    /// status 0 within [`STOP_TIMEOUT`].
    pub fn stop(&mut self) {
        let status = self
            .process
            .signal_and_wait("TERM", STOP_TIMEOUT)
            .unwrap_or_else(|| {
                panic!(
                    "the broker did not exit within {} s of SIGTERM",
                    STOP_TIMEOUT.as_secs()
                )
            });
        assert!(
            status.success(),
            "the broker exited with {status} after SIGTERM, not 0"
        );
    }

    /// Kills the broker with SIGKILL (nothing is flushed or persisted on the way out) and waits
    /// for it to exit.
    pub fn kill9(&mut self) {
        let status = self.process.signal_and_wait("KILL", STOP_TIMEOUT);
        assert!(status.is_some(), "the broker survived SIGKILL");
    }

    /// Starts the broker again on the same data directory with the same options (after
    /// [`stop`](Self::stop) or [`kill9`](Self::kill9); a running broker is killed first).
    pub fn restart(&mut self) {
        if self.process.is_running() {
            self.kill9();
        }
        let run = self.earlier_runs() + 1;
        self.earlier_logs
            .push(format!("---- run {run} of this broker ----"));
        self.earlier_logs.extend(self.process.log_lines());
        self.process = Self::spawn(&self.data_dir, &self.args);
    }

    /// The log of every run of this broker, the earlier ones (before each
    /// [`restart`](Self::restart)) first, then the current one's lines so far.
    #[must_use]
    pub fn all_log_lines(&self) -> Vec<String> {
        let mut lines = self.earlier_logs.clone();
        lines.push(format!(
            "---- run {} of this broker (the current one) ----",
            self.earlier_runs() + 1
        ));
        lines.extend(self.process.log_lines());
        lines
    }

    /// How many runs came before the current one.
    fn earlier_runs(&self) -> usize {
        self.earlier_logs
            .iter()
            .filter(|line| line.starts_with("---- run "))
            .count()
    }
}

impl Deref for BrokerProcess {
    type Target = ServerProcess;

    fn deref(&self) -> &ServerProcess {
        &self.process
    }
}

impl std::ops::DerefMut for BrokerProcess {
    fn deref_mut(&mut self) -> &mut ServerProcess {
        &mut self.process
    }
}

/// A message for [`send_request_body`]: a body and the optional fields tests set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TestMessage {
    pub body: Vec<u8>,
    pub tags: Option<String>,
    pub keys: Vec<String>,
    pub unique_id: Option<String>,
    /// User properties (name, value).
    pub properties: Vec<(String, String)>,
    pub born_timestamp_ms: i64,
}

impl TestMessage {
    /// A message with only a body.
    #[must_use]
    pub fn new(body: impl Into<Vec<u8>>) -> Self {
        Self {
            body: body.into(),
            ..Self::default()
        }
    }

    /// The same message with tag `tag`.
    #[must_use]
    pub fn tag(self, tag: &str) -> Self {
        Self {
            tags: Some(tag.to_owned()),
            ..self
        }
    }

    /// The same message with `keys`.
    #[must_use]
    pub fn keys(self, keys: &[&str]) -> Self {
        Self {
            keys: keys.iter().map(|&key| key.to_owned()).collect(),
            ..self
        }
    }

    /// The same message with unique id `unique_id`.
    #[must_use]
    pub fn unique_id(self, unique_id: &str) -> Self {
        Self {
            unique_id: Some(unique_id.to_owned()),
            ..self
        }
    }

    /// The same message with user property `name` = `value` added.
    #[must_use]
    pub fn property(mut self, name: &str, value: &str) -> Self {
        self.properties.push((name.to_owned(), value.to_owned()));
        self
    }
}

/// The body type and offset a [`TestClient::request`] closure returns.
pub type RequestBody = (wire::Body, WIPOffset<UnionWIPOffset>);

/// Writes an `UpsertTopicRequest` for `name` with `read_queues`/`write_queues` and `perm`.
pub fn upsert_topic_body(
    builder: &mut FlatBufferBuilder<'static>,
    name: &str,
    (read_queues, write_queues, perm): (u32, u32, u32),
    is_create_only: bool,
) -> RequestBody {
    let name = builder.create_string(name);
    let config = wire::TopicConfig::create(
        builder,
        &wire::TopicConfigArgs {
            name: Some(name),
            read_queues,
            write_queues,
            perm,
            is_ordered: false,
        },
    );
    let request = wire::UpsertTopicRequest::create(
        builder,
        &wire::UpsertTopicRequestArgs {
            config: Some(config),
            create_only: is_create_only,
        },
    );
    (wire::Body::UpsertTopicRequest, request.as_union_value())
}

/// Writes a `SendRequest` of `messages` to (`topic`, `queue_id`; -1 lets the broker choose).
pub fn send_request_body(
    builder: &mut FlatBufferBuilder<'static>,
    topic: &str,
    queue_id: i32,
    messages: &[TestMessage],
) -> RequestBody {
    let messages: Vec<_> = messages
        .iter()
        .map(|message| {
            let body = builder.create_vector(&message.body);
            let tags = message
                .tags
                .as_deref()
                .map(|tags| builder.create_string(tags));
            let keys = (!message.keys.is_empty()).then(|| {
                let keys: Vec<_> = message
                    .keys
                    .iter()
                    .map(|key| builder.create_string(key))
                    .collect();
                builder.create_vector(&keys)
            });
            let unique_id = message
                .unique_id
                .as_deref()
                .map(|unique_id| builder.create_string(unique_id));
            let properties = (!message.properties.is_empty()).then(|| {
                let pairs: Vec<_> = message
                    .properties
                    .iter()
                    .map(|(name, value)| {
                        let key = builder.create_string(name);
                        let value = builder.create_string(value);
                        wire::KeyValue::create(
                            builder,
                            &wire::KeyValueArgs {
                                key: Some(key),
                                value: Some(value),
                            },
                        )
                    })
                    .collect();
                builder.create_vector(&pairs)
            });
            wire::Message::create(
                builder,
                &wire::MessageArgs {
                    body: Some(body),
                    tags,
                    keys,
                    born_timestamp_ms: message.born_timestamp_ms,
                    unique_id,
                    properties,
                    ..Default::default()
                },
            )
        })
        .collect();
    let messages = builder.create_vector(&messages);
    let topic = builder.create_string(topic);
    let producer_group = builder.create_string("test-producers");
    let request = wire::SendRequest::create(
        builder,
        &wire::SendRequestArgs {
            topic: Some(topic),
            queue_id,
            producer_group: Some(producer_group),
            messages: Some(messages),
        },
    );
    (wire::Body::SendRequest, request.as_union_value())
}

/// What a pull asks for; [`PullParams::new`] gives an immediate (no long poll) pull of up to
/// 32 messages of every tag, without a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullParams {
    pub consumer_group: Option<String>,
    pub topic: String,
    pub queue_id: i32,
    pub queue_offset: i64,
    pub max_messages: u32,
    pub tag_expression: Option<String>,
    pub suspend_timeout_ms: u32,
    pub commit_offset: i64,
}

impl PullParams {
    #[must_use]
    pub fn new(topic: &str, queue_id: i32, queue_offset: i64) -> Self {
        Self {
            consumer_group: None,
            topic: topic.to_owned(),
            queue_id,
            queue_offset,
            max_messages: 32,
            tag_expression: None,
            suspend_timeout_ms: 0,
            commit_offset: -1,
        }
    }
}

/// Writes a `PullRequest` for `params`.
pub fn pull_request_body(
    builder: &mut FlatBufferBuilder<'static>,
    params: &PullParams,
) -> RequestBody {
    let consumer_group = params
        .consumer_group
        .as_deref()
        .map(|group| builder.create_string(group));
    let topic = builder.create_string(&params.topic);
    let tag_expression = params
        .tag_expression
        .as_deref()
        .map(|expression| builder.create_string(expression));
    let request = wire::PullRequest::create(
        builder,
        &wire::PullRequestArgs {
            consumer_group,
            topic: Some(topic),
            queue_id: params.queue_id,
            queue_offset: params.queue_offset,
            max_messages: params.max_messages,
            max_bytes: 0,
            tag_expression,
            suspend_timeout_ms: params.suspend_timeout_ms,
            commit_offset: params.commit_offset,
            expression_type: None,
        },
    );
    (wire::Body::PullRequest, request.as_union_value())
}

/// Splits the `records` of a pull or query response into the stored records it concatenates,
/// each starting with its total size (`u32` big-endian). Panics on a size that does not fit.
#[must_use]
pub fn split_records(records: &[u8]) -> Vec<&[u8]> {
    let mut split = Vec::new();
    let mut rest = records;
    while !rest.is_empty() {
        assert!(
            rest.len() >= 4,
            "{} stray bytes after the last record",
            rest.len()
        );
        let total_size = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        assert!(
            (4..=rest.len()).contains(&total_size),
            "a record claims {total_size} bytes, {} are left",
            rest.len()
        );
        split.push(&rest[..total_size]);
        rest = &rest[total_size..];
    }
    split
}

impl TestClient {
    /// Like [`request`](Self::request), but ONE_WAY frames the server pushes before the
    /// response (such as a broker's `ConsumerIdsChangedNotice`) are collected instead of being
    /// an error. Returns the response and those frames.
    pub fn request_collecting_one_way<F>(
        &mut self,
        build: F,
    ) -> Result<(VerifiedFrame, Vec<VerifiedFrame>), ClientError>
    where
        F: FnOnce(&mut FlatBufferBuilder<'static>) -> (wire::Body, WIPOffset<UnionWIPOffset>),
    {
        let request_id = self.send_request(build)?;
        let mut one_way = Vec::new();
        loop {
            let frame = self.read_frame()?;
            let header = frame.frame();
            if header.kind() == wire::FrameKind::ONE_WAY {
                one_way.push(frame);
            } else if header.kind() == wire::FrameKind::RESPONSE
                && header.request_id() == request_id
            {
                return Ok((frame, one_way));
            } else {
                return Err(ClientError::UnexpectedFrame {
                    awaited_request_id: request_id,
                    frame,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "cargo build --workspace --bins")]
    fn missing_binary_says_how_to_build_it() {
        let _ = binary_path("shardmq-no-such-binary");
    }

    #[test]
    fn wait_until_returns_the_value() {
        let mut calls = 0;
        let value = wait_until(Duration::from_secs(5), "the third call", || {
            calls += 1;
            (calls == 3).then_some(calls)
        });
        assert_eq!(value, 3);
    }
}

// ---------------------------------------------------------------------------------------------
// A namesrv with a broker registered (client library and CLI tests)

/// How long a new topic may take to appear in the namesrv's routes (the broker registers
/// right after a topic change).
pub const ROUTE_TIMEOUT: Duration = Duration::from_secs(20);

/// A real namesrv and a real broker registered with it (`--namesrv`), each on a free loopback
/// port, both killed on drop: what a client needs to find topics by name.
#[derive(Debug)]
pub struct LocalCluster {
    pub namesrv: NamesrvProcess,
    pub broker: BrokerProcess,
}

impl LocalCluster {
    /// Starts a namesrv, then a broker over `data_dir` (which the test owns) registered with it.
    #[must_use]
    pub fn start(data_dir: &Path) -> Self {
        Self::start_with_broker_args(data_dir, &[])
    }

    /// Like [`start`](Self::start), with extra broker arguments (for example
    /// `["--auto-create-topics"]`).
    #[must_use]
    pub fn start_with_broker_args(data_dir: &Path, broker_args: &[&str]) -> Self {
        let namesrv = NamesrvProcess::start();
        let namesrv_addr = namesrv.addr().to_string();
        let mut args = vec!["--namesrv", namesrv_addr.as_str()];
        args.extend_from_slice(broker_args);
        let broker = BrokerProcess::start(data_dir, &args);
        Self { namesrv, broker }
    }

    /// The namesrv's `host:port`, as clients are given it.
    #[must_use]
    pub fn namesrv_addr(&self) -> String {
        self.namesrv.addr().to_string()
    }

    /// The broker's `host:port`.
    #[must_use]
    pub fn broker_addr(&self) -> String {
        self.broker.addr().to_string()
    }

    /// Creates `topic` with `queues` read and write queues on the broker and waits (up to
    /// [`ROUTE_TIMEOUT`]) until the namesrv routes it with that many queues.
    pub fn create_topic(&self, topic: &str, queues: u32) {
        let mut broker = self.broker.client();
        let created = broker
            .request(|builder| upsert_topic_body(builder, topic, (queues, queues, 6), false))
            .and_then(require_ok);
        if let Err(error) = created {
            panic!("creating topic {topic}: {error}");
        }
        let mut namesrv = self.namesrv.client();
        wait_until(ROUTE_TIMEOUT, &format!("a route for {topic}"), || {
            let frame = namesrv
                .request(|builder| {
                    let topic = builder.create_string(topic);
                    let request = wire::GetRouteRequest::create(
                        builder,
                        &wire::GetRouteRequestArgs { topic: Some(topic) },
                    );
                    (wire::Body::GetRouteRequest, request.as_union_value())
                })
                .ok()?;
            let route = frame.frame().body_as_route_response()?;
            let routed_queues: u32 = route.queues()?.iter().map(|q| q.write_queues()).sum();
            (routed_queues == queues).then_some(())
        });
    }
}

/// The body of `GET path` from an HTTP endpoint (the metrics endpoints); empty when it cannot
/// be read.
#[must_use]
pub fn http_get_body(addr: SocketAddr, path: &str) -> String {
    use std::io::{Read as _, Write as _};
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    if write!(stream, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").is_err() {
        return String::new();
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default()
}

/// A loopback port free right now (for a server that must be told its port in advance, such
/// as an HA or controller address), chosen below the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`) and never handed out twice by this process: a port taken
/// from the ephemeral range could be given again to any socket bound to port 0 (another
/// server's listener, a client's connection) before the server told it starts.
#[must_use]
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    const LOWEST: u16 = 10_000;
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    if ephemeral_start <= LOWEST + 1_000 {
        return std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map(|address| address.port())
            .expect("a free loopback port");
    }
    let span = u32::from(ephemeral_start - LOWEST);
    // A start that differs between test processes run one after another.
    let seed = std::process::id()
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for step in 0..span {
        let port = LOWEST
            + u16::try_from((seed.wrapping_add(step.wrapping_mul(7_919))) % span)
                .expect("below the span");
        if given.contains(&port) {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.push(port);
            return port;
        }
    }
    panic!("no free loopback port in {LOWEST}..{ephemeral_start}");
}

/// A broker's answer to `BrokerStatusRequest` (`broker status`).
pub fn broker_status(client: &mut TestClient) -> Result<VerifiedFrame, ClientError> {
    client.request(|b| {
        let body = wire::BrokerStatusRequest::create(b, &wire::BrokerStatusRequestArgs {});
        (wire::Body::BrokerStatusRequest, body.as_union_value())
    })
}

/// A blocking RocketMQ remoting client over a plain socket, speaking the `shardmq-remoting`
/// codec to the real name server or broker (tests/tests/remoting_*.rs).
pub struct RemotingClient {
    pub stream: std::net::TcpStream,
    buffer: BytesMut,
    decoder: shardmq_remoting::FrameDecoder,
    next_opaque: i32,
}

impl RemotingClient {
    /// How long a read waits for the server.
    pub const READ_TIMEOUT: Duration = Duration::from_secs(20);

    /// Connects to `addr` (`host:port`).
    #[must_use]
    pub fn connect(addr: &str) -> Self {
        let stream = std::net::TcpStream::connect(addr).expect("connects");
        stream.set_read_timeout(Some(Self::READ_TIMEOUT)).unwrap();
        Self {
            stream,
            buffer: BytesMut::new(),
            decoder: shardmq_remoting::FrameDecoder::default(),
            next_opaque: 1,
        }
    }

    /// Writes `command` as one frame.
    pub fn send(&mut self, command: &shardmq_remoting::RemotingCommand) {
        let mut frame = BytesMut::new();
        shardmq_remoting::encode_frame(
            command,
            shardmq_remoting::DEFAULT_MAX_FRAME_BYTES,
            &mut frame,
        )
        .expect("encodes");
        self.send_bytes(&frame);
    }

    /// Writes raw bytes (malformed frames).
    pub fn send_bytes(&mut self, bytes: &[u8]) {
        std::io::Write::write_all(&mut self.stream, bytes).expect("writes");
    }

    /// The next frame, or `None` once the server closed the connection.
    pub fn receive(&mut self) -> Option<shardmq_remoting::RemotingCommand> {
        loop {
            if let Some(command) = self
                .decoder
                .decode(&mut self.buffer)
                .expect("a valid frame")
            {
                return Some(command);
            }
            let mut chunk = [0u8; 64 * 1024];
            match std::io::Read::read(&mut self.stream, &mut chunk) {
                Ok(0) => return None,
                Ok(read) => self.buffer.extend_from_slice(&chunk[..read]),
                Err(error) if error.kind() == io::ErrorKind::ConnectionReset => return None,
                Err(error) => panic!("no answer within {:?}: {error}", Self::READ_TIMEOUT),
            }
        }
    }

    /// Sends `command` with a fresh opaque and returns its answer, skipping the requests the
    /// server pushes meanwhile; checks that the answer echoes the opaque.
    pub fn call(
        &mut self,
        mut command: shardmq_remoting::RemotingCommand,
    ) -> shardmq_remoting::RemotingCommand {
        command.opaque = self.next_opaque;
        self.next_opaque += 1;
        self.send(&command);
        loop {
            let answer = self
                .receive()
                .expect("an answer before the connection closed");
            if !answer.is_response() {
                continue;
            }
            assert_eq!(
                answer.opaque, command.opaque,
                "the answer echoes the opaque"
            );
            return answer;
        }
    }
}
