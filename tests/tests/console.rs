//! The web console (`shardmq console`, docs/console.md) against a real name server and broker:
//! in headless Chromium (Debian's `chromium`), driven over the DevTools protocol, the test
//! opens every page, creates a topic with the form, sends through the client crate, finds the
//! message on the messages page (text, JSON, hex), resets a group with the confirmation,
//! deletes the topic, watches the metrics charts (send latency percentiles too), sees which
//! member of a push consumer group holds which queue, and sees a stopped broker shown as down.
//! Over plain HTTP it checks the API's errors (unknown topic, bad input, limits, a broker down)
//! and the login sessions against servers that enforce access control.
//!
//! Needs the binaries (`cargo build --workspace --bins`) and `chromium` (scripts/setup.sh).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use shardmq_client::{Message, Producer, PullConsumer};
use shardmq_tests::{binary_path, wait_until, BrokerProcess, LocalCluster, NamesrvProcess};
use tempfile::TempDir;

/// How long a page may take to show what the test waits for.
const PAGE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the console may take to start.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long Chromium may take to print its DevTools address. Its first start on a fresh machine
/// reads a few hundred MiB of binary and libraries from a cold disk while the other tests of this
/// file start their brokers; one CI run spent 30 s before Chromium's first log line.
const BROWSER_START_TIMEOUT: Duration = Duration::from_secs(180);

// ---------------------------------------------------------------------------------------------
// The console process

/// A running `shardmq console`, killed on drop.
struct ConsoleProcess {
    child: Child,
    addr: SocketAddr,
    stderr: mpsc::Receiver<String>,
}

/// The lines `source` gives, on a channel, read by a thread of their own.
fn lines_of(source: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (sender, receiver) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(source).lines() {
            let Ok(line) = line else { break };
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    receiver
}

impl ConsoleProcess {
    fn start(namesrv: &str, extra: &[&str]) -> ConsoleProcess {
        let mut child = Command::new(binary_path("shardmq"))
            .args(["--namesrv", namesrv])
            .args(extra)
            .args(["console", "--listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("shardmq console starts");
        let stdout = lines_of(child.stdout.take().expect("stdout piped"));
        let stderr = lines_of(child.stderr.take().expect("stderr piped"));
        let line = stdout.recv_timeout(START_TIMEOUT).unwrap_or_else(|error| {
            let _ = child.kill();
            let log: Vec<String> = stderr.try_iter().collect();
            panic!("the console printed no address ({error}); stderr: {log:?}")
        });
        let addr = line
            .strip_prefix("console listening on http://")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .parse()
            .expect("an address");
        ConsoleProcess {
            child,
            addr,
            stderr,
        }
    }

    fn url(&self, hash: &str) -> String {
        format!("http://{}/{hash}", self.addr)
    }
}

impl Drop for ConsoleProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if thread::panicking() {
            let log: Vec<String> = self.stderr.try_iter().collect();
            eprintln!("console stderr:\n{}", log.join("\n"));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Plain HTTP

/// One HTTP answer: status, headers (lowercase names) and the body as JSON.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Value,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    fn error(&self) -> &str {
        self.body["error"].as_str().unwrap_or_default()
    }
}

/// Sends one request (a new connection, closed after the answer) and reads the answer.
fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
    cookie: Option<&str>,
) -> Answer {
    let mut stream = TcpStream::connect(addr).expect("connect to the console");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout set");
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(cookie) = cookie {
        request.push_str(&format!("Cookie: {cookie}\r\n"));
    }
    let body = body.unwrap_or_default();
    if !body.is_empty() || method == "POST" {
        request.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    request.push_str("\r\n");
    // A body over the limit may be refused before it is all read: the write may then fail.
    let _ = stream
        .write_all(request.as_bytes())
        .and_then(|()| stream.write_all(body.as_bytes()));
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP answer to {method} {path}: {raw:?}"));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {head:?}"));
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    let body = serde_json::from_str(body)
        .unwrap_or_else(|error| panic!("{method} {path}: not JSON ({error}): {body:?}"));
    Answer {
        status,
        headers,
        body,
    }
}

fn get(addr: SocketAddr, path: &str) -> Answer {
    http(addr, "GET", path, None, None)
}

fn post(addr: SocketAddr, path: &str, body: &Value) -> Answer {
    http(addr, "POST", path, Some(&body.to_string()), None)
}

// ---------------------------------------------------------------------------------------------
// Chromium over the DevTools protocol

type Socket = tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>>;

/// Headless Chromium with one page, killed on drop.
struct Browser {
    child: Child,
    socket: Socket,
    /// The DevTools session of the page.
    session: String,
    next_id: u64,
    _profile: TempDir,
}

