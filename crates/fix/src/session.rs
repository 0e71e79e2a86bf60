//! The FIX 4.4 session layer as a state machine: it is handed each framed
//! message and the time, and answers with [`Action`]s (bytes to send,
//! what to store, when to disconnect). It never reads a clock, touches a
//! socket or a file, so every rule here is tested without either.
//!
//! The order of the checks on a message is fixed, since it decides what a
//! client hears when a message is wrong in several ways: garbled (ignored),
//! BeginString, CompIDs present, the data dictionary, SendingTime, CompIDs
//! matching, then the sequence number (too high: queue and ask for a
//! resend; too low: PossDup rules or logout), then the message's own
//! handling. `docs/fix.md` walks through them.

use crate::dictionary::Dictionary;
use crate::time::{format_timestamp, parse_timestamp};
use crate::validate::{Invalid, RejectReason, Shape, canonical_order, validate};
use crate::wire::{Builder, Message, printable};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Tags the session layer reads.
mod tag {
    pub const BEGIN_SEQ_NO: u32 = 7;
    pub const BEGIN_STRING: u32 = 8;
    pub const END_SEQ_NO: u32 = 16;
    pub const MSG_SEQ_NUM: u32 = 34;
    pub const MSG_TYPE: u32 = 35;
    pub const NEW_SEQ_NO: u32 = 36;
    pub const POSS_DUP_FLAG: u32 = 43;
    pub const REF_SEQ_NUM: u32 = 45;
    pub const SENDER_COMP_ID: u32 = 49;
    pub const SENDING_TIME: u32 = 52;
    pub const TARGET_COMP_ID: u32 = 56;
    pub const TEXT: u32 = 58;
    pub const ENCRYPT_METHOD: u32 = 98;
    pub const HEART_BT_INT: u32 = 108;
    pub const TEST_REQ_ID: u32 = 112;
    pub const ORIG_SENDING_TIME: u32 = 122;
    pub const GAP_FILL_FLAG: u32 = 123;
    pub const RESET_SEQ_NUM_FLAG: u32 = 141;
    pub const REF_TAG_ID: u32 = 371;
    pub const REF_MSG_TYPE: u32 = 372;
    pub const SESSION_REJECT_REASON: u32 = 373;
    pub const BUSINESS_REJECT_REASON: u32 = 380;
}

/// Header fields the session writes itself on every message.
const OWN_HEADER: [u32; 9] = [8, 9, 35, 34, 43, 49, 52, 56, 122];

/// Header routing fields mirrored on a Reject (OnBehalfOf <-> DeliverTo).
const REVERSE_ROUTE: [(u32, u32); 6] = [(115, 128), (116, 129), (144, 145), (128, 115), (129, 116), (145, 144)];

/// Application messages kept for resending, and their bytes, at most.
/// Older ones are gap-filled. (A refusal quotes the ClOrdID it refuses:
/// without the bound in bytes, messages of `max_message` each would keep
/// gigabytes.)
pub const MAX_STORED: usize = 100_000;
pub const MAX_STORED_BYTES: usize = 64 << 20;

/// The application messages a session keeps for resends: the newest, up
/// to [`MAX_STORED`] of them and [`MAX_STORED_BYTES`].
#[derive(Clone, Debug, Default)]
pub struct Kept {
    messages: BTreeMap<u64, Vec<u8>>,
    bytes: usize,
}

impl Kept {
    /// Keeps `message` under `seq`, letting the oldest go past the bounds.
    pub fn insert(&mut self, seq: u64, message: Vec<u8>) {
        self.bytes += message.len();
        if let Some(old) = self.messages.insert(seq, message) {
            self.bytes -= old.len();
        }
        while self.messages.len() > MAX_STORED || self.bytes > MAX_STORED_BYTES {
            let Some((_, old)) = self.messages.pop_first() else { break };
            self.bytes -= old.len();
        }
    }

    pub fn clear(&mut self) {
        self.messages.clear();
        self.bytes = 0;
    }

    pub fn get(&self, seq: &u64) -> Option<&Vec<u8>> {
        self.messages.get(seq)
    }

    pub fn len(&self) -> usize {
        self.messages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// Oldest first.
    pub fn iter(&self) -> impl Iterator<Item = (&u64, &Vec<u8>)> {
        self.messages.iter()
    }

    pub fn range(&self, range: std::ops::RangeInclusive<u64>) -> impl Iterator<Item = (&u64, &Vec<u8>)> {
        self.messages.range(range)
    }
}
/// Messages with a too-high sequence number kept until the gap is filled.
pub const MAX_QUEUED: usize = 10_000;
/// Bytes of the messages kept ahead of a gap, at most (a counterparty's
/// messages may each be `max_message` long).
pub const MAX_QUEUED_BYTES: usize = 16 << 20;

#[derive(Clone, Debug)]
pub struct SessionConfig {
    pub begin_string: String,
    /// Ours.
    pub sender_comp_id: String,
    /// The counterparty's.
    pub target_comp_id: String,
    /// Every Logon starts both sequences at 1 and empties the store.
    pub reset_on_logon: bool,
    /// Largest accepted |now - SendingTime|.
    pub max_latency_ms: i64,
    /// How long to wait for the counterparty's Logout after ours.
    pub logout_timeout_ms: i64,
    /// Largest HeartBtInt a Logon may ask for (seconds).
    pub max_heartbeat_s: i64,
}

impl SessionConfig {
    pub fn new(sender_comp_id: &str, target_comp_id: &str) -> SessionConfig {
        SessionConfig {
            begin_string: "FIX.4.4".into(),
            sender_comp_id: sender_comp_id.into(),
            target_comp_id: target_comp_id.into(),
            reset_on_logon: false,
            max_latency_ms: 120_000,
            logout_timeout_ms: 2_000,
            max_heartbeat_s: 3_600,
        }
    }
}

/// What a session asks its connection to do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Write these bytes to the counterparty.
    Send(Vec<u8>),
    /// Record this in the session's store before anything after it is sent.
    Store(StoreOp),
    /// Close the connection (after sending what came before).
    Disconnect(String),
    /// Something worth a log line (an ignored garbled message, say).
    Log(String),
}

