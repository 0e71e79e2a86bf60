//! A FIX session's store: one append-only file per counterparty CompID
//! under `<data>/fix/`, holding what the session needs after a restart
//! (both sequence numbers, the application messages it may have to send
//! again, the account it is bound to and how far into the journal its
//! execution reports go).
//!
//! The file: a 16-byte header (`XBFIXSTR`, format version 2, reserved),
//! then records framed exactly as the journal's (`crossbook_journal::
//! format`: `len u32 | seq u64 | payload | crc32c u32`, little-endian,
//! numbered from 1, each checksum chained from the one before), whose
//! payload is a kind byte and its body. It is read with the journal's own
//! reader (`crossbook_journal::read_records`), so a torn last record is cut
//! off and a bad record followed by good ones is corruption that stops the
//! server, by the same rules as the journal (docs/fix.md). A store of the
//! first format (no header, unchained records) is converted on open.
//!
//! Every message sent adds a record, so a store grows for as long as its
//! session lives, while what it says (two numbers, the account, the kept
//! messages) stays bounded. Once a store is past [`COMPACT_MIN`] bytes and
//! twice its size when last written compactly, it is written again with
//! only what it says (a new file, synced, renamed over the old one), on
//! open and while its session runs: the disk it takes, and what a restart
//! reads, stay bounded by what it keeps.

use crossbook_fix::session::StoreOp;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const RESET: u8 = 1;
const SENT: u8 = 2;
const RECEIVED: u8 = 3;
const BOUND: u8 = 4;
/// The journal ends before the reports the store holds (an async-mode power
/// cut took those commands back): reports go on from this engine sequence
/// number, so the commands that take their place are reported too.
const REWIND: u8 = 5;
/// Largest record body (a stored message plus a little).
const MAX_BODY: usize = 1 << 20;
/// Largest record payload: the kind byte and the body.
const MAX_PAYLOAD: usize = MAX_BODY + 1;
const MAGIC: &[u8; 8] = b"XBFIXSTR";
const VERSION: u32 = 2;
const HEADER_BYTES: usize = 16;

