//! FIX tag=value messages on the wire: framing a byte stream into messages,
//! splitting a message into fields, checksums, and building outgoing
//! messages with their BodyLength (9) and CheckSum (10).
//!
//! Nothing here trusts the input: every length is bounded by the caller's
//! limit before anything is buffered for it, and no byte sequence panics.

pub const SOH: u8 = 0x01;

pub const BEGIN_STRING: u32 = 8;
pub const BODY_LENGTH: u32 = 9;
pub const CHECK_SUM: u32 = 10;
pub const MSG_TYPE: u32 = 35;
pub const MSG_SEQ_NUM: u32 = 34;
pub const SENDER_COMP_ID: u32 = 49;
pub const TARGET_COMP_ID: u32 = 56;
pub const SENDING_TIME: u32 = 52;

/// What the front of a receive buffer holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame {
    /// Not a whole message yet: read more.
    NeedMore,
    /// A message of this many bytes starts the buffer (it may still be
    /// garbled inside: [`Message::parse`] and [`check_frame`] tell).
    Message(usize),
    /// This many bytes at the front are not the start of a message: drop
    /// them and look again.
    Garbage(usize),
    /// The message at the front declares, or grows to, more than the limit.
    TooLong,
}

fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if from >= haystack.len() {
        return None;
    }
    haystack[from..].windows(needle.len()).position(|w| w == needle).map(|p| p + from)
}

/// Finds the next message in `buffer`. A message starts with `8=`, its
/// second field is `9=<length>`, and it ends with the first `<SOH>10=...<SOH>`
/// found at or after the end its length announces (so a wrong length still
/// frames the message, and the length check then rejects it as garbled,
/// rather than swallowing the messages after it). `max_bytes` bounds a
/// message; more is [`Frame::TooLong`].
pub fn frame(buffer: &[u8], max_bytes: usize) -> Frame {
    if buffer.is_empty() {
        return Frame::NeedMore;
    }
    if !buffer.starts_with(b"8=") {
        // Skip to the next "8=".
        return match find(buffer, b"8=", 1) {
            Some(at) => Frame::Garbage(at),
            // Keep a trailing "8": it may begin the next message.
            None if buffer.ends_with(b"8") => match buffer.len() {
                1 => Frame::NeedMore,
                len => Frame::Garbage(len - 1),
            },
            None => Frame::Garbage(buffer.len()),
        };
    }
    let Some(begin_end) = buffer.iter().position(|&b| b == SOH) else {
        return if buffer.len() > 64 { Frame::Garbage(2) } else { Frame::NeedMore };
    };
    let rest = &buffer[begin_end + 1..];
    if rest.len() < 2 {
        return Frame::NeedMore;
    }
    if !rest.starts_with(b"9=") {
        // The second field must be the body length: without it the
        // message cannot be framed. Drop up to the next message.
        return match find(buffer, b"8=", 2) {
            Some(at) => Frame::Garbage(at),
            None => Frame::Garbage(buffer.len()),
        };
    }
    let digits_start = begin_end + 3;
    let mut length: usize = 0;
    let mut at = digits_start;
    loop {
        let Some(&byte) = buffer.get(at) else {
            return if at - digits_start > 10 { Frame::Garbage(2) } else { Frame::NeedMore };
        };
        match byte {
            b'0'..=b'9' if at - digits_start < 10 => {
                length = length * 10 + usize::from(byte - b'0');
                at += 1;
            }
            SOH if at > digits_start => break,
            _ => {
                // Not a number: not a message we can frame.
                return match find(buffer, b"8=", 2) {
                    Some(next) => Frame::Garbage(next),
                    None => Frame::Garbage(buffer.len()),
                };
            }
        }
    }
    let body_start = at + 1;
    if length > max_bytes || body_start + length > max_bytes {
        return Frame::TooLong;
    }
    let body_end = body_start + length;
    if buffer.len() < body_end {
        return Frame::NeedMore;
    }
    // The trailer: "<SOH>10=" at or after the announced end.
    let Some(trailer) = find(buffer, b"\x0110=", body_end.saturating_sub(1).max(body_start.saturating_sub(1))) else {
        return if buffer.len() > max_bytes { Frame::TooLong } else { Frame::NeedMore };
    };
    match buffer[trailer + 4..].iter().position(|&b| b == SOH) {
        Some(end) => {
            let total = trailer + 4 + end + 1;
            if total > max_bytes { Frame::TooLong } else { Frame::Message(total) }
        }
        None if buffer.len() > max_bytes => Frame::TooLong,
        None => Frame::NeedMore,
    }
}

