//! Appending to the journal with group commit.
//!
//! The caller appends records to a pending buffer (`Journal::append`); one
//! writer thread takes everything pending, writes it with one `write` and
//! covers it with one `fdatasync`, then publishes the highest sequence
//! number that is now acknowledged. Whatever arrives while a sync runs goes
//! into the next batch: one sync covers every command that arrived while
//! the previous one ran.
//!
//! After a failed write or sync the journal refuses all further work: the
//! state of the file after an fsync error is unknown and retrying it cannot
//! be trusted (redb's `PreviousIo`, PostgreSQL's fsync lesson).

use crate::format::*;
use crate::read::JournalEnd;
use crossbook_engine::Command;
use crossbook_engine::codec::encode_command;
use crate::format::MAX_ANNEX;
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Nothing is acknowledged before the record holding it is on disk
    /// (`fdatasync`). Survives a power cut.
    Sync,
    /// Records are written at once and synced every `interval`: a command
    /// is acknowledged once the operating system has it. Survives a crash
    /// of the process, not of the machine.
    Async { interval: Duration },
}

#[derive(Clone, Debug)]
pub struct JournalConfig {
    pub durability: Durability,
    /// A new segment starts once the current one has reached this size.
    pub segment_bytes: u64,
    /// Called by the writer thread with the new acknowledged sequence number
    /// after each group commit, so that a caller can wait for new commands
    /// and acknowledgements in one place.
    pub on_ack: Option<AckHook>,
    /// Sync mode: hand each record to an idle writer as soon as it is
    /// appended, so its sync starts at once. Right for a caller that
    /// acknowledges command by command (`crossbook run`). A caller that
    /// acknowledges a batch only once all of it is durable (the server)
    /// turns it off and calls [`Journal::publish`] after the batch: a sync
    /// started on the batch's first record would make it wait for two.
    pub eager: bool,
}

/// See [`JournalConfig::on_ack`].
#[derive(Clone)]
pub struct AckHook(pub Arc<dyn Fn(u64) + Send + Sync>);

impl std::fmt::Debug for AckHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AckHook")
    }
}

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig { durability: Durability::Sync, segment_bytes: 64 << 20, on_ack: None, eager: true }
    }
}

/// Async mode's periodic `fdatasync`, on a thread of its own so that writes
/// (and so acknowledgements) never wait behind a sync.
struct Syncer {
    /// The segment being written (replaced when a new one starts). The
    /// syncer reads `Shared::written` under this lock, before it syncs, so
    /// what it then calls durable was written to the file it syncs; the
    /// writer holds the lock for a whole batch that moves to a new segment.
    file: Arc<Mutex<File>>,
    dirty: Arc<AtomicBool>,
    handle: JoinHandle<()>,
}

impl Syncer {
    /// Syncs at most `interval` after the previous sync *started* (a
    /// deadline, not a sleep after each sync, so a slow sync does not widen
    /// the window), or at once when asked (`Shared::sync_requested`).
    fn start(file: File, interval: Duration, shared: Arc<Shared>) -> std::io::Result<Syncer> {
        let file = Arc::new(Mutex::new(file));
        let dirty = Arc::new(AtomicBool::new(false));
        let (thread_file, thread_dirty) = (file.clone(), dirty.clone());
        let handle = std::thread::Builder::new().name("journal-syncer".into()).spawn(move || {
            let mut next = Instant::now() + interval;
            loop {
                {
                    let mut pending = shared.lock();
                    loop {
                        if pending.closed {
                            return;
                        }
                        let now = Instant::now();
                        if now >= next || shared.sync_requested.load(Ordering::Acquire) {
                            break;
                        }
                        pending = shared.syncer_wake.wait_timeout(pending, next - now).unwrap_or_else(|e| e.into_inner()).0;
                    }
                }
                let started = Instant::now();
                next = started + interval;
                shared.sync_requested.store(false, Ordering::Release);
                if !thread_dirty.swap(false, Ordering::AcqRel) {
                    // Nothing new: what was written is already durable.
                    shared.progress.notify_all();
                    continue;
                }
                // Every sync of the segment, the writer's too, happens under
                // this lock, and a failed one poisons the journal before the
                // lock is released: the descriptors are duplicates sharing
                // one error state, so a sync after a failed one can succeed
                // without the data being on disk, and must not count.
                let file = thread_file.lock().unwrap_or_else(|e| e.into_inner());
                if shared.poisoned.load(Ordering::Acquire) {
                    return;
                }
                let covers = shared.written.load(Ordering::Acquire);
                let oldest = shared.oldest_unsynced_nanos.swap(0, Ordering::AcqRel);
                let synced = file.sync_data();
                if synced.is_err() {
                    shared.poisoned.store(true, Ordering::Release);
                }
                drop(file);
                let mut pending = shared.lock();
                match synced {
                    Ok(()) => {
                        shared.durable.fetch_max(covers, Ordering::AcqRel);
                        pending.stats.record_sync(started.elapsed().as_nanos() as u64);
                        if oldest > 0 {
                            let exposed = shared.clock_nanos().saturating_sub(oldest);
                            pending.stats.write_to_sync_micros.saturating_record(exposed / 1000);
                        }
                    }
                    Err(e) => {
                        // An fsync error is never retried: poison the journal.
                        pending.error.get_or_insert(format!("fdatasync (async mode): {e}"));
                        shared.poisoned.store(true, Ordering::Release);
                        drop(pending);
                        shared.progress.notify_all();
                        return;
                    }
                }
                drop(pending);
                shared.progress.notify_all();
            }
        })?;
        Ok(Syncer { file, dirty, handle })
    }
}

