//! The binary-protocol gateway: one thread, one epoll (via mio) for every
//! connection. It accepts, reads and decodes frames, logs sessions in,
//! gives each round's commands to the sequencer (which runs on this same
//! thread, `sequencer.rs`) in one batch, hands the durable ones to every
//! [`ReportSink`] (its own [`Sessions`] first), and writes the frames its
//! sessions queued.
//!
//! One thread rather than two per connection: on a machine with few cores
//! the hand-offs and wake-ups of many threads cost more than the work
//! (a reader thread per connection woke once per order; this thread wakes
//! once per round of ready sockets).
//!
//! Bounds: a connection's input buffer holds at most one frame plus
//! `READS_PER_ROUND` reads; its output buffer at most `MAX_OUTBUF` (past
//! that the client is dropped as one that does not read its reports); a
//! connection with `limits.in_flight` commands unanswered is not read
//! until the journal has made some durable and their reports are out.

use crate::config::{Config, keys_match};
use crate::keys::Keys;
use crate::ratelog::RateLog;
use crate::sequencer::{InFlight, Inbound, Request, Sequencer};
use crate::sessions::{Session, Sessions};
use crate::replica::NodeState;
use crate::sink::{BINARY, Query, QueryKind, ReportSink};
use crate::{ServeError, log};
use crossbook_engine::AccountId;
use crossbook_protocol::*;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use std::collections::{HashMap, HashSet};
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

const LISTENER: Token = Token(0);
/// Woken by the journal's writer after a group commit, by the FIX
/// readers after queueing commands, and by nothing else.
pub(crate) const WAKER: Token = Token(1);
/// Connection `n`'s token is `n + FIRST_CONNECTION` (after the two above).
const FIRST_CONNECTION: usize = 2;

fn token_of(connection: u64) -> Token {
    Token(connection as usize + FIRST_CONNECTION)
}
/// Readiness events taken from epoll per round.
const EVENTS_PER_POLL: usize = 1024;
/// A new connection's input buffer (grows to what it is sent).
const INBUF_START: usize = 4096;
/// Written bytes dropped from the front of an output buffer that is not
/// yet empty once they pass this (so a slow reader's buffer does not keep
/// everything ever sent to it).
const OUTBUF_COMPACT: usize = 1 << 20;
/// Bytes asked of a socket per read.
const READ_BYTES: usize = 64 * 1024;
/// Reads of one socket per round before the others get their turn.
const READS_PER_ROUND: usize = 4;
/// Unsent bytes a connection may have before it is dropped as a client
/// that does not read its reports.
const MAX_OUTBUF: usize = 16 << 20;
/// How long a closing connection may take to take its last bytes.
const CLOSE_GRACE: Duration = Duration::from_secs(5);
/// How long connections are given to take their last bytes when the venue
/// stops on a failure.
const FAIL_GRACE: Duration = Duration::from_secs(2);
/// How often the loop looks at the shutdown flag.
const TICK: Duration = Duration::from_millis(50);
/// How long a login for an account whose session's connection still looks
/// alive waits for that connection's end before it is refused: on loopback
/// a client's close and its next connection's login can reach the server
/// in either order.
const RELOGIN_GRACE: Duration = Duration::from_millis(250);
/// How often such a login looks again.
const RELOGIN_POLL: Duration = Duration::from_millis(5);

struct Conn {
    id: u64,
    stream: TcpStream,
    peer: SocketAddr,
    inbuf: Vec<u8>,
    outbuf: Vec<u8>,
    /// Bytes of `outbuf` already written.
    written: usize,
    account: Option<AccountId>,
    /// The account had `cancel_on_disconnect` when this session logged in:
    /// its end cancels the account's orders.
    cancel_on_disconnect: bool,
    in_flight: Arc<InFlight>,
    /// Close once `outbuf` is out (why, and since when).
    closing: Option<(String, Instant)>,
    /// WRITABLE interest is registered.
    want_write: bool,
    /// Not read because `limits.in_flight` commands are unanswered; read
    /// again once the sequencer answers (epoll is edge-triggered, so the
    /// bytes waiting in the socket would give no new event).
    held: bool,
    /// When it was accepted (it must log in within `limits.login_timeout_s`).
    accepted_at: Instant,
    /// The connection of an earlier session of the account this one logs
    /// in for, found alive: the login is refused.
    probed: Option<u64>,
    /// Since when its login has waited for an earlier session's end.
    relogin_wait: Option<Instant>,
    /// It sent a Logout while earlier messages were unanswered: nothing
    /// more is read, and it closes once the sequencer has answered them
    /// all, the Logout last.
    logging_out: bool,
    /// The server began stopping while it had requests unanswered:
    /// nothing more is read, and its Logout goes out after their answers
    /// (not before them).
    logout_when_answered: bool,
    /// What it sent this round for the sequencer (added to `in_flight`
    /// once its bytes are decoded).
    queued: u32,
}