/// The checksum of `bytes`: their sum modulo 256.
pub fn checksum(bytes: &[u8]) -> u8 {
    bytes.iter().fold(0u8, |sum, &b| sum.wrapping_add(b))
}

/// Why a framed message is garbled (to be ignored, per the FIX session
/// rules, rather than rejected).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Garbled {
    BadBodyLength { declared: usize, actual: usize },
    BadCheckSum { declared: String, computed: u8 },
    /// A field that is not `digits=...`.
    BadField { offset: usize },
    /// The first three fields are not 8, 9, 35 or the last is not 10.
    OutOfOrder,
}

impl std::fmt::Display for Garbled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Garbled::BadBodyLength { declared, actual } => write!(f, "BodyLength is {declared}, the body has {actual} bytes"),
            Garbled::BadCheckSum { declared, computed } => write!(f, "CheckSum is {declared}, computed {computed:03}"),
            Garbled::BadField { offset } => write!(f, "malformed field at byte {offset}"),
            Garbled::OutOfOrder => f.write_str("BeginString, BodyLength and MsgType must be the first three fields, CheckSum the last"),
        }
    }
}

/// One `tag=value` of a message: the value is `raw[start..end]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    /// The tag as written; 0 and negative tags are kept (validation
    /// rejects them as invalid tag numbers).
    pub tag: i64,
    start: u32,
    end: u32,
}

/// A message split into its fields (in wire order, repeats kept).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    raw: Vec<u8>,
    fields: Vec<Field>,
}

impl Message {
    /// Splits a framed message into fields and checks its framing: the
    /// first three fields 8, 9, 35, the last 10, the body length and the
    /// checksum. Fields with an empty value are kept (validation rejects
    /// them with the right reason).
    pub fn parse(raw: &[u8]) -> Result<Message, Garbled> {
        let mut fields = Vec::with_capacity(16);
        let mut at = 0usize;
        // (data tag, its length) announced by the field before.
        let mut data: Option<(i64, usize)> = None;
        while at < raw.len() {
            let Some(eq) = raw[at..].iter().position(|&b| b == b'=') else {
                return Err(Garbled::BadField { offset: at });
            };
            let Some(tag) = parse_tag(&raw[at..at + eq]) else {
                return Err(Garbled::BadField { offset: at });
            };
            let start = at + eq + 1;
            let end = match data.take() {
                // Raw data may hold SOH: its length field says where it ends.
                // (`len` is the sender's: compared without adding, so that
                // a huge one cannot wrap around to an earlier offset.)
                Some((data_tag, len)) if data_tag == tag && len < raw.len() - start && raw[start + len] == SOH => start + len,
                _ => match raw[start..].iter().position(|&b| b == SOH) {
                    Some(len) => start + len,
                    None => return Err(Garbled::BadField { offset: at }),
                },
            };
            if let Some(&(_, data_tag)) = crate::dictionary::DATA_PAIRS.iter().find(|(len_tag, _)| i64::from(*len_tag) == tag) {
                let len = std::str::from_utf8(&raw[start..end]).ok().and_then(|t| t.parse::<usize>().ok());
                data = len.map(|len| (i64::from(data_tag), len));
            }
            fields.push(Field { tag, start: start as u32, end: end as u32 });
            at = end + 1;
        }
        let message = Message { raw: raw.to_vec(), fields };
        message.check_frame()?;
        Ok(message)
    }

    fn check_frame(&self) -> Result<(), Garbled> {
        let tags: Vec<i64> = self.fields.iter().map(|f| f.tag).collect();
        let is = |at: usize, tag: u32| tags[at] == i64::from(tag);
        if tags.len() < 4 || !is(0, BEGIN_STRING) || !is(1, BODY_LENGTH) || !is(2, MSG_TYPE) || !is(tags.len() - 1, CHECK_SUM) {
            return Err(Garbled::OutOfOrder);
        }
        let body_start = self.fields[1].end as usize + 1;
        let checksum_field = self.fields[self.fields.len() - 1];
        let trailer_start = checksum_field.start as usize - 3;
        let declared = std::str::from_utf8(self.value_of(self.fields[1])).ok().and_then(|s| s.parse::<usize>().ok());
        let actual = trailer_start - body_start;
        if declared != Some(actual) {
            return Err(Garbled::BadBodyLength { declared: declared.unwrap_or(usize::MAX), actual });
        }
        let computed = checksum(&self.raw[..trailer_start]);
        let text = self.value_of(checksum_field);
        // Three digits are sent; fewer are read (`10=7` is 007), as the
        // framing above reads them (docs/fix.md).
        let ok = (1..=3).contains(&text.len()) && text.iter().all(u8::is_ascii_digit) && std::str::from_utf8(text).ok().and_then(|s| s.parse::<u16>().ok()) == Some(u16::from(computed));
        if !ok {
            return Err(Garbled::BadCheckSum { declared: String::from_utf8_lossy(text).into_owned(), computed });
        }
        Ok(())
    }