/// What makes a session's state durable: replaying these rebuilds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreOp {
    /// Both sequence numbers back to 1, the store emptied.
    Reset,
    /// Message `seq` was sent (an application message's bytes are kept
    /// for resending; administrative ones are gap-filled).
    Sent { seq: u64, app: Option<Vec<u8>> },
    /// The next expected incoming sequence number.
    Received { next_in: u64 },
}

/// Why the application refused a Logon: `text` goes in the Text (58) of
/// the Logout the counterparty is sent before the disconnect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogonRefusal {
    pub text: String,
}

/// What the application does with the messages the session accepts.
pub trait Application {
    /// Decides whether a Logon may proceed (credentials).
    fn on_logon(&mut self, logon: &Message) -> Result<(), LogonRefusal>;
    /// An application message, accepted in sequence.
    fn on_message(&mut self, message: &Message, shape: &Shape, outbox: &mut Outbox<'_>);
    /// The session has logged out or lost its connection.
    fn on_logout(&mut self) {}
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// No connection.
    Disconnected,
    /// Connected; the first message must be a Logon.
    AwaitingLogon,
    LoggedOn,
}

/// The sending half: sequence numbers out, the store, the clock of the
/// last message sent. Lent to the application through [`Outbox`].
struct Outbound {
    config: SessionConfig,
    next_out: u64,
    stored: Kept,
    last_sent_ms: i64,
    connected: bool,
}

/// Lets the application send through the session while it handles a
/// message.
pub struct Outbox<'a> {
    outbound: &'a mut Outbound,
    actions: &'a mut Vec<Action>,
    dictionary: &'a Dictionary,
    now_ms: i64,
}

impl Outbox<'_> {
    /// Sends an application message; `body` in the order it is written.
    pub fn send(&mut self, msg_type: &str, header: Vec<(u32, Vec<u8>)>, body: Vec<(u32, Vec<u8>)>) {
        self.outbound.send(msg_type, header, body, true, self.now_ms, self.actions);
    }

    /// Sends `message` back: its header fields other than the session's own
    /// (PossDupFlag and OrigSendingTime dropped), its body in canonical
    /// order, with values exactly as received.
    pub fn echo(&mut self, message: &Message, shape: &Shape) {
        let fields = message.fields();
        let header = shape
            .header
            .iter()
            .filter_map(|&i| {
                let tag = u32::try_from(fields[i].tag).ok()?;
                (!OWN_HEADER.contains(&tag)).then(|| (tag, message.value_of(fields[i]).to_vec()))
            })
            .collect();
        let layout = self.dictionary.message(message.msg_type()).map(|m| &m.body);
        let mut order = Vec::new();
        canonical_order(message, layout, &shape.body, &mut order);
        let body = order.iter().filter_map(|&i| Some((u32::try_from(fields[i].tag).ok()?, message.value_of(fields[i]).to_vec()))).collect();
        let msg_type = String::from_utf8_lossy(message.msg_type()).into_owned();
        self.send(&msg_type, header, body);
    }

    /// A BusinessMessageReject (j) for a well-formed message this
    /// application does not handle.
    pub fn business_reject(&mut self, message: &Message, reason: u32, text: &str) {
        let mut body = Vec::new();
        // RefSeqNum is a SeqNum: only a number the message really had.
        if let Some(seq) = message.number(tag::MSG_SEQ_NUM) {
            body.push((tag::REF_SEQ_NUM, seq.to_string().into_bytes()));
        }
        body.push((tag::TEXT, text.as_bytes().to_vec()));
        body.push((tag::REF_MSG_TYPE, message.msg_type().to_vec()));
        body.push((tag::BUSINESS_REJECT_REASON, reason.to_string().into_bytes()));
        self.send("j", Vec::new(), body);
    }
}

impl Outbound {
    /// The message `msg_type` with sequence number `seq`: 8, 9, 35, then the
    /// header fields by tag, then `body` as given, then 10.
    fn compose(&self, msg_type: &str, seq: u64, mut header: Vec<(u32, Vec<u8>)>, body: &[(u32, Vec<u8>)], now_ms: i64) -> Vec<u8> {
        header.push((tag::MSG_SEQ_NUM, seq.to_string().into_bytes()));
        header.push((tag::SENDER_COMP_ID, self.config.sender_comp_id.as_bytes().to_vec()));
        header.push((tag::SENDING_TIME, format_timestamp(now_ms).into_bytes()));
        header.push((tag::TARGET_COMP_ID, self.config.target_comp_id.as_bytes().to_vec()));
        header.sort_by_key(|(tag, _)| *tag);
        let mut builder = Builder::new();
        builder.str(tag::MSG_TYPE, msg_type);
        for (tag, value) in &header {
            builder.field(*tag, value);
        }
        for (tag, value) in body {
            builder.field(*tag, value);
        }
        builder.finish(&self.config.begin_string)
    }

