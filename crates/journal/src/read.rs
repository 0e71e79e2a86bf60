//! Reading the journal back: checking every record, finding where it ends,
//! telling a torn tail (never acknowledged: truncate) from corruption of
//! history (refuse to start).

use crate::format::*;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Damage that is not a torn tail: history itself is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corruption {
    pub file: PathBuf,
    pub offset: u64,
    /// The sequence number the journal expected at that place.
    pub seq: u64,
    pub what: String,
}

impl std::fmt::Display for Corruption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "corrupt journal: {} at offset {} (expected seq {}): {}", self.file.display(), self.offset, self.seq, self.what)
    }
}

impl std::error::Error for Corruption {}

/// An incomplete or unreadable last record with nothing valid after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    pub file: PathBuf,
    pub offset: u64,
    /// The sequence number the dropped record would have had.
    pub seq: u64,
    pub what: String,
    /// The segment's header itself never made it to disk.
    pub whole_segment: bool,
}

/// Where a checked journal ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalEnd {
    pub last_seq: u64,
    /// Checksum of the last valid record (the next record's chain value).
    pub last_crc: u32,
    /// The last segment holding valid data, and where that data ends.
    pub tail: Option<(PathBuf, u64)>,
    pub torn: Option<TornTail>,
    pub records: u64,
    pub segments: usize,
}

/// Is there a record anywhere in `bytes[from..]` that verifies against the
/// checksum stored just before it? Such a record means the damage at
/// `from` is followed by history, not by the end of a torn write.
fn valid_record_after(bytes: &[u8], from: usize, max_payload: usize) -> bool {
    let start = from.max(4) + 1;
    if bytes.len() < RECORD_OVERHEAD + 1 {
        return false;
    }
    (start..=bytes.len() - RECORD_OVERHEAD - 1).any(|at| decode_record_at_bounded(bytes, at, u32_at(bytes, at - 4), max_payload).is_ok())
}

/// Whether the record at `bytes[at..]`, whole (its length sane and all its
/// bytes there) but failing its checksum, is followed by a whole record
/// that verifies when chained from what the damaged record's checksum
/// should be. Then the damaged record's own checksum field was hit (a
/// flipped bit in stored history), not a write torn by a crash: a torn
/// write leaves nothing whole after it, so a later record that chains from
/// this one proves it was complete, and (in sync mode) acknowledged.
fn whole_record_chains_after(bytes: &[u8], at: usize, previous: u32, max_payload: usize) -> bool {
    let rest = &bytes[at..];
    if rest.len() < RECORD_OVERHEAD {
        return false;
    }
    let len = u32_at(rest, 0) as usize;
    if len == 0 || len > max_payload || rest.len() < RECORD_OVERHEAD + len {
        return false;
    }
    let size = RECORD_OVERHEAD + len;
    let should_be = record_crc(previous, &rest[..size - 4]);
    at + size < bytes.len() && decode_record_at_bounded(bytes, at + size, should_be, max_payload).is_ok()
}

/// Whether a whole record header is at `bytes[at..]` (its length sane and
/// all its bytes there) whose sequence field is in `seqs`.
fn whole_header_says(bytes: &[u8], at: usize, max_payload: usize, seqs: std::ops::RangeInclusive<u64>) -> bool {
    let Some(rest) = bytes.get(at..) else { return false };
    if rest.len() < RECORD_OVERHEAD {
        return false;
    }
    let len = u32_at(rest, 0) as usize;
    len > 0 && len <= max_payload && rest.len() >= RECORD_OVERHEAD + len && seqs.contains(&u64_at(rest, 4))
}

