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

pub use read::{Corruption, JournalEnd, RecordDamage, Records, TornTail, read_records, scan, scan_chained, scan_chained_from, scan_timed_from};
pub use format::{SnapshotError, SnapshotHeader};
pub use write::{CommitStats, DirLock, Durability, DurableWatch, Journal, JournalConfig, JournalError, lock_dir, micros_histogram, sync_dir};

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
/// `chain` is the checksum of the journal record at `engine.seq()`
/// ([`write::DurableWatch::chain_at`], or [`JournalEnd::last_crc`] right
/// after recovery): the snapshot is bound to that record. The caller must
/// write only what the journal holds durably (`docs/journal.md`).
pub fn write_snapshot(dir: &Path, engine: &Engine, chain: u32, keep: usize) -> Result<PathBuf, JournalError> {
    let mut state = Vec::new();
    engine.encode_state(&mut state);
    write_snapshot_state(dir, SnapshotHeader { seq: engine.seq(), chain }, &state, &[], Retention { newest: keep, reach: 0 })
}

/// Which snapshots stay when a new one is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// The newest this many (at least 1), whatever they hold.
    pub newest: usize,
    /// Among those with attachments (`crossbook serve` rebuilds its report
    /// histories from one): the newest at or below `N - reach` (`N` the
    /// newest snapshot's seq) and the oldest above it, so that one with
    /// attachments between `reach` and about twice `reach` commands
    /// before the newest stays once the journal is that long. 0: only the
    /// newest with attachments is kept besides the newest `newest`.
    pub reach: u64,
}

/// The snapshots (newest first, as [`read::snapshots`] lists them) that
/// `retention` keeps; `attached(path)` says whether one has attachments.
pub fn retained(all: &[(u64, PathBuf)], retention: Retention, attached: impl Fn(&Path) -> bool) -> Vec<PathBuf> {
    let mut keep: Vec<PathBuf> = all.iter().take(retention.newest.max(1)).map(|(_, p)| p.clone()).collect();
    if retention.reach == 0 {
        // A writer that does not know the server's reach (`crossbook
        // journal snapshot`) still leaves the newest with attachments, so
        // that a restart of the server is not left without one.
        if let Some((_, path)) = all.iter().find(|(_, p)| attached(p))
            && !keep.contains(path)
        {
            keep.push(path.clone());
        }
    }
    if let (Some((newest, _)), true) = (all.first(), retention.reach > 0) {
        let horizon = newest.saturating_sub(retention.reach);
        let with: Vec<&(u64, PathBuf)> = all.iter().filter(|(_, p)| attached(p)).collect();
        let anchor = with.iter().find(|(seq, _)| *seq <= horizon);
        let candidate = with.iter().rev().find(|(seq, _)| *seq > horizon);
        for (_, path) in anchor.into_iter().chain(candidate) {
            if !keep.contains(path) {
                keep.push(path.clone());
            }
        }
    }
    keep
}

/// [`write_snapshot`] of a state already encoded (`Engine::encode_state`)
/// at `header.seq`, with the gateways' `attachments` (opaque here; empty
/// for none): the encoding is quick and must happen on the engine's
/// thread; the writing and syncing can happen on another. A failure
/// removes the temporary file (best effort) and leaves every snapshot
/// that was there.
pub fn write_snapshot_state(dir: &Path, header: SnapshotHeader, state: &[u8], attachments: &[u8], retention: Retention) -> Result<PathBuf, JournalError> {
    let path = dir.join(snapshot_name(header.seq));
    // A snapshot at the same command holds the same state (the engine is
    // a function of the journal): one written without the gateways'
    // checkpoints (at shutdown) does not replace a sound one with them
    // (an operator's SIGUSR1 just before), which spares the next start a
    // longer re-read.
    let keep_existing = attachments.is_empty()
        && std::fs::read(&path).is_ok_and(|existing| decode_snapshot(&existing).is_ok_and(|parts| parts.header == header && parts.state == state && !parts.attachments.is_empty()));
    if !keep_existing {
        write_whole(dir, &path, &encode_snapshot(header, state, attachments))?;
    }
    let all = read::snapshots(dir).map_err(write::io(format!("listing {}", dir.display())))?;
    let keep = retained(&all, retention, |p| read::snapshot_has_attachments(p).unwrap_or(false));
    for (_, old) in all.iter().filter(|(_, p)| !keep.contains(p)) {
        std::fs::remove_file(old).map_err(write::io(format!("removing {}", old.display())))?;
    }
    Ok(path)
}