    fn send(&mut self, msg_type: &str, header: Vec<(u32, Vec<u8>)>, body: Vec<(u32, Vec<u8>)>, app: bool, now_ms: i64, actions: &mut Vec<Action>) {
        let seq = self.next_out;
        self.next_out += 1;
        let bytes = self.compose(msg_type, seq, header, &body, now_ms);
        if app {
            self.stored.insert(seq, bytes.clone());
        }
        actions.push(Action::Store(StoreOp::Sent { seq, app: app.then(|| bytes.clone()) }));
        if self.connected {
            actions.push(Action::Send(bytes));
            self.last_sent_ms = now_ms;
        }
    }

    fn admin(&mut self, msg_type: &str, body: Vec<(u32, Vec<u8>)>, now_ms: i64, actions: &mut Vec<Action>) {
        self.send(msg_type, Vec::new(), body, false, now_ms, actions);
    }
}

pub struct Session {
    dictionary: Arc<Dictionary>,
    outbound: Outbound,
    next_in: u64,
    state: State,
    heartbeat_ms: i64,
    last_received_ms: i64,
    /// TestRequests sent since the last message received.
    test_requests: u32,
    logout_sent_ms: Option<i64>,
    /// (begin, end) of the ResendRequest we are waiting on.
    resend_range: Option<(u64, u64)>,
    /// Messages that arrived ahead of a gap, by sequence number (or the
    /// mark of one rejected on arrival, whose number is used up when the
    /// gap fills), and their bytes together.
    queue: BTreeMap<u64, Held>,
    queued_bytes: usize,
}

/// What arrived ahead of a gap under one sequence number.
enum Held {
    Message(Message),
    /// Rejected when it came: its number is used up in its turn, it is
    /// not asked for again.
    Rejected,
}

fn text_of(value: &[u8]) -> String {
    String::from_utf8_lossy(value).into_owned()
}

impl Session {
    /// A session with nothing sent or received yet.
    pub fn new(config: SessionConfig, dictionary: Arc<Dictionary>) -> Session {
        Session::restore(config, dictionary, 1, 1, Kept::default())
    }

    /// A session as its store left it.
    pub fn restore(config: SessionConfig, dictionary: Arc<Dictionary>, next_in: u64, next_out: u64, stored: Kept) -> Session {
        Session {
            dictionary,
            outbound: Outbound { config, next_out, stored, last_sent_ms: 0, connected: false },
            next_in,
            state: State::Disconnected,
            heartbeat_ms: 0,
            last_received_ms: 0,
            test_requests: 0,
            logout_sent_ms: None,
            resend_range: None,
            queue: BTreeMap::new(),
            queued_bytes: 0,
        }
    }

    pub fn config(&self) -> &SessionConfig {
        &self.outbound.config
    }

    pub fn next_in(&self) -> u64 {
        self.next_in
    }

    pub fn next_out(&self) -> u64 {
        self.outbound.next_out
    }

    pub fn is_logged_on(&self) -> bool {
        self.state == State::LoggedOn
    }

    /// Whether a connection is attached (logged on or logging on).
    pub fn is_connected(&self) -> bool {
        self.state != State::Disconnected
    }

    /// A connection is attached: the next message must be a Logon.
    pub fn connect(&mut self, now_ms: i64) {
        self.state = State::AwaitingLogon;
        self.outbound.connected = true;
        self.last_received_ms = now_ms;
        self.outbound.last_sent_ms = now_ms;
        self.test_requests = 0;
        self.logout_sent_ms = None;
        self.resend_range = None;
        self.queue.clear();
        self.queued_bytes = 0;
    }

    /// The connection is gone (whoever closed it).
    pub fn disconnected(&mut self, app: &mut dyn Application) {
        if self.state == State::LoggedOn {
            app.on_logout();
        }
        self.state = State::Disconnected;
        self.outbound.connected = false;
        self.queue.clear();
        self.queued_bytes = 0;
        self.resend_range = None;
    }

    /// Sends an application message now (or, with no connection, stores
    /// it under the next sequence number so that a resend delivers it).
    /// After our Logout it is only stored: FIX 4.4 has us send nothing
    /// more but what a ResendRequest asks for (the next session's gap
    /// brings it).
    pub fn send_app(&mut self, msg_type: &str, header: Vec<(u32, Vec<u8>)>, body: Vec<(u32, Vec<u8>)>, now_ms: i64, actions: &mut Vec<Action>) {
        let connected = self.outbound.connected;
        self.outbound.connected = connected && self.state == State::LoggedOn && self.logout_sent_ms.is_none();
        self.outbound.send(msg_type, header, body, true, now_ms, actions);
        self.outbound.connected = connected;
    }