/// Whether the record due at `bytes[at..]` (numbered `expected`), which
/// fails its checksum, has the next record's header after it: where its
/// own length says it ends, a whole record numbered `expected + 1`; or,
/// where the record due was zeroed (a lost sector), the first bytes that
/// are not zero start a whole record numbered past `expected`. A torn
/// write leaves only zeros after what it wrote (or, on a device that
/// reorders sectors, parts of itself, which are refused the same), so the
/// damaged record was history: damage to synced bytes, both its payload
/// and its checksum field hit, with the journal's last record whole after
/// it (the case no chained checksum can show, since the record after
/// chains from the damaged field).
fn next_header_after(bytes: &[u8], at: usize, expected: u64, max_payload: usize) -> bool {
    if whole_header_says(bytes, at, max_payload, 0..=u64::MAX)
        && whole_header_says(bytes, at + RECORD_OVERHEAD + u32_at(bytes, at) as usize, max_payload, expected + 1..=expected + 1)
    {
        return true;
    }
    let rest = &bytes[at..];
    if rest.first() != Some(&0) {
        return false;
    }
    let Some(first) = rest.iter().position(|&b| b != 0) else { return false };
    // A length whose low bytes are zero starts with zeros: the header may
    // begin up to three bytes before the first byte that is not.
    (first.saturating_sub(3)..=first).any(|start| whole_header_says(bytes, at + start, max_payload, expected + 1..=expected.saturating_add(1 << 32)))
}

/// Where the chained records of a buffer stopped ([`read_records`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Records {
    /// The offset after the last valid record.
    pub end: usize,
    /// The sequence number the next record would have.
    pub next_seq: u64,
    /// The last valid record's checksum (the next record's chain value).
    pub chain: u32,
    pub count: u64,
    /// Set when a torn last record was cut off: why it does not verify.
    pub torn: Option<String>,
}

/// A damaged record: not a torn tail, since history follows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordDamage {
    pub offset: usize,
    /// The sequence number due there.
    pub seq: u64,
    pub what: String,
}

/// Reads the chained records of `bytes` from offset `at` on, the first
/// numbered `seq` and chained from `chain`, each of at most `max_payload`
/// bytes, calling `visit(seq, payload, crc)` for each. Zeros (space a
/// writer reserved ahead) end the records. A record that does not verify
/// ends them too when nothing after it says it was history (a torn write
/// of the last record, which was never acknowledged) and `may_be_torn`
/// says the buffer is the last one written; anything else is damage.
/// The journal's segments and the FIX session stores are read with it.
pub fn read_records(
    bytes: &[u8],
    mut at: usize,
    seq: u64,
    mut chain: u32,
    max_payload: usize,
    may_be_torn: bool,
    mut visit: impl FnMut(u64, &[u8], u32) -> Result<(), String>,
) -> Result<Records, RecordDamage> {
    let mut expected = seq;
    let mut count = 0;
    let damage = |offset: usize, seq: u64, what: String| RecordDamage { offset, seq, what };
    while at < bytes.len() {
        match decode_record_at_bounded(bytes, at, chain, max_payload) {
            Ok(record) if record.seq == expected => {
                visit(record.seq, record.payload, record.crc).map_err(|what| damage(at, expected, what))?;
                chain = record.crc;
                count += 1;
                expected += 1;
                at += record.size;
            }
            Ok(record) => return Err(damage(at, expected, format!("holds seq {}", record.seq))),
            // Zeros written ahead: the records end here.
            Err(_) if zeros_from(bytes, at) => break,
            Err(error) => {
                let rest = &bytes[at..];
                // A complete record whose sequence number is past the one
                // due is history out of order (a record missing, or two
                // swapped), not a torn write. A torn write cannot look like
                // that: its sequence field holds a prefix of the due
                // number's little-endian bytes, then zeros (the space
                // written ahead), so at most the number due.
                let out_of_order = whole_header_says(bytes, at, max_payload, expected.saturating_add(1)..=u64::MAX);
                let chained_after = whole_record_chains_after(bytes, at, chain, max_payload);
                let next_after = next_header_after(bytes, at, expected, max_payload);
                // A whole record that verifies but whose length no writer
                // gives: written, not torn.
                let verifies_too_long = rest.len() >= 4 && {
                    let len = u32_at(rest, 0) as usize;
                    len > max_payload && rest.len() >= RECORD_OVERHEAD + len && {
                        let size = RECORD_OVERHEAD + len;
                        record_crc(chain, &rest[..size - 4]) == u32_at(rest, size - 4)
                    }
                };
                let valid_after = || valid_record_after(bytes, at, max_payload);
                if may_be_torn && !out_of_order && !chained_after && !next_after && !verifies_too_long && !valid_after() {
                    return Ok(Records { end: at, next_seq: expected, chain, count, torn: Some(error.to_string()) });
                }
                let what = if out_of_order {
                    format!("{error}; the record there says seq {}", u64_at(rest, 4))
                } else if verifies_too_long {
                    format!("{error} in a whole record whose checksum verifies (written so, not torn)")
                } else if chained_after {
                    format!("{error} in a whole record followed by a whole record that chains from it: its checksum field is damaged")
                } else if next_after && !valid_after() {
                    format!("{error}, and a whole record numbered after it follows (damaged history, not a torn write)")
                } else if valid_after() {
                    format!("{error}, and valid records follow")
                } else {
                    // Not the last buffer (a segment with later ones
                    // after it, each synced before the next began): no
                    // torn write ends it.
                    format!("{error}, in a segment that later segments follow (only the journal's last record can be torn)")
                };
                return Err(damage(at, expected, what));
            }
        }
    }
    Ok(Records { end: at.min(bytes.len()), next_seq: expected, chain, count, torn: None })
}