impl Conn {
    fn queue(&mut self, message: &ServerMessage) {
        encode_server(message, &mut self.outbuf);
    }

    fn close_after(&mut self, reason: String) {
        if self.closing.is_none() {
            self.closing = Some((reason, Instant::now()));
        }
    }

    /// Whether the peer is still there: not closing, and its socket has
    /// neither an end nor an error waiting (a peek that would block, or
    /// that finds bytes, says it is).
    fn is_alive(&self) -> bool {
        if self.closing.is_some() {
            return false;
        }
        let mut byte = [0u8; 1];
        match self.stream.peek(&mut byte) {
            Ok(0) => false,
            Ok(_) => true,
            Err(e) => matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted),
        }
    }
}

/// Why decoding a connection's input stopped early.
enum Stop {
    /// Close the connection, for this reason (after what is queued).
    Close(String),
    /// A Login for an account whose session is on connection `.0`: the
    /// gateway looks at that connection and decodes again.
    Conflict(u64),
}

/// The reactor's state.
struct Gateway<'a> {
    poll: Poll,
    listener: TcpListener,
    conns: HashMap<Token, Conn>,
    /// Connections with bytes left to read (stopped after `READS_PER_ROUND`)
    /// or held back by their in-flight limit.
    unread: HashSet<Token>,
    /// Connections whose login waits for an earlier session's end
    /// (`RELOGIN_GRACE`), looked at again every `RELOGIN_POLL`.
    deferred: HashSet<Token>,
    next_id: u64,
    config: &'a Config,
    /// The accounts' keys (a configuration reload changes them).
    keys: &'a Keys,
    /// Logged-in sessions, report histories and the frames to write.
    sessions: Sessions,
    /// Commands of this round, for the sequencer.
    commands: Vec<Inbound>,
    chunk: Vec<u8>,
    /// Connection events a flood could multiply, rate-limited.
    ratelog: RateLog,
    /// Whether this node takes orders, and who leads (a replicated venue).
    node: Arc<NodeState>,
    /// The venue is stopping (or failed): a session that ends now leaves
    /// its orders (nothing more is journaled for it).
    stopping: bool,
}