/// Writes `bytes` as `path` in `dir` whole: a temporary file, synced,
/// renamed over it, the directory synced. A failure removes the temporary
/// file (best effort) and leaves what was there.
fn write_whole(dir: &Path, path: &Path, bytes: &[u8]) -> Result<(), JournalError> {
    let temporary = path.with_extension("xbs.tmp");
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&temporary)
            .map_err(write::io(format!("creating {}", temporary.display())))?;
        file.write_all(bytes).map_err(write::io(format!("writing {}", temporary.display())))?;
        file.sync_all().map_err(write::io(format!("syncing {}", temporary.display())))?;
        drop(file);
        std::fs::rename(&temporary, path).map_err(write::io(format!("renaming {}", temporary.display())))
    })();
    if let Err(error) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(error);
    }
    sync_dir(dir)
}

/// Loads and checks one snapshot file: checksum, format, state decoding,
/// the full invariant check, and that its name, header and state agree on
/// the sequence number.
pub fn load_snapshot(path: &Path) -> Result<(SnapshotHeader, Engine), SnapshotError> {
    load_snapshot_with_attachments(path).map(|(header, engine, _)| (header, engine))
}

/// [`load_snapshot`], with the attachments the gateways kept with it.
pub fn load_snapshot_with_attachments(path: &Path) -> Result<(SnapshotHeader, Engine, Vec<u8>), SnapshotError> {
    let damaged = SnapshotError::Damaged;
    let bytes = std::fs::read(path).map_err(|e| damaged(format!("cannot read: {e}")))?;
    let SnapshotParts { header, state, attachments } = decode_snapshot(&bytes)?;
    if numbered(path, "snapshot-", ".xbs").is_some_and(|named| named != header.seq) {
        return Err(damaged(format!("named for seq {} but its header says {}", numbered(path, "snapshot-", ".xbs").unwrap_or(0), header.seq)));
    }
    let engine = Engine::decode_state(state).map_err(|e| damaged(e.to_string()))?;
    if engine.seq() != header.seq {
        return Err(damaged(format!("header says seq {}, state says {}", header.seq, engine.seq())));
    }
    Ok((header, engine, attachments.to_vec()))
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
    /// snapshot skipped, one that does not belong set aside), one line
    /// each.
    pub warnings: Vec<String>,
    /// Snapshots that do not belong to this journal, and the names they
    /// were set aside under (never looked at again).
    pub set_aside: Vec<(PathBuf, PathBuf)>,
}

#[derive(Debug)]
pub enum RecoveryError {
    Corruption(Corruption),
    Io(JournalError),
    /// The journal holds no record, but a snapshot shows that commands up
    /// to `synced_through` were synced: its segments are lost (deleted, or
    /// a damaged disk). Recovery refuses, changing nothing, rather than
    /// let a new venue start over the lost one.
    JournalLost { snapshot: PathBuf, synced_through: u64 },
}

impl std::fmt::Display for RecoveryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecoveryError::Corruption(c) => write!(f, "{c}"),
            RecoveryError::Io(e) => write!(f, "{e}"),
            RecoveryError::JournalLost { snapshot, synced_through } => write!(
                f,
                "the journal holds no record, but snapshot {} shows that commands 1..={synced_through} were synced: the journal is lost \
                 (its segments deleted, or a damaged disk); refusing to start over it. Restore the segments (from a backup or a replica), \
                 or move the snapshots out of the directory to start a new venue there",
                snapshot.display()
            ),
        }
    }
}

impl std::error::Error for RecoveryError {}

/// Names a set-aside snapshot may take (`.set-aside`, `.set-aside-2`, ...).
const SET_ASIDE_NAMES: u32 = 1000;

/// Renames a snapshot that does not belong to the journal (or is damaged)
/// out of the way for good (recovery lists only `snapshot-N.xbs`), and
/// syncs the directory so that the rename survives a crash. Returns its
/// new name.
pub fn set_aside(dir: &Path, path: &Path) -> Result<PathBuf, JournalError> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    for n in 1..=SET_ASIDE_NAMES {
        let target = path.with_file_name(if n == 1 { format!("{name}.set-aside") } else { format!("{name}.set-aside-{n}") });
        if target.exists() {
            continue;
        }
        std::fs::rename(path, &target).map_err(write::io(format!("setting aside {}", path.display())))?;
        sync_dir(dir)?;
        return Ok(target);
    }
    Err(JournalError::Io {
        context: format!("setting aside {}", path.display()),
        source: std::io::Error::other(format!("{SET_ASIDE_NAMES} set-aside names already taken")),
    })
}