/// Bound on commands waiting for the writer: `append` blocks beyond it.
const MAX_PENDING_COMMANDS: usize = 1 << 18;

#[derive(Debug)]
pub enum JournalError {
    Io { context: String, source: std::io::Error },
    /// An earlier write or sync failed; nothing more is accepted.
    Poisoned(String),
    /// Another process holds the data directory ([`lock_dir`]).
    InUse { dir: PathBuf, holder: String },
}

impl std::fmt::Display for JournalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JournalError::Io { context, source } => write!(f, "{context}: {source}"),
            JournalError::Poisoned(why) => write!(f, "a write or sync failed, and the journal takes nothing more: {why}"),
            JournalError::InUse { dir, holder } => write!(
                f,
                "the data directory {} is in use by another crossbook process ({holder}): one process at a time may write it (two would interleave their records and lose acknowledged commands)",
                dir.display()
            ),
        }
    }
}

impl std::error::Error for JournalError {}

/// A data directory held by this process alone: `LOCK` in it, locked
/// exclusively (`flock`) for as long as this value lives. The operating
/// system lets it go when the process ends, `kill -9` included, so a
/// crash never leaves it held.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
    _dir: File,
}

/// Takes `dir` (created if missing) for this process, or says who has it:
/// every process that writes a data directory (`serve`, `follow`, `run
/// --journal`, `recover`, `journal snapshot`) takes it first.
pub fn lock_dir(dir: &Path) -> Result<DirLock, JournalError> {
    if dir.exists() && !dir.is_dir() {
        return Err(io(format!("using {} as a data directory", dir.display()))(std::io::Error::new(std::io::ErrorKind::NotADirectory, "it is not a directory")));
    }
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    let path = dir.join("LOCK");
    // Made here (none was there): removed again if the lock is refused, so
    // that a refused process changes nothing.
    let made = std::fs::OpenOptions::new().create_new(true).write(true).open(&path).is_ok();
    // Read-only where it cannot be written (a copy or backup, another
    // user's file): flock needs no more.
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        // (Where neither works, why the first did not is the one told: a
        // directory that cannot be written, say.)
        .or_else(|first| File::open(&path).map_err(|_| first))
        .map_err(io(format!("opening {}", path.display())))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = std::io::Read::read_to_string(&mut file, &mut holder);
            let holder = match holder.trim() {
                "" => "its LOCK file is held".to_string(),
                pid => format!("process {pid}"),
            };
            return Err(JournalError::InUse { dir: dir.to_path_buf(), holder });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(io(format!("locking {}", path.display()))(e)),
    }
    // Then the directory itself: a lock on the LOCK file alone is lost
    // for the next process if someone deletes the file while it is held
    // (the next one makes a new file and locks that), and two writers
    // would then mix their records in one journal. (The file first, so
    // that of two processes starting at once one gets both. Where a
    // directory cannot be locked at all, a file system without flock on
    // directories, the file's lock is what there is, as before.)
    let directory = File::open(dir).map_err(io(format!("opening {}", dir.display())))?;
    if let Err(std::fs::TryLockError::WouldBlock) = directory.try_lock() {
        let _ = file.unlock();
        if made {
            let _ = std::fs::remove_file(&path);
        }
        return Err(JournalError::InUse { dir: dir.to_path_buf(), holder: "a process that holds the directory (its LOCK file was removed while it ran)".into() });
    }
    // Who holds it, for the message another process gets (if the file
    // can be written).
    if file.set_len(0).is_ok() {
        let _ = std::io::Write::write_all(&mut file, format!("{}\n", std::process::id()).as_bytes());
    }
    Ok(DirLock { _file: file, _dir: directory })
}

pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> JournalError {
    let context = context.into();
    move |source| JournalError::Io { context, source }
}

/// Group-commit figures.
#[derive(Clone, Debug)]
pub struct CommitStats {
    /// Batches written (one `write` each, after the segment's turn).
    pub writes: u64,
    /// Records written.
    pub records: u64,
    /// The most records one write carried.
    pub largest_group: u64,
    /// `fdatasync`s: one per group commit in sync mode, the periodic ones
    /// (and the last, at close) in async mode.
    pub syncs: u64,
    pub sync_nanos: u64,
    /// How long each of those `fdatasync`s took, in microseconds.
    pub sync_micros: Histogram<u64>,
    /// Async mode: for each periodic sync, how long the oldest write it
    /// covered had been acknowledged (written) before the sync completed,
    /// in microseconds: the window a power cut could take back.
    pub write_to_sync_micros: Histogram<u64>,
}

/// A histogram of durations in microseconds, from 1 µs to over an hour,
/// within 1%.
pub fn micros_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 1 << 32, 2).expect("valid histogram bounds")
}

impl Default for CommitStats {
    fn default() -> Self {
        CommitStats {
            writes: 0,
            records: 0,
            largest_group: 0,
            syncs: 0,
            sync_nanos: 0,
            sync_micros: micros_histogram(),
            write_to_sync_micros: micros_histogram(),
        }
    }
}

