//! Byte layouts of segment headers, records and snapshot files
//! (`docs/journal.md` has the same tables).

use crossbook_engine::codec::MAX_COMMAND_BYTES;
use std::path::{Path, PathBuf};

pub const SEGMENT_MAGIC: &[u8; 8] = b"XBJOURNL";
/// Version 3 records begin their payload with the sequencer's timestamp
/// (u64 milliseconds since the Unix epoch); version 2 records may carry an
/// annex after the command; segments of versions 1 and 2 are still read
/// (no time: 0).
pub const SEGMENT_VERSION: u32 = 3;
/// Bytes of a version 3 payload's timestamp.
pub const TIME_BYTES: usize = 8;
/// magic 8 | version u32 | command format u32 | first_seq u64 | chain_seed u32 | header_crc u32
pub const SEGMENT_HEADER_BYTES: usize = 32;

/// len u32 | seq u64 | payload | crc u32
pub const RECORD_OVERHEAD: usize = 16;
/// An annex: bytes a gateway keeps with a command (length u8 + bytes).
pub const MAX_ANNEX: usize = 128;
pub const MAX_PAYLOAD: usize = TIME_BYTES + MAX_COMMAND_BYTES + 1 + MAX_ANNEX;

pub const SNAPSHOT_MAGIC: &[u8; 8] = b"XBSNAPSH";
/// Version 2 names the journal record it continues (`chain`); version 1
/// snapshots, which cannot, are never used (`docs/journal.md`). Version 3
/// adds the attachments: bytes the gateways keep with the state (their own
/// state at the same command), opaque to the journal. Version 2 files are
/// still read (no attachments).
pub const SNAPSHOT_VERSION: u32 = 3;
/// magic 8 | version u32 | seq u64 | chain u32 | state_len u64 | state |
/// attachments_len u64 | attachments | crc u32 (version 2: no attachments)
pub const SNAPSHOT_HEADER_BYTES: usize = 32;

pub fn segment_name(first_seq: u64) -> String {
    format!("segment-{first_seq:020}.xbj")
}

pub fn snapshot_name(seq: u64) -> String {
    format!("snapshot-{seq:020}.xbs")
}

/// The number in a file name of the given prefix and suffix, if it is one.
pub fn numbered(path: &Path, prefix: &str, suffix: &str) -> Option<u64> {
    let name = path.file_name()?.to_str()?;
    let digits = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Files of one kind in `dir`, sorted by their number.
pub fn list(dir: &Path, prefix: &str, suffix: &str) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if let Some(number) = numbered(&path, prefix, suffix) {
            found.push((number, path));
        }
    }
    found.sort();
    Ok(found)
}

pub fn segment_header(first_seq: u64, chain_seed: u32) -> [u8; SEGMENT_HEADER_BYTES] {
    let mut header = [0u8; SEGMENT_HEADER_BYTES];
    header[0..8].copy_from_slice(SEGMENT_MAGIC);
    header[8..12].copy_from_slice(&SEGMENT_VERSION.to_le_bytes());
    header[12..16].copy_from_slice(&crossbook_engine::codec::COMMAND_FORMAT_VERSION.to_le_bytes());
    header[16..24].copy_from_slice(&first_seq.to_le_bytes());
    header[24..28].copy_from_slice(&chain_seed.to_le_bytes());
    let crc = crc32c::crc32c(&header[0..28]);
    header[28..32].copy_from_slice(&crc.to_le_bytes());
    header
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    pub first_seq: u64,
    pub chain_seed: u32,
    pub version: u32,
    /// The command encoding's version (`crossbook_engine::codec`).
    pub format: u32,
}

pub fn parse_segment_header(bytes: &[u8]) -> Result<SegmentHeader, String> {
    if bytes.len() < SEGMENT_HEADER_BYTES {
        return Err(format!("header truncated ({} of {SEGMENT_HEADER_BYTES} bytes)", bytes.len()));
    }
    if &bytes[0..8] != SEGMENT_MAGIC {
        return Err("not a journal segment (bad magic)".into());
    }
    let crc = u32_at(bytes, 28);
    if crc32c::crc32c(&bytes[0..28]) != crc {
        return Err("header checksum mismatch".into());
    }
    let version = u32_at(bytes, 8);
    let format = u32_at(bytes, 12);
    if !(1..=SEGMENT_VERSION).contains(&version) || !(1..=crossbook_engine::codec::COMMAND_FORMAT_VERSION).contains(&format) {
        return Err(format!("unsupported segment version {version} / command format {format}"));
    }
    Ok(SegmentHeader { first_seq: u64_at(bytes, 16), chain_seed: u32_at(bytes, 24), version, format })
}