/// Cuts the journal in `dir` after record `seq`: the records after it go
/// (the segment holding `seq + 1` is cut at that record, later segments and
/// snapshots past `seq` are removed), and everything is synced. For a
/// replicated node whose journal holds commands the replicated log does not
/// (a deposed leader's last, never acknowledged, batches): the log is the
/// truth, and the node follows it from `seq` on. Nothing is cut from a
/// journal that ends at or before `seq`.
pub fn truncate_after(dir: &Path, seq: u64) -> Result<(), JournalError> {
    let segments = format::list(dir, "segment-", ".xbj").map_err(write::io(format!("listing {}", dir.display())))?;
    for (first, path) in &segments {
        if *first > seq {
            std::fs::remove_file(path).map_err(write::io(format!("removing {}", path.display())))?;
        }
    }
    if let Some((_, path)) = segments.iter().rev().find(|(first, _)| *first <= seq) {
        let bytes = std::fs::read(path).map_err(write::io(format!("reading {}", path.display())))?;
        let bad = |what: String| JournalError::Io { context: format!("cutting {} after record {seq}", path.display()), source: std::io::Error::other(what) };
        let header = format::parse_segment_header(&bytes).map_err(bad)?;
        let (mut at, mut chain, mut next) = (format::SEGMENT_HEADER_BYTES, header.chain_seed, header.first_seq);
        while next <= seq {
            match format::decode_record_at(&bytes, at, chain) {
                Ok(view) => {
                    at += view.size;
                    chain = view.crc;
                    next += 1;
                }
                // The journal ends before `seq` (its end, or zeros written
                // ahead): nothing to cut.
                Err(format::RecordError::Incomplete | format::RecordError::BadLength(0)) => {
                    at = bytes.len();
                    break;
                }
                Err(e) => return Err(bad(format!("record {next}: {e}"))),
            }
        }
        if (at as u64) < bytes.len() as u64 {
            let file = std::fs::OpenOptions::new().write(true).open(path).map_err(write::io(format!("opening {}", path.display())))?;
            file.set_len(at as u64).map_err(write::io(format!("cutting {}", path.display())))?;
            file.sync_all().map_err(write::io(format!("syncing {}", path.display())))?;
        }
    }
    for (at, path) in read::snapshots(dir).map_err(write::io(format!("listing {}", dir.display())))? {
        if at > seq {
            std::fs::remove_file(&path).map_err(write::io(format!("removing {}", path.display())))?;
        }
    }
    write::sync_dir(dir)
}

