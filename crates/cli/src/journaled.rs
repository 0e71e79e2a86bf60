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
    let recovered = recover_dir(dir).with_context(|| format!("recovering {}", dir.display()))?;
    for warning in &recovered.warnings {
        eprintln!("warning: {warning}");
    }
    let mut engine = recovered.engine;
    let start = engine.seq();
    if start > 0 {
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
            // A snapshot never gets ahead of the durable journal.
            journal.flush()?;
            write_snapshot(dir, &engine, keep)?;
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
        "commands {count} in {elapsed:.3} s ({:.0}/s); fsyncs {} averaging {:.1} us, {:.1} commands per group commit (largest {})",
        count as f64 / elapsed.max(1e-9),
        stats.syncs,
        stats.average_sync_micros(),
        stats.average_group(),
        stats.largest_group
    );
    Ok(())
}

pub fn recover(dir: &Path) -> Result<()> {
    if !dir.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
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
    let recovered = crossbook_journal::recover(dir)?;
    for warning in &recovered.warnings {
        eprintln!("warning: {warning}");
    }
    let path = crossbook_journal::write_snapshot(dir, &recovered.engine, keep)?;
    println!("snapshot {} seq {}", path.display(), recovered.engine.seq());
    eprintln!("state-sha256 {}", crossbook_journal::state_hash(&recovered.engine));
    Ok(())
}

pub fn verify(dir: &Path) -> Result<()> {
    if !dir.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    let (end, problems) = crossbook_journal::verify(dir);
    if let Some(end) = &end {
        println!("{} records in {} segments, last seq {}", end.records, end.segments, end.last_seq);
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
    Ok(())
}

/// The journal figures of `crossbook bench --journal DIR`: in rounds, the
/// commands applied in memory, journaled in async mode, journaled in sync
/// mode, and recovered from the sync journal; medians of each, so that the
/// ratios compare figures taken side by side.
pub fn bench(commands: &[crossbook_engine::Command], dir: &Path, _in_memory_per_s: f64) -> Result<()> {
    use crossbook_journal::{CommitStats, Durability};
    use std::time::Duration;
    const ROUNDS: usize = 5;
    let mut memory = Vec::new();
    let mut journaled: [Vec<(f64, CommitStats)>; 2] = [Vec::new(), Vec::new()];
    let mut replay = Vec::new();
    let modes = [("async", Durability::Async { interval: Duration::from_millis(10) }), ("sync", Durability::Sync)];
    for _ in 0..ROUNDS {
        let _ = std::fs::remove_dir_all(dir);
        let mut engine = crossbook_engine::Engine::new();
        let mut events: Vec<Event> = Vec::with_capacity(1 << 12);
        let started = Instant::now();
        for command in commands {
            events.clear();
            engine.apply(command, &mut events);
        }
        memory.push(commands.len() as f64 / started.elapsed().as_secs_f64());
        for (index, (name, durability)) in modes.iter().enumerate() {
            let path = dir.join(name);
            let recovered = recover_dir(&path)?;
            let mut engine = recovered.engine;
            let mut journal = Journal::open(&path, JournalConfig { durability: *durability, ..JournalConfig::default() }, &recovered.end)?;
            let started = Instant::now();
            for command in commands {
                let seq = engine.seq() + 1;
                journal.append(seq, command)?;
                events.clear();
                engine.apply(command, &mut events);
            }
            journal.flush()?;
            let elapsed = started.elapsed().as_secs_f64();
            let stats = journal.close()?;
            journaled[index].push((commands.len() as f64 / elapsed, stats));
        }
        let started = Instant::now();
        let recovered = recover_dir(&dir.join("sync"))?;
        replay.push(recovered.replayed as f64 / started.elapsed().as_secs_f64());
    }
    let _ = std::fs::remove_dir_all(dir);
    let median = |values: &mut Vec<f64>| {
        values.sort_by(|a, b| a.total_cmp(b));
        values[values.len() / 2]
    };
    let memory = median(&mut memory);
    println!("journal_rounds {ROUNDS} (medians)");
    println!("in_memory commands_per_s {memory:.0}");
    for (index, (name, _)) in modes.iter().enumerate() {
        let mut rates: Vec<f64> = journaled[index].iter().map(|(r, _)| *r).collect();
        let rate = median(&mut rates);
        let syncs: u64 = journaled[index].iter().map(|(_, s)| s.syncs).sum();
        let records: u64 = journaled[index].iter().map(|(_, s)| s.records).sum();
        let nanos: u64 = journaled[index].iter().map(|(_, s)| s.sync_nanos).sum();
        let mut line = format!("journal_{name} commands_per_s {rate:.0} ({:.0}% of in-memory)", 100.0 * rate / memory);
        if *name == "sync" && syncs > 0 {
            line.push_str(&format!(
                " fsyncs {syncs} fsync_us {:.1} commands_per_group_commit {:.1}",
                nanos as f64 / syncs as f64 / 1000.0,
                records as f64 / syncs as f64
            ));
        }
        println!("{line}");
    }
    let replay = median(&mut replay);
    println!("recovery_replay commands_per_s {replay:.0} ({:.0}% of in-memory)", 100.0 * replay / memory);
    let mut extra = Vec::new();
    for (index, (name, _)) in modes.iter().enumerate() {
        let mut rates: Vec<f64> = journaled[index].iter().map(|(r, _)| *r).collect();
        let rate = median(&mut rates);
        extra.push(format!("journal_{name} {:.1}", (1e9 / rate - 1e9 / memory).max(0.0)));
    }
    println!("stages_ns_per_command {} (journaled minus in-memory, medians)", extra.join(" "));
    Ok(())
}
