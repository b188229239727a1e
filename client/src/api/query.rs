//! Message queries: by key within a time range, or by unique id, and the stored records they
//! answer with.
//!
//! Owns: those two requests and decoding their answers. Never: which brokers to ask
//! (`admin.rs`, `broker_admin.rs`).

use std::time::Duration;

use bytes::Bytes;
use shardmq_schema::{wire, VerifiedFrame};

use super::{missing_body, require_ok};
use crate::error::{Error, Result};
use crate::message::MessageExt;
use crate::pool::ConnectionPool;
use crate::record::decode_records;

fn decode_records_of(
    address: &str,
    frame: &VerifiedFrame,
    records: Option<flatbuffers::Vector<'_, u8>>,
    broker_name: &str,
) -> Result<Vec<MessageExt>> {
    let Some(records) = records.filter(|r| !r.is_empty()) else {
        return Ok(Vec::new());
    };
    let bytes = frame
        .share(records.bytes())
        .unwrap_or_else(|| Bytes::copy_from_slice(records.bytes()));
    decode_records(&bytes, broker_name).map_err(|error| Error::CorruptRecord {
        address: address.to_owned(),
        reason: error.to_string(),
    })
}

impl ConnectionPool {
    /// Messages of `topic` with `key`, stored within `[begin_ms, end_ms]` (end 0: now).
    pub(crate) async fn query_by_key(
        &self,
        address: &str,
        timeout: Duration,
        topic: &str,
        key: &str,
        (begin_ms, end_ms): (i64, i64),
        max_results: u32,
    ) -> Result<Vec<MessageExt>> {
        let frame = self
            .request(address, "query by key", timeout, |builder| {
                let topic = builder.create_string(topic);
                let key = builder.create_string(key);
                let request = wire::QueryByKeyRequest::create(
                    builder,
                    &wire::QueryByKeyRequestArgs {
                        topic: Some(topic),
                        key: Some(key),
                        begin_ms,
                        end_ms,
                        max_results,
                    },
                );
                (wire::Body::QueryByKeyRequest, request.as_union_value())
            })
            .await?;
        self.query_answer(address, frame)
    }

    /// The message with this unique id (`UNIQ_KEY`), stored within `[begin_ms, end_ms]`.
    pub(crate) async fn query_by_unique_id(
        &self,
        address: &str,
        timeout: Duration,
        unique_id: &str,
        begin_ms: i64,
        end_ms: i64,
    ) -> Result<Vec<MessageExt>> {
        let frame = self
            .request(address, "query by id", timeout, |builder| {
                let unique_id = builder.create_string(unique_id);
                let request = wire::QueryByIdRequest::create(
                    builder,
                    &wire::QueryByIdRequestArgs {
                        unique_id: Some(unique_id),
                        offset_msg_id: None,
                        begin_ms,
                        end_ms,
                    },
                );
                (wire::Body::QueryByIdRequest, request.as_union_value())
            })
            .await?;
        self.query_answer(address, frame)
    }

    pub(crate) fn query_answer(
        &self,
        address: &str,
        frame: VerifiedFrame,
    ) -> Result<Vec<MessageExt>> {
        if frame.frame().status() == wire::Status::QUERY_NOT_FOUND {
            return Ok(Vec::new());
        }
        let frame = require_ok(address, frame)?;
        let records = frame
            .frame()
            .body_as_query_response()
            .ok_or_else(|| missing_body(address, "QueryResponse"))?
            .records();
        decode_records_of(address, &frame, records, "")
    }
}
