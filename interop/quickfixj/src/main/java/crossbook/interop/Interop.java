package crossbook.interop;

import java.io.InputStream;
import java.io.OutputStream;
import java.math.BigDecimal;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;

import quickfix.Application;
import quickfix.CompositeLogFactory;
import quickfix.DataDictionary;
import quickfix.DefaultMessageFactory;
import quickfix.FieldNotFound;
import quickfix.FileLogFactory;
import quickfix.FileStoreFactory;
import quickfix.Log;
import quickfix.LogFactory;
import quickfix.Message;
import quickfix.Session;
import quickfix.SessionID;
import quickfix.SessionSettings;
import quickfix.SocketInitiator;
import quickfix.ValidationSettings;
import quickfix.field.ClOrdID;
import quickfix.field.MassCancelRequestType;
import quickfix.field.MsgSeqNum;
import quickfix.field.MsgType;
import quickfix.field.OrdType;
import quickfix.field.OrderQty;
import quickfix.field.OrigClOrdID;
import quickfix.field.Password;
import quickfix.field.Price;
import quickfix.field.Side;
import quickfix.field.Symbol;
import quickfix.field.TimeInForce;
import quickfix.field.TransactTime;
import quickfix.field.Username;

/**
 * QuickFIX/J 3.0.0 as the FIX 4.4 client of {@code crossbook serve}: two
 * initiators (ALICE = account 1, BOB = account 2) against the venue's demo
 * configuration. Phase 1 trades, replaces, cancels and is refused; phase 2
 * (after the server restarted on the same data directory) logs on again
 * with the same FileStore and checks the sequence numbers continue.
 *
 * <pre>
 *   java -jar crossbook-interop.jar --phase 1|2 --fix HOST:PORT --store DIR [--wait SECONDS] [--verbose]
 * </pre>
 *
 * Every check is counted; the last line is {@code phase P: N passed, M failed}
 * and the exit status is 0 only if nothing failed.
 */
public final class Interop {
    static final String SYMBOL = "BTC-USD";
    static final String TARGET = "CROSSBOOK";
    static final String STATE_FILE = "interop-phase1.properties";

    // ------------------------------------------------------------------
    // Results
    // ------------------------------------------------------------------

    static int passed;
    static int failed;
    static int stepPassed;
    static int stepFailed;
    static boolean verbose;

    static String show(String raw) {
        return raw == null ? "(none)" : raw.replace('\001', '|');
    }

    static String raw(Message m) {
        if (m == null) {
            return null;
        }
        String raw = m.toRawString();
        return raw != null ? raw : m.toString();
    }

    static void check(boolean ok, String what, String detail, String rawMessage) {
        if (ok) {
            passed++;
            stepPassed++;
            if (verbose) {
                System.out.println("  ok   " + what);
            }
        } else {
            failed++;
            stepFailed++;
            System.out.println("  FAIL " + what + (detail == null ? "" : ": " + detail));
            if (rawMessage != null) {
                System.out.println("       message: " + show(rawMessage));
            }
        }
        System.out.flush();
    }

    static void note(String text) {
        System.out.println("  note " + text);
        System.out.flush();
    }

    static void step(String name) {
        stepPassed = 0;
        stepFailed = 0;
        System.out.println(name);
        System.out.flush();
    }

    static void endStep() {
        System.out.println("  -> " + stepPassed + " passed, " + stepFailed + " failed");
        System.out.flush();
    }

    // ------------------------------------------------------------------
    // One counterparty: a QuickFIX/J session and what it saw
    // ------------------------------------------------------------------

    static final class Party {
        final String name;
        final String username;
        final String password;
        final int account;
        SessionID id;
        final LinkedBlockingQueue<Message> app = new LinkedBlockingQueue<>();
        final List<String> incoming = Collections.synchronizedList(new ArrayList<>());
        final List<String> outgoing = Collections.synchronizedList(new ArrayList<>());
        final List<String> events = Collections.synchronizedList(new ArrayList<>());
        /** QuickFIX/J error events, rejects in either direction: each a failure. */
        final List<String> problems = Collections.synchronizedList(new ArrayList<>());
        volatile boolean loggedOn;
        volatile boolean loggedOut;
        volatile String serverLogon;
        volatile String serverLogout;

        Party(String name, int account, String password) {
            this.name = name;
            this.account = account;
            this.username = Integer.toString(account);
            this.password = password;
        }

        Session session() {
            return Session.lookupSession(id);
        }
    }

    static final Party ALICE = new Party("ALICE", 1, "demo-key-1");
    static final Party BOB = new Party("BOB", 2, "demo-key-2");
    static final Map<String, Party> PARTIES = new HashMap<>();

    static {
        PARTIES.put(ALICE.name, ALICE);
        PARTIES.put(BOB.name, BOB);
    }

    static Party party(SessionID id) {
        return PARTIES.get(id.getSenderCompID());
    }

    static String type(Message m) {
        try {
            return m.getHeader().getString(MsgType.FIELD);
        } catch (FieldNotFound e) {
            return "?";
        }
    }

    static String rawField(String raw, int tag) {
        String key = "\001" + tag + "=";
        String s = "\001" + raw;
        int at = s.indexOf(key);
        if (at < 0) {
            return null;
        }
        int start = at + key.length();
        int end = s.indexOf('\001', start);
        return end < 0 ? s.substring(start) : s.substring(start, end);
    }

