//! The RocketMQ side of the compatibility tests: `rocketmq-client-rust` 1.0.0, set up the way
//! an application sets it up, with a deadline on every call.
//!
//! Owns: the serialize-type switch ([`select_serialize_type`]), [`ClientHost`] (the runtime the
//! 1.0.0 client requires its application to own, and the one place client futures are run, each
//! with a deadline), and [`RocketMqAdmin`], the client's admin facade (`DefaultMQAdminExt`, what
//! RocketMQ's `mqadmin` is built on). Producers and consumers run on a [`ClientHost`] too
//! (`crate::producer`, `crate::consumer`). Never: a raw remoting frame; what goes on the wire is
//! the client's own doing.
//!
//! Data enters as a name server address and topic names; it leaves as the client's results
//! (`TopicRouteData`, `ClientError`) or [`CallError::TimedOut`] when a call overstays its
//! deadline.
//!
//! Two things about 1.0.0 shape this module:
//! - The serialize type is chosen once per process: `ClientRuntime::try_new` reads
//!   `rocketmq.serialize.type`, then `ROCKETMQ_SERIALIZE_TYPE` (`JSON` or `ROCKETMQ`, JSON when
//!   neither is set) and fixes it in a process-wide cell; a later runtime that asks for another
//!   type fails. So a test binary uses one type; `tests/route_json.rs` and
//!   `tests/route_rocketmq.rs` are the two.
//! - The client wants an application-owned runtime (`rocketmq_runtime::RuntimeOwner`, a
//!   multi-threaded tokio runtime) and never creates one itself; a [`ClientHost`] owns one, so
//!   the tests stay synchronous like the main workspace's: a test thread blocks on one client
//!   call at a time while the consumers' background work goes on on the runtime's threads.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rocketmq_client_rust::{
    AclClientRPCHook, ClientError, ClientRuntime, ClientRuntimeConfig, DefaultMQAdminExt,
    MQAdminReadExt, MQBrokerException, MQClientException, SessionCredentials, TelemetryHandle,
    TopicAdmin,
};
use rocketmq_model::common::config::TopicConfig;
use rocketmq_protocol::protocol::remoting_command::{SERIALIZE_TYPE_ENV, SERIALIZE_TYPE_PROPERTY};
use rocketmq_protocol::protocol::remoting_command_defaults::application_remoting_command_factory;
pub use rocketmq_protocol::protocol::route::topic_route_data::TopicRouteData;
pub use rocketmq_protocol::protocol::SerializeType;
use rocketmq_runtime::{RuntimeConfig, RuntimeOwner};

/// The remoting timeout the client itself applies to each request (the 1.0.0 client's API
/// default is 3 s).
pub const REMOTING_TIMEOUT: Duration = Duration::from_secs(3);

/// The hard deadline of one client call, above [`REMOTING_TIMEOUT`] so that the client's own
/// timeout error normally comes first; this one catches a call that never ends.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long shutting the client and its runtime down may take.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// The serialize type this process selected (see [`select_serialize_type`]).
static SELECTED_SERIALIZE_TYPE: OnceLock<SerializeType> = OnceLock::new();

/// Sets the client's environment switch so that this process's RocketMQ clients send headers
/// of `serialize_type`: `JSON` by leaving both variables unset (the client's default), or
/// `ROCKETMQ_SERIALIZE_TYPE=ROCKETMQ` for the binary header. Called before any client runtime
/// exists; the first call decides for the whole process, and a call that asks for the other
/// type panics (the client could not honour it).
pub fn select_serialize_type(serialize_type: SerializeType) {
    let selected = *SELECTED_SERIALIZE_TYPE.get_or_init(|| {
        // Every test calls this first, before it starts a server or a client, so no other
        // thread reads the environment while it changes (and the client reads it only later,
        // when its runtime is built).
        std::env::remove_var(SERIALIZE_TYPE_PROPERTY);
        match serialize_type {
            SerializeType::JSON => std::env::remove_var(SERIALIZE_TYPE_ENV),
            SerializeType::ROCKETMQ => std::env::set_var(SERIALIZE_TYPE_ENV, "ROCKETMQ"),
        }
        serialize_type
    });
    assert_eq!(
        selected, serialize_type,
        "this test binary already selected {selected}: rocketmq-client-rust 1.0.0 fixes the \
         serialize type once per process, so each type needs its own test binary"
    );
}