impl CommitStats {
    /// Records per write: per group commit, in sync mode.
    pub fn average_group(&self) -> f64 {
        if self.writes == 0 { 0.0 } else { self.records as f64 / self.writes as f64 }
    }
    fn record_sync(&mut self, nanos: u64) {
        self.syncs += 1;
        self.sync_nanos += nanos;
        self.sync_micros.saturating_record(nanos / 1000);
    }
    pub fn average_sync_micros(&self) -> f64 {
        if self.syncs == 0 { 0.0 } else { self.sync_nanos as f64 / self.syncs as f64 / 1000.0 }
    }
}

struct Pending {
    /// Commands handed over and not yet written, from `first_seq` on.
    commands: Vec<Command>,
    /// The annexes of some of them, by sequence number, in order.
    annexes: Vec<(u64, Vec<u8>)>,
    /// Their timestamps, as runs: (first sequence number, milliseconds
    /// since the Unix epoch) whenever the time changes.
    times: Vec<(u64, u64)>,
    first_seq: u64,
    last_seq: u64,
    closed: bool,
    error: Option<String>,
    stats: CommitStats,
}

struct Shared {
    pending: Mutex<Pending>,
    /// Signals the writer: something is pending, or closing.
    work: Condvar,
    /// Signals appenders and flushers: progress, room, or an error.
    progress: Condvar,
    /// Wakes the async syncer before its deadline (a sync asked for, or
    /// closing).
    syncer_wake: Condvar,
    sync_requested: AtomicBool,
    /// The highest sequence number acknowledged: synced (sync mode) or
    /// written (async mode).
    acked: AtomicU64,
    /// The highest sequence number written to a segment.
    written: AtomicU64,
    /// The highest sequence number a completed `fdatasync` covers: what a
    /// power cut cannot take back. Equal to `acked` in sync mode.
    durable: AtomicU64,
    /// Async mode: when (`clock_nanos`) the oldest write not yet covered
    /// by a sync was made; 0 when there is none.
    oldest_unsynced_nanos: AtomicU64,
    clock: Instant,
    poisoned: AtomicBool,
    /// The writer is idle, waiting for records: hand them over at once.
    writer_idle: AtomicBool,
    chains: ChainRing,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        // A panic in the writer thread poisons the mutex; the state inside
        // is still consistent (plain buffers and counters).
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Nanoseconds since the journal opened, never 0.
    fn clock_nanos(&self) -> u64 {
        self.clock.elapsed().as_nanos() as u64 + 1
    }