/// Why a store could not be read or written.
#[derive(Debug)]
pub enum StoreError {
    /// The file system refused (`doing` says what was being done).
    Io { path: PathBuf, doing: &'static str, source: std::io::Error },
    /// A damaged record with valid ones after it (or out of order, or one
    /// whose content makes no sense): not a torn tail, so something
    /// overwrote the file; the server refuses to guess.
    Damaged { path: PathBuf, offset: usize, what: String },
    /// A header this build does not read.
    UnknownFormat { path: PathBuf, version: u32 },
    /// A record whose checksum holds but whose content makes no sense.
    BadRecord { path: PathBuf, offset: usize, what: &'static str },
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Io { path, doing, source } => write!(f, "{doing} {}: {source}", path.display()),
            StoreError::Damaged { path, offset, what } => write!(f, "{}: damaged record at byte {offset} ({what}): refusing to guess", path.display()),
            StoreError::UnknownFormat { path, version } => write!(f, "{}: store format version {version}; this build reads version {VERSION}", path.display()),
            StoreError::BadRecord { path, offset, what } => write!(f, "{}: record at byte {offset}: {what}", path.display()),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

fn io(path: &Path, doing: &'static str) -> impl FnOnce(std::io::Error) -> StoreError {
    let path = path.to_path_buf();
    move |source| StoreError::Io { path, doing, source }
}

/// What a store file says, read back.
#[derive(Debug, Default)]
pub struct Restored {
    pub next_in: u64,
    pub next_out: u64,
    pub stored: crossbook_fix::session::Kept,
    /// The account the session is bound to.
    pub account: Option<u64>,
    /// The last engine sequence number whose reports are in the store.
    pub through_seq: u64,
}

/// A store past this many bytes, and twice as large as when it was last
/// written compactly, is written again with only what it says.
const COMPACT_MIN: u64 = 32 << 20;

pub struct Store {
    file: File,
    path: PathBuf,
    /// Compacted when its length reaches this (see [`COMPACT_MIN`]).
    compact_at: u64,
    /// Records not yet written (one write per batch of messages).
    pending: Vec<u8>,
    /// How much of what was written is on disk, shared with the writer of
    /// the session's connection ([`Durable`]).
    durable: Arc<Durable>,
    /// The file's length, and how far its blocks are reserved
    /// (`RESERVE_BYTES` ahead: a full disk still takes the last Logout).
    length: u64,
    reserved: u64,
    /// Bound to an account (a Logon succeeded once): only such stores keep
    /// a reserve, so that failed Logons cost no disk beyond their records.
    bound: bool,
    /// The next record's number, and the last record's checksum.
    next_seq: u64,
    chain: u32,
}

/// Bytes reserved past the end of a store (without changing its size), so
/// that the Logout telling a counterparty why the venue stops can be
/// recorded, and so sent, when the disk is full.
const RESERVE_BYTES: u64 = 64 << 10;

/// What of a store is on disk, shared between the store (written under
/// the gateway's lock) and the writer thread of its session's connection,
/// which makes it durable before it sends a message that needs it: the
/// gateway's lock is never held across an `fdatasync`, so the other
/// sessions' messages, and this one's incoming orders, do not wait for a
/// disk. Writes are counted: each [`Store::flush`] that hands bytes to the
/// operating system is one more; a message sent after the flush that
/// recorded it needs that many on disk, and one `fdatasync` makes every
/// write done before it starts durable, so the writes of several batches,
/// and of messages to several counterparties' stores, share syncs.
pub struct Durable {
    /// Writes handed to the operating system so far.
    written: AtomicU64,
    /// Writes known to be on disk.
    synced: AtomicU64,
    /// Set once a sync failed (the why is in `file`): read without the
    /// lock, which a writer holds across its `fdatasync`.
    failed: AtomicBool,
    file: Mutex<DurableFile>,
}

struct DurableFile {
    /// Another handle on the store's file (the one written since the last
    /// compaction).
    file: Option<File>,
    path: PathBuf,
    /// A sync that failed: nothing more is sent for the store (an
    /// `fdatasync` that failed once may have lost what it was to keep, and
    /// a later one can succeed without it).
    failed: Option<(std::io::ErrorKind, String)>,
}

impl DurableFile {
    /// The error of the sync that failed, if one did.
    fn failure(&self) -> Result<(), StoreError> {
        match &self.failed {
            Some((kind, why)) => Err(StoreError::Io { path: self.path.clone(), doing: "syncing", source: std::io::Error::new(*kind, why.clone()) }),
            None => Ok(()),
        }
    }
}

impl Durable {
    fn new(file: &File, path: &Path) -> Result<Arc<Durable>, StoreError> {
        let handle = file.try_clone().map_err(io(path, "opening (a second handle)"))?;
        Ok(Arc::new(Durable {
            written: AtomicU64::new(0),
            synced: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            file: Mutex::new(DurableFile { file: Some(handle), path: path.to_path_buf(), failed: None }),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DurableFile> {
        self.file.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes handed to the operating system so far: what a message
    /// recorded by them needs on disk before it is sent.
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }

    /// Makes the first `writes` writes durable: at once if they are, else
    /// with one `fdatasync`, which covers every write made before it
    /// starts. An error (this sync's or an earlier one's) says what failed.
    pub fn make_durable(&self, writes: u64) -> Result<(), StoreError> {
        if self.synced.load(Ordering::Acquire) >= writes {
            return Ok(());
        }
        let mut guard = self.lock();
        let state = &mut *guard;
        state.failure()?;
        if self.synced.load(Ordering::Acquire) >= writes {
            return Ok(());
        }
        let target = self.written.load(Ordering::Acquire);
        let Some(file) = &state.file else { return Ok(()) };
        match file.sync_data() {
            Ok(()) => {
                self.synced.fetch_max(target, Ordering::AcqRel);
                Ok(())
            }
            Err(e) => {
                state.failed = Some((e.kind(), e.to_string()));
                self.failed.store(true, Ordering::Release);
                Err(StoreError::Io { path: state.path.clone(), doing: "syncing", source: e })
            }
        }
    }

    /// An earlier sync's failure, if one failed (without waiting for a
    /// sync under way when none has).
    pub fn failure(&self) -> Result<(), StoreError> {
        if !self.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        self.lock().failure()
    }

    /// Takes the file of a store written again whole (and synced) in place
    /// of the old one: everything written so far is on disk.
    fn take_over(&self, compacted: &Durable) {
        let file = compacted.lock().file.take();
        let mut state = self.lock();
        state.file = file;
        self.synced.fetch_max(self.written.load(Ordering::Acquire), Ordering::AcqRel);
    }
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    bytes.get(at..at + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
}

/// The store file of counterparty `comp_id` (a CompID is a FIX string; the
/// file name keeps only safe characters and adds a checksum of the rest).
pub fn path_for(dir: &Path, comp_id: &str) -> PathBuf {
    let safe: String = comp_id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
    dir.join(format!("{safe}-{:08x}.fixstore", crc32c::crc32c(comp_id.as_bytes())))
}

/// Writes a file whole (`<name>.writing` first, synced, renamed over: a
/// crash leaves the old content or the new, never a part) and syncs its
/// directory. A new store is made so, with its header, and a session's
/// `.compid` file.
pub(super) fn write_whole(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let mut writing = path.as_os_str().to_owned();
    writing.push(".writing");
    let writing = PathBuf::from(writing);
    let mut file = File::create(&writing).map_err(io(&writing, "creating"))?;
    file.write_all(bytes).map_err(io(&writing, "writing"))?;
    file.sync_all().map_err(io(&writing, "syncing"))?;
    std::fs::rename(&writing, path).map_err(io(path, "writing"))?;
    sync_parent(path)
}

/// Syncs the directory `path` is in (a name made or renamed there lasts).
fn sync_parent(path: &Path) -> Result<(), StoreError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir, "syncing the directory"))
}

/// Makes a new store whole with its header, so a store is never seen
/// without one.
fn create(path: &Path) -> Result<(), StoreError> {
    let mut header = [0u8; HEADER_BYTES];
    header[..8].copy_from_slice(MAGIC);
    header[8..12].copy_from_slice(&VERSION.to_le_bytes());
    write_whole(path, &header)
}

impl Store {
    /// Opens (or creates) a store and reads it back.
    pub fn open(path: &Path) -> Result<(Store, Restored), StoreError> {
        let damaged = |offset: usize, what: &str| StoreError::Damaged { path: path.to_path_buf(), offset, what: what.to_string() };
        if !path.exists() {
            create(path)?;
        }
        let mut file = OpenOptions::new().read(true).append(true).open(path).map_err(io(path, "opening"))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io(path, "reading"))?;
        if bytes.iter().all(|&b| b == 0) {
            // Empty, or zeros only: a store made by a release before
            // 2026-11-27 (which wrote its header unsynced) cut off by a
            // crash before its first sync, when nothing had been sent yet
            // (a store is synced before a message goes out), so starting
            // at 1 is right; or a store emptied since, which nothing here
            // can tell apart (this build makes a store whole with its
            // header). Said loudly, and started afresh.
            crate::log(&format!(
                "warning: FIX store {} is empty ({} bytes, all zero): a store made by an earlier release just before a crash, \
                 or one emptied since; its session starts again at sequence number 1 (if its counterparty has sent or received more, \
                 restore the store from a backup before it logs on)",
                path.display(),
                bytes.len()
            ));
            drop(file);
            std::fs::remove_file(path).map_err(io(path, "removing (an empty store)"))?;
            return Store::open(path);
        } else if !bytes.starts_with(MAGIC) {
            // The first format starts with a whole record; anything else
            // is a damaged header (or no store of ours), never converted
            // to an empty store.
            if !legacy::starts_with_a_record(&bytes) {
                return Err(damaged(
                    0,
                    "no store header (it is damaged, or this is not a FIX store); move the file away to start the session afresh at sequence number 1",
                ));
            }
            drop(file);
            legacy::convert(path, &bytes)?;
            return Store::open(path);
        }
        if bytes.len() < HEADER_BYTES {
            return Err(StoreError::Damaged { path: path.to_path_buf(), offset: 0, what: "short header".into() });
        }
        let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        if version != VERSION {
            return Err(StoreError::UnknownFormat { path: path.to_path_buf(), version });
        }
        let (restored, records) = read_back(path, &bytes)?;
        if let Some(why) = &records.torn {
            // A torn write at the end: it was never acknowledged.
            crate::log(&format!(
                "FIX store {}: torn last record at byte {} ({why}) cut off, {} bytes: it was never acknowledged",
                path.display(),
                records.end,
                bytes.len() - records.end
            ));
            file.set_len(records.end as u64).map_err(io(path, "truncating"))?;
            file.seek(SeekFrom::End(0)).map_err(io(path, "seeking"))?;
        } else if records.end < bytes.len() {
            // Zeros after the last record (the space a crash can leave
            // where a write never landed): cut off, so that the next
            // records follow the last one, as a reader expects.
            crate::log(&format!(
                "FIX store {}: {} zero bytes after the last record (at byte {}) cut off: space a crash left unwritten",
                path.display(),
                bytes.len() - records.end,
                records.end
            ));
            file.set_len(records.end as u64).map_err(io(path, "truncating"))?;
            file.seek(SeekFrom::End(0)).map_err(io(path, "seeking"))?;
        }
        let length = file.metadata().map_err(io(path, "reading"))?.len();
        drop(bytes);
        let compact_at = COMPACT_MIN.max(2 * compact_size(&restored));
        if length >= compact_at {
            drop(file);
            let store = rewrite(path, &restored, "compacting")?;
            crate::log(&format!("FIX store {} compacted on open: {length} bytes to {}", path.display(), store.length));
            return Ok((store, restored));
        }
        let durable = Durable::new(&file, path)?;
        let mut store = Store {
            file,
            path: path.to_path_buf(),
            compact_at,
            pending: Vec::new(),
            durable,
            length,
            reserved: length,
            bound: restored.account.is_some(),
            next_seq: records.next_seq,
            chain: records.chain,
        };
        store.reserve();
        Ok((store, restored))
    }

    /// Appends one record (to be written by the next flush).
    fn append(&mut self, kind: u8, body: &[u8]) {
        let mut payload = Vec::with_capacity(1 + body.len());
        payload.push(kind);
        payload.extend_from_slice(body);
        self.chain = crossbook_journal::format::encode_record_bounded(&mut self.pending, self.chain, self.next_seq, &payload, MAX_PAYLOAD);
        self.next_seq += 1;
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Hands what was recorded to the operating system (enough to survive
    /// a crash of the process; [`Store::sync`] for a power cut).
    pub fn flush(&mut self) -> Result<(), StoreError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let result = self.file.write_all(&self.pending).map_err(io(&self.path, "writing"));
        if result.is_ok() {
            self.length += self.pending.len() as u64;
            self.durable.written.fetch_add(1, Ordering::AcqRel);
        }
        self.pending.clear();
        self.reserve();
        result?;
        if self.length >= self.compact_at {
            self.compact();
        }
        Ok(())
    }

    /// Writes the store again with only what it says, in place of the old
    /// file (a new one, synced, renamed over it). A failure is logged and
    /// leaves the old file as it was, in use: compacting is housekeeping,
    /// and the next try waits until the store has doubled again.
    fn compact(&mut self) {
        let before = self.length;
        let compacted = std::fs::read(&self.path)
            .map_err(io(&self.path, "reading (to compact)"))
            .and_then(|bytes| read_back(&self.path, &bytes))
            .and_then(|(restored, _)| rewrite(&self.path, &restored, "compacting"));
        match compacted {
            Ok(store) => {
                crate::log(&format!("FIX store {} compacted: {before} bytes to {}", self.path.display(), store.length));
                let durable = Arc::clone(&self.durable);
                *self = store;
                durable.take_over(&self.durable);
                self.durable = durable;
            }
            Err(e) => {
                crate::log(&format!("FIX store {}: compacting failed, the store goes on as it is: {e}", self.path.display()));
                self.compact_at = 2 * self.length;
            }
        }
    }

    /// Keeps `RESERVE_BYTES` reserved past the end once half of it is
    /// used. A failure (a full disk) is not an error here: the reserve
    /// already made is what it is for.
    fn reserve(&mut self) {
        if self.bound
            && self.length + RESERVE_BYTES / 2 > self.reserved
            && crossbook_journal::write::reserve_blocks(&self.file, self.length, RESERVE_BYTES).is_ok()
        {
            self.reserved = self.length + RESERVE_BYTES;
        }
    }

    /// Records a session store operation; `engine_seq` is the command whose
    /// report a sent message is (0 for the session's own messages).
    pub fn record(&mut self, op: &StoreOp, engine_seq: u64) {
        match op {
            StoreOp::Reset => self.append(RESET, &[]),
            StoreOp::Sent { seq, app } => {
                let mut body = Vec::with_capacity(16 + app.as_ref().map_or(0, Vec::len));
                body.extend_from_slice(&seq.to_le_bytes());
                body.extend_from_slice(&engine_seq.to_le_bytes());
                if let Some(app) = app {
                    body.extend_from_slice(app);
                }
                self.append(SENT, &body);
            }
            StoreOp::Received { next_in } => self.append(RECEIVED, &next_in.to_le_bytes()),
        }
    }

    /// Binds the session to `account` from engine sequence number `seq` on.
    pub fn bind(&mut self, account: u64, seq: u64) {
        let mut body = account.to_le_bytes().to_vec();
        body.extend_from_slice(&seq.to_le_bytes());
        self.bound = true;
        self.append(BOUND, &body);
    }

    /// Records that the journal ends at `seq`, before reports this store
    /// holds (see `REWIND`), and syncs it.
    pub fn rewind(&mut self, seq: u64) -> Result<(), StoreError> {
        self.append(REWIND, &seq.to_le_bytes());
        self.sync()
    }

    /// Makes everything recorded so far durable, now.
    pub fn sync(&mut self) -> Result<(), StoreError> {
        self.flush()?;
        self.durable.make_durable(self.durable.written())
    }

    /// What of the store is on disk, for the writer that sends its
    /// messages.
    pub fn durable(&self) -> &Arc<Durable> {
        &self.durable
    }
}

/// What a store's bytes (header included) say, and where its records end.
fn read_back(path: &Path, bytes: &[u8]) -> Result<(Restored, crossbook_journal::Records), StoreError> {
    let mut restored = Restored { next_in: 1, next_out: 1, ..Restored::default() };
    let records = crossbook_journal::read_records(bytes, HEADER_BYTES, 1, 0, MAX_PAYLOAD, true, |_, payload, _| {
        let (&kind, body) = payload.split_first().ok_or("an empty record")?;
        apply(&mut restored, kind, body).map_err(|fault| fault.to_string())
    })
    .map_err(|damage| StoreError::Damaged { path: path.to_path_buf(), offset: damage.offset, what: damage.what })?;
    Ok((restored, records))
}

/// A record's bytes besides its body: the journal's framing and the kind
/// byte.
const RECORD_OVERHEAD: u64 = crossbook_journal::format::RECORD_OVERHEAD as u64 + 1;

/// The length of the store [`rewrite`] makes of `restored`.
fn compact_size(restored: &Restored) -> u64 {
    let kept: u64 = restored.stored.iter().map(|(_, message)| RECORD_OVERHEAD + 16 + message.len() as u64).sum();
    // Header, binding, next outgoing number, next incoming, rewind.
    HEADER_BYTES as u64 + kept + 4 * RECORD_OVERHEAD + 16 + 16 + 8 + 8
}

/// Writes what `restored` says as a new store in place of `path`'s (made
/// beside it as `<name>.<what>`, synced, renamed over it, the directory
/// synced) and returns it open at its end.
fn rewrite(path: &Path, restored: &Restored, what: &str) -> Result<Store, StoreError> {
    let beside = path.with_extension(what);
    let _ = std::fs::remove_file(&beside);
    let (mut store, _) = Store::open(&beside)?;
    // Not compacted again while it is written (its kept messages may be
    // past `COMPACT_MIN` on their own).
    store.compact_at = u64::MAX;
    if let Some(account) = restored.account {
        store.bind(account, 0);
    }
    let mut last_sent = 0;
    for (&seq, message) in restored.stored.iter() {
        store.record(&StoreOp::Sent { seq, app: Some(message.clone()) }, 0);
        last_sent = seq;
    }
    if restored.next_out > last_sent + 1 {
        store.record(&StoreOp::Sent { seq: restored.next_out - 1, app: None }, 0);
    }
    store.record(&StoreOp::Received { next_in: restored.next_in }, 0);
    // `rewind` sets how far the reports go (not a maximum) and syncs.
    store.rewind(restored.through_seq)?;
    std::fs::rename(&beside, path).map_err(io(path, "replacing (writing the store again)"))?;
    store.path = path.to_path_buf();
    store.durable.lock().path = path.to_path_buf();
    store.compact_at = COMPACT_MIN.max(2 * store.length);
    sync_parent(path)?;
    Ok(store)
}

/// The first format (before 2026-11-23): no header, records `len u32 |
/// kind u8 | body | crc32c u32`, unchained. Read once, to convert.
mod legacy {
    use super::*;

    /// Whether `bytes` starts with a whole first-format record.
    pub(super) fn starts_with_a_record(bytes: &[u8]) -> bool {
        parse(bytes).is_some_and(|(kind, _, _)| (RESET..=REWIND).contains(&kind))
    }

    /// (kind, body, record size) of a whole, checksummed record at the start.
    fn parse(bytes: &[u8]) -> Option<(u8, &[u8], usize)> {
        let len = u32::from_le_bytes(bytes.get(0..4)?.try_into().ok()?) as usize;
        if len == 0 || len > MAX_PAYLOAD {
            return None;
        }
        let size = 4 + len + 4;
        let record = bytes.get(..size)?;
        let crc = u32::from_le_bytes(record[size - 4..].try_into().ok()?);
        if crc32c::crc32c(&record[..size - 4]) != crc {
            return None;
        }
        Some((record[4], &record[5..size - 4], size))
    }

    /// Reads a first-format store and writes what it says in the current
    /// format in its place (a new file, synced, renamed over the old one).
    pub(super) fn convert(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
        let mut restored = Restored { next_in: 1, next_out: 1, ..Restored::default() };
        let mut at = 0usize;
        while at < bytes.len() {
            match parse(&bytes[at..]) {
                Some((kind, body, size)) => {
                    apply(&mut restored, kind, body).map_err(|fault| StoreError::Damaged { path: path.to_path_buf(), offset: at, what: fault.to_string() })?;
                    at += size;
                }
                None if (at + 1..bytes.len()).any(|later| parse(&bytes[later..]).is_some_and(|(kind, _, _)| (RESET..=REWIND).contains(&kind))) => {
                    return Err(StoreError::Damaged { path: path.to_path_buf(), offset: at, what: "a bad record followed by valid ones".into() });
                }
                // A torn write at the end: it was never acknowledged.
                None => break,
            }
        }
        rewrite(path, &restored, "converting")?;
        crate::log(&format!("FIX store {} converted to format version {VERSION}", path.display()));
        Ok(())
    }
}

/// What is wrong with a store record that passed its checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RecordFault {
    /// Shorter than its kind's fields (the kind's name).
    Short(&'static str),
    UnknownKind(u8),
}

impl std::fmt::Display for RecordFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordFault::Short(kind) => write!(f, "short {kind} record"),
            RecordFault::UnknownKind(kind) => write!(f, "unknown record kind {kind}"),
        }
    }
}

fn apply(restored: &mut Restored, kind: u8, body: &[u8]) -> Result<(), RecordFault> {
    match kind {
        RESET => {
            restored.next_in = 1;
            restored.next_out = 1;
            restored.stored.clear();
        }
        SENT => {
            let seq = u64_at(body, 0).ok_or(RecordFault::Short("Sent"))?;
            let engine_seq = u64_at(body, 8).ok_or(RecordFault::Short("Sent"))?;
            restored.next_out = seq + 1;
            restored.through_seq = restored.through_seq.max(engine_seq);
            if body.len() > 16 {
                restored.stored.insert(seq, body[16..].to_vec());
            }
        }
        RECEIVED => restored.next_in = u64_at(body, 0).ok_or(RecordFault::Short("Received"))?,
        BOUND => {
            restored.account = Some(u64_at(body, 0).ok_or(RecordFault::Short("Bound"))?);
            restored.through_seq = restored.through_seq.max(u64_at(body, 8).ok_or(RecordFault::Short("Bound"))?);
        }
        REWIND => restored.through_seq = u64_at(body, 0).ok_or(RecordFault::Short("Rewind"))?,
        other => return Err(RecordFault::UnknownKind(other)),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store's path in a directory of its own, removed when dropped.
    struct Scratch(PathBuf);

    impl std::ops::Deref for Scratch {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl AsRef<Path> for Scratch {
        fn as_ref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            if let Some(dir) = self.0.parent() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }

    fn temp(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("crossbook-fixstore-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        Scratch(dir.join("s.fixstore"))
    }

    #[test]
    fn reads_back_what_it_wrote_and_cuts_a_torn_tail() {
        let path = temp("roundtrip");
        {
            let (mut store, restored) = Store::open(&path).expect("open");
            assert_eq!((restored.next_in, restored.next_out), (1, 1));
            store.bind(7, 40);
            store.record(&StoreOp::Sent { seq: 1, app: None }, 0);
            store.record(&StoreOp::Sent { seq: 2, app: Some(b"8=FIX.4.4".to_vec()) }, 41);
            store.record(&StoreOp::Received { next_in: 5 }, 0);
            store.sync().expect("sync");
        }
        {
            // A rewind sets how far the reports go (not a maximum), and
            // later reports raise it again.
            let copy = path.with_extension("rewound");
            std::fs::copy(&path, &copy).expect("copy");
            let (mut store, restored) = Store::open(&copy).expect("open");
            assert_eq!(restored.through_seq, 41);
            store.rewind(30).expect("rewind");
            drop(store);
            let (mut store, restored) = Store::open(&copy).expect("open");
            assert_eq!((restored.through_seq, restored.next_out), (30, 3));
            store.record(&StoreOp::Sent { seq: 3, app: None }, 33);
            store.sync().expect("sync");
            drop(store);
            assert_eq!(Store::open(&copy).expect("open").1.through_seq, 33);
        }
        let full = std::fs::read(&path).expect("read");
        for cut in 0..20 {
            std::fs::write(&path, &full[..full.len() - cut]).expect("write");
            let (_, restored) = Store::open(&path).expect("a torn tail is not an error");
            if cut == 0 {
                assert_eq!((restored.next_in, restored.next_out, restored.account, restored.through_seq), (5, 3, Some(7), 41));
                assert_eq!(restored.stored.get(&2).map(Vec::as_slice), Some(&b"8=FIX.4.4"[..]));
            } else {
                assert_eq!(restored.next_in, 1, "cut {cut}: the last record is gone");
            }
        }
        // Zeros after the last record (a crash's unwritten space): cut off,
        // and what is recorded next follows the last record.
        for zeros in [1usize, 8, 200] {
            let mut padded = full.clone();
            padded.resize(full.len() + zeros, 0);
            std::fs::write(&path, &padded).expect("write");
            let (mut store, restored) = Store::open(&path).expect("zeros after the records are not an error");
            assert_eq!((restored.next_in, restored.next_out), (5, 3));
            assert_eq!(std::fs::read(&path).expect("read"), full, "{zeros} zeros cut off");
            store.record(&StoreOp::Received { next_in: 6 }, 0);
            store.sync().expect("sync");
            drop(store);
            assert_eq!(Store::open(&path).expect("reopen").1.next_in, 6, "{zeros} zeros: the next record is read");
        }
        let mut damaged = full.clone();
        damaged[30] ^= 0xff;
        std::fs::write(&path, &damaged).expect("write");
        match Store::open(&path) {
            Err(StoreError::Damaged { offset, .. }) => assert_eq!(offset, HEADER_BYTES, "the first record is the damaged one"),
            other => panic!("damage before valid records is refused, not {:?}", other.map(|(_, r)| r)),
        }
    }

    /// A store is never converted to an empty one because its header is
    /// damaged: a damaged header, or a file that is no store, is refused
    /// and left as it is. A new store is whole from the start (no
    /// `.writing` file left).
    #[test]
    fn a_store_that_lost_its_header_is_refused_not_started_afresh() {
        let path = temp("header");
        {
            let (mut store, _) = Store::open(&path).expect("open");
            assert!(!PathBuf::from(format!("{}.writing", path.display())).exists());
            assert_eq!(std::fs::read(&path).expect("read").len(), HEADER_BYTES, "the header is there before any record");
            store.bind(7, 40);
            store.record(&StoreOp::Sent { seq: 1, app: None }, 0);
            store.record(&StoreOp::Received { next_in: 9 }, 0);
            store.sync().expect("sync");
        }
        let whole = std::fs::read(&path).expect("read");
        let flipped = |at: usize, mask: u8| {
            let mut bytes = whole.clone();
            bytes[at] ^= mask;
            bytes
        };
        let mut zeroed = whole.clone();
        zeroed[..HEADER_BYTES].fill(0);
        // Bytes that are no store (a Weyl sequence: none zero, none
        // repeating soon).
        let random: Vec<u8> = (1..=300u32).map(|i| (i.wrapping_mul(0x9e37_79b9) >> 24) as u8 | 1).collect();
        for (name, bytes) in [("magic flipped", flipped(0, 0x80)), ("magic byte 2", flipped(2, 1)), ("header zeroed", zeroed), ("random bytes", random)] {
            std::fs::write(&path, &bytes).expect("write");
            match Store::open(&path) {
                Err(StoreError::Damaged { offset: 0, .. }) => {}
                other => panic!("{name}: refused, not {:?}", other.map(|(_, r)| (r.next_in, r.next_out))),
            }
            assert_eq!(std::fs::read(&path).expect("read"), bytes, "{name}: left as it was");
        }
        // Empty, or zeros only (a store an earlier release made unsynced,
        // cut off by a crash before anything was sent): started afresh,
        // with its header (and a warning in the log).
        for bytes in [Vec::new(), vec![0u8; HEADER_BYTES]] {
            std::fs::write(&path, &bytes).expect("write");
            let (_, restored) = Store::open(&path).expect("an empty store starts afresh");
            assert_eq!((restored.next_in, restored.next_out, restored.account), (1, 1, None));
            assert_eq!(std::fs::read(&path).expect("read").len(), HEADER_BYTES);
        }
    }

    /// Next in, next out, account, how far reports go, kept messages.
    type Says = (u64, u64, Option<u64>, u64, Vec<(u64, Vec<u8>)>);

    fn says(restored: &Restored) -> Says {
        let stored = restored.stored.iter().map(|(&seq, message)| (seq, message.clone())).collect();
        (restored.next_in, restored.next_out, restored.account, restored.through_seq, stored)
    }

    /// Each flush that writes is counted; a sync makes what was written
    /// durable once, and compaction keeps the count (the writers hold it)
    /// with the new file behind it.
    #[test]
    fn writes_are_counted_and_made_durable_and_compaction_hands_over_the_count() {
        use std::os::unix::fs::MetadataExt;
        let path = temp("durable");
        let (mut store, _) = Store::open(&path).expect("open");
        let durable = Arc::clone(store.durable());
        let synced = |d: &Durable| d.synced.load(Ordering::Acquire);
        assert_eq!((durable.written(), synced(&durable)), (0, 0));
        store.record(&StoreOp::Sent { seq: 1, app: None }, 0);
        store.flush().expect("flush");
        store.flush().expect("a flush with nothing recorded");
        assert_eq!((durable.written(), synced(&durable)), (1, 0), "one write, not synced");
        durable.make_durable(1).expect("sync");
        assert_eq!(synced(&durable), 1);
        store.record(&StoreOp::Sent { seq: 2, app: None }, 0);
        store.flush().expect("flush");
        durable.make_durable(1).expect("already on disk");
        assert_eq!(synced(&durable), 1, "a sync only when a message needs more than is on disk");
        // Compacted: the same count, all of it on disk, and the writer's
        // handle is on the new file.
        store.compact_at = 0;
        store.record(&StoreOp::Sent { seq: 3, app: Some(b"8=FIX.4.4|35=8|".to_vec()) }, 9);
        store.flush().expect("flush, compacting");
        assert!(Arc::ptr_eq(store.durable(), &durable), "the session's writers keep the store's count");
        assert_eq!((durable.written(), synced(&durable)), (3, 3));
        let inode = |file: &File| file.metadata().expect("stat").ino();
        assert_eq!(inode(durable.lock().file.as_ref().expect("a handle")), std::fs::metadata(&path).expect("stat").ino());
        assert_eq!(durable.lock().path, path.to_path_buf());
        store.compact_at = u64::MAX;
        store.record(&StoreOp::Sent { seq: 4, app: None }, 0);
        store.flush().expect("flush");
        durable.make_durable(4).expect("sync the new file");
        assert_eq!(synced(&durable), 4);
        drop(store);
        assert_eq!(Store::open(&path).expect("reopen").1.next_out, 5);
    }

    /// A store that grows past its bound is written again with only what
    /// it says, while in use (here with a small bound) and on open (past
    /// `COMPACT_MIN`), and says exactly what a twin never compacted says,
    /// across a reset and on through more records.
    #[test]
    fn a_compacted_store_says_what_it_said() {
        let path = temp("compact");
        let twin_path = path.with_file_name("twin.fixstore");
        let (mut store, _) = Store::open(&path).expect("open");
        let (mut twin, _) = Store::open(&twin_path).expect("open");
        twin.compact_at = u64::MAX;
        let bound = 16 << 10;
        store.compact_at = bound;
        let mut compactions = 0;
        let mut engine_seq = 40;
        let mut ops = vec![];
        for (phase, last) in [(0, 2000u64), (1, 700)] {
            if phase == 1 {
                ops.push(StoreOp::Reset);
            }
            for seq in 1..=last {
                engine_seq += 1;
                let report = seq % 3 == 0;
                let app = report.then(|| format!("8=FIX.4.4|35=8|report {engine_seq}").into_bytes());
                ops.push(StoreOp::Sent { seq, app });
                ops.push(StoreOp::Received { next_in: seq / 2 + 1 });
            }
        }
        store.bind(7, 40);
        twin.bind(7, 40);
        for (i, op) in ops.iter().enumerate() {
            let engine_seq = if let StoreOp::Sent { app: Some(_), .. } = op { 40 + i as u64 } else { 0 };
            store.record(op, engine_seq);
            twin.record(op, engine_seq);
            if i % 7 == 0 {
                let before = store.length;
                store.flush().expect("flush");
                if store.length < before {
                    compactions += 1;
                    assert_eq!(store.compact_at, COMPACT_MIN, "a compacted store is not compacted again until it doubles (or reaches the least)");
                    store.compact_at = store.length + bound;
                }
            }
        }
        store.sync().expect("sync");
        twin.sync().expect("sync");
        assert!(compactions >= 3, "compacted {compactions} times");
        assert!(!path.with_extension("compacting").exists(), "nothing left beside it");
        let (_, compacted) = Store::open(&path).expect("open the compacted store");
        let (_, whole) = Store::open(&twin_path).expect("open the twin");
        assert_eq!(says(&compacted), says(&whole));
        assert_eq!((whole.next_out, whole.account), (701, Some(7)));
        assert_eq!(whole.stored.len(), 233, "the reports since the reset");
        assert!(std::fs::metadata(&path).expect("stat").len() < std::fs::metadata(&twin_path).expect("stat").len() / 4);

        // Past `COMPACT_MIN` of session messages: compacted on open.
        let (mut twin, _) = Store::open(&twin_path).expect("open");
        twin.compact_at = u64::MAX;
        let mut seq = whole.next_out;
        while twin.length + twin.pending.len() as u64 <= COMPACT_MIN {
            twin.record(&StoreOp::Sent { seq, app: None }, 0);
            seq += 1;
        }
        twin.sync().expect("sync");
        drop(twin);
        let grown = std::fs::metadata(&twin_path).expect("stat").len();
        let (store, restored) = Store::open(&twin_path).expect("open, compacting");
        assert!(store.length < 64 << 10, "{grown} bytes compacted to {}", store.length);
        assert_eq!(std::fs::metadata(&twin_path).expect("stat").len(), store.length);
        assert_eq!(restored.next_out, seq);
        let mut want = says(&whole);
        want.1 = seq;
        assert_eq!(says(&restored), want);
        drop(store);
        assert_eq!(says(&Store::open(&twin_path).expect("reopen").1), want);
    }

    /// A store written in the first format (no header, unchained records)
    /// is converted on open, with everything it said kept.
    #[test]
    fn a_first_format_store_is_converted() {
        let path = temp("legacy");
        let legacy = |kind: u8, body: &[u8]| {
            let mut out = ((body.len() + 1) as u32).to_le_bytes().to_vec();
            out.push(kind);
            out.extend_from_slice(body);
            let crc = crc32c::crc32c(&out);
            out.extend_from_slice(&crc.to_le_bytes());
            out
        };
        let sent = |seq: u64, engine_seq: u64, app: &[u8]| [&seq.to_le_bytes()[..], &engine_seq.to_le_bytes(), app].concat();
        let mut bytes = legacy(BOUND, &[&7u64.to_le_bytes()[..], &40u64.to_le_bytes()].concat());
        bytes.extend(legacy(SENT, &sent(1, 0, b"")));
        bytes.extend(legacy(SENT, &sent(2, 41, b"8=FIX.4.4|app")));
        bytes.extend(legacy(SENT, &sent(3, 0, b"")));
        bytes.extend(legacy(RECEIVED, &5u64.to_le_bytes()));
        std::fs::write(&path, &bytes).expect("write");
        let want = |r: &Restored| {
            assert_eq!((r.next_in, r.next_out, r.account, r.through_seq), (5, 4, Some(7), 41));
            assert_eq!(r.stored.get(&2).map(Vec::as_slice), Some(&b"8=FIX.4.4|app"[..]));
        };
        let (mut store, restored) = Store::open(&path).expect("converted");
        want(&restored);
        assert!(std::fs::read(&path).expect("read").starts_with(MAGIC));
        store.record(&StoreOp::Received { next_in: 6 }, 0);
        store.sync().expect("sync");
        drop(store);
        let (_, again) = Store::open(&path).expect("reopen");
        assert_eq!((again.next_in, again.next_out, again.through_seq), (6, 4, 41));
    }
}