/// Rebuilds the state from `dir` (created if missing): the newest snapshot
/// that checks out *and belongs to this journal* (its record's checksum is
/// the journal's), older ones or the journal from the start as fallback,
/// plus every journal record after it. A snapshot ahead of the journal or
/// naming another record is set aside for good; a torn tail is truncated;
/// corruption anywhere else is an error naming file, offset and sequence
/// number.
pub fn recover(dir: &Path) -> Result<Recovered, RecoveryError> {
    let io_error = |what: String| move |e: std::io::Error| RecoveryError::Io(write::io(what)(e));
    std::fs::create_dir_all(dir).map_err(io_error(format!("creating {}", dir.display())))?;
    let mut warnings = Vec::new();
    let mut set_asides = Vec::new();
    // The highest seq a snapshot set aside as ahead of the journal shows
    // was synced: a torn tail at or below it is lost synced history, not
    // a write that was never acknowledged.
    let mut synced_through = 0;
    // A snapshot being written when the process stopped: never renamed
    // into place, so never part of the state; removed so it takes no
    // room.
    for leftover in read::snapshot_leftovers(dir).map_err(io_error(format!("listing {}", dir.display())))? {
        std::fs::remove_file(&leftover).map_err(io_error(format!("removing {}", leftover.display())))?;
        warnings.push(format!("unfinished snapshot {} (its writing was cut short) removed", leftover.display()));
    }
    let candidates = read::snapshots(dir).map_err(io_error(format!("listing {}", dir.display())))?;
    let mut candidates: Vec<Option<(u64, PathBuf)>> = candidates.into_iter().map(Some).collect();
    candidates.push(None);
    // Snapshots to set aside, and why (`belongs` false: damaged): renamed
    // once recovery has found what to start from, so that a start it
    // refuses changes nothing.
    let mut to_set_aside: Vec<(PathBuf, String, bool)> = Vec::new();
    // The snapshot that shows the most synced history lost, if one does.
    let mut lost: Option<PathBuf> = None;
    for candidate in candidates {
        let (mut engine, header) = match &candidate {
            Some((_, path)) => match load_snapshot(path) {
                Ok((header, engine)) => (engine, header),
                Err(why @ SnapshotError::Unbound { .. }) => {
                    to_set_aside.push((path.clone(), why.to_string(), true));
                    continue;
                }
                Err(SnapshotError::Damaged(why)) => {
                    // Set aside too (kept for a look, never listed again):
                    // left in place, a damaged snapshot newer than the
                    // good ones would count among those pruning keeps.
                    to_set_aside.push((path.clone(), why.to_string(), false));
                    continue;
                }
            },
            None => (Engine::new(), SnapshotHeader { seq: 0, chain: 0 }),
        };
        let path = candidate.as_ref().map(|(_, p)| p.clone()).unwrap_or_default();
        let (end, replayed) = match replay(dir, &mut engine, header)? {
            Replay::Done { end, replayed } => (end, replayed),
            Replay::Mismatch { found } => {
                to_set_aside.push((
                    path,
                    format!("it continues record {} with checksum {:08x}, the journal's record {} has {found:08x}", header.seq, header.chain, header.seq),
                    true,
                ));
                continue;
            }
        };
        if end.last_seq < header.seq {
            // A snapshot is written only once the journal has synced its
            // sequence number: records past the journal's end up to it
            // were durable, so they are named as lost.
            if header.seq > synced_through {
                synced_through = header.seq;
                lost = Some(path.clone());
            }
            to_set_aside.push((
                path,
                format!(
                    "it is ahead of the journal: seq {}, the journal ends at seq {}; records {}..={} were synced before the snapshot was written and are lost (damage to synced history, or a disk that lied about a sync)",
                    header.seq,
                    end.last_seq,
                    end.last_seq + 1,
                    header.seq
                ),
                true,
            ));
            continue;
        }
        // Nothing of the journal left, where a snapshot shows there was:
        // going on would start a new venue over a lost one.
        if end.last_seq == 0
            && let Some(snapshot) = lost
        {
            return Err(RecoveryError::JournalLost { snapshot, synced_through });
        }
        for (path, why, belongs) in to_set_aside {
            let target = set_aside(dir, &path).map_err(RecoveryError::Io)?;
            warnings.push(if belongs {
                format!("snapshot {} does not belong to this journal ({why}): set aside as {}, never to be used", path.display(), target.display())
            } else {
                format!("snapshot {} is damaged ({why}): set aside as {}; trying an older one", path.display(), target.display())
            });
            set_asides.push((path, target));
        }
        if let Some(torn) = &end.torn {
            truncate_torn_tail(dir, torn).map_err(RecoveryError::Io)?;
            let why = if torn.seq <= synced_through {
                format!("synced, as the snapshot at seq {synced_through} set aside above shows: lost with the records after it")
            } else {
                "as far as the journal can tell, written but never synced (a torn write: never acknowledged in sync mode; damage to a synced last record looks the same, docs/journal.md)".to_string()
            };
            let done = if torn.whole_segment { "torn segment removed (its header never made it to disk)" } else { "torn tail truncated" };
            warnings.push(format!("{done}: {} at offset {} (seq {} on: {why}: {})", torn.file.display(), torn.offset, torn.seq, torn.what));
        }
        let snapshot = candidate.map(|(seq, _)| seq);
        return Ok(Recovered { engine, end, snapshot, replayed, warnings, set_aside: set_asides });
    }
    unreachable!("the last candidate (no snapshot) always returns")
}

/// Commands handed from the reading thread to the applying one at a time.
const REPLAY_BATCH: usize = 4096;

enum Replay {
    Done { end: JournalEnd, replayed: u64 },
    /// The journal's record at the snapshot's sequence number is another
    /// one (this checksum): nothing was applied.
    Mismatch { found: u32 },
}

