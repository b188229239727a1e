//! Integration-test support: start the real binaries and talk to them over the real protocol
//! (the tests themselves are in `tests/`).
//!
//! Owns: locating the built binaries ([`binary_path`]), process guards that start a server,
//! learn its address from its `listening on` line and kill it on drop ([`ServerProcess`],
//! [`NamesrvProcess`]), a blocking wire client ([`TestClient`]) and condition polling with a
//! deadline ([`wait_until`]). Never: building the binaries (run `cargo build --workspace --bins`
//! first), or anything that needs a runtime: everything here is std threads and blocking
//! sockets, so it works the same against the tokio namesrv and the glommio broker.
//!
//! Data enters as the servers' stdout/stderr lines and response frames; it leaves as parsed
//! addresses, [`VerifiedFrame`]s and captured log lines (printed when a test fails).

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
        capture_lines(stderr, Arc::clone(&log_lines));
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
        }
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
fn capture_lines(source: impl Read + Send + 'static, lines: Arc<Mutex<VecDeque<String>>>) {
    thread::spawn(move || {
        for line in BufReader::new(source).lines() {
            let Ok(line) = line else { break };
            let mut lines = lock(&lines);
            if lines.len() == MAX_CAPTURED_LOG_LINES {
                lines.pop_front();
            }
            lines.push_back(line);
        }
    });
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
