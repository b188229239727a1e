//! openraft's network: each RPC to another controller is one `ControllerRaftRequest` frame
//! whose payload is the openraft request as JSON; the answer's payload is openraft's result
//! (response or error) as JSON. One connection per target, made again after any failure.

use std::io;
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use serde::Serialize;
use shardmq_acl::Credentials;
use shardmq_schema::{build_frame, wire};

use super::link::Link;
use super::{NodeId, TypeConfig};

/// Makes one [`Network`] per target controller.
#[derive(Debug, Clone, Default)]
pub struct NetworkFactory {
    /// This name server's account, for controllers that enforce access control.
    credentials: Option<Credentials>,
}

impl NetworkFactory {
    #[must_use]
    pub fn new(credentials: Option<Credentials>) -> NetworkFactory {
        NetworkFactory { credentials }
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = Network;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Network {
        Network {
            target,
            address: node.addr.clone(),
            link: None,
            credentials: self.credentials.clone(),
        }
    }
}

pub struct Network {
    target: NodeId,
    address: String,
    link: Option<Link>,
    credentials: Option<Credentials>,
}

enum CallError {
    /// Could not connect: the target is down.
    Unreachable(io::Error),
    /// Connected, then the call failed.
    Network(io::Error),
}

impl Network {
    async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &mut self,
        rpc: &'static str,
        request: &Req,
        ttl: Duration,
    ) -> Result<Resp, CallError> {
        let payload =
            serde_json::to_vec(request).map_err(|e| CallError::Network(io::Error::other(e)))?;
        if self.link.is_none() {
            let link = Link::connect(&self.address, ttl, self.credentials.as_ref())
                .await
                .map_err(CallError::Unreachable)?;
            self.link = Some(link);
        }
        let link = self.link.as_mut().expect("connected above");
        let call = link.request(Box::new(move |b, header| {
            let rpc = b.create_string(rpc);
            let payload = b.create_vector(&payload);
            let body = wire::ControllerRaftRequest::create(
                b,
                &wire::ControllerRaftRequestArgs {
                    rpc: Some(rpc),
                    payload: Some(payload),
                },
            );
            build_frame(
                b,
                &header,
                wire::Body::ControllerRaftRequest,
                Some(body.as_union_value()),
            )
        }));
        let answer = match tokio::time::timeout(ttl, call).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => {
                self.link = None;
                return Err(CallError::Network(e));
            }
            Err(_) => {
                self.link = None;
                return Err(CallError::Network(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{rpc} to {} timed out", self.address),
                )));
            }
        };
        let frame = answer.frame();
        if frame.status() != wire::Status::OK {
            return Err(CallError::Network(io::Error::other(format!(
                "{} answered {:?}: {}",
                self.address,
                frame.status(),
                frame.message().unwrap_or_default()
            ))));
        }
        let payload = frame
            .body_as_controller_raft_response()
            .and_then(|r| r.payload())
            .map(|p| p.bytes().to_vec())
            .unwrap_or_default();
        serde_json::from_slice(&payload).map_err(|e| CallError::Network(io::Error::other(e)))
    }
}

// The error type is openraft's, fixed by `RaftNetwork`.
#[allow(clippy::result_large_err)]
fn rpc_error<T, E: std::error::Error>(
    target: NodeId,
    outcome: Result<Result<T, E>, CallError>,
) -> Result<T, RPCError<NodeId, BasicNode, E>> {
    match outcome {
        Ok(Ok(response)) => Ok(response),
        Ok(Err(remote)) => Err(RPCError::RemoteError(RemoteError::new(target, remote))),
        Err(CallError::Unreachable(e)) => Err(RPCError::Unreachable(Unreachable::new(&e))),
        Err(CallError::Network(e)) => Err(RPCError::Network(NetworkError::new(&e))),
    }
}

impl RaftNetwork<TypeConfig> for Network {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let outcome: Result<Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>, _> =
            self.call("append", &rpc, option.hard_ttl()).await;
        rpc_error(self.target, outcome)
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        let outcome: Result<
            Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>,
            _,
        > = self.call("snapshot", &rpc, option.hard_ttl()).await;
        rpc_error(self.target, outcome)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let outcome: Result<Result<VoteResponse<NodeId>, RaftError<NodeId>>, _> =
            self.call("vote", &rpc, option.hard_ttl()).await;
        rpc_error(self.target, outcome)
    }
}