/// Whether everything from `at` on is zero: the space a writer reserved
/// ahead of its records (`write::PREALLOCATE_BYTES`), so the clean end of
/// the journal, not a damaged record.
fn zeros_from(bytes: &[u8], at: usize) -> bool {
    bytes[at.min(bytes.len())..].iter().all(|&b| b == 0)
}

/// Where a segment's records end (the seq after its last, and that
/// record's checksum), read past damage: after a damaged place the chain
/// is picked up again at the first whole record that verifies against the
/// four bytes before it (the checksum field of the record before). `None`
/// if the header is damaged, or nothing after the damage verifies (where
/// the segment ends is then unknown). For `journal verify` only.
fn segment_end_past_damage(bytes: &[u8]) -> Option<(u64, u32)> {
    let header = parse_segment_header(bytes).ok()?;
    let (mut expected, mut chain, mut at) = (header.first_seq, header.chain_seed, SEGMENT_HEADER_BYTES);
    while at < bytes.len() {
        match decode_record_at(bytes, at, chain) {
            Ok(record) => {
                expected = record.seq + 1;
                chain = record.crc;
                at += record.size;
            }
            Err(_) if zeros_from(bytes, at) => break,
            Err(_) => {
                let last = bytes.len().checked_sub(RECORD_OVERHEAD)?;
                let resumed = (at + 1..=last)
                    .find(|&p| p >= SEGMENT_HEADER_BYTES + 4 && decode_record_at_bounded(bytes, p, u32_at(bytes, p - 4), MAX_PAYLOAD).is_ok())?;
                chain = u32_at(bytes, resumed - 4);
                at = resumed;
            }
        }
    }
    Some((expected, chain))
}

/// Checks the segments after `after` (the file where [`scan`] stopped) each
/// on its own, from its header's first sequence number and chain seed, so
/// that `journal verify` reports every damaged segment, not only the first.
/// Returns one problem per damaged segment (its first), including a
/// segment that does not follow on from the one before it.
pub fn check_later_segments(dir: &Path, after: &Path) -> Vec<Corruption> {
    let Ok(segments) = list(dir, "segment-", ".xbj") else {
        return Vec::new();
    };
    let mut problems = Vec::new();
    // (seq after the last record, its checksum) of the previous segment, if
    // it is known: read to its end, past its damage if records that verify
    // come after it (so that a missing segment after a damaged one is
    // named too).
    let mut previous: Option<(u64, u32)> = std::fs::read(after).ok().and_then(|bytes| segment_end_past_damage(&bytes));
    for (named_seq, path) in segments.iter().filter(|(_, p)| p.as_path() > after) {
        let corrupt = |offset: usize, seq: u64, what: String| Corruption { file: path.clone(), offset: offset as u64, seq, what };
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) => {
                problems.push(corrupt(0, *named_seq, format!("cannot read: {e}")));
                previous = None;
                continue;
            }
        };
        let header = match parse_segment_header(&bytes) {
            Ok(header) => header,
            Err(what) => {
                problems.push(corrupt(0, *named_seq, what));
                previous = None;
                continue;
            }
        };
        if let Some((next, crc)) = previous
            && (header.first_seq != next || header.chain_seed != crc)
        {
            problems.push(corrupt(0, next, format!("does not follow on from the previous segment (starts at seq {})", header.first_seq)));
        }
        let (mut expected, mut chain, mut at) = (header.first_seq, header.chain_seed, SEGMENT_HEADER_BYTES);
        let mut damaged = false;
        while at < bytes.len() {
            match decode_record_at(&bytes, at, chain) {
                Ok(record) if record.seq == expected => {
                    chain = record.crc;
                    expected += 1;
                    at += record.size;
                }
                Ok(record) => {
                    problems.push(corrupt(at, expected, format!("holds seq {}", record.seq)));
                    damaged = true;
                    break;
                }
                Err(_) if zeros_from(&bytes, at) => break,
                Err(error) => {
                    // Worded as the first damaged segment's is.
                    let what = if valid_record_after(&bytes, at, MAX_PAYLOAD) { format!("{error}, and valid records follow") } else { error.to_string() };
                    problems.push(corrupt(at, expected, what));
                    damaged = true;
                    break;
                }
            }
        }
        previous = if damaged { segment_end_past_damage(&bytes) } else { Some((expected, chain)) };
    }
    problems
}

