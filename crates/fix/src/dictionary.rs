//! The FIX data dictionary: which fields exist (tag, name, type, allowed
//! values), which fields each message type may carry and which it must,
//! and the shape of repeating groups. Read from an XML file in the layout
//! the QuickFIX engines use (`<fix>` with `<header>`, `<trailer>`,
//! `<messages>`, `<components>` and `<fields>`), or the built-in one
//! ([`Dictionary::builtin`]) that covers what this venue understands.
//!
//! Components are flattened when the dictionary is loaded: a message's
//! layout lists every field it may carry directly, and a field that a
//! component requires is required only when the component is.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The value types of FIX 4.4 fields, as far as validation tells them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldType {
    Int,
    /// NumInGroup, SeqNum, Length: non-negative integers.
    Count,
    Float,
    Char,
    Boolean,
    String,
    /// MultipleValueString: space-separated values, each from the enumeration.
    MultipleValue,
    UtcTimestamp,
    UtcTimeOnly,
    /// UTCDateOnly (LocalMktDate is free text here, as QuickFIX has it).
    Date,
    MonthYear,
    DayOfMonth,
    Data,
}

impl FieldType {
    fn from_name(name: &str) -> FieldType {
        match name {
            "INT" => FieldType::Int,
            "NUMINGROUP" | "SEQNUM" | "LENGTH" => FieldType::Count,
            "FLOAT" | "PRICE" | "AMT" | "QTY" | "PRICEOFFSET" | "PERCENTAGE" => FieldType::Float,
            "CHAR" => FieldType::Char,
            "BOOLEAN" => FieldType::Boolean,
            "MULTIPLEVALUESTRING" | "MULTIPLESTRINGVALUE" | "MULTIPLECHARVALUE" => FieldType::MultipleValue,
            "UTCTIMESTAMP" | "TZTIMESTAMP" => FieldType::UtcTimestamp,
            "UTCTIMEONLY" | "TZTIMEONLY" => FieldType::UtcTimeOnly,
            "UTCDATEONLY" | "UTCDATE" => FieldType::Date,
            "MONTHYEAR" => FieldType::MonthYear,
            "DAYOFMONTH" => FieldType::DayOfMonth,
            "DATA" | "XMLDATA" => FieldType::Data,
            // STRING, CURRENCY, EXCHANGE, COUNTRY, LANGUAGE and the rest.
            _ => FieldType::String,
        }
    }
}

#[derive(Clone, Debug)]
pub struct FieldDef {
    pub tag: u32,
    pub name: String,
    pub kind: FieldType,
    /// Allowed values; empty means any value of the type.
    pub values: BTreeSet<String>,
}

/// The fields one level of a message may carry: the message body, the
/// header, the trailer, or one repeating group's entries.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    /// Every field allowed at this level, in the order the dictionary
    /// lists them (a group entry must start with the first).
    pub order: Vec<u32>,
    pub allowed: BTreeSet<u32>,
    pub required: BTreeSet<u32>,
    /// Repeating groups at this level, by their NumInGroup tag.
    pub groups: BTreeMap<u32, Layout>,
}

impl Layout {
    fn add_field(&mut self, tag: u32, required: bool) {
        if self.allowed.insert(tag) {
            self.order.push(tag);
        }
        if required {
            self.required.insert(tag);
        }
    }

    /// The tag that starts each entry of this group.
    pub fn delimiter(&self) -> Option<u32> {
        self.order.first().copied()
    }
}

#[derive(Clone, Debug)]
pub struct MessageDef {
    pub msg_type: String,
    pub name: String,
    pub admin: bool,
    pub body: Layout,
}

#[derive(Clone, Debug, Default)]
pub struct Dictionary {
    pub begin_string: String,
    pub fields: HashMap<u32, FieldDef>,
    pub header: Layout,
    pub trailer: Layout,
    pub messages: BTreeMap<String, MessageDef>,
    /// Reject a body field the message's layout does not list. On for a
    /// full dictionary; the built-in one only lists what the venue reads
    /// and lets other known fields through.
    pub strict: bool,
}

/// Tags whose value is raw data whose length the tag before gives:
/// (length tag, data tag), as FIX 4.4 defines them.
pub const DATA_PAIRS: &[(u32, u32)] = &[
    (90, 91),
    (93, 89),
    (95, 96),
    (212, 213),
    (348, 349),
    (350, 351),
    (352, 353),
    (354, 355),
    (356, 357),
    (358, 359),
    (360, 361),
    (362, 363),
    (364, 365),
    (445, 446),
    (618, 619),
    (621, 622),
];

#[derive(Debug)]
pub struct DictionaryError(pub String);

impl std::fmt::Display for DictionaryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FIX dictionary: {}", self.0)
    }
}

impl std::error::Error for DictionaryError {}

