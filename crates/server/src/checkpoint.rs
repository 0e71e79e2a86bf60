//! The gateways' checkpoints in a snapshot, and the reading of them.
//!
//! A snapshot of the engine at command `S` may carry, as its attachments
//! (opaque to the journal), each gateway's own state after the same
//! command ([`crate::sink::ReportSink::checkpoint`]): the binary gateway's
//! report numbering per account, the FIX gateway's open orders with their
//! ClOrdIDs. At start-up the report histories are rebuilt from such a
//! snapshot about `history_commands` before the journal's end instead of
//! from the first command, so a restart costs the same after a million
//! commands as after a billion (`docs/ARCHITECTURE.md`, "Start-up").
//!
//! Layout (little-endian): magic `XBGW`, version u32 (1), count u32, then
//! per gateway: name length u8, name, state length u64, state. A snapshot
//! whose checkpoints are of another version is passed over (the histories
//! are rebuilt from an older one, or from the journal's start).

use crate::sink::RestoreError;
pub(crate) use crossbook_marketdata::codec::Reader;

const MAGIC: &[u8; 4] = b"XBGW";
const VERSION: u32 = 1;
/// Longest gateway name kept.
pub(crate) const MAX_NAME: usize = 64;

/// Every gateway's checkpoint, by name, as one attachment.
pub(crate) fn encode(sections: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + sections.iter().map(|(n, s)| 9 + n.len() + s.len()).sum::<usize>());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(sections.len() as u32).to_le_bytes());
    for (name, state) in sections {
        assert!(name.len() <= MAX_NAME, "gateway name {name:?} longer than {MAX_NAME} bytes");
        out.push(name.len() as u8);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(state.len() as u64).to_le_bytes());
        out.extend_from_slice(state);
    }
    out
}

/// The checkpoints of an attachment, by name.
pub(crate) fn decode(bytes: &[u8]) -> Result<Vec<(String, &[u8])>, RestoreError> {
    let mut reader = Reader::new(bytes);
    if reader.take(4)? != MAGIC {
        return Err(RestoreError("not a gateway checkpoint (bad magic)".into()));
    }
    let version = reader.u32()?;
    if version != VERSION {
        return Err(RestoreError(format!("gateway checkpoints of version {version}, this build reads {VERSION}")));
    }
    let count = reader.u32()?;
    let mut sections = Vec::new();
    for _ in 0..count {
        let length = reader.u8()? as usize;
        let name = std::str::from_utf8(reader.take(length)?).map_err(|_| RestoreError("a gateway name that is not UTF-8".into()))?.to_owned();
        let size = reader.u64()?;
        let size = usize::try_from(size).map_err(|_| RestoreError(format!("gateway {name}: state of {size} bytes")))?;
        sections.push((name, reader.take(size)?));
    }
    reader.end()?;
    Ok(sections)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_round_trip_and_damage_is_refused() {
        let sections = vec![("binary".to_string(), vec![1, 2, 3]), ("fix".to_string(), Vec::new())];
        let bytes = encode(&sections);
        let decoded = decode(&bytes).unwrap();
        assert_eq!(decoded, vec![("binary".to_string(), &[1u8, 2, 3][..]), ("fix".to_string(), &[][..])]);
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode(&longer).is_err());
        let mut huge = bytes.clone();
        huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&huge).is_err());
    }
}