    /// Waits until `counter` (acknowledged or durable) reaches `target`,
    /// `timeout` passes, or (`until_closed`) the journal closes; returns
    /// its value then, or the journal's failure.
    fn wait_for(&self, counter: &AtomicU64, target: u64, timeout: Duration, until_closed: bool) -> Result<u64, JournalError> {
        let deadline = Instant::now() + timeout;
        let mut pending = self.lock();
        loop {
            if let Some(why) = &pending.error {
                return Err(JournalError::Poisoned(why.clone()));
            }
            let reached = counter.load(Ordering::Acquire);
            let now = Instant::now();
            if reached >= target || now >= deadline || (until_closed && pending.closed) {
                return Ok(reached);
            }
            pending = self.progress.wait_timeout(pending, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    fn error(&self) -> Option<JournalError> {
        if self.poisoned.load(Ordering::Acquire) {
            let why = self.lock().error.clone().unwrap_or_default();
            return Some(JournalError::Poisoned(why));
        }
        None
    }
}

/// Records whose checksums stay readable after they are written: enough
/// for a snapshot offered now to find the checksum of its record once the
/// journal has made it durable (the writer takes at most
/// `MAX_PENDING_COMMANDS + STAGING_COMMANDS` records at a time).
const CHAIN_RING: u64 = 1 << 20;

/// The chained checksums of the most recent `CHAIN_RING` records, by
/// sequence number, written by the writer thread as it encodes them and
/// read by whoever writes a snapshot (which names the checksum of the
/// record it continues). A seqlock in spirit: `encoding` is raised before
/// slots are overwritten and `encoded` after, so a reader that saw a slot
/// can tell whether it was overwritten meanwhile.
struct ChainRing {
    crcs: Box<[AtomicU32]>,
    encoding: AtomicU64,
    encoded: AtomicU64,
    /// The record the journal was opened after: nothing before it is here.
    floor: u64,
}

impl ChainRing {
    fn new(last_seq: u64, last_crc: u32) -> ChainRing {
        let crcs: Box<[AtomicU32]> = (0..CHAIN_RING).map(|_| AtomicU32::new(0)).collect();
        crcs[(last_seq % CHAIN_RING) as usize].store(last_crc, Ordering::SeqCst);
        ChainRing { crcs, encoding: AtomicU64::new(last_seq), encoded: AtomicU64::new(last_seq), floor: last_seq }
    }

    fn get(&self, seq: u64) -> Option<u32> {
        if seq < self.floor || seq > self.encoded.load(Ordering::SeqCst) {
            return None;
        }
        let crc = self.crcs[(seq % CHAIN_RING) as usize].load(Ordering::SeqCst);
        if self.encoding.load(Ordering::SeqCst) >= seq + CHAIN_RING {
            return None;
        }
        Some(crc)
    }
}

/// A handle on a journal's progress for other threads (a snapshot writer):
/// what is durable, and the checksum of a record.
#[derive(Clone)]
pub struct DurableWatch {
    shared: Arc<Shared>,
}

impl DurableWatch {
    /// The highest sequence number a completed `fdatasync` covers.
    pub fn durable(&self) -> u64 {
        self.shared.durable.load(Ordering::Acquire)
    }

    /// Waits until `seq` is durable or `timeout` passes; returns what is
    /// durable then. An error if the journal failed (it never will be).
    pub fn wait_durable(&self, seq: u64, timeout: Duration) -> Result<u64, JournalError> {
        self.shared.wait_for(&self.shared.durable, seq, timeout, true)
    }

    /// The chained checksum of record `seq`, if it has been written and is
    /// still among the last `CHAIN_RING` written (or is the record the
    /// journal was opened after).
    pub fn chain_at(&self, seq: u64) -> Option<u32> {
        self.shared.chains.get(seq)
    }
}

pub struct Journal {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
    appended: u64,
    /// Commands not yet handed to the writer, and the sequence number of
    /// the first. The writer thread encodes and checksums them: the
    /// engine's thread only copies each command once.
    staging: Vec<Command>,
    staging_annexes: Vec<(u64, Vec<u8>)>,
    staging_times: Vec<(u64, u64)>,
    staging_first: u64,
    /// The timestamp of the records appended from now on
    /// ([`Journal::stamp`]), and whether it is staged yet.
    time_ms: u64,
    time_staged: bool,
    /// Publish whenever the writer is idle (sync mode).
    eager: bool,
}

/// Staged commands past which `append` hands them to the writer even while
/// it is busy.
const STAGING_COMMANDS: usize = 8192;

/// Reserves the blocks of `length` bytes of `file` from `offset` without
/// changing its size (`fallocate` with `FALLOC_FL_KEEP_SIZE`): appends into
/// that range then cannot fail for want of space. The FIX session stores
/// keep a reserve so that the Logout telling a counterparty why the venue
/// stops can be recorded on a disk that is full.
pub fn reserve_blocks(file: &File, offset: u64, length: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open file descriptor, a non-negative range.
    let failed = unsafe { libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, offset as libc::off_t, length as libc::off_t) };
    if failed != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Syncs a directory so that a created, renamed or removed entry in it is
/// durable.
pub fn sync_dir(dir: &Path) -> Result<(), JournalError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(format!("syncing directory {}", dir.display())))
}

struct Segment {
    file: File,
    path: PathBuf,
    /// Bytes of header and records.
    size: u64,
    /// Length of the file: past `size` it holds zeros written ahead.
    allocated: u64,
}

/// Space reserved ahead of the records at a time (`posix_fallocate`: the
/// file system allocates the blocks, which read as zeros; nothing is
/// written). A segment is extended, and the extension synced, before the
/// records reach its end, so that the `fdatasync` of a group commit never
/// changes the file's size or allocates blocks.
pub const PREALLOCATE_BYTES: u64 = 8 << 20;

/// Whether a segment's header names the current segment format and
/// command encoding (recovery has checked it; a header it cut off as torn
/// is taken as current, as before). Records are appended only to such a
/// segment, so an older reader meets no record it cannot decode in a
/// segment whose header it accepts.
fn segment_is_current(path: &Path) -> Result<bool, JournalError> {
    use std::io::Read;
    let mut header = [0u8; SEGMENT_HEADER_BYTES];
    let mut file = File::open(path).map_err(io(format!("reading the header of {}", path.display())))?;
    if file.read_exact(&mut header).is_err() {
        return Ok(true);
    }
    Ok(parse_segment_header(&header)
        .map_or(true, |h| h.version == SEGMENT_VERSION && h.format == crossbook_engine::codec::COMMAND_FORMAT_VERSION))
}

fn create_segment(dir: &Path, first_seq: u64, chain_seed: u32) -> Result<Segment, JournalError> {
    let path = dir.join(segment_name(first_seq));
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(io(format!("creating {}", path.display())))?;
    file.write_all(&segment_header(first_seq, chain_seed)).map_err(io(format!("writing {}", path.display())))?;
    let size = SEGMENT_HEADER_BYTES as u64;
    Ok(Segment { file, path, size, allocated: size })
}

impl Segment {
    /// Whether `extra` more bytes need a new reservation (and so a sync).
    fn needs_reserve(&self, extra: u64) -> bool {
        self.size + extra > self.allocated
    }

    /// Makes sure `extra` more bytes fit in the space reserved: reserves
    /// (`posix_fallocate`) and syncs the next `PREALLOCATE_BYTES` when they
    /// would not. The caller holds the async syncer's lock (the sync here
    /// shares the file's error state with the syncer's, see `Syncer`), and
    /// a failed sync poisons the journal before that lock is released.
    fn reserve(&mut self, extra: u64, poisoned: &AtomicBool) -> Result<(), JournalError> {
        use std::os::fd::AsRawFd;
        if self.size + extra <= self.allocated {
            return Ok(());
        }
        let target = (self.size + extra).div_ceil(PREALLOCATE_BYTES) * PREALLOCATE_BYTES + PREALLOCATE_BYTES;
        let length = (target - self.allocated) as libc::off_t;
        // SAFETY: a valid open file descriptor, a non-negative range.
        let failed = unsafe { libc::posix_fallocate(self.file.as_raw_fd(), self.allocated as libc::off_t, length) };
        if failed != 0 {
            return Err(JournalError::Io { context: format!("reserving space in {}", self.path.display()), source: std::io::Error::from_raw_os_error(failed) });
        }
        if let Err(e) = self.file.sync_data() {
            poisoned.store(true, Ordering::Release);
            return Err(io(format!("fdatasync {}", self.path.display()))(e));
        }
        self.allocated = target;
        Ok(())
    }

