//! RocketMQ's `tls.server.mode`: what a listener does with TLS and with plain connections.

use std::fmt;
use std::str::FromStr;

use crate::TlsError;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TlsMode {
    /// Plain connections only (a ClientHello is read as a malformed frame).
    #[default]
    Disabled,
    /// TLS and plain on one port, told apart by the first bytes.
    Permissive,
    /// TLS only: a plain connection is closed unanswered.
    Enforcing,
}

impl TlsMode {
    /// Whether the listener accepts TLS at all (and so needs a certificate).
    #[must_use]
    pub fn is_tls_accepted(self) -> bool {
        self != Self::Disabled
    }

    /// Whether the listener accepts plain connections.
    #[must_use]
    pub fn is_plain_accepted(self) -> bool {
        self != Self::Enforcing
    }
}

impl FromStr for TlsMode {
    type Err = TlsError;

    fn from_str(text: &str) -> Result<Self, TlsError> {
        match text.trim().to_ascii_lowercase().as_str() {
            "disabled" => Ok(Self::Disabled),
            "permissive" => Ok(Self::Permissive),
            "enforcing" => Ok(Self::Enforcing),
            _ => Err(TlsError::Setting(format!(
                "TLS mode `{text}` is not one of disabled, permissive, enforcing"
            ))),
        }
    }
}

impl fmt::Display for TlsMode {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(match self {
            Self::Disabled => "disabled",
            Self::Permissive => "permissive",
            Self::Enforcing => "enforcing",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print_back() {
        for mode in [TlsMode::Disabled, TlsMode::Permissive, TlsMode::Enforcing] {
            assert_eq!(mode.to_string().parse::<TlsMode>().unwrap(), mode);
        }
        assert_eq!("Enforcing".parse::<TlsMode>().unwrap(), TlsMode::Enforcing);
        let error = "strict".parse::<TlsMode>().unwrap_err().to_string();
        assert!(error.contains("`strict`"), "{error}");
        assert!(!TlsMode::Enforcing.is_plain_accepted());
        assert!(!TlsMode::Disabled.is_tls_accepted());
    }
}