/// Runs the gateway, and with it the sequencer, on the calling thread
/// until `shutdown`; then logs every session out, lets them take what is
/// queued for them (bounded), and returns. Each round: wait for sockets
/// (or a wake-up), take the FIX gateway's queued commands and what every
/// readable connection sent, apply them all as one batch, hand out the
/// reports of every batch the journal has made durable, and write.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    poll: Poll,
    listener: std::net::TcpListener,
    config: &Config,
    keys: &Keys,
    sessions: Sessions,
    inbound: &Receiver<Vec<Inbound>>,
    sequencer: &mut Sequencer<'_>,
    others: &mut [&mut dyn ReportSink],
    shutdown: &AtomicBool,
    node: Arc<NodeState>,
) -> Result<(), ServeError> {
    listener.set_nonblocking(true).map_err(ServeError::io("setting the listener non-blocking"))?;
    let mut listener = TcpListener::from_std(listener);
    poll.registry().register(&mut listener, LISTENER, Interest::READABLE).map_err(ServeError::io("registering the listener"))?;
    let mut gateway = Gateway {
        poll,
        listener,
        conns: HashMap::new(),
        unread: HashSet::new(),
        deferred: HashSet::new(),
        next_id: 0,
        config,
        keys,
        sessions,
        commands: Vec::new(),
        chunk: vec![0u8; READ_BYTES],
        ratelog: RateLog::default(),
        node,
        stopping: false,
    };
    let mut events = Events::with_capacity(EVENTS_PER_POLL);
    let mut stopping: Option<Instant> = None;
    // Rounds of the loop, logged at the end: a loop that spins instead of
    // sleeping in epoll shows here (an idle server makes about 20 a
    // second, one per `TICK`).
    let mut rounds: u64 = 0;
    loop {
        rounds += 1;
        if stopping.is_none() && shutdown.load(Ordering::Acquire) {
            gateway.begin_shutdown();
            for sink in others.iter_mut() {
                sink.stop_intake();
            }
            stopping = Some(Instant::now());
        }
        // Commands queued after the last round's apply (a cancel on
        // disconnect of a session reaped then) go first.
        if let Some(since) = stopping
            && gateway.commands.is_empty()
            && ((gateway.conns.is_empty() && sequencer.idle() && others.iter().all(|sink| sink.settled())) || since.elapsed() > CLOSE_GRACE)
        {
            let tokens: Vec<Token> = gateway.conns.keys().copied().collect();
            for token in tokens {
                // A session still owed answers the grace did not bring (a
                // replicated leader without a quorum: its orders' fate is
                // the log's) gets its Logout all the same, before the close.
                if let Some(conn) = gateway.conns.get_mut(&token)
                    && std::mem::take(&mut conn.logout_when_answered)
                {
                    conn.queue(&ServerMessage::Logout { reason: 0 });
                    gateway.flush(token);
                }
                gateway.close(token, "server shutting down".into());
            }
            gateway.ratelog.flush();
            log(&format!("gateway: {rounds} polling rounds"));
            return Ok(());
        }
        let timeout = if !gateway.unread.is_empty() {
            Duration::ZERO
        } else if !gateway.deferred.is_empty() {
            RELOGIN_POLL
        } else {
            TICK
        };
        if let Err(e) = gateway.poll.poll(&mut events, Some(timeout))
            && e.kind() != ErrorKind::Interrupted {
                return Err(ServeError::Io { what: "epoll".into(), source: e });
            }
        for event in events.iter() {
            match event.token() {
                LISTENER => gateway.accept_all(stopping.is_some()),
                WAKER => {}
                token => {
                    if event.is_readable() || event.is_read_closed() || event.is_error() {
                        gateway.unread.insert(token);
                    }
                    if event.is_writable() {
                        gateway.flush(token);
                    }
                }
            }
        }
        // Commands: the FIX gateway's first (queued earlier), then this
        // round's reads, in one batch.
        while let Ok(items) = inbound.try_recv() {
            gateway.commands.extend(items);
        }
        let deferred: Vec<Token> = gateway.deferred.drain().collect();
        gateway.unread.extend(deferred);
        gateway.read_ready();
        // A replicated node applies the log's messages that came (or, as
        // leader, checks it still leads) before this round's commands.
        let round = sequencer.replicate().and_then(|()| sequencer.apply(&mut gateway.commands));
        // Reports of what the journal made durable go out even when this
        // round failed (those commands are safe).
        let released = {
            let mut sinks: Vec<&mut dyn ReportSink> = Vec::with_capacity(1 + others.len());
            sinks.push(&mut gateway.sessions);
            for sink in others.iter_mut() {
                sinks.push(&mut **sink);
            }
            sequencer.release(&mut sinks)
        };
        gateway.deliver_outbox();
        if let Err(failure) = round.and(released) {
            gateway.fail(&failure);
            return Err(failure);
        }
        gateway.reap();
        sequencer.tick();
        // The configuration read again (SIGHUP): sessions that logged in or
        // signed with credentials it changed or took away are let go.
        // (Its commands can fail as a round's can: the sessions are told
        // the same way.)
        let revoked = match sequencer.reload_if_asked() {
            Ok(revoked) => revoked,
            Err(failure) => {
                gateway.fail(&failure);
                return Err(failure);
            }
        };
        if revoked != crate::keys::Changed::default() {
            gateway.revoke(&revoked.logins);
            for sink in others.iter_mut() {
                sink.revoked(&revoked);
            }
        }
    }
}

