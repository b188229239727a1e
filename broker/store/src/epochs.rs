//! The epoch log of a storage shard: which master term wrote which CommitLog bytes, so that a
//! slave holding bytes its master does not (the master lost its tail, or a new master took
//! over) finds where their histories part and cuts its log there (docs/replication.md,
//! "Divergence").
//!
//! Owns the `<shard>/epochs` file: one line `epoch start_offset` per term, in increasing order
//! of both, rewritten atomically. A term begins each time a master starts (the epoch after
//! the newest it knows) at its log's end; a slave records the master's terms as their first
//! bytes reach it. Every log implicitly begins with term 0 at offset 0, so a store written
//! before epochs existed (or a fresh one) has `[(0, 0)]`.
//!
//! The rule ([`EpochLog::consistent_end`]): for the newest term both sides know with the same
//! start, the bytes they share end where the shorter side's term ends. A slave's bytes past
//! that point were never the master's: they are cut.

use std::io;
use std::path::{Path, PathBuf};

use super::atomic_file::write_atomically;

pub const EPOCHS_FILE: &str = "epochs";
/// Most terms kept; the oldest beyond it merge into their successor (a slave that far behind
/// is compared on the terms that remain).
pub const MAX_EPOCHS: usize = 4096;

/// One master term: its number and the CommitLog offset of its first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Epoch {
    pub epoch: u64,
    pub start: u64,
}

/// See the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochLog {
    entries: Vec<Epoch>,
}

impl Default for EpochLog {
    fn default() -> EpochLog {
        EpochLog {
            entries: vec![Epoch { epoch: 0, start: 0 }],
        }
    }
}

impl EpochLog {
    pub fn path(shard_dir: &Path) -> PathBuf {
        shard_dir.join(EPOCHS_FILE)
    }

