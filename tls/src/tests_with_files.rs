//! Loading, refusing and reloading real files made by `scripts/make-certs.sh`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::ServerName;

use crate::{ClientAuth, ClientTlsFiles, ServerTls, ServerTlsFiles, TlsError};

fn make_certs() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/make-certs.sh");
    let status = std::process::Command::new(script)
        .arg(dir.path())
        .stdout(std::process::Stdio::null())
        .status()
        .expect("scripts/make-certs.sh runs (needs openssl)");
    assert!(status.success());
    dir
}

fn path(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}

/// Runs a TLS handshake in memory between the two configurations; the client's error, or the
/// server's when the client saw none, or the subject of the certificate the server presented.
fn handshake(
    server: Arc<rustls::ServerConfig>,
    client: &crate::ClientTls,
    address: &str,
) -> Result<Vec<u8>, rustls::Error> {
    let mut server = rustls::ServerConnection::new(server).unwrap();
    let mut client =
        rustls::ClientConnection::new(client.config(), client.server_name_for(address).unwrap())
            .unwrap();
    for _ in 0..10 {
        let mut bytes = Vec::new();
        client.write_tls(&mut bytes).unwrap();
        server.read_tls(&mut bytes.as_slice()).unwrap();
        server.process_new_packets()?;
        let mut bytes = Vec::new();
        server.write_tls(&mut bytes).unwrap();
        client.read_tls(&mut bytes.as_slice()).unwrap();
        client.process_new_packets()?;
        if !client.is_handshaking() && !server.is_handshaking() {
            let certificate = client.peer_certificates().unwrap()[0].to_vec();
            return Ok(certificate);
        }
    }
    panic!("the handshake did not finish");
}

fn der(path: &Path) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_file(path)
        .unwrap()
        .to_vec()
}

#[test]
fn a_client_trusting_the_ca_completes_a_handshake() {
    let dir = make_certs();
    let server = ServerTls::load(ServerTlsFiles::new(
        path(&dir, "server.pem"),
        path(&dir, "server.key"),
    ))
    .unwrap();
    let client = ClientTlsFiles::new(path(&dir, "ca.pem")).load().unwrap();
    let presented = handshake(server.config(), &client, "127.0.0.1:9876").unwrap();
    assert_eq!(presented, der(&path(&dir, "server.pem")));
    let by_name = handshake(server.config(), &client, "localhost:9876").unwrap();
    assert_eq!(by_name, presented);
}

#[test]
fn a_client_trusting_another_ca_refuses_the_server() {
    let dir = make_certs();
    let server = ServerTls::load(ServerTlsFiles::new(
        path(&dir, "server.pem"),
        path(&dir, "server.key"),
    ))
    .unwrap();
    let client = ClientTlsFiles::new(path(&dir, "other-ca.pem"))
        .load()
        .unwrap();
    let error = handshake(server.config(), &client, "127.0.0.1:1").unwrap_err();
    assert!(
        matches!(
            error,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer)
        ),
        "{error}"
    );
}

#[test]
fn an_expired_server_certificate_is_refused() {
    let dir = make_certs();
    let server = ServerTls::load(ServerTlsFiles::new(
        path(&dir, "expired.pem"),
        path(&dir, "expired.key"),
    ))
    .unwrap();
    let client = ClientTlsFiles::new(path(&dir, "ca.pem")).load().unwrap();
    let error = handshake(server.config(), &client, "127.0.0.1:1").unwrap_err();
    assert!(error.to_string().contains("expired"), "{error}");
}

#[test]
fn mutual_tls_refuses_a_client_without_a_certificate_unless_optional() {
    let dir = make_certs();
    let files = ServerTlsFiles::new(path(&dir, "server.pem"), path(&dir, "server.key"));
    let required = ServerTls::load(
        files
            .clone()
            .with_client_ca(path(&dir, "ca.pem"), ClientAuth::Required),
    )
    .unwrap();
    let optional =
        ServerTls::load(files.with_client_ca(path(&dir, "ca.pem"), ClientAuth::Optional)).unwrap();
    let anonymous = ClientTlsFiles::new(path(&dir, "ca.pem")).load().unwrap();
    let with_cert = ClientTlsFiles::new(path(&dir, "ca.pem"))
        .with_client_cert(path(&dir, "client.pem"), path(&dir, "client.key"))
        .load()
        .unwrap();
    let error = handshake(required.config(), &anonymous, "127.0.0.1:1").unwrap_err();
    assert!(
        matches!(error, rustls::Error::NoCertificatesPresented),
        "{error}"
    );
    handshake(required.config(), &with_cert, "127.0.0.1:1").unwrap();
    handshake(optional.config(), &anonymous, "127.0.0.1:1").unwrap();
}