impl Gateway<'_> {
    fn accept_all(&mut self, stopping: bool) {
        loop {
            match self.listener.accept() {
                Ok((stream, peer)) => self.accept(stream, peer, stopping),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) => {
                    log(&format!("accept failed: {e}"));
                    return;
                }
            }
        }
    }

    fn accept(&mut self, mut stream: TcpStream, peer: SocketAddr, stopping: bool) {
        self.next_id += 1;
        let id = self.next_id;
        let _ = stream.set_nodelay(true);
        if stopping {
            self.ratelog.line("refused connection", || format!("refused connection {id} from {peer}: server shutting down"));
            let mut frame = Vec::new();
            encode_server(&ServerMessage::Error { reason: ProtocolError::ServerBusy }, &mut frame);
            let _ = stream.write(&frame);
            return;
        }
        // Connections that have not logged in have a budget of their own:
        // past it the oldest of them makes room, so that idle connections
        // can never keep a trader out (logged-in sessions are bounded at
        // login, by `max_connections`).
        let waiting: Vec<(Instant, Token)> = self.conns.iter().filter(|(_, c)| c.account.is_none() && c.closing.is_none()).map(|(t, c)| (c.accepted_at, *t)).collect();
        if waiting.len() >= self.config.limits.max_unauthenticated.max(1)
            && let Some(&(_, oldest)) = waiting.iter().min()
        {
            if let Some(conn) = self.conns.get_mut(&oldest) {
                conn.queue(&ServerMessage::Error { reason: ProtocolError::ServerBusy });
            }
            self.flush(oldest);
            self.close(oldest, "evicted: too many connections waiting to log in".into());
        }
        let token = token_of(id);
        if let Err(e) = self.poll.registry().register(&mut stream, token, Interest::READABLE) {
            log(&format!("refused connection {id} from {peer}: {e}"));
            return;
        }
        let conn = Conn {
            id,
            stream,
            peer,
            inbuf: Vec::with_capacity(INBUF_START),
            outbuf: Vec::new(),
            written: 0,
            account: None,
            cancel_on_disconnect: false,
            in_flight: InFlight::polled(),
            closing: None,
            logging_out: false,
            logout_when_answered: false,
            queued: 0,
            want_write: false,
            held: false,
            accepted_at: Instant::now(),
            probed: None,
            relogin_wait: None,
        };
        self.conns.insert(token, conn);
        // Bytes may already be waiting.
        self.unread.insert(token);
    }

    /// Reads every connection that has something (up to its in-flight
    /// limit and `READS_PER_ROUND` reads), decodes and handles it.
    fn read_ready(&mut self) {
        let limit = self.config.limits.in_flight.max(1);
        let tokens: Vec<Token> = self.unread.iter().copied().collect();
        for token in tokens {
            let Some(conn) = self.conns.get_mut(&token) else {
                self.unread.remove(&token);
                continue;
            };
            if conn.closing.is_some() || conn.logging_out || conn.logout_when_answered {
                self.unread.remove(&token);
                continue;
            }
            // Backpressure: while this session has too many commands
            // unanswered, its socket is not read; it is looked at again
            // when the sequencer answers (not before: a socket left in
            // `unread` would turn the poll loop into a busy loop).
            if conn.in_flight.count() >= limit {
                conn.held = true;
                self.unread.remove(&token);
                continue;
            }
            let mut drained = false;
            let mut ended: Option<String> = None;
            for _ in 0..READS_PER_ROUND {
                match conn.stream.read(&mut self.chunk) {
                    Ok(0) => {
                        ended = Some("closed by the client".into());
                        break;
                    }
                    Ok(n) => conn.inbuf.extend_from_slice(&self.chunk[..n]),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        drained = true;
                        break;
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => {
                        ended = Some(format!("read error: {e}"));
                        break;
                    }
                }
            }
            let mut decoded = decode_all(conn, self.config, self.keys, &mut self.sessions, &mut self.commands, &self.node);
            // A login for an account whose session is still registered: if
            // that session's connection is gone (its end not read yet), it
            // is closed now and the login goes ahead; if it is alive, the
            // login is refused.
            while let Err(Stop::Conflict(old)) = decoded {
                let old_token = token_of(old);
                match self.conns.get(&old_token).map(Conn::is_alive) {
                    Some(true) => {
                        // Its end may still be on the way: look again for
                        // a moment before refusing (the login stays in
                        // the buffer meanwhile).
                        let Some(conn) = self.conns.get_mut(&token) else { break };
                        let since = *conn.relogin_wait.get_or_insert_with(Instant::now);
                        if since.elapsed() < RELOGIN_GRACE {
                            self.deferred.insert(token);
                            decoded = Ok(());
                            break;
                        }
                    }
                    Some(false) => self.close(old_token, "gone (found at its account's next login)".into()),
                    None => {
                        self.sessions.by_account.retain(|_, s| s.connection != old);
                        self.sessions.count();
                    }
                }
                let Some(conn) = self.conns.get_mut(&token) else { break };
                conn.probed = Some(old);
                decoded = decode_all(conn, self.config, self.keys, &mut self.sessions, &mut self.commands, &self.node);
            }
            let Some(conn) = self.conns.get_mut(&token) else { continue };
            let decoded = decoded.map_err(|stop| match stop {
                Stop::Close(reason) => reason,
                Stop::Conflict(old) => format!("login conflicts with connection {old}"),
            });
            // Only this connection's (a session closed meanwhile may have
            // queued its cancel on disconnect, counted on its own).
            let added = std::mem::take(&mut conn.queued);
            if added > 0 {
                conn.in_flight.add(added);
            }
            if let Err(reason) = decoded {
                conn.close_after(reason);
            }
            if drained || ended.is_some() || conn.closing.is_some() {
                self.unread.remove(&token);
            }
            if let Some(reason) = ended {
                // Whatever came before the end was handled. A protocol
                // error found in it is the reason that counts (and its
                // error frame still goes out); otherwise close now.
                if conn.closing.is_none() {
                    self.close(token, reason);
                    continue;
                }
            }
            self.flush(token);
            // What it was answered at once (heartbeats, a follower's
            // refusals) is bounded as its reports are.
            self.drop_if_unread(token);
        }
    }

    /// Closes a connection with more than `MAX_OUTBUF` bytes it has not
    /// read; whether it did.
    fn drop_if_unread(&mut self, token: Token) -> bool {
        let Some(conn) = self.conns.get(&token) else { return false };
        if conn.outbuf.len() - conn.written <= MAX_OUTBUF {
            return false;
        }
        log(&format!("dropping session of account {}: it does not read its reports", conn.account.unwrap_or(0)));
        self.close(token, "does not read its reports".into());
        true
    }

    /// Moves what the sequencer left for each connection into its buffer
    /// and writes.
    fn deliver_outbox(&mut self) {
        let outgoing = std::mem::take(&mut self.sessions.outbox);
        for (id, frames) in outgoing {
            let token = token_of(id);
            let Some(conn) = self.conns.get_mut(&token) else { continue };
            conn.outbuf.extend_from_slice(&frames);
            if conn.logging_out && conn.in_flight.count() == 0 {
                // Its Logout's answer is in `frames`, after everything
                // it sent before.
                conn.close_after("logout".into());
            }
            if self.drop_if_unread(token) {
                continue;
            }
            self.flush(token);
        }
        // The sequencer answered: connections held back may be read again.
        let limit = self.config.limits.in_flight.max(1);
        for (token, conn) in self.conns.iter_mut() {
            if conn.held && conn.in_flight.count() < limit && conn.closing.is_none() {
                conn.held = false;
                self.unread.insert(*token);
            }
        }
    }

    /// Writes as much of a connection's buffer as the socket takes.
    fn flush(&mut self, token: Token) {
        let Some(conn) = self.conns.get_mut(&token) else { return };
        while conn.written < conn.outbuf.len() {
            match conn.stream.write(&conn.outbuf[conn.written..]) {
                Ok(0) => break,
                Ok(n) => conn.written += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    self.close(token, format!("write error: {e}"));
                    return;
                }
            }
        }
        if conn.written == conn.outbuf.len() {
            conn.outbuf.clear();
            conn.written = 0;
        } else if conn.written > OUTBUF_COMPACT {
            conn.outbuf.drain(..conn.written);
            conn.written = 0;
        }
        let want_write = !conn.outbuf.is_empty();
        if want_write != conn.want_write {
            let interest = if want_write { Interest::READABLE | Interest::WRITABLE } else { Interest::READABLE };
            if self.poll.registry().reregister(&mut conn.stream, token, interest).is_ok() {
                conn.want_write = want_write;
            }
        }
    }

    /// Closes connections whose last bytes are out (or that took too long),
    /// and those that did not log in in time.
    fn reap(&mut self) {
        let deadline = Duration::from_secs(self.config.limits.login_timeout_s);
        let late: Vec<Token> = self.conns.iter().filter(|(_, c)| c.account.is_none() && c.closing.is_none() && c.accepted_at.elapsed() > deadline).map(|(t, _)| *t).collect();
        for token in late {
            if let Some(conn) = self.conns.get_mut(&token) {
                conn.queue(&ServerMessage::Error { reason: ProtocolError::LoginTimeout });
                conn.close_after(format!("no login within {} s", deadline.as_secs()));
            }
            self.flush(token);
        }
        self.ratelog.tick();
        // Stopping: a session whose requests were unanswered gets its
        // Logout once they are (after their answers, delivered above).
        let answered: Vec<Token> = self.conns.iter().filter(|(_, c)| c.logout_when_answered && c.in_flight.count() == 0).map(|(t, _)| *t).collect();
        for token in answered {
            if let Some(conn) = self.conns.get_mut(&token) {
                conn.logout_when_answered = false;
                conn.queue(&ServerMessage::Logout { reason: 0 });
                conn.close_after("server shutting down".into());
            }
            self.flush(token);
        }
        let done: Vec<(Token, String)> = self
            .conns
            .iter()
            .filter_map(|(token, conn)| {
                let (reason, since) = conn.closing.as_ref()?;
                (conn.outbuf.is_empty() || since.elapsed() > CLOSE_GRACE).then(|| (*token, reason.clone()))
            })
            .collect();
        for (token, reason) in done {
            self.close(token, reason);
        }
    }

    fn close(&mut self, token: Token, reason: String) {
        let Some(mut conn) = self.conns.remove(&token) else { return };
        self.unread.remove(&token);
        let _ = self.poll.registry().deregister(&mut conn.stream);
        let _ = conn.stream.shutdown(std::net::Shutdown::Both);
        self.sessions.by_account.retain(|_, s| s.connection != conn.id);
        self.sessions.count();
        // Cancel on disconnect: the session's end is journaled as a
        // CancelAll for its account, in this round's batch (before any
        // command of a session that replaces it).
        if let Some(account) = conn.account
            && conn.cancel_on_disconnect
            && !self.stopping
            && self.node.accepting.load(Ordering::Acquire)
        {
            self.commands.extend(crate::sequencer::own_commands([crossbook_engine::Command::CancelAll { account, instrument: None }]));
            log(&format!("cancel on disconnect: account {account}'s open orders are cancelled (connection {})", conn.id));
        }
        let line = || format!("disconnect connection={} peer={} reason={reason}", conn.id, conn.peer);
        if conn.account.is_some() {
            log(&line());
        } else {
            // A flood of connections that never log in is a flood of these.
            self.ratelog.line("disconnect before login", line);
        }
    }

    /// The venue cannot go on (the journal failed): every connection is
    /// told why (`journal_failed`), given up to `FAIL_GRACE` to take what is
    /// queued for it, and closed.
    fn fail(&mut self, why: &ServeError) {
        self.stopping = true;
        log(&format!("stopping: {why}; telling {} connections", self.conns.len()));
        let reason = if matches!(why, ServeError::Deposed(_)) { ProtocolError::NotLeader } else { ProtocolError::JournalFailed };
        let _ = self.poll.registry().deregister(&mut self.listener);
        let tokens: Vec<Token> = self.conns.keys().copied().collect();
        for &token in &tokens {
            if let Some(conn) = self.conns.get_mut(&token) {
                conn.queue(&ServerMessage::Error { reason });
                conn.close_after(if reason == ProtocolError::NotLeader { "no longer the leader".into() } else { "the journal failed".into() });
            }
            self.flush(token);
        }
        let deadline = Instant::now() + FAIL_GRACE;
        let mut events = Events::with_capacity(256);
        while Instant::now() < deadline && self.conns.values().any(|c| !c.outbuf.is_empty()) {
            let _ = self.poll.poll(&mut events, Some(Duration::from_millis(10)));
            for &token in &tokens {
                self.flush(token);
            }
        }
        for token in tokens {
            self.close(token, if reason == ProtocolError::NotLeader { "no longer the leader".into() } else { "the journal failed".into() });
        }
    }

    /// Logs out the sessions of `accounts`, whose keys a configuration
    /// reload changed or took away (Logout, reason `bad_credentials`).
    fn revoke(&mut self, accounts: &[AccountId]) {
        let tokens: Vec<Token> = self.conns.iter().filter(|(_, c)| c.account.is_some_and(|a| accounts.contains(&a)) && c.closing.is_none()).map(|(t, _)| *t).collect();
        for token in tokens {
            if let Some(conn) = self.conns.get_mut(&token) {
                conn.queue(&ServerMessage::Logout { reason: ProtocolError::BadCredentials.code() });
                conn.close_after("the account's key was changed or removed by a configuration reload".into());
            }
            self.flush(token);
        }
    }

    fn begin_shutdown(&mut self) {
        self.stopping = true;
        log("shutting down: no new connections; draining");
        let _ = self.poll.registry().deregister(&mut self.listener);
        let tokens: Vec<Token> = self.conns.keys().copied().collect();
        for token in tokens {
            if let Some(conn) = self.conns.get_mut(&token) {
                if conn.account.is_some() && (conn.logging_out || unanswered(conn)) {
                    // Its answers first (they are being drained), then its
                    // Logout: its own, or the server's once they are out.
                    conn.logout_when_answered = !conn.logging_out;
                    continue;
                }
                // A session is logged out; a connection not logged in yet
                // is told the server is busy (docs/protocol.md).
                conn.queue(&if conn.account.is_some() { ServerMessage::Logout { reason: 0 } } else { ServerMessage::Error { reason: ProtocolError::ServerBusy } });
                conn.close_after("server shutting down".into());
            }
            self.flush(token);
        }
    }
}

