//! Name server requests: a topic's route, the clusters with their brokers, and the topic list.
//!
//! Owns: those three requests and reading their answers into [`TopicRoute`]s and
//! [`ClusterInfo`]s. Never: caching routes or choosing a name server (`namesrv.rs` at the top
//! of the crate).

use std::time::Duration;

use shardmq_schema::wire;

use super::{missing_body, require_namesrv_ok};
use crate::error::{Error, Result};
use crate::pool::ConnectionPool;
use crate::route::{BrokerData, ClusterInfo, QueueData, TopicRoute};

fn broker_data(broker: wire::BrokerData<'_>) -> BrokerData {
    BrokerData {
        cluster_name: broker.cluster_name().unwrap_or_default().to_owned(),
        broker_name: broker.broker_name().unwrap_or_default().to_owned(),
        addresses: broker
            .addresses()
            .iter()
            .flat_map(|addresses| addresses.iter())
            .filter_map(|address| Some((address.broker_id(), address.address()?.to_owned())))
            .collect(),
    }
}

impl ConnectionPool {
    /// A topic's route from the name server at `address`; [`Error::TopicNotFound`] when no
    /// live broker hosts it.
    pub(crate) async fn get_route(
        &self,
        address: &str,
        timeout: Duration,
        topic: &str,
    ) -> Result<TopicRoute> {
        let frame = self
            .request(address, "route lookup", timeout, |builder| {
                let topic = builder.create_string(topic);
                let request = wire::GetRouteRequest::create(
                    builder,
                    &wire::GetRouteRequestArgs { topic: Some(topic) },
                );
                (wire::Body::GetRouteRequest, request.as_union_value())
            })
            .await?;
        if frame.frame().status() == wire::Status::TOPIC_NOT_FOUND {
            return Err(Error::TopicNotFound {
                topic: topic.to_owned(),
            });
        }
        let frame = require_namesrv_ok(address, frame)?;
        let response = frame
            .frame()
            .body_as_route_response()
            .ok_or_else(|| missing_body(address, "RouteResponse"))?;
        let mut route = TopicRoute {
            topic: topic.to_owned(),
            brokers: Default::default(),
            queues: Default::default(),
        };
        for broker in response.brokers().iter().flat_map(|b| b.iter()) {
            let broker = broker_data(broker);
            route.brokers.insert(broker.broker_name.clone(), broker);
        }
        for queue in response.queues().iter().flat_map(|q| q.iter()) {
            route.queues.insert(
                queue.broker_name().unwrap_or_default().to_owned(),
                QueueData {
                    read_queues: queue.read_queues(),
                    write_queues: queue.write_queues(),
                    perm: queue.perm(),
                },
            );
        }
        Ok(route)
    }

    /// Every cluster the name server at `address` knows, with its broker names and their live
    /// instances (sorted by cluster, then broker name).
    pub(crate) async fn cluster_info(
        &self,
        address: &str,
        timeout: Duration,
    ) -> Result<Vec<ClusterInfo>> {
        let frame = self
            .request(address, "cluster info", timeout, |builder| {
                let request =
                    wire::ClusterInfoRequest::create(builder, &wire::ClusterInfoRequestArgs {});
                (wire::Body::ClusterInfoRequest, request.as_union_value())
            })
            .await?;
        let frame = require_namesrv_ok(address, frame)?;
        let response = frame
            .frame()
            .body_as_cluster_info_response()
            .ok_or_else(|| missing_body(address, "ClusterInfoResponse"))?;
        Ok(response
            .clusters()
            .iter()
            .flat_map(|clusters| clusters.iter())
            .map(|cluster| ClusterInfo {
                name: cluster.cluster_name().unwrap_or_default().to_owned(),
                brokers: cluster
                    .brokers()
                    .iter()
                    .flat_map(|brokers| brokers.iter())
                    .map(broker_data)
                    .collect(),
            })
            .collect())
    }

    /// Topic names known to the name server at `address`, sorted.
    pub(crate) async fn topic_list(&self, address: &str, timeout: Duration) -> Result<Vec<String>> {
        let frame = self
            .request(address, "topic list", timeout, |builder| {
                let request = wire::TopicListRequest::create(
                    builder,
                    &wire::TopicListRequestArgs { cluster_name: None },
                );
                (wire::Body::TopicListRequest, request.as_union_value())
            })
            .await?;
        let frame = require_namesrv_ok(address, frame)?;
        let response = frame
            .frame()
            .body_as_topic_list_response()
            .ok_or_else(|| missing_body(address, "TopicListResponse"))?;
        Ok(response
            .topics()
            .iter()
            .flat_map(|topics| topics.iter())
            .map(str::to_owned)
            .collect())
    }
}
