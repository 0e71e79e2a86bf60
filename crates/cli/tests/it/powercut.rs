//! Power cuts: a process runs under a test-only `LD_PRELOAD` shim
//! (`tests/powercut/shim.c`) that logs every write, allocation, truncation,
//! rename and sync it makes; after `kill -9`, [`power_cut`] takes back
//! whatever a real power failure could: every byte not covered by a
//! completed `fsync`/`fdatasync` (all of it, or, for a torn write, all but a
//! prefix) and every directory entry made since its directory's last
//! completed sync. Then the data directory must recover to exactly the
//! state of a fresh replay of the journal's commands, no snapshot may be
//! found that does not belong, and in sync mode nothing acknowledged may
//! be missing, over several lifetimes per directory (each lifetime's
//! commands differ from the last's, so a stale snapshot would show).

use crossbook_engine::{Command, Engine};
use crossbook_journal::{recover, scan, state_hash};
use crossbook_workload::{Rng, Workload, generate};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command as Process, Stdio};
use std::sync::OnceLock;

/// The shim, compiled once per test run with the system's C compiler.
pub(crate) fn shim() -> &'static Path {
    static SHIM: OnceLock<PathBuf> = OnceLock::new();
    SHIM.get_or_init(|| {
        let source = crate::support::repo_root().join("crates/cli/tests/powercut/shim.c");
        // Beside the build (`CARGO_TARGET_TMPDIR`), not left in /tmp.
        let output = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("crossbook-powercut-shim-{}.so", std::process::id()));
        let status = Process::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-Wall", "-o"])
            .arg(&output)
            .arg(&source)
            .arg("-ldl")
            .status()
            .expect("cc (build-essential, which .ci/run installs) compiles the power-cut shim");
        assert!(status.success(), "compiling {}", source.display());
        output
    })
}