/// Decodes every whole frame in `conn.inbuf` and handles it; stops at
/// the first that closes the connection, or at a login that conflicts
/// with a registered session (left in the buffer, to be decoded again).
fn decode_all(conn: &mut Conn, config: &Config, keys: &Keys, sessions: &mut Sessions, commands: &mut Vec<Inbound>, node: &NodeState) -> Result<(), Stop> {
    let max_frame = config.limits.max_frame;
    let mut used = 0;
    let result = loop {
        match decode_client(&conn.inbuf[used..], max_frame) {
            Ok(Decoded::NeedMore) => break Ok(()),
            Ok(Decoded::Message(message, size)) => match handle(message, conn, config, keys, sessions, commands, node) {
                Ok(()) if conn.logging_out => {
                    // What comes after a Logout is not read.
                    used = conn.inbuf.len();
                    break Ok(());
                }
                Ok(()) => used += size,
                Err(Stop::Close(reason)) => {
                    used += size;
                    break Err(Stop::Close(reason));
                }
                Err(conflict) => break Err(conflict),
            },
            Err(reason) => {
                conn.queue(&ServerMessage::Error { reason });
                break Err(Stop::Close(format!("protocol error: {reason}")));
            }
        }
    };
    conn.inbuf.drain(..used);
    result
}

