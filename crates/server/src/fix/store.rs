//! A FIX session's store: one append-only file per counterparty CompID
//! under `<data>/fix/`, holding what the session needs after a restart
//! (both sequence numbers, the application messages it may have to send
//! again, the account it is bound to and how far into the journal its
//! execution reports go).
//!
//! Record: `len u32 | kind u8 | body | crc32c u32` (little-endian; the
//! checksum covers `len`, `kind` and `body`). A torn last record is cut
//! off; a bad record followed by good ones is corruption and stops the
//! server, as with the journal (docs/fix.md).

use crossbook_fix::session::StoreOp;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

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

/// Why a store could not be read or written.
#[derive(Debug)]
pub enum StoreError {
    /// The file system refused (`doing` says what was being done).
    Io { path: PathBuf, doing: &'static str, source: std::io::Error },
    /// A damaged record with valid ones after it: not a torn tail, so
    /// something overwrote the file; the server refuses to guess.
    Damaged { path: PathBuf, offset: usize },
    /// A record whose checksum holds but whose content makes no sense.
    BadRecord { path: PathBuf, offset: usize, what: &'static str },
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Io { path, doing, source } => write!(f, "{doing} {}: {source}", path.display()),
            StoreError::Damaged { path, offset } => write!(f, "{}: damaged record at byte {offset} followed by valid ones: refusing to guess", path.display()),
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
    pub stored: BTreeMap<u64, Vec<u8>>,
    /// The account the session is bound to.
    pub account: Option<u64>,
    /// The last engine sequence number whose reports are in the store.
    pub through_seq: u64,
}

pub struct Store {
    file: File,
    path: PathBuf,
    /// Records not yet written (one write per batch of messages).
    pending: Vec<u8>,
    /// Written since the last sync.
    dirty: bool,
    /// The file's length, and how far its blocks are reserved
    /// (`RESERVE_BYTES` ahead: a full disk still takes the last Logout).
    length: u64,
    reserved: u64,
    /// Bound to an account (a Logon succeeded once): only such stores keep
    /// a reserve, so that failed Logons cost no disk beyond their records.
    bound: bool,
}

/// Bytes reserved past the end of a store (without changing its size), so
/// that the Logout telling a counterparty why the venue stops can be
/// recorded, and so sent, when the disk is full.
const RESERVE_BYTES: u64 = 64 << 10;

fn record(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 9);
    out.extend_from_slice(&((body.len() + 1) as u32).to_le_bytes());
    out.push(kind);
    out.extend_from_slice(body);
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
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

impl Store {
    /// Opens (or creates) a store and reads it back.
    pub fn open(path: &Path) -> Result<(Store, Restored), StoreError> {
        let mut file = OpenOptions::new().read(true).append(true).create(true).open(path).map_err(io(path, "opening"))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io(path, "reading"))?;
        let mut restored = Restored { next_in: 1, next_out: 1, ..Restored::default() };
        let mut at = 0usize;
        while at < bytes.len() {
            match parse(&bytes[at..]) {
                Some((kind, body, size)) => {
                    apply(&mut restored, kind, body).map_err(|what| StoreError::BadRecord { path: path.to_path_buf(), offset: at, what })?;
                    at += size;
                }
                None => {
                    if later_record_is_valid(&bytes[at..]) {
                        return Err(StoreError::Damaged { path: path.to_path_buf(), offset: at });
                    }
                    // A torn write at the end: it was never acknowledged.
                    file.set_len(at as u64).map_err(io(path, "truncating"))?;
                    file.seek(SeekFrom::End(0)).map_err(io(path, "seeking"))?;
                    break;
                }
            }
        }
        let length = file.metadata().map_err(io(path, "reading"))?.len();
        let mut store = Store { file, path: path.to_path_buf(), pending: Vec::new(), dirty: false, length, reserved: length, bound: restored.account.is_some() };
        store.reserve();
        Ok((store, restored))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
    }

    /// Hands what was recorded to the operating system (enough to survive
    /// a crash of the process; [`Store::sync`] for a power cut).
    pub fn flush(&mut self) -> Result<(), StoreError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.dirty = true;
        let result = self.file.write_all(&self.pending).map_err(io(&self.path, "writing"));
        if result.is_ok() {
            self.length += self.pending.len() as u64;
        }
        self.pending.clear();
        self.reserve();
        result
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
        let bytes = match op {
            StoreOp::Reset => record(RESET, &[]),
            StoreOp::Sent { seq, app } => {
                let mut body = Vec::with_capacity(16 + app.as_ref().map_or(0, Vec::len));
                body.extend_from_slice(&seq.to_le_bytes());
                body.extend_from_slice(&engine_seq.to_le_bytes());
                if let Some(app) = app {
                    body.extend_from_slice(app);
                }
                record(SENT, &body)
            }
            StoreOp::Received { next_in } => record(RECEIVED, &next_in.to_le_bytes()),
        };
        self.write(&bytes);
    }