/// A record's timestamp and the rest of its payload (the command and its
/// annex), by the version of the segment it is in.
pub fn split_time(version: u32, payload: &[u8]) -> Result<(u64, &[u8]), String> {
    if version < 3 {
        return Ok((0, payload));
    }
    if payload.len() < TIME_BYTES {
        return Err(format!("a payload of {} bytes has no room for its timestamp", payload.len()));
    }
    Ok((u64_at(payload, 0), &payload[TIME_BYTES..]))
}

/// A record's payload: the command and, if there is one, its annex
/// (`annex_len u8 | annex` after the command's bytes).
pub fn split_payload(payload: &[u8]) -> Result<(crossbook_engine::Command, Option<&[u8]>), String> {
    let (command, used) = crossbook_engine::codec::decode_command_prefix(payload).map_err(|e| format!("undecodable command: {e}"))?;
    let rest = &payload[used..];
    match rest.split_first() {
        None => Ok((command, None)),
        Some((&len, annex)) if len as usize == annex.len() && !annex.is_empty() && annex.len() <= MAX_ANNEX => Ok((command, Some(annex))),
        Some(_) => Err(format!("bad annex after the command ({} bytes)", rest.len())),
    }
}

pub fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

pub fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

/// The checksum of a record: CRC32C over the previous record's checksum
/// (little-endian) followed by the record's bytes up to its checksum field.
/// Chaining catches a record in the wrong place, a missing one, or two
/// swapped.
pub fn record_crc(previous: u32, body: &[u8]) -> u32 {
    let seeded = crc32c::crc32c(&previous.to_le_bytes());
    crc32c::crc32c_append(seeded, body)
}

/// Appends one record to `out`; returns its checksum (the next record's
/// chain value).
pub fn encode_record(out: &mut Vec<u8>, previous: u32, seq: u64, payload: &[u8]) -> u32 {
    encode_record_bounded(out, previous, seq, payload, MAX_PAYLOAD)
}

/// [`encode_record`] for a file of records of up to `max_payload` bytes
/// (the same framing: the FIX session stores use it).
#[inline]
pub fn encode_record_bounded(out: &mut Vec<u8>, previous: u32, seq: u64, payload: &[u8], max_payload: usize) -> u32 {
    assert!(!payload.is_empty() && payload.len() <= max_payload, "payload of {} bytes", payload.len());
    let start = out.len();
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(payload);
    seal_record(out, start, previous)
}

/// Appends the chained checksum to the record that starts at `out[start..]`
/// (its length, sequence number and payload already written); returns it.
#[inline]
pub fn seal_record(out: &mut Vec<u8>, start: usize, previous: u32) -> u32 {
    let crc = if start >= 4 && u32_at(out, start - 4) == previous {
        crc32c::crc32c(&out[start - 4..])
    } else {
        record_crc(previous, &out[start..])
    };
    out.extend_from_slice(&crc.to_le_bytes());
    crc
}

/// A record read back from a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordView<'a> {
    pub seq: u64,
    pub payload: &'a [u8],
    pub crc: u32,
    /// Total bytes of the record.
    pub size: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordError {
    /// Fewer bytes remain than the record says it has.
    Incomplete,
    BadLength(u32),
    /// The checksum does not match (with the given chain value).
    BadChecksum,
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordError::Incomplete => f.write_str("record runs past the end of the file"),
            RecordError::BadLength(len) => write!(f, "impossible record length {len}"),
            RecordError::BadChecksum => f.write_str("checksum mismatch"),
        }
    }
}

/// Parses the record at `buffer[at..]` with chain value `previous`. When
/// the previous record's checksum lies just before it in the buffer (every
/// record but a segment's first), the chained checksum is one CRC pass over
/// contiguous bytes.
#[inline]
pub fn decode_record_at(buffer: &[u8], at: usize, previous: u32) -> Result<RecordView<'_>, RecordError> {
    decode_record_at_bounded(buffer, at, previous, MAX_PAYLOAD)
}

/// [`decode_record_at`] for records of up to `max_payload` bytes.
#[inline]
pub fn decode_record_at_bounded(buffer: &[u8], at: usize, previous: u32, max_payload: usize) -> Result<RecordView<'_>, RecordError> {
    let contiguous = at >= 4 && u32_at(buffer, at - 4) == previous;
    let bytes = &buffer[at..];
    let size = record_size(bytes, max_payload)?;
    let crc = u32_at(bytes, size - 4);
    let computed = if contiguous { crc32c::crc32c(&buffer[at - 4..at + size - 4]) } else { record_crc(previous, &bytes[..size - 4]) };
    if computed != crc {
        return Err(RecordError::BadChecksum);
    }
    Ok(RecordView { seq: u64_at(bytes, 4), payload: &bytes[12..size - 4], crc, size })
}

