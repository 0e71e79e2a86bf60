//! The replicated log's messages: each JetStream message holds one or
//! more whole batches of journaled commands as **journal records**
//! (`docs/journal.md`: length, sequence number, payload with the time
//! stamp, the command and its annex, and a CRC32C chained from the record
//! before), so a replica checks every record against the chain it has and
//! writes the very records the leader wrote. A message's headers say which
//! commands it holds (`Crossbook-Seq: first-last`), the chain value before
//! its first record and after its last, and, for a leadership marker (a
//! message with no record, written by a new leader before it takes any
//! order), the node.
//!
//! Pure: no I/O.

use crossbook_engine::Command;
use crossbook_engine::codec::encode_command;
use crossbook_journal::format::{self, decode_record_at, encode_record};

pub const HEADER_SEQ: &str = "Crossbook-Seq";
pub const HEADER_PREVIOUS: &str = "Crossbook-Previous";
pub const HEADER_CHAIN: &str = "Crossbook-Chain";
pub const HEADER_LEADER: &str = "Crossbook-Leader";
/// The command encoding of the message's records
/// (`crossbook_engine::codec::COMMAND_FORMAT_VERSION`; absent: 2 or
/// before): a node that reads an older one stops rather than misread.
pub const HEADER_ENCODING: &str = "Crossbook-Encoding";

/// The segment format version whose record payloads carry a time stamp.
const TIMED: u32 = 3;

/// One journaled command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    pub time_ms: u64,
    pub command: Command,
    pub annex: Option<Vec<u8>>,
}

/// What a message's headers say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// The first command it holds; a marker holds none: `last = first - 1`.
    pub first: u64,
    pub last: u64,
    /// The chain value before its first record, and after its last.
    pub previous: u32,
    pub chain: u32,
}

impl Span {
    pub fn is_marker(&self) -> bool {
        self.last + 1 == self.first
    }

    /// `Crossbook-Seq`'s value.
    pub fn seq_header(&self) -> String {
        format!("{}-{}", self.first, self.last)
    }

    /// Parses the three headers' values.
    pub fn parse(seq: &str, previous: &str, chain: &str) -> Option<Span> {
        let (first, last) = seq.split_once('-')?;
        let (first, last): (u64, u64) = (first.parse().ok()?, last.parse().ok()?);
        // Commands are numbered from 1: a span from 0 is no span (and
        // would take 1 from 0 where a message's records are counted).
        if first == 0 || last.checked_add(1)? < first {
            return None;
        }
        Some(Span { first, last, previous: previous.parse().ok()?, chain: chain.parse().ok()? })
    }
}

/// Builds one message's payload: records appended in order, chained.
pub struct Encoder {
    pub payload: Vec<u8>,
    first: u64,
    next: u64,
    previous: u32,
    chain: u32,
    scratch: Vec<u8>,
}

impl Encoder {
    /// A message whose first record will be `first`, following chain value
    /// `previous`.
    pub fn new(first: u64, previous: u32) -> Encoder {
        Encoder { payload: Vec::new(), first, next: first, previous, chain: previous, scratch: Vec::new() }
    }

    pub fn push(&mut self, seq: u64, time_ms: u64, command: &Command, annex: Option<&[u8]>) {
        assert_eq!(seq, self.next, "records in sequence");
        self.scratch.clear();
        self.scratch.extend_from_slice(&time_ms.to_le_bytes());
        encode_command(command, &mut self.scratch);
        if let Some(annex) = annex {
            self.scratch.push(annex.len() as u8);
            self.scratch.extend_from_slice(annex);
        }
        self.chain = encode_record(&mut self.payload, self.chain, seq, &self.scratch);
        self.next += 1;
    }

    /// Appends another encoder's records (the batch right after these).
    pub fn extend(&mut self, other: &Encoder) {
        assert_eq!((other.first, other.previous), (self.next, self.chain), "batches in sequence");
        self.payload.extend_from_slice(&other.payload);
        self.next = other.next;
        self.chain = other.chain;
    }

