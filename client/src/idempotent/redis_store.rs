//! The Redis claim store: claims shared by every consumer of a group, in any process, through
//! one Redis server (the `redis` crate's tokio connection manager, which reconnects by
//! itself after the server restarts or the connection drops).
//!
//! Owns: [`RedisStore`] (the lazily made connection, the per-operation timeout, and the four
//! operations as Lua scripts, so that each is atomic in Redis: claiming is SET NX PX and, when
//! that finds the key taken, a GET of what holds it; extending, completing and releasing
//! compare the stored owner token first). Never: deciding what a consumer does with a
//! message (`mod.rs`).

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Script, Value};
use tokio::sync::OnceCell;

use super::store::{
    claim_value, ClaimOutcome, ClaimStore, StoreError, StoreFuture, DONE, PROCESSING,
};
use crate::error::{Error, Result};

/// Default longest wait for one Redis operation (connecting included) before it fails with
/// [`StoreError::Timeout`].
pub const DEFAULT_REDIS_OPERATION_TIMEOUT: Duration = Duration::from_secs(2);

/// SET NX PX; if the key is taken, what holds it (1 when claimed).
const CLAIM_SCRIPT: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return redis.call('GET', KEYS[1])
";

/// PEXPIRE if the stored value is the owner's `processing` claim (1 when extended).
const EXTEND_SCRIPT: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
";

/// SET done PX if the stored value is the owner's claim or the key is free (1 when set).
const COMPLETE_SCRIPT: &str = r"
local current = redis.call('GET', KEYS[1])
if current == false or current == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
";

/// DEL if the stored value is the owner's `processing` claim (1 when deleted).
const RELEASE_SCRIPT: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

/// Claims in a Redis server, shared by every consumer that uses it (see the module docs).
pub struct RedisStore {
    client: redis::Client,
    /// `redis at host:port db N`, without credentials.
    description: String,
    connection: OnceCell<ConnectionManager>,
    operation_timeout: Duration,
    claim_script: Script,
    extend_script: Script,
    complete_script: Script,
    release_script: Script,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("RedisStore")
            .field("server", &self.description)
            .field("operation_timeout", &self.operation_timeout)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// A store for the Redis at `url` (`redis://[user:password@]host:port[/db]`), connecting
    /// at its first operation (and again whenever the connection is lost). Fails only on a
    /// URL that does not parse.
    pub fn new(url: &str) -> Result<Self> {
        let client = redis::Client::open(url).map_err(|error| {
            Error::Config(format!(
                "redis url {:?} is not usable: {error} (expected redis://host:port[/db])",
                without_password(url)
            ))
        })?;
        let info = client.get_connection_info();
        let description = format!("redis at {} db {}", info.addr, info.redis.db);
        Ok(Self {
            client,
            description,
            connection: OnceCell::new(),
            operation_timeout: DEFAULT_REDIS_OPERATION_TIMEOUT,
            claim_script: Script::new(CLAIM_SCRIPT),
            extend_script: Script::new(EXTEND_SCRIPT),
            complete_script: Script::new(COMPLETE_SCRIPT),
            release_script: Script::new(RELEASE_SCRIPT),
        })
    }

    /// [`new`](Self::new), then a PING, so that a wrong address or a server that is down is
    /// reported now rather than at the first message.
    pub async fn connect(url: &str) -> Result<Self> {
        let store = Self::new(url)?;
        store
            .ping()
            .await
            .map_err(|error| Error::Config(error.to_string()))?;
        Ok(store)
    }

    /// The longest wait for one operation, connecting included (default
    /// [`DEFAULT_REDIS_OPERATION_TIMEOUT`]; at least 1 ms).
    #[must_use]
    pub fn with_operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Asks the server for a PONG.
    pub async fn ping(&self) -> std::result::Result<(), StoreError> {
        let answer: Value = self
            .run("ping", |mut connection| async move {
                redis::cmd("PING").query_async(&mut connection).await
            })
            .await?;
        match answer {
            Value::SimpleString(pong) if pong == "PONG" => Ok(()),
            other => Err(self.unexpected("ping", &other)),
        }
    }