/// Applies every journal record after `from.seq` to `engine`, once the
/// record at `from.seq` has shown it is the one the snapshot continues.
/// One thread reads, checks and decodes the journal while this one
/// applies, so recovery runs at close to the engine's own speed.
fn replay(dir: &Path, engine: &mut Engine, from: SnapshotHeader) -> Result<Replay, RecoveryError> {
    let (sender, receiver) = std::sync::mpsc::sync_channel::<Vec<crossbook_engine::Command>>(4);
    let reader_dir = dir.to_path_buf();
    let reader = std::thread::Builder::new()
        .name("journal-reader".into())
        .spawn(move || {
            let mut batch = Vec::with_capacity(REPLAY_BATCH);
            let mut mismatch = None;
            let result = read::scan_chained(&reader_dir, |seq, payload, crc| {
                if seq < from.seq {
                    return Ok(());
                }
                if seq == from.seq {
                    if crc != from.chain {
                        mismatch = Some(crc);
                        return Err("the snapshot does not continue this record".into());
                    }
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
            (result, mismatch)
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
    let (result, mismatch) = match reader.join() {
        Ok(outcome) => outcome,
        Err(_) => panic!("the journal reader thread panicked"),
    };
    if let Some(found) = mismatch {
        return Ok(Replay::Mismatch { found });
    }
    let end = result.map_err(RecoveryError::Corruption)?;
    Ok(Replay::Done { end, replayed })
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
    /// A snapshot that is damaged or cannot be loaded.
    BadSnapshot { file: PathBuf, what: String },
    /// A sound snapshot that does not belong to this journal: ahead of its
    /// end, naming another record, or of a format that names none.
    /// Recovery would set it aside.
    ForeignSnapshot { file: PathBuf, what: String },
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::Corruption(c) => write!(f, "{c}"),
            Problem::TornTail(t) => write!(
                f,
                "torn tail: {} at offset {} (seq {}): {}; recovery would {}",
                t.file.display(),
                t.offset,
                t.seq,
                t.what,
                if t.whole_segment { "remove the segment (its header never made it to disk)" } else { "truncate it" }
            ),
            Problem::BadSnapshot { file, what } => write!(f, "bad snapshot: {}: {what}", file.display()),
            Problem::ForeignSnapshot { file, what } => {
                write!(f, "snapshot does not belong to this journal: {}: {what}; recovery would set it aside", file.display())
            }
        }
    }
}

/// Checks every record and snapshot in `dir` without changing anything,
/// including that every snapshot continues a record this journal holds.
/// Returns what was found and the problems, each with its exact place.
pub fn verify(dir: &Path) -> (Option<JournalEnd>, Vec<Problem>) {
    verify_with(dir, false)
}

/// [`verify`], and with `replay` also applies every record to an engine
/// from the start, so that each snapshot's state is compared with the
/// journal's at its command: a snapshot whose checksums hold but whose
/// state is not what its commands make (written so by a bug, or damaged
/// before its checksum was taken) is found, which the checks of its bytes
/// and its invariants cannot always do.
pub fn verify_with(dir: &Path, replay: bool) -> (Option<JournalEnd>, Vec<Problem>) {
    let mut problems = Vec::new();
    let snapshots = match read::snapshots(dir) {
        Ok(found) => found,
        Err(e) => {
            problems.push(Problem::BadSnapshot { file: dir.to_path_buf(), what: format!("cannot list: {e}") });
            Vec::new()
        }
    };
    // The records snapshots name, and their checksums in the journal.
    let mut wanted: std::collections::BTreeMap<u64, Option<u32>> = snapshots.iter().map(|(seq, _)| (*seq, None)).collect();
    wanted.insert(0, Some(0));
    // With `replay`: the state's hash at each snapshot's command.
    let mut replayed: std::collections::BTreeMap<u64, String> = std::collections::BTreeMap::new();
    let (mut engine, mut events) = (Engine::new(), Vec::new());
    let end = match read::scan_chained(dir, |seq, payload, crc| {
        let (command, _) = crate::format::split_payload(payload)?;
        if replay {
            events.clear();
            engine.apply(&command, &mut events);
        }
        if let Some(slot) = wanted.get_mut(&seq) {
            *slot = Some(crc);
            if replay {
                replayed.insert(seq, state_hash(&engine));
            }
        }
        Ok(())
    }) {
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
    for (_, path) in snapshots {
        let header = match load_snapshot(&path) {
            Ok((header, snapshot)) => {
                if let Some(expected) = replayed.get(&header.seq) {
                    let found = state_hash(&snapshot);
                    if found != *expected {
                        problems.push(Problem::BadSnapshot {
                            file: path.clone(),
                            what: format!(
                                "its state is not the journal's replayed to seq {} (state-sha256 {found}, the replay's {expected}); recovery would start from it: move it out of the directory",
                                header.seq
                            ),
                        });
                    }
                }
                header
            }
            Err(why @ SnapshotError::Unbound { .. }) => {
                problems.push(Problem::ForeignSnapshot { file: path, what: why.to_string() });
                continue;
            }
            Err(SnapshotError::Damaged(what)) => {
                problems.push(Problem::BadSnapshot { file: path, what });
                continue;
            }
        };
        let foreign = |what: String| Problem::ForeignSnapshot { file: path.clone(), what };
        match (wanted.get(&header.seq).copied().flatten(), &end) {
            (Some(crc), _) if crc == header.chain => {}
            (Some(crc), _) => problems.push(foreign(format!(
                "it continues record {} with checksum {:08x}, the journal's record {} has {crc:08x}",
                header.seq, header.chain, header.seq
            ))),
            (None, Some(end)) => {
                problems.push(foreign(format!("it is ahead of the journal: seq {}, the journal ends at seq {}", header.seq, end.last_seq)))
            }
            // The journal is damaged before the record: named above.
            (None, None) => {}
        }
    }
    (end, problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Snapshots every 100 commands, a reach of 1,000: whatever the newest,
    /// one with attachments between 1,000 and about 2,000 commands before
    /// it stays (once there is one), and at most the newest two plus two
    /// others are kept.
    #[test]
    fn retention_keeps_a_snapshot_with_attachments_a_reach_back() {
        let retention = Retention { newest: 2, reach: 1_000 };
        let mut kept: Vec<(u64, PathBuf)> = Vec::new();
        for newest in (100..=20_000u64).step_by(100) {
            kept.insert(0, (newest, PathBuf::from(format!("{newest}"))));
            let keep = retained(&kept, retention, |_| true);
            kept.retain(|(_, p)| keep.contains(p));
            assert!(kept.len() <= 4, "at {newest}: {kept:?}");
            if newest >= 1_100 {
                let anchor = kept.iter().map(|(s, _)| *s).filter(|s| *s <= newest - 1_000).max();
                let anchor = anchor.unwrap_or_else(|| panic!("at {newest}: none far enough back in {kept:?}"));
                assert!(newest - anchor <= 2_000 + 100, "at {newest}: the one to start from is {anchor}");
            }
        }
        // Those without attachments count only among the newest.
        let all: Vec<(u64, PathBuf)> = [900u64, 800, 500, 100].iter().map(|s| (*s, PathBuf::from(format!("{s}")))).collect();
        let keep = retained(&all, Retention { newest: 1, reach: 300 }, |p| p != Path::new("500"));
        assert_eq!(keep, vec![PathBuf::from("900"), PathBuf::from("100"), PathBuf::from("800")]);
        // Without a reach, the newest with attachments stays all the same.
        let keep = retained(&all, Retention { newest: 2, reach: 0 }, |p| p == Path::new("500"));
        assert_eq!(keep, vec![PathBuf::from("900"), PathBuf::from("800"), PathBuf::from("500")]);
    }

    /// A snapshot without the gateways' checkpoints (the shutdown's) does
    /// not replace a sound one at the same command with them (an
    /// operator's just before); one with them does, and so does any
    /// snapshot a damaged file of the same name.
    #[test]
    fn a_snapshot_without_checkpoints_keeps_one_with_them_at_the_same_command() {
        let dir = std::env::temp_dir().join(format!("crossbook-snapshot-same-seq-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let engine = Engine::new();
        let mut state = Vec::new();
        engine.encode_state(&mut state);
        let header = SnapshotHeader { seq: engine.seq(), chain: 7 };
        let retention = Retention { newest: 2, reach: 0 };
        let attachments_of = |path: &Path| decode_snapshot(&std::fs::read(path).expect("read")).expect("sound").attachments.to_vec();
        let path = write_snapshot_state(&dir, header, &state, b"checkpoints", retention).expect("written");
        write_snapshot_state(&dir, header, &state, &[], retention).expect("written");
        assert_eq!(attachments_of(&path), b"checkpoints");
        write_snapshot_state(&dir, header, &state, b"newer", retention).expect("written");
        assert_eq!(attachments_of(&path), b"newer");
        let mut damaged = std::fs::read(&path).expect("read");
        let last = damaged.len() - 1;
        damaged[last] ^= 1;
        std::fs::write(&path, damaged).expect("write");
        write_snapshot_state(&dir, header, &state, &[], retention).expect("written");
        assert!(attachments_of(&path).is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
