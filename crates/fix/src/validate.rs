//! Checking a parsed message against the data dictionary, and its shape as
//! a tree (header, body with repeating groups, trailer) for the session
//! and the application.
//!
//! The order of the checks decides which error a client hears about when a
//! message has several, so it is fixed (and is what the FIX acceptance
//! scripts expect): section order (header, body, trailer), then the
//! message type, then required fields, then each field in turn (header
//! fields, trailer fields, body fields by ascending tag, group entries
//! recursively), each for: repeated, empty, unknown tag, format, allowed
//! value, defined for this message type, group count.

use crate::dictionary::{Dictionary, FieldType, Layout};
use crate::wire::{Message, BEGIN_STRING, BODY_LENGTH, MSG_TYPE};

/// SessionRejectReason (373) values and their texts (58).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectReason {
    InvalidTagNumber = 0,
    RequiredTagMissing = 1,
    TagNotDefinedForMessageType = 2,
    TagSpecifiedWithoutValue = 4,
    ValueIncorrect = 5,
    IncorrectDataFormat = 6,
    CompIdProblem = 9,
    SendingTimeAccuracy = 10,
    InvalidMsgType = 11,
    TagAppearsMoreThanOnce = 13,
    TagOutOfOrder = 14,
    IncorrectNumInGroupCount = 16,
    Other = 99,
}

impl RejectReason {
    pub fn code(self) -> u32 {
        self as u32
    }

    pub fn text(self) -> &'static str {
        match self {
            RejectReason::InvalidTagNumber => "Invalid tag number",
            RejectReason::RequiredTagMissing => "Required tag missing",
            RejectReason::TagNotDefinedForMessageType => "Tag not defined for this message type",
            RejectReason::TagSpecifiedWithoutValue => "Tag specified without a value",
            RejectReason::ValueIncorrect => "Value is incorrect (out of range) for this tag",
            RejectReason::IncorrectDataFormat => "Incorrect data format for value",
            RejectReason::CompIdProblem => "CompID problem",
            RejectReason::SendingTimeAccuracy => "SendingTime accuracy problem",
            RejectReason::InvalidMsgType => "Invalid MsgType",
            RejectReason::TagAppearsMoreThanOnce => "Tag appears more than once",
            RejectReason::TagOutOfOrder => "Tag specified out of required order",
            RejectReason::IncorrectNumInGroupCount => "Incorrect NumInGroup count for repeating group",
            RejectReason::Other => "Other",
        }
    }
}

/// Why a message is refused by the session layer: the reason and, for a
/// field-specific reason, the tag (as written: 0 and negative tags too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Invalid {
    pub reason: RejectReason,
    pub tag: Option<i64>,
}

fn invalid(reason: RejectReason, tag: i64) -> Invalid {
    Invalid { reason, tag: Some(tag) }
}

/// One level of a message: its fields (indexes into the message's fields,
/// in wire order) and its repeating groups.
#[derive(Clone, Debug, Default)]
pub struct Level {
    pub fields: Vec<usize>,
    /// (index of the NumInGroup field, its entries).
    pub groups: Vec<(usize, Vec<Level>)>,
}

/// A message split into its sections.
#[derive(Clone, Debug, Default)]
pub struct Shape {
    /// Header fields after 8, 9, 35 (indexes into the message's fields).
    pub header: Vec<usize>,
    pub body: Level,
    pub trailer: Vec<usize>,
    /// The first header or body field found after the section it belongs
    /// to (reason 14).
    pub misplaced: Option<i64>,
}

fn tag_u32(tag: i64) -> Option<u32> {
    u32::try_from(tag).ok()
}

fn in_layout(layout: &Layout, tag: i64) -> bool {
    tag_u32(tag).is_some_and(|t| layout.allowed.contains(&t) || layout.groups.values().any(|g| in_layout(g, tag)))
}

/// Repeating groups nest at most this deep (a bound on the recursion a
/// message can cause).
const MAX_GROUP_DEPTH: usize = 8;

/// Reads the entries of the group whose count field is at `fields[*at - 1]`
/// from `fields[*at..]`: entries begin with the delimiter and hold fields
/// of the group's layout; the first other field ends the group.
fn read_group(message: &Message, group: &Layout, indexes: &[usize], at: &mut usize, depth: usize) -> Vec<Level> {
    let fields = message.fields();
    let mut entries: Vec<Level> = Vec::new();
    let Some(delimiter) = group.delimiter() else {
        return entries;
    };
    while *at < indexes.len() {
        let tag = fields[indexes[*at]].tag;
        if tag == i64::from(delimiter) {
            entries.push(Level::default());
        } else if entries.is_empty() || !group.allowed.contains(&tag_u32(tag).unwrap_or(0)) || entries.last().is_some_and(|e| e.fields.iter().any(|&i| fields[i].tag == tag)) {
            // Not a member, or a member already in this entry: the group
            // has ended.
            break;
        }
        let Some(entry) = entries.last_mut() else {
            break;
        };
        let index = indexes[*at];
        entry.fields.push(index);
        *at += 1;
        if let Some(nested) = tag_u32(tag).and_then(|t| group.groups.get(&t))
            && depth < MAX_GROUP_DEPTH
        {
            let inner = read_group(message, nested, indexes, at, depth + 1);
            if let Some(entry) = entries.last_mut() {
                entry.groups.push((index, inner));
            }
        }
    }
    entries
}

