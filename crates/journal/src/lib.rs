//! crossbook's durability: a write-ahead journal of commands, snapshots of
//! the engine state, and recovery (`docs/journal.md`).
//!
//! The engine is a deterministic state machine, so its state is a function
//! of the commands applied: journal every command before acknowledging it,
//! snapshot now and then, and rebuild on start from the newest snapshot that
//! checks out plus the journal after it.
//!
//! This is the only crate that touches files.

pub mod format;
pub mod read;
pub mod write;

pub use read::{Corruption, JournalEnd, TornTail, scan};
pub use write::{CommitStats, Durability, Journal, JournalConfig, JournalError, micros_histogram, sync_dir};

use crossbook_engine::Engine;
use format::*;
use sha2::{Digest, Sha256};
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

/// SHA-256 of the engine's canonical state, in hex: two states are equal
/// exactly when their hashes are.
pub fn state_hash(engine: &Engine) -> String {
    let mut bytes = Vec::new();
    engine.encode_state(&mut bytes);
    Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes a snapshot of `engine` into `dir` (temporary file, sync, rename,
/// sync the directory) and removes all but the newest `keep` snapshots.
pub fn write_snapshot(dir: &Path, engine: &Engine, keep: usize) -> Result<PathBuf, JournalError> {
    let mut state = Vec::new();
    engine.encode_state(&mut state);
    write_snapshot_state(dir, engine.seq(), &state, keep)
}

/// [`write_snapshot`] of a state already encoded (`Engine::encode_state`)
/// at sequence number `seq`: the encoding is quick and must happen on the
/// engine's thread; the writing and syncing can happen on another.
pub fn write_snapshot_state(dir: &Path, seq: u64, state: &[u8], keep: usize) -> Result<PathBuf, JournalError> {
    let bytes = encode_snapshot(seq, state);
    let path = dir.join(snapshot_name(seq));
    let temporary = path.with_extension("xbs.tmp");
    {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&temporary)
            .map_err(write::io(format!("creating {}", temporary.display())))?;
        file.write_all(&bytes).map_err(write::io(format!("writing {}", temporary.display())))?;
        file.sync_all().map_err(write::io(format!("syncing {}", temporary.display())))?;
    }
    std::fs::rename(&temporary, &path).map_err(write::io(format!("renaming {}", temporary.display())))?;
    sync_dir(dir)?;
    let all = read::snapshots(dir).map_err(write::io(format!("listing {}", dir.display())))?;
    for (_, old) in all.into_iter().skip(keep.max(1)) {
        std::fs::remove_file(&old).map_err(write::io(format!("removing {}", old.display())))?;
    }
    Ok(path)
}

/// Loads and checks one snapshot file.
pub fn load_snapshot(path: &Path) -> Result<Engine, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read: {e}"))?;
    let (seq, state) = decode_snapshot(&bytes)?;
    let engine = Engine::decode_state(state).map_err(|e| e.to_string())?;
    if engine.seq() != seq {
        return Err(format!("header says seq {seq}, state says {}", engine.seq()));
    }
    Ok(engine)
}

/// What recovery rebuilt, and how.
pub struct Recovered {
    pub engine: Engine,
    pub end: JournalEnd,
    /// Sequence number of the snapshot it started from, if any.
    pub snapshot: Option<u64>,
    /// Commands replayed from the journal on top of it.
    pub replayed: u64,
    /// Things that were wrong but recoverable (a torn tail truncated, a bad
    /// snapshot skipped), one line each.
    pub warnings: Vec<String>,
}

#[derive(Debug)]
pub enum RecoveryError {
    Corruption(Corruption),
    Io(JournalError),
}

impl std::fmt::Display for RecoveryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecoveryError::Corruption(c) => write!(f, "{c}"),
            RecoveryError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for RecoveryError {}

/// Rebuilds the state from `dir` (created if missing): the newest snapshot
/// that checks out (older ones, or the journal from the start, as fallback)
/// plus every journal record after it. A torn tail is truncated; corruption
/// anywhere else is an error naming file, offset and sequence number.
pub fn recover(dir: &Path) -> Result<Recovered, RecoveryError> {
    std::fs::create_dir_all(dir).map_err(|e| RecoveryError::Io(write::io(format!("creating {}", dir.display()))(e)))?;
    let mut warnings = Vec::new();
    let candidates = read::snapshots(dir).map_err(|e| RecoveryError::Io(write::io(format!("listing {}", dir.display()))(e)))?;
    let mut candidates: Vec<Option<(u64, PathBuf)>> = candidates.into_iter().map(Some).collect();
    candidates.push(None);
    for candidate in candidates {
        let (mut engine, from) = match &candidate {
            Some((seq, path)) => match load_snapshot(path) {
                Ok(engine) => (engine, *seq),
                Err(why) => {
                    warnings.push(format!("snapshot {} is unusable ({why}); trying an older one", path.display()));
                    continue;
                }
            },
            None => (Engine::new(), 0),
        };
        let (end, replayed) = replay(dir, &mut engine, from)?;
        if end.last_seq < from {
            let path = candidate.as_ref().map(|(_, p)| p.display().to_string()).unwrap_or_default();
            warnings.push(format!(
                "snapshot {path} is ahead of the journal (journal ends at seq {}); trying an older one",
                end.last_seq
            ));
            continue;
        }
        if let Some(torn) = &end.torn {
            truncate_torn_tail(dir, torn).map_err(RecoveryError::Io)?;
            warnings.push(format!(
                "torn tail truncated: {} at offset {} (seq {} was never acknowledged: {})",
                torn.file.display(),
                torn.offset,
                torn.seq,
                torn.what
            ));
        }
        return Ok(Recovered { engine, end, snapshot: candidate.map(|(seq, _)| seq), replayed, warnings });
    }
    unreachable!("the last candidate (no snapshot) always returns")
}