/// A follower's answer to an order message: refused (`not_leader`, not
/// numbered, never journaled), and where the leader is.
fn not_leader(message: &ClientMessage, conn: &mut Conn, node: &NodeState) {
    let mut report = ExecutionReport::unnumbered_refusal(crossbook_protocol::reports::NOT_LEADER);
    match *message {
        ClientMessage::NewOrder(o) => {
            (report.cid, report.instrument, report.side, report.price) = (o.cid, o.instrument, o.side, o.price);
        }
        ClientMessage::Cancel { order } | ClientMessage::Replace { order, .. } => report.order = order,
        ClientMessage::CancelAll { instrument } => report.instrument = instrument.unwrap_or(0),
        _ => {}
    }
    conn.queue(&ServerMessage::ExecutionReport(report));
    conn.queue(&ServerMessage::Redirect { leader: redirect_field(&node.leader_binary().unwrap_or_default()) });
}

/// Whether something `conn` sent is still unanswered: in flight, or
/// queued this round.
fn unanswered(conn: &Conn) -> bool {
    conn.in_flight.count() > 0 || conn.queued > 0
}

/// Hands the sequencer one of `conn`'s requests (counted against its
/// in-flight limit once the round's bytes are decoded).
fn queue_for_sequencer(conn: &mut Conn, commands: &mut Vec<Inbound>, request: Request) {
    commands.push(Inbound { request, annex: None, source: BINARY, in_flight: conn.in_flight.clone() });
    conn.queued += 1;
}

