//! The journaled commands: `run --journal`, `recover`, `journal verify`,
//! `journal inspect`.

use crate::read_commands;
use anyhow::{Context, Result, bail};
use crossbook_engine::Event;
use crossbook_journal::{Journal, JournalConfig, recover as recover_dir, state_hash, write_snapshot};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

pub fn run(commands: &PathBuf, dir: &Path, config: JournalConfig, snapshot_every: u64, keep: usize) -> Result<()> {
    let commands = read_commands(commands)?;
    let _lock = crossbook_journal::lock_dir(dir)?;
    let recovered = recover_dir(dir).with_context(|| format!("recovering {}", dir.display()))?;
    for warning in &recovered.warnings {
        eprintln!("warning: {warning}");
    }
    let mut engine = recovered.engine;
    let start = engine.seq();
    if start as usize > commands.len() {
        eprintln!(
            "recovered seq {start}: the journal holds more commands than the file's {} (another file's journal?); nothing to do",
            commands.len()
        );
    } else if start > 0 && start as usize == commands.len() {
        eprintln!("recovered seq {start}: the journal already holds all {} commands of the file; nothing to do", commands.len());
    } else if start > 0 {
        eprintln!("recovered seq {start}; continuing with command {}", start + 1);
    }
    let mut journal = Journal::open(dir, config, &recovered.end).context("opening the journal")?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut events: Vec<Event> = Vec::new();
    let mut printed = journal.acked();
    let started = Instant::now();
    let todo = commands.iter().skip(start as usize);
    let count = todo.len();
    for command in todo {
        let seq = engine.seq() + 1;
        journal.append(seq, command)?;
        events.clear();
        engine.apply(command, &mut events);
        if snapshot_every > 0 && seq % snapshot_every == 0 {
            // A snapshot never gets ahead of the durable journal (in async
            // mode too: the journal syncs now), and names the record it
            // continues.
            journal.sync()?;
            let chain = journal.watch().chain_at(seq).context("the checksum of the last record written")?;
            // A snapshot is a shortcut for recovery, not history: one that
            // cannot be written (a full disk) is said, and the run goes on
            // with the older ones (docs/journal.md).
            if let Err(e) = write_snapshot(dir, &engine, chain, keep) {
                eprintln!("warning: snapshot at seq {seq} failed: {e}; the older snapshots stay, the next one is tried when due");
            }
        }
        let acked = journal.acked();
        if acked > printed {
            writeln!(out, "acked {acked}")?;
            out.flush()?;
            printed = acked;
        }
    }
    let acked = journal.flush()?;
    if acked > printed {
        writeln!(out, "acked {acked}")?;
        out.flush()?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let stats = journal.close()?;
    eprintln!("seq {}", engine.seq());
    eprintln!("state-sha256 {}", state_hash(&engine));
    eprintln!(
        "commands {count} in {elapsed:.3} s ({:.0}/s); writes {} of {:.1} commands each (largest {}); fsyncs {} averaging {:.1} us (p99 {} us, max {} us)",
        count as f64 / elapsed.max(1e-9),
        stats.writes,
        stats.average_group(),
        stats.largest_group,
        stats.syncs,
        stats.average_sync_micros(),
        stats.sync_micros.value_at_quantile(0.99),
        stats.sync_micros.max()
    );
    Ok(())
}

/// A journal directory named on the command line must be there: a
/// mistyped path is an error, never a new, empty journal.
fn existing(dir: &Path) -> Result<()> {
    if !dir.exists() {
        bail!("{} does not exist", dir.display());
    }
    if !dir.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    Ok(())
}

pub fn recover(dir: &Path) -> Result<()> {
    existing(dir)?;
    // Recovery may cut a torn tail or set a snapshot aside: never under a
    // running server.
    let _lock = crossbook_journal::lock_dir(dir)?;
    let started = Instant::now();
    let recovered = recover_dir(dir).with_context(|| format!("recovering {}", dir.display()))?;
    let elapsed = started.elapsed().as_secs_f64();
    for warning in &recovered.warnings {
        eprintln!("warning: {warning}");
    }
    println!("seq {}", recovered.engine.seq());
    println!("state-sha256 {}", state_hash(&recovered.engine));
    let from = recovered.snapshot.map_or("the start of the journal".to_string(), |s| format!("snapshot {s}"));
    eprintln!(
        "from {from}, replayed {} commands in {elapsed:.3} s ({:.0}/s)",
        recovered.replayed,
        recovered.replayed as f64 / elapsed.max(1e-9)
    );
    Ok(())
}

/// `crossbook journal snapshot DIR`: recover, then write a snapshot.
pub fn snapshot(dir: &Path, keep: usize) -> Result<()> {
    existing(dir)?;
    let _lock = crossbook_journal::lock_dir(dir)?;
    let recovered = crossbook_journal::recover(dir)?;
    for warning in &recovered.warnings {
        eprintln!("warning: {warning}");
    }
    // The records recovery read may be only in the page cache (a process
    // that crashed in async mode): opening the journal syncs them, so the
    // snapshot is never ahead of what a power cut leaves.
    Journal::open(dir, JournalConfig::default(), &recovered.end).context("opening the journal")?.close().context("syncing the journal")?;
    let path = crossbook_journal::write_snapshot(dir, &recovered.engine, recovered.end.last_crc, keep)?;
    println!("snapshot {} seq {}", path.display(), recovered.engine.seq());
    eprintln!("state-sha256 {}", crossbook_journal::state_hash(&recovered.engine));
    Ok(())
}

pub fn verify(dir: &Path, replay: bool) -> Result<()> {
    existing(dir)?;
    let (end, problems) = crossbook_journal::verify_with(dir, replay);
    if let Some(end) = &end {
        // A last segment whose header a crash cut off holds no record, and
        // recovery removes it (its torn tail, below): not counted.
        let removed = end.torn.as_ref().is_some_and(|torn| torn.whole_segment);
        println!("{} records in {} segments, last seq {}", end.records, end.segments - usize::from(removed), end.last_seq);
    }
    for problem in &problems {
        println!("{problem}");
    }
    let fatal = problems.iter().filter(|p| !matches!(p, crossbook_journal::Problem::TornTail(_))).count();
    if fatal > 0 {
        bail!("{fatal} problem(s) found");
    }
    println!("ok");
    Ok(())
}

pub fn inspect(dir: &Path) -> Result<()> {
    existing(dir)?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut line = String::new();
    let mut failed: Option<std::io::Error> = None;
    let end = crossbook_journal::scan(dir, |seq, payload| {
        let (command, annex) = crossbook_journal::format::split_payload(payload)?;
        line.clear();
        crossbook_text::write_command(&mut line, &command);
        if let Some(annex) = annex {
            // A gateway's annex (docs/journal.md), as a comment.
            line.push_str(&format!("\n# annex {}", annex.iter().map(|b| format!("{b:02x}")).collect::<String>()));
        }
        if let Err(e) = writeln!(out, "{line}") {
            failed.get_or_insert(e);
        }
        let _ = seq;
        if failed.is_some() {
            return Err("standard output closed".into());
        }
        Ok(())
    });
    let flushed = out.flush();
    if let Some(e) = failed.or(flushed.err()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            return Ok(());
        }
        return Err(e.into());
    }
    let end = end?;
    if let Some(torn) = end.torn {
        eprintln!("warning: torn tail at {} offset {} (seq {}): {}", torn.file.display(), torn.offset, torn.seq, torn.what);
    }
    if end.segments == 0 {
        bail!("{} holds no journal (no segment-*.xbj file)", dir.display());
    }
    Ok(())
}
