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
            // A snapshot never gets ahead of the durable journal (in async
            // mode too: the journal syncs now), and names the record it
            // continues.
            journal.sync()?;
            let chain = journal.watch().chain_at(seq).context("the checksum of the last record written")?;
            write_snapshot(dir, &engine, chain, keep)?;
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
        "commands {count} in {elapsed:.3} s ({:.0}/s); fsyncs {} averaging {:.1} us (p99 {} us, max {} us), {:.1} commands per group commit (largest {})",
        count as f64 / elapsed.max(1e-9),
        stats.syncs,
        stats.average_sync_micros(),
        stats.sync_micros.value_at_quantile(0.99),
        stats.sync_micros.max(),
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
    // The records recovery read may be only in the page cache (a process
    // that crashed in async mode): opening the journal syncs them, so the
    // snapshot is never ahead of what a power cut leaves.
    Journal::open(dir, JournalConfig::default(), &recovered.end).context("opening the journal")?.close().context("syncing the journal")?;
    let path = crossbook_journal::write_snapshot(dir, &recovered.engine, recovered.end.last_crc, keep)?;
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
pub fn bench(commands: &[crossbook_engine::Command], dir: &Path) -> Result<JournalFigures> {
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
    let mut figures = JournalFigures { rounds: ROUNDS, in_memory_commands_per_s: memory, ..JournalFigures::default() };
    for (index, (name, _)) in modes.iter().enumerate() {
        let mut rates: Vec<f64> = journaled[index].iter().map(|(r, _)| *r).collect();
        let rate = median(&mut rates);
        let stage = (1e9 / rate - 1e9 / memory).max(0.0);
        if *name == "async" {
            figures.async_commands_per_s = rate;
            figures.async_ns_per_command = stage;
        } else {
            let syncs: u64 = journaled[index].iter().map(|(_, s)| s.syncs).sum();
            let records: u64 = journaled[index].iter().map(|(_, s)| s.records).sum();
            let nanos: u64 = journaled[index].iter().map(|(_, s)| s.sync_nanos).sum();
            figures.sync_commands_per_s = rate;
            figures.sync_ns_per_command = stage;
            if syncs > 0 {
                figures.fsync_us = nanos as f64 / syncs as f64 / 1000.0;
                figures.commands_per_group_commit = records as f64 / syncs as f64;
            }
        }
    }
    figures.recovery_replay_commands_per_s = median(&mut replay);
    Ok(figures)
}

/// What `crossbook bench --journal DIR` measured: medians of `rounds`
/// rounds, each running the commands in memory, through the journal in
/// `async` and `sync` mode, and replaying the sync journal in recovery.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, Default, PartialEq)]
pub struct JournalFigures {
    pub rounds: usize,
    pub in_memory_commands_per_s: f64,
    pub async_commands_per_s: f64,
    pub sync_commands_per_s: f64,
    pub recovery_replay_commands_per_s: f64,
    /// Average time of one group commit's fdatasync, and the commands it
    /// covered.
    pub fsync_us: f64,
    pub commands_per_group_commit: f64,
    /// The journal's stage: journaled minus in-memory, per command.
    pub async_ns_per_command: f64,
    pub sync_ns_per_command: f64,
}

impl JournalFigures {
    pub fn print(&self) {
        let memory = self.in_memory_commands_per_s;
        let share = |rate: f64| 100.0 * rate / memory;
        println!("journal_rounds {} (medians)", self.rounds);
        println!("in_memory commands_per_s {memory:.0}");
        println!("journal_async commands_per_s {:.0} ({:.0}% of in-memory)", self.async_commands_per_s, share(self.async_commands_per_s));
        println!(
            "journal_sync commands_per_s {:.0} ({:.0}% of in-memory) fsync_us {:.1} commands_per_group_commit {:.1}",
            self.sync_commands_per_s,
            share(self.sync_commands_per_s),
            self.fsync_us,
            self.commands_per_group_commit
        );
        println!("recovery_replay commands_per_s {:.0} ({:.0}% of in-memory)", self.recovery_replay_commands_per_s, share(self.recovery_replay_commands_per_s));
        println!("stages_ns_per_command journal_async {:.1} journal_sync {:.1} (journaled minus in-memory, medians)", self.async_ns_per_command, self.sync_ns_per_command);
    }
}
