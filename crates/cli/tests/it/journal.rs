//! Durability: replay equals live, kill -9 loses nothing acknowledged, a
//! torn tail is dropped, corruption of history is refused with its place.

use crate::support::*;
use crossbook_engine::codec::encode_command;
use crossbook_engine::{Command, Engine};
use crossbook_journal::format::{RECORD_OVERHEAD, SEGMENT_HEADER_BYTES};
use crossbook_journal::{
    Durability, Journal, JournalConfig, JournalEnd, Problem, RecoveryError, recover, state_hash, verify, write_snapshot,
};
use crossbook_workload::{Workload, generate};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command as Process, Stdio};
use std::time::Duration;

fn live_hash(commands: &[Command]) -> String {
    let mut engine = Engine::new();
    let mut events = Vec::new();
    for command in commands {
        events.clear();
        engine.apply(command, &mut events);
    }
    state_hash(&engine)
}

/// Journals `commands` into `dir` as `crossbook run --journal` does.
fn journal_run(dir: &Path, commands: &[Command], config: JournalConfig, snapshot_every: u64) -> String {
    let recovered = recover(dir).unwrap();
    let mut engine = recovered.engine;
    let mut journal = Journal::open(dir, config, &recovered.end).unwrap();
    let mut events = Vec::new();
    for command in &commands[engine.seq() as usize..] {
        let seq = engine.seq() + 1;
        journal.append(seq, command).unwrap();
        events.clear();
        engine.apply(command, &mut events);
        if snapshot_every > 0 && seq.is_multiple_of(snapshot_every) {
            journal.sync().unwrap();
            let chain = journal.watch().chain_at(seq).unwrap();
            write_snapshot(dir, &engine, chain, 2).unwrap();
        }
    }
    journal.close().unwrap();
    state_hash(&engine)
}

fn small_segments(durability: Durability) -> JournalConfig {
    JournalConfig { durability, segment_bytes: 16_000, ..JournalConfig::default() }
}

#[test]
fn replay_equals_live_with_and_without_snapshots_across_segments() {
    for seed in 1..=6u64 {
        let commands = generate(Workload::Mixed, seed, 8_000);
        let expected = live_hash(&commands);
        for snapshot_every in [0, 2_500] {
            let durability = if seed % 2 == 0 { Durability::Sync } else { Durability::Async { interval: Duration::from_millis(2) } };
            let dir = TempDir::new("replay");
            let live = journal_run(&dir.0, &commands, small_segments(durability), snapshot_every);
            assert_eq!(live, expected, "seed {seed}");
            let recovered = recover(&dir.0).unwrap();
            assert!(recovered.warnings.is_empty(), "{:?}", recovered.warnings);
            assert!(recovered.end.segments >= 2, "seed {seed}: {} segments", recovered.end.segments);
            assert_eq!(recovered.engine.seq(), commands.len() as u64);
            assert_eq!(state_hash(&recovered.engine), expected, "seed {seed} snapshot_every {snapshot_every}");
            assert_eq!(recovered.snapshot.is_some(), snapshot_every > 0);
            let (_, problems) = verify(&dir.0);
            assert!(problems.is_empty(), "{problems:?}");
        }
    }
}

#[test]
fn a_run_resumes_where_the_journal_ends() {
    let commands = generate(Workload::Mixed, 12, 6_000);
    let dir = TempDir::new("resume");
    journal_run(&dir.0, &commands[..2_000], small_segments(Durability::Sync), 0);
    journal_run(&dir.0, &commands[..4_000], small_segments(Durability::Sync), 1_000);
    let hash = journal_run(&dir.0, &commands, small_segments(Durability::Sync), 0);
    assert_eq!(hash, live_hash(&commands));
    assert_eq!(state_hash(&recover(&dir.0).unwrap().engine), hash);
}

