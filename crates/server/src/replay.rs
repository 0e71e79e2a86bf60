//! Start-up: the journaled commands handed to the gateways again, so that
//! they rebuild what they had sent before the restart (reports are a
//! function of the journal: replaying it through a [`ReportBuilder`]
//! gives every report exactly as it was given live). Not the whole
//! journal: the gateways start from their checkpoints in a snapshot about
//! `history_commands` before its end (`checkpoint.rs`), so a restart
//! costs the same however long the journal is.
//!
//! One thread reads, checks and decodes the journal while this one applies
//! and hands each command to the sinks ([`ReportSink::recovered`]).

use crate::{ServeError, checkpoint};
use crate::sink::{Durable, ReportSink};
use crossbook_engine::{Command, Engine};
use crossbook_journal::Corruption;
use crossbook_protocol::reports::ReportBuilder;
use std::path::{Path, PathBuf};
use std::sync::mpsc::sync_channel;
use std::thread;

/// Commands handed from the journal reader to the applying thread at a
/// time.
const BATCH: usize = 4096;

type Decoded = (u64, u64, Command, Option<Vec<u8>>);

/// How the gateways were brought up to the journal's end.
pub(crate) struct Rebuilt {
    /// The snapshot whose gateway checkpoints they started from (`None`:
    /// the journal's first command).
    pub(crate) from: Option<u64>,
    /// Commands handed over after it.
    pub(crate) commands: u64,
}

/// Brings every sink up to `through` (the journal's end): from the newest
/// snapshot with every sink's checkpoint that is at least
/// `history_commands` commands before it (and at or before `not_after`,
/// where the FIX stores' messages end), or else from the journal's first
/// command; the commands after it are re-applied and handed over with
/// their reports (`ReportSink::recovered`). Snapshots that cannot serve
/// (one whose checkpoints do not all restore included: every gateway is
/// reset then) are passed over with a warning.
pub(crate) fn rebuild(dir: &Path, through: u64, history_commands: u64, not_after: u64, sinks: &mut [&mut dyn ReportSink]) -> Result<Rebuilt, ServeError> {
    let horizon = through.saturating_sub(history_commands).min(not_after);
    let candidates = if horizon == 0 { Vec::new() } else { crossbook_journal::read::snapshots(dir).map_err(ServeError::io(format!("listing {}", dir.display())))? };
    for (seq, path) in candidates.into_iter().filter(|(seq, _)| *seq <= horizon) {
        let Some(engine) = usable(dir, seq, &path, sinks)? else { continue };
        let commands = replay_after(dir, engine, through, sinks)?;
        return Ok(Rebuilt { from: Some(seq), commands });
    }
    let commands = replay_after(dir, Engine::new(), through, sinks)?;
    Ok(Rebuilt { from: None, commands })
}

/// The engine of the snapshot at `path`, with every sink restored from its
/// checkpoint, if the snapshot belongs to the journal and has one for each
/// (`None`, with a warning, if not; nothing is restored then).
fn usable(dir: &Path, seq: u64, path: &Path, sinks: &mut [&mut dyn ReportSink]) -> Result<Option<Engine>, ServeError> {
    let pass = |why: String| {
        crate::log(&format!("warning: report histories not rebuilt from {}: {why}; trying an older one", path.display()));
        Ok(None)
    };
    if !crossbook_journal::read::snapshot_has_attachments(path).unwrap_or(false) {
        // A shutdown snapshot, or one written before checkpoints: no
        // warning, it is not meant for this (and not read whole).
        return Ok(None);
    }
    // A damaged snapshot, or one of another history, is set aside as
    // recovery sets aside those it meets (an older one than recovery read
    // is first read here): no later start pays for it again, and snapshot
    // pruning does not count it.
    let set_aside = |why: String| {
        let why = match crossbook_journal::set_aside(dir, path) {
            Ok(target) => format!("{why}; set aside as {}", target.display()),
            Err(e) => format!("{why}; could not set it aside: {e}"),
        };
        pass(why)
    };
    let (header, engine, attachments) = match crossbook_journal::load_snapshot_with_attachments(path) {
        Ok(loaded) => loaded,
        Err(e @ crossbook_journal::SnapshotError::Damaged(_)) => return set_aside(e.to_string()),
        Err(e) => return pass(e.to_string()),
    };
    match chain_at(dir, seq)? {
        Some(chain) if chain == header.chain => {}
        Some(_) => return set_aside(format!("it does not continue the journal's record {seq}")),
        None => return pass(format!("it does not continue the journal's record {seq}")),
    }
    let sections = match checkpoint::decode(&attachments) {
        Ok(sections) => sections,
        Err(e) => return pass(format!("its gateway checkpoints are unreadable ({e})")),
    };
    let mut found = Vec::with_capacity(sinks.len());
    for sink in sinks.iter() {
        match sections.iter().find(|(name, _)| name == sink.name()) {
            Some((_, state)) => found.push(*state),
            None => return pass(format!("it has no checkpoint of the {} gateway", sink.name())),
        }
    }
    for (index, state) in found.into_iter().enumerate() {
        if let Err(why) = sinks[index].restore(state) {
            // A checkpoint this build cannot take back (another
            // configuration, another format): as if the snapshot had none.
            let gateway = sinks[index].name().to_owned();
            for sink in sinks.iter_mut() {
                sink.reset();
            }
            return pass(format!("the {gateway} gateway's checkpoint does not restore ({why})"));
        }
    }
    Ok(Some(engine))
}