/// Checks every segment in `dir` in order and calls `visit(seq, payload)` for
/// each valid record. A `visit` error is reported as corruption at that
/// record.
pub fn scan(dir: &Path, mut visit: impl FnMut(u64, &[u8]) -> Result<(), String>) -> Result<JournalEnd, Corruption> {
    scan_chained(dir, |seq, payload, _| visit(seq, payload))
}

/// [`scan_chained_from`], with each record's timestamp (milliseconds since
/// the Unix epoch; 0 in segments before version 3):
/// `visit(seq, time_ms, payload, crc)`, the payload without its timestamp.
pub fn scan_timed_from(dir: &Path, from: u64, visit: impl FnMut(u64, u64, &[u8], u32) -> Result<(), String>) -> Result<JournalEnd, Corruption> {
    scan_segments(dir, from, visit)
}

/// [`scan`], with each record's chained checksum: `visit(seq, payload,
/// crc)`. A snapshot names the checksum of the record it continues.
pub fn scan_chained(dir: &Path, visit: impl FnMut(u64, &[u8], u32) -> Result<(), String>) -> Result<JournalEnd, Corruption> {
    scan_chained_from(dir, 1, visit)
}

/// [`scan_chained`] from the segment that holds record `from` on (the
/// segments before it are not read: their end is that segment's chain
/// seed, which its checksummed header carries). Records before `from` in
/// that segment are visited too.
pub fn scan_chained_from(dir: &Path, from: u64, mut visit: impl FnMut(u64, &[u8], u32) -> Result<(), String>) -> Result<JournalEnd, Corruption> {
    scan_segments(dir, from, |seq, _, payload, crc| visit(seq, payload, crc))
}