/// Builds a one-segment journal of `count` mixed commands; returns the
/// commands, the segment path and the byte offset of every record.
fn one_segment(dir: &Path, count: usize) -> (Vec<Command>, PathBuf, Vec<usize>) {
    let commands = generate(Workload::Mixed, 21, count);
    journal_run(dir, &commands, JournalConfig::default(), 0);
    let segment = dir.join(crossbook_journal::format::segment_name(1));
    let mut offsets = Vec::new();
    let mut at = SEGMENT_HEADER_BYTES;
    let mut payload = Vec::new();
    for command in &commands {
        offsets.push(at);
        payload.clear();
        encode_command(command, &mut payload);
        at += RECORD_OVERHEAD + crossbook_journal::format::TIME_BYTES + payload.len();
    }
    assert_eq!(std::fs::metadata(&segment).unwrap().len() as usize, at);
    (commands, segment, offsets)
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

#[test]
fn a_torn_last_record_is_dropped_at_every_byte_offset() {
    let original = TempDir::new("torn-src");
    let (commands, segment, offsets) = one_segment(&original.0, 300);
    let last = *offsets.last().unwrap();
    let end = std::fs::metadata(&segment).unwrap().len() as usize;
    let without_last = live_hash(&commands[..commands.len() - 1]);
    for cut in last..end {
        let dir = TempDir::new("torn");
        copy_dir(&original.0, &dir.0);
        let file = dir.0.join(segment.file_name().unwrap());
        std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(cut as u64).unwrap();
        let (_, problems) = verify(&dir.0);
        if cut > last {
            assert!(matches!(problems.as_slice(), [Problem::TornTail(t)] if t.offset == last as u64), "cut {cut}: {problems:?}");
        }
        let recovered = recover(&dir.0).unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
        assert_eq!(recovered.engine.seq(), commands.len() as u64 - 1, "cut at {cut}");
        assert_eq!(state_hash(&recovered.engine), without_last, "cut at {cut}");
        assert_eq!(recovered.warnings.len(), usize::from(cut > last), "cut at {cut}: {:?}", recovered.warnings);
        assert_eq!(std::fs::metadata(&file).unwrap().len() as usize, last, "cut at {cut}: file truncated to the last whole record");
        // And the journal takes new records after the cut.
        journal_run(&dir.0, &commands, JournalConfig::default(), 0);
        assert_eq!(state_hash(&recover(&dir.0).unwrap().engine), live_hash(&commands));
    }
}

/// A whole record after the last one, chained and with a checksum that
/// verifies, but longer than any a writer makes: written so, not torn (a
/// torn write verifies nothing), so refused like any other damage.
#[test]
fn a_whole_last_record_of_impossible_length_is_refused_not_dropped() {
    let original = TempDir::new("long-src");
    let (_, segment, _) = one_segment(&original.0, 300);
    let mut bytes = std::fs::read(&segment).unwrap();
    let end = bytes.len();
    let chain = u32::from_le_bytes(bytes[end - 4..].try_into().unwrap());
    let payload = vec![7u8; crossbook_journal::format::MAX_PAYLOAD + 1];
    crossbook_journal::format::encode_record_bounded(&mut bytes, chain, 301, &payload, payload.len());
    std::fs::write(&segment, &bytes).unwrap();
    expect_refusal(&original.0, end, 301);
}

/// The record before the last damaged in both its payload and its
/// checksum field (so the last record, which chains from that field,
/// cannot show it), or zeroed whole (a lost sector), with the last record
/// whole after it: history, refused, not dropped as a torn tail with the
/// whole record after it (a torn write leaves only zeros after it).
#[test]
fn a_damaged_record_before_a_whole_last_one_is_refused_not_dropped() {
    let original = TempDir::new("second-src");
    let (_, segment, offsets) = one_segment(&original.0, 300);
    let bytes = std::fs::read(&segment).unwrap();
    let (record, last) = (offsets[298], offsets[299]);
    let size = last - record;
    let payload_and_checksum = |b: &mut Vec<u8>| {
        b[record + 14] ^= 1;
        b[last - 1] ^= 1;
    };
    let zeroed = |b: &mut Vec<u8>| b[record..last].fill(0);
    let zeroed_but_header = |b: &mut Vec<u8>| b[record + 12..last].fill(0);
    let zeroed_and_more = |b: &mut Vec<u8>| b[record..last + 1].fill(0);
    type Damage<'a> = (&'a str, &'a dyn Fn(&mut Vec<u8>));
    let damages: [Damage; 3] = [("payload and checksum field", &payload_and_checksum), ("zeroed", &zeroed), ("zeroed but its header", &zeroed_but_header)];
    for (name, damage) in damages {
        let dir = TempDir::new("second");
        copy_dir(&original.0, &dir.0);
        let mut corrupt = bytes.clone();
        damage(&mut corrupt);
        std::fs::write(dir.0.join(segment.file_name().unwrap()), &corrupt).unwrap();
        eprintln!("{name}: record of {size} bytes at {record}");
        expect_refusal(&dir.0, record, 299);
    }
    // Zeros over the record and into the next one's length: nothing whole
    // follows that says so (a torn write of both could look like this), so
    // the records from there are the torn tail.
    let dir = TempDir::new("second-torn");
    copy_dir(&original.0, &dir.0);
    let mut torn = bytes.clone();
    zeroed_and_more(&mut torn);
    let tail = &torn[last + 1..];
    assert!(tail.iter().any(|&b| b != 0));
    std::fs::write(dir.0.join(segment.file_name().unwrap()), &torn).unwrap();
    let recovered = recover(&dir.0).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(recovered.engine.seq(), 298);
}

fn expect_refusal(dir: &Path, offset: usize, seq: u64) {
    match recover(dir) {
        Err(RecoveryError::Corruption(c)) => {
            assert_eq!((c.offset, c.seq), (offset as u64, seq), "{c}");
            assert!(c.file.ends_with(crossbook_journal::format::segment_name(1)), "{c}");
        }
        Err(other) => panic!("expected corruption at {offset}, got {other}"),
        Ok(r) => panic!("expected corruption at {offset}, recovered seq {}", r.engine.seq()),
    }
    let (_, problems) = verify(dir);
    assert!(
        matches!(problems.as_slice(), [Problem::Corruption(c)] if c.offset == offset as u64 && c.seq == seq),
        "{problems:?}"
    );
}

#[test]
fn a_flipped_byte_in_a_middle_record_is_refused_with_its_place() {
    let original = TempDir::new("flip-src");
    let (_, segment, offsets) = one_segment(&original.0, 200);
    let bytes = std::fs::read(&segment).unwrap();
    for (index, &record) in offsets.iter().enumerate().take(199).step_by(17) {
        let size = offsets[index + 1] - record;
        for within in [0, 5, 12, size - 1] {
            let dir = TempDir::new("flip");
            copy_dir(&original.0, &dir.0);
            let mut corrupt = bytes.clone();
            corrupt[record + within] ^= 0x10;
            std::fs::write(dir.0.join(segment.file_name().unwrap()), &corrupt).unwrap();
            expect_refusal(&dir.0, record, index as u64 + 1);
        }
    }
}

#[test]
fn a_missing_or_swapped_middle_record_is_refused() {
    let original = TempDir::new("gap-src");
    let (_, segment, offsets) = one_segment(&original.0, 120);
    let bytes = std::fs::read(&segment).unwrap();
    for index in [3usize, 50, 117] {
        let (a, b, c) = (offsets[index], offsets[index + 1], offsets[index + 2]);
        // Drop record index+1 (seq index + 1).
        let dir = TempDir::new("gap");
        let mut dropped = bytes[..a].to_vec();
        dropped.extend_from_slice(&bytes[b..]);
        std::fs::write(dir.0.join(segment.file_name().unwrap()), &dropped).unwrap();
        expect_refusal(&dir.0, a, index as u64 + 1);
        // Swap records index+1 and index+2.
        let dir = TempDir::new("swap");
        let mut swapped = bytes[..a].to_vec();
        swapped.extend_from_slice(&bytes[b..c]);
        swapped.extend_from_slice(&bytes[a..b]);
        swapped.extend_from_slice(&bytes[c..]);
        std::fs::write(dir.0.join(segment.file_name().unwrap()), &swapped).unwrap();
        expect_refusal(&dir.0, a, index as u64 + 1);
    }
}

#[test]
fn a_corrupt_newest_snapshot_falls_back_to_an_older_one_or_the_journal() {
    let commands = generate(Workload::Mixed, 33, 9_000);
    let expected = live_hash(&commands);
    let dir = TempDir::new("snap");
    journal_run(&dir.0, &commands, small_segments(Durability::Sync), 4_000);
    let newest = dir.0.join(crossbook_journal::format::snapshot_name(8_000));
    let older = dir.0.join(crossbook_journal::format::snapshot_name(4_000));
    let mut bytes = std::fs::read(&newest).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&newest, &bytes).unwrap();
    let (_, problems) = verify(&dir.0);
    assert!(matches!(problems.as_slice(), [Problem::BadSnapshot { file, .. }] if *file == newest), "{problems:?}");
    let recovered = recover(&dir.0).unwrap();
    assert_eq!(recovered.snapshot, Some(4_000));
    assert_eq!(recovered.warnings.len(), 1, "{:?}", recovered.warnings);
    assert_eq!(state_hash(&recovered.engine), expected);
    // Both snapshots bad: the journal from the start.
    std::fs::write(&older, b"garbage").unwrap();
    let recovered = recover(&dir.0).unwrap();
    assert_eq!(recovered.snapshot, None);
    assert_eq!(recovered.replayed, commands.len() as u64);
    assert_eq!(state_hash(&recovered.engine), expected);
}