/// Splits a body (field indexes in wire order) into a level with groups.
fn read_level(message: &Message, layout: Option<&Layout>, indexes: &[usize]) -> Level {
    let fields = message.fields();
    let mut level = Level::default();
    let mut at = 0;
    while at < indexes.len() {
        let index = indexes[at];
        level.fields.push(index);
        at += 1;
        let group = layout.and_then(|l| tag_u32(fields[index].tag).and_then(|t| l.groups.get(&t)));
        if let Some(group) = group {
            let entries = read_group(message, group, indexes, &mut at, 1);
            level.groups.push((index, entries));
        }
    }
    level
}

/// Splits `message` into header, body and trailer.
pub fn shape(dictionary: &Dictionary, message: &Message) -> Shape {
    let fields = message.fields();
    let layout = dictionary.message(message.msg_type()).map(|m| &m.body);
    let is_header = |tag: i64| in_layout(&dictionary.header, tag);
    let is_trailer = |tag: i64| in_layout(&dictionary.trailer, tag);
    let mut shape = Shape::default();
    let mut body = Vec::new();
    #[derive(PartialEq, PartialOrd)]
    enum Section {
        Header,
        Body,
        Trailer,
    }
    let mut section = Section::Header;
    for (index, field) in fields.iter().enumerate().skip(3) {
        let tag = field.tag;
        let belongs = if is_header(tag) {
            Section::Header
        } else if is_trailer(tag) {
            Section::Trailer
        } else {
            Section::Body
        };
        if belongs < section {
            shape.misplaced.get_or_insert(tag);
        } else {
            section = belongs;
        }
        match (is_header(tag), is_trailer(tag)) {
            (true, _) => shape.header.push(index),
            (_, true) => shape.trailer.push(index),
            _ => body.push(index),
        }
    }
    shape.body = read_level(message, layout, &body);
    shape
}

/// Checks `message` completely. `Ok` carries its shape.
pub fn validate(dictionary: &Dictionary, message: &Message) -> Result<Shape, Invalid> {
    let shape = shape(dictionary, message);
    if let Some(tag) = shape.misplaced {
        return Err(invalid(RejectReason::TagOutOfOrder, tag));
    }
    let Some(definition) = dictionary.message(message.msg_type()) else {
        return Err(Invalid { reason: RejectReason::InvalidMsgType, tag: None });
    };
    let fields = message.fields();
    let has = |indexes: &[usize], tag: u32| indexes.iter().any(|&i| fields[i].tag == i64::from(tag));
    let header_all: Vec<usize> = (0..3).chain(shape.header.iter().copied()).collect();
    for &tag in &dictionary.header.required {
        if !has(&header_all, tag) {
            return Err(invalid(RejectReason::RequiredTagMissing, i64::from(tag)));
        }
    }
    for &tag in &dictionary.trailer.required {
        if !has(&shape.trailer, tag) {
            return Err(invalid(RejectReason::RequiredTagMissing, i64::from(tag)));
        }
    }
    check_required(message, &definition.body, &shape.body)?;

    // Each field: the header in order after 8, 9, 35 by tag, the
    // trailer, then the body by tag.
    let mut header_sorted = shape.header.clone();
    header_sorted.sort_by_key(|&i| fields[i].tag);
    let header_order: Vec<usize> = (0..3).chain(header_sorted).collect();
    check_level(dictionary, message, None, &Level { fields: header_order, groups: Vec::new() }, false)?;
    check_level(dictionary, message, None, &Level { fields: shape.trailer.clone(), groups: Vec::new() }, false)?;
    check_level(dictionary, message, Some(&definition.body), &shape.body, true)?;
    Ok(shape)
}

fn check_required(message: &Message, layout: &Layout, level: &Level) -> Result<(), Invalid> {
    let fields = message.fields();
    for &tag in &layout.required {
        if !level.fields.iter().any(|&i| fields[i].tag == i64::from(tag)) {
            return Err(invalid(RejectReason::RequiredTagMissing, i64::from(tag)));
        }
    }
    for (count, entries) in &level.groups {
        let Some(group) = tag_u32(fields[*count].tag).and_then(|t| layout.groups.get(&t)) else {
            continue;
        };
        for entry in entries {
            check_required(message, group, entry)?;
        }
    }
    Ok(())
}

