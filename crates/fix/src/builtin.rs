//! The built-in FIX 4.4 dictionary: the standard header and trailer, the
//! session messages, and the order-entry messages this venue handles, with
//! the types and values FIX 4.4 gives their fields. Every other FIX 4.4
//! message type is known by its code only, so that it is answered with a
//! BusinessMessageReject (unsupported) rather than a session Reject
//! (invalid MsgType).
//!
//! Written from the FIX 4.4 specification's field and message tables. A
//! full dictionary file can be configured instead (`fix.dictionary`).

use crate::dictionary::{Dictionary, FieldDef, FieldType, Layout, MessageDef};
use std::collections::BTreeSet;

/// tag, name, type, allowed values (space-separated; empty: any).
const FIELDS: &[(u32, &str, FieldType, &str)] = &[
    (1, "Account", FieldType::String, ""),
    (6, "AvgPx", FieldType::Float, ""),
    (7, "BeginSeqNo", FieldType::Count, ""),
    (8, "BeginString", FieldType::String, ""),
    (9, "BodyLength", FieldType::Count, ""),
    (10, "CheckSum", FieldType::String, ""),
    (11, "ClOrdID", FieldType::String, ""),
    (12, "Commission", FieldType::Float, ""),
    (13, "CommType", FieldType::Char, "1 2 3 4 5 6"),
    (14, "CumQty", FieldType::Float, ""),
    (15, "Currency", FieldType::String, ""),
    (16, "EndSeqNo", FieldType::Count, ""),
    (17, "ExecID", FieldType::String, ""),
    (18, "ExecInst", FieldType::MultipleValue, "0 1 2 3 4 5 6 7 8 9 A B C D E F G H I J K L M N O P Q R S T U V W X Y Z a b c d e f g h i"),
    (21, "HandlInst", FieldType::Char, "1 2 3"),
    (22, "SecurityIDSource", FieldType::String, ""),
    (31, "LastPx", FieldType::Float, ""),
    (32, "LastQty", FieldType::Float, ""),
    (34, "MsgSeqNum", FieldType::Count, ""),
    (35, "MsgType", FieldType::String, ""),
    (36, "NewSeqNo", FieldType::Count, ""),
    (37, "OrderID", FieldType::String, ""),
    (38, "OrderQty", FieldType::Float, ""),
    (39, "OrdStatus", FieldType::Char, "0 1 2 3 4 5 6 7 8 9 A B C D E"),
    (40, "OrdType", FieldType::Char, "1 2 3 4 5 6 7 8 9 D E G I J K L M P"),
    (41, "OrigClOrdID", FieldType::String, ""),
    (43, "PossDupFlag", FieldType::Boolean, ""),
    (44, "Price", FieldType::Float, ""),
    (45, "RefSeqNum", FieldType::Count, ""),
    (48, "SecurityID", FieldType::String, ""),
    (49, "SenderCompID", FieldType::String, ""),
    (50, "SenderSubID", FieldType::String, ""),
    (52, "SendingTime", FieldType::UtcTimestamp, ""),
    (54, "Side", FieldType::Char, "1 2 3 4 5 6 7 8 9 A B C D E F G"),
    (55, "Symbol", FieldType::String, ""),
    (56, "TargetCompID", FieldType::String, ""),
    (57, "TargetSubID", FieldType::String, ""),
    (58, "Text", FieldType::String, ""),
    (59, "TimeInForce", FieldType::Char, "0 1 2 3 4 5 6 7"),
    (60, "TransactTime", FieldType::UtcTimestamp, ""),
    (89, "Signature", FieldType::Data, ""),
    (90, "SecureDataLen", FieldType::Count, ""),
    (91, "SecureData", FieldType::Data, ""),
    (93, "SignatureLength", FieldType::Count, ""),
    (95, "RawDataLength", FieldType::Count, ""),
    (96, "RawData", FieldType::Data, ""),
    (97, "PossResend", FieldType::Boolean, ""),
    (98, "EncryptMethod", FieldType::Int, "0 1 2 3 4 5 6"),
    (102, "CxlRejReason", FieldType::Int, "0 1 2 3 4 5 6 99"),
    (103, "OrdRejReason", FieldType::Int, "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 18 99"),
    (108, "HeartBtInt", FieldType::Int, ""),
    (112, "TestReqID", FieldType::String, ""),
    (115, "OnBehalfOfCompID", FieldType::String, ""),
    (116, "OnBehalfOfSubID", FieldType::String, ""),
    (122, "OrigSendingTime", FieldType::UtcTimestamp, ""),
    (123, "GapFillFlag", FieldType::Boolean, ""),
    (128, "DeliverToCompID", FieldType::String, ""),
    (129, "DeliverToSubID", FieldType::String, ""),
    (141, "ResetSeqNumFlag", FieldType::Boolean, ""),
    (142, "SenderLocationID", FieldType::String, ""),
    (143, "TargetLocationID", FieldType::String, ""),
    (144, "OnBehalfOfLocationID", FieldType::String, ""),
    (145, "DeliverToLocationID", FieldType::String, ""),
    (150, "ExecType", FieldType::Char, "0 3 4 5 6 7 8 9 A B C D E F G H I"),
    (151, "LeavesQty", FieldType::Float, ""),
    (152, "CashOrderQty", FieldType::Float, ""),
    (167, "SecurityType", FieldType::String, ""),
    (207, "SecurityExchange", FieldType::String, ""),
    (212, "XmlDataLen", FieldType::Count, ""),
    (213, "XmlData", FieldType::Data, ""),
    (347, "MessageEncoding", FieldType::String, ""),
    (354, "EncodedTextLen", FieldType::Count, ""),
    (355, "EncodedText", FieldType::Data, ""),
    (369, "LastMsgSeqNumProcessed", FieldType::Count, ""),
    (371, "RefTagID", FieldType::Int, ""),
    (372, "RefMsgType", FieldType::String, ""),
    (373, "SessionRejectReason", FieldType::Int, "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 99"),
    (379, "BusinessRejectRefID", FieldType::String, ""),
    (380, "BusinessRejectReason", FieldType::Int, "0 1 2 3 4 5 6 7"),
    (383, "MaxMessageSize", FieldType::Count, ""),
    (384, "NoMsgTypes", FieldType::Count, ""),
    (385, "MsgDirection", FieldType::Char, "S R"),
    (434, "CxlRejResponseTo", FieldType::Char, "1 2"),
    (464, "TestMessageIndicator", FieldType::Boolean, ""),
    (530, "MassCancelRequestType", FieldType::Char, "1 2 3 4 5 6 7"),
    (531, "MassCancelResponse", FieldType::Char, "0 1 2 3 4 5 6 7"),
    (532, "MassCancelRejectReason", FieldType::Int, "0 1 2 3 4 5 6 99"),
    (533, "TotalAffectedOrders", FieldType::Int, ""),
    (553, "Username", FieldType::String, ""),
    (554, "Password", FieldType::String, ""),
    (627, "NoHops", FieldType::Count, ""),
    (628, "HopCompID", FieldType::String, ""),
    (629, "HopSendingTime", FieldType::UtcTimestamp, ""),
    (630, "HopRefID", FieldType::Count, ""),
    (789, "NextExpectedMsgSeqNum", FieldType::Count, ""),
    // Not FIX 4.4: the venue's self-trade prevention (the user-defined
    // tag range). N: cancel the incoming order, O: cancel the resting
    // one, B: cancel both; absent: allow.
    (7928, "SelfTradePrevention", FieldType::Char, "N O B"),
];