#[test]
fn after_a_failed_write_the_journal_refuses_all_work() {
    // /dev/full accepts the open and fails every write with ENOSPC.
    let end = JournalEnd {
        last_seq: 0,
        last_crc: 0,
        tail: Some((PathBuf::from("/dev/full"), 0)),
        torn: None,
        records: 0,
        segments: 1,
    };
    let dir = TempDir::new("full");
    let mut journal = Journal::open(&dir.0, JournalConfig::default(), &end).unwrap();
    let command = Command::OpenAccount { account: 1 };
    journal.append(1, &command).unwrap();
    let error = journal.flush().unwrap_err().to_string();
    assert!(error.contains("the journal takes nothing more"), "{error}");
    assert!(journal.append(2, &command).is_err());
    assert!(journal.flush().is_err());
    assert_eq!(journal.acked(), 0, "nothing was acknowledged");
}

/// The server releases a batch only once all of it is durable, so it turns
/// the eager hand-off off: the batch's records reach the writer together
/// when it publishes, and one sync covers them all (with the hand-off on,
/// an idle writer would start syncing the first record alone, and the
/// batch would wait for two syncs).
#[test]
fn without_eager_hand_off_a_published_batch_is_one_group_commit() {
    let dir = TempDir::new("batch");
    let recovered = recover(&dir.0).unwrap();
    let config = JournalConfig { eager: false, ..JournalConfig::default() };
    let mut journal = Journal::open(&dir.0, config, &recovered.end).unwrap();
    // Let the writer thread start and wait for work (it is idle).
    std::thread::sleep(Duration::from_millis(50));
    for seq in 1..=5 {
        journal.append(seq, &Command::OpenAccount { account: seq }).unwrap();
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(journal.acked(), 0, "nothing reaches the writer before publish");
    assert_eq!(journal.stats().syncs, 0);
    journal.publish().unwrap();
    assert_eq!(journal.wait_acked(5, Duration::from_secs(30)).unwrap(), 5);
    let stats = journal.close().unwrap();
    assert_eq!((stats.writes, stats.syncs, stats.records, stats.largest_group), (1, 1, 5, 5), "one write and one fdatasync for the batch");
    assert_eq!(recover(&dir.0).unwrap().engine.seq(), 5);
}

/// In async mode a write is the acknowledgement and the syncs come on an
/// interval from another thread: both are counted, apart.
#[test]
fn async_mode_counts_its_writes_and_its_periodic_syncs() {
    let dir = TempDir::new("async-stats");
    let recovered = recover(&dir.0).unwrap();
    let config = JournalConfig { durability: Durability::Async { interval: Duration::from_millis(5) }, ..JournalConfig::default() };
    let mut journal = Journal::open(&dir.0, config, &recovered.end).unwrap();
    for seq in 1..=3 {
        journal.append(seq, &Command::OpenAccount { account: seq }).unwrap();
    }
    journal.publish().unwrap();
    assert_eq!(journal.wait_acked(3, Duration::from_secs(30)).unwrap(), 3);
    // The periodic sync picks the write up within a few intervals.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while journal.stats().syncs == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let stats = journal.close().unwrap();
    assert_eq!((stats.writes, stats.records, stats.largest_group), (1, 3, 3));
    assert!(stats.syncs >= 1 && stats.sync_micros.len() == stats.syncs, "{stats:?}");
}

/// `crossbook run --journal` killed with SIGKILL at random moments: every
/// acknowledged command survives, and the state equals an in-memory replay
/// of exactly what was recovered.
#[test]
fn kill_9_loses_nothing_acknowledged() {
    let commands = generate(Workload::Mixed, 77, 400_000);
    let work = TempDir::new("crash");
    let file = work.0.join("commands.txt");
    std::fs::write(&file, commands_text(&commands)).unwrap();
    let mut rng = crossbook_workload::Rng::new(2026);
    let mut kills_with_progress = 0;
    for round in 0..20 {
        let dir = work.0.join(format!("journal-{round}"));
        let snapshot_every = if round % 2 == 0 { "0" } else { "50000" };
        let mut child = Process::new(env!("CARGO_BIN_EXE_crossbook"))
            .args(["run", "--commands", file.to_str().unwrap(), "--journal", dir.to_str().unwrap()])
            .args(["--snapshot-every", snapshot_every, "--segment-bytes", "1000000"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Kill the moment the acknowledgements pass a random point: the
        // writer is mid-flight then, with more commands appended and being
        // synced.
        let target = 1 + rng.below(commands.len() as u64 - 1000);
        let mut acked = 0u64;
        let stdout = child.stdout.take().unwrap();
        let mut killed = false;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(n) = line.strip_prefix("acked ").and_then(|n| n.parse::<u64>().ok()) {
                acked = n;
            }
            if !killed && acked >= target {
                let _ = child.kill();
                killed = true;
            }
        }
        let _ = child.wait();
        let recovered = recover(&dir).unwrap_or_else(|e| panic!("round {round}: {e}"));
        let seq = recovered.engine.seq();
        assert!(seq >= acked, "round {round}: recovered seq {seq} < acknowledged {acked}");
        assert_eq!(state_hash(&recovered.engine), live_hash(&commands[..seq as usize]), "round {round} at seq {seq}");
        if killed && (seq as usize) < commands.len() {
            kills_with_progress += 1;
        }
    }
    assert!(kills_with_progress >= 10, "only {kills_with_progress} of 20 kills landed mid-run");
}

/// `crossbook run --journal` then `crossbook recover`, as a user runs
/// them: the state hash printed by one equals the other's, with and without
/// snapshots and across segments.
#[test]
fn run_and_recover_binaries_print_the_same_state_hash() {
    let binary = env!("CARGO_BIN_EXE_crossbook");
    for (seed, snapshot_every, segment_bytes) in [(21u64, "0", "67108864"), (22, "1500", "20000"), (23, "0", "9000")] {
        let dir = TempDir::new("run-recover");
        let commands = generate(Workload::Mixed, seed, 6_000);
        let file = dir.0.join("commands.txt");
        std::fs::write(&file, commands_text(&commands)).unwrap();
        let journal = dir.0.join("journal");
        let run = Process::new(binary)
            .args(["run", "--commands", file.to_str().unwrap(), "--journal", journal.to_str().unwrap()])
            .args(["--snapshot-every", snapshot_every, "--segment-bytes", segment_bytes, "--durability", "async"])
            .output()
            .unwrap();
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
        let hash = |stderr: &[u8]| {
            String::from_utf8_lossy(stderr).lines().find_map(|l| l.strip_prefix("state-sha256 ").map(str::to_owned)).expect("a state-sha256 line")
        };
        let live = hash(&run.stderr);
        assert_eq!(live, live_hash(&commands), "seed {seed}: the binary's hash is the in-memory state's");
        let recovered = Process::new(binary).args(["recover", "--journal", journal.to_str().unwrap()]).output().unwrap();
        assert!(recovered.status.success(), "{}", String::from_utf8_lossy(&recovered.stderr));
        let text = format!("{}{}", String::from_utf8_lossy(&recovered.stdout), String::from_utf8_lossy(&recovered.stderr));
        assert!(text.contains(&live), "seed {seed}: recover printed {text}");
        assert!(text.contains("seq 6000"), "seed {seed}: recover printed {text}");
        if segment_bytes != "67108864" {
            let segments = std::fs::read_dir(&journal).unwrap().filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("segment-")).count();
            assert!(segments > 2, "seed {seed}: {segments} segments");
        }
    }
}

/// `run --journal` whose snapshot cannot be written (here a directory put
/// in the way of its temporary file once the run has started: recovery
/// would clear it before) says so and goes on: every command acknowledged
/// and journaled, the other snapshots written. The obstacle is put there
/// when the first snapshot appears; a run that got past the second first
/// is tried again.
#[test]
fn a_snapshot_that_cannot_be_written_is_said_and_the_run_goes_on() {
    let binary = env!("CARGO_BIN_EXE_crossbook");
    let every = 100_000u64;
    let commands = generate(Workload::Mixed, 24, 3 * every as usize);
    let text = commands_text(&commands);
    for attempt in 1..=5 {
        let dir = TempDir::new("run-snapshot-fails");
        let file = dir.0.join("commands.txt");
        std::fs::write(&file, &text).unwrap();
        let journal = dir.0.join("journal");
        let run = Process::new(binary)
            .args(["run", "--commands", file.to_str().unwrap(), "--journal", journal.to_str().unwrap()])
            .args(["--snapshot-every", &every.to_string(), "--keep-snapshots", "5", "--durability", "async"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let snapshot = |seq: u64| journal.join(crossbook_journal::format::snapshot_name(seq));
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !snapshot(every).exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(200));
        }
        let obstacle = snapshot(2 * every).with_extension("xbs.tmp");
        let _ = std::fs::create_dir_all(&obstacle);
        let output = run.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{stderr}");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(stdout.lines().last(), Some(format!("acked {}", 3 * every).as_str()), "{stdout}");
        if snapshot(2 * every).exists() {
            eprintln!("attempt {attempt}: the run wrote snapshot {} before the obstacle was there", 2 * every);
            continue;
        }
        assert!(stderr.contains(&format!("warning: snapshot at seq {} failed", 2 * every)), "{stderr}");
        assert!(snapshot(every).exists() && snapshot(3 * every).exists(), "the snapshots before and after");
        std::fs::remove_dir(&obstacle).unwrap();
        let recovered = recover(&journal).unwrap();
        assert_eq!((recovered.engine.seq(), recovered.snapshot), (3 * every, Some(3 * every)));
        assert_eq!(state_hash(&recovered.engine), live_hash(&commands));
        return;
    }
    panic!("the run was always past its second snapshot before the obstacle was there");
}

/// A journal of 4,000 mixed commands in small segments; its segments, in
/// order.
fn small_segment_journal(dir: &Path) -> Vec<PathBuf> {
    let commands = generate(Workload::Mixed, 31, 4_000);
    journal_run(dir, &commands, small_segments(Durability::Async { interval: Duration::from_millis(5) }), 0);
    let mut segments: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "xbj")).collect();
    segments.sort();
    segments
}