/// The environment that puts a child process under the shim.
pub(crate) fn shim_env(log: &Path) -> [(&'static str, PathBuf); 2] {
    [("LD_PRELOAD", shim().to_path_buf()), ("CROSSBOOK_POWERCUT_LOG", log.to_path_buf())]
}

type FileKey = (u64, u64);

#[derive(Debug)]
enum Op {
    Open { key: FileKey, size: u64, path: PathBuf },
    Create { path: PathBuf },
    Write { key: FileKey, offset: u64, length: u64 },
    Allocate { key: FileKey, offset: u64, length: u64 },
    Truncate { key: FileKey, length: u64 },
    SyncBegin { key: FileKey, thread: u64 },
    SyncEnd { key: FileKey, thread: u64 },
    DirBegin { path: PathBuf, thread: u64 },
    DirEnd { path: PathBuf, thread: u64 },
    Rename { from: PathBuf, to: PathBuf },
    Unlink { path: PathBuf },
}

fn parse(line: &str) -> Option<Op> {
    let fields: Vec<&str> = line.split('\t').collect();
    let number = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    let key = || Some((number(1)?, number(2)?));
    Some(match *fields.first()? {
        "O" => Op::Open { key: key()?, size: number(3)?, path: PathBuf::from(fields.get(4)?) },
        "C" => Op::Create { path: PathBuf::from(fields.get(1)?) },
        "W" => Op::Write { key: key()?, offset: number(3)?, length: number(4)? },
        "A" => Op::Allocate { key: key()?, offset: number(3)?, length: number(4)? },
        "T" => Op::Truncate { key: key()?, length: number(3)? },
        "B" => Op::SyncBegin { key: key()?, thread: number(3)? },
        "E" => Op::SyncEnd { key: key()?, thread: number(3)? },
        "DB" => Op::DirBegin { thread: number(1)?, path: PathBuf::from(fields.get(2)?) },
        "DE" => Op::DirEnd { thread: number(1)?, path: PathBuf::from(fields.get(2)?) },
        "R" => Op::Rename { from: PathBuf::from(fields.get(1)?), to: PathBuf::from(fields.get(2)?) },
        "U" => Op::Unlink { path: PathBuf::from(fields.get(1)?) },
        _ => return None,
    })
}

/// What [`power_cut`] took back.
#[derive(Debug, Default)]
pub(crate) struct Cut {
    pub(crate) bytes_lost: u64,
    pub(crate) files_cut: usize,
    pub(crate) entries_undone: usize,
}

/// Simulates a power failure at the moment the logged process died, on
/// the files under `root`. Bytes written (or space allocated, or a file
/// truncated) after the last completed sync of their file that began
/// after them are lost; with `torn`, a random prefix of the lost writes of
/// each file survives instead (the last write torn) and each lost
/// directory entry survives with even odds. Files created and renames made
/// after their directory's last completed sync are undone. (Unlinks are
/// taken as durable at once: the shim keeps no copy to bring back.)
pub(crate) fn power_cut(log: &Path, root: &Path, mut torn: Option<&mut Rng>) -> Cut {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let ops: Vec<Op> = text.lines().filter_map(parse).collect();
    // The latest sync of each file (and directory) known to have completed,
    // by the position of its start: what was logged before that start is
    // covered. An end is matched with the start by the same thread (a
    // thread runs one sync at a time; a process killed mid-sync leaves a
    // start with no end).
    let mut open_syncs: HashMap<(FileKey, u64), usize> = HashMap::new();
    let mut covered: HashMap<FileKey, usize> = HashMap::new();
    let mut open_dir_syncs: HashMap<(PathBuf, u64), usize> = HashMap::new();
    let mut dir_covered: HashMap<PathBuf, usize> = HashMap::new();
    let mut paths: HashMap<FileKey, PathBuf> = HashMap::new();
    let mut first_size: HashMap<FileKey, u64> = HashMap::new();
    let mut data: HashMap<FileKey, Vec<(usize, &Op)>> = HashMap::new();
    let mut entries: Vec<(usize, &Op)> = Vec::new();
    for (at, op) in ops.iter().enumerate() {
        match op {
            Op::Open { key, size, path } => {
                first_size.entry(*key).or_insert(*size);
                paths.insert(*key, path.clone());
            }
            Op::Write { key, .. } | Op::Allocate { key, .. } | Op::Truncate { key, .. } => data.entry(*key).or_default().push((at, op)),
            Op::SyncBegin { key, thread } => {
                open_syncs.insert((*key, *thread), at);
            }
            Op::SyncEnd { key, thread } => {
                if let Some(begin) = open_syncs.remove(&(*key, *thread)) {
                    let slot = covered.entry(*key).or_insert(0);
                    *slot = (*slot).max(begin);
                }
            }
            Op::DirBegin { path, thread } => {
                open_dir_syncs.insert((path.clone(), *thread), at);
            }
            Op::DirEnd { path, thread } => {
                if let Some(begin) = open_dir_syncs.remove(&(path.clone(), *thread)) {
                    let slot = dir_covered.entry(path.clone()).or_insert(0);
                    *slot = (*slot).max(begin);
                }
            }
            Op::Rename { from, to } => {
                for path in paths.values_mut() {
                    if path == from {
                        *path = to.clone();
                    }
                }
                entries.push((at, op));
            }
            Op::Create { .. } => entries.push((at, op)),
            Op::Unlink { path } => paths.retain(|_, p| p != path),
        }
    }
    let mut cut = Cut::default();
    // File contents first, at the paths the files have now.
    for (key, ops) in &data {
        let Some(path) = paths.get(key) else { continue };
        if !path.starts_with(root) || !path.exists() {
            continue;
        }
        let durable_before = covered.get(key).copied().unwrap_or(0);
        let lost: Vec<&(usize, &Op)> = ops.iter().filter(|(at, _)| *at >= durable_before).collect();
        if lost.is_empty() {
            continue;
        }
        // With a torn cut, the first `keep` lost operations survive whole
        // and the next one in part.
        let (keep, partial) = match torn.as_deref_mut() {
            Some(rng) => (rng.below(lost.len() as u64 + 1) as usize, rng.below(1 << 16)),
            None => (0, 0),
        };
        let mut size = first_size.get(key).copied().unwrap_or(0);
        let mut zero: Vec<(u64, u64)> = Vec::new();
        let mut lost_index = 0usize;
        for (at, op) in ops {
            let survives = if *at < durable_before {
                Some(u64::MAX)
            } else {
                let index = lost_index;
                lost_index += 1;
                match index.cmp(&keep) {
                    std::cmp::Ordering::Less => Some(u64::MAX),
                    std::cmp::Ordering::Equal if torn.is_some() => Some(partial),
                    _ => None,
                }
            };
            match (op, survives) {
                (Op::Write { offset, length, .. }, Some(fraction)) => {
                    let kept = if fraction == u64::MAX { *length } else { length * fraction / (1 << 16) };
                    if kept < *length {
                        zero.push((offset + kept, length - kept));
                    }
                    size = size.max(offset + kept);
                }
                (Op::Write { offset, length, .. }, None) => zero.push((*offset, *length)),
                (Op::Allocate { offset, length, .. }, Some(_)) => size = size.max(offset + length),
                (Op::Truncate { length, .. }, Some(_)) => size = *length,
                _ => {}
            }
        }
        let mut file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        let current = file.metadata().unwrap().len();
        // The shim logs a write once it has completed: a process killed in
        // between leaves one write the log does not know of, after every
        // logged one. If the last logged write is lost, that one is too
        // (no sync began after it): everything past the logged writes goes.
        let last_write = ops.iter().rev().find(|(_, op)| matches!(op, Op::Write { .. }));
        if let Some((at, _)) = last_write
            && *at >= durable_before
        {
            let logged_end = ops.iter().filter_map(|(_, op)| if let Op::Write { offset, length, .. } = op { Some(offset + length) } else { None }).max().unwrap_or(0);
            if current > logged_end {
                zero.push((logged_end, current - logged_end));
            }
        }
        for (offset, length) in zero {
            let end = (offset + length).min(size).min(current);
            if end > offset {
                file.seek(SeekFrom::Start(offset)).unwrap();
                file.write_all(&vec![0u8; (end - offset) as usize]).unwrap();
                cut.bytes_lost += end - offset;
            }
        }
        cut.bytes_lost += current.saturating_sub(size);
        file.set_len(size).unwrap();
        cut.files_cut += 1;
    }
    // Then the directory entries not yet durable, newest first.
    for (at, op) in entries.iter().rev() {
        let (path, parent) = match op {
            Op::Create { path } | Op::Rename { to: path, .. } => (path, path.parent().unwrap_or(Path::new("/"))),
            _ => continue,
        };
        if !path.starts_with(root) || dir_covered.get(parent).is_some_and(|d| d > at) {
            continue;
        }
        if let Some(rng) = torn.as_deref_mut()
            && rng.below(2) == 0
        {
            continue;
        }
        let undone = match op {
            Op::Create { path } => std::fs::remove_file(path).is_ok(),
            Op::Rename { from, to } => std::fs::rename(to, from).is_ok(),
            _ => false,
        };
        cut.entries_undone += usize::from(undone);
    }
    cut
}

/// The sequence number and state hash of a fresh in-memory replay of the
/// commands the journal in `dir` holds (read only; snapshots ignored).
pub(crate) fn journal_replay(dir: &Path) -> (u64, String) {
    let mut engine = Engine::new();
    let mut events = Vec::new();
    let end = scan(dir, |_, payload| {
        let (command, _) = crossbook_journal::format::split_payload(payload)?;
        events.clear();
        engine.apply(&command, &mut events);
        Ok(())
    })
    .unwrap_or_else(|e| panic!("the journal in {} is corrupt after a power cut: {e}", dir.display()));
    assert_eq!(end.last_seq, engine.seq());
    (engine.seq(), state_hash(&engine))
}

fn commands_file(dir: &Path, name: &str, commands: &[Command]) -> PathBuf {
    let file = dir.join(name);
    std::fs::write(&file, crate::support::commands_text(commands)).unwrap();
    file
}

/// One lifetime of `crossbook run --journal` under the shim, killed with
/// SIGKILL once its acknowledgements pass `kill_at` (or run to its end);
/// returns the highest sequence number it acknowledged.
fn lifetime(dir: &Path, commands: &Path, durability: &str, snapshot_every: u64, log: &Path, kill_at: Option<u64>) -> u64 {
    let mut child = Process::new(env!("CARGO_BIN_EXE_crossbook"))
        .args(["run", "--commands", commands.to_str().unwrap(), "--journal", dir.to_str().unwrap()])
        .args(["--durability", durability, "--snapshot-every", &snapshot_every.to_string()])
        .args(["--segment-bytes", "300000", "--keep-snapshots", "3"])
        .envs(shim_env(log))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut acked = 0u64;
    let stdout = child.stdout.take().unwrap();
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        if let Some(n) = line.strip_prefix("acked ").and_then(|n| n.parse::<u64>().ok()) {
            acked = n;
        }
        if kill_at.is_some_and(|at| acked >= at) {
            let _ = child.kill();
            break;
        }
    }
    let _ = child.wait();
    acked
}