    /** The application: credentials on the Logon, everything else recorded. */
    static final class App implements Application {
        @Override
        public void onCreate(SessionID id) {
        }

        @Override
        public void onLogon(SessionID id) {
            party(id).loggedOn = true;
        }

        @Override
        public void onLogout(SessionID id) {
            Party p = party(id);
            if (p.loggedOn) {
                p.loggedOut = true;
            }
        }

        @Override
        public void toAdmin(Message m, SessionID id) {
            Party p = party(id);
            String t = type(m);
            if (MsgType.LOGON.equals(t)) {
                m.setString(Username.FIELD, p.username);
                m.setString(Password.FIELD, p.password);
            } else if (MsgType.REJECT.equals(t)) {
                p.problems.add("QuickFIX/J rejected a message from the server (the Reject it sent: " + show(m.toString()) + ")");
            }
        }

        @Override
        public void fromAdmin(Message m, SessionID id) {
            Party p = party(id);
            String t = type(m);
            if (MsgType.LOGON.equals(t)) {
                p.serverLogon = raw(m);
            } else if (MsgType.LOGOUT.equals(t)) {
                p.serverLogout = raw(m);
            } else if (MsgType.REJECT.equals(t)) {
                p.problems.add("the server rejected one of our messages: " + show(raw(m)));
            }
        }

        @Override
        public void toApp(Message m, SessionID id) {
        }

        @Override
        public void fromApp(Message m, SessionID id) {
            party(id).app.add(m);
        }
    }

    /** Keeps every raw message and event in memory (beside QuickFIX/J's own file log). */
    static final class CaptureLog implements Log {
        final Party p;

        CaptureLog(Party p) {
            this.p = p;
        }

        @Override
        public void clear() {
        }

        @Override
        public void onIncoming(String message) {
            p.incoming.add(message);
        }

        @Override
        public void onOutgoing(String message) {
            p.outgoing.add(message);
        }

        @Override
        public void onEvent(String text) {
            p.events.add(text);
        }

        @Override
        public void onErrorEvent(String text) {
            p.events.add("ERROR " + text);
            p.problems.add("QuickFIX/J error event: " + text);
        }

        @Override
        public void onWarnEvent(String text) {
            p.events.add("WARN " + text);
        }
    }

    // ------------------------------------------------------------------
    // Checking messages
    // ------------------------------------------------------------------

    static final Map<Integer, String> NAMES = new HashMap<>();
    static final Set<Integer> DECIMAL = Set.of(6, 12, 14, 31, 32, 38, 44, 151);

    static {
        Object[][] names = {
            {1, "Account"}, {6, "AvgPx"}, {11, "ClOrdID"}, {12, "Commission"}, {13, "CommType"}, {14, "CumQty"},
            {17, "ExecID"}, {31, "LastPx"}, {32, "LastQty"}, {35, "MsgType"}, {37, "OrderID"}, {38, "OrderQty"},
            {39, "OrdStatus"}, {40, "OrdType"}, {41, "OrigClOrdID"}, {44, "Price"}, {54, "Side"}, {55, "Symbol"},
            {58, "Text"}, {59, "TimeInForce"}, {60, "TransactTime"}, {102, "CxlRejReason"}, {150, "ExecType"},
            {151, "LeavesQty"}, {434, "CxlRejResponseTo"}, {530, "MassCancelRequestType"},
            {531, "MassCancelResponse"}, {533, "TotalAffectedOrders"}, {34, "MsgSeqNum"}, {108, "HeartBtInt"},
            {98, "EncryptMethod"},
        };
        for (Object[] n : names) {
            NAMES.put((Integer) n[0], (String) n[1]);
        }
    }

    static String tagName(int tag) {
        String n = NAMES.get(tag);
        return n == null ? Integer.toString(tag) : n + "(" + tag + ")";
    }

    static String get(Message m, int tag) {
        try {
            if (m.isSetField(tag)) {
                return m.getString(tag);
            }
            if (m.getHeader().isSetField(tag)) {
                return m.getHeader().getString(tag);
            }
        } catch (FieldNotFound e) {
            return null;
        }
        return null;
    }

    static boolean same(int tag, String want, String got) {
        if (want == null || got == null) {
            return want == got;
        }
        if (DECIMAL.contains(tag)) {
            try {
                return new BigDecimal(want).compareTo(new BigDecimal(got)) == 0;
            } catch (NumberFormatException e) {
                return false;
            }
        }
        return want.equals(got);
    }

    /** want == null: the field must be absent. */
    static void expect(String ctx, Message m, int tag, String want) {
        String got = get(m, tag);
        check(same(tag, want, got), ctx + " " + tagName(tag) + (want == null ? " absent" : "=" + want),
            "got " + (got == null ? "no such field" : tagName(tag) + "=" + got), raw(m));
    }

    static void expectPresent(String ctx, Message m, int tag) {
        String got = get(m, tag);
        check(got != null && !got.isEmpty(), ctx + " " + tagName(tag) + " present", "missing", raw(m));
    }

    /** What an ExecutionReport must say. Null fields: must be absent (unless noted). */
    static final class ER {
        String execType;
        String ordStatus;
        String clOrdId;
        String origClOrdId;
        String side;
        String orderQty;
        String price;
        String cumQty;
        String leavesQty;
        String avgPx;
        String lastPx;
        String lastQty;
        String commission;
        String commType;
        /** Expected OrderID; null: only present. */
        String orderId;
        /** Text must contain this; null: not checked. */
        String textContains;
        int account;
        boolean rejected;