/// Why a client call failed.
#[derive(Debug)]
pub enum CallError {
    /// The call did not finish within its deadline ([`CALL_TIMEOUT`] unless the caller chose
    /// another).
    TimedOut { call: String, timeout: Duration },
    /// The client returned an error.
    Client { call: String, error: ClientError },
}

impl fmt::Display for CallError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TimedOut { call, timeout } => write!(
                formatter,
                "{call} did not finish within {} ms",
                timeout.as_millis()
            ),
            Self::Client { call, error } => {
                write!(formatter, "{call} failed: {error}")?;
                match response_of(error) {
                    Some((code, remark)) => {
                        write!(formatter, " (response code {code}, remark {remark:?})")
                    }
                    None => Ok(()),
                }
            }
        }
    }
}

impl std::error::Error for CallError {}

impl CallError {
    /// The response code and remark of the server's answer, when the call failed on one (see
    /// [`response_of`]).
    #[must_use]
    pub fn response(&self) -> Option<(i32, String)> {
        match self {
            Self::TimedOut { .. } => None,
            Self::Client { error, .. } => response_of(error),
        }
    }
}

/// The response code and remark of the answer `error` reports. 1.0.0 displays a name server's
/// non-success answer only as `core.argument.invalid: Argument is invalid` (with the remark
/// redacted) and keeps the code and remark in an `MQClientException` down its source chain;
/// a broker's answer may be an `MQBrokerException` there, or the error's broker code field.
#[must_use]
pub fn response_of(error: &ClientError) -> Option<(i32, String)> {
    if let Some(exception) = error.source_ref::<MQClientException>() {
        let remark = exception.error_message().unwrap_or_default().to_owned();
        return Some((exception.response_code(), remark));
    }
    if let Some(exception) = error.source_ref::<MQBrokerException>() {
        let remark = exception.error_message().unwrap_or_default().to_owned();
        return Some((exception.response_code(), remark));
    }
    error
        .broker_response_code()
        .map(|code| (code, String::new()))
}

/// The runtime a 1.0.0 client runs on: a `RuntimeOwner` (a multi-threaded tokio runtime that
/// the application owns) and the `ClientRuntime` built on it, which every producer, consumer and
/// admin client of a test is made from. Shared by those clients (`Arc`): the last one dropped
/// shuts the client runtime down, then the tokio runtime, each with a deadline. Must be dropped
/// outside the runtime (a test thread, never a listener).
pub struct ClientHost {
    // Options so that drop can take them apart in order: the client runtime, then the tokio
    // runtime it runs on.
    client_runtime: Option<Arc<ClientRuntime>>,
    owner: Option<RuntimeOwner>,
}

impl ClientHost {
    /// Builds the tokio runtime and the client's runtime on it (which reads the serialize-type
    /// switch: `serialize_type` is selected first, see [`select_serialize_type`], and checked to
    /// be the one the client took). `component` names the runtime's threads and scope.
    #[must_use]
    pub fn start(component: &'static str, serialize_type: SerializeType) -> Arc<Self> {
        select_serialize_type(serialize_type);
        let owner = RuntimeOwner::plan(RuntimeConfig {
            thread_name: format!("compat-{component}"),
            ..RuntimeConfig::default()
        })
        .expect("a valid runtime configuration")
        .build()
        .expect("the client's runtime starts");
        let client_runtime = ClientRuntime::try_new(
            owner.root_context().component(component),
            ClientRuntimeConfig {
                shutdown_timeout: SHUTDOWN_TIMEOUT,
                ..ClientRuntimeConfig::default()
            },
            TelemetryHandle::noop(),
        )
        .expect("the client runtime accepts the selected serialize type");
        let in_use = application_remoting_command_factory()
            .defaults()
            .serialize_type();
        assert_eq!(
            in_use, serialize_type,
            "the client took serialize type {in_use} from its environment switch, not {serialize_type}"
        );
        Arc::new(Self {
            client_runtime: Some(client_runtime),
            owner: Some(owner),
        })
    }

