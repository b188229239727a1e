//! Permissions: what an account holds on a topic or group ([`Perm`]) and what a request needs
//! ([`Action`]), with RocketMQ's words for them.
//!
//! Owns the words `DENY`, `PUB`, `SUB`, `PUB|SUB` (and `SUB|PUB`) and the rule that decides
//! whether a holding covers a need; knows nothing of accounts, files or requests. Text enters
//! through [`Perm::parse`]; decisions leave through [`Perm::allows`].

use std::fmt;

/// What an account holds on one resource (RocketMQ's `Permission` byte without the `ANY` bit,
/// which only a request's need carries).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Perm {
    /// Nothing, even when a default would allow it.
    Deny,
    /// Produce to a topic.
    Pub,
    /// Consume from a topic; use a consumer group.
    Sub,
    /// Both.
    PubSub,
}

/// What a request needs on one resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Pub,
    Sub,
    /// Either PUB or SUB (RocketMQ's `ANY` bit: topic lookups and the like).
    Any,
}

impl Perm {
    /// Reads RocketMQ's words (`Permission.parsePermFromString`), surrounding blanks trimmed.
    /// RocketMQ turns an unknown word into DENY silently; here it is `None` so the loader can
    /// refuse the file and name the word.
    pub fn parse(word: &str) -> Option<Perm> {
        match word.trim() {
            "DENY" => Some(Perm::Deny),
            "PUB" => Some(Perm::Pub),
            "SUB" => Some(Perm::Sub),
            "PUB|SUB" | "SUB|PUB" => Some(Perm::PubSub),
            _ => None,
        }
    }

    /// RocketMQ's `Permission.checkPermission`: DENY allows nothing; ANY is met by PUB or SUB;
    /// otherwise the needed bit must be held.
    pub fn allows(self, action: Action) -> bool {
        let (is_pub, is_sub) = match self {
            Perm::Deny => return false,
            Perm::Pub => (true, false),
            Perm::Sub => (false, true),
            Perm::PubSub => (true, true),
        };
        match action {
            Action::Pub => is_pub,
            Action::Sub => is_sub,
            Action::Any => is_pub || is_sub,
        }
    }
}

impl fmt::Display for Perm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Perm::Deny => "DENY",
            Perm::Pub => "PUB",
            Perm::Sub => "SUB",
            Perm::PubSub => "PUB|SUB",
        })
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Action::Pub => "PUB",
            Action::Sub => "SUB",
            Action::Any => "PUB or SUB",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_parse_as_rocketmq_spells_them() {
        assert_eq!(Perm::parse("DENY"), Some(Perm::Deny));
        assert_eq!(Perm::parse(" PUB "), Some(Perm::Pub));
        assert_eq!(Perm::parse("SUB"), Some(Perm::Sub));
        assert_eq!(Perm::parse("PUB|SUB"), Some(Perm::PubSub));
        assert_eq!(Perm::parse("SUB|PUB"), Some(Perm::PubSub));
        for bad in ["", "pub", "ANY", "PUB | SUB", "PUB|", "READ"] {
            assert_eq!(Perm::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn holdings_cover_needs_as_in_rocketmq() {
        use Action::*;
        let table = [
            (Perm::Deny, [false, false, false]),
            (Perm::Pub, [true, false, true]),
            (Perm::Sub, [false, true, true]),
            (Perm::PubSub, [true, true, true]),
        ];
        for (perm, expected) in table {
            assert_eq!(
                [perm.allows(Pub), perm.allows(Sub), perm.allows(Any)],
                expected,
                "{perm}"
            );
        }
    }
}
