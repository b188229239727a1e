//! The epoch log of a storage shard: which master term wrote which CommitLog bytes, so that a
//! slave holding bytes its master does not (the master lost its tail, or a new master took
//! over) finds where their histories part and cuts its log there (docs/replication.md,
//! "Divergence").
//!
//! Owns the `<shard>/epochs` file: one line `epoch start_offset incarnation` per term, in
//! increasing order of epoch and start, rewritten atomically. A term begins each time a master
//! starts (the epoch after the newest it knows, or the controller's) at its log's end, with a
//! random 64-bit incarnation id; a slave records the master's terms as their first bytes reach
//! it. Every log implicitly begins with term 0 at offset 0, so a store written before epochs
//! existed (or a fresh one) has `[(0, 0)]`. Lines of two fields (terms begun before incarnation
//! ids) read as incarnation 0.
//!
//! A term's identity is (epoch, start, incarnation): without a controller handing out epochs,
//! two brokers can both begin epoch 2 at the same offset (a master restarting in place while
//! its slave was promoted by hand) and write different bytes there; their incarnations differ,
//! so neither mistakes the other's term for its own.
//!
//! The rule ([`EpochLog::consistent_end`]): for the newest term both sides know with the same
//! identity, the bytes they share end where the shorter side's term ends. A slave's bytes past
//! that point were never the master's: they are cut.

use std::io;
use std::path::{Path, PathBuf};

use super::atomic_file::write_atomically;

pub const EPOCHS_FILE: &str = "epochs";
/// A sync master's record of the newest of its own terms in which a slave acknowledged bytes
/// (one line `epoch start incarnation`): after a restart it tells the master that a slave may
/// hold acknowledged bytes its own log lost (docs/replication.md, "A master that lost its
/// tail").
pub const REPLICATED_TERM_FILE: &str = "replicated-term";
/// Most terms kept; the oldest beyond it merge into their successor (a slave that far behind
/// is compared on the terms that remain).
pub const MAX_EPOCHS: usize = 4096;

/// One master term: its number, the CommitLog offset of its first byte, and the random id of
/// the master start that began it (0: begun before incarnation ids, or the implicit term 0).
/// Two terms are the same term when all three are equal (`==`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Epoch {
    pub epoch: u64,
    pub start: u64,
    pub incarnation: u64,
}

/// A random, non-zero incarnation id for a term a master begins.
pub fn new_incarnation() -> u64 {
    loop {
        // The OS's random source; failing that (it does not on Linux), the clock and the pid.
        let id = getrandom::u64().unwrap_or_else(|_| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            nanos ^ (u64::from(std::process::id()) << 32)
        });
        if id != 0 {
            return id;
        }
    }
}

/// See the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochLog {
    entries: Vec<Epoch>,
}