    /// The client runtime, to build producers, consumers and admin clients from.
    #[must_use]
    pub fn client_runtime(&self) -> Arc<ClientRuntime> {
        Arc::clone(
            self.client_runtime
                .as_ref()
                .expect("the client runtime lives as long as its host"),
        )
    }

    /// Runs `future`, a client call, on the runtime with [`CALL_TIMEOUT`] as its deadline.
    pub fn call<T>(
        &self,
        call: &str,
        future: impl Future<Output = Result<T, ClientError>>,
    ) -> Result<T, CallError> {
        self.call_within(call, CALL_TIMEOUT, future)
    }

    /// Runs `future`, a client call, on the runtime with `timeout` as its deadline.
    pub fn call_within<T>(
        &self,
        call: &str,
        timeout: Duration,
        future: impl Future<Output = Result<T, ClientError>>,
    ) -> Result<T, CallError> {
        match self.run_within(timeout, future) {
            Some(Ok(value)) => Ok(value),
            Some(Err(error)) => Err(CallError::Client {
                call: call.to_owned(),
                error,
            }),
            None => Err(CallError::TimedOut {
                call: call.to_owned(),
                timeout,
            }),
        }
    }

    /// Runs `future` on the runtime; `None` when `timeout` passes first (the future is then
    /// dropped). For calls that cannot fail, such as a client's shutdown.
    pub fn run_within<T>(&self, timeout: Duration, future: impl Future<Output = T>) -> Option<T> {
        let owner = self
            .owner
            .as_ref()
            .expect("the runtime owner lives as long as its host");
        owner
            .block_on(async { tokio::time::timeout(timeout, future).await })
            .ok()
    }

    /// Shuts a client down (`shutdown`, the client's own future) within [`SHUTDOWN_TIMEOUT`],
    /// saying so on stderr when it overstays: for the clients' `Drop`s, which cannot fail.
    pub fn shut_down(&self, client: &str, shutdown: impl Future<Output = ()>) {
        if self.run_within(SHUTDOWN_TIMEOUT, shutdown).is_none() {
            eprintln!(
                "the RocketMQ {client} did not shut down within {} ms",
                SHUTDOWN_TIMEOUT.as_millis()
            );
        }
    }
}

impl Drop for ClientHost {
    fn drop(&mut self) {
        let Some(owner) = self.owner.take() else {
            return;
        };
        if let Some(client_runtime) = self.client_runtime.take() {
            let shutdown = async move {
                let _report = client_runtime.shutdown().await;
            };
            if owner
                .block_on(async { tokio::time::timeout(SHUTDOWN_TIMEOUT, shutdown).await })
                .is_err()
            {
                eprintln!(
                    "the RocketMQ client runtime did not shut down within {} ms",
                    SHUTDOWN_TIMEOUT.as_millis()
                );
            }
        }
        let _report = owner.shutdown_runtime_blocking_with_timeout(SHUTDOWN_TIMEOUT);
    }
}

/// A started `DefaultMQAdminExt` of rocketmq-client-rust 1.0.0 pointed at one name server, on
/// a [`ClientHost`] of its own. Shut down, with a deadline, when dropped.
pub struct RocketMqAdmin {
    admin: Option<DefaultMQAdminExt>,
    host: Arc<ClientHost>,
}

impl RocketMqAdmin {
    /// Builds a [`ClientHost`] (which reads the serialize-type switch: `serialize_type` must be
    /// what [`select_serialize_type`] selected), then starts an admin client against the name
    /// server `namesrv_addr` (`host:port`).
    pub fn start(namesrv_addr: &str, serialize_type: SerializeType) -> Result<Self, CallError> {
        Self::start_with_credentials(namesrv_addr, serialize_type, None)
    }