    /// Loads the shard's epoch log (the implicit `[(0, 0)]` when there is none).
    pub fn load(shard_dir: &Path) -> io::Result<EpochLog> {
        let path = EpochLog::path(shard_dir);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(EpochLog::default()),
            Err(e) => return Err(e),
        };
        EpochLog::parse(&text).map_err(|why| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {why}", path.display()),
            )
        })
    }

    /// Parses the file's text; entries must increase in both epoch and start.
    pub fn parse(text: &str) -> Result<EpochLog, String> {
        let mut log = EpochLog::default();
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let mut fields = line.split_ascii_whitespace().map(str::parse::<u64>);
            let (Some(Ok(epoch)), Some(Ok(start)), None) =
                (fields.next(), fields.next(), fields.next())
            else {
                return Err(format!(
                    "line {} is not `epoch start_offset`: {line:?}",
                    number + 1
                ));
            };
            log.push(Epoch { epoch, start })
                .map_err(|why| format!("line {}: {why}", number + 1))?;
        }
        Ok(log)
    }

    /// Writes the log atomically (a small file; blocking).
    pub fn save(&self, shard_dir: &Path) -> io::Result<()> {
        write_atomically(&EpochLog::path(shard_dir), self.to_text().as_bytes())
    }

    pub fn to_text(&self) -> String {
        self.entries
            .iter()
            .skip_while(|e| e.epoch == 0 && e.start == 0)
            .map(|e| format!("{} {}\n", e.epoch, e.start))
            .collect()
    }

    pub fn entries(&self) -> &[Epoch] {
        &self.entries
    }

    pub fn last(&self) -> Epoch {
        *self.entries.last().expect("an epoch log is never empty")
    }

    /// Adds a term; it must come after the last in number and not before it in offset. A term
    /// at the same offset as the last replaces it (the last wrote nothing).
    pub fn push(&mut self, epoch: Epoch) -> Result<(), String> {
        let last = self.last();
        if epoch.epoch == last.epoch && epoch.start == last.start {
            return Ok(());
        }
        if epoch.epoch <= last.epoch || epoch.start < last.start {
            return Err(format!(
                "epoch {} at {} does not follow epoch {} at {}",
                epoch.epoch, epoch.start, last.epoch, last.start
            ));
        }
        if epoch.start == last.start && self.entries.len() > 1 {
            self.entries.pop();
        }
        self.entries.push(epoch);
        if self.entries.len() > MAX_EPOCHS {
            self.entries.remove(1);
        }
        Ok(())
    }

    /// Starts a new term at `log_end` (a master starting): the epoch after the newest known,
    /// or `at_least` if that is higher (a controller's number).
    pub fn begin_term(&mut self, log_end: u64, at_least: u64) -> Epoch {
        let epoch = Epoch {
            epoch: (self.last().epoch + 1).max(at_least),
            start: log_end.max(self.last().start),
        };
        self.push(epoch).expect("a new term follows the last");
        epoch
    }

    /// Where term `epoch` ends on a log that ends at `log_end` (`None`: no such term here).
    pub fn end_of(&self, epoch: u64, log_end: u64) -> Option<u64> {
        let index = self.entries.iter().position(|e| e.epoch == epoch)?;
        Some(
            self.entries
                .get(index + 1)
                .map_or(log_end, |next| next.start.min(log_end)),
        )
    }

    fn start_of(&self, epoch: u64) -> Option<u64> {
        self.entries
            .iter()
            .find(|e| e.epoch == epoch)
            .map(|e| e.start)
    }

    /// Where the bytes this log (a master's, ending at `master_end`) shares with a slave's
    /// (`slave`, ending at `slave_end`) end: the slave keeps its bytes below the answer and cuts
    /// the rest. Terms are compared newest first; a term both know with the same start is
    /// shared up to where the shorter side's term ends.
    pub fn consistent_end(&self, master_end: u64, slave: &EpochLog, slave_end: u64) -> u64 {
        for term in slave.entries.iter().rev() {
            if term.start > slave_end {
                continue;
            }
            if self.start_of(term.epoch) != Some(term.start) {
                continue;
            }
            let ours = self.end_of(term.epoch, master_end).unwrap_or(master_end);
            let theirs = slave.end_of(term.epoch, slave_end).unwrap_or(slave_end);
            return ours.min(theirs);
        }
        0
    }

    /// Records the master's terms whose first bytes lie in `[from, to)` (a slave appending
    /// replicated bytes). Returns whether anything changed.
    pub fn record_crossed(&mut self, master: &EpochLog, from: u64, to: u64) -> bool {
        let mut changed = false;
        for term in master.entries.iter() {
            if term.start >= to || term.start < from.min(self.last().start) {
                continue;
            }
            if term.epoch <= self.last().epoch {
                continue;
            }
            if self.push(*term).is_ok() {
                changed = true;
            }
        }
        changed
    }

    /// Drops the terms that start at or past `offset` (the log is being cut there).
    pub fn truncate(&mut self, offset: u64) {
        while self.entries.len() > 1 && self.last().start >= offset {
            self.entries.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(entries: &[(u64, u64)]) -> EpochLog {
        let mut log = EpochLog::default();
        for &(epoch, start) in entries {
            log.push(Epoch { epoch, start }).unwrap();
        }
        log
    }

    #[test]
    fn a_slave_behind_its_master_keeps_everything() {
        let master = log(&[(1, 0), (2, 500)]);
        let slave = log(&[(1, 0)]);
        assert_eq!(master.consistent_end(900, &slave, 300), 300);
        assert_eq!(master.consistent_end(900, &EpochLog::default(), 0), 0);
    }

    #[test]
    fn a_slave_past_the_end_of_a_shortened_term_is_cut_where_the_term_ended() {
        // The master wrote term 1 to 800, the slave copied it, the master lost everything past
        // 500 and restarted: term 2 begins at 500.
        let master = log(&[(1, 0), (2, 500)]);
        let slave = log(&[(1, 0)]);
        assert_eq!(master.consistent_end(600, &slave, 800), 500);
        // The master restarted with its tail lost and wrote nothing yet.
        let master = log(&[(1, 0), (2, 500)]);
        assert_eq!(master.consistent_end(500, &slave, 800), 500);
    }

    #[test]
    fn a_term_the_master_never_had_is_cut_whole() {
        // The slave was a master for term 3 (starting at 700) that the current master never saw.
        let master = log(&[(1, 0), (2, 500), (4, 650)]);
        let slave = log(&[(1, 0), (2, 500), (3, 700)]);
        assert_eq!(master.consistent_end(900, &slave, 1000), 650);
    }

    #[test]
    fn a_term_that_wrote_nothing_is_replaced_by_the_next() {
        let mut master = log(&[(1, 0)]);
        master.begin_term(100, 0);
        master.begin_term(100, 0);
        assert_eq!(
            master.entries().last(),
            Some(&Epoch {
                epoch: 3,
                start: 100
            })
        );
        assert_eq!(master.entries().len(), 3);
        // A controller's number wins when it is higher.
        assert_eq!(master.begin_term(150, 9).epoch, 9);
    }

    #[test]
    fn a_slave_records_the_terms_its_bytes_cross() {
        let master = log(&[(1, 0), (2, 500), (3, 900)]);
        let mut slave = EpochLog::default();
        assert!(slave.record_crossed(&master, 0, 400));
        assert_eq!(slave.last(), Epoch { epoch: 1, start: 0 });
        // A term starting exactly at the end is not crossed yet.
        assert!(!slave.record_crossed(&master, 400, 500));
        assert!(slave.record_crossed(&master, 500, 1000));
        assert_eq!(slave.entries().len(), 4);
        assert_eq!(master.consistent_end(1000, &slave, 1000), 1000);
        slave.truncate(900);
        assert_eq!(
            slave.last(),
            Epoch {
                epoch: 2,
                start: 500
            }
        );
    }

    #[test]
    fn the_file_round_trips_and_bad_files_are_named() {
        let original = log(&[(1, 0), (2, 500)]);
        assert_eq!(EpochLog::parse(&original.to_text()).unwrap(), original);
        assert!(EpochLog::parse("2 500\n1 600\n").is_err());
        assert!(EpochLog::parse("1 x\n").is_err());
        assert!(EpochLog::parse("1 2 3\n").is_err());
    }
}
