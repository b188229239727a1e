//! Talking to the name servers: route look-ups with a cache, and topic lists.
//!
//! Owns: the list of name server addresses and which one answered last (asked first next
//! time; the others are tried in turn when it fails), and the route cache that the client's
//! background task refreshes every 30 s (RocketMQ's `pollNameServerInterval`). Never: broker
//! requests.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{debug, warn};

use crate::error::{Error, Result};
use crate::pool::ConnectionPool;
use crate::route::{ClusterInfo, TopicRoute};

/// How often cached routes are fetched again (RocketMQ's `pollNameServerInterval`).
pub const ROUTE_REFRESH_INTERVAL: Duration = Duration::from_secs(30);

/// The name servers of one client and its route cache.
pub(crate) struct NameServers {
    addresses: Vec<String>,
    /// Index of the name server to ask first (the last one that answered).
    preferred: AtomicUsize,
    pool: Arc<ConnectionPool>,
    timeout: Duration,
    routes: Mutex<HashMap<String, Arc<TopicRoute>>>,
}

impl NameServers {
    pub(crate) fn new(
        addresses: Vec<String>,
        pool: Arc<ConnectionPool>,
        timeout: Duration,
    ) -> Self {
        debug_assert!(!addresses.is_empty(), "checked by the builders");
        Self {
            addresses,
            preferred: AtomicUsize::new(0),
            pool,
            timeout,
            routes: Mutex::new(HashMap::new()),
        }
    }

    fn routes(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<TopicRoute>>> {
        self.routes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Asks the name servers in turn, from the preferred one, until one answers (an answer
    /// with an error status counts: the name server is up). `call` gets the pool, an address
    /// and the timeout.
    async fn ask<T, F, Fut>(&self, call: F) -> Result<T>
    where
        F: Fn(Arc<ConnectionPool>, String, Duration) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let first = self.preferred.load(Ordering::Relaxed);
        let mut last_error = None;
        for step in 0..self.addresses.len() {
            let index = (first + step) % self.addresses.len();
            let address = self.addresses[index].clone();
            match call(Arc::clone(&self.pool), address.clone(), self.timeout).await {
                Err(error) if error.is_transport() => {
                    debug!(namesrv = %address, %error, "name server failed; trying the next");
                    last_error = Some(error);
                }
                outcome => {
                    self.preferred.store(index, Ordering::Relaxed);
                    return outcome;
                }
            }
        }
        Err(Error::NameServerUnavailable {
            tried: self.addresses.clone(),
            last: Box::new(last_error.unwrap_or(Error::ShutDown)),
        })
    }

    /// The route of `topic`: from the cache, else fetched.
    pub(crate) async fn route(&self, topic: &str) -> Result<Arc<TopicRoute>> {
        if let Some(route) = self.routes().get(topic) {
            return Ok(Arc::clone(route));
        }
        self.fetch_route(topic).await
    }

    /// Fetches the route of `topic` now and caches it. A topic without a route leaves the
    /// cache.
    pub(crate) async fn fetch_route(&self, topic: &str) -> Result<Arc<TopicRoute>> {
        let outcome =
            self.ask(|pool, address, timeout| async move {
                pool.get_route(&address, timeout, topic).await
            })
            .await;
        match outcome {
            Ok(route) => {
                let route = Arc::new(route);
                self.routes().insert(topic.to_owned(), Arc::clone(&route));
                Ok(route)
            }
            Err(error) => {
                if matches!(error, Error::TopicNotFound { .. }) {
                    self.routes().remove(topic);
                }
                Err(error)
            }
        }
    }

    /// Every cached route.
    pub(crate) fn cached_routes(&self) -> Vec<Arc<TopicRoute>> {
        self.routes().values().cloned().collect()
    }

    /// Fetches every cached route again; a failure keeps the old route (a name server outage
    /// must not stop producers).
    pub(crate) async fn refresh_all(&self) {
        let topics: Vec<String> = self.routes().keys().cloned().collect();
        for topic in topics {
            if let Err(error) = self.fetch_route(&topic).await {
                warn!(%topic, %error, "route refresh failed");
            }
        }
    }

    /// Every cluster with its broker names and live instances.
    pub(crate) async fn cluster_info(&self) -> Result<Vec<ClusterInfo>> {
        self.ask(|pool, address, timeout| async move { pool.cluster_info(&address, timeout).await })
            .await
    }

    /// Topic names the name servers know, sorted.
    pub(crate) async fn topic_list(&self) -> Result<Vec<String>> {
        self.ask(|pool, address, timeout| async move { pool.topic_list(&address, timeout).await })
            .await
    }
}