/// A message: type, name, admin?, fields as `tag` or `tag!` (required).
const MESSAGES: &[(&str, &str, bool, &str)] = &[
    ("0", "Heartbeat", true, "112"),
    ("1", "TestRequest", true, "112!"),
    ("2", "ResendRequest", true, "7! 16!"),
    ("3", "Reject", true, "45! 371 372 373 58 354 355"),
    ("4", "SequenceReset", true, "123 36!"),
    ("5", "Logout", true, "58 354 355"),
    ("A", "Logon", true, "98! 108! 95 96 141 789 383 384 464 553 554"),
    ("D", "NewOrderSingle", false, "11! 1 21 18 55! 48 22 167 207 54! 60! 38 152 40! 44 15 59 58 7928"),
    ("F", "OrderCancelRequest", false, "41! 37 11! 1 55! 48 22 167 54! 60! 38 58"),
    ("G", "OrderCancelReplaceRequest", false, "37 41! 11! 1 21 18 55! 48 22 167 54! 60! 38 152 40! 44 15 59 58 7928"),
    ("q", "OrderMassCancelRequest", false, "11! 530! 55 48 22 167 54 60! 58"),
    ("8", "ExecutionReport", false, "37! 11 41 17! 150! 39! 103 1 55! 54! 38 40 44 59 32 31 151! 14! 6! 60 58 12 13"),
    ("9", "OrderCancelReject", false, "37! 11! 41! 39! 434! 102 58"),
    ("r", "OrderMassCancelReport", false, "11 37! 530! 531! 532 533 58"),
    ("j", "BusinessMessageReject", false, "45 372! 379 380! 58"),
];