/// Commands handed from the reading thread to the applying one at a time.
const REPLAY_BATCH: usize = 4096;

/// Applies every journal record after `from` to `engine`. One thread reads,
/// checks and decodes the journal while this one applies, so recovery runs
/// at close to the engine's own speed.
fn replay(dir: &Path, engine: &mut Engine, from: u64) -> Result<(JournalEnd, u64), RecoveryError> {
    let (sender, receiver) = std::sync::mpsc::sync_channel::<Vec<crossbook_engine::Command>>(4);
    let reader_dir = dir.to_path_buf();
    let reader = std::thread::Builder::new()
        .name("journal-reader".into())
        .spawn(move || {
            let mut batch = Vec::with_capacity(REPLAY_BATCH);
            let result = scan(&reader_dir, |seq, payload| {
                if seq <= from {
                    return Ok(());
                }
                batch.push(crate::format::split_payload(payload)?.0);
                if batch.len() == REPLAY_BATCH {
                    let full = std::mem::replace(&mut batch, Vec::with_capacity(REPLAY_BATCH));
                    sender.send(full).map_err(|_| "recovery stopped".to_string())?;
                }
                Ok(())
            });
            if result.is_ok() && !batch.is_empty() {
                let _ = sender.send(batch);
            }
            result
        })
        .map_err(|e| RecoveryError::Io(write::io("starting the journal reader thread")(e)))?;
    let mut events = Vec::new();
    let mut replayed = 0u64;
    for batch in receiver {
        for command in &batch {
            events.clear();
            engine.apply(command, &mut events);
        }
        replayed += batch.len() as u64;
    }
    let end = match reader.join() {
        Ok(result) => result.map_err(RecoveryError::Corruption)?,
        Err(_) => panic!("the journal reader thread panicked"),
    };
    Ok((end, replayed))
}

fn truncate_torn_tail(dir: &Path, torn: &TornTail) -> Result<(), JournalError> {
    if torn.whole_segment {
        std::fs::remove_file(&torn.file).map_err(write::io(format!("removing {}", torn.file.display())))?;
    } else {
        let file = OpenOptions::new().write(true).open(&torn.file).map_err(write::io(format!("opening {}", torn.file.display())))?;
        file.set_len(torn.offset).map_err(write::io(format!("truncating {}", torn.file.display())))?;
        file.sync_all().map_err(write::io(format!("syncing {}", torn.file.display())))?;
    }
    sync_dir(dir)
}

/// One problem found by [`verify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    Corruption(Corruption),
    TornTail(TornTail),
    BadSnapshot { file: PathBuf, what: String },
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::Corruption(c) => write!(f, "{c}"),
            Problem::TornTail(t) => write!(
                f,
                "torn tail: {} at offset {} (seq {}): {}; recovery would truncate it",
                t.file.display(),
                t.offset,
                t.seq,
                t.what
            ),
            Problem::BadSnapshot { file, what } => write!(f, "bad snapshot: {}: {what}", file.display()),
        }
    }
}

/// Checks every record and snapshot in `dir` without changing anything.
/// Returns what was found and the problems, each with its exact place.
pub fn verify(dir: &Path) -> (Option<JournalEnd>, Vec<Problem>) {
    let mut problems = Vec::new();
    let end = match scan(dir, |_, payload| crate::format::split_payload(payload).map(|_| ())) {
        Ok(end) => {
            if let Some(torn) = &end.torn {
                problems.push(Problem::TornTail(torn.clone()));
            }
            Some(end)
        }
        Err(corruption) => {
            // Recovery stops at the first damage; verify goes on, segment by
            // segment, so that every damaged place is named.
            let later = read::check_later_segments(dir, &corruption.file);
            problems.push(Problem::Corruption(corruption));
            problems.extend(later.into_iter().map(Problem::Corruption));
            None
        }
    };
    match read::snapshots(dir) {
        Ok(found) => {
            for (_, path) in found {
                if let Err(what) = load_snapshot(&path) {
                    problems.push(Problem::BadSnapshot { file: path, what });
                }
            }
        }
        Err(e) => problems.push(Problem::BadSnapshot { file: dir.to_path_buf(), what: format!("cannot list: {e}") }),
    }
    (end, problems)
}