fn scan_segments(dir: &Path, from: u64, mut visit: impl FnMut(u64, u64, &[u8], u32) -> Result<(), String>) -> Result<JournalEnd, Corruption> {
    let segments = list(dir, "segment-", ".xbj").map_err(|e| Corruption {
        file: dir.to_path_buf(),
        offset: 0,
        seq: 1,
        what: format!("cannot list the journal directory: {e}"),
    })?;
    let mut end = JournalEnd { last_seq: 0, last_crc: 0, tail: None, torn: None, records: 0, segments: segments.len() };
    let mut expected = 1u64;
    let mut chain = 0u32;
    let start = segments.iter().rposition(|(first, _)| *first <= from).unwrap_or(0);
    if start > 0 {
        let (named_seq, path) = &segments[start];
        let corrupt = |what: String| Corruption { file: path.clone(), offset: 0, seq: *named_seq, what };
        let mut file = File::open(path).map_err(|e| corrupt(format!("cannot open: {e}")))?;
        let mut header = [0u8; SEGMENT_HEADER_BYTES];
        let got = read_full(&mut file, &mut header).map_err(|e| corrupt(format!("cannot read: {e}")))?;
        let parsed = parse_segment_header(&header[..got]).map_err(corrupt)?;
        expected = parsed.first_seq;
        chain = parsed.chain_seed;
        end.last_seq = expected - 1;
        end.last_crc = chain;
    }
    for (index, (named_seq, path)) in segments.iter().enumerate().skip(start) {
        let is_last = index + 1 == segments.len();
        let corrupt = |offset: usize, seq: u64, what: String| Corruption { file: path.clone(), offset: offset as u64, seq, what };
        // The common case: read in chunks, every record fine.
        let resume = match fast_segment(path, *named_seq, &mut expected, &mut chain, &mut end, &mut visit)? {
            Fast::Complete(length) => {
                end.tail = Some((path.clone(), length));
                continue;
            }
            Fast::Stopped(offset) => offset,
        };
        // Something is off at `resume`: read the whole segment and decide
        // between a torn tail and corruption.
        let bytes = std::fs::read(path).map_err(|e| corrupt(0, expected, format!("cannot read: {e}")))?;
        let header = match parse_segment_header(&bytes) {
            Ok(header) => header,
            Err(what) => {
                // A header a crash cut off is short, or ends in the zeros
                // not yet written over (its checksum, its last field, is
                // written with it); a whole header that fails its checks is
                // damage (or no segment of ours), never dropped as torn.
                let unwritten = bytes.len() < SEGMENT_HEADER_BYTES || bytes[SEGMENT_HEADER_BYTES - 4..SEGMENT_HEADER_BYTES] == [0; 4];
                if is_last && unwritten && !valid_record_after(&bytes, SEGMENT_HEADER_BYTES.min(bytes.len()), MAX_PAYLOAD) {
                    end.torn = Some(TornTail { file: path.clone(), offset: 0, seq: expected, what, whole_segment: true });
                    break;
                }
                return Err(corrupt(0, expected, what));
            }
        };
        if header.first_seq != *named_seq {
            return Err(corrupt(0, expected, format!("named for seq {named_seq} but its header says {}", header.first_seq)));
        }
        if resume == 0 && header.first_seq != expected {
            return Err(corrupt(0, expected, format!("starts at seq {}: records {expected}.. are missing", header.first_seq)));
        }
        if resume == 0 && header.chain_seed != chain {
            return Err(corrupt(0, expected, "does not chain to the end of the previous segment".into()));
        }
        let version = header.version;
        let timed = |seq: u64, payload: &[u8], crc: u32| -> Result<(), String> {
            let (time, rest) = split_time(version, payload)?;
            visit(seq, time, rest, crc)
        };
        let records = read_records(&bytes, resume.max(SEGMENT_HEADER_BYTES), expected, chain, MAX_PAYLOAD, is_last, timed)
            .map_err(|damage| corrupt(damage.offset, damage.seq, damage.what))?;
        end.last_seq = records.next_seq - 1;
        end.records += records.count;
        expected = records.next_seq;
        chain = records.chain;
        let at = records.end;
        if let Some(what) = records.torn {
            end.torn = Some(TornTail { file: path.clone(), offset: at as u64, seq: expected, what, whole_segment: false });
            end.tail = Some((path.clone(), at as u64));
            end.last_crc = chain;
            return Ok(end);
        }
        end.tail = Some((path.clone(), at.min(bytes.len()) as u64));
    }
    end.last_crc = chain;
    Ok(end)
}

enum Fast {
    /// Every record checked out; the segment's length.
    Complete(u64),
    /// Stopped at this file offset (0: the header) for the careful path.
    Stopped(usize),
}

const CHUNK_BYTES: usize = 4 << 20;

