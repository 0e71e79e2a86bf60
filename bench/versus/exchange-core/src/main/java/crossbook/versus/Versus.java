package crossbook.versus;

import exchange.core2.collections.objpool.ObjectsPool;
import exchange.core2.core.common.CoreSymbolSpecification;
import exchange.core2.core.common.MatcherEventType;
import exchange.core2.core.common.MatcherTradeEvent;
import exchange.core2.core.common.OrderAction;
import exchange.core2.core.common.OrderType;
import exchange.core2.core.common.SymbolType;
import exchange.core2.core.common.cmd.CommandResultCode;
import exchange.core2.core.common.cmd.OrderCommand;
import exchange.core2.core.common.config.LoggingConfiguration;
import exchange.core2.core.orderbook.IOrderBook;
import exchange.core2.core.orderbook.OrderBookDirectImpl;
import exchange.core2.core.orderbook.OrderBookEventsHelper;

import java.io.BufferedReader;
import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.zip.GZIPInputStream;

/**
 * exchange-core's OrderBookDirectImpl on exchange-core's single-pair flow
 * (../shared/workloads/exchange-core-singlepair/commands.csv.gz), driven
 * single-threaded: every row becomes an OrderCommand before any timing,
 * then each pass applies the whole flow to a fresh book inside one timed
 * loop. Prints ns per command for every pass, the median of passes 3 to N
 * (the JIT has compiled the hot paths by then), and the trade count (the
 * check that the flow was applied right: 40,430).
 *
 *   java -cp ... crossbook.versus.Versus FLOW_DIR [PASSES]
 */
public final class Versus {
    private static final int SYMBOL = 1;

    public static void main(String[] args) throws IOException {
        if (args.length < 1) {
            System.err.println("usage: Versus FLOW_DIR [PASSES]");
            System.exit(2);
        }
        Path flow = Path.of(args[0], "commands.csv.gz");
        int passes = args.length > 1 ? Integer.parseInt(args[1]) : 16;
        if (passes < 3) {
            System.err.println("PASSES must be at least 3 (passes 1 and 2 warm up)");
            System.exit(2);
        }
        OrderCommand[] commands = read(flow);
        CoreSymbolSpecification spec = CoreSymbolSpecification.builder()
            .symbolId(SYMBOL)
            .type(SymbolType.CURRENCY_EXCHANGE_PAIR)
            .baseCurrency(1)
            .quoteCurrency(2)
            .baseScaleK(1)
            .quoteScaleK(1)
            .takerFee(0)
            .makerFee(0)
            .build();
        double[] nsPerCommand = new double[passes];
        long trades = -1;
        for (int pass = 0; pass < passes; pass++) {
            // Outside the timer: a fresh book, and the commands' results
            // from the last pass cleared.
            for (OrderCommand cmd : commands) {
                cmd.matcherEvent = null;
                // What the risk engine would have said: exchange-core's book only
                // processes commands marked valid for matching.
                cmd.resultCode = CommandResultCode.VALID_FOR_MATCHING_ENGINE;
            }
            IOrderBook book = new OrderBookDirectImpl(spec, ObjectsPool.createDefaultTestPool(), OrderBookEventsHelper.NON_POOLED_EVENTS_HELPER, LoggingConfiguration.DEFAULT);
            long started = System.nanoTime();
            for (OrderCommand cmd : commands) {
                IOrderBook.processCommand(book, cmd);
            }
            long elapsed = System.nanoTime() - started;
            nsPerCommand[pass] = (double) elapsed / commands.length;
            long passTrades = countTrades(commands);
            if (trades >= 0 && passTrades != trades) {
                throw new IllegalStateException("pass " + (pass + 1) + " made " + passTrades + " trades, pass 1 made " + trades);
            }
            trades = passTrades;
            System.out.printf("pass %d ns_per_command %.1f%n", pass + 1, nsPerCommand[pass]);
        }
        double[] warm = Arrays.copyOfRange(nsPerCommand, 2, passes);
        Arrays.sort(warm);
        double median = warm.length % 2 == 1 ? warm[warm.length / 2] : (warm[warm.length / 2 - 1] + warm[warm.length / 2]) / 2;
        System.out.printf("commands %d trades %d%n", commands.length, trades);
        System.out.printf("warm_ns_per_command %.1f (median of passes 3-%d)%n", median, passes);
    }

    private static long countTrades(OrderCommand[] commands) {
        long trades = 0;
        for (OrderCommand cmd : commands) {
            for (MatcherTradeEvent event = cmd.matcherEvent; event != null; event = event.nextEvent) {
                if (event.eventType == MatcherEventType.TRADE) {
                    trades++;
                }
            }
        }
        return trades;
    }

    /** seq,command,order_id,uid,action,order_type,price,reserve_bid_price,size */
    private static OrderCommand[] read(Path file) throws IOException {
        List<OrderCommand> out = new ArrayList<>(1 << 20);
        try (BufferedReader reader = new BufferedReader(new InputStreamReader(new GZIPInputStream(new FileInputStream(file.toFile()), 1 << 16), StandardCharsets.US_ASCII))) {
            String header = reader.readLine();
            if (header == null || !header.startsWith("seq,command,")) {
                throw new IOException(file + ": not the flow's command file");
            }
            String line;
            while ((line = reader.readLine()) != null) {
                String[] f = line.split(",", -1);
                long orderId = Long.parseLong(f[2]);
                long uid = Long.parseLong(f[3]);
                OrderCommand cmd;
                switch (f[1]) {
                    case "PLACE_ORDER" -> {
                        OrderAction action = OrderAction.valueOf(f[4]);
                        OrderType type = OrderType.valueOf(f[5]);
                        cmd = OrderCommand.newOrder(type, orderId, uid, Long.parseLong(f[6]), Long.parseLong(f[7]), Long.parseLong(f[8]), action);
                    }
                    case "MOVE_ORDER" -> cmd = OrderCommand.update(orderId, uid, Long.parseLong(f[6]));
                    case "REDUCE_ORDER" -> cmd = OrderCommand.reduce(orderId, uid, Long.parseLong(f[8]));
                    case "CANCEL_ORDER" -> cmd = OrderCommand.cancel(orderId, uid);
                    default -> throw new IOException(file + ": unknown command " + f[1]);
                }
                cmd.symbol = SYMBOL;
                out.add(cmd);
            }
        }
        return out.toArray(new OrderCommand[0]);
    }
}