    /// Sends a Logout with `text` and drops the connection (a message too
    /// long to read, say).
    pub fn logout_and_drop(&mut self, text: &str, now_ms: i64, app: &mut dyn Application, actions: &mut Vec<Action>) {
        if self.state == State::LoggedOn {
            self.logout(Some(text.to_owned()), now_ms, actions);
        }
        self.drop_connection(text.to_owned(), app, actions);
    }

    /// Handles one framed message (the bytes [`crate::wire::frame`] cut).
    pub fn on_message(&mut self, raw: &[u8], now_ms: i64, app: &mut dyn Application, actions: &mut Vec<Action>) {
        let next_in = self.next_in;
        match Message::parse(raw) {
            Err(garbled) if self.state == State::LoggedOn => {
                // Its first bytes only: a counterparty cannot make each of
                // its messages a log line as long as itself.
                const SHOWN: usize = 200;
                let shown = printable(&raw[..raw.len().min(SHOWN)]);
                let more = if raw.len() > SHOWN { format!("... ({} bytes)", raw.len()) } else { String::new() };
                actions.push(Action::Log(format!("ignored a garbled message ({garbled}): {shown}{more}")));
            }
            Err(garbled) => self.drop_connection(format!("garbled first message ({garbled})"), app, actions),
            Ok(message) if self.state == State::AwaitingLogon => self.on_logon(message, now_ms, app, actions),
            Ok(message) if self.state == State::LoggedOn => {
                self.process(message, now_ms, app, actions);
                self.drain_queue(now_ms, app, actions);
            }
            Ok(_) => {}
        }
        if self.next_in != next_in {
            actions.push(Action::Store(StoreOp::Received { next_in: self.next_in }));
        }
    }

    /// Heartbeats, TestRequests and time-outs: call about once a second.
    pub fn on_timer(&mut self, now_ms: i64, app: &mut dyn Application, actions: &mut Vec<Action>) {
        if self.state != State::LoggedOn {
            return;
        }
        if let Some(sent) = self.logout_sent_ms {
            if now_ms - sent >= self.outbound.config.logout_timeout_ms {
                self.drop_connection("no Logout in answer to ours".into(), app, actions);
            }
            return;
        }
        let interval = self.heartbeat_ms;
        if interval == 0 {
            return;
        }
        let silent = now_ms - self.last_received_ms;
        if silent * 10 >= interval * 24 {
            self.drop_connection(format!("nothing received for {} ms (HeartBtInt {} s)", silent, interval / 1000), app, actions);
        } else if silent * 10 >= interval * 12 * (i64::from(self.test_requests) + 1) {
            self.test_requests += 1;
            self.outbound.admin("1", vec![(tag::TEST_REQ_ID, b"TEST".to_vec())], now_ms, actions);
        } else if now_ms - self.outbound.last_sent_ms >= interval && self.test_requests == 0 {
            self.outbound.admin("0", Vec::new(), now_ms, actions);
        }
    }

    fn drop_connection(&mut self, reason: String, app: &mut dyn Application, actions: &mut Vec<Action>) {
        actions.push(Action::Disconnect(reason));
        self.disconnected(app);
    }

    fn sending_time_ok(&self, message: &Message, now_ms: i64) -> bool {
        message.get(tag::SENDING_TIME).and_then(parse_timestamp).is_some_and(|t| (now_ms - t).abs() <= self.outbound.config.max_latency_ms)
    }

    fn comp_ids_ok(&self, message: &Message) -> bool {
        let config = &self.outbound.config;
        message.get(tag::SENDER_COMP_ID) == Some(config.target_comp_id.as_bytes()) && message.get(tag::TARGET_COMP_ID) == Some(config.sender_comp_id.as_bytes())
    }

    fn reset(&mut self, actions: &mut Vec<Action>) {
        self.next_in = 1;
        self.outbound.next_out = 1;
        self.outbound.stored.clear();
        // What was held, and the gap asked for, belong to the old numbers.
        self.queue.clear();
        self.queued_bytes = 0;
        self.resend_range = None;
        actions.push(Action::Store(StoreOp::Reset));
    }

    /// Whether a message numbered `seq`, ahead of the expected one, shows
    /// a gap not asked for yet: none is, or the one asked for began after
    /// it, or was filled without reaching as far as it said (a GapFill
    /// past its end). After our Logout nothing is asked for.
    fn gap_to_ask(&self, seq: u64) -> bool {
        self.logout_sent_ms.is_none() && self.resend_range.is_none_or(|(begin, end)| seq < begin || self.next_in > end)
    }