    /// Binds the session to `account` from engine sequence number `seq` on.
    pub fn bind(&mut self, account: u64, seq: u64) {
        let mut body = account.to_le_bytes().to_vec();
        body.extend_from_slice(&seq.to_le_bytes());
        self.bound = true;
        self.write(&record(BOUND, &body));
    }

    /// Records that the journal ends at `seq`, before reports this store
    /// holds (see `REWIND`), and syncs it.
    pub fn rewind(&mut self, seq: u64) -> Result<(), StoreError> {
        self.write(&record(REWIND, &seq.to_le_bytes()));
        self.sync()
    }

    /// Makes everything recorded so far durable.
    pub fn sync(&mut self) -> Result<(), StoreError> {
        self.flush()?;
        if self.dirty {
            self.file.sync_data().map_err(io(&self.path, "syncing"))?;
            self.dirty = false;
        }
        Ok(())
    }
}

/// (kind, body, record size) of a whole, checksummed record at the start.
fn parse(bytes: &[u8]) -> Option<(u8, &[u8], usize)> {
    let len = u32::from_le_bytes(bytes.get(0..4)?.try_into().ok()?) as usize;
    if len == 0 || len > MAX_BODY + 1 {
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

/// Whether a valid record starts anywhere after the first byte.
fn later_record_is_valid(bytes: &[u8]) -> bool {
    (1..bytes.len()).any(|at| parse(&bytes[at..]).is_some_and(|(kind, _, _)| (RESET..=REWIND).contains(&kind)))
}

fn apply(restored: &mut Restored, kind: u8, body: &[u8]) -> Result<(), &'static str> {
    match kind {
        RESET => {
            restored.next_in = 1;
            restored.next_out = 1;
            restored.stored.clear();
        }
        SENT => {
            let seq = u64_at(body, 0).ok_or("short Sent record")?;
            let engine_seq = u64_at(body, 8).ok_or("short Sent record")?;
            restored.next_out = seq + 1;
            restored.through_seq = restored.through_seq.max(engine_seq);
            if body.len() > 16 {
                if restored.stored.len() >= crossbook_fix::session::MAX_STORED {
                    restored.stored.pop_first();
                }
                restored.stored.insert(seq, body[16..].to_vec());
            }
        }
        RECEIVED => restored.next_in = u64_at(body, 0).ok_or("short Received record")?,
        BOUND => {
            restored.account = Some(u64_at(body, 0).ok_or("short Bound record")?);
            restored.through_seq = restored.through_seq.max(u64_at(body, 8).ok_or("short Bound record")?);
        }
        REWIND => restored.through_seq = u64_at(body, 0).ok_or("short Rewind record")?,
        _ => return Err("unknown record kind"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("crossbook-fixstore-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir.join("s.fixstore")
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
        let mut damaged = full.clone();
        damaged[30] ^= 0xff;
        std::fs::write(&path, &damaged).expect("write");
        assert!(matches!(Store::open(&path), Err(StoreError::Damaged { offset: 25, .. })), "damage before valid records is refused");
    }
}
