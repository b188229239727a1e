//! What every producer, consumer and admin client is made of (RocketMQ's MQClientInstance):
//! its settings ([`ClientOptions`]), identity (client id `ip@instance`), connection pool,
//! name servers with their route cache, and background tasks.
//!
//! Owns: the settings all builders share and their checks, the client id, and the lifetime of
//! background tasks (aborted on shutdown or drop). Never: producing or consuming; those live
//! in their own modules and run their loops through [`ClientInstance::spawn`].

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::connection::Notice;
use crate::error::{Error, Result};
use crate::host::local_ipv4;
use crate::namesrv::{NameServers, ROUTE_REFRESH_INTERVAL};
use crate::pool::ConnectionPool;
use crate::route::{MessageQueue, TopicRoute};

/// How long a request waits for its answer unless configured (RocketMQ's 3 s).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// How long making a connection (TCP connect and handshake) may take.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Notices that may queue before further ones are dropped (timers cover dropped ones).
const MAX_QUEUED_NOTICES: usize = 256;

/// Settings every kind of client has.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub(crate) namesrv_addresses: Vec<String>,
    pub(crate) instance_name: Option<String>,
    pub(crate) request_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    /// TLS files; `None`: the process default or the environment (`crate::tls`).
    pub(crate) tls: Option<shardmq_tls::ClientTlsFiles>,
    /// The account every connection authenticates as when its server enforces access
    /// control; `None`: the process default (`crate::account`), else anonymous.
    pub(crate) credentials: Option<shardmq_acl::Credentials>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            namesrv_addresses: Vec::new(),
            instance_name: None,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            tls: None,
            credentials: None,
        }
    }
}

impl ClientOptions {
    /// Adds name server addresses from a comma-separated list.
    pub(crate) fn add_namesrv(&mut self, addresses: &str) {
        self.namesrv_addresses.extend(
            addresses
                .split(',')
                .map(str::trim)
                .filter(|address| !address.is_empty())
                .map(str::to_owned),
        );
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.namesrv_addresses.is_empty() {
            return Err(Error::Config(
                "no name server address; call .namesrv(\"host:port\") (for example 127.0.0.1:9876)"
                    .to_owned(),
            ));
        }
        for address in &self.namesrv_addresses {
            check_address(address)?;
        }
        if let Some(name) = &self.instance_name {
            // It names a directory of the local offset store, so no separators or dots alone.
            let is_valid = !name.is_empty()
                && name.len() <= 255
                && name != "."
                && name != ".."
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '@' | '#'));
            if !is_valid {
                return Err(Error::Config(format!(
                    "instance name `{name}` must be 1..=255 characters of [A-Za-z0-9_.@#-]"
                )));
            }
        }
        if self.request_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(Error::Config(
                "request_timeout and connect_timeout must be positive".to_owned(),
            ));
        }
        Ok(())
    }
}

/// Checks that `address` is `host:port` with a port 1..=65535.
pub(crate) fn check_address(address: &str) -> Result<()> {
    let port = address
        .rsplit_once(':')
        .filter(|(host, _)| !host.is_empty())
        .and_then(|(_, port)| port.parse::<u16>().ok())
        .filter(|port| *port != 0);
    if port.is_none() {
        return Err(Error::Config(format!(
            "address `{address}` is not host:port with a port 1..=65535"
        )));
    }
    Ok(())
}