    fn on_logon(&mut self, message: Message, now_ms: i64, app: &mut dyn Application, actions: &mut Vec<Action>) {
        let config = &self.outbound.config;
        if message.get(tag::BEGIN_STRING) != Some(config.begin_string.as_bytes()) {
            return self.drop_connection("Logon with a wrong BeginString".into(), app, actions);
        }
        if message.msg_type() != b"A" {
            return self.drop_connection(format!("first message is not a Logon (MsgType {})", text_of(message.msg_type())), app, actions);
        }
        if !self.comp_ids_ok(&message) {
            return self.drop_connection("Logon with unknown CompIDs".into(), app, actions);
        }
        if let Err(invalid) = validate(&self.dictionary, &message) {
            return self.drop_connection(format!("invalid Logon: {} (tag {:?})", invalid.reason.text(), invalid.tag), app, actions);
        }
        if !self.sending_time_ok(&message, now_ms) {
            return self.drop_connection("Logon SendingTime out of range".into(), app, actions);
        }
        let heartbeat = message.text(tag::HEART_BT_INT).and_then(|t| t.parse::<i64>().ok()).filter(|&h| h >= 0 && h <= self.outbound.config.max_heartbeat_s);
        let Some(heartbeat) = heartbeat else {
            return self.drop_connection("Logon HeartBtInt out of range".into(), app, actions);
        };
        let Some(seq) = message.number(tag::MSG_SEQ_NUM) else {
            return self.drop_connection("Logon without MsgSeqNum".into(), app, actions);
        };
        if let Err(LogonRefusal { text }) = app.on_logon(&message) {
            self.outbound.admin("5", vec![(tag::TEXT, text.clone().into_bytes())], now_ms, actions);
            // The application's text says why (and that the Logon was refused).
            return self.drop_connection(text, app, actions);
        }
        let reset_requested = message.get(tag::RESET_SEQ_NUM_FLAG) == Some(b"Y");
        if self.outbound.config.reset_on_logon || reset_requested {
            self.reset(actions);
        }
        if seq < self.next_in {
            let text = format!("MsgSeqNum too low, expecting {} but received {seq}", self.next_in);
            self.outbound.admin("5", vec![(tag::TEXT, text.clone().into_bytes())], now_ms, actions);
            return self.drop_connection(text, app, actions);
        }
        self.state = State::LoggedOn;
        self.heartbeat_ms = heartbeat * 1000;
        self.last_received_ms = now_ms;
        let mut body = vec![(tag::ENCRYPT_METHOD, b"0".to_vec()), (tag::HEART_BT_INT, heartbeat.to_string().into_bytes())];
        if reset_requested {
            body.push((tag::RESET_SEQ_NUM_FLAG, b"Y".to_vec()));
        }
        self.outbound.admin("A", body, now_ms, actions);
        if seq > self.next_in {
            self.request_resend(seq, now_ms, actions);
            self.hold(seq, message);
        } else {
            self.next_in = seq + 1;
        }
    }

    fn request_resend(&mut self, seq: u64, now_ms: i64, actions: &mut Vec<Action>) {
        let begin = self.next_in;
        self.outbound.admin("2", vec![(tag::BEGIN_SEQ_NO, begin.to_string().into_bytes()), (tag::END_SEQ_NO, b"0".to_vec())], now_ms, actions);
        self.resend_range = Some((begin, seq - 1));
    }

    /// A session Reject of `message`. It uses up the message's sequence
    /// number when that was the one expected (not for a Logon or a
    /// SequenceReset).
    fn reject(&mut self, message: &Message, invalid: Invalid, now_ms: i64, actions: &mut Vec<Action>) {
        let mut header = Vec::new();
        for (from, to) in REVERSE_ROUTE {
            if let Some(value) = message.get(from).filter(|v| !v.is_empty()) {
                header.push((to, value.to_vec()));
            }
        }
        let mut body = Vec::new();
        // RefSeqNum is a SeqNum: only a number the message really had.
        if let Some(seq) = message.number(tag::MSG_SEQ_NUM) {
            body.push((tag::REF_SEQ_NUM, seq.to_string().into_bytes()));
        }
        body.push((tag::TEXT, invalid.reason.text().as_bytes().to_vec()));
        if let Some(field) = invalid.tag {
            body.push((tag::REF_TAG_ID, field.to_string().into_bytes()));
        }
        body.push((tag::REF_MSG_TYPE, message.msg_type().to_vec()));
        body.push((tag::SESSION_REJECT_REASON, invalid.reason.code().to_string().into_bytes()));
        // After our Logout nothing is sent but what a ResendRequest asks
        // for; the number is used up all the same.
        if self.logout_sent_ms.is_none() {
            self.outbound.send("3", header, body, false, now_ms, actions);
        }
        let msg_type = message.msg_type();
        if msg_type == b"A" || msg_type == b"4" {
            return;
        }
        match message.number(tag::MSG_SEQ_NUM) {
            Some(seq) if seq == self.next_in => self.next_in += 1,
            // Ahead of a gap: its number is used up in its turn (a
            // rejected message is not asked for again), and the gap
            // asked for as any message past it would.
            Some(seq) if seq > self.next_in && self.state == State::LoggedOn => {
                // (A message already held under the number stays: the
                // first to arrive is the one done.)
                if self.queue.len() < MAX_QUEUED
                    && let std::collections::btree_map::Entry::Vacant(vacant) = self.queue.entry(seq)
                {
                    vacant.insert(Held::Rejected);
                }
                if self.gap_to_ask(seq) {
                    self.request_resend(seq, now_ms, actions);
                }
            }
            _ => {}
        }
    }

    /// Keeps `message` (number `seq`, ahead of a gap) until the gap fills,
    /// within [`MAX_QUEUED`] messages and [`MAX_QUEUED_BYTES`]: past them
    /// it is not kept, and is asked for again with the gap.
    fn hold(&mut self, seq: u64, message: Message) {
        let bytes = message.footprint();
        if self.queue.len() < MAX_QUEUED && self.queued_bytes + bytes <= MAX_QUEUED_BYTES {
            self.queued_bytes += bytes;
            if let Some(Held::Message(old)) = self.queue.insert(seq, Held::Message(message)) {
                self.queued_bytes -= old.footprint();
            }
        }
    }