/// A segment cut short in its last record, with only later segments
/// after it (which begin with a header, not a record): damage, since a
/// segment is synced before the next begins, and named as what it is.
#[test]
fn a_segment_cut_short_before_later_ones_is_damage_named_as_such() {
    let dir = TempDir::new("cut-middle");
    let segments = small_segment_journal(&dir.0);
    let length = std::fs::metadata(&segments[0]).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&segments[0]).unwrap().set_len(length - 5).unwrap();
    for later in &segments[2..] {
        std::fs::remove_file(later).unwrap();
    }
    let header_only = std::fs::read(&segments[1]).unwrap()[..SEGMENT_HEADER_BYTES].to_vec();
    std::fs::write(&segments[1], header_only).unwrap();
    match recover(&dir.0) {
        Err(RecoveryError::Corruption(c)) => {
            assert_eq!(c.file, segments[0]);
            assert!(c.what.contains("later segments follow") && !c.what.contains("valid records follow"), "{}", c.what);
        }
        Err(other) => panic!("{other}"),
        Ok(recovered) => panic!("recovered to seq {}", recovered.engine.seq()),
    }
}

/// Recovery stops at the first damage; `journal verify` names every damaged
/// segment, each with its file, offset and sequence number.
#[test]
fn verify_names_every_damaged_segment() {
    let dir = TempDir::new("verify-all");
    let segments = small_segment_journal(&dir.0);
    assert!(segments.len() >= 4, "{} segments", segments.len());
    // Damage a record in the middle of the first and of the third segment.
    for path in [&segments[0], &segments[2]] {
        let mut bytes = std::fs::read(path).unwrap();
        let at = SEGMENT_HEADER_BYTES + RECORD_OVERHEAD + 60;
        bytes[at] ^= 0x40;
        std::fs::write(path, &bytes).unwrap();
    }
    assert!(matches!(recover(&dir.0), Err(RecoveryError::Corruption(c)) if c.file == segments[0]));
    let (_, problems) = verify(&dir.0);
    let damaged: Vec<&PathBuf> = problems.iter().filter_map(|p| if let Problem::Corruption(c) = p { Some(&c.file) } else { None }).collect();
    assert_eq!(damaged, vec![&segments[0], &segments[2]], "{problems:?}");
    // And the command line says so, with the places, and fails.
    let output = Process::new(env!("CARGO_BIN_EXE_crossbook")).args(["journal", "verify", dir.0.to_str().unwrap()]).output().unwrap();
    assert!(!output.status.success());
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    for path in [&segments[0], &segments[2]] {
        assert!(text.contains(&path.file_name().unwrap().to_string_lossy().to_string()), "{text}");
    }
    assert!(text.contains("offset"), "{text}");
    // Both, with valid records after the damage, are worded alike.
    assert_eq!(text.matches("checksum mismatch, and valid records follow").count(), 2, "{text}");
    // A mistyped directory is named as missing, never taken for an empty journal.
    let missing = dir.0.join("no-such-journal");
    for args in [vec!["recover", "--journal", missing.to_str().unwrap()], vec!["journal", "verify", missing.to_str().unwrap()]] {
        let output = Process::new(env!("CARGO_BIN_EXE_crossbook")).args(&args).output().unwrap();
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        assert!(String::from_utf8_lossy(&output.stderr).contains("no-such-journal does not exist"), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
        assert!(!missing.exists());
    }
}

/// A segment missing after a damaged one is named too: verify reads the
/// damaged segment on past its damage to learn where it ends.
#[test]
fn verify_names_a_missing_segment_after_a_damaged_one() {
    let dir = TempDir::new("verify-missing");
    let segments = small_segment_journal(&dir.0);
    assert!(segments.len() >= 3, "{} segments", segments.len());
    let mut bytes = std::fs::read(&segments[0]).unwrap();
    bytes[SEGMENT_HEADER_BYTES + RECORD_OVERHEAD + 60] ^= 0x40;
    std::fs::write(&segments[0], &bytes).unwrap();
    std::fs::remove_file(&segments[1]).unwrap();
    let (_, problems) = verify(&dir.0);
    let named: Vec<(&PathBuf, &str)> = problems.iter().filter_map(|p| if let Problem::Corruption(c) = p { Some((&c.file, c.what.as_str())) } else { None }).collect();
    assert_eq!(named.len(), 2, "{problems:?}");
    assert_eq!(named[0].0, &segments[0]);
    assert!(named[1].0 == &segments[2] && named[1].1.contains("does not follow on"), "{problems:?}");
}

/// A last segment whose header a crash cut off (short, or ending in the
/// zeros not yet written over) holds nothing acknowledged and is dropped;
/// one with a whole header that fails its checks (random bytes, another
/// file) is refused and left as it is.
#[test]
fn only_a_header_a_crash_cut_off_is_dropped_as_torn() {
    let source = TempDir::new("torn-header-source");
    let (commands, _, _) = one_segment(&source.0, 300);
    let next = crossbook_journal::format::segment_name(commands.len() as u64 + 1);
    let header = crossbook_journal::format::segment_header(commands.len() as u64 + 1, 0x1234_5678);
    let mut random = vec![0u8; 5_000];
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for byte in &mut random {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        *byte = state as u8;
    }
    let mut cut = header[..28].to_vec();
    cut.extend([0u8; 4100]);
    let cases: [(&str, Vec<u8>, bool); 4] =
        [("short", header[..20].to_vec(), true), ("checksum not yet written", cut, true), ("random bytes", random, false), ("a flipped header byte", {
            let mut h = header.to_vec();
            h[17] ^= 1;
            h
        }, false)];
    for (name, bytes, torn) in cases {
        let dir = TempDir::new("torn-header");
        copy_dir(&source.0, &dir.0);
        let path = dir.0.join(&next);
        std::fs::write(&path, &bytes).unwrap();
        match recover(&dir.0) {
            Ok(recovered) if torn => {
                assert_eq!(recovered.end.last_seq, commands.len() as u64, "{name}");
                assert!(recovered.end.torn.as_ref().is_some_and(|t| t.whole_segment), "{name}");
                // verify counts the segments recovery keeps.
                let output = Process::new(env!("CARGO_BIN_EXE_crossbook")).args(["journal", "verify", dir.0.to_str().unwrap()]).output().unwrap();
                let said = String::from_utf8_lossy(&output.stdout);
                assert!(output.status.success() && said.starts_with(&format!("{} records in 1 segments, ", commands.len())), "{name}: {said}");
            }
            Err(RecoveryError::Corruption(c)) if !torn => {
                assert_eq!(c.file, path, "{name}");
                assert_eq!(std::fs::read(&path).unwrap(), bytes, "{name}: left as it was");
            }
            other => panic!("{name}: {:?}", other.map(|r| r.end)),
        }
    }
}

/// A journal whose writer died with zeros written ahead of its records (a
/// crash, not a clean close) ends where the zeros start; a torn record
/// followed by zeros is a torn tail, dropped; damage followed by valid
/// records is still refused.
#[test]
fn zeros_written_ahead_are_the_end_of_the_journal() {
    let original = TempDir::new("zeros-src");
    let (commands, segment, offsets) = one_segment(&original.0, 300);
    let bytes = std::fs::read(&segment).unwrap();
    let name = segment.file_name().unwrap().to_owned();
    // Clean end, then a megabyte of zeros.
    let dir = TempDir::new("zeros");
    copy_dir(&original.0, &dir.0);
    let mut padded = bytes.clone();
    padded.extend(std::iter::repeat_n(0u8, 1 << 20));
    std::fs::write(dir.0.join(&name), &padded).unwrap();
    let recovered = recover(&dir.0).unwrap();
    assert_eq!(recovered.engine.seq(), 300);
    assert!(recovered.warnings.is_empty(), "{:?}", recovered.warnings);
    assert_eq!(state_hash(&recovered.engine), live_hash(&commands));
    assert!(verify(&dir.0).1.is_empty());
    // And appending goes on after the last record, over the zeros.
    let more = generate(Workload::Mixed, 21, 400);
    assert_eq!(journal_run(&dir.0, &more, JournalConfig::default(), 0), live_hash(&more));
    assert_eq!(recover(&dir.0).unwrap().engine.seq(), 400);
    // A torn last record, then zeros, torn at every byte of it (the length
    // field whole and the sequence field cut included): dropped.
    for cut in offsets[299] + 1..bytes.len() {
        let dir = TempDir::new("zeros-torn");
        copy_dir(&original.0, &dir.0);
        let mut torn = bytes[..cut].to_vec();
        torn.extend(std::iter::repeat_n(0u8, 4096));
        std::fs::write(dir.0.join(&name), &torn).unwrap();
        let recovered = recover(&dir.0).unwrap_or_else(|e| panic!("torn at {cut} (record at {}): {e}", offsets[299]));
        assert_eq!(recovered.engine.seq(), 299, "torn at {cut}");
    }
    // A zeroed record in the middle, valid records after it: refused.
    let dir = TempDir::new("zeros-middle");
    copy_dir(&original.0, &dir.0);
    let mut holed = padded.clone();
    holed[offsets[100]..offsets[101]].fill(0);
    std::fs::write(dir.0.join(&name), &holed).unwrap();
    assert!(matches!(recover(&dir.0), Err(RecoveryError::Corruption(c)) if c.seq == 101));
}

/// The sequence: a snapshot is written at the journal's last
/// record; that record is then torn (as a power cut can do to a record
/// whose sync did not complete); recovery falls back to an older snapshot
/// and sets the stale one aside; different commands are journaled under
/// the sequence numbers it covered; the next recovery must still equal a
/// fresh replay of the journal, never the stale snapshot plus the rest.
#[test]
fn a_snapshot_ahead_of_the_journal_is_set_aside_and_never_used_later() {
    let first = generate(Workload::Mixed, 41, 6_000);
    let dir = TempDir::new("stale");
    journal_run(&dir.0, &first, JournalConfig::default(), 2_000);
    let stale = dir.0.join(crossbook_journal::format::snapshot_name(6_000));
    assert!(stale.exists());
    // Tear the last record.
    let segment = dir.0.join(crossbook_journal::format::segment_name(1));
    let length = std::fs::metadata(&segment).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&segment).unwrap().set_len(length - 3).unwrap();
    // verify names the snapshot before anything is changed.
    let (_, problems) = verify(&dir.0);
    assert!(problems.iter().any(|p| matches!(p, Problem::ForeignSnapshot { file, what } if *file == stale && what.contains("ahead"))), "{problems:?}");
    let recovered = recover(&dir.0).unwrap();
    assert_eq!((recovered.engine.seq(), recovered.snapshot), (5_999, Some(4_000)));
    assert_eq!(recovered.set_aside.len(), 1, "{:?}", recovered.warnings);
    assert!(!stale.exists(), "set aside under another name");
    assert!(recovered.warnings.iter().any(|w| w.contains("does not belong") && w.contains("ahead of the journal")), "{:?}", recovered.warnings);
    // Different commands under seq 6000 and on.
    let mut second = first[..5_999].to_vec();
    second.extend(generate(Workload::Mixed, 42, 9_000).into_iter().skip(5_999));
    journal_run(&dir.0, &second, JournalConfig::default(), 0);
    let recovered = recover(&dir.0).unwrap();
    assert_eq!(recovered.engine.seq(), 9_000);
    assert_eq!(state_hash(&recovered.engine), live_hash(&second), "the stale snapshot was used");
    assert_eq!(recovered.snapshot, Some(4_000));
    assert!(recovered.warnings.is_empty(), "set aside for good: {:?}", recovered.warnings);
    assert!(verify(&dir.0).1.is_empty());
}