impl Default for EpochLog {
    fn default() -> EpochLog {
        EpochLog {
            entries: vec![Epoch {
                epoch: 0,
                start: 0,
                incarnation: 0,
            }],
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
            let fields: Vec<Result<u64, _>> = line
                .split_ascii_whitespace()
                .map(str::parse::<u64>)
                .collect();
            let (epoch, start, incarnation) = match fields[..] {
                [Ok(epoch), Ok(start)] => (epoch, start, 0),
                [Ok(epoch), Ok(start), Ok(incarnation)] => (epoch, start, incarnation),
                _ => {
                    return Err(format!(
                        "line {} is not `epoch start_offset [incarnation]`: {line:?}",
                        number + 1
                    ))
                }
            };
            log.push(Epoch {
                epoch,
                start,
                incarnation,
            })
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
            .map(|e| format!("{} {} {}\n", e.epoch, e.start, e.incarnation))
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
        if epoch == last {
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
    /// or `at_least` if that is higher (a controller's number), with a new incarnation id.
    /// Terms that begin at or past `log_end` hold none of this log's bytes (they wrote nothing,
    /// or a power loss took what they wrote) and are dropped, so the new term begins exactly
    /// where the log ends and every byte written from here on is the new term's. What a slave
    /// holds of a dropped term is found through the term a slave acknowledged last
    /// ([`REPLICATED_TERM_FILE`]) and taken back with [`take_back`](Self::take_back).
    pub fn begin_term(&mut self, log_end: u64, at_least: u64) -> Epoch {
        let number = (self.last().epoch + 1).max(at_least);
        self.truncate(log_end);
        let epoch = Epoch {
            epoch: number,
            start: log_end,
            incarnation: new_incarnation(),
        };
        self.push(epoch).expect("a new term follows the last");
        epoch
    }

    /// Bytes of `source`'s terms (a slave's log) from where this log's last term begins up to
    /// `to` were appended before that term wrote anything (a master taking back what a power
    /// loss took from its log): records the terms those bytes cross, as `source` names them,
    /// and moves the last term's start to `to`.
    pub fn take_back(&mut self, source: &EpochLog, to: u64) {
        let current = self.last();
        if self.entries.len() < 2 || to <= current.start {
            return;
        }
        self.entries.pop();
        for term in source.entries() {
            let is_crossed = term.start >= current.start && term.start < to;
            if is_crossed && term.epoch > self.last().epoch && term.epoch < current.epoch {
                let _ = self.push(*term);
            }
        }
        let moved = Epoch {
            start: to.max(self.last().start),
            ..current
        };
        self.push(moved)
            .expect("the current term follows the terms taken back");
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

    fn term(&self, epoch: u64) -> Option<&Epoch> {
        self.entries.iter().find(|e| e.epoch == epoch)
    }

    /// Where the bytes this log (a master's, ending at `master_end`) shares with a slave's
    /// (`slave`, ending at `slave_end`) end: the slave keeps its bytes below the answer and cuts
    /// the rest. Terms are compared newest first; a term both know with the same identity
    /// (number, start and incarnation) is shared up to where the shorter side's term ends.
    pub fn consistent_end(&self, master_end: u64, slave: &EpochLog, slave_end: u64) -> u64 {
        for term in slave.entries.iter().rev() {
            if term.start > slave_end {
                continue;
            }
            if !self.term(term.epoch).is_some_and(|ours| ours == term) {
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

    /// The term before the last (`None` when the last is the only one).
    pub fn previous(&self) -> Option<Epoch> {
        self.entries.len().checked_sub(2).map(|i| self.entries[i])
    }

    /// Where a slave's copy (`slave`, ending at `slave_end`) of this log's previous term ends,
    /// when it reaches past where this log's last term begins: the slave holds bytes of that
    /// term this log lost (a master that lost its tail, then began a new term where its log
    /// ended). `None` when the slave holds nothing of the kind.
    pub fn lost_tail_end(&self, slave: &EpochLog, slave_end: u64) -> Option<u64> {
        let previous = self.previous()?;
        if slave.term(previous.epoch) != Some(&previous) {
            return None;
        }
        let theirs = slave.end_of(previous.epoch, slave_end)?;
        (theirs > self.last().start).then_some(theirs)
    }

    /// Drops the terms that start at or past `offset` (the log is being cut there).
    pub fn truncate(&mut self, offset: u64) {
        while self.entries.len() > 1 && self.last().start >= offset {
            self.entries.pop();
        }
    }
}

/// The term [`REPLICATED_TERM_FILE`] names (`None` when there is none).
pub fn load_replicated_term(shard_dir: &Path) -> io::Result<Option<Epoch>> {
    let path = shard_dir.join(REPLICATED_TERM_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let fields: Vec<u64> = text
        .split_ascii_whitespace()
        .map(str::parse::<u64>)
        .collect::<Result<_, _>>()
        .map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        })?;
    match fields[..] {
        [epoch, start, incarnation] => Ok(Some(Epoch {
            epoch,
            start,
            incarnation,
        })),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} is not `epoch start incarnation`: {text:?}",
                path.display()
            ),
        )),
    }
}

/// Records `term` in [`REPLICATED_TERM_FILE`] (atomically; blocking).
pub fn save_replicated_term(shard_dir: &Path, term: Epoch) -> io::Result<()> {
    let text = format!("{} {} {}\n", term.epoch, term.start, term.incarnation);
    write_atomically(&shard_dir.join(REPLICATED_TERM_FILE), text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(entries: &[(u64, u64)]) -> EpochLog {
        let mut log = EpochLog::default();
        for &(epoch, start) in entries {
            log.push(Epoch {
                epoch,
                start,
                incarnation: 0,
            })
            .unwrap();
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
    fn a_slave_holding_the_masters_lost_tail_is_found_and_the_term_moves_past_it() {
        // Term 1 written to 800 and copied; the master lost everything past 500 and began
        // term 2 there.
        let mut master = log(&[(1, 0), (2, 500)]);
        let slave = log(&[(1, 0)]);
        assert_eq!(master.lost_tail_end(&slave, 800), Some(800));
        // A slave no further than the cut, or one that never had term 1, holds nothing lost.
        assert_eq!(master.lost_tail_end(&slave, 500), None);
        assert_eq!(master.lost_tail_end(&log(&[(3, 0)]), 800), None);
        // A slave that went on to a term of its own holds term 1 only up to that term.
        assert_eq!(
            master.lost_tail_end(&log(&[(1, 0), (3, 650)]), 900),
            Some(650)
        );
        // A term 1 of the same number begun by another start is not the master's.
        let other = EpochLog {
            entries: vec![
                EpochLog::default().last(),
                Epoch {
                    epoch: 1,
                    start: 0,
                    incarnation: 7,
                },
            ],
        };
        assert_eq!(master.lost_tail_end(&other, 800), None);
        master.take_back(&slave, 800);
        assert_eq!(master.last().start, 800);
        assert_eq!(master.lost_tail_end(&slave, 800), None);
        assert_eq!(master.consistent_end(800, &slave, 800), 800);
    }

    #[test]
    fn the_replicated_term_file_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load_replicated_term(dir.path()).unwrap(), None);
        let term = Epoch {
            epoch: 4,
            start: 1 << 40,
            incarnation: u64::MAX,
        };
        save_replicated_term(dir.path(), term).unwrap();
        assert_eq!(load_replicated_term(dir.path()).unwrap(), Some(term));
        std::fs::write(dir.path().join(REPLICATED_TERM_FILE), "4 5").unwrap();
        assert!(load_replicated_term(dir.path()).is_err());
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
        let last = master.last();
        assert_eq!((last.epoch, last.start), (3, 100));
        assert_ne!(last.incarnation, 0, "a begun term has an incarnation id");
        assert_eq!(master.entries().len(), 3);
        // A controller's number wins when it is higher.
        assert_eq!(master.begin_term(150, 9).epoch, 9);
    }

    #[test]
    fn a_term_a_power_loss_took_whole_is_dropped_and_the_next_begins_at_the_log_end() {
        // Term 2 began at 500; the log was cut back to 400 (and to 0 below).
        let mut master = log(&[(1, 0), (2, 500)]);
        let next = master.begin_term(400, 0);
        assert_eq!((next.epoch, next.start), (3, 400));
        let kept: Vec<(u64, u64)> = master
            .entries()
            .iter()
            .map(|e| (e.epoch, e.start))
            .collect();
        assert_eq!(kept, [(0, 0), (1, 0), (3, 400)]);
        let mut emptied = log(&[(1, 0), (2, 500)]);
        let next = emptied.begin_term(0, 0);
        assert_eq!((next.epoch, next.start), (3, 0));
        assert_eq!(emptied.entries().len(), 2);
    }

    #[test]
    fn a_slave_records_the_terms_its_bytes_cross() {
        let master = log(&[(1, 0), (2, 500), (3, 900)]);
        let mut slave = EpochLog::default();
        assert!(slave.record_crossed(&master, 0, 400));
        assert_eq!(
            slave.last(),
            Epoch {
                epoch: 1,
                start: 0,
                incarnation: 0
            }
        );
        // A term starting exactly at the end is not crossed yet.
        assert!(!slave.record_crossed(&master, 400, 500));
        assert!(slave.record_crossed(&master, 500, 1000));
        assert_eq!(slave.entries().len(), 4);
        assert_eq!(master.consistent_end(1000, &slave, 1000), 1000);
        slave.truncate(900);
        assert_eq!((slave.last().epoch, slave.last().start), (2, 500));
    }

    #[test]
    fn the_file_round_trips_and_bad_files_are_named() {
        let original = log(&[(1, 0), (2, 500)]);
        assert_eq!(EpochLog::parse(&original.to_text()).unwrap(), original);
        assert!(EpochLog::parse("2 500\n1 600\n").is_err());
        assert!(EpochLog::parse("1 x\n").is_err());
        assert!(EpochLog::parse("1 2 3 4\n").is_err());
        // Begun terms keep their incarnation ids; a file from before them reads as 0.
        let mut begun = log(&[(1, 0)]);
        begun.begin_term(700, 0);
        let text = begun.to_text();
        assert_eq!(text.lines().last().unwrap().split(' ').count(), 3);
        assert_eq!(EpochLog::parse(&text).unwrap(), begun);
        let legacy = EpochLog::parse("1 0\n2 500\n").unwrap();
        assert_eq!(legacy, log(&[(1, 0), (2, 500)]));
    }

    #[test]
    fn two_masters_that_began_the_same_epoch_at_the_same_offset_are_told_apart() {
        // Both wrote term 1 from 0. Then the master restarted in place at 500 while its slave,
        // promoted by hand, also began epoch 2 at 500: different bytes past 500 on each.
        let shared = log(&[(1, 0)]);
        let mut restarted = shared.clone();
        let mut promoted = shared.clone();
        let a = restarted.begin_term(500, 0);
        let b = promoted.begin_term(500, 0);
        assert_eq!((a.epoch, a.start), (b.epoch, b.start));
        assert_ne!(a.incarnation, b.incarnation);
        // The promoted broker joins the restarted one as its slave: only term 1 is shared, so
        // it keeps 500 bytes and cuts the rest, rather than keeping its own epoch 2 bytes.
        assert_eq!(restarted.consistent_end(900, &promoted, 800), 500);
        // The same term on both sides (a slave that copied it) is shared to the shorter end.
        let mut copy = shared.clone();
        assert!(copy.record_crossed(&restarted, 400, 600));
        assert_eq!(copy.last(), a);
        assert_eq!(restarted.consistent_end(900, &copy, 800), 800);
    }
}