    /// The held entry under `seq`, taken out.
    fn take_held(&mut self, seq: u64) -> Option<Held> {
        let held = self.queue.remove(&seq)?;
        if let Held::Message(message) = &held {
            self.queued_bytes -= message.footprint();
        }
        Some(held)
    }

    /// Our Logout, once: another reason to log out does not send a
    /// second one, nor give the counterparty more time to answer.
    fn logout(&mut self, text: Option<String>, now_ms: i64, actions: &mut Vec<Action>) {
        if self.logout_sent_ms.is_some() {
            return;
        }
        let body = text.map(|t| vec![(tag::TEXT, t.into_bytes())]).unwrap_or_default();
        self.outbound.admin("5", body, now_ms, actions);
        self.logout_sent_ms = Some(now_ms);
    }

    /// One message from a logged-on counterparty, in the order of checks
    /// described at the top of this file.
    fn process(&mut self, message: Message, now_ms: i64, app: &mut dyn Application, actions: &mut Vec<Action>) {
        let msg_type = message.msg_type().to_vec();
        if message.get(tag::BEGIN_STRING) != Some(self.outbound.config.begin_string.as_bytes()) {
            if msg_type == b"5" {
                return self.on_logout_message(now_ms, app, actions);
            }
            self.logout(Some("Incorrect BeginString".into()), now_ms, actions);
            // Its own number used up, if it is the one expected: not the
            // expected one it may not have had.
            if message.number(tag::MSG_SEQ_NUM) == Some(self.next_in) {
                self.next_in += 1;
            }
            return;
        }
        for required in [tag::SENDER_COMP_ID, tag::TARGET_COMP_ID] {
            if message.get(required).is_none() {
                let invalid = Invalid { reason: RejectReason::RequiredTagMissing, tag: Some(i64::from(required)) };
                return self.reject(&message, invalid, now_ms, actions);
            }
        }
        let shape = match validate(&self.dictionary, &message) {
            Ok(shape) => shape,
            Err(invalid) => return self.reject(&message, invalid, now_ms, actions),
        };
        if !self.sending_time_ok(&message, now_ms) {
            self.reject(&message, Invalid { reason: RejectReason::SendingTimeAccuracy, tag: None }, now_ms, actions);
            return self.logout(None, now_ms, actions);
        }
        if !self.comp_ids_ok(&message) {
            self.reject(&message, Invalid { reason: RejectReason::CompIdProblem, tag: None }, now_ms, actions);
            return self.logout(None, now_ms, actions);
        }
        let Some(seq) = message.number(tag::MSG_SEQ_NUM) else {
            // There but not a number a sequence can reach: its format, not
            // its absence.
            let reason = if message.get(tag::MSG_SEQ_NUM).is_some() { RejectReason::IncorrectDataFormat } else { RejectReason::RequiredTagMissing };
            return self.reject(&message, Invalid { reason, tag: Some(i64::from(tag::MSG_SEQ_NUM)) }, now_ms, actions);
        };
        // Anything that gets this far was heard from the counterparty,
        // kept ahead of a gap or not (it is busy filling one).
        self.last_received_ms = now_ms;
        self.test_requests = 0;
        let gap_fill = message.get(tag::GAP_FILL_FLAG) == Some(b"Y");
        let checked = match msg_type.as_slice() {
            b"5" | b"2" => false,
            b"4" => gap_fill,
            // A Logon that resets the sequence numbers starts them over.
            b"A" => message.get(tag::RESET_SEQ_NUM_FLAG) != Some(b"Y"),
            _ => true,
        };
        if checked && seq > self.next_in {
            let asked = self.gap_to_ask(seq);
            self.hold(seq, message);
            if asked {
                self.request_resend(seq, now_ms, actions);
            }
            return;
        }
        if checked && seq < self.next_in {
            return self.too_low(&message, seq, now_ms, app, actions);
        }
        // Accepted.
        if self.resend_range.is_some_and(|(_, end)| seq >= end) {
            self.resend_range = None;
        }
        match msg_type.as_slice() {
            b"0" | b"3" => self.next_in += 1,
            b"1" => {
                // Answered, unless we have logged out (then nothing is
                // sent but what a ResendRequest asks for).
                if self.logout_sent_ms.is_none() {
                    let id = message.get(tag::TEST_REQ_ID).unwrap_or(b"").to_vec();
                    self.outbound.admin("0", vec![(tag::TEST_REQ_ID, id)], now_ms, actions);
                }
                self.next_in += 1;
            }
            b"5" => {
                if seq == self.next_in {
                    self.next_in += 1;
                }
                self.on_logout_message(now_ms, app, actions);
            }
            b"4" => self.sequence_reset(&message, seq, now_ms, actions),
            b"2" => {
                self.answer_resend(&message, now_ms, actions);
                if seq == self.next_in {
                    self.next_in += 1;
                }
            }
            b"A" if self.logout_sent_ms.is_some() => {
                if seq == self.next_in {
                    self.next_in += 1;
                }
                actions.push(Action::Log(format!("not processed (after our Logout): MsgType A MsgSeqNum {seq}")));
            }
            b"A" => {
                if message.get(tag::RESET_SEQ_NUM_FLAG) == Some(b"Y") {
                    self.reset(actions);
                    let heartbeat = (self.heartbeat_ms / 1000).to_string().into_bytes();
                    let body = vec![(tag::ENCRYPT_METHOD, b"0".to_vec()), (tag::HEART_BT_INT, heartbeat), (tag::RESET_SEQ_NUM_FLAG, b"Y".to_vec())];
                    self.outbound.admin("A", body, now_ms, actions);
                    self.next_in = 2;
                } else {
                    self.drop_connection("a second Logon without ResetSeqNumFlag".into(), app, actions);
                }
            }
            // After our Logout the session is ending: what it asks is not
            // done (a message held behind a gap included). FIX 4.4 has us
            // send nothing more but what a ResendRequest asks: its number
            // is used up, and the log says so.
            _ if self.logout_sent_ms.is_some() => {
                self.next_in += 1;
                actions.push(Action::Log(format!("not processed (after our Logout): MsgType {} MsgSeqNum {seq}", text_of(&msg_type))));
            }
            _ => {
                self.next_in += 1;
                let mut outbox = Outbox { outbound: &mut self.outbound, actions, dictionary: &self.dictionary, now_ms };
                app.on_message(&message, &shape, &mut outbox);
            }
        }
    }