/// Builder methods for the settings of [`ClientOptions`], shared by every client builder (each
/// has an `options: ClientOptions` field).
macro_rules! client_option_setters {
    () => {
        /// Name server address `host:port`, or several separated by commas; may be called
        /// more than once. Required. Name servers are asked in turn until one answers.
        #[must_use]
        pub fn namesrv(mut self, addresses: impl AsRef<str>) -> Self {
            self.options.add_namesrv(addresses.as_ref());
            self
        }

        /// The instance name: the part of the client id after `ip@` (default: the process id,
        /// with `-N` for the N-th client of the process). Clients in one group must differ;
        /// a broadcasting consumer keeps its local offsets under it.
        #[must_use]
        pub fn instance_name(mut self, name: impl Into<String>) -> Self {
            self.options.instance_name = Some(name.into());
            self
        }

        /// How long a request waits for its answer (default 3 s).
        #[must_use]
        pub fn request_timeout(mut self, timeout: std::time::Duration) -> Self {
            self.options.request_timeout = timeout;
            self
        }

        /// How long a connection (TCP connect and handshake) may take (default 3 s).
        #[must_use]
        pub fn connect_timeout(mut self, timeout: std::time::Duration) -> Self {
            self.options.connect_timeout = timeout;
            self
        }

        /// Connects to every server in TLS, trusting the CAs of `files` (and presenting its
        /// client certificate, if any, for mutual TLS); docs/tls.md. Without it: the process
        /// default ([`crate::set_default_tls`]) or `SHARDMQ_TLS_CA` and friends, else plain.
        #[must_use]
        pub fn tls(mut self, files: crate::tls::TlsFiles) -> Self {
            self.options.tls = Some(files);
            self
        }

        /// The account to authenticate as with brokers and name servers that enforce access
        /// control (docs/acl.md): each connection proves the secret in its handshake without
        /// sending it. Without credentials a client is anonymous, which such servers serve
        /// only from their trusted addresses. See [`Credentials::from_env`](shardmq_acl::Credentials::from_env)
        /// and [`Credentials::from_file`](shardmq_acl::Credentials::from_file).
        #[must_use]
        pub fn credentials(mut self, credentials: shardmq_acl::Credentials) -> Self {
            self.options.credentials = Some(credentials);
            self
        }
    };
}
pub(crate) use client_option_setters;

/// The default instance name: the process id for the first client of the process, then
/// `pid-N`.
fn default_instance_name() -> String {
    static CLIENTS: AtomicU32 = AtomicU32::new(0);
    let pid = std::process::id();
    match CLIENTS.fetch_add(1, Ordering::Relaxed) {
        0 => pid.to_string(),
        n => format!("{pid}-{n}"),
    }
}

/// One client's connections, name servers and background tasks.
pub(crate) struct ClientInstance {
    pub(crate) options: ClientOptions,
    pub(crate) instance_name: String,
    pub(crate) pool: Arc<ConnectionPool>,
    pub(crate) namesrv: Arc<NameServers>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Queues a broker suggested pulling from a slave (its broker id), RocketMQ's
    /// suggestWhichBrokerId; absent: the usual choice.
    pull_from: Mutex<std::collections::HashMap<MessageQueue, i64>>,
}