/// The other FIX 4.4 message types: known, not handled here.
const OTHER_TYPES: &str = "6 7 B C E H J K L M N P Q R S T V W X Y Z a b c d e f g h i k l m o p s t u v w x y z \
     AA AB AC AD AE AF AG AH AI AJ AK AL AM AN AO AP AQ AR AS AT AU AV AW AX AY AZ BA BB BC BD BE BF BG BH";

fn layout(spec: &str) -> Layout {
    let mut layout = Layout::default();
    for item in spec.split_whitespace() {
        let (tag, required) = match item.strip_suffix('!') {
            Some(tag) => (tag, true),
            None => (item, false),
        };
        let tag: u32 = tag.parse().expect("a built-in tag is a number");
        layout.order.push(tag);
        layout.allowed.insert(tag);
        if required {
            layout.required.insert(tag);
        }
    }
    layout
}

pub(crate) fn dictionary() -> Dictionary {
    let mut dictionary = Dictionary { begin_string: "FIX.4.4".into(), strict: false, ..Dictionary::default() };
    for &(tag, name, kind, values) in FIELDS {
        let values: BTreeSet<String> = values.split_whitespace().map(str::to_owned).collect();
        dictionary.fields.insert(tag, FieldDef { tag, name: name.into(), kind, values });
    }
    dictionary.header = layout("8! 9! 35! 49! 56! 115 128 90 91 34! 50 142 57 143 116 144 129 145 43 97 52! 122 212 213 347 369 627");
    dictionary.header.groups.insert(627, layout("628 629 630"));
    dictionary.trailer = layout("93 89 10!");
    for &(msg_type, name, admin, fields) in MESSAGES {
        let mut body = layout(fields);
        if msg_type == "A" {
            body.groups.insert(384, layout("372 385"));
        }
        dictionary.messages.insert(msg_type.into(), MessageDef { msg_type: msg_type.into(), name: name.into(), admin, body });
    }
    for msg_type in OTHER_TYPES.split_whitespace() {
        dictionary.messages.insert(msg_type.into(), MessageDef { msg_type: msg_type.into(), name: msg_type.into(), admin: false, body: Layout::default() });
    }
    dictionary
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_listed_tag_is_defined() {
        let d = super::dictionary();
        let mut layouts = vec![&d.header, &d.trailer];
        layouts.extend(d.messages.values().map(|m| &m.body));
        for layout in layouts {
            for tag in &layout.order {
                assert!(d.fields.contains_key(tag), "tag {tag} is used but not defined");
            }
        }
        assert_eq!(d.messages.len(), 92, "FIX 4.4 has 92 message types");
    }
}