fn chromium_path() -> String {
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {name}")])
            .output()
            .ok()
            .filter(|output| output.status.success())
            .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned());
        if let Some(path) = found.filter(|path| !path.is_empty()) {
            return path;
        }
    }
    panic!("no chromium on PATH: install Debian's `chromium` (scripts/setup.sh does)");
}

impl Browser {
    fn start() -> Browser {
        let profile = TempDir::new().expect("profile dir");
        let mut child = Command::new(chromium_path())
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--disable-extensions",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                "--window-size=1400,1000",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("chromium starts");
        let stderr = lines_of(child.stderr.take().expect("stderr piped"));
        let started = Instant::now();
        let deadline = started + BROWSER_START_TIMEOUT;
        let mut seen = Vec::new();
        let url = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match stderr.recv_timeout(left) {
                Ok(line) => match line.split_once("DevTools listening on ") {
                    Some((_, url)) => break url.trim().to_owned(),
                    None => seen.push(line),
                },
                Err(error) => {
                    let _ = child.kill();
                    panic!(
                        "chromium printed no DevTools address in {:?} ({error}): {seen:?}",
                        started.elapsed()
                    );
                }
            }
        };
        // Keep reading chromium's stderr so that it never blocks on a full pipe.
        thread::spawn(move || for _ in stderr {});
        let (socket, _) = tungstenite::connect(url.as_str()).expect("DevTools WebSocket");
        if let tungstenite::stream::MaybeTlsStream::Plain(stream) = socket.get_ref() {
            stream
                .set_read_timeout(Some(Duration::from_secs(60)))
                .expect("timeout set");
        }
        let mut browser = Browser {
            child,
            socket,
            session: String::new(),
            next_id: 0,
            _profile: profile,
        };
        let target = browser.call("Target.createTarget", json!({ "url": "about:blank" }));
        let target_id = target["targetId"].as_str().expect("targetId").to_owned();
        let attached = browser.call(
            "Target.attachToTarget",
            json!({ "targetId": target_id, "flatten": true }),
        );
        browser.session = attached["sessionId"]
            .as_str()
            .expect("sessionId")
            .to_owned();
        browser
    }

    /// Sends one DevTools command (to the page once attached) and returns its result.
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut command = json!({ "id": id, "method": method, "params": params });
        if !self.session.is_empty() {
            command["sessionId"] = json!(self.session);
        }
        self.socket
            .send(tungstenite::Message::text(command.to_string()))
            .expect("DevTools command sent");
        loop {
            let message = self.socket.read().expect("DevTools answer");
            let tungstenite::Message::Text(text) = message else {
                continue;
            };
            let answer: Value = serde_json::from_str(text.as_str()).expect("DevTools JSON");
            if answer["id"].as_u64() != Some(id) {
                continue; // an event, or an answer to another session
            }
            if let Some(error) = answer.get("error") {
                panic!("DevTools {method} failed: {error}");
            }
            return answer["result"].clone();
        }
    }

    /// Evaluates `script` in the page (awaiting a promise) and returns its value.
    fn eval(&mut self, script: &str) -> Value {
        let result = self.call(
            "Runtime.evaluate",
            json!({ "expression": script, "returnByValue": true, "awaitPromise": true }),
        );
        if let Some(details) = result.get("exceptionDetails") {
            panic!("the page threw evaluating {script}: {details}");
        }
        result["result"]["value"].clone()
    }

    /// Waits until `script` gives a value other than null, false or "" and returns it.
    fn wait_for(&mut self, what: &str, script: &str) -> Value {
        let deadline = Instant::now() + PAGE_TIMEOUT;
        loop {
            let value = self.eval(script);
            let is_set =
                !matches!(&value, Value::Null | Value::Bool(false)) && value.as_str() != Some("");
            if is_set {
                return value;
            }
            if Instant::now() > deadline {
                let page = self.eval("document.body.innerText");
                panic!("waited {PAGE_TIMEOUT:?} for {what} ({script}); the page shows:\n{page}");
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    fn open(&mut self, url: &str) {
        self.call("Page.navigate", json!({ "url": url }));
        self.wait_for(
            "the page to load",
            "document.readyState === 'complete' && document.querySelector('main') !== null",
        );
    }

    /// Shows the page of `hash` (`#/topics`) in the already loaded console.
    fn show(&mut self, hash: &str) {
        self.eval(&format!("location.hash = {}", json!(hash)));
    }

    fn text(&mut self, selector: &str) -> String {
        let script = format!(
            "(document.querySelector({}) || {{}}).innerText || ''",
            json!(selector)
        );
        self.eval(&script).as_str().unwrap_or_default().to_owned()
    }

    fn fill(&mut self, id: &str, value: &str) {
        self.eval(&format!(
            "document.getElementById({}).value = {}",
            json!(id),
            json!(value)
        ));
    }

    fn click(&mut self, selector: &str) {
        let clicked = self.eval(&format!(
            "(() => {{ const node = document.querySelector({}); if (!node) return false; node.click(); return true; }})()",
            json!(selector)
        ));
        assert_eq!(clicked, json!(true), "nothing to click at {selector}");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// Tests

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn pages_show_the_cluster_and_drive_topics_messages_and_groups() {
    const TOPIC: &str = "ConsoleTopic";
    const GROUP: &str = "ConsoleGroup";
    const SENT: i64 = 5;
    let data = TempDir::new().expect("temp dir");
    let cluster = LocalCluster::start(data.path());
    let namesrv = cluster.namesrv_addr();
    let broker = cluster.broker_addr();
    let console = ConsoleProcess::start(&namesrv, &["--request-timeout-ms", "1500"]);
    let mut browser = Browser::start();
    browser.open(&console.url("#/cluster"));

    // Cluster: the broker, up, with its role and version.
    let row = format!("#brokers tr[data-address='{broker}']");
    let state = browser.wait_for(
        "the broker's row",
        &format!("document.querySelector(\"{row}\")?.dataset.state"),
    );
    assert_eq!(state, json!("up"));
    let row_text = browser.text(&row);
    assert!(row_text.contains("async-master"), "{row_text}");
    assert!(row_text.contains(env!("CARGO_PKG_VERSION")), "{row_text}");

    // Topics: create one with the form.
    browser.show("#/topics");
    browser.wait_for(
        "the create form",
        "document.getElementById('create-topic-name')",
    );
    browser.fill("create-topic-name", TOPIC);
    browser.fill("create-topic-queues", "2");
    browser.click("#create-topic-submit");
    let message = browser.wait_for(
        "the create message",
        "document.getElementById('message').hidden ? '' : document.getElementById('message').innerText",
    );
    assert!(
        message
            .as_str()
            .unwrap()
            .contains(&format!("created topic {TOPIC} on {broker}")),
        "{message}"
    );
    browser.wait_for(
        "the new topic in the list",
        &format!("document.querySelector(\"#topic-list tr[data-topic='{TOPIC}']\")"),
    );
    // Creating it again is refused, and the page says why.
    browser.fill("create-topic-name", TOPIC);
    browser.click("#create-topic-submit");
    let refusal = browser.wait_for(
        "the refusal",
        "document.getElementById('message').className === 'error' && document.getElementById('message').innerText",
    );
    assert!(
        refusal.as_str().unwrap().contains("TOPIC_ALREADY_EXISTS"),
        "{refusal}"
    );

    // Send through the client crate.
    let runtime = runtime();
    let msg_id = runtime.block_on(async {
        let producer = Producer::builder()
            .namesrv(&namesrv)
            .build()
            .await
            .expect("producer");
        let mut last = String::new();
        for n in 0..SENT {
            let message = Message::new(TOPIC, format!("{{\"order\":{n},\"item\":\"book\"}}"))
                .with_keys(["console-key"])
                .with_tags("created")
                .with_property("region", "eu");
            last = producer
                .send(message)
                .await
                .expect("sent")
                .msg_id
                .to_string();
        }
        producer.shutdown().await;
        last
    });

    // The topic's page: route and queue offsets that add up to what was sent.
    browser.show(&format!("#/topics/{TOPIC}"));
    browser.wait_for(
        "both queues",
        "document.querySelectorAll('#topic-queues tbody tr').length === 2",
    );
    let route = browser.text("#topic-route");
    assert!(route.contains(&broker), "{route}");
    let stored = browser.eval(
        "[...document.querySelectorAll('#topic-queues tbody tr')].map(r => Number(r.cells[3].innerText)).reduce((a, b) => a + b, 0)",
    );
    assert_eq!(stored, json!(SENT));

    // Messages: by id, with the body as text, JSON and hex.
    browser.show("#/messages");
    browser.wait_for("the id form", "document.getElementById('query-id-value')");
    browser.fill("query-id-value", &msg_id);
    browser.click("#query-id-submit");
    let card = format!(".message[data-msg-id='{msg_id}']");
    browser.wait_for(
        "the message found by id",
        &format!("document.querySelector(\"{card}\")"),
    );
    let shown = browser.text(&card);
    assert!(
        shown.contains(TOPIC) && shown.contains("console-key"),
        "{shown}"
    );
    assert!(shown.contains("region") && shown.contains("eu"), "{shown}");
    let body = browser.text(&format!("{card} pre.body"));
    assert_eq!(
        body,
        format!("{{\"order\":{},\"item\":\"book\"}}", SENT - 1)
    );
    browser.click(&format!("{card} button[data-view='json']"));
    let json_view = browser.text(&format!("{card} pre.body"));
    assert!(json_view.contains("\"item\": \"book\""), "{json_view}");
    browser.click(&format!("{card} button[data-view='hex']"));
    let hex_view = browser.text(&format!("{card} pre.body"));
    assert!(hex_view.starts_with("00000000  7b 22 6f 72"), "{hex_view}");

    // By key: every message sent.
    browser.fill("query-key-topic", TOPIC);
    browser.fill("query-key-value", "console-key");
    browser.click("#query-key-submit");
    browser.wait_for(
        "the messages found by key",
        &format!("document.getElementById('result-count')?.innerText.startsWith('{SENT} message(s) with key')"),
    );

    // By queue and offset range: what queue 0 holds.
    browser.fill("range-topic", TOPIC);
    browser.fill("range-queue", "0");
    browser.fill("range-from", "0");
    browser.click("#query-range-submit");
    let range = browser.wait_for(
        "the queue range",
        "document.getElementById('result-count')?.innerText.includes('queue 0 from offset 0') && document.getElementById('result-count').innerText",
    );
    let in_queue_0 = browser.eval("document.querySelectorAll('#results .message').length");
    assert!(in_queue_0.as_i64().unwrap() >= 1, "{range}");

    // Resend the message found by id: a copy under the same id, with its keys, to its topic.
    browser.fill("query-id-value", &msg_id);
    browser.click("#query-id-submit");
    browser.wait_for(
        "the message found by id again",
        &format!("document.getElementById('result-count')?.innerText.includes('with id {msg_id}')"),
    );
    browser.click(&format!("{card} button.resend"));
    browser.wait_for(
        "the confirmation",
        "!document.getElementById('confirm').hidden",
    );
    browser.click("#confirm-yes");
    let resent = browser.wait_for(
        "the resend message",
        "document.getElementById('message').className === 'ok' && document.getElementById('message').innerText",
    );
    assert!(
        resent
            .as_str()
            .unwrap()
            .starts_with(&format!("resent {msg_id} to {TOPIC} as {msg_id}")),
        "{resent}"
    );
    let stored = runtime.block_on(async {
        let admin = shardmq_client::Admin::builder()
            .namesrv(&namesrv)
            .build()
            .await
            .expect("admin");
        let stats = admin.topic_stats(TOPIC).await.expect("stats");
        stats.iter().map(|queue| queue.max_offset).sum::<i64>()
    });
    assert_eq!(stored, SENT + 1);

    // A group consumes everything (committing through the client crate).
    runtime.block_on(async {
        let consumer = PullConsumer::builder()
            .namesrv(&namesrv)
            .group(GROUP)
            .build()
            .await
            .expect("consumer");
        for queue in consumer.queues(TOPIC).await.expect("queues") {
            let (_, max) = consumer.queue_offsets(&queue).await.expect("offsets");
            consumer
                .commit_offset(&queue, max)
                .await
                .expect("committed");
        }
        consumer.shutdown().await;
    });

    // Groups: the list, then the group's page with no lag; reset it to the first message.
    browser.show("#/groups");
    browser.wait_for(
        "the group in the list",
        &format!("document.querySelector(\"#group-list tr[data-group='{GROUP}']\")"),
    );
    browser.show(&format!("#/groups/{GROUP}"));
    browser.wait_for("the progress", "document.getElementById('consume-rate')");
    assert!(
        browser.text("#consume-rate").starts_with("Total lag 0."),
        "{}",
        browser.text("#consume-rate")
    );
    // The pull consumer has left: nobody holds a queue.
    assert_eq!(browser.text("#group-assignment"), "no live member");
    browser.eval("document.getElementById('reset-to').value = 'first'");
    browser.click("#reset-submit");
    browser.wait_for(
        "the confirmation",
        "!document.getElementById('confirm').hidden",
    );
    let question = browser.text("#confirm-question");
    assert!(
        question.contains(GROUP) && question.contains("first"),
        "{question}"
    );
    browser.click("#confirm-yes");
    browser.wait_for(
        "the reset's result",
        "document.getElementById('reset-result')",
    );
    browser.wait_for(
        "the lag after the reset",
        &format!(
            "document.getElementById('consume-rate')?.innerText.startsWith('Total lag {}.')",
            SENT + 1
        ),
    );
    // The committed offsets did move (asked through the client crate, not the console).
    let committed = runtime.block_on(async {
        let consumer = PullConsumer::builder()
            .namesrv(&namesrv)
            .group(GROUP)
            .build()
            .await
            .expect("consumer");
        let mut committed = Vec::new();
        for queue in consumer.queues(TOPIC).await.expect("queues") {
            committed.push(consumer.committed_offset(&queue).await.expect("offset"));
        }
        consumer.shutdown().await;
        committed
    });
    assert_eq!(committed, vec![Some(0), Some(0)]);

    // Metrics: charts drawn from two samples or more.
    browser.show("#/metrics");
    browser.wait_for(
        "a drawn produce-rate line",
        "document.querySelector('#chart-in polyline[data-series]')",
    );
    let legend = browser.text("#chart-in-legend");
    assert!(legend.contains(&broker), "{legend}");

    // An unknown topic's page says so, and the rest of the console still works.
    browser.show("#/topics/NoSuchTopic");
    let error = browser.wait_for(
        "the unknown topic's error",
        "document.getElementById('message').className === 'error' && document.getElementById('message').innerText",
    );
    assert!(error.as_str().unwrap().contains("NoSuchTopic"), "{error}");

    // Delete the topic: the confirmation wants its name typed.
    browser.show(&format!("#/topics/{TOPIC}"));
    browser.wait_for(
        "the delete button",
        "document.getElementById('delete-topic')",
    );
    browser.click("#delete-topic");
    browser.wait_for(
        "the confirmation",
        "!document.getElementById('confirm').hidden",
    );
    browser.click("#confirm-yes");
    let must_type = browser.text("#message");
    assert!(
        must_type.contains(&format!("type {TOPIC} exactly")),
        "{must_type}"
    );
    browser.fill("confirm-input", TOPIC);
    browser.click("#confirm-yes");
    let deleted = browser.wait_for(
        "the delete message",
        "document.getElementById('message').className === 'ok' && document.getElementById('message').innerText.startsWith('deleted') && document.getElementById('message').innerText",
    );
    assert!(
        deleted
            .as_str()
            .unwrap()
            .contains(&format!("deleted topic {TOPIC} on {broker}")),
        "{deleted}"
    );

    // A broker that hangs (stopped: its connection to the name server stays open, so the name
    // server still lists it) shows as down, with why, while the page still works.
    shardmq_tests::signal(cluster.broker.pid(), "STOP");
    browser.show("#/cluster");
    let state = browser.wait_for(
        "the broker shown down",
        &format!("document.querySelector(\"{row}\")?.dataset.state === 'down' && document.querySelector(\"{row}\").innerText"),
    );
    assert!(state.as_str().unwrap().contains(&broker), "{state}");
    assert!(state.as_str().unwrap().contains("no answer"), "{state}");
    assert_eq!(browser.text("main h1"), "Cluster");
    shardmq_tests::signal(cluster.broker.pid(), "CONT");
}

/// A broker histogram bound (50 µs doubling) or not.
fn is_latency_bound(micros: &Value) -> bool {
    micros
        .as_u64()
        .is_some_and(|us| us >= 50 && us % 50 == 0 && (us / 50).is_power_of_two())
}

#[test]
fn metrics_show_send_latency_percentiles_and_a_group_its_queue_assignment() {
    const TOPIC: &str = "AssignedTopic";
    const GROUP: &str = "AssignedGroup";
    const QUEUES: u32 = 4;
    let data = TempDir::new().expect("temp dir");
    let cluster = LocalCluster::start(data.path());
    let namesrv = cluster.namesrv_addr();
    let broker = cluster.broker_addr();
    cluster.create_topic(TOPIC, QUEUES);
    let console = ConsoleProcess::start(&namesrv, &["--request-timeout-ms", "1500"]);
    let addr = console.addr;
    let runtime = runtime();

    // Sends while the console samples: some interval's percentiles count them.
    let producer = runtime.block_on(async {
        Producer::builder()
            .namesrv(&namesrv)
            .build()
            .await
            .expect("producer")
    });
    let latency = wait_until(Duration::from_secs(30), "send latency percentiles", || {
        runtime.block_on(async {
            for n in 0..20 {
                producer
                    .send(Message::new(TOPIC, format!("latency {n}")))
                    .await
                    .expect("sent");
            }
        });
        let metrics = get(addr, "/api/metrics").body;
        let samples = metrics["brokers"][0]["samples"].as_array()?.clone();
        let latest = samples
            .iter()
            .rev()
            .find(|sample| !sample["send_latency"].is_null())?;
        Some((latest["send_latency"].clone(), metrics))
    });
    let (interval, metrics) = latency;
    assert!(interval["sends"].as_u64().unwrap() > 0, "{interval}");
    for field in ["p50_us", "p90_us", "p99_us"] {
        assert!(is_latency_bound(&interval[field]), "{field}: {interval}");
    }
    let (p50, p90, p99) = (
        interval["p50_us"].as_u64().unwrap(),
        interval["p90_us"].as_u64().unwrap(),
        interval["p99_us"].as_u64().unwrap(),
    );
    assert!(p50 <= p90 && p90 <= p99, "{interval}");
    // Sends on a local broker take well under a second.
    assert!(p50 < 1_000_000, "{interval}");
    let window = &metrics["brokers"][0]["send_latency_window"];
    assert!(window["sends"].as_u64().unwrap() >= interval["sends"].as_u64().unwrap());
    assert!(is_latency_bound(&window["p99_us"]), "{window}");
    // The first sample has no interval before it.
    assert!(
        metrics["brokers"][0]["samples"][0]["send_latency"].is_null(),
        "{metrics}"
    );

    // Two push consumers share the topic's queues and report them.
    let consumers: Vec<_> = runtime.block_on(async {
        let mut consumers = Vec::new();
        for instance in ["first", "second"] {
            consumers.push(
                shardmq_client::PushConsumer::builder()
                    .namesrv(namesrv.clone())
                    .group(GROUP)
                    .instance_name(instance)
                    .subscribe(TOPIC, "*")
                    .listen_concurrently(|_messages| async {
                        shardmq_client::ConsumeResult::Success
                    })
                    .start()
                    .await
                    .expect("start a push consumer"),
            );
        }
        consumers
    });
    let path = format!("/api/groups/{GROUP}?topic={TOPIC}");
    let assignment = wait_until(
        Duration::from_secs(30),
        "each queue held by exactly one of two members",
        || {
            let answer = get(addr, &path).body;
            let entry = answer["members"]
                .as_array()?
                .iter()
                .find(|entry| entry["topic"] == json!(TOPIC))?
                .clone();
            let assignment = entry["assignment"].as_array()?.clone();
            if assignment.len() != 2 {
                return None;
            }
            let mut held = Vec::new();
            for member in &assignment {
                let queues = member["queues"].as_array()?;
                if queues.is_empty() {
                    return None;
                }
                for queue in queues {
                    assert!(
                        queue["broker_name"].as_str()?.starts_with("broker"),
                        "{answer}"
                    );
                    held.push(queue["queue_id"].as_u64()?);
                }
            }
            held.sort_unstable();
            (held == (0..u64::from(QUEUES)).collect::<Vec<_>>()).then_some(assignment)
        },
    );
    let ids: Vec<&str> = assignment
        .iter()
        .map(|member| member["client_id"].as_str().unwrap())
        .collect();
    assert!(ids.iter().any(|id| id.contains("first")), "{ids:?}");
    assert!(ids.iter().any(|id| id.contains("second")), "{ids:?}");

    // The pages show them.
    let mut browser = Browser::start();
    browser.open(&console.url("#/metrics"));
    browser.wait_for(
        "a drawn send-latency line",
        "document.querySelector('#chart-send-p99 polyline[data-series]')",
    );
    let legend = browser.text("#chart-send-p99-legend");
    assert!(
        legend.contains(&broker) && legend.contains("in the window"),
        "{legend}"
    );
    browser.show(&format!("#/groups/{GROUP}"));
    browser.wait_for(
        "the assignment table",
        "document.querySelectorAll('#group-assignment tbody tr').length === 2",
    );
    let table = browser.text("#group-assignment");
    assert!(table.contains("#0") && table.contains("#3"), "{table}");
    assert!(!table.contains("not reported"), "{table}");

    // A member that stops leaves; the other takes every queue.
    runtime.block_on(async {
        let mut consumers = consumers.into_iter();
        consumers.next().unwrap().shutdown().await;
        let _second = consumers.next().unwrap();
        wait_until_async(&path, addr).await;
    });
}

/// Waits until `path` shows one member holding all four queues.
async fn wait_until_async(path: &str, addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let path = path.to_owned();
        let answer = tokio::task::spawn_blocking(move || get(addr, &path).body)
            .await
            .expect("asked");
        let held: Option<Vec<Value>> = answer["members"][0]["assignment"]
            .as_array()
            .filter(|members| members.len() == 1)
            .and_then(|members| members[0]["queues"].as_array().cloned());
        if held.is_some_and(|queues| queues.len() == 4) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "one member holding all: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[test]
fn the_api_answers_errors_as_json_and_keeps_working_while_a_broker_is_down() {
    let data = TempDir::new().expect("temp dir");
    let cluster = LocalCluster::start(data.path());
    let namesrv = cluster.namesrv_addr();
    let broker = cluster.broker_addr();
    cluster.create_topic("ApiTopic", 2);
    let console = ConsoleProcess::start(&namesrv, &["--request-timeout-ms", "1500"]);
    let addr = console.addr;

    // The pages are served, with a policy that loads nothing from elsewhere.
    let page = {
        let mut stream = TcpStream::connect(addr).expect("connect");
        write!(
            stream,
            "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .expect("sent");
        let mut page = String::new();
        stream.read_to_string(&mut page).expect("read");
        page
    };
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(
        page.contains("content-security-policy: default-src 'self'"),
        "{page}"
    );
    assert!(
        page.contains("<script type=\"module\" src=\"/app.js\">"),
        "{page}"
    );

    let unknown = get(addr, "/api/topics/NoSuchTopic");
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    assert!(unknown.error().contains("NoSuchTopic"), "{}", unknown.body);

    let bad_name = post(addr, "/api/topics", &json!({ "topic": "bad name" }));
    assert_eq!(bad_name.status, 400, "{}", bad_name.body);
    assert!(bad_name.error().contains("bad name"), "{}", bad_name.body);

    let not_json = http(addr, "POST", "/api/topics", Some("{not json"), None);
    assert_eq!(not_json.status, 400);
    assert!(not_json.error().contains("JSON"), "{}", not_json.body);

    let too_large = format!("{{\"topic\":\"{}\"}}", "a".repeat(100 * 1024));
    let too_large = http(addr, "POST", "/api/topics", Some(&too_large), None);
    assert_eq!(too_large.status, 413, "{}", too_large.body);
    assert!(
        too_large.error().contains("65536 bytes"),
        "{}",
        too_large.body
    );

    let too_many = get(
        addr,
        "/api/messages/range?topic=ApiTopic&queue=0&count=1000",
    );
    assert_eq!(too_many.status, 400);
    assert!(
        too_many.error().contains("`count` is 1000"),
        "{}",
        too_many.body
    );

    let no_path = get(addr, "/api/nothing-here");
    assert_eq!(no_path.status, 404);

    let missing = post(addr, "/api/groups/G/reset", &json!({ "topic": "ApiTopic" }));
    assert_eq!(missing.status, 400);
    assert_eq!(missing.error(), "`to` is required");

    let bad_time = post(
        addr,
        "/api/groups/G/reset",
        &json!({ "topic": "ApiTopic", "to": "yesterday" }),
    );
    assert_eq!(bad_time.status, 400);
    assert!(bad_time.error().contains("yesterday"), "{}", bad_time.body);

    // With the broker hung (stopped: the name server still lists it): the cluster answers
    // with the broker marked down; a topic's page has its route without offsets; a change on
    // that broker fails naming it.
    let up = get(addr, "/api/cluster");
    assert_eq!(up.body["brokers"][0]["is_up"], json!(true), "{}", up.body);
    wait_until(Duration::from_secs(20), "a metrics sample", || {
        let metrics = get(addr, "/api/metrics").body;
        let samples = metrics["brokers"][0]["samples"].as_array()?.len();
        (samples > 0).then_some(())
    });
    shardmq_tests::signal(cluster.broker.pid(), "STOP");
    let down = get(addr, "/api/cluster");
    assert_eq!(down.status, 200, "{}", down.body);
    let entry = &down.body["brokers"][0];
    assert_eq!(entry["address"], json!(broker));
    assert_eq!(entry["is_up"], json!(false), "{}", down.body);
    assert!(
        entry["error"].as_str().unwrap().contains(&broker),
        "{}",
        down.body
    );
    let topic = get(addr, "/api/topics/ApiTopic");
    assert_eq!(topic.status, 200, "{}", topic.body);
    assert_eq!(topic.body["route"]["brokers"][0]["read_queues"], json!(2));
    assert!(
        topic.body["stats_error"]
            .as_str()
            .unwrap()
            .contains(&broker),
        "{}",
        topic.body
    );
    let create = post(
        addr,
        "/api/topics",
        &json!({ "topic": "Another", "broker": broker }),
    );
    assert_eq!(create.status, 502, "{}", create.body);
    assert!(create.error().contains(&broker), "{}", create.body);
    // The metrics sampler marks it down at its next round, keeping what it sampled before.
    let sampled = wait_until(
        Duration::from_secs(20),
        "the sampler to see it down",
        || {
            let metrics = get(addr, "/api/metrics").body;
            (metrics["brokers"][0]["is_up"] == json!(false)).then_some(metrics)
        },
    );
    assert!(
        sampled["brokers"][0]["error"]
            .as_str()
            .unwrap()
            .contains(&broker),
        "{sampled}"
    );
    assert!(
        !sampled["brokers"][0]["samples"]
            .as_array()
            .unwrap()
            .is_empty(),
        "{sampled}"
    );
    shardmq_tests::signal(cluster.broker.pid(), "CONT");
}

const ACCOUNTS: &str = r#"
[[accounts]]
access_key = "console-admin"
secret_key = "console-admin-secret"
admin = true

[[accounts]]
access_key = "console-app"
secret_key = "console-app-secret"
default_topic_perm = "PUB|SUB"
default_group_perm = "SUB"
"#;

fn session_cookie(answer: &Answer) -> String {
    let header = answer.header("set-cookie").expect("a session cookie");
    assert!(header.contains("HttpOnly"), "{header}");
    header.split(';').next().expect("name=value").to_owned()
}

#[test]
fn with_access_control_operations_run_as_the_logged_in_account() {
    let dir = TempDir::new().expect("temp dir");
    let acl_file = dir.path().join("acl.toml");
    std::fs::write(&acl_file, ACCOUNTS).expect("accounts written");
    let acl = acl_file.to_str().expect("UTF-8 path");
    let namesrv = NamesrvProcess::start_with_args(&["--acl-file", acl]);
    let namesrv_addr = namesrv.addr().to_string();
    let _broker = BrokerProcess::start(
        &dir.path().join("broker"),
        &[
            "--namesrv",
            &namesrv_addr,
            "--acl-file",
            acl,
            "--access-key",
            "console-admin",
            "--secret-key",
            "console-admin-secret",
        ],
    );
    let console = ConsoleProcess::start(&namesrv_addr, &[]);
    let addr = console.addr;

    // No account: refused, and the page is told it is access control.
    let anonymous = get(addr, "/api/topics");
    assert_eq!(anonymous.status, 403, "{}", anonymous.body);
    assert_eq!(
        anonymous.body["status"],
        json!("ACCESS_DENIED"),
        "{}",
        anonymous.body
    );

    let wrong = post(
        addr,
        "/api/login",
        &json!({ "access_key": "console-app", "secret_key": "not-the-secret" }),
    );
    assert_eq!(wrong.status, 403, "{}", wrong.body);
    assert!(wrong.header("set-cookie").is_none());

    // The application's account lists topics but may not create one.
    let login = post(
        addr,
        "/api/login",
        &json!({ "access_key": "console-app", "secret_key": "console-app-secret" }),
    );
    assert_eq!(login.status, 200, "{}", login.body);
    assert!(!login.body.to_string().contains("console-app-secret"));
    let app = session_cookie(&login);
    assert_eq!(login.body["may_admin"], json!(false), "{}", login.body);
    let session = http(addr, "GET", "/api/session", None, Some(&app));
    assert_eq!(session.body["account"], json!("console-app"));
    assert_eq!(session.body["may_admin"], json!(false), "{}", session.body);
    let anonymous_session = get(addr, "/api/session");
    assert_eq!(
        anonymous_session.body["may_admin"],
        json!(null),
        "{}",
        anonymous_session.body
    );
    let listed = http(addr, "GET", "/api/topics", None, Some(&app));
    assert_eq!(listed.status, 200, "{}", listed.body);
    let create = json!({ "topic": "AclConsoleTopic", "queues": 1 }).to_string();
    let refused = http(addr, "POST", "/api/topics", Some(&create), Some(&app));
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert_eq!(
        refused.body["status"],
        json!("ACCESS_DENIED"),
        "{}",
        refused.body
    );

    // The admin account, in another session, may.
    let login = post(
        addr,
        "/api/login",
        &json!({ "access_key": "console-admin", "secret_key": "console-admin-secret" }),
    );
    assert_eq!(login.body["may_admin"], json!(true), "{}", login.body);
    let admin = session_cookie(&login);
    assert_ne!(admin, app);
    let created = http(addr, "POST", "/api/topics", Some(&create), Some(&admin));
    assert_eq!(created.status, 200, "{}", created.body);

    // Logging out ends the session: its cookie works as no account again.
    let out = http(addr, "POST", "/api/logout", Some(""), Some(&app));
    assert_eq!(out.status, 200);
    let after = http(addr, "GET", "/api/topics", None, Some(&app));
    assert_eq!(after.status, 403, "{}", after.body);

    // The account given on the command line is the default of every browser.
    let with_flags = ConsoleProcess::start(
        &namesrv_addr,
        &[
            "--access-key",
            "console-app",
            "--secret-key",
            "console-app-secret",
        ],
    );
    let listed = get(with_flags.addr, "/api/topics");
    assert_eq!(listed.status, 200, "{}", listed.body);

    wait_until(Duration::from_secs(20), "the topic routed", || {
        let topics = get(with_flags.addr, "/api/topics").body;
        topics["topics"]
            .as_array()?
            .iter()
            .any(|topic| topic == "AclConsoleTopic")
            .then_some(())
    });

    // The pages hide what that account may not do: no topic forms, a note instead.
    let mut browser = Browser::start();
    browser.open(&with_flags.url("#/topics"));
    browser.wait_for(
        "the note instead of the create form",
        "document.getElementById('create-topic-denied')",
    );
    assert_eq!(
        browser.eval("document.getElementById('create-topic') === null"),
        json!(true)
    );
    browser.show("#/topics/AclConsoleTopic");
    browser.wait_for(
        "the notes instead of update and delete",
        "document.getElementById('delete-topic-denied') && document.getElementById('update-topic-denied')",
    );
    assert_eq!(
        browser.eval("document.getElementById('delete-topic') === null"),
        json!(true)
    );
}