#[test]
fn bad_files_are_named_in_the_error() {
    let dir = make_certs();
    let missing = ServerTls::load(ServerTlsFiles::new(
        path(&dir, "nothing.pem"),
        path(&dir, "server.key"),
    ))
    .unwrap_err();
    assert!(matches!(missing, TlsError::Read { .. }));
    assert!(missing.to_string().contains("nothing.pem"), "{missing}");

    // A key given as the certificate: no CERTIFICATE block in it.
    let swapped = ServerTls::load(ServerTlsFiles::new(
        path(&dir, "server.key"),
        path(&dir, "server.key"),
    ))
    .unwrap_err();
    assert!(swapped.to_string().contains("server.key"), "{swapped}");
    assert!(swapped.to_string().contains("CERTIFICATE"), "{swapped}");

    let mismatched = ServerTls::load(ServerTlsFiles::new(
        path(&dir, "server.pem"),
        path(&dir, "client.key"),
    ))
    .unwrap_err();
    assert!(matches!(mismatched, TlsError::Pair { .. }), "{mismatched}");

    let half = ClientTlsFiles::new(path(&dir, "ca.pem"));
    let half = ClientTlsFiles {
        cert_chain: Some(path(&dir, "client.pem")),
        ..half
    };
    assert!(half
        .load()
        .unwrap_err()
        .to_string()
        .contains("without its key"));
}

#[test]
fn replaced_files_are_used_for_new_connections_and_broken_ones_are_not() {
    let dir = make_certs();
    let live = tempfile::tempdir().unwrap();
    let cert = live.path().join("cert.pem");
    let key = live.path().join("cert.key");
    std::fs::copy(path(&dir, "server.pem"), &cert).unwrap();
    std::fs::copy(path(&dir, "server.key"), &key).unwrap();
    let server = ServerTls::load(ServerTlsFiles::new(&cert, &key)).unwrap();
    let trusts_both = {
        let bundle = live.path().join("both.pem");
        let mut pem = std::fs::read(path(&dir, "ca.pem")).unwrap();
        pem.extend(std::fs::read(path(&dir, "other-ca.pem")).unwrap());
        std::fs::write(&bundle, pem).unwrap();
        ClientTlsFiles::new(bundle).load().unwrap()
    };
    let before = server.config();
    assert_eq!(
        handshake(before.clone(), &trusts_both, "127.0.0.1:1").unwrap(),
        der(&path(&dir, "server.pem"))
    );

    // A certificate without its key yet: the previous pair stays.
    std::fs::copy(path(&dir, "other-server.pem"), &cert).unwrap();
    std::thread::sleep(crate::RELOAD_CHECK_INTERVAL);
    assert!(Arc::ptr_eq(&server.config(), &before));
    assert_eq!(server.reload_count(), 0);

    std::fs::copy(path(&dir, "other-server.key"), &key).unwrap();
    std::thread::sleep(crate::RELOAD_CHECK_INTERVAL);
    let after = server.config();
    assert_eq!(server.reload_count(), 1);
    assert_eq!(
        handshake(after, &trusts_both, "127.0.0.1:1").unwrap(),
        der(&path(&dir, "other-server.pem"))
    );
}

#[test]
fn server_names_come_from_the_address_unless_given() {
    let dir = make_certs();
    let client = ClientTlsFiles::new(path(&dir, "ca.pem")).load().unwrap();
    assert_eq!(
        client.server_name_for("127.0.0.1:9876").unwrap(),
        ServerName::try_from("127.0.0.1").unwrap()
    );
    assert_eq!(
        client.server_name_for("[::1]:9876").unwrap(),
        ServerName::try_from("::1").unwrap()
    );
    let named = ClientTlsFiles::new(path(&dir, "ca.pem"))
        .with_server_name("broker.example")
        .load()
        .unwrap();
    assert_eq!(
        named.server_name_for("10.0.0.1:9876").unwrap(),
        ServerName::try_from("broker.example").unwrap()
    );
}