fn err(what: impl Into<String>) -> DictionaryError {
    DictionaryError(what.into())
}

/// Components may nest; a bound on the depth keeps a cyclic file from
/// looping.
const MAX_COMPONENT_DEPTH: usize = 16;
/// Elements the messages expand to at most, components in place: a file
/// whose components each hold the next many times over would otherwise
/// take for ever to load rather than be refused (FIX 4.4's own expands to
/// some tens of thousands).
const MAX_EXPANDED: usize = 4_000_000;

struct Loader<'a, 'input> {
    by_name: HashMap<&'a str, u32>,
    components: HashMap<&'a str, roxmltree::Node<'a, 'input>>,
    /// Elements expanded so far (of [`MAX_EXPANDED`]).
    expanded: std::cell::Cell<usize>,
}

impl<'a, 'input> Loader<'a, 'input> {
    fn tag(&self, name: &str) -> Result<u32, DictionaryError> {
        self.by_name.get(name).copied().ok_or_else(|| err(format!("field {name} is used but not defined")))
    }

    /// Adds the children of `node` (fields, groups, components) to `layout`.
    fn fill(&self, node: roxmltree::Node<'a, 'input>, layout: &mut Layout, required_here: bool, depth: usize) -> Result<(), DictionaryError> {
        if depth > MAX_COMPONENT_DEPTH {
            return Err(err("components nest too deeply (a cycle?)"));
        }
        for child in node.children().filter(|n| n.is_element()) {
            self.expanded.set(self.expanded.get() + 1);
            if self.expanded.get() > MAX_EXPANDED {
                return Err(err(format!("the messages expand to more than {MAX_EXPANDED} elements, components in place")));
            }
            let name = child.attribute("name").ok_or_else(|| err("an element without a name"))?;
            let required = required_here && child.attribute("required") == Some("Y");
            match child.tag_name().name() {
                "field" => layout.add_field(self.tag(name)?, required),
                "group" => {
                    let count_tag = self.tag(name)?;
                    layout.add_field(count_tag, required);
                    let mut group = Layout::default();
                    self.fill(child, &mut group, true, depth + 1)?;
                    layout.groups.insert(count_tag, group);
                }
                "component" => {
                    let component = *self.components.get(name).ok_or_else(|| err(format!("component {name} is not defined")))?;
                    self.fill(component, layout, required, depth + 1)?;
                }
                other => return Err(err(format!("unexpected element <{other}>"))),
            }
        }
        Ok(())
    }
}

impl Dictionary {
    /// Reads a QuickFIX-style XML data dictionary.
    pub fn from_xml(text: &str) -> Result<Dictionary, DictionaryError> {
        let document = roxmltree::Document::parse(text).map_err(|e| err(e.to_string()))?;
        let root = document.root_element();
        if root.tag_name().name() != "fix" {
            return Err(err("the root element is not <fix>"));
        }
        let major = root.attribute("major").unwrap_or("4");
        let minor = root.attribute("minor").unwrap_or("4");
        let section = |name: &str| root.children().find(|n| n.is_element() && n.tag_name().name() == name);

        let mut dictionary = Dictionary { begin_string: format!("FIX.{major}.{minor}"), strict: true, ..Dictionary::default() };
        let mut by_name = HashMap::new();
        if let Some(fields) = section("fields") {
            for field in fields.children().filter(|n| n.is_element()) {
                let name = field.attribute("name").ok_or_else(|| err("a field without a name"))?;
                let tag: u32 = field.attribute("number").and_then(|n| n.parse().ok()).ok_or_else(|| err(format!("field {name} has no number")))?;
                let kind = FieldType::from_name(field.attribute("type").unwrap_or("STRING"));
                let values = field.children().filter(|n| n.is_element()).filter_map(|v| v.attribute("enum")).map(str::to_owned).collect();
                by_name.insert(name, tag);
                dictionary.fields.insert(tag, FieldDef { tag, name: name.to_owned(), kind, values });
            }
        }
        let mut components = HashMap::new();
        if let Some(section) = section("components") {
            for component in section.children().filter(|n| n.is_element()) {
                if let Some(name) = component.attribute("name") {
                    components.insert(name, component);
                }
            }
        }
        let loader = Loader { by_name, components, expanded: std::cell::Cell::new(0) };
        if let Some(header) = section("header") {
            loader.fill(header, &mut dictionary.header, true, 0)?;
        }
        if let Some(trailer) = section("trailer") {
            loader.fill(trailer, &mut dictionary.trailer, true, 0)?;
        }
        if let Some(messages) = section("messages") {
            for message in messages.children().filter(|n| n.is_element()) {
                let msg_type = message.attribute("msgtype").ok_or_else(|| err("a message without a msgtype"))?;
                let mut body = Layout::default();
                loader.fill(message, &mut body, true, 0)?;
                dictionary.messages.insert(
                    msg_type.to_owned(),
                    MessageDef {
                        msg_type: msg_type.to_owned(),
                        name: message.attribute("name").unwrap_or(msg_type).to_owned(),
                        admin: message.attribute("msgcat") == Some("admin"),
                        body,
                    },
                );
            }
        }
        if dictionary.header.allowed.is_empty() || dictionary.messages.is_empty() {
            return Err(err("no header or no messages"));
        }
        Ok(dictionary)
    }