/// Every segment gone while the snapshots stay (deleted by hand, a
/// damaged disk): going on would start a new venue over the lost one
/// (with `serve`, its configuration's set-up and deposits), so recovery
/// refuses and changes nothing; once the snapshots are moved away, the
/// directory is a new venue's.
#[test]
fn a_journal_lost_under_its_snapshots_is_refused_not_started_afresh() {
    let commands = generate(Workload::Mixed, 43, 5_000);
    let dir = TempDir::new("lost");
    journal_run(&dir.0, &commands, JournalConfig::default(), 2_000);
    let snapshots: Vec<_> = [2_000, 4_000].iter().map(|&seq| dir.0.join(crossbook_journal::format::snapshot_name(seq))).collect();
    assert!(snapshots.iter().all(|s| s.exists()));
    for entry in std::fs::read_dir(&dir.0).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "xbj") {
            std::fs::remove_file(path).unwrap();
        }
    }
    for _ in 0..2 {
        match recover(&dir.0) {
            Err(e @ RecoveryError::JournalLost { .. }) => {
                let text = e.to_string();
                assert!(text.contains("commands 1..=4000 were synced") && text.contains(&snapshots[1].display().to_string()), "{text}");
            }
            Err(other) => panic!("{other}"),
            Ok(recovered) => panic!("recovered seq {} over a lost journal: {:?}", recovered.engine.seq(), recovered.warnings),
        }
        assert!(snapshots.iter().all(|s| s.exists()), "a refused start sets nothing aside");
    }
    let output = Process::new(env!("CARGO_BIN_EXE_crossbook")).args(["recover", "--journal", dir.0.to_str().unwrap()]).output().unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("the journal is lost"), "{}", String::from_utf8_lossy(&output.stderr));
    // The operator's choice: the snapshots moved out, a new journal.
    for snapshot in &snapshots {
        std::fs::remove_file(snapshot).unwrap();
    }
    let recovered = recover(&dir.0).unwrap();
    assert_eq!(recovered.engine.seq(), 0);
}