    /// Like [`start`](Self::start), signing every request with `credentials` when given
    /// (RocketMQ's ACL 1.0: the client's `AclClientRPCHook`).
    pub fn start_with_credentials(
        namesrv_addr: &str,
        serialize_type: SerializeType,
        credentials: Option<SessionCredentials>,
    ) -> Result<Self, CallError> {
        let host = ClientHost::start("admin", serialize_type);
        let mut admin = match credentials {
            Some(credentials) => DefaultMQAdminExt::with_rpc_hook_and_timeout(
                host.client_runtime(),
                Arc::new(AclClientRPCHook::new(credentials)),
                REMOTING_TIMEOUT,
            ),
            None => DefaultMQAdminExt::with_timeout(host.client_runtime(), REMOTING_TIMEOUT),
        };
        admin.set_namesrv_addr(namesrv_addr);
        let started = host.call("starting the admin client", admin.start());
        let this = Self {
            admin: Some(admin),
            host,
        };
        started.map(|()| this)
    }

    /// The route of `topic` as the name server gives it: `GET_ROUTEINFO_BY_TOPIC` (105) through
    /// the admin API (`TopicAdmin::examine_topic_route_info_with_timeout`). `Ok(None)` is how
    /// 1.0.0 reports `TOPIC_NOT_EXIST` (17): every public route call of the client maps that
    /// code, and only that code, to "no route"; any other non-success code is an error.
    pub fn topic_route(&self, topic: &str) -> Result<Option<TopicRouteData>, CallError> {
        let admin = self.admin.as_ref().expect("a started admin client");
        let timeout_millis =
            u64::try_from(REMOTING_TIMEOUT.as_millis()).expect("the timeout fits in u64 ms");
        self.host.call(
            &format!("fetching the route of {topic}"),
            TopicAdmin::examine_topic_route_info_with_timeout(admin, topic.into(), timeout_millis),
        )
    }
}

impl RocketMqAdmin {
    /// Creates `topic` with `queues` read and write queues (perm read|write) on the broker at
    /// `broker_addr`: `UPDATE_AND_CREATE_TOPIC` (17), an admin call.
    pub fn create_topic(
        &self,
        broker_addr: &str,
        topic: &str,
        queues: u32,
    ) -> Result<(), CallError> {
        let admin = self.admin.as_ref().expect("a started admin client");
        let mut config = TopicConfig::with_queues(topic, queues, queues);
        config.perm = PERM_READ_WRITE;
        self.host.call(
            &format!("creating topic {topic} on {broker_addr}"),
            TopicAdmin::create_and_update_topic_config(admin, broker_addr.into(), config),
        )
    }
}

impl RocketMqAdmin {
    /// The sum of `group`'s committed offsets in `topic`'s queues on the broker at
    /// `broker_addr`: `GET_CONSUME_STATS` (208).
    pub fn committed_offsets(
        &self,
        broker_addr: &str,
        group: &str,
        topic: &str,
    ) -> Result<i64, CallError> {
        let admin = self.admin.as_ref().expect("a started admin client");
        let stats = self.host.call(
            &format!("fetching the consume stats of {group} on {broker_addr}"),
            admin.examine_consume_stats(
                group.into(),
                Some(topic.into()),
                None,
                Some(broker_addr.into()),
                None,
            ),
        )?;
        Ok(stats
            .get_offset_table()
            .iter()
            .filter(|(queue, _)| queue.topic() == topic)
            .map(|(_, offset)| offset.get_consumer_offset())
            .sum())
    }
}

/// RocketMQ's permission bits of a readable and writable topic (`PermName`: read 4, write 2).
const PERM_READ_WRITE: u32 = 6;

impl Drop for RocketMqAdmin {
    fn drop(&mut self) {
        if let Some(mut admin) = self.admin.take() {
            self.host
                .shut_down("admin client", async move { admin.shutdown().await });
        }
    }
}