    pub fn is_empty(&self) -> bool {
        self.next == self.first
    }

    pub fn span(&self) -> Span {
        Span { first: self.first, last: self.next - 1, previous: self.previous, chain: self.chain }
    }
}

/// Decodes a message's records, checking that they are `span`'s, in
/// sequence, each with its chained checksum.
pub fn decode(span: &Span, payload: &[u8]) -> Result<Vec<Record>, String> {
    // Not trusting the headers' count for the allocation: a record takes 16
    // bytes at least.
    let mut records = Vec::with_capacity(((span.last + 1 - span.first) as usize).min(payload.len() / 16 + 1));
    let mut at = 0;
    let mut chain = span.previous;
    let mut expected = span.first;
    while at < payload.len() {
        let view = decode_record_at(payload, at, chain).map_err(|e| format!("record {expected} at byte {at}: {e}"))?;
        if view.seq != expected {
            return Err(format!("record {} where {expected} was due", view.seq));
        }
        let (time_ms, rest) = format::split_time(TIMED, view.payload)?;
        let (command, annex) = format::split_payload(rest)?;
        records.push(Record { seq: view.seq, time_ms, command, annex: annex.map(<[u8]>::to_vec) });
        chain = view.crc;
        at += view.size;
        expected += 1;
    }
    if expected != span.last + 1 || chain != span.chain {
        return Err(format!("the message says commands {}..={} ending at chain {:08x}; it holds up to {} ending at {chain:08x}", span.first, span.last, span.chain, expected - 1));
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbook_engine::{Command, Symbol};

    #[test]
    fn records_round_trip_and_any_damage_is_refused() {
        let commands = [
            Command::AddAsset { id: 1, name: Symbol::new("BTC").expect("name") },
            Command::OpenAccount { account: 7 },
            Command::Deposit { account: 7, asset: 1, amount: 500 },
        ];
        let mut first = Encoder::new(10, 0xDEAD_BEEF);
        first.push(10, 1_000, &commands[0], None);
        first.push(11, 1_000, &commands[1], Some(b"R-annex"));
        let mut second = Encoder::new(12, first.span().chain);
        second.push(12, 1_001, &commands[2], None);
        first.extend(&second);
        let span = first.span();
        assert_eq!((span.first, span.last, span.previous), (10, 12, 0xDEAD_BEEF));
        let parsed = Span::parse(&span.seq_header(), &span.previous.to_string(), &span.chain.to_string()).expect("headers");
        assert_eq!(parsed, span);
        let records = decode(&span, &first.payload).expect("decodes");
        assert_eq!(records.iter().map(|r| (r.seq, r.time_ms, r.command)).collect::<Vec<_>>(), vec![(10, 1_000, commands[0]), (11, 1_000, commands[1]), (12, 1_001, commands[2])]);
        assert_eq!(records[1].annex.as_deref(), Some(&b"R-annex"[..]));
        for at in 0..first.payload.len() {
            let mut bad = first.payload.clone();
            bad[at] ^= 0x40;
            assert!(decode(&span, &bad).is_err(), "a flipped bit at {at} is refused");
        }
        assert!(decode(&Span { previous: 1, ..span }, &first.payload).is_err(), "another chain");
        assert!(decode(&Span { last: 13, ..span }, &first.payload).is_err(), "a record missing");
        assert!(decode(&span, &first.payload[..first.payload.len() - 1]).is_err(), "cut");
        let marker = Encoder::new(13, span.chain).span();
        assert!(marker.is_marker());
        assert_eq!(decode(&marker, &[]), Ok(Vec::new()));
        assert_eq!(Span::parse("5-3", "0", "0"), None);
        assert_eq!(Span::parse("0-0", "0", "0"), None);
        assert_eq!(Span::parse("0-5", "0", "0"), None);
        assert!(Span::parse("1-0", "0", "0").is_some_and(|span| span.is_marker()), "a marker before the first command");
    }
}