    pub fn field(&self, tag: u32) -> Option<&FieldDef> {
        self.fields.get(&tag)
    }

    pub fn message(&self, msg_type: &[u8]) -> Option<&MessageDef> {
        std::str::from_utf8(msg_type).ok().and_then(|t| self.messages.get(t))
    }

    pub fn is_header_field(&self, tag: u32) -> bool {
        self.header.allowed.contains(&tag)
    }

    pub fn is_trailer_field(&self, tag: u32) -> bool {
        self.trailer.allowed.contains(&tag)
    }

    /// The dictionary the venue uses when none is configured: the
    /// standard header and trailer, the session messages and the order
    /// messages this venue handles, with the FIX 4.4 types and values of
    /// the fields it reads. Fields it does not list are let through
    /// (`strict` is off), so a client that sends more than the venue
    /// needs is not refused for it.
    pub fn builtin() -> Dictionary {
        crate::builtin::dictionary()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = r#"<fix major='4' minor='4' type='FIX'>
      <header><field name='BeginString' required='Y'/><field name='MsgType' required='Y'/></header>
      <trailer><field name='CheckSum' required='Y'/></trailer>
      <messages>
        <message name='NewOrderSingle' msgtype='D' msgcat='app'>
          <field name='ClOrdID' required='Y'/>
          <component name='Instrument' required='Y'/>
          <component name='Parties' required='N'/>
        </message>
      </messages>
      <components>
        <component name='Instrument'><field name='Symbol' required='Y'/></component>
        <component name='Parties'>
          <group name='NoPartyIDs' required='N'><field name='PartyID' required='Y'/><field name='PartyRole' required='N'/></group>
          <field name='Side' required='Y'/>
        </component>
      </components>
      <fields>
        <field number='8' name='BeginString' type='STRING'/>
        <field number='35' name='MsgType' type='STRING'/>
        <field number='10' name='CheckSum' type='STRING'/>
        <field number='11' name='ClOrdID' type='STRING'/>
        <field number='55' name='Symbol' type='STRING'/>
        <field number='54' name='Side' type='CHAR'><value enum='1' description='BUY'/><value enum='2' description='SELL'/></field>
        <field number='453' name='NoPartyIDs' type='NUMINGROUP'/>
        <field number='448' name='PartyID' type='STRING'/>
        <field number='452' name='PartyRole' type='INT'/>
      </fields>
    </fix>"#;

    #[test]
    fn components_flatten_and_carry_their_requiredness() {
        let d = Dictionary::from_xml(SMALL).expect("loads");
        assert_eq!(d.begin_string, "FIX.4.4");
        let order = &d.message(b"D").expect("D").body;
        assert!(order.required.contains(&11) && order.required.contains(&55));
        // Side is required by Parties, which is optional.
        assert!(order.allowed.contains(&54) && !order.required.contains(&54));
        let parties = &order.groups[&453];
        assert_eq!(parties.delimiter(), Some(448));
        assert!(parties.required.contains(&448));
        assert_eq!(d.field(54).map(|f| f.values.len()), Some(2));
    }

    #[test]
    fn a_broken_file_is_an_error_not_a_panic() {
        assert!(Dictionary::from_xml("<fix>").is_err());
        assert!(Dictionary::from_xml("<fox/>").is_err());
        assert!(Dictionary::from_xml(&SMALL.replace("<field number='55' name='Symbol' type='STRING'/>", "")).is_err());
    }

    /// Components that each hold the next ten times (10^15 elements once
    /// expanded) are refused at once, not loaded for ever.
    #[test]
    fn components_that_expand_past_reason_are_refused() {
        let mut components = String::new();
        for level in 0..15 {
            let inner = format!("<component name='C{}' required='N'/>", level + 1).repeat(10);
            components.push_str(&format!("<component name='C{level}'>{inner}</component>"));
        }
        components.push_str("<component name='C15'><field name='Symbol' required='N'/></component>");
        let xml = SMALL
            .replace("<component name='Parties' required='N'/>", "<component name='Parties' required='N'/><component name='C0' required='N'/>")
            .replace("<components>", &format!("<components>{components}"));
        let Err(refused) = Dictionary::from_xml(&xml) else { panic!("loaded") };
        assert!(refused.to_string().contains("expand to more than"), "{refused}");
    }
}