    fn too_low(&mut self, message: &Message, seq: u64, now_ms: i64, app: &mut dyn Application, actions: &mut Vec<Action>) {
        if message.get(tag::POSS_DUP_FLAG) != Some(b"Y") {
            let text = format!("MsgSeqNum too low, expecting {} but received {seq}", self.next_in);
            self.logout(Some(text.clone()), now_ms, actions);
            return self.drop_connection(text, app, actions);
        }
        if message.msg_type() == b"4" {
            return;
        }
        let Some(original) = message.get(tag::ORIG_SENDING_TIME) else {
            let invalid = Invalid { reason: RejectReason::RequiredTagMissing, tag: Some(i64::from(tag::ORIG_SENDING_TIME)) };
            return self.reject(message, invalid, now_ms, actions);
        };
        let sent = message.get(tag::SENDING_TIME).and_then(parse_timestamp);
        if parse_timestamp(original).zip(sent).is_some_and(|(original, sent)| original > sent) {
            self.reject(message, Invalid { reason: RejectReason::SendingTimeAccuracy, tag: None }, now_ms, actions);
            self.logout(None, now_ms, actions);
        }
        // Otherwise a duplicate of something already processed: ignored.
    }

    fn on_logout_message(&mut self, now_ms: i64, app: &mut dyn Application, actions: &mut Vec<Action>) {
        self.logout(None, now_ms, actions);
        self.drop_connection("logout".into(), app, actions);
    }

    fn sequence_reset(&mut self, message: &Message, seq: u64, now_ms: i64, actions: &mut Vec<Action>) {
        let Some(new_seq) = message.number(tag::NEW_SEQ_NO) else {
            let reason = if message.get(tag::NEW_SEQ_NO).is_some() { RejectReason::IncorrectDataFormat } else { RejectReason::RequiredTagMissing };
            let invalid = Invalid { reason, tag: Some(i64::from(tag::NEW_SEQ_NO)) };
            return self.reject(message, invalid, now_ms, actions);
        };
        let _ = seq;
        if new_seq > self.next_in {
            self.next_in = new_seq;
            // Filled short of the next message held: the gap that is left
            // is asked for again by the next message past it (the rest of
            // a resend still on its way comes first, in order, and asks
            // nothing).
            if self.queue.first_key_value().is_some_and(|(&held, _)| held > self.next_in) {
                self.resend_range = None;
            }
        } else if new_seq < self.next_in {
            self.reject(message, Invalid { reason: RejectReason::ValueIncorrect, tag: None }, now_ms, actions);
        }
    }

    /// Answers a ResendRequest from the store: application messages again
    /// (PossDupFlag, their original SendingTime), everything else as
    /// SequenceReset-GapFill runs.
    fn answer_resend(&mut self, message: &Message, now_ms: i64, actions: &mut Vec<Action>) {
        let begin = message.number(tag::BEGIN_SEQ_NO).unwrap_or(1).max(1);
        // A range that ends before it begins asks for nothing a sender can
        // mean: said so, not passed over in silence.
        if message.number(tag::END_SEQ_NO).is_some_and(|end| end != 0 && end < begin) {
            return self.reject(message, Invalid { reason: RejectReason::ValueIncorrect, tag: Some(i64::from(tag::END_SEQ_NO)) }, now_ms, actions);
        }
        let last = self.outbound.next_out - 1;
        let end = match message.number(tag::END_SEQ_NO) {
            Some(0) | None => last,
            Some(end) => end.min(last),
        };
        if begin > end {
            return;
        }
        let resend: Vec<(u64, Vec<u8>)> = self.outbound.stored.range(begin..=end).map(|(seq, raw)| (*seq, raw.clone())).collect();
        let mut gap_from = begin;
        for (seq, raw) in resend {
            if seq > gap_from {
                self.gap_fill(gap_from, seq, now_ms, actions);
            }
            if let Some(bytes) = self.resent(&raw, seq, now_ms) {
                actions.push(Action::Send(bytes));
                self.outbound.last_sent_ms = now_ms;
            }
            gap_from = seq + 1;
        }
        if gap_from <= end {
            self.gap_fill(gap_from, end + 1, now_ms, actions);
        }
    }