    pub fn raw(&self) -> &[u8] {
        &self.raw
    }

    /// The bytes it holds: its text and its field index.
    pub fn footprint(&self) -> usize {
        self.raw.len() + self.fields.len() * std::mem::size_of::<Field>()
    }

    pub fn fields(&self) -> &[Field] {
        &self.fields
    }

    pub fn value_of(&self, field: Field) -> &[u8] {
        &self.raw[field.start as usize..field.end as usize]
    }

    /// The value of the first field with `tag`.
    pub fn get(&self, tag: u32) -> Option<&[u8]> {
        self.fields.iter().find(|f| f.tag == i64::from(tag)).map(|f| self.value_of(*f))
    }

    /// The value of the first field with `tag`, as text.
    pub fn text(&self, tag: u32) -> Option<&str> {
        self.get(tag).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The value of the first field with `tag` as an unsigned integer.
    pub fn number(&self, tag: u32) -> Option<u64> {
        let value = self.get(tag)?;
        if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(value).ok()?.parse().ok()
    }

    pub fn msg_type(&self) -> &[u8] {
        self.get(MSG_TYPE).unwrap_or(b"")
    }

    /// Every (tag, value) in wire order.
    pub fn iter(&self) -> impl Iterator<Item = (i64, &[u8])> {
        self.fields.iter().map(|f| (f.tag, self.value_of(*f)))
    }
}

/// A tag: an optional minus and up to nine digits.
fn parse_tag(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text.first() {
        Some(b'-') => (true, &text[1..]),
        _ => (false, text),
    };
    if digits.is_empty() || digits.len() > 9 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let value = digits.iter().fold(0i64, |n, &d| n * 10 + i64::from(d - b'0'));
    Some(if negative { -value } else { value })
}

/// Builds one outgoing message: the caller adds the header fields after
/// 8/9 and the body in the order they must appear; [`Builder::finish`]
/// writes BeginString, BodyLength and CheckSum around them.
pub struct Builder {
    body: Vec<u8>,
}

impl Default for Builder {
    fn default() -> Self {
        Self::new()
    }
}

impl Builder {
    pub fn new() -> Builder {
        Builder { body: Vec::with_capacity(256) }
    }

    // Tags and numbers are written straight into the message (`write!`
    // on a `Vec` cannot fail), not through a `String` each: every report
    // is a few dozen fields.

    pub fn field(&mut self, tag: u32, value: &[u8]) -> &mut Self {
        self.tag(tag);
        self.body.extend_from_slice(value);
        self.body.push(SOH);
        self
    }

    pub fn str(&mut self, tag: u32, value: &str) -> &mut Self {
        self.field(tag, value.as_bytes())
    }

    pub fn num(&mut self, tag: u32, value: impl std::fmt::Display) -> &mut Self {
        self.tag(tag);
        let _ = std::io::Write::write_fmt(&mut self.body, format_args!("{value}"));
        self.body.push(SOH);
        self
    }

    fn tag(&mut self, tag: u32) {
        let _ = std::io::Write::write_fmt(&mut self.body, format_args!("{tag}="));
    }