/// A snapshot whose bytes and checksums hold, bound to the right record,
/// but whose state is not what the journal's commands make (a bug in
/// whatever wrote it): only a replay tells, and `journal verify --replay`
/// does, naming it; without it, it passes.
#[test]
fn a_snapshot_of_the_wrong_state_is_found_by_a_replay() {
    let ours = generate(Workload::Mixed, 53, 5_000);
    let theirs = generate(Workload::Mixed, 54, 5_000);
    let dir = TempDir::new("wrong-state");
    journal_run(&dir.0, &ours, JournalConfig::default(), 1_000);
    let name = crossbook_journal::format::snapshot_name(4_000);
    let bytes = std::fs::read(dir.0.join(&name)).unwrap();
    let header = crossbook_journal::format::decode_snapshot(&bytes).unwrap().header;
    let mut other = Engine::new();
    let mut events = Vec::new();
    for command in &theirs[..4_000] {
        events.clear();
        other.apply(command, &mut events);
    }
    let mut state = Vec::new();
    other.encode_state(&mut state);
    std::fs::write(dir.0.join(&name), crossbook_journal::format::encode_snapshot(header, &state, &[])).unwrap();
    assert!(verify(&dir.0).1.is_empty(), "its bytes are sound");
    let (_, problems) = crossbook_journal::verify_with(&dir.0, true);
    assert!(matches!(problems.as_slice(), [Problem::BadSnapshot { file, what }] if file.ends_with(&name) && what.contains("not the journal's replayed to seq 4000")), "{problems:?}");
    let verified = |args: &[&str]| Process::new(env!("CARGO_BIN_EXE_crossbook")).args(args).output().unwrap();
    let path = dir.0.to_str().unwrap();
    assert!(verified(&["journal", "verify", path]).status.success());
    let output = verified(&["journal", "verify", "--replay", path]);
    assert!(!output.status.success() && String::from_utf8_lossy(&output.stdout).contains(&name), "{}", String::from_utf8_lossy(&output.stdout));
    // The sound ones pass a replay.
    let clean = TempDir::new("wrong-state-clean");
    journal_run(&clean.0, &ours, JournalConfig::default(), 1_000);
    assert!(crossbook_journal::verify_with(&clean.0, true).1.is_empty());
}