/// The chained checksum of the journal's record `seq`, if it has one.
fn chain_at(dir: &Path, seq: u64) -> Result<Option<u32>, ServeError> {
    const FOUND: &str = "found";
    let mut chain = None;
    let scanned = crossbook_journal::scan_chained_from(dir, seq, |at, _, crc| {
        if at == seq {
            chain = Some(crc);
            return Err(FOUND.into());
        }
        Ok(())
    });
    match scanned {
        Err(corruption) if corruption.what != FOUND => Err(ServeError::History(corruption)),
        _ => Ok(chain),
    }
}

/// Re-applies the journal's commands after `engine`'s on it, through
/// `through` (the journal's end), handing each with its reports to every
/// sink in order; returns how many. One thread reads, checks and decodes
/// the journal (from the segment holding the first command needed) while
/// this one applies.
fn replay_after(dir: &Path, mut engine: Engine, through: u64, sinks: &mut [&mut dyn ReportSink]) -> Result<u64, ServeError> {
    let from = engine.seq();
    let (sender, receiver) = sync_channel::<Vec<Decoded>>(4);
    let reader_dir: PathBuf = dir.to_path_buf();
    let reader = thread::Builder::new()
        .name("history-reader".into())
        .spawn(move || -> Result<(), Corruption> {
            let mut batch = Vec::with_capacity(BATCH);
            let result = crossbook_journal::scan_timed_from(&reader_dir, from + 1, |seq, time_ms, payload, _| {
                if seq <= from || seq > through {
                    return Ok(());
                }
                let (command, annex) = crossbook_journal::format::split_payload(payload)?;
                batch.push((seq, time_ms, command, annex.map(<[u8]>::to_vec)));
                if batch.len() == BATCH {
                    let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
                    sender.send(full).map_err(|_| "the applying thread stopped".to_string())?;
                }
                Ok(())
            });
            if result.is_ok() && !batch.is_empty() {
                let _ = sender.send(batch);
            }
            result.map(|_| ())
        })
        .map_err(ServeError::io("starting the history reader thread"))?;
    let mut builder = ReportBuilder::from_engine(&engine);
    let mut events = Vec::new();
    let mut reports = Vec::new();
    let mut commands = 0u64;
    for batch in receiver {
        for (seq, time_ms, command, annex) in batch {
            events.clear();
            reports.clear();
            engine.apply(&command, &mut events);
            builder.reports(&command, &events, &mut reports);
            let durable = Durable { seq, time_ms, command: &command, annex: annex.as_deref(), reports: &reports, events: &events };
            for sink in sinks.iter_mut() {
                sink.recovered(&durable);
            }
            commands += 1;
        }
    }
    match reader.join() {
        Ok(result) => result.map_err(ServeError::History)?,
        Err(_) => return Err(ServeError::Io { what: "the history reader thread".into(), source: std::io::Error::other("panicked") }),
    }
    if engine.seq() != through {
        return Err(ServeError::History(Corruption {
            file: dir.to_path_buf(),
            offset: 0,
            seq: engine.seq() + 1,
            what: format!("the journal ends at {} but recovery reached {through}", engine.seq()),
        }));
    }
    Ok(commands)
}