    /// Cuts the zeros written ahead (a segment that is done).
    fn trim(&mut self) -> Result<(), JournalError> {
        if self.allocated > self.size {
            self.file.set_len(self.size).map_err(io(format!("trimming {}", self.path.display())))?;
            self.allocated = self.size;
        }
        Ok(())
    }
}

impl Journal {
    /// Opens the journal in `dir` for appending after `end` (what recovery
    /// found; a torn tail must already have been truncated).
    pub fn open(dir: &Path, config: JournalConfig, end: &JournalEnd) -> Result<Journal, JournalError> {
        let segment = match &end.tail {
            Some((path, valid_len)) => {
                let mut file = OpenOptions::new().write(true).open(path).map_err(io(format!("opening {}", path.display())))?;
                // After a crash of the process in async mode, the records
                // recovery read may still be only in the page cache: sync
                // them before anything (a snapshot) is built on them as
                // durable. (Earlier segments were synced when they ended.)
                if file.metadata().is_ok_and(|m| m.is_file()) {
                    file.sync_data().map_err(io(format!("fdatasync {}", path.display())))?;
                    // And its name: a crash between a segment's creation
                    // and the sync of its directory leaves it unsynced.
                    sync_dir(dir)?;
                }
                file.seek(SeekFrom::Start(*valid_len)).map_err(io(format!("seeking in {}", path.display())))?;
                let allocated = file.metadata().map_err(io(format!("reading {}", path.display())))?.len().max(*valid_len);
                let mut tail = Segment { file, path: path.clone(), size: *valid_len, allocated };
                if !segment_is_current(path)? {
                    // A segment of an older format is not appended to: it
                    // ends here, and the records go on in a new one. One
                    // with no record yet holds the new one's name: it goes.
                    tail.trim()?;
                    tail.file.sync_all().map_err(io(format!("syncing {}", path.display())))?;
                    if *valid_len <= SEGMENT_HEADER_BYTES as u64 {
                        drop(tail);
                        std::fs::remove_file(path).map_err(io(format!("removing {}", path.display())))?;
                        sync_dir(dir)?;
                    }
                    let segment = create_segment(dir, end.last_seq + 1, end.last_crc)?;
                    segment.file.sync_all().map_err(io(format!("syncing {}", segment.path.display())))?;
                    sync_dir(dir)?;
                    segment
                } else {
                    tail
                }
            }
            None => {
                let segment = create_segment(dir, end.last_seq + 1, end.last_crc)?;
                segment.file.sync_all().map_err(io(format!("syncing {}", segment.path.display())))?;
                sync_dir(dir)?;
                segment
            }
        };
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending {
                commands: Vec::with_capacity(STAGING_COMMANDS),
                annexes: Vec::new(),
                times: Vec::new(),
                first_seq: 0,
                last_seq: 0,
                closed: false,
                error: None,
                stats: CommitStats::default(),
            }),
            work: Condvar::new(),
            progress: Condvar::new(),
            syncer_wake: Condvar::new(),
            sync_requested: AtomicBool::new(false),
            acked: AtomicU64::new(end.last_seq),
            written: AtomicU64::new(end.last_seq),
            durable: AtomicU64::new(end.last_seq),
            oldest_unsynced_nanos: AtomicU64::new(0),
            clock: Instant::now(),
            poisoned: AtomicBool::new(false),
            writer_idle: AtomicBool::new(false),
            chains: ChainRing::new(end.last_seq, end.last_crc),
        });
        let eager = config.eager && config.durability == Durability::Sync;
        let syncer = match config.durability {
            Durability::Async { interval } => {
                let file = segment.file.try_clone().map_err(io(format!("cloning {}", segment.path.display())))?;
                Some(Syncer::start(file, interval, shared.clone()).map_err(io("starting the journal syncer thread"))?)
            }
            Durability::Sync => None,
        };
        let writer = Writer { shared: shared.clone(), dir: dir.to_path_buf(), config, segment, last_crc: end.last_crc, dirty: false, syncer };
        let handle = std::thread::Builder::new()
            .name("journal-writer".into())
            .spawn(move || writer.run())
            .map_err(io("starting the journal writer thread"))?;
        Ok(Journal {
            shared,
            writer: Some(handle),
            appended: end.last_seq,
            staging: Vec::with_capacity(STAGING_COMMANDS),
            staging_annexes: Vec::new(),
            staging_times: Vec::new(),
            staging_first: 0,
            time_ms: 0,
            time_staged: false,
            eager,
        })
    }

    fn check(&self) -> Result<(), JournalError> {
        match self.shared.error() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Queues the record of command `seq` (which must follow the last one).
    /// Records are handed to the writer thread at once when it is idle, and
    /// otherwise in batches (see [`Journal::publish`]).
    pub fn append(&mut self, seq: u64, command: &Command) -> Result<(), JournalError> {
        self.append_with(seq, command, None)
    }

    /// Sets the timestamp (milliseconds since the Unix epoch) written with
    /// the records appended from now on: the sequencer's clock, read once
    /// per batch, so that what is derived from the journal (market data's
    /// trade times and candles) is the same after a restart. 0 (the
    /// default) means no time.
    pub fn stamp(&mut self, time_ms: u64) {
        if time_ms != self.time_ms {
            self.time_ms = time_ms;
            self.time_staged = false;
        }
    }

    /// [`Journal::append`] with an annex: up to [`MAX_ANNEX`] bytes that a
    /// gateway keeps with the command (its client's own id for the order,
    /// say), written in the same record and returned by recovery.
    pub fn append_with(&mut self, seq: u64, command: &Command, annex: Option<&[u8]>) -> Result<(), JournalError> {
        self.check()?;
        if !self.time_staged {
            self.staging_times.push((seq, self.time_ms));
            self.time_staged = true;
        }
        if let Some(annex) = annex {
            assert!(!annex.is_empty() && annex.len() <= MAX_ANNEX, "annex of {} bytes", annex.len());
            self.staging_annexes.push((seq, annex.to_vec()));
        }
        assert_eq!(seq, self.appended + 1, "journal records must be appended in sequence");
        if self.staging.is_empty() {
            self.staging_first = seq;
        }
        self.staging.push(*command);
        self.appended = seq;
        // Sync mode hands records over as soon as the writer is free, so a
        // sync starts as early as possible; async mode batches them, since
        // its writes are cheap and waking the writer per command is not.
        let eager = self.eager && self.shared.writer_idle.load(Ordering::Acquire);
        if self.staging.len() >= STAGING_COMMANDS || eager {
            self.publish()?;
        }
        Ok(())
    }

    /// Hands every staged record to the writer thread.
    pub fn publish(&mut self) -> Result<(), JournalError> {
        if self.staging.is_empty() {
            return Ok(());
        }
        let mut pending = self.shared.lock();
        while pending.commands.len() >= MAX_PENDING_COMMANDS && pending.error.is_none() {
            pending = self.shared.progress.wait(pending).unwrap_or_else(|e| e.into_inner());
        }
        if let Some(why) = &pending.error {
            return Err(JournalError::Poisoned(why.clone()));
        }
        pending.annexes.append(&mut self.staging_annexes);
        pending.times.append(&mut self.staging_times);
        // The next batch starts with its time again (the writer may take
        // this one alone).
        self.time_staged = false;
        if pending.commands.is_empty() {
            pending.first_seq = self.staging_first;
            // Hand the buffer over whole rather than copying it.
            std::mem::swap(&mut pending.commands, &mut self.staging);
        } else {
            pending.commands.extend_from_slice(&self.staging);
        }
        pending.last_seq = self.appended;
        drop(pending);
        self.staging.clear();
        self.shared.work.notify_one();
        Ok(())
    }

    /// The highest sequence number acknowledged: synced (sync mode) or
    /// written (async mode).
    pub fn acked(&self) -> u64 {
        self.shared.acked.load(Ordering::Acquire)
    }

    /// Why the journal refuses work, once a write or sync has failed.
    pub fn failure(&self) -> Option<JournalError> {
        self.shared.error()
    }

    /// The highest sequence number appended.
    pub fn appended(&self) -> u64 {
        self.appended
    }

    /// The highest sequence number a completed `fdatasync` covers: equal
    /// to [`Journal::acked`] in sync mode, behind it in async mode.
    pub fn durable(&self) -> u64 {
        self.shared.durable.load(Ordering::Acquire)
    }

    /// A handle for other threads: durability and record checksums.
    pub fn watch(&self) -> DurableWatch {
        DurableWatch { shared: self.shared.clone() }
    }

    /// Waits until everything appended is durable (in async mode, asks for
    /// a sync now rather than at the next interval); returns the sequence
    /// number.
    pub fn sync(&mut self) -> Result<u64, JournalError> {
        let target = self.flush()?;
        while self.shared.durable.load(Ordering::Acquire) < target {
            {
                // Asked under the lock the syncer checks it under.
                let _pending = self.shared.lock();
                self.shared.sync_requested.store(true, Ordering::Release);
                self.shared.syncer_wake.notify_all();
            }
            self.shared.wait_for(&self.shared.durable, target, Duration::from_millis(100), false)?;
        }
        Ok(target)
    }

    /// Waits until everything appended is acknowledged.
    pub fn flush(&mut self) -> Result<u64, JournalError> {
        self.publish()?;
        let target = self.appended;
        while self.shared.wait_for(&self.shared.acked, target, Duration::from_secs(3600), false)? < target {}
        Ok(target)
    }

    /// Waits until `target` is acknowledged or `timeout` passes; returns
    /// the acknowledged sequence number.
    pub fn wait_acked(&self, target: u64, timeout: Duration) -> Result<u64, JournalError> {
        self.shared.wait_for(&self.shared.acked, target, timeout, false)
    }

    /// The figures so far (a copy).
    pub fn stats(&self) -> CommitStats {
        self.shared.lock().stats.clone()
    }

    /// Flushes, syncs and stops the writer.
    pub fn close(mut self) -> Result<CommitStats, JournalError> {
        let result = self.flush();
        let stats = self.stop();
        // The last sync happens as the writer stops: its failure counts.
        result?;
        match self.shared.error() {
            Some(error) => Err(error),
            None => Ok(stats),
        }
    }

    fn stop(&mut self) -> CommitStats {
        let _ = self.publish();
        self.shared.lock().closed = true;
        self.shared.work.notify_one();
        self.shared.syncer_wake.notify_all();
        if let Some(handle) = self.writer.take() {
            let _ = handle.join();
        }
        std::mem::take(&mut self.shared.lock().stats)
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Writer {
    shared: Arc<Shared>,
    dir: PathBuf,
    config: JournalConfig,
    segment: Segment,
    last_crc: u32,
    /// Written but not yet synced.
    dirty: bool,
    /// Async mode: the thread that syncs every interval.
    syncer: Option<Syncer>,
}

impl Writer {
    fn run(mut self) {
        let mut batch: Vec<Command> = Vec::with_capacity(STAGING_COMMANDS);
        let mut annexes: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut times: Vec<(u64, u64)> = Vec::new();
        let mut encoded: Vec<u8> = Vec::with_capacity(1 << 16);
        loop {
            let (first_seq, last_seq, records, closing) = {
                let mut pending = self.shared.lock();
                while pending.commands.is_empty() && !pending.closed {
                    self.shared.writer_idle.store(true, Ordering::Release);
                    pending = self.shared.work.wait(pending).unwrap_or_else(|e| e.into_inner());
                }
                self.shared.writer_idle.store(false, Ordering::Release);
                std::mem::swap(&mut batch, &mut pending.commands);
                std::mem::swap(&mut annexes, &mut pending.annexes);
                std::mem::swap(&mut times, &mut pending.times);
                (pending.first_seq, pending.last_seq, batch.len() as u64, pending.closed)
            };
            self.shared.progress.notify_all();
            if self.shared.poisoned.load(Ordering::Acquire) {
                // The syncer failed: nothing more is written or acknowledged.
                self.shared.progress.notify_all();
                return;
            }
            let result = if batch.is_empty() {
                Ok(None)
            } else {
                self.encode(&batch, &annexes, &times, first_seq, &mut encoded);
                self.commit(&encoded, last_seq)
            };
            // A clean close leaves no zeros ahead of the end, and everything
            // synced; a failure there fails the close like any other. (That
            // last sync is not counted among the group commits.)
            let result = result.and_then(|synced| if closing { self.close_segment().map(|_| synced) } else { Ok(synced) });
            let result = result.and_then(|synced| match self.shared.error() {
                // The syncer failed while this batch was written.
                Some(error) => Err(error),
                None => Ok(synced),
            });
            match result {
                Ok(sync_nanos) => {
                    let mut pending = self.shared.lock();
                    if !batch.is_empty() {
                        self.shared.acked.store(last_seq, Ordering::Release);
                        if let Some(hook) = &self.config.on_ack {
                            (hook.0)(last_seq);
                        }
                        pending.stats.writes += 1;
                        pending.stats.records += records;
                        pending.stats.largest_group = pending.stats.largest_group.max(records);
                    }
                    if let Some(nanos) = sync_nanos {
                        pending.stats.record_sync(nanos);
                    }
                }
                Err(error) => {
                    let mut pending = self.shared.lock();
                    if pending.error.is_none() {
                        pending.error = Some(error.to_string());
                    }
                    self.shared.poisoned.store(true, Ordering::Release);
                    drop(pending);
                    self.shared.progress.notify_all();
                    self.shared.syncer_wake.notify_all();
                    return;
                }
            }
            self.shared.progress.notify_all();
            batch.clear();
            annexes.clear();
            times.clear();
            if closing && self.shared.lock().commands.is_empty() {
                if let Some(syncer) = self.syncer.take() {
                    self.shared.syncer_wake.notify_all();
                    let _ = syncer.handle.join();
                }
                return;
            }
        }
    }

    /// Trims the zeros written ahead and syncs what is not synced yet (under
    /// the syncer's lock, in async mode: see `Syncer`).
    fn close_segment(&mut self) -> Result<Option<u64>, JournalError> {
        let syncer_file = self.syncer.as_ref().map(|syncer| syncer.file.clone());
        let _guard = syncer_file.as_ref().map(|file| file.lock().unwrap_or_else(|e| e.into_inner()));
        if self.segment.allocated > self.segment.size {
            self.segment.trim()?;
            self.dirty = true;
        }
        let synced = self.sync_if_dirty()?;
        self.shared.durable.fetch_max(self.shared.written.load(Ordering::Acquire), Ordering::AcqRel);
        Ok(synced)
    }

    /// Encodes a batch of commands as chained records, and leaves each
    /// record's checksum in the ring ([`DurableWatch::chain_at`]).
    fn encode(&self, batch: &[Command], annexes: &[(u64, Vec<u8>)], times: &[(u64, u64)], first_seq: u64, out: &mut Vec<u8>) {
        out.clear();
        let chains = &self.shared.chains;
        chains.encoding.store(first_seq + batch.len() as u64 - 1, Ordering::SeqCst);
        let mut chain = self.last_crc;
        let mut annexes = annexes.iter().peekable();
        let mut times = times.iter().peekable();
        let mut time_ms = 0u64;
        for (offset, command) in batch.iter().enumerate() {
            let seq = first_seq + offset as u64;
            let start = out.len();
            out.extend_from_slice(&[0u8; 4]);
            out.extend_from_slice(&seq.to_le_bytes());
            while let Some((_, time)) = times.next_if(|(from, _)| *from <= seq) {
                time_ms = *time;
            }
            out.extend_from_slice(&time_ms.to_le_bytes());
            encode_command(command, out);
            if let Some((_, annex)) = annexes.next_if(|(at, _)| *at == seq) {
                out.push(annex.len() as u8);
                out.extend_from_slice(annex);
            }
            let len = (out.len() - start - 12) as u32;
            out[start..start + 4].copy_from_slice(&len.to_le_bytes());
            chain = seal_record(out, start, chain);
            chains.crcs[(seq % CHAIN_RING) as usize].store(chain, Ordering::SeqCst);
        }
        chains.encoded.store(first_seq + batch.len() as u64 - 1, Ordering::SeqCst);
    }

    /// Writes whole records ending with record `last_seq`.
    fn write_chunk(&mut self, chunk: &[u8], last_seq: u64) -> Result<(), JournalError> {
        if chunk.is_empty() {
            return Ok(());
        }
        self.segment.reserve(chunk.len() as u64, &self.shared.poisoned)?;
        self.segment.file.write_all(chunk).map_err(io(format!("writing {}", self.segment.path.display())))?;
        self.segment.size += chunk.len() as u64;
        self.last_crc = u32_at(chunk, chunk.len() - 4);
        self.dirty = true;
        self.shared.written.store(last_seq, Ordering::Release);
        if let Some(syncer) = &self.syncer {
            let _ = self.shared.oldest_unsynced_nanos.compare_exchange(0, self.shared.clock_nanos(), Ordering::AcqRel, Ordering::Acquire);
            syncer.dirty.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Syncs the segment if anything was written since its last sync (the
    /// caller publishes what is then durable). A failure poisons the
    /// journal at once, while the caller still holds the syncer's lock.
    fn sync_if_dirty(&mut self) -> Result<Option<u64>, JournalError> {
        if !self.dirty {
            return Ok(None);
        }
        let started = Instant::now();
        if let Err(e) = self.segment.file.sync_data() {
            self.shared.poisoned.store(true, Ordering::Release);
            return Err(io(format!("fdatasync {}", self.segment.path.display()))(e));
        }
        self.dirty = false;
        Ok(Some(started.elapsed().as_nanos() as u64))
    }

    /// Writes one batch of whole records (the last one `last_seq`),
    /// starting a new segment at a record boundary whenever the current one
    /// is full, and, in sync mode, syncs it.
    fn commit(&mut self, batch: &[u8], last_seq: u64) -> Result<Option<u64>, JournalError> {
        // Async mode: while this batch moves to a new segment, the syncer
        // must not sync the old file on the strength of records written to
        // the new one; it waits for the lock (once per segment).
        let syncer_file = self.syncer.as_ref().map(|syncer| syncer.file.clone());
        let crossing = self.segment.size + batch.len() as u64 >= self.config.segment_bytes;
        // And while a reservation syncs the file: a failed sync there must
        // poison the journal before the syncer can sync again and count
        // records that failed sync lost.
        let reserving = self.segment.needs_reserve(batch.len() as u64);
        let mut syncer_guard = match &syncer_file {
            Some(file) if crossing || reserving => Some(file.lock().unwrap_or_else(|e| e.into_inner())),
            _ => None,
        };
        let mut new_segment = false;
        let mut written = 0usize;
        let mut at = 0usize;
        while at < batch.len() {
            if self.segment.size + (at - written) as u64 >= self.config.segment_bytes
                && self.segment.size + (at - written) as u64 > SEGMENT_HEADER_BYTES as u64
            {
                // Close this segment at the record boundary `at`.
                let next_seq = u64_at(batch, at + 4);
                self.write_chunk(&batch[written..at], next_seq - 1)?;
                written = at;
                self.segment.trim()?;
                self.dirty = true;
                self.sync_if_dirty()?;
                if new_segment {
                    // A segment begun in this batch: its name is synced
                    // before its records count as durable.
                    sync_dir(&self.dir).inspect_err(|_| self.shared.poisoned.store(true, Ordering::Release))?;
                }
                // The ended segment's records are durable (its name was
                // synced when it began, or just now).
                self.shared.durable.fetch_max(next_seq - 1, Ordering::AcqRel);
                self.segment = create_segment(&self.dir, next_seq, self.last_crc)?;
                self.dirty = true;
                new_segment = true;
            }
            at += RECORD_OVERHEAD + u32_at(batch, at) as usize;
        }
        self.write_chunk(&batch[written..], last_seq)?;
        match self.config.durability {
            Durability::Sync => {
                let synced = self.sync_if_dirty()?;
                if new_segment {
                    sync_dir(&self.dir).inspect_err(|_| self.shared.poisoned.store(true, Ordering::Release))?;
                }
                // Durable only once a new segment's name is too.
                self.shared.durable.fetch_max(last_seq, Ordering::AcqRel);
                Ok(synced)
            }
            Durability::Async { .. } => {
                if new_segment {
                    self.dirty = true;
                    self.sync_if_dirty()?;
                    sync_dir(&self.dir).inspect_err(|_| self.shared.poisoned.store(true, Ordering::Release))?;
                    self.shared.durable.fetch_max(last_seq, Ordering::AcqRel);
                    let clone = self.segment.file.try_clone().map_err(io(format!("cloning {}", self.segment.path.display())))?;
                    if let Some(guard) = syncer_guard.as_mut() {
                        **guard = clone;
                    }
                }
                drop(syncer_guard);
                Ok(None)
            }
        }
    }
}