/// A snapshot at a sequence number the journal holds, but of another
/// history (another journal's, copied in by mistake): its record's
/// checksum is not the journal's, so it is set aside.
#[test]
fn a_snapshot_of_another_history_is_set_aside() {
    let ours = generate(Workload::Mixed, 51, 5_000);
    let theirs = generate(Workload::Mixed, 52, 5_000);
    let dir = TempDir::new("foreign");
    let other = TempDir::new("foreign-other");
    journal_run(&dir.0, &ours, JournalConfig::default(), 0);
    journal_run(&other.0, &theirs, JournalConfig::default(), 3_000);
    let name = crossbook_journal::format::snapshot_name(3_000);
    std::fs::copy(other.0.join(&name), dir.0.join(&name)).unwrap();
    let (_, problems) = verify(&dir.0);
    assert!(matches!(problems.as_slice(), [Problem::ForeignSnapshot { what, .. }] if what.contains("checksum")), "{problems:?}");
    let output = Process::new(env!("CARGO_BIN_EXE_crossbook")).args(["journal", "verify", dir.0.to_str().unwrap()]).output().unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stdout).contains(&name), "{}", String::from_utf8_lossy(&output.stdout));
    let recovered = recover(&dir.0).unwrap();
    assert_eq!(recovered.snapshot, None);
    assert_eq!(state_hash(&recovered.engine), live_hash(&ours));
    assert_eq!(recovered.set_aside.len(), 1);
    assert!(recovered.set_aside[0].1.to_string_lossy().ends_with(".xbs.set-aside"));
    // A second such file at the same place gets a name of its own.
    std::fs::copy(other.0.join(&name), dir.0.join(&name)).unwrap();
    let recovered = recover(&dir.0).unwrap();
    assert!(recovered.set_aside[0].1.to_string_lossy().ends_with(".xbs.set-aside-2"), "{:?}", recovered.set_aside);
    // A snapshot of the old format names no record: set aside too.
    let mut old = std::fs::read(other.0.join(&name)).unwrap();
    old[8..12].copy_from_slice(&1u32.to_le_bytes());
    let at = old.len() - 4;
    let crc = crc32c::crc32c(&old[..at]);
    old[at..].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(dir.0.join(&name), &old).unwrap();
    let recovered = recover(&dir.0).unwrap();
    assert_eq!(recovered.set_aside.len(), 1, "{:?}", recovered.warnings);
    assert!(recovered.warnings[0].contains("version 1"), "{:?}", recovered.warnings);
    assert_eq!(state_hash(&recovered.engine), live_hash(&ours));
}

/// Damage to the checksum field of the second-to-last record is not a torn
/// tail: the last record is whole and chains from what that checksum
/// should be, so it was written after, and (in sync mode) acknowledged.
/// Every byte of that record, checksum included, is refused with its
/// place; the last record alone stays indistinguishable from a torn write.
#[test]
fn damage_before_a_whole_last_record_is_refused_not_truncated() {
    let original = TempDir::new("crc-src");
    let (_, segment, offsets) = one_segment(&original.0, 300);
    let bytes = std::fs::read(&segment).unwrap();
    let (record, last) = (offsets[298], offsets[299]);
    for at in record..last {
        for bit in [0x01u8, 0x80] {
            let dir = TempDir::new("crc");
            copy_dir(&original.0, &dir.0);
            let mut damaged = bytes.clone();
            damaged[at] ^= bit;
            std::fs::write(dir.0.join(segment.file_name().unwrap()), &damaged).unwrap();
            expect_refusal(&dir.0, record, 299);
        }
    }
}

/// Async mode: a write is acknowledged before the sync that covers it;
/// `durable` trails `acked` until the syncer runs, `sync` closes the gap at
/// once, and the wait of each acknowledged write for its sync is measured.
#[test]
fn async_mode_tells_durable_from_acknowledged() {
    let dir = TempDir::new("async-durable");
    let recovered = recover(&dir.0).unwrap();
    let config = JournalConfig { durability: Durability::Async { interval: Duration::from_secs(3600) }, ..JournalConfig::default() };
    let mut journal = Journal::open(&dir.0, config, &recovered.end).unwrap();
    for seq in 1..=10 {
        journal.append(seq, &Command::OpenAccount { account: seq }).unwrap();
    }
    assert_eq!(journal.flush().unwrap(), 10);
    assert_eq!((journal.acked(), journal.durable()), (10, 0), "written, not yet synced (the interval is an hour)");
    let watch = journal.watch();
    assert_eq!(watch.chain_at(10).map(|_| ()), Some(()), "the checksum of a written record is at hand");
    assert_eq!(watch.chain_at(11), None);
    assert_eq!(journal.sync().unwrap(), 10);
    assert_eq!(journal.durable(), 10);
    let stats = journal.close().unwrap();
    assert_eq!(stats.write_to_sync_micros.len(), 1, "one sync covered acknowledged writes");
    // The checksum the ring gave is the journal's.
    let end = crossbook_journal::scan(&dir.0, |_, _| Ok(())).unwrap();
    assert_eq!(watch.chain_at(10), Some(end.last_crc));
}

/// A segment as version 2 wrote it (no timestamps) from record
/// `first_seq` on, chained from `chain`: its bytes and its last checksum.
fn version_2_segment(first_seq: u64, chain: u32, commands: &[Command]) -> (Vec<u8>, u32) {
    older_segment(2, 1, first_seq, chain, commands)
}

/// A segment of segment format `version` and command encoding `format`.
fn older_segment(version: u32, format: u32, first_seq: u64, chain: u32, commands: &[Command]) -> (Vec<u8>, u32) {
    use crossbook_journal::format::{encode_record, segment_header};
    let mut header = segment_header(first_seq, chain);
    header[8..12].copy_from_slice(&version.to_le_bytes());
    header[12..16].copy_from_slice(&format.to_le_bytes());
    let crc = crc32c::crc32c(&header[0..28]);
    header[28..32].copy_from_slice(&crc.to_le_bytes());
    let mut bytes = header.to_vec();
    let mut chain = chain;
    for (index, command) in commands.iter().enumerate() {
        let mut payload = Vec::new();
        if version >= 3 {
            payload.extend_from_slice(&0u64.to_le_bytes());
        }
        encode_command(command, &mut payload);
        chain = encode_record(&mut bytes, chain, first_seq + index as u64, &payload);
    }
    (bytes, chain)
}