        static ER of(String execType, String ordStatus, String clOrdId, String side, String orderQty, String price) {
            ER e = new ER();
            e.execType = execType;
            e.ordStatus = ordStatus;
            e.clOrdId = clOrdId;
            e.side = side;
            e.orderQty = orderQty;
            e.price = price;
            return e;
        }

        ER qty(String cum, String leaves, String avg) {
            cumQty = cum;
            leavesQty = leaves;
            avgPx = avg;
            return this;
        }

        ER fill(String px, String q) {
            lastPx = px;
            lastQty = q;
            return this;
        }

        ER orig(String o) {
            origClOrdId = o;
            return this;
        }

        ER commission(String c, String t) {
            commission = c;
            commType = t;
            return this;
        }

        ER order(String id) {
            orderId = id;
            return this;
        }

        ER text(String t) {
            textContains = t;
            return this;
        }

        ER account(int a) {
            account = a;
            return this;
        }
    }

    /** Every ExecID received, both sessions, this run (phase 2: phase 1's are loaded). */
    static final Set<String> EXEC_IDS = new LinkedHashSet<>();
    static final Set<String> PHASE1_EXEC_IDS = new LinkedHashSet<>();
    static final Set<String> ORDER_IDS = new LinkedHashSet<>();
    static final Set<String> PHASE1_ORDER_IDS = new LinkedHashSet<>();

    /** Checks every field of an ExecutionReport; returns its OrderID. */
    static String checkER(String ctx, Message m, ER e) {
        check("8".equals(type(m)), ctx + " is an ExecutionReport (35=8)", "got 35=" + type(m), raw(m));
        expect(ctx, m, 150, e.execType);
        expect(ctx, m, 39, e.ordStatus);
        expect(ctx, m, 11, e.clOrdId);
        expect(ctx, m, 41, e.origClOrdId);
        expect(ctx, m, 55, SYMBOL);
        expect(ctx, m, 54, e.side);
        expect(ctx, m, 14, e.cumQty);
        expect(ctx, m, 151, e.leavesQty);
        expect(ctx, m, 6, e.avgPx);
        expect(ctx, m, 31, e.lastPx);
        expect(ctx, m, 32, e.lastQty);
        expect(ctx, m, 12, e.commission);
        expect(ctx, m, 13, e.commType);
        expect(ctx, m, 1, Integer.toString(e.account));
        if (e.rejected) {
            // FIX 4.4 does not require a rejection to echo the order's
            // OrderQty, Price, OrdType, TimeInForce: if there, they must match.
            for (int[] t : new int[][] {{38}, {44}, {40}, {59}}) {
                int tag = t[0];
                String want = tag == 38 ? e.orderQty : tag == 44 ? e.price : tag == 40 ? "2" : "1";
                String got = get(m, tag);
                if (got == null) {
                    note(ctx + ": " + tagName(tag) + " not echoed on the rejection (FIX 4.4 does not require it)");
                } else {
                    expect(ctx, m, tag, want);
                }
            }
        } else {
            expect(ctx, m, 38, e.orderQty);
            expect(ctx, m, 44, e.price);
            expect(ctx, m, 40, "2");
            expect(ctx, m, 59, "1");
        }
        expectPresent(ctx, m, 60);
        if (e.textContains != null) {
            String text = get(m, 58);
            check(text != null && text.contains(e.textContains), ctx + " Text(58) contains \"" + e.textContains + "\"",
                "got " + (text == null ? "no Text" : "Text(58)=" + text), raw(m));
        }
        String execId = get(m, 17);
        check(execId != null && !execId.isEmpty(), ctx + " ExecID(17) present", "missing", raw(m));
        if (execId != null) {
            check(EXEC_IDS.add(execId), ctx + " ExecID(17)=" + execId + " unique", "already seen in an earlier report", raw(m));
        }
        String orderId = get(m, 37);
        check(orderId != null && !orderId.isEmpty(), ctx + " OrderID(37) present", "missing", raw(m));
        if (e.orderId != null) {
            expect(ctx, m, 37, e.orderId);
        }
        if (orderId != null && !e.rejected) {
            ORDER_IDS.add(orderId);
        }
        return orderId;
    }

    // ------------------------------------------------------------------
    // Waiting
    // ------------------------------------------------------------------

    static long waitMillis = 10_000;