impl ClientInstance {
    /// Checks `options` and starts a client: its pool, and the route refresh task. Notices
    /// from servers (and new connections) go to `notices` when given. Must run inside a tokio
    /// runtime.
    pub(crate) fn start(
        options: ClientOptions,
        wants_notices: bool,
    ) -> Result<(Arc<Self>, Option<mpsc::Receiver<Notice>>)> {
        options.validate()?;
        let instance_name = options
            .instance_name
            .clone()
            .unwrap_or_else(default_instance_name);
        let client_id = format!("{}@{instance_name}", local_ipv4());
        let (notice_sender, notices) = if wants_notices {
            let (sender, receiver) = mpsc::channel(MAX_QUEUED_NOTICES);
            (Some(sender), Some(receiver))
        } else {
            (None, None)
        };
        let tls = crate::tls::resolve(options.tls.as_ref())?;
        let pool = Arc::new(
            ConnectionPool::new(client_id, options.connect_timeout, notice_sender, tls)
                .with_credentials(crate::account::resolve(options.credentials.as_ref())),
        );
        let namesrv = Arc::new(NameServers::new(
            options.namesrv_addresses.clone(),
            Arc::clone(&pool),
            options.request_timeout,
        ));
        let instance = Arc::new(Self {
            options,
            instance_name,
            pool,
            namesrv: Arc::clone(&namesrv),
            tasks: Mutex::new(Vec::new()),
            pull_from: Mutex::new(std::collections::HashMap::new()),
        });
        instance.spawn(async move {
            let mut ticks = tokio::time::interval(ROUTE_REFRESH_INTERVAL);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                namesrv.refresh_all().await;
            }
        });
        Ok((instance, notices))
    }

    /// The client id announced to servers: `ip@instance_name`.
    pub(crate) fn client_id(&self) -> &str {
        self.pool.client_id()
    }

    pub(crate) fn request_timeout(&self) -> Duration {
        self.options.request_timeout
    }

    /// The address to send `queue`'s requests to: its broker's master (`is_master_only`, for
    /// writes and offset commits), or else the master or the lowest-id slave alive. The cached
    /// route is fetched again once when it lacks the broker.
    pub(crate) async fn broker_address(
        &self,
        queue: &MessageQueue,
        is_master_only: bool,
    ) -> Result<String> {
        let pick = |route: &TopicRoute| {
            let address = if is_master_only {
                route.master_address(&queue.broker_name)
            } else {
                route.read_address(&queue.broker_name)
            };
            address.map(str::to_owned)
        };
        let route = self.namesrv.route(&queue.topic).await?;
        if let Some(address) = pick(&route) {
            return Ok(address);
        }
        let route = self.namesrv.fetch_route(&queue.topic).await?;
        pick(&route).ok_or_else(|| Error::NoQueue {
            topic: queue.topic.clone(),
            kind: if is_master_only {
                "live-master"
            } else {
                "live-broker"
            },
        })
    }

    /// Where to pull `queue` from: the broker id its last pull answer suggested, while the
    /// route has that broker alive; else the master, else the lowest-id slave.
    pub(crate) async fn pull_address(&self, queue: &MessageQueue) -> Result<String> {
        let suggested = self
            .pull_from
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(queue)
            .copied();
        if let Some(id) = suggested {
            let route = self.namesrv.route(&queue.topic).await?;
            if let Some(address) = route
                .brokers
                .get(&queue.broker_name)
                .and_then(|b| b.addresses.get(&id))
            {
                return Ok(address.clone());
            }
        }
        self.broker_address(queue, false).await
    }

    /// Records a pull answer's suggestion for `queue` (0: back to the usual choice).
    pub(crate) fn follow_pull_suggestion(&self, queue: &MessageQueue, broker_id: i64) {
        let mut pull_from = self.pull_from.lock().unwrap_or_else(|e| e.into_inner());
        if broker_id > 0 {
            if pull_from.insert(queue.clone(), broker_id) != Some(broker_id) {
                tracing::debug!(%queue, broker_id, "the broker suggests pulling from a slave");
            }
        } else {
            pull_from.remove(queue);
        }
    }

    /// Runs `task` in the background until the client shuts down.
    pub(crate) fn spawn<F>(&self, task: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let handle = tokio::spawn(task);
        let mut tasks = self
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        tasks.retain(|task| !task.is_finished());
        tasks.push(handle);
    }

    /// Stops the background tasks and closes every connection.
    pub(crate) fn shut_down(&self) {
        let tasks = std::mem::take(
            &mut *self
                .tasks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for task in tasks {
            task.abort();
        }
        self.pool.shut_down();
    }
}

impl Drop for ClientInstance {
    fn drop(&mut self) {
        self.shut_down();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_need_a_name_server() {
        let error = ClientOptions::default().validate().unwrap_err().to_string();
        assert!(error.contains(".namesrv("), "{error}");
        let mut options = ClientOptions::default();
        options.add_namesrv("127.0.0.1:9876, 10.0.0.1:9876");
        assert_eq!(options.namesrv_addresses.len(), 2);
        assert!(options.validate().is_ok());
        options.instance_name = Some("../escape".to_owned());
        assert!(options.validate().is_err());
        options.instance_name = Some("worker-1".to_owned());
        assert!(options.validate().is_ok());
        options.add_namesrv("nohost");
        assert!(options.validate().is_err());
    }

    #[test]
    fn addresses_need_a_port() {
        assert!(check_address("localhost:9876").is_ok());
        assert!(check_address("[::1]:9876").is_ok());
        assert!(check_address(":9876").is_err());
        assert!(check_address("h:0").is_err());
        assert!(check_address("h:99999").is_err());
    }
}