/// A segment of command encoding 1 (before `amend`) is read; the records
/// after it, an amend among them, go into a new segment of encoding 2, so
/// a reader of encoding 1 never meets a tag it does not know in a segment
/// it accepts. A segment naming an encoding from the future is refused.
#[test]
fn a_segment_of_the_older_command_encoding_is_read_and_ended() {
    use crossbook_engine::codec::COMMAND_FORMAT_VERSION;
    use crossbook_journal::format::{SEGMENT_VERSION, segment_name};
    let dir = TempDir::new("encoding-v1");
    let commands = generate(Workload::Mixed, 9, 4_000);
    let cut = 3_000;
    let older: Vec<Command> = commands[..cut].iter().filter(|c| !matches!(c, Command::Amend { .. })).cloned().collect();
    let mut rest: Vec<Command> = commands[cut..].to_vec();
    assert!(rest.iter().any(|c| matches!(c, Command::Amend { .. })), "the records after it hold an amend");
    std::fs::write(dir.0.join(segment_name(1)), older_segment(SEGMENT_VERSION, 1, 1, 0, &older).0).unwrap();
    let recovered = recover(&dir.0).unwrap();
    assert_eq!(recovered.engine.seq(), older.len() as u64);
    let next = older.len() as u64 + 1;
    let mut journal = Journal::open(&dir.0, JournalConfig::default(), &recovered.end).unwrap();
    for (index, command) in rest.iter().enumerate() {
        journal.append(next + index as u64, command).unwrap();
    }
    journal.close().unwrap();
    let header = std::fs::read(dir.0.join(segment_name(next))).expect("a new segment");
    assert_eq!(u32::from_le_bytes([header[12], header[13], header[14], header[15]]), COMMAND_FORMAT_VERSION);
    let mut all = older;
    all.append(&mut rest);
    assert_eq!(state_hash(&recover(&dir.0).unwrap().engine), live_hash(&all));
    // An encoding this build does not know: refused, not misread.
    let future = TempDir::new("encoding-future");
    std::fs::write(future.0.join(segment_name(1)), older_segment(SEGMENT_VERSION, COMMAND_FORMAT_VERSION + 1, 1, 0, &all[..10]).0).unwrap();
    assert!(recover(&future.0).is_err());
}

/// A journal written before records carried their time (segment version
/// 2) recovers as it was, and the records appended after it go into a new
/// segment of the current version, each with the time it was stamped
/// with.
#[test]
fn an_older_segment_is_read_and_ended_and_new_records_carry_their_time() {
    use crossbook_journal::format::{SEGMENT_VERSION, segment_name};
    let dir = TempDir::new("segment-v2");
    let commands = generate(Workload::Mixed, 5, 8);
    // A version 2 segment: its header says so, its payloads are bare.
    std::fs::write(dir.0.join(segment_name(1)), version_2_segment(1, 0, &commands[..5]).0).unwrap();
    let recovered = recover(&dir.0).unwrap();
    assert_eq!(recovered.engine.seq(), 5);
    let mut journal = Journal::open(&dir.0, JournalConfig::default(), &recovered.end).unwrap();
    journal.stamp(1_764_000_000_123);
    for (index, command) in commands[5..].iter().enumerate() {
        journal.append(6 + index as u64, command).unwrap();
    }
    journal.close().unwrap();
    assert!(dir.0.join(segment_name(6)).exists(), "the new records start a segment of version {SEGMENT_VERSION}");
    let mut times = Vec::new();
    crossbook_journal::scan_timed_from(&dir.0, 1, |seq, time, payload, _| {
        crossbook_journal::format::split_payload(payload)?;
        times.push((seq, time));
        Ok(())
    })
    .unwrap();
    let want: Vec<(u64, u64)> = (1..=8).map(|seq| (seq, if seq <= 5 { 0 } else { 1_764_000_000_123 })).collect();
    assert_eq!(times, want);
    assert_eq!(state_hash(&recover(&dir.0).unwrap().engine), live_hash(&commands));
}

/// A version 2 journal that ends with a segment holding no record yet (a
/// roll-over, then a crash): the new records start a version 3 segment
/// under the same name.
#[test]
fn an_older_empty_last_segment_makes_way_for_a_current_one() {
    use crossbook_journal::format::{SEGMENT_VERSION, segment_name};
    let dir = TempDir::new("segment-v2-empty");
    let commands = generate(Workload::Mixed, 6, 6);
    let (bytes, chain) = version_2_segment(1, 0, &commands[..3]);
    std::fs::write(dir.0.join(segment_name(1)), &bytes).unwrap();
    std::fs::write(dir.0.join(segment_name(4)), version_2_segment(4, chain, &[]).0).unwrap();
    let recovered = recover(&dir.0).unwrap();
    assert_eq!(recovered.engine.seq(), 3);
    let mut journal = Journal::open(&dir.0, JournalConfig::default(), &recovered.end).unwrap();
    for (index, command) in commands[3..].iter().enumerate() {
        journal.append(4 + index as u64, command).unwrap();
    }
    journal.close().unwrap();
    let header = std::fs::read(dir.0.join(segment_name(4))).unwrap();
    assert_eq!(u32::from_le_bytes([header[8], header[9], header[10], header[11]]), SEGMENT_VERSION);
    assert_eq!(state_hash(&recover(&dir.0).unwrap().engine), live_hash(&commands));
}

/// A journal cut after record k (at a segment's start, in its middle, at
/// its end, past the end, with snapshots on both sides) recovers to the
/// state of the first k commands, and goes on from there: a replicated
/// node drops the commands the log does not hold this way.
#[test]
fn a_journal_cut_after_a_record_recovers_to_it_and_goes_on() {
    let commands = generate(Workload::Mixed, 5, 6_000);
    let dir = TempDir::new("truncate");
    journal_run(&dir.0, &commands, small_segments(Durability::Sync), 1_500);
    let segments: Vec<u64> = std::fs::read_dir(&dir.0)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix("segment-")?.strip_suffix(".xbj")?.parse().ok())
        .collect();
    let boundary = *segments.iter().filter(|s| **s > 1_000).min().expect("several segments");
    for cut in [boundary - 1, boundary, boundary + 7, 4_321, 5_999, 6_000, 9_000] {
        let copy = TempDir::new("truncate-copy");
        copy_dir(&dir.0, &copy.0);
        crossbook_journal::truncate_after(&copy.0, cut).unwrap();
        let kept = cut.min(6_000) as usize;
        let recovered = recover(&copy.0).unwrap();
        assert_eq!(recovered.engine.seq(), kept as u64, "cut after {cut}");
        assert_eq!(state_hash(&recovered.engine), live_hash(&commands[..kept]), "cut after {cut}");
        assert!(recovered.snapshot.is_none_or(|s| s <= kept as u64));
        // It goes on: the rest journaled again, the whole recovers.
        assert_eq!(journal_run(&copy.0, &commands, small_segments(Durability::Sync), 0), live_hash(&commands));
        assert_eq!(state_hash(&recover(&copy.0).unwrap().engine), live_hash(&commands), "cut after {cut}, then the rest");
    }
}