    /// The connection manager, made at the first call (a failed attempt is tried again at
    /// the next).
    async fn connection(&self) -> redis::RedisResult<ConnectionManager> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(self.operation_timeout)
            .set_response_timeout(self.operation_timeout)
            // Reconnecting is retried once here and again at every later operation.
            .set_number_of_retries(1)
            .set_max_delay(200);
        self.connection
            .get_or_try_init(|| ConnectionManager::new_with_config(self.client.clone(), config))
            .await
            .cloned()
    }

    /// Runs `operation` on the connection within the operation timeout.
    async fn run<T, F, Fut>(
        &self,
        name: &'static str,
        operation: F,
    ) -> std::result::Result<T, StoreError>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let attempt = async {
            let connection = self.connection().await?;
            operation(connection).await
        };
        match tokio::time::timeout(self.operation_timeout, attempt).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(error)) => Err(StoreError::Unavailable {
                store: self.description.clone(),
                operation: name,
                reason: error.to_string(),
            }),
            Err(_) => Err(StoreError::Timeout {
                store: self.description.clone(),
                operation: name,
                timeout: self.operation_timeout,
            }),
        }
    }

    async fn invoke(
        &self,
        name: &'static str,
        script: &Script,
        key: &str,
        args: &[&str],
    ) -> std::result::Result<Value, StoreError> {
        self.run(name, |mut connection| async move {
            let mut invocation = script.key(key);
            for arg in args {
                invocation.arg(*arg);
            }
            invocation.invoke_async(&mut connection).await
        })
        .await
    }

    /// A script's 1/0 answer as a bool.
    fn flag(&self, name: &'static str, answer: Value) -> std::result::Result<bool, StoreError> {
        match answer {
            Value::Int(1) => Ok(true),
            Value::Int(0) => Ok(false),
            other => Err(self.unexpected(name, &other)),
        }
    }

    fn unexpected(&self, name: &'static str, answer: &Value) -> StoreError {
        StoreError::Unexpected {
            store: self.description.clone(),
            operation: name,
            answer: format!("{answer:?}"),
        }
    }
}

fn milliseconds(ttl: Duration) -> String {
    ttl.as_millis().clamp(1, u128::from(u64::MAX)).to_string()
}

/// `url` with any password replaced, for error messages.
fn without_password(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://***{}", &url[..scheme_end], &url[at..])
        }
        _ => url.to_owned(),
    }
}

impl ClaimStore for RedisStore {
    fn claim<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> StoreFuture<'a, ClaimOutcome> {
        Box::pin(async move {
            let value = claim_value(PROCESSING, owner);
            let ttl = milliseconds(ttl);
            let answer = self
                .invoke("claim", &self.claim_script, key, &[&value, &ttl])
                .await?;
            match answer {
                Value::Int(1) => Ok(ClaimOutcome::Claimed),
                Value::BulkString(stored) => match String::from_utf8(stored) {
                    Ok(stored) => Ok(ClaimOutcome::of_stored(stored)),
                    Err(error) => {
                        Err(self.unexpected("claim", &Value::BulkString(error.into_bytes())))
                    }
                },
                other => Err(self.unexpected("claim", &other)),
            }
        })
    }

    fn extend<'a>(&'a self, key: &'a str, owner: &'a str, ttl: Duration) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let value = claim_value(PROCESSING, owner);
            let ttl = milliseconds(ttl);
            let answer = self
                .invoke("extend", &self.extend_script, key, &[&value, &ttl])
                .await?;
            self.flag("extend", answer)
        })
    }

    fn complete<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let processing = claim_value(PROCESSING, owner);
            let done = claim_value(DONE, owner);
            let ttl = milliseconds(ttl);
            let answer = self
                .invoke(
                    "complete",
                    &self.complete_script,
                    key,
                    &[&processing, &done, &ttl],
                )
                .await?;
            self.flag("complete", answer)
        })
    }

    fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let value = claim_value(PROCESSING, owner);
            let answer = self
                .invoke("release", &self.release_script, key, &[&value])
                .await?;
            self.flag("release", answer)
        })
    }

    fn describe(&self) -> String {
        self.description.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_url_is_refused_without_showing_its_password() {
        let error = RedisStore::new("http://user:secret@host:1")
            .unwrap_err()
            .to_string();
        assert!(error.contains("redis url"), "{error}");
        assert!(!error.contains("secret"), "{error}");
        let store = RedisStore::new("redis://127.0.0.1:6390/3").unwrap();
        assert_eq!(store.describe(), "redis at 127.0.0.1:6390 db 3");
    }

    #[tokio::test]
    async fn a_server_that_is_not_there_is_a_clear_error() {
        // Port 1 on loopback: nothing listens there.
        let store = RedisStore::new("redis://127.0.0.1:1")
            .unwrap()
            .with_operation_timeout(Duration::from_millis(500));
        let error = store
            .claim("g:t:k", "owner", Duration::from_secs(1))
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains("redis at 127.0.0.1:1"), "{error}");
        assert!(error.contains("claim"), "{error}");
    }
}
