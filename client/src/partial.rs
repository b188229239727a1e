//! Answers gathered from several brokers, some of which may not answer.
//!
//! A cluster-wide admin command (list groups, a group's progress, a query, creating a topic on
//! every master) asks each broker in turn. One dead broker — the name servers keep routing to
//! it for up to two minutes — must not hide what the others said: the command answers with
//! what it got and names each broker that failed, and the caller decides (the CLI prints both
//! and exits with status 3).

use crate::error::{Error, Result};

/// A broker that did not answer its part of a request sent to several.
#[derive(Debug)]
pub struct BrokerFailure {
    /// The broker's address.
    pub address: String,
    pub error: Error,
}

/// What the brokers that answered said, and each that did not.
#[derive(Debug)]
pub struct Partial<T> {
    pub value: T,
    pub failures: Vec<BrokerFailure>,
}

impl<T> Partial<T> {
    /// Every broker asked answered.
    pub fn is_complete(&self) -> bool {
        self.failures.is_empty()
    }

    /// The value when every broker answered; the first failure otherwise.
    pub fn complete(self) -> Result<T> {
        match self.failures.into_iter().next() {
            None => Ok(self.value),
            Some(failure) => Err(failure.error),
        }
    }
}

/// Collects the parts of a fan-out: `value` grows with each answer, failures are kept.
pub(crate) struct FanOut<T> {
    partial: Partial<T>,
    answered: usize,
}

impl<T> FanOut<T> {
    pub(crate) fn new(value: T) -> FanOut<T> {
        FanOut {
            partial: Partial {
                value,
                failures: Vec::new(),
            },
            answered: 0,
        }
    }

    /// Records one broker's answer: `merge` folds it into the value, or the failure is kept.
    pub(crate) fn add<A>(
        &mut self,
        address: &str,
        answer: Result<A>,
        merge: impl FnOnce(&mut T, A),
    ) {
        match answer {
            Ok(answer) => {
                self.answered += 1;
                merge(&mut self.partial.value, answer);
            }
            Err(error) => self.partial.failures.push(BrokerFailure {
                address: address.to_owned(),
                error,
            }),
        }
    }

    /// The result: an error when brokers were asked and none answered (the first failure),
    /// else what was gathered.
    pub(crate) fn finish(self) -> Result<Partial<T>> {
        if self.answered == 0 && !self.partial.failures.is_empty() {
            return Err(self
                .partial
                .failures
                .into_iter()
                .next()
                .expect("a failure")
                .error);
        }
        Ok(self.partial)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(address: &str) -> Error {
        Error::InvalidArgument(format!("{address} is down"))
    }

    #[test]
    fn answers_are_kept_beside_failures_and_none_at_all_is_an_error() {
        let mut fan: FanOut<Vec<u32>> = FanOut::new(Vec::new());
        fan.add("a:1", Ok(vec![1, 2]), |all, part| all.extend(part));
        fan.add::<Vec<u32>>("b:1", Err(refused("b:1")), |all, part| all.extend(part));
        let partial = fan.finish().unwrap();
        assert!(!partial.is_complete());
        assert_eq!(partial.value, vec![1, 2]);
        assert_eq!(partial.failures[0].address, "b:1");
        assert!(partial.complete().is_err());

        let mut none: FanOut<Vec<u32>> = FanOut::new(Vec::new());
        none.add::<Vec<u32>>("b:1", Err(refused("b:1")), |all, part| all.extend(part));
        assert!(none.finish().is_err(), "nobody answered");
        let empty: FanOut<Vec<u32>> = FanOut::new(Vec::new());
        assert!(
            empty.finish().unwrap().is_complete(),
            "nobody to ask is no failure"
        );
    }
}
