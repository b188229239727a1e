//! Reading PEM files (certificate chains, private keys, CA bundles) and noticing that a file
//! changed.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::RootCertStore;

use crate::TlsError;

/// Most bytes a PEM file may have (a chain of a few certificates is a few KiB).
const MAX_PEM_FILE_BYTES: u64 = 1 << 20;

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let read_error = |source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    };
    let length = std::fs::metadata(path).map_err(read_error)?.len();
    if length > MAX_PEM_FILE_BYTES {
        return Err(TlsError::Pem {
            what,
            path: path.to_owned(),
            reason: format!("{length} bytes, over the {MAX_PEM_FILE_BYTES} a PEM file may have"),
        });
    }
    std::fs::read(path).map_err(read_error)
}

/// The certificates of a PEM file, in order (a chain: the leaf first).
pub(crate) fn certificates(
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read(what, path)?;
    let certificates = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| TlsError::Pem {
            what,
            path: path.to_owned(),
            reason: error.to_string(),
        })?;
    if certificates.is_empty() {
        return Err(TlsError::Empty {
            what,
            path: path.to_owned(),
            expected: "CERTIFICATE block",
        });
    }
    Ok(certificates)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub(crate) fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read("key", path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|error| match error {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::Empty {
            what: "key",
            path: path.to_owned(),
            expected: "PRIVATE KEY block",
        },
        error => TlsError::Pem {
            what: "key",
            path: path.to_owned(),
            reason: error.to_string(),
        },
    })
}

/// The trust anchors of a CA bundle.
pub(crate) fn roots(what: &'static str, path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for (index, certificate) in certificates(what, path)?.into_iter().enumerate() {
        roots
            .add(certificate)
            .map_err(|source| TlsError::BadAnchor {
                path: path.to_owned(),
                index,
                source,
            })?;
    }
    Ok(roots)
}

/// What identifies one version of a set of files: for each, its modification time, length and
/// inode (a file replaced by a rename has a new inode even within one mtime tick). A file that
/// cannot be read stamps as `None`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Stamp(Vec<Option<(SystemTime, u64, u64)>>);

impl Stamp {
    pub(crate) fn of(paths: &[&PathBuf]) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self(
            paths
                .iter()
                .map(|path| {
                    let metadata = std::fs::metadata(path).ok()?;
                    Some((metadata.modified().ok()?, metadata.len(), metadata.ino()))
                })
                .collect(),
        )
    }
}
