//! The process's default account: what a client whose builder was given no credentials
//! authenticates as (set by programs such as `shardmq-perf` from their global options). Unset,
//! such a client is anonymous. Owns that one setting; never reads the environment (see
//! [`Credentials::from_env`](shardmq_acl::Credentials::from_env)).

use std::sync::{Mutex, PoisonError};

use shardmq_acl::Credentials;

static DEFAULT_CREDENTIALS: Mutex<Option<Credentials>> = Mutex::new(None);

/// Sets the account of every client of this process whose builder was given none. Clients
/// started before keep what they had.
pub fn set_default_credentials(credentials: Option<Credentials>) {
    *DEFAULT_CREDENTIALS
        .lock()
        .unwrap_or_else(PoisonError::into_inner) = credentials;
}

/// The account a new client uses (`explicit`: its builder's).
pub(crate) fn resolve(explicit: Option<&Credentials>) -> Option<Credentials> {
    explicit.cloned().or_else(|| {
        DEFAULT_CREDENTIALS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    })
}
