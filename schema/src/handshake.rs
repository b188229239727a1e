//! The protocol version rule of the handshake (docs/protocol.md, "Version handshake").
//!
//! Owns: which protocol versions this build speaks and how a server picks one from a client's
//! `HandshakeRequest`. Never: sending or awaiting anything; the broker, namesrv and client call
//! [`negotiate_protocol_version`] and write the `HandshakeResponse` themselves.

/// The protocol version this build speaks and sends in `HandshakeRequest.protocol_version`.
/// Bump it for any change that old peers cannot read by flatbuffers' own evolution rules.
pub const PROTOCOL_VERSION: u32 = 2;

/// The oldest protocol version this build still speaks.
pub const MIN_PROTOCOL_VERSION: u32 = 1;

/// Picks the version to speak with a peer that speaks `peer_min_version..=peer_max_version`
/// (a `HandshakeRequest`'s `min_protocol_version` and `protocol_version`; a min of 0 means the
/// same as the max): the highest version both sides speak, or `None` when there is none, in
/// which case the server answers `UNSUPPORTED_VERSION`.
#[must_use]
pub fn negotiate_protocol_version(peer_max_version: u32, peer_min_version: u32) -> Option<u32> {
    let peer_min_version = if peer_min_version == 0 {
        peer_max_version
    } else {
        peer_min_version
    };
    let highest_common = peer_max_version.min(PROTOCOL_VERSION);
    let lowest_common = peer_min_version.max(MIN_PROTOCOL_VERSION);
    (highest_common >= lowest_common && highest_common != 0).then_some(highest_common)
}

/// A `HandshakeRequest` frame from `client_id` offering this build's versions: what a
/// server-to-server link (replication, registration, the controller) sends first.
pub fn build_handshake_request<'b>(
    builder: &mut flatbuffers::FlatBufferBuilder<'b>,
    header: &crate::FrameHeader<'_>,
    client_id: &str,
) -> flatbuffers::WIPOffset<crate::wire::Frame<'b>> {
    let client_id = builder.create_string(client_id);
    let body = crate::wire::HandshakeRequest::create(
        builder,
        &crate::wire::HandshakeRequestArgs {
            protocol_version: PROTOCOL_VERSION,
            min_protocol_version: MIN_PROTOCOL_VERSION,
            client_id: Some(client_id),
            client_version: None,
        },
    );
    crate::build_frame(
        builder,
        header,
        crate::wire::Body::HandshakeRequest,
        Some(body.as_union_value()),
    )
}

/// An `AuthRequest` frame: the answer to a `HandshakeResponse` that carried an `auth_nonce`
/// (docs/acl.md, "The native handshake").
pub fn build_auth_request<'b>(
    builder: &mut flatbuffers::FlatBufferBuilder<'b>,
    header: &crate::FrameHeader<'_>,
    access_key: &str,
    client_nonce: &[u8],
    proof: &[u8],
) -> flatbuffers::WIPOffset<crate::wire::Frame<'b>> {
    let access_key = builder.create_string(access_key);
    let client_nonce = builder.create_vector(client_nonce);
    let proof = builder.create_vector(proof);
    let body = crate::wire::AuthRequest::create(
        builder,
        &crate::wire::AuthRequestArgs {
            access_key: Some(access_key),
            client_nonce: Some(client_nonce),
            proof: Some(proof),
        },
    );
    crate::build_frame(
        builder,
        header,
        crate::wire::Body::AuthRequest,
        Some(body.as_union_value()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_version_is_chosen() {
        assert_eq!(negotiate_protocol_version(1, 1), Some(1));
        assert_eq!(negotiate_protocol_version(1, 0), Some(1));
        assert_eq!(negotiate_protocol_version(2, 1), Some(2));
    }

    #[test]
    fn newer_peer_that_accepts_ours_gets_ours() {
        assert_eq!(negotiate_protocol_version(7, 1), Some(PROTOCOL_VERSION));
    }

    #[test]
    fn no_common_version_is_refused() {
        assert_eq!(negotiate_protocol_version(0, 0), None);
        assert_eq!(negotiate_protocol_version(9, PROTOCOL_VERSION + 1), None);
        assert_eq!(negotiate_protocol_version(9, 0), None);
        // A nonsensical range (min above max) is refused rather than guessed at.
        assert_eq!(negotiate_protocol_version(1, 3), None);
    }
}