fn read_full(file: &mut File, buffer: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match file.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Reads a segment in chunks and visits its records while all is well;
/// stops at the first thing that is not (an unreadable header, a bad or
/// incomplete record) and says where.
fn fast_segment(
    path: &Path,
    named_seq: u64,
    expected: &mut u64,
    chain: &mut u32,
    end: &mut JournalEnd,
    visit: &mut impl FnMut(u64, u64, &[u8], u32) -> Result<(), String>,
) -> Result<Fast, Corruption> {
    let corrupt = |offset: usize, seq: u64, what: String| Corruption { file: path.to_path_buf(), offset: offset as u64, seq, what };
    let mut file = File::open(path).map_err(|e| corrupt(0, *expected, format!("cannot open: {e}")))?;
    let mut header = [0u8; SEGMENT_HEADER_BYTES];
    let got = read_full(&mut file, &mut header).map_err(|e| corrupt(0, *expected, format!("cannot read: {e}")))?;
    let Ok(parsed) = parse_segment_header(&header[..got]) else {
        return Ok(Fast::Stopped(0));
    };
    if parsed.first_seq != named_seq {
        return Err(corrupt(0, *expected, format!("named for seq {named_seq} but its header says {}", parsed.first_seq)));
    }
    if parsed.first_seq != *expected {
        return Err(corrupt(0, *expected, format!("starts at seq {}: records {}.. are missing", parsed.first_seq, *expected)));
    }
    if parsed.chain_seed != *chain {
        return Err(corrupt(0, *expected, "does not chain to the end of the previous segment".into()));
    }
    // `buffer[0]` is at file offset `base`; the 4 bytes before each record
    // stay in the buffer so that its chained checksum is one pass.
    let mut buffer: Vec<u8> = header[SEGMENT_HEADER_BYTES - 4..].to_vec();
    let mut base = SEGMENT_HEADER_BYTES - 4;
    let mut at = 4;
    loop {
        let filled = buffer.len();
        buffer.resize(filled + CHUNK_BYTES, 0);
        let read = read_full(&mut file, &mut buffer[filled..]).map_err(|e| corrupt(base + at, *expected, format!("cannot read: {e}")))?;
        buffer.truncate(filled + read);
        let at_eof = read < CHUNK_BYTES;
        while at < buffer.len() {
            match decode_record_at(&buffer, at, *chain) {
                Ok(record) if record.seq == *expected => {
                    let (time, rest) = split_time(parsed.version, record.payload).map_err(|what| corrupt(base + at, *expected, what))?;
                    visit(record.seq, time, rest, record.crc).map_err(|what| corrupt(base + at, *expected, what))?;
                    *chain = record.crc;
                    end.last_seq = *expected;
                    end.records += 1;
                    *expected += 1;
                    at += record.size;
                }
                Err(RecordError::Incomplete) if !at_eof => break,
                // Zeros to the end of the file: the space written ahead.
                _ if zeros_from(&buffer, at) && rest_is_zero(&mut file).unwrap_or(false) => return Ok(Fast::Complete((base + at) as u64)),
                _ => return Ok(Fast::Stopped(base + at)),
            }
        }
        if at_eof && at >= buffer.len() {
            return Ok(Fast::Complete((base + at) as u64));
        }
        buffer.drain(..at - 4);
        base += at - 4;
        at = 4;
    }
}

/// Whether the rest of `file` (from its current position) is all zeros.
fn rest_is_zero(file: &mut File) -> std::io::Result<bool> {
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        let read = read_full(file, &mut chunk)?;
        if !chunk[..read].iter().all(|&b| b == 0) {
            return Ok(false);
        }
        if read < chunk.len() {
            return Ok(true);
        }
    }
}

/// A snapshot file found in the directory, newest first.
pub fn snapshots(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut found = list(dir, "snapshot-", ".xbs")?;
    found.reverse();
    Ok(found)
}

/// Temporary snapshot files (`snapshot-N.xbs.tmp`) a stopped process left:
/// a snapshot is renamed into place only once it is whole and synced, so
/// these are never part of the state.
pub fn snapshot_leftovers(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    Ok(list(dir, "snapshot-", ".xbs.tmp")?.into_iter().map(|(_, path)| path).collect())
}

/// Whether a snapshot file carries attachments (version 3 with a non-empty
/// attachments part). Reads the header and one length, not the state; the
/// file is not checked (loading it does that).
pub fn snapshot_has_attachments(path: &Path) -> std::io::Result<bool> {
    use std::io::{Seek, SeekFrom};
    let mut file = File::open(path)?;
    let mut header = [0u8; SNAPSHOT_HEADER_BYTES];
    if read_full(&mut file, &mut header)? < SNAPSHOT_HEADER_BYTES || &header[0..8] != SNAPSHOT_MAGIC || u32_at(&header, 8) < 3 {
        return Ok(false);
    }
    let Some(at) = u64_at(&header, 24).checked_add(SNAPSHOT_HEADER_BYTES as u64) else {
        return Ok(false);
    };
    file.seek(SeekFrom::Start(at))?;
    let mut length = [0u8; 8];
    Ok(read_full(&mut file, &mut length)? == 8 && u64::from_le_bytes(length) > 0)
}