    /// The complete message with `begin_string` (e.g. `FIX.4.4`).
    pub fn finish(&self, begin_string: &str) -> Vec<u8> {
        use std::io::Write;
        let mut out = Vec::with_capacity(self.body.len() + 32);
        out.extend_from_slice(b"8=");
        out.extend_from_slice(begin_string.as_bytes());
        out.push(SOH);
        let _ = write!(out, "9={}", self.body.len());
        out.push(SOH);
        out.extend_from_slice(&self.body);
        let sum = checksum(&out);
        let _ = write!(out, "10={sum:03}");
        out.push(SOH);
        out
    }
}

/// A message for a log line: SOH shown as `|`.
pub fn printable(raw: &[u8]) -> String {
    raw.iter().map(|&b| if b == SOH { '|' } else if b.is_ascii_graphic() || b == b' ' { b as char } else { '?' }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn soh(text: &str) -> Vec<u8> {
        text.replace('|', "\x01").into_bytes()
    }

    #[test]
    fn a_built_message_frames_and_parses_back() {
        let mut b = Builder::new();
        b.str(MSG_TYPE, "A").num(MSG_SEQ_NUM, 1).str(SENDER_COMP_ID, "ISLD").str(SENDING_TIME, "20020619-16:14:10.000").str(TARGET_COMP_ID, "TW");
        b.num(98, 0).num(108, 2);
        let raw = b.finish("FIX.4.4");
        assert_eq!(frame(&raw, 4096), Frame::Message(raw.len()));
        let m = Message::parse(&raw).expect("valid");
        assert_eq!(m.msg_type(), b"A");
        assert_eq!(m.number(108), Some(2));
        assert_eq!(m.text(49), Some("ISLD"));
        // Body length as the acceptance scripts count it.
        assert_eq!(m.text(BODY_LENGTH), Some("60"));
    }

    #[test]
    fn framing_skips_garbage_and_waits_for_the_rest() {
        let good = soh("8=FIX.4.4|9=5|35=0|10=163|");
        let mut stream = b"garbage".to_vec();
        stream.extend_from_slice(&good);
        assert_eq!(frame(&stream, 4096), Frame::Garbage(7));
        for cut in 1..good.len() {
            assert_eq!(frame(&good[..cut], 4096), Frame::NeedMore, "cut at {cut}");
        }
        assert_eq!(frame(&good, 4096), Frame::Message(good.len()));
    }

    #[test]
    fn a_wrong_body_length_still_frames_and_is_garbled() {
        let wrong = soh("8=FIX.4.4|9=3|35=0|34=2|10=000|8=FIX.4.4|9=5|35=0|10=163|");
        let Frame::Message(len) = frame(&wrong, 4096) else { panic!("not framed") };
        assert!(matches!(Message::parse(&wrong[..len]), Err(Garbled::BadBodyLength { .. })));
        assert_eq!(frame(&wrong[len..], 4096), Frame::Message(wrong.len() - len));
    }

    #[test]
    fn a_bad_checksum_is_garbled() {
        let raw = soh("8=FIX.4.4|9=5|35=0|10=164|");
        assert!(matches!(Message::parse(&raw), Err(Garbled::BadCheckSum { .. })));
        // Fewer than three digits are read as the number they say: a
        // message whose sum is below 100, written `10=NN`.
        let short = (b'!'..=b'~')
            .flat_map(|c| (b'!'..=b'~').map(move |d| soh(&format!("8=FIX.4.4|9=11|35=0|58={}{}|", c as char, d as char))))
            .find(|head| checksum(head) < 100)
            .map(|mut head| {
                let sum = checksum(&head);
                head.extend_from_slice(format!("10={sum}\x01").as_bytes());
                head
            })
            .expect("a message summing below 100");
        assert!(Message::parse(&short).is_ok(), "{}", String::from_utf8_lossy(&short));
        for bad in ["10=0163|", "10=|", "10=1a|"] {
            let raw = soh(&format!("8=FIX.4.4|9=5|35=0|{bad}"));
            assert!(Message::parse(&raw).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_huge_declared_length_is_refused_before_buffering() {
        let raw = soh("8=FIX.4.4|9=10000000|35=D|");
        assert_eq!(frame(&raw, 65536), Frame::TooLong);
    }

    #[test]
    fn a_data_length_that_would_wrap_around_is_not_followed() {
        // RawDataLength (95) so large that adding it to the offset of
        // RawData wraps to each of the offsets before it: parsing must end,
        // with every field forward of the one before.
        for back in 1..64u64 {
            let len = (u64::MAX - back + 1) as usize;
            let raw = soh(&format!("8=FIX.4.4|9=5|35=A|95={len}|96=x|10=000|"));
            if let Ok(message) = Message::parse(&raw) {
                assert!(message.fields.windows(2).all(|w| w[0].start <= w[0].end && w[0].end < w[1].start), "{back}");
            }
        }
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            let len = (state % 64) as usize;
            let mut bytes = Vec::with_capacity(len);
            for _ in 0..len {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let alphabet = b"8=9\x011035A";
                bytes.push(alphabet[(state >> 33) as usize % alphabet.len()]);
            }
            let _ = frame(&bytes, 128);
            let _ = Message::parse(&bytes);
        }
    }
}