fn handle(message: ClientMessage, conn: &mut Conn, config: &Config, keys: &Keys, sessions: &mut Sessions, commands: &mut Vec<Inbound>, node: &NodeState) -> Result<(), Stop> {
    let id = conn.id;
    let close = |reason: &str| Err(Stop::Close(reason.to_string()));
    match (message, conn.account) {
        (ClientMessage::Login { account: claimed, api_key, last_seen }, None) => {
            let known = keys.wire_key(claimed).is_some_and(|key| keys_match(&key, &api_key));
            if !known {
                conn.queue(&ServerMessage::LoginRejected { reason: ProtocolError::BadCredentials });
                return close(&format!("login refused for account {claimed}: bad credentials"));
            }
            if let Some(session) = sessions.by_account.get(&claimed) {
                if conn.probed != Some(session.connection) {
                    return Err(Stop::Conflict(session.connection));
                }
                conn.queue(&ServerMessage::LoginRejected { reason: ProtocolError::AlreadyLoggedIn });
                return close(&format!("login refused for account {claimed}: already logged in"));
            }
            if sessions.by_account.len() >= config.limits.max_connections {
                conn.queue(&ServerMessage::LoginRejected { reason: ProtocolError::ServerBusy });
                return close(&format!("login refused for account {claimed}: {} sessions already (limits.max_connections)", config.limits.max_connections));
            }
            let history_end = sessions.histories.get(&claimed).map_or(0, |h| h.last);
            if node.replicated && last_seen != u64::MAX && last_seen > history_end {
                // This node has not released the reports the client saw
                // yet (a follower behind the log, a new leader catching
                // up): a LoginAccepted would tell it they were taken back.
                conn.queue(&ServerMessage::LoginRejected { reason: ProtocolError::ServerBusy });
                return close(&format!("login refused for account {claimed}: it saw reports up to {last_seen}, this node has released them up to {history_end} so far (try again, or the leader)"));
            }
            sessions.by_account.insert(claimed, Session { connection: id });
            sessions.count();
            // The sequencer runs on this thread: no report can be handed
            // out between the replay and the acceptance, and anything
            // handed out later is queued after them.
            let history = sessions.histories.get(&claimed);
            let next_seq = history_end + 1;
            conn.queue(&ServerMessage::LoginAccepted { seq: 0, account: claimed, next_seq });
            if last_seen != u64::MAX && last_seen >= next_seq {
                // Only an async-mode power cut does this (docs/protocol.md):
                // the client saw reports of commands the journal lost.
                log(&format!(
                    "account {claimed} saw reports up to {last_seen} but the history ends at {}: reports {next_seq}..={last_seen} were taken back with their commands",
                    next_seq - 1
                ));
            }
            let mut replayed = 0;
            if let Some(history) = history {
                // Numbers run without gaps: those past `last_seen` are the
                // newest `last - last_seen` kept.
                let wanted = history.last.saturating_sub(last_seen).min(history.reports.len() as u64) as usize;
                for report in history.reports.range(history.reports.len() - wanted..) {
                    encode_server(&ServerMessage::ExecutionReport(*report), &mut conn.outbuf);
                    replayed += 1;
                }
                if let Some(oldest) = history.reports.front().map(|r| r.seq)
                    && last_seen.saturating_add(1) < oldest
                {
                    log(&format!("account {claimed} asked for reports from {} but only {oldest}.. are kept", last_seen + 1));
                }
            }
            conn.account = Some(claimed);
            conn.cancel_on_disconnect = keys.cancels_on_disconnect(claimed);
            if !node.accepting.load(Ordering::Acquire) {
                // A follower: the session replays and hears its reports,
                // and learns where orders go.
                conn.queue(&ServerMessage::Redirect { leader: redirect_field(&node.leader_binary().unwrap_or_default()) });
            }
            log(&format!("login connection={id} account={claimed} replayed={replayed}"));
            Ok(())
        }
        (ClientMessage::Login { .. }, Some(_)) => {
            conn.queue(&ServerMessage::Error { reason: ProtocolError::AlreadyLoggedIn });
            close("second login on one connection")
        }
        (_, None) => {
            conn.queue(&ServerMessage::Error { reason: ProtocolError::NotLoggedIn });
            close("message before login")
        }
        // Answered at once when nothing the connection sent before is
        // unanswered; otherwise in its place, after those answers (the
        // sequencer answers it as a query).
        (ClientMessage::Heartbeat, Some(who)) => {
            if unanswered(conn) {
                let query = Query { account: who, kind: QueryKind::Heartbeat, token: id, request: 0 };
                queue_for_sequencer(conn, commands, Request::Query(query));
            } else {
                conn.queue(&ServerMessage::Heartbeat);
            }
            Ok(())
        }
        (ClientMessage::Logout, Some(who)) => {
            log(&format!("logout connection={id} account={who}"));
            if unanswered(conn) {
                let query = Query { account: who, kind: QueryKind::Logout, token: id, request: 0 };
                queue_for_sequencer(conn, commands, Request::Query(query));
                conn.logging_out = true;
                return Ok(());
            }
            conn.queue(&ServerMessage::Logout { reason: 0 });
            close("logout")
        }
        (ClientMessage::QueryBalances { request }, Some(who)) => {
            let query = Query { account: who, kind: QueryKind::Balances, token: id, request };
            queue_for_sequencer(conn, commands, Request::Query(query));
            Ok(())
        }
        (ClientMessage::QueryOpenOrders { request, instrument }, Some(who)) => {
            let query = Query { account: who, kind: QueryKind::OpenOrders { instrument }, token: id, request };
            queue_for_sequencer(conn, commands, Request::Query(query));
            Ok(())
        }
        (message, Some(_)) if message.to_command(0).is_some() && !node.accepting.load(Ordering::Acquire) => {
            not_leader(&message, conn, node);
            Ok(())
        }
        (message, Some(who)) => {
            if let Some(command) = message.to_command(who) {
                queue_for_sequencer(conn, commands, Request::Command(command));
            }
            Ok(())
        }
    }
}
