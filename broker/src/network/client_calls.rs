//! Requests the broker sends to a client on the client's own connection (transaction
//! check-backs), and the matching of the client's RESPONSE frames to them.
//!
//! Owns: the broker's request ids (one counter per network shard, so ids are unique on every
//! connection), the table of calls waiting for their answer, and the limits on both: at most
//! [`MAX_PENDING_CLIENT_CALLS`] waiting per network shard, each for at most the timeout its
//! caller gives. Never: deciding what to ask (the caller builds the frame) or retrying.
//!
//! A RESPONSE that matches no waiting call (late, or never asked) is dropped.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use futures_channel::oneshot;
use futures_lite::future;
use glommio::channels::local_channel::LocalSender;
use shardmq_schema::{FrameError, VerifiedFrame};

use super::Outbound;

/// Calls one network shard may have waiting for their answers at once.
pub const MAX_PENDING_CLIENT_CALLS: usize = 4096;

/// Why a call to a client got no answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("{MAX_PENDING_CLIENT_CALLS} calls to clients are waiting already (MAX_PENDING_CLIENT_CALLS)")]
    TooManyPending,
    #[error("the client's connection is closed or not reading")]
    NotReachable,
    #[error("the call could not be encoded: {0}")]
    Encode(#[from] FrameError),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// The calls of one network shard that wait for their answers.
#[derive(Default)]
pub struct ClientCalls {
    next_request_id: Cell<u64>,
    /// (connection id, request id) → where the answer goes.
    waiting: RefCell<HashMap<(u64, u64), oneshot::Sender<VerifiedFrame>>>,
}

/// Removes a call's entry however its wait ends.
struct Waiting<'a> {
    calls: &'a ClientCalls,
    key: (u64, u64),
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.calls.waiting.borrow_mut().remove(&self.key);
    }
}

impl ClientCalls {
    /// Sends the REQUEST frame `encode(request_id)` on connection `connection_id` (through its
    /// writer, `push`) and waits up to `timeout` for the client's RESPONSE.
    pub async fn call(
        &self,
        connection_id: u64,
        push: &LocalSender<Outbound>,
        timeout: Duration,
        encode: impl FnOnce(u64) -> Result<Bytes, FrameError>,
    ) -> Result<VerifiedFrame, CallError> {
        if self.waiting.borrow().len() >= MAX_PENDING_CLIENT_CALLS {
            return Err(CallError::TooManyPending);
        }
        // Start at 1: request id 0 is what a peer echoes for frames it could not read.
        let request_id = self.next_request_id.get() + 1;
        self.next_request_id.set(request_id);
        let frame = encode(request_id)?;
        let (sender, answer) = oneshot::channel();
        let key = (connection_id, request_id);
        self.waiting.borrow_mut().insert(key, sender);
        let _waiting = Waiting { calls: self, key };
        // A full writer queue means the client is not reading: do not wait on it.
        push.try_send(vec![frame])
            .map_err(|_| CallError::NotReachable)?;
        future::or(
            async { answer.await.map_err(|_| CallError::NotReachable) },
            async {
                glommio::timer::sleep(timeout).await;
                Err(CallError::Timeout(timeout))
            },
        )
        .await
    }

    /// Hands a RESPONSE frame read on `connection_id` to the call waiting for it; false when
    /// none waits.
    pub fn complete(&self, connection_id: u64, frame: VerifiedFrame) -> bool {
        let key = (connection_id, frame.frame().request_id());
        match self.waiting.borrow_mut().remove(&key) {
            Some(sender) => sender.send(frame).is_ok(),
            None => false,
        }
    }

    /// Calls waiting now.
    pub fn pending(&self) -> usize {
        self.waiting.borrow().len()
    }
}