    fn gap_fill(&mut self, seq: u64, new_seq: u64, now_ms: i64, actions: &mut Vec<Action>) {
        let now = format_timestamp(now_ms).into_bytes();
        let header = vec![(tag::POSS_DUP_FLAG, b"Y".to_vec()), (tag::ORIG_SENDING_TIME, now)];
        let body = [(tag::NEW_SEQ_NO, new_seq.to_string().into_bytes()), (tag::GAP_FILL_FLAG, b"Y".to_vec())];
        let bytes = self.outbound.compose("4", seq, header, &body, now_ms);
        actions.push(Action::Send(bytes));
        self.outbound.last_sent_ms = now_ms;
    }

    /// A stored message as it is sent again.
    fn resent(&self, raw: &[u8], seq: u64, now_ms: i64) -> Option<Vec<u8>> {
        let stored = Message::parse(raw).ok()?;
        let shape = crate::validate::shape(&self.dictionary, &stored);
        let fields = stored.fields();
        let mut header: Vec<(u32, Vec<u8>)> = shape
            .header
            .iter()
            .filter_map(|&i| {
                let tag = u32::try_from(fields[i].tag).ok()?;
                (!OWN_HEADER.contains(&tag)).then(|| (tag, stored.value_of(fields[i]).to_vec()))
            })
            .collect();
        header.push((tag::POSS_DUP_FLAG, b"Y".to_vec()));
        header.push((tag::ORIG_SENDING_TIME, stored.get(tag::SENDING_TIME)?.to_vec()));
        let mut body_fields: Vec<usize> = Vec::new();
        collect(&shape.body, &mut body_fields);
        body_fields.sort_unstable();
        let body: Vec<(u32, Vec<u8>)> = body_fields.iter().filter_map(|&i| Some((u32::try_from(fields[i].tag).ok()?, stored.value_of(fields[i]).to_vec()))).collect();
        let msg_type = String::from_utf8_lossy(stored.msg_type()).into_owned();
        Some(self.outbound.compose(&msg_type, seq, header, &body, now_ms))
    }

    fn drain_queue(&mut self, now_ms: i64, app: &mut dyn Application, actions: &mut Vec<Action>) {
        while self.state == State::LoggedOn {
            while let Some(seq) = self.queue.first_key_value().map(|(&seq, _)| seq).filter(|&seq| seq < self.next_in) {
                self.take_held(seq);
            }
            let message = match self.take_held(self.next_in) {
                None => break,
                Some(Held::Rejected) => {
                    self.next_in += 1;
                    continue;
                }
                Some(Held::Message(message)) => message,
            };
            let msg_type = message.msg_type();
            if msg_type == b"A" || msg_type == b"2" {
                self.next_in += 1;
                continue;
            }
            self.process(message, now_ms, app, actions);
        }
    }
}

/// Every field index of a level, groups included, in wire order.
fn collect(level: &crate::validate::Level, out: &mut Vec<usize>) {
    out.extend_from_slice(&level.fields);
    for (_, entries) in &level.groups {
        for entry in entries {
            collect(entry, out);
        }
    }
}

/// The application the acceptance scripts assume: NewOrderSingle and
/// SecurityDefinition are sent back as they came (a NewOrderSingle
/// marked PossResend whose ClOrdID was already seen is not), anything else
/// gets a BusinessMessageReject.
#[derive(Default)]
pub struct EchoApplication {
    seen: std::collections::BTreeSet<Vec<u8>>,
}

impl Application for EchoApplication {
    fn on_logon(&mut self, _logon: &Message) -> Result<(), LogonRefusal> {
        Ok(())
    }

    fn on_message(&mut self, message: &Message, shape: &Shape, outbox: &mut Outbox<'_>) {
        match message.msg_type() {
            b"D" => {
                let id = message.get(11).unwrap_or(b"").to_vec();
                let resent = message.get(97) == Some(b"Y");
                if resent && self.seen.contains(&id) {
                    return;
                }
                self.seen.insert(id);
                outbox.echo(message, shape);
            }
            b"d" => outbox.echo(message, shape),
            b"j" => {}
            _ => outbox.business_reject(message, 3, "Unsupported Message Type"),
        }
    }

    fn on_logout(&mut self) {
        self.seen.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kept messages are bounded in number and in bytes: the oldest
    /// go first.
    #[test]
    fn kept_messages_are_bounded_in_number_and_bytes() {
        let mut kept = Kept::default();
        for seq in 1..=100u64 {
            kept.insert(seq, vec![b'x'; 1 << 20]);
        }
        assert_eq!(kept.len(), MAX_STORED_BYTES >> 20);
        assert_eq!(kept.iter().next().map(|(seq, _)| *seq), Some(100 - (MAX_STORED_BYTES >> 20) as u64 + 1));
        assert!(kept.get(&100).is_some() && kept.get(&1).is_none());
        let mut small = Kept::default();
        for seq in 1..=(MAX_STORED as u64 + 5) {
            small.insert(seq, b"8=FIX.4.4".to_vec());
        }
        assert_eq!((small.len(), small.iter().next().map(|(seq, _)| *seq)), (MAX_STORED, Some(6)));
        small.clear();
        assert!(small.is_empty());
    }
}