fn check_level(dictionary: &Dictionary, message: &Message, layout: Option<&Layout>, level: &Level, body: bool) -> Result<(), Invalid> {
    let fields = message.fields();
    let mut order = level.fields.clone();
    if body {
        order.sort_by_key(|&i| fields[i].tag);
    }
    // The level's tags sorted, for telling a repeated one in log time
    // (a message of thousands of fields, each compared with every other,
    // cost seconds).
    let mut tags: Vec<i64> = level.fields.iter().map(|&i| fields[i].tag).collect();
    tags.sort_unstable();
    for &index in &order {
        let field = fields[index];
        let tag = field.tag;
        let value = message.value_of(field);
        let first = tags.partition_point(|&t| t < tag);
        if tags.get(first + 1) == Some(&tag) {
            return Err(invalid(RejectReason::TagAppearsMoreThanOnce, tag));
        }
        if value.is_empty() {
            return Err(invalid(RejectReason::TagSpecifiedWithoutValue, tag));
        }
        let definition = tag_u32(tag).and_then(|t| dictionary.field(t));
        match definition {
            None if dictionary.strict || tag <= 0 => return Err(invalid(RejectReason::InvalidTagNumber, tag)),
            None => {}
            Some(definition) => {
                if !well_formed(definition.kind, value) {
                    return Err(invalid(RejectReason::IncorrectDataFormat, tag));
                }
                if !definition.values.is_empty() && !allowed(definition.kind, &definition.values, value) {
                    return Err(invalid(RejectReason::ValueIncorrect, tag));
                }
            }
        }
        if body && dictionary.strict && definition.is_some() && !layout.is_some_and(|l| l.allowed.contains(&tag_u32(tag).unwrap_or(0))) {
            return Err(invalid(RejectReason::TagNotDefinedForMessageType, tag));
        }
        if let Some((_, entries)) = level.groups.iter().find(|(count, _)| *count == index) {
            let declared = message.value_of(field);
            let declared: Option<usize> = std::str::from_utf8(declared).ok().and_then(|t| t.parse().ok());
            if declared != Some(entries.len()) {
                return Err(invalid(RejectReason::IncorrectNumInGroupCount, tag));
            }
            let group = layout.and_then(|l| tag_u32(tag).and_then(|t| l.groups.get(&t)));
            for entry in entries {
                check_level(dictionary, message, group, entry, true)?;
            }
        }
    }
    Ok(())
}

fn is_integer(value: &[u8]) -> bool {
    let digits = value.strip_prefix(b"-").unwrap_or(value);
    !digits.is_empty() && digits.iter().all(u8::is_ascii_digit)
}

fn is_timestamp(value: &[u8]) -> bool {
    if value.len() < 17 {
        return false;
    }
    let (base, fraction) = value.split_at(17);
    crate::time::parse_timestamp(base).is_some()
        && (fraction.is_empty() || (fraction.len() >= 2 && fraction.len() <= 10 && fraction[0] == b'.' && fraction[1..].iter().all(u8::is_ascii_digit)))
}

/// Does `value` have the format of `kind`?
pub fn well_formed(kind: FieldType, value: &[u8]) -> bool {
    match kind {
        FieldType::Int | FieldType::Count | FieldType::DayOfMonth => is_integer(value),
        FieldType::Float => crate::decimal::Decimal::parse(value).is_some(),
        FieldType::Char => value.len() == 1,
        FieldType::Boolean => value == b"Y" || value == b"N",
        FieldType::UtcTimestamp => is_timestamp(value),
        FieldType::UtcTimeOnly => crate::time::is_time_only(value),
        FieldType::Date => crate::time::is_date(value),
        FieldType::String | FieldType::MultipleValue | FieldType::MonthYear | FieldType::Data => true,
    }
}

fn allowed(kind: FieldType, values: &std::collections::BTreeSet<String>, value: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(value) else {
        return false;
    };
    match kind {
        FieldType::MultipleValue => text.split(' ').all(|v| values.contains(v)),
        _ => values.contains(text),
    }
}

/// The body fields in the order they are written out: by tag, each
/// repeating group right after its count, the fields of an entry in the
/// dictionary's order (so its delimiter comes first).
pub fn canonical_order(message: &Message, layout: Option<&Layout>, level: &Level, out: &mut Vec<usize>) {
    write_level(message, layout, level, false, out);
}

fn write_level(message: &Message, layout: Option<&Layout>, level: &Level, entry: bool, out: &mut Vec<usize>) {
    let fields = message.fields();
    let mut order = level.fields.clone();
    match layout {
        Some(layout) if entry => {
            let rank = |tag: i64| tag_u32(tag).and_then(|t| layout.order.iter().position(|&o| o == t)).unwrap_or(usize::MAX);
            order.sort_by_key(|&i| (rank(fields[i].tag), fields[i].tag));
        }
        _ => order.sort_by_key(|&i| fields[i].tag),
    }
    for index in order {
        out.push(index);
        if let Some((_, entries)) = level.groups.iter().find(|(count, _)| *count == index) {
            let group = layout.and_then(|l| tag_u32(fields[index].tag).and_then(|t| l.groups.get(&t)));
            for inner in entries {
                write_level(message, group, inner, true, out);
            }
        }
    }
}

/// Whether `tag` is one of the first three fields' tags.
pub fn is_frame_tag(tag: i64) -> bool {
    tag == i64::from(BEGIN_STRING) || tag == i64::from(BODY_LENGTH) || tag == i64::from(MSG_TYPE)
}