    static boolean waitUntil(BooleanSupplier condition, long millis) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(millis);
        while (!condition.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                return false;
            }
            Thread.sleep(10);
        }
        return true;
    }

    /** The next application message to p, or a failed check (and null) after the wait. */
    static Message next(Party p, String what) throws InterruptedException {
        Message m = p.app.poll(waitMillis, TimeUnit.MILLISECONDS);
        check(m != null, p.name + " receives " + what, "nothing within " + waitMillis + " ms", null);
        if (m == null) {
            dumpRecent(p);
        }
        return m;
    }

    static void dumpRecent(Party p) {
        synchronized (p.incoming) {
            int from = Math.max(0, p.incoming.size() - 5);
            for (String s : p.incoming.subList(from, p.incoming.size())) {
                System.out.println("       " + p.name + " last received: " + show(s));
            }
        }
        synchronized (p.problems) {
            for (String s : p.problems) {
                System.out.println("       " + p.name + ": " + s);
            }
        }
    }

    /** Nothing more arrives for p (a short quiet period). */
    static void nothingMore(Party p, String ctx) throws InterruptedException {
        Message m = p.app.poll(300, TimeUnit.MILLISECONDS);
        check(m == null, ctx + ": no further message to " + p.name, "unexpected message", raw(m));
        while (m != null) {
            m = p.app.poll(100, TimeUnit.MILLISECONDS);
            if (m != null) {
                check(false, ctx + ": no further message to " + p.name, "unexpected message", raw(m));
            }
        }
    }

    static void send(Party p, Message m) {
        boolean sent;
        try {
            sent = Session.sendToTarget(m, p.id);
        } catch (Exception e) {
            check(false, p.name + " sends " + type(m), e.toString(), m.toString());
            return;
        }
        check(sent, p.name + " sends " + type(m), "Session.sendToTarget returned false", m.toString());
    }

    // ------------------------------------------------------------------
    // Messages we send
    // ------------------------------------------------------------------

    static TransactTime now() {
        return new TransactTime();
    }

    static Message newOrder(String clOrdId, char side, String price, String qty) {
        quickfix.fix44.NewOrderSingle m = new quickfix.fix44.NewOrderSingle(new ClOrdID(clOrdId), new Side(side), now(), new OrdType(OrdType.LIMIT));
        m.set(new Symbol(SYMBOL));
        m.setString(Price.FIELD, price);
        m.setString(OrderQty.FIELD, qty);
        m.set(new TimeInForce(TimeInForce.GOOD_TILL_CANCEL));
        return m;
    }

    static Message replace(String clOrdId, String orig, char side, String price, String qty) {
        quickfix.fix44.OrderCancelReplaceRequest m = new quickfix.fix44.OrderCancelReplaceRequest(
            new OrigClOrdID(orig), new ClOrdID(clOrdId), new Side(side), now(), new OrdType(OrdType.LIMIT));
        m.set(new Symbol(SYMBOL));
        m.setString(Price.FIELD, price);
        m.setString(OrderQty.FIELD, qty);
        m.set(new TimeInForce(TimeInForce.GOOD_TILL_CANCEL));
        return m;
    }

    static Message cancel(String clOrdId, String orig, char side, String qty) {
        quickfix.fix44.OrderCancelRequest m = new quickfix.fix44.OrderCancelRequest(new OrigClOrdID(orig), new ClOrdID(clOrdId), new Side(side), now());
        m.set(new Symbol(SYMBOL));
        m.setString(OrderQty.FIELD, qty);
        return m;
    }

    static Message massCancel(String clOrdId) {
        return new quickfix.fix44.OrderMassCancelRequest(new ClOrdID(clOrdId),
            new MassCancelRequestType(MassCancelRequestType.CANCEL_ALL_ORDERS), now());
    }

    // ------------------------------------------------------------------
    // A strict second opinion on every application message received
    // ------------------------------------------------------------------

    static DataDictionary strictDictionary;
    static ValidationSettings strictSettings;
    static final List<String> STRICT_NOTES = new ArrayList<>();

    /**
     * Validates a received message against FIX44.xml with QuickFIX/J's
     * default, strict settings (AllowUnknownMsgFields=N,
     * ValidateUserDefinedFields=Y). The sessions run with the lenient
     * settings the brief asked for; this only reports what the strict ones
     * would refuse.
     */
    static void strictOpinion(Party p, Message received) {
        String raw = raw(received);
        try {
            if (strictDictionary == null) {
                strictDictionary = new DataDictionary("FIX44.xml");
                strictSettings = new ValidationSettings();
            }
            Message m = new Message(raw, strictDictionary, strictSettings, true);
            strictDictionary.validate(m, strictSettings);
        } catch (Exception e) {
            String line = "strict FIX44.xml validation (AllowUnknownMsgFields=N, ValidateUserDefinedFields=Y) of a message to "
                + p.name + " fails: " + e + " in " + show(raw);
            STRICT_NOTES.add(line);
            note(line);
        }
    }

    static Message nextChecked(Party p, String what) throws InterruptedException {
        Message m = next(p, what);
        if (m != null) {
            strictOpinion(p, m);
        }
        return m;
    }

    // ------------------------------------------------------------------
    // Sessions
    // ------------------------------------------------------------------

    static SocketInitiator initiator;

    static SessionSettings settings(String host, int port, Path store) throws Exception {
        StringBuilder s = new StringBuilder();
        s.append("[DEFAULT]\n")
            .append("ConnectionType=initiator\n")
            .append("BeginString=FIX.4.4\n")
            .append("TargetCompID=").append(TARGET).append('\n')
            .append("SocketConnectHost=").append(host).append('\n')
            .append("SocketConnectPort=").append(port).append('\n')
            .append("HeartBtInt=30\n")
            .append("ReconnectInterval=1\n")
            .append("LogonTimeout=10\n")
            .append("LogoutTimeout=5\n")
            .append("NonStopSession=Y\n")
            .append("ResetOnLogon=N\n")
            .append("ResetOnLogout=N\n")
            .append("ResetOnDisconnect=N\n")
            .append("UseDataDictionary=Y\n")
            .append("DataDictionary=FIX44.xml\n")
            .append("ValidateUserDefinedFields=N\n")
            .append("AllowUnknownMsgFields=Y\n")
            .append("ValidateIncomingMessage=Y\n")
            .append("CheckLatency=Y\n")
            .append("MaxLatency=120\n")
            .append("TimeStampPrecision=MILLIS\n")
            .append("FileStorePath=").append(store.toAbsolutePath()).append('\n')
            .append("FileStoreSync=Y\n")
            .append("FileLogPath=").append(store.resolve("log").toAbsolutePath()).append('\n')
            .append("FileLogHeartbeats=Y\n")
            .append("FileIncludeMilliseconds=Y\n")
            .append("FileIncludeTimeStampForMessages=Y\n");
        for (Party p : List.of(ALICE, BOB)) {
            s.append("\n[SESSION]\nSenderCompID=").append(p.name).append('\n');
        }
        return new SessionSettings(new java.io.ByteArrayInputStream(s.toString().getBytes(java.nio.charset.StandardCharsets.UTF_8)));
    }

    static void start(String host, int port, Path store) throws Exception {
        SessionSettings settings = settings(host, port, store);
        for (Party p : List.of(ALICE, BOB)) {
            p.id = new SessionID("FIX.4.4", p.name, TARGET);
        }
        LogFactory capture = id -> new CaptureLog(party(id));
        LogFactory logs = new CompositeLogFactory(new LogFactory[] {new FileLogFactory(settings), capture});
        initiator = new SocketInitiator(new App(), new FileStoreFactory(settings), settings, logs, new DefaultMessageFactory());
        initiator.start();
    }

    static boolean logOn(int phase) throws InterruptedException {
        boolean both = waitUntil(() -> ALICE.loggedOn && BOB.loggedOn, Math.max(waitMillis, 20_000));
        for (Party p : List.of(ALICE, BOB)) {
            check(p.loggedOn, p.name + " logs on (phase " + phase + ")", "no Logon answer; session events: " + p.events, p.serverLogout);
            if (!p.loggedOn) {
                dumpRecent(p);
            }
        }
        return both;
    }

    /** Our Logon as sent (raw), or null. */
    static String ourLogon(Party p) {
        synchronized (p.outgoing) {
            for (String s : p.outgoing) {
                if ("A".equals(rawField(s, 35))) {
                    return s;
                }
            }
        }
        return null;
    }

    static void checkLogons(int phase, Properties expected) {
        for (Party p : List.of(ALICE, BOB)) {
            String ours = ourLogon(p);
            String theirs = p.serverLogon;
            String ctx = p.name + " Logon";
            check(ours != null && p.username.equals(rawField(ours, 553)) && p.password.equals(rawField(ours, 554)),
                ctx + " we sent carries Username(553)=" + p.username + " Password(554)=" + p.password, "not so", ours);
            check(ours != null && "30".equals(rawField(ours, 108)) && rawField(ours, 141) == null,
                ctx + " we sent has HeartBtInt(108)=30 and no ResetSeqNumFlag(141)", "not so", ours);
            String wantOurs = phase == 1 ? "1" : expected.getProperty(p.name + ".nextSender");
            String wantTheirs = phase == 1 ? "1" : expected.getProperty(p.name + ".nextTarget");
            check(ours != null && wantOurs != null && wantOurs.equals(rawField(ours, 34)),
                ctx + " we sent has MsgSeqNum(34)=" + wantOurs + (phase == 2 ? " (phase 1's next sender seq)" : ""),
                "got " + (ours == null ? "no Logon" : rawField(ours, 34)), ours);
            check(theirs != null && wantTheirs != null && wantTheirs.equals(rawField(theirs, 34)),
                ctx + " answer from the server has MsgSeqNum(34)=" + wantTheirs + (phase == 2 ? " (phase 1's next target seq)" : ""),
                "got " + (theirs == null ? "no Logon" : rawField(theirs, 34)), theirs);
            check(theirs != null && "30".equals(rawField(theirs, 108)) && "0".equals(rawField(theirs, 98)),
                ctx + " answer has HeartBtInt(108)=30 EncryptMethod(98)=0", "not so", theirs);
            check(theirs != null && rawField(theirs, 141) == null, ctx + " answer has no ResetSeqNumFlag(141)", "it has", theirs);
        }
    }

    /** No ResendRequest, SequenceReset, PossDup or Reject in either direction. */
    static void checkQuietSession(String ctx) {
        for (Party p : List.of(ALICE, BOB)) {
            List<String> odd = new ArrayList<>();
            synchronized (p.incoming) {
                for (String s : p.incoming) {
                    String t = rawField(s, 35);
                    if ("2".equals(t) || "4".equals(t) || "3".equals(t) || "j".equals(t) || "Y".equals(rawField(s, 43))) {
                        odd.add("received " + show(s));
                    }
                }
            }
            synchronized (p.outgoing) {
                for (String s : p.outgoing) {
                    String t = rawField(s, 35);
                    if ("2".equals(t) || "4".equals(t) || "3".equals(t) || "j".equals(t) || "Y".equals(rawField(s, 43))) {
                        odd.add("sent " + show(s));
                    }
                }
            }
            check(odd.isEmpty(), ctx + ": " + p.name + " no ResendRequest/SequenceReset/Reject/BusinessMessageReject/PossDup either way",
                String.join("\n       ", odd), null);
            List<String> problems;
            synchronized (p.problems) {
                problems = new ArrayList<>(p.problems);
            }
            check(problems.isEmpty(), ctx + ": " + p.name + " no QuickFIX/J error or reject", String.join("\n       ", problems), null);
        }
    }

    static void logOut(Properties out) throws Exception {
        for (Party p : List.of(ALICE, BOB)) {
            Session s = p.session();
            if (s == null) {
                check(false, p.name + " session exists", "Session.lookupSession returned null", null);
                continue;
            }
            s.logout("interop test done");
        }
        waitUntil(() -> ALICE.loggedOut && BOB.loggedOut, waitMillis);
        for (Party p : List.of(ALICE, BOB)) {
            Session s = p.session();
            check(p.loggedOut && s != null && !s.isLoggedOn(), p.name + " logs out", "still logged on after " + waitMillis + " ms", null);
            check(p.serverLogout != null, p.name + " Logout answered by the server (35=5)", "no Logout received; events: " + p.events, null);
            if (s != null) {
                int sender = s.getStore().getNextSenderMsgSeqNum();
                int target = s.getStore().getNextTargetMsgSeqNum();
                System.out.println("  " + p.name + ": next sender seq " + sender + ", next target seq " + target);
                out.setProperty(p.name + ".nextSender", Integer.toString(sender));
                out.setProperty(p.name + ".nextTarget", Integer.toString(target));
                int sent = p.outgoing.size();
                int received = p.incoming.size();
                out.setProperty(p.name + ".sentThisPhase", Integer.toString(sent));
                out.setProperty(p.name + ".receivedThisPhase", Integer.toString(received));
            }
        }
    }

    static void stop() {
        if (initiator != null) {
            try {
                initiator.stop(true);
            } catch (Exception e) {
                System.out.println("  (stopping the initiator: " + e + ")");
            }
            initiator = null;
        }
    }

    // ------------------------------------------------------------------
    // Phase 1
    // ------------------------------------------------------------------

    static void phase1(String host, int port, Path store) throws Exception {
        step("phase 1: log on (fresh FileStore under " + store + ")");
        start(host, port, store);
        if (!logOn(1)) {
            endStep();
            return;
        }
        checkLogons(1, new Properties());
        endStep();

        step("a. ALICE NewOrderSingle A1 sell 10 @ 100 GTC");
        send(ALICE, newOrder("A1", Side.SELL, "100", "10"));
        Message m = nextChecked(ALICE, "New for A1");
        String a1 = null;
        if (m != null) {
            a1 = checkER("a. A1 New", m, ER.of("0", "0", "A1", "2", "10", "100").qty("0", "10", "0").account(1));
        }
        nothingMore(ALICE, "a");
        endStep();

        step("b. BOB NewOrderSingle B1 buy 4 @ 101 GTC: crosses A1");
        send(BOB, newOrder("B1", Side.BUY, "101", "4"));
        m = nextChecked(BOB, "New for B1");
        String b1 = null;
        if (m != null) {
            b1 = checkER("b. B1 New", m, ER.of("0", "0", "B1", "1", "4", "101").qty("0", "4", "0").account(2));
        }
        m = nextChecked(BOB, "Fill for B1");
        if (m != null) {
            // Taker fee: ceil(100 * 4 * 5 / 10000) = 1 (absolute, quote units).
            checkER("b. B1 Fill", m, ER.of("F", "2", "B1", "1", "4", "101").qty("4", "0", "100").fill("100", "4")
                .commission("1", "3").order(b1).account(2));
        }
        m = nextChecked(ALICE, "PartialFill for A1");
        if (m != null) {
            // Maker fee: ceil(100 * 4 * -1 / 10000) = 0: no Commission.
            checkER("b. A1 PartialFill", m, ER.of("F", "1", "A1", "2", "10", "100").qty("4", "6", "100").fill("100", "4")
                .order(a1).account(1));
        }
        nothingMore(BOB, "b");
        nothingMore(ALICE, "b");
        endStep();

        step("c. ALICE OrderCancelReplaceRequest A2 (was A1): 8 @ 102");
        send(ALICE, replace("A2", "A1", Side.SELL, "102", "8"));
        m = nextChecked(ALICE, "Replaced for A2");
        if (m != null) {
            checkER("c. A2 Replaced", m, ER.of("5", "1", "A2", "2", "8", "102").orig("A1").qty("4", "4", "100").order(a1).account(1));
        }
        nothingMore(ALICE, "c");
        endStep();

        step("d. ALICE OrderCancelRequest A3 (was A2)");
        send(ALICE, cancel("A3", "A2", Side.SELL, "8"));
        m = nextChecked(ALICE, "Canceled for A3");
        if (m != null) {
            checkER("d. A3 Canceled", m, ER.of("4", "4", "A3", "2", "8", "102").orig("A2").qty("4", "0", "100").order(a1).account(1));
        }
        nothingMore(ALICE, "d");
        endStep();

        step("e. BOB B2 buy 1 @ 90, B3 buy 1 @ 91, then OrderMassCancelRequest B4 (all orders)");
        send(BOB, newOrder("B2", Side.BUY, "90", "1"));
        send(BOB, newOrder("B3", Side.BUY, "91", "1"));
        Map<String, String> orderIds = new HashMap<>();
        m = nextChecked(BOB, "New for B2");
        if (m != null) {
            orderIds.put("B2", checkER("e. B2 New", m, ER.of("0", "0", "B2", "1", "1", "90").qty("0", "1", "0").account(2)));
        }
        m = nextChecked(BOB, "New for B3");
        if (m != null) {
            orderIds.put("B3", checkER("e. B3 New", m, ER.of("0", "0", "B3", "1", "1", "91").qty("0", "1", "0").account(2)));
        }
        send(BOB, massCancel("B4"));
        Set<String> cancelled = new LinkedHashSet<>();
        int reports = 0;
        for (int i = 0; i < 3; i++) {
            m = nextChecked(BOB, "mass-cancel result " + (i + 1) + " of 3");
            if (m == null) {
                break;
            }
            String t = type(m);
            if ("r".equals(t)) {
                reports++;
                String ctx = "e. B4 OrderMassCancelReport";
                expect(ctx, m, 11, "B4");
                expect(ctx, m, 530, "7");
                expect(ctx, m, 531, "7");
                expect(ctx, m, 533, "2");
                expectPresent(ctx, m, 37);
            } else {
                String cl = get(m, 11);
                String price = "B2".equals(cl) ? "90" : "91";
                check(("B2".equals(cl) || "B3".equals(cl)) && cancelled.add(cl), "e. mass-cancel ExecutionReport for B2 or B3 (each once)",
                    "got 35=" + t + " ClOrdID(11)=" + cl, raw(m));
                checkER("e. " + cl + " Canceled", m, ER.of("4", "4", cl, "1", "1", price).qty("0", "0", "0")
                    .order(orderIds.get(cl)).account(2));
            }
        }
        check(reports == 1, "e. exactly one OrderMassCancelReport (35=r)", "got " + reports, null);
        check(cancelled.size() == 2, "e. Canceled reports for both B2 and B3", "got " + cancelled, null);
        nothingMore(BOB, "e");
        endStep();

        step("f. BOB OrderCancelRequest B5 for an unknown OrigClOrdID NOPE");
        send(BOB, cancel("B5", "NOPE", Side.BUY, "1"));
        m = nextChecked(BOB, "OrderCancelReject for B5");
        if (m != null) {
            String ctx = "f. B5 OrderCancelReject";
            check("9".equals(type(m)), ctx + " is an OrderCancelReject (35=9)", "got 35=" + type(m), raw(m));
            expect(ctx, m, 11, "B5");
            expect(ctx, m, 41, "NOPE");
            expect(ctx, m, 434, "1");
            expect(ctx, m, 102, "1");
            // FIX 4.4: OrderID is required; "NONE" when CxlRejReason = unknown order.
            expect(ctx, m, 37, "NONE");
            String status = get(m, 39);
            check(status != null && status.matches("[0-9A-E]"), ctx + " OrdStatus(39) present and a FIX 4.4 value", "got " + status, raw(m));
        }
        nothingMore(BOB, "f");
        endStep();

        step("g. ALICE NewOrderSingle A4 sell 1 @ 100.5 (not a whole tick)");
        send(ALICE, newOrder("A4", Side.SELL, "100.5", "1"));
        m = nextChecked(ALICE, "Rejected for A4");
        if (m != null) {
            ER e = ER.of("8", "8", "A4", "2", "1", "100.5").qty("0", "0", "0").text("multiple").account(1);
            e.rejected = true;
            String id = checkER("g. A4 Rejected", m, e);
            String text = get(m, 58);
            System.out.println("  (A4 rejection: OrderID(37)=" + id + " Text(58)=" + text + ")");
        }
        nothingMore(ALICE, "g");
        endStep();

        step("h. both log out");
        Properties state = new Properties();
        logOut(state);
        checkQuietSession("h");
        for (Party p : List.of(ALICE, BOB)) {
            // A fresh store: the next numbers are one more than the messages each way.
            int sent = Integer.parseInt(state.getProperty(p.name + ".sentThisPhase", "-1"));
            int received = Integer.parseInt(state.getProperty(p.name + ".receivedThisPhase", "-1"));
            check(Integer.toString(sent + 1).equals(state.getProperty(p.name + ".nextSender")),
                "h. " + p.name + " next sender seq = messages sent + 1 (" + (sent + 1) + ")", "store says " + state.getProperty(p.name + ".nextSender"), null);
            check(Integer.toString(received + 1).equals(state.getProperty(p.name + ".nextTarget")),
                "h. " + p.name + " next target seq = messages received + 1 (" + (received + 1) + ")", "store says " + state.getProperty(p.name + ".nextTarget"), null);
        }
        state.setProperty("execIds", String.join(",", EXEC_IDS));
        state.setProperty("orderIds", String.join(",", ORDER_IDS));
        try (OutputStream out = Files.newOutputStream(store.resolve(STATE_FILE))) {
            state.store(out, "crossbook interop phase 1: sequence numbers after logout, ExecIDs and OrderIDs seen");
        }
        System.out.println("  wrote " + store.resolve(STATE_FILE));
        endStep();
    }

    // ------------------------------------------------------------------
    // Phase 2
    // ------------------------------------------------------------------

    static void phase2(String host, int port, Path store) throws Exception {
        step("phase 2: log on again with phase 1's FileStore");
        Properties expected = new Properties();
        Path stateFile = store.resolve(STATE_FILE);
        boolean have = Files.isRegularFile(stateFile);
        check(have, "phase 1 state file " + stateFile + " exists", "missing: run phase 1 first", null);
        if (!have) {
            endStep();
            return;
        }
        try (InputStream in = Files.newInputStream(stateFile)) {
            expected.load(in);
        }
        for (String id : expected.getProperty("execIds", "").split(",")) {
            if (!id.isEmpty()) {
                PHASE1_EXEC_IDS.add(id);
                EXEC_IDS.add(id);
            }
        }
        for (String id : expected.getProperty("orderIds", "").split(",")) {
            if (!id.isEmpty()) {
                PHASE1_ORDER_IDS.add(id);
            }
        }
        for (Party p : List.of(ALICE, BOB)) {
            System.out.println("  " + p.name + ": phase 1 ended with next sender seq " + expected.getProperty(p.name + ".nextSender")
                + ", next target seq " + expected.getProperty(p.name + ".nextTarget"));
        }
        start(host, port, store);
        if (!logOn(2)) {
            endStep();
            return;
        }
        checkLogons(2, expected);
        endStep();

        step("phase 2: ALICE NewOrderSingle A5 sell 1 @ 200");
        send(ALICE, newOrder("A5", Side.SELL, "200", "1"));
        Message m = nextChecked(ALICE, "New for A5");
        if (m != null) {
            String execId = get(m, 17);
            String orderId = checkER("A5 New", m, ER.of("0", "0", "A5", "2", "1", "200").qty("0", "1", "0").account(1));
            check(execId != null && !PHASE1_EXEC_IDS.contains(execId), "A5 New ExecID(17)=" + execId + " differs from every phase 1 ExecID",
                "phase 1 had it: " + PHASE1_EXEC_IDS, raw(m));
            check(orderId != null && !PHASE1_ORDER_IDS.contains(orderId), "A5 New OrderID(37)=" + orderId + " is new",
                "phase 1 had it: " + PHASE1_ORDER_IDS, raw(m));
        }
        nothingMore(ALICE, "phase 2");
        nothingMore(BOB, "phase 2");
        endStep();

        step("phase 2: both log out");
        Properties state = new Properties();
        logOut(state);
        checkQuietSession("phase 2");
        for (Party p : List.of(ALICE, BOB)) {
            int sent = Integer.parseInt(state.getProperty(p.name + ".sentThisPhase", "-1"));
            int received = Integer.parseInt(state.getProperty(p.name + ".receivedThisPhase", "-1"));
            int startSender = Integer.parseInt(expected.getProperty(p.name + ".nextSender", "-1000"));
            int startTarget = Integer.parseInt(expected.getProperty(p.name + ".nextTarget", "-1000"));
            check(Integer.toString(startSender + sent).equals(state.getProperty(p.name + ".nextSender")),
                "phase 2: " + p.name + " next sender seq = phase 1's + messages sent (" + (startSender + sent) + ")",
                "store says " + state.getProperty(p.name + ".nextSender"), null);
            check(Integer.toString(startTarget + received).equals(state.getProperty(p.name + ".nextTarget")),
                "phase 2: " + p.name + " next target seq = phase 1's + messages received (" + (startTarget + received) + ")",
                "store says " + state.getProperty(p.name + ".nextTarget"), null);
        }
        try (OutputStream out = Files.newOutputStream(store.resolve("interop-phase2.properties"))) {
            state.store(out, "crossbook interop phase 2: sequence numbers after logout");
        }
        endStep();
    }

    // ------------------------------------------------------------------

    static void usage(String why) {
        System.err.println("interop: " + why);
        System.err.println("usage: java -jar crossbook-interop.jar --phase 1|2 --fix HOST:PORT --store DIR [--wait SECONDS] [--verbose]");
        System.exit(2);
    }

    public static void main(String[] args) {
        System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        System.setProperty("org.slf4j.simpleLogger.logFile", "System.err");
        int phase = 0;
        String fix = null;
        String store = null;
        List<String> rest = new ArrayList<>(Arrays.asList(args));
        while (!rest.isEmpty()) {
            String a = rest.remove(0);
            switch (a) {
                case "--verbose" -> verbose = true;
                case "--phase", "--fix", "--store", "--wait" -> {
                    if (rest.isEmpty()) {
                        usage(a + " needs a value");
                    }
                    String v = rest.remove(0);
                    switch (a) {
                        case "--phase" -> phase = "1".equals(v) ? 1 : "2".equals(v) ? 2 : 0;
                        case "--fix" -> fix = v;
                        case "--store" -> store = v;
                        default -> waitMillis = (long) (Double.parseDouble(v) * 1000);
                    }
                }
                default -> usage("unknown argument " + a);
            }
        }
        if (phase == 0 || fix == null || store == null) {
            usage("--phase 1|2, --fix and --store are required");
        }
        int colon = fix.lastIndexOf(':');
        if (colon < 0) {
            usage("--fix HOST:PORT");
        }
        String host = fix.substring(0, colon);
        int port = Integer.parseInt(fix.substring(colon + 1));
        Path dir = Paths.get(store);
        try {
            Files.createDirectories(dir);
            if (phase == 1) {
                phase1(host, port, dir);
            } else {
                phase2(host, port, dir);
            }
        } catch (Throwable t) {
            check(false, "phase " + phase + " runs without an exception", t.toString(), null);
            t.printStackTrace(System.out);
        } finally {
            stop();
        }
        if (!STRICT_NOTES.isEmpty()) {
            System.out.println("(" + STRICT_NOTES.size() + " message(s) would fail strict FIX44.xml validation: see the notes above)");
        }
        System.out.println("phase " + phase + ": " + passed + " passed, " + failed + " failed");
        System.out.flush();
        System.exit(failed == 0 ? 0 : 1);
    }

    private Interop() {
    }
}
