//! Message ids the broker makes: RocketMQ's offset message id (the store host's address and port,
//! then where the record sits), with the storage shard kept in the offset's top byte. The
//! client's unique ids are made by the client; the broker only indexes them.

use std::net::{IpAddr, SocketAddr};

/// RocketMQ's offset message id: store host address and port, then the physical offset, as
/// 32 upper-case hex characters for IPv4. With several storage shards, physical offsets repeat
/// across shards, so the shard index is kept in the offset's top byte.
pub fn offset_message_id(
    store_host: SocketAddr,
    storage_shard: usize,
    physical_offset: u64,
) -> String {
    let mut id = String::with_capacity(56);
    push_offset_message_id(&mut id, store_host, storage_shard, physical_offset);
    id
}

/// The bits of a located offset below its storage shard: the shard is the top byte.
pub const STORAGE_SHARD_SHIFT: u32 = 56;

/// `(storage_shard << STORAGE_SHARD_SHIFT) | physical_offset`: a CommitLog offset that names
/// its storage shard too, as offset message ids hold it.
pub fn located_offset(storage_shard: usize, physical_offset: u64) -> u64 {
    ((storage_shard as u64) << STORAGE_SHARD_SHIFT) | physical_offset
}

/// A located offset's storage shard and its offset in that shard's CommitLog.
pub fn split_located_offset(located: u64) -> (usize, u64) {
    (
        (located >> STORAGE_SHARD_SHIFT) as usize,
        located & ((1 << STORAGE_SHARD_SHIFT) - 1),
    )
}

/// Appends [`offset_message_id`] to `id`, without allocating (answers of many messages).
pub fn push_offset_message_id(
    id: &mut String,
    store_host: SocketAddr,
    storage_shard: usize,
    physical_offset: u64,
) {
    match store_host.ip() {
        IpAddr::V4(ip) => shardmq_schema::hex::push_upper_hex(&ip.octets(), id),
        IpAddr::V6(ip) => shardmq_schema::hex::push_upper_hex(&ip.octets(), id),
    }
    shardmq_schema::hex::push_upper_hex(&u32::from(store_host.port()).to_be_bytes(), id);
    shardmq_schema::hex::push_upper_hex(
        &located_offset(storage_shard, physical_offset).to_be_bytes(),
        id,
    );
}

/// Inverse of [`offset_message_id`] for IPv4 ids: (host, storage shard, physical offset).
pub fn parse_offset_message_id(id: &str) -> Option<(SocketAddr, usize, u64)> {
    if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let bytes: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&id[i * 2..i * 2 + 2], 16))
        .collect::<Result<_, _>>()
        .ok()?;
    let ip = std::net::Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]);
    let port = u32::from_be_bytes(bytes[4..8].try_into().ok()?) as u16;
    let (storage_shard, physical_offset) =
        split_located_offset(u64::from_be_bytes(bytes[8..16].try_into().ok()?));
    Some((
        SocketAddr::new(IpAddr::V4(ip), port),
        storage_shard,
        physical_offset,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_message_id_round_trips_with_shard() {
        let host: SocketAddr = "10.1.2.3:10911".parse().unwrap();
        let id = offset_message_id(host, 1, 123_456);
        assert_eq!(id.len(), 32);
        assert_eq!(&id[..8], "0A010203");
        assert_eq!(parse_offset_message_id(&id), Some((host, 1, 123_456)));
        assert_eq!(parse_offset_message_id("xyz"), None);
    }
}