/// Commands per lifetime: enough that a kill lands while the run is busy.
const COMMANDS: usize = 200_000;

/// Many power cuts at random points of `crossbook run --journal`, with
/// snapshots every few thousand commands, in both durability modes, two
/// and three lifetimes per directory, each lifetime journaling different
/// commands after what survived of the last.
#[test]
fn power_cuts_recover_the_journal_state_and_never_a_stale_snapshot() {
    let work = crate::support::TempDir::new("powercut");
    let mut rng = Rng::new(0x9047_c0de);
    let trials = crate::support::seeds(8).len() as u64;
    let mut stale_candidates = 0u64;
    let mut acknowledged_lost_async = 0u64;
    for trial in 0..trials {
        for durability in ["sync", "async"] {
            let lifetimes = 2 + (trial % 2);
            let dir = work.0.join(format!("journal-{trial}-{durability}"));
            std::fs::create_dir_all(&dir).unwrap();
            for life in 0..lifetimes {
                let seed = 100 * trial + 10 * life + u64::from(durability == "async");
                let commands = generate(Workload::Mixed, seed, COMMANDS);
                let file = commands_file(&work.0, &format!("commands-{trial}-{durability}-{life}.txt"), &commands);
                let (before, _) = journal_replay(&dir);
                let kill_at = (life + 1 < lifetimes || rng.below(3) > 0).then(|| before + 500 + rng.below(COMMANDS as u64 * 3 / 4));
                let snapshot_every = 1_000 + rng.below(6_000);
                let log = work.0.join(format!("log-{trial}-{durability}-{life}"));
                let mut acked = lifetime(&dir, &file, durability, snapshot_every, &log, kill_at);
                // Now and then a crash, a restart (which recovers, syncs what
                // it found and goes on), and only then the power cut.
                let restarted = kill_at.is_some() && rng.below(3) == 0;
                if restarted {
                    acked = acked.max(lifetime(&dir, &file, durability, snapshot_every, &log, Some(acked + 200 + rng.below(5_000))));
                }
                let torn = rng.below(2) == 0;
                let cut = power_cut(&log, &dir, if torn { Some(&mut rng) } else { None });
                let context = format!("trial {trial} {durability} lifetime {life} (seed {seed}, snapshot every {snapshot_every}, killed at {kill_at:?}, restarted {restarted}, torn {torn}, {cut:?})");
                let snapshots_before: Vec<u64> = crossbook_journal::read::snapshots(&dir).unwrap().into_iter().map(|(s, _)| s).collect();
                let (seq, fresh) = journal_replay(&dir);
                stale_candidates += snapshots_before.iter().filter(|&&s| s > seq).count() as u64;
                let recovered = recover(&dir).unwrap_or_else(|e| panic!("{context}: {e}"));
                assert_eq!((recovered.engine.seq(), state_hash(&recovered.engine)), (seq, fresh.clone()), "{context}: recovery differs from the journal");
                assert!(recovered.set_aside.is_empty(), "{context}: a snapshot ahead of what the power cut left: {:?}", recovered.warnings);
                if durability == "sync" {
                    assert!(seq >= acked, "{context}: acknowledged {acked}, recovered {seq}");
                } else if seq < acked {
                    acknowledged_lost_async += acked - seq;
                }
                std::fs::remove_file(&log).unwrap();
            }
            // And once more as a user would check it: the binaries agree.
            let output = Process::new(env!("CARGO_BIN_EXE_crossbook")).args(["recover", "--journal", dir.to_str().unwrap()]).output().unwrap();
            assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
            let (_, fresh) = journal_replay(&dir);
            assert!(String::from_utf8_lossy(&output.stdout).contains(&fresh), "trial {trial} {durability}");
            let verified = Process::new(env!("CARGO_BIN_EXE_crossbook")).args(["journal", "verify", dir.to_str().unwrap()]).output().unwrap();
            assert!(verified.status.success(), "{}", String::from_utf8_lossy(&verified.stdout));
        }
    }
    eprintln!("power cuts: {stale_candidates} snapshots found ahead of the journal (must be 0), async acknowledgements taken back {acknowledged_lost_async}");
    assert_eq!(stale_candidates, 0, "a snapshot was written ahead of the durable journal");
}