/// The total size of the record at the start of `bytes`, once its length
/// field is sane and the whole record is there.
#[inline]
fn record_size(bytes: &[u8], max_payload: usize) -> Result<usize, RecordError> {
    if bytes.len() < 4 {
        return Err(RecordError::Incomplete);
    }
    let len = u32_at(bytes, 0);
    if len == 0 || len as usize > max_payload {
        return Err(RecordError::BadLength(len));
    }
    let size = RECORD_OVERHEAD + len as usize;
    if bytes.len() < size {
        return Err(RecordError::Incomplete);
    }
    Ok(size)
}

/// Parses the record at the start of `bytes`, checking its checksum against
/// the chain value `previous`.
pub fn decode_record(bytes: &[u8], previous: u32) -> Result<RecordView<'_>, RecordError> {
    decode_record_at(bytes, 0, previous)
}

/// What a snapshot says it is: the state after command `seq`, continuing
/// the journal whose record `seq` has the checksum `chain` (0 for seq 0).
/// The chained checksum depends on every record before it, so a journal
/// that holds a record `seq` with this checksum holds the very history the
/// state was built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotHeader {
    pub seq: u64,
    pub chain: u32,
}

pub fn encode_snapshot(header: SnapshotHeader, state: &[u8], attachments: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(SNAPSHOT_HEADER_BYTES + state.len() + 8 + attachments.len() + 4);
    out.extend_from_slice(SNAPSHOT_MAGIC);
    out.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
    out.extend_from_slice(&header.seq.to_le_bytes());
    out.extend_from_slice(&header.chain.to_le_bytes());
    out.extend_from_slice(&(state.len() as u64).to_le_bytes());
    out.extend_from_slice(state);
    out.extend_from_slice(&(attachments.len() as u64).to_le_bytes());
    out.extend_from_slice(attachments);
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Why a snapshot file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotError {
    /// Damaged, truncated, or not a snapshot.
    Damaged(String),
    /// A format that does not name the journal record it continues.
    Unbound { version: u32 },
}

impl std::fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SnapshotError::Damaged(what) => f.write_str(what),
            SnapshotError::Unbound { version } => {
                write!(f, "snapshot format version {version} does not name the journal record it continues")
            }
        }
    }
}

/// A snapshot file's parts, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotParts<'a> {
    pub header: SnapshotHeader,
    /// The engine state.
    pub state: &'a [u8],
    /// What the gateways kept with it (empty in version 2).
    pub attachments: &'a [u8],
}

/// The header, state and attachment bytes of a snapshot file, checked.
pub fn decode_snapshot(bytes: &[u8]) -> Result<SnapshotParts<'_>, SnapshotError> {
    let damaged = |what: String| SnapshotError::Damaged(what);
    if bytes.len() < 12 || &bytes[0..8] != SNAPSHOT_MAGIC {
        return Err(damaged("not a snapshot (bad magic)".into()));
    }
    let body = &bytes[..bytes.len() - 4];
    if bytes.len() < 16 || crc32c::crc32c(body) != u32_at(bytes, bytes.len() - 4) {
        return Err(damaged("checksum mismatch".into()));
    }
    let version = u32_at(bytes, 8);
    if version == 1 {
        return Err(SnapshotError::Unbound { version });
    }
    if version != 2 && version != SNAPSHOT_VERSION {
        return Err(damaged(format!("unsupported snapshot version {version}")));
    }
    if bytes.len() < SNAPSHOT_HEADER_BYTES + 4 {
        return Err(damaged(format!("truncated ({} bytes)", bytes.len())));
    }
    let header = SnapshotHeader { seq: u64_at(bytes, 12), chain: u32_at(bytes, 20) };
    let rest = &body[SNAPSHOT_HEADER_BYTES..];
    let len = u64_at(bytes, 24);
    if version == 2 {
        if len != rest.len() as u64 {
            return Err(damaged(format!("length field {len} disagrees with the file size")));
        }
        return Ok(SnapshotParts { header, state: rest, attachments: &[] });
    }
    if len > rest.len() as u64 || rest.len() as u64 - len < 8 {
        return Err(damaged(format!("length field {len} disagrees with the file size")));
    }
    let (state, rest) = rest.split_at(len as usize);
    let attached = u64_at(rest, 0);
    if attached != (rest.len() - 8) as u64 {
        return Err(damaged(format!("attachments length field {attached} disagrees with the file size")));
    }
    Ok(SnapshotParts { header, state, attachments: &rest[8..] })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An annex is 1 to `MAX_ANNEX` bytes, its length byte exact.
    #[test]
    fn an_annex_is_one_to_max_annex_bytes() {
        let mut payload = Vec::new();
        crossbook_engine::codec::encode_command(&crossbook_engine::Command::OpenAccount { account: 7 }, &mut payload);
        let command = payload.len();
        for (len, ok) in [(1, true), (MAX_ANNEX, true), (MAX_ANNEX + 1, false)] {
            payload.truncate(command);
            payload.push(len as u8);
            payload.extend(std::iter::repeat_n(b'a', len));
            assert_eq!(split_payload(&payload).is_ok(), ok, "an annex of {len} bytes");
        }
        payload.truncate(command);
        payload.extend([2, b'a']);
        assert!(split_payload(&payload).is_err(), "a length that is not the annex's");
    }

    #[test]
    fn records_read_back_and_chain() {
        let mut buffer = Vec::new();
        let first = encode_record(&mut buffer, 0, 1, b"hello");
        let second = encode_record(&mut buffer, first, 2, b"world!");
        let a = decode_record(&buffer, 0).unwrap();
        assert_eq!((a.seq, a.payload, a.crc), (1, &b"hello"[..], first));
        let b = decode_record(&buffer[a.size..], a.crc).unwrap();
        assert_eq!((b.seq, b.payload, b.crc), (2, &b"world!"[..], second));
        // The second record does not verify with the wrong chain value: a
        // record moved elsewhere, or after a missing one, is caught.
        assert_eq!(decode_record(&buffer[a.size..], 0), Err(RecordError::BadChecksum));
        // Any single flipped bit is caught.
        for at in 0..a.size {
            for bit in 0..8 {
                let mut corrupt = buffer.clone();
                corrupt[at] ^= 1 << bit;
                assert!(decode_record(&corrupt, 0) != Ok(a), "flip at {at} bit {bit}");
            }
        }
        // Every strict prefix is incomplete.
        for cut in 0..a.size {
            assert!(decode_record(&buffer[..cut], 0).is_err());
        }
    }

    #[test]
    fn headers_and_snapshots_check_out_and_catch_damage() {
        let header = segment_header(42, 7);
        assert_eq!(parse_segment_header(&header), Ok(SegmentHeader { first_seq: 42, chain_seed: 7, version: SEGMENT_VERSION, format: crossbook_engine::codec::COMMAND_FORMAT_VERSION }));
        let mut bad = header;
        bad[17] ^= 1;
        assert!(parse_segment_header(&bad).is_err());
        let header = SnapshotHeader { seq: 9, chain: 0xdead_beef };
        let file = encode_snapshot(header, b"state", b"gateways");
        assert_eq!(decode_snapshot(&file), Ok(SnapshotParts { header, state: b"state", attachments: b"gateways" }));
        let bare = encode_snapshot(header, b"state", b"");
        assert_eq!(decode_snapshot(&bare), Ok(SnapshotParts { header, state: b"state", attachments: b"" }));
        let mut bad = file.clone();
        bad[30] ^= 4;
        assert!(decode_snapshot(&bad).is_err());
        assert!(decode_snapshot(&file[..file.len() - 1]).is_err());
        for cut in 0..file.len() {
            assert!(decode_snapshot(&file[..cut]).is_err(), "cut at {cut}");
        }
        // A version 1 file (no chain) is recognised and refused as such.
        let mut old = file.clone();
        old[8..12].copy_from_slice(&1u32.to_le_bytes());
        let crc = crc32c::crc32c(&old[..old.len() - 4]);
        let at = old.len() - 4;
        old[at..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(decode_snapshot(&old), Err(SnapshotError::Unbound { version: 1 }));
        // A version 2 file (state, no attachments) is still read.
        let mut two = Vec::new();
        two.extend_from_slice(SNAPSHOT_MAGIC);
        two.extend_from_slice(&2u32.to_le_bytes());
        two.extend_from_slice(&9u64.to_le_bytes());
        two.extend_from_slice(&0xdead_beefu32.to_le_bytes());
        two.extend_from_slice(&5u64.to_le_bytes());
        two.extend_from_slice(b"state");
        let crc = crc32c::crc32c(&two);
        two.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(decode_snapshot(&two), Ok(SnapshotParts { header, state: b"state", attachments: b"" }));
    }

    #[test]
    fn file_names_sort_by_number() {
        assert_eq!(segment_name(12), "segment-00000000000000000012.xbj");
        assert_eq!(numbered(Path::new("/x/segment-00000000000000000012.xbj"), "segment-", ".xbj"), Some(12));
        assert_eq!(numbered(Path::new("segment-12.xbj"), "segment-", ".xbj"), None);
        assert_eq!(numbered(Path::new("snapshot-00000000000000000012.xbs.tmp"), "snapshot-", ".xbs"), None);
    }
}
