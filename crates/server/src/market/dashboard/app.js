// crossbook's dashboard: the order book ladder, recent trades, candles and
// the 24-hour ticker of one instrument, kept live from the combined
// WebSocket stream; the order book by Binance's documented procedure (a
// REST snapshot plus the buffered @depth diffs after it), so a gap in the
// diffs is seen and the page says it is out of sync while it catches up.
'use strict';

const LEVELS = 15;
const TRADES = 40;
const INTERVALS = ['1m', '5m', '15m', '1h', '4h', '1d', '1w'];
// The connection is asked for an answer (LIST_SUBSCRIPTIONS) this often;
// one that has not come after STALLED_MS shows the page as stalled (a
// frozen server, a stuck network: nothing would say so otherwise), and
// after DEAD_MS the connection is dropped and made again.
const HEARTBEAT_MS = 2000;
const STALLED_MS = 5000;
const DEAD_MS = 15000;
// Diffs kept while the book's snapshot is on its way, at most.
const BUFFERED_DIFFS = 5000;
// A request for the snapshot or the figures that takes longer fails.
const REQUEST_MS = 5000;

const state = {
  instruments: [],
  symbol: null,
  interval: '1m',
  ws: null,
  book: null,
  buffer: [],
  syncing: true,
  trades: new Map(),
  klinesReady: false,
  pendingKlines: [],
  lastCandle: null,
  previousStats: null,
  // The venue's counters at the last answer of /crossbook/stats (kept
  // while it does not answer: counters lower after a gap mean another
  // venue), and the polls sent and the newest one handled.
  lastCounters: null,
  // How many times counters that went back started the page over.
  venueRestarts: 0,
  pollsSent: 0,
  pollsHandled: 0,
  statusHistory: [],
  pricePrecision: 2,
  // The heartbeat: the id of the last request sent, when it was sent,
  // and the last one answered.
  heartbeat: { sent: 0, sentAt: 0, answered: 0 },
  stalled: false,
};

// Messages change the state as they come; the page is drawn from it at
// most ten times a second (a busy feed brings tens of thousands of
// messages a second: drawing each, or even sixty frames a second, takes
// the browser a core, and a browser behind the feed is dropped by it).
const DRAW_EVERY_MS = 100;
const dirty = { book: false, trades: false, ticker: null, klines: new Map() };
let drawing = false;
let lastDraw = 0;

function redraw() {
  if (drawing) return;
  drawing = true;
  const wait = Math.max(0, lastDraw + DRAW_EVERY_MS - performance.now());
  setTimeout(() => requestAnimationFrame(drawDirty), wait);
}

function drawDirty() {
  drawing = false;
  lastDraw = performance.now();
  if (dirty.book) { dirty.book = false; renderBook(); }
  if (dirty.trades) { dirty.trades = false; renderTrades(); }
  if (dirty.ticker) { showTicker(dirty.ticker); dirty.ticker = null; }
  if (dirty.klines.size) {
    const klines = [...dirty.klines.values()].sort((a, b) => a.t - b.t);
    dirty.klines.clear();
    for (const k of klines) applyKline(k);
  }
}

const $ = (id) => document.getElementById(id);

async function getJSON(path) {
  const response = await fetch(path, { cache: 'no-store', signal: AbortSignal.timeout(REQUEST_MS) });
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

// A decimal price as a whole number of units of its last decimal at the
// instrument's precision: exact, whatever its length (a float holds 15 to
// 17 digits; a price of 1,000,000,000 to 8 decimals has 18, and two such
// prices would compare equal as floats).
function priceUnits(text) {
  const negative = text.startsWith('-');
  const [whole, fraction = ''] = (negative ? text.slice(1) : text).split('.');
  const units = BigInt((whole || '0') + fraction.padEnd(state.pricePrecision, '0').slice(0, state.pricePrecision));
  return negative ? -units : units;
}

function comparePrices(a, b) {
  const [x, y] = [priceUnits(a), priceUnits(b)];
  return x < y ? -1 : x > y ? 1 : 0;
}

// A price difference in the instrument's decimals, exactly.
function formatPriceDifference(a, b) {
  const precision = state.pricePrecision;
  const units = priceUnits(a) - priceUnits(b);
  const digits = (units < 0n ? -units : units).toString().padStart(precision + 1, '0');
  const whole = precision ? `${digits.slice(0, -precision)}.${digits.slice(-precision)}` : digits;
  return (units < 0n ? '-' : '') + whole;
}

// The decimals the chart draws prices with: the instrument's, as long as
// its highest price keeps to 15 significant digits (the chart computes in
// floats: past that its scale comes out blank or off the tick grid), fewer
// for an instrument whose prices are too long for that.
function chartPrecision(info) {
  const precision = info ? info.pricePrecision : 2;
  const highest = info && info.maxPrice ? info.maxPrice.split('.')[0].replace(/^0+/, '').length : 0;
  return Math.max(0, Math.min(precision, 15 - highest));
}

function setStatus(kind, text) {
  const status = $('status');
  status.className = kind;
  status.textContent = text;
  // What the page shows while the connection is down is not current: it
  // is dimmed until the connection is back.
  document.body.classList.toggle('stale', kind === 'down');
  // One entry per state (a count of seconds going up is the same one).
  const history = state.statusHistory;
  if (!history.length || history[history.length - 1].split(':')[0] !== text.split(':')[0]) history.push(text);
  if (history.length > 50) history.shift();
}

// ---- the chart -------------------------------------------------------

const chart = LightweightCharts.createChart($('chart'), {
  autoSize: true,
  layout: { background: { color: '#171b21' }, textColor: '#d6dbe1' },
  grid: { vertLines: { color: '#20252d' }, horzLines: { color: '#20252d' } },
  timeScale: { timeVisible: true, secondsVisible: false, borderColor: '#262c35', rightOffset: 6, barSpacing: 10 },
  rightPriceScale: { borderColor: '#262c35' },
});
const candleSeries = chart.addSeries(LightweightCharts.CandlestickSeries, {
  upColor: '#26a69a', downColor: '#ef5350', borderVisible: false, wickUpColor: '#26a69a', wickDownColor: '#ef5350',
});
// On its own scale, without a label on the price axis (it would read as
// a price).
const volumeSeries = chart.addSeries(LightweightCharts.HistogramSeries, { priceFormat: { type: 'volume' }, priceScaleId: '', lastValueVisible: false, priceLineVisible: false });
volumeSeries.priceScale().applyOptions({ scaleMargins: { top: 0.8, bottom: 0 } });

function bar(openTime, open, high, low, close, volume) {
  const time = Math.floor(openTime / 1000);
  const up = parseFloat(close) >= parseFloat(open);
  return {
    candle: { time, open: parseFloat(open), high: parseFloat(high), low: parseFloat(low), close: parseFloat(close) },
    volume: { time, value: parseFloat(volume), color: up ? 'rgba(38,166,154,0.5)' : 'rgba(239,83,80,0.5)' },
    raw: { openTime, open, high, low, close, volume },
  };
}

function showCandle(raw) {
  state.lastCandle = raw;
  const el = $('candle');
  for (const [key, value] of Object.entries(raw)) el.dataset[key] = value;
  el.textContent = `O ${raw.open}  H ${raw.high}  L ${raw.low}  C ${raw.close}  V ${raw.volume}`;
}

function clearCandle(text) {
  const el = $('candle');
  for (const key of Object.keys(el.dataset)) delete el.dataset[key];
  el.textContent = text;
}

function applyKline(k) {
  if (state.lastCandle && k.t < state.lastCandle.openTime) return;
  const b = bar(k.t, k.o, k.h, k.l, k.c, k.v);
  candleSeries.update(b.candle);
  volumeSeries.update(b.volume);
  showCandle(b.raw);
}

async function loadKlines(symbol) {
  state.klinesReady = false;
  state.pendingKlines = [];
  state.lastCandle = null;
  const rows = await getJSON(`/api/v3/klines?symbol=${symbol}&interval=${state.interval}&limit=500`);
  if (symbol !== state.symbol) return;
  const bars = rows.map((r) => bar(r[0], r[1], r[2], r[3], r[4], r[5]));
  candleSeries.setData(bars.map((b) => b.candle));
  volumeSeries.setData(bars.map((b) => b.volume));
  if (bars.length) showCandle(bars[bars.length - 1].raw);
  else { clearCandle('no trades yet'); }
  state.klinesReady = true;
  for (const k of state.pendingKlines) applyKline(k);
  state.pendingKlines = [];
}

// ---- the order book --------------------------------------------------

function applyLevels(side, levels) {
  for (const [price, qty] of levels) {
    if (parseFloat(qty) === 0) side.delete(price); else side.set(price, qty);
  }
}

function renderBook() {
  const book = state.book;
  if (!book) return;
  const asks = [...book.asks.entries()].sort((a, b) => comparePrices(a[0], b[0])).slice(0, LEVELS);
  const bids = [...book.bids.entries()].sort((a, b) => comparePrices(b[0], a[0])).slice(0, LEVELS);
  // Bars against the biggest level shown (quantities below 1 too).
  const biggest = Math.max(...asks.map((l) => parseFloat(l[1])), ...bids.map((l) => parseFloat(l[1]))) || 1;
  const rows = (levels, kind) => levels.map(([price, qty]) => {
    const width = (100 * parseFloat(qty) / biggest).toFixed(1);
    return `<div class="row ${kind}" data-price="${price}" data-qty="${qty}"><div class="bar" style="width:${width}%"></div><span class="price">${price}</span><span class="qty">${qty}</span></div>`;
  }).join('');
  $('asks').innerHTML = rows(asks, 'ask');
  $('bids').innerHTML = rows(bids, 'bid');
  $('spread').textContent = asks.length && bids.length ? `spread ${formatPriceDifference(asks[0][0], bids[0][0])}` : 'spread -';
  $('book-id').textContent = `update ${book.lastUpdateId}`;
}

function outOfSync(why) {
  setStatus('syncing', `out of sync (${why}): resyncing`);
  resync(state.symbol);
}

async function resync(symbol) {
  state.syncing = true;
  state.buffer = [];
  if (!$('status').textContent.startsWith('out of sync')) setStatus('syncing', 'syncing the order book');
  let snapshot;
  try {
    snapshot = await getJSON(`/api/v3/depth?symbol=${symbol}&limit=5000`);
  } catch (e) {
    // Asked again while the stream is up (the diffs stay buffered).
    if (symbol !== state.symbol) return;
    if (!state.stalled) setStatus('syncing', `order book not loaded (${e.message}): retrying`);
    setTimeout(() => {
      if (symbol === state.symbol && state.syncing && state.ws && state.ws.readyState === WebSocket.OPEN) resync(symbol);
    }, 2000);
    return;
  }
  if (symbol !== state.symbol) return;
  state.book = { bids: new Map(snapshot.bids), asks: new Map(snapshot.asks), lastUpdateId: snapshot.lastUpdateId };
  const buffered = state.buffer.filter((d) => d.u > snapshot.lastUpdateId);
  state.buffer = [];
  state.syncing = false;
  for (const diff of buffered) {
    if (!applyDiff(diff)) return;
  }
  renderBook();
  if (state.ws && state.ws.readyState === WebSocket.OPEN && !state.stalled) setStatus('live', 'live');
}

// Applies one diff by the procedure; false (and a resync) on a gap.
function applyDiff(diff) {
  const book = state.book;
  if (diff.u <= book.lastUpdateId) return true;
  if (diff.U > book.lastUpdateId + 1) {
    outOfSync(`diff ${diff.U}..${diff.u} after ${book.lastUpdateId}`);
    return false;
  }
  applyLevels(book.bids, diff.b);
  applyLevels(book.asks, diff.a);
  book.lastUpdateId = diff.u;
  return true;
}

function onDepth(diff) {
  if (state.syncing) {
    // The oldest go first: a snapshot newer than them does not need them,
    // an older one finds the gap and asks again.
    state.buffer.push(diff);
    if (state.buffer.length > BUFFERED_DIFFS) state.buffer.shift();
    return;
  }
  if (applyDiff(diff)) { dirty.book = true; redraw(); }
}

// ---- trades and the ticker -------------------------------------------

// The newest TRADES trades, newest first (the others are forgotten).
function keepNewestTrades() {
  const trades = [...state.trades.values()].sort((a, b) => b.id - a.id).slice(0, TRADES);
  state.trades = new Map(trades.map((t) => [t.id, t]));
  return trades;
}

function renderTrades() {
  const trades = keepNewestTrades();
  // The last price follows the trades as they come (the ticker's other
  // figures come every second).
  if (trades.length && trades[0].id > state.lastPriceTrade) {
    state.lastPriceTrade = trades[0].id;
    $('last-price').textContent = trades[0].price;
  }
  $('trades').innerHTML = trades.map((t) => {
    const time = new Date(t.time).toISOString().slice(11, 19);
    return `<div class="row ${t.isBuyerMaker ? 'sell' : 'buy'}" data-id="${t.id}" data-price="${t.price}" data-qty="${t.qty}"><span>${t.price}</span><span>${t.qty}</span><span style="text-align:right">${time}</span></div>`;
  }).join('');
}

async function loadTrades(symbol) {
  const trades = await getJSON(`/api/v3/trades?symbol=${symbol}&limit=${TRADES}`);
  if (symbol !== state.symbol) return;
  for (const t of trades) state.trades.set(t.id, t);
  renderTrades();
}

function showTicker(t) {
  // No trade yet: the last price reads zero, which no price can be.
  const traded = /[1-9]/.test(t.lastPrice);
  if (t.lastId >= state.lastPriceTrade) {
    state.lastPriceTrade = t.lastId;
    $('last-price').textContent = traded ? t.lastPrice : '-';
  }
  const change = $('change');
  // No trade in the window: its prices would read 0.
  const inWindow = Number(t.count) > 0;
  const sign = inWindow ? Math.sign(parseFloat(t.priceChange)) : 0;
  change.textContent = inWindow ? `${t.priceChange} (${t.priceChangePercent}%)` : '-';
  change.className = sign < 0 ? 'sell' : sign > 0 ? 'buy' : '';
  $('high').textContent = inWindow ? t.highPrice : '-';
  $('low').textContent = inWindow ? t.lowPrice : '-';
  $('volume').textContent = t.volume;
  $('quote-volume').textContent = t.quoteVolume;
  $('count').textContent = t.count;
}

async function loadTicker(symbol) {
  const t = await getJSON(`/api/v3/ticker/24hr?symbol=${symbol}`);
  if (symbol === state.symbol) showTicker(t);
}

// ---- the stream ------------------------------------------------------

function onMessage(event) {
  const message = JSON.parse(event.data);
  if (message.id !== undefined && message.data === undefined) { onAnswer(message); return; }
  const data = message.data;
  if (!data || message.stream.split('@')[0] !== state.symbol.toLowerCase()) return;
  const kind = message.stream.slice(message.stream.indexOf('@') + 1);
  if (kind === 'depth' || kind.startsWith('depth@')) onDepth(data);
  else if (kind === 'trade' || kind === 'trade@100ms') {
    // One trade, or (@trade@100ms) the newest trades of 100 ms.
    for (const t of kind === 'trade' ? [data] : data.t) {
      state.trades.set(t.t, { id: t.t, price: t.p, qty: t.q, time: t.T, isBuyerMaker: t.m });
    }
    // Bounded while no frame is drawn (a hidden tab draws none).
    if (state.trades.size > 10 * TRADES) keepNewestTrades();
    dirty.trades = true;
    redraw();
  } else if (kind.startsWith('kline_')) {
    if (!state.klinesReady) { state.pendingKlines.push(data.k); return; }
    // The newest version of each candle.
    dirty.klines.set(data.k.t, data.k);
    redraw();
  } else if (kind === 'ticker') {
    dirty.ticker = { lastId: data.L, lastPrice: data.c, priceChange: data.p, priceChangePercent: data.P, highPrice: data.h, lowPrice: data.l, volume: data.v, quoteVolume: data.q, count: data.n };
    redraw();
  }
}

// ---- the heartbeat ---------------------------------------------------

function onAnswer(message) {
  if (typeof message.id !== 'number' || message.id > state.heartbeat.sent) return;
  state.heartbeat.answered = Math.max(state.heartbeat.answered, message.id);
  if (state.stalled && state.heartbeat.answered === state.heartbeat.sent) {
    state.stalled = false;
    setStatus(state.syncing ? 'syncing' : 'live', state.syncing ? 'syncing the order book' : 'live');
  }
}

function beat() {
  const ws = state.ws;
  if (!ws || ws.readyState !== WebSocket.OPEN) return;
  const hb = state.heartbeat;
  const waited = hb.answered < hb.sent ? performance.now() - hb.sentAt : 0;
  if (waited > DEAD_MS) {
    // Dropped and made again at once: a close would wait for the
    // server's answer to it (a minute, in a browser) before onclose.
    state.ws = null;
    ws.onclose = null;
    ws.onmessage = null;
    ws.close();
    setStatus('down', `disconnected: no answer from the server for ${Math.floor(waited / 1000)} s; reconnecting`);
    connect();
    return;
  }
  if (waited > STALLED_MS) {
    state.stalled = true;
    setStatus('down', `stalled: no answer from the server for ${Math.floor(waited / 1000)} s`);
    return;
  }
  if (hb.answered === hb.sent) {
    hb.sent += 1;
    hb.sentAt = performance.now();
    ws.send(JSON.stringify({ method: 'LIST_SUBSCRIPTIONS', id: hb.sent }));
  }
}
setInterval(beat, HEARTBEAT_MS / 2);

function connect() {
  const symbol = state.symbol;
  const s = symbol.toLowerCase();
  // Streams sent on a clock (the book's diffs and the trades of 100 ms
  // together, the ticker every second, the candle every two), not one
  // message per batch: a browser takes a message at a time, and a busy
  // venue makes tens of thousands of batches a second.
  const streams = [`${s}@depth@100ms`, `${s}@trade@100ms`, `${s}@kline_${state.interval}`, `${s}@ticker`].join('/');
  const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
  const ws = new WebSocket(`${scheme}://${location.host}/stream?streams=${streams}`);
  state.ws = ws;
  state.syncing = true;
  state.buffer = [];
  state.heartbeat = { sent: 0, sentAt: 0, answered: 0 };
  state.stalled = false;
  // Only the current connection's messages count (one being replaced may
  // still deliver some).
  ws.onmessage = (event) => { if (ws === state.ws) onMessage(event); };
  ws.onopen = () => {
    // What the page showed came from the connection before: the venue
    // may have been started again on other data (its trade ids start
    // again). The REST answers and this connection's messages replace it.
    state.trades = new Map();
    state.lastPriceTrade = -1;
    resync(symbol);
    loadTrades(symbol).catch(() => {});
    loadKlines(symbol).catch(() => {});
    loadTicker(symbol).catch(() => {});
  };
  ws.onclose = (event) => {
    if (ws !== state.ws) return;
    const why = event.reason ? `: ${event.reason}` : '';
    setStatus('down', `disconnected${why}; reconnecting`);
    setTimeout(() => { if (ws === state.ws) connect(); }, 2000);
  };
}

// Nothing of what the page showed stays: the book, the ticker and the
// chart until the new connection's answers come.
function clearShown() {
  $('asks').innerHTML = '';
  $('bids').innerHTML = '';
  $('spread').textContent = 'spread -';
  $('book-id').textContent = '-';
  for (const id of ['last-price', 'change', 'high', 'low', 'volume', 'quote-volume', 'count']) $(id).textContent = '-';
  $('change').className = '';
  candleSeries.setData([]);
  volumeSeries.setData([]);
  state.lastCandle = null;
  clearCandle('-');
}

function select(symbol) {
  // None to show (a venue that lists none yet): nothing to connect to.
  if (!symbol) return;
  if (state.ws) { const old = state.ws; state.ws = null; old.close(); }
  state.symbol = symbol;
  const info = state.instruments.find((i) => i.symbol === symbol);
  state.pricePrecision = info ? info.pricePrecision : 2;
  // The old instrument's candles go before the new precision comes: the
  // chart would lay out their scale in the new one's steps (a price of
  // 10^9 in steps of 10^-10 hangs it).
  clearShown();
  const precision = chartPrecision(info);
  candleSeries.applyOptions({ priceFormat: { type: 'price', precision, minMove: Math.pow(10, -precision) } });
  state.book = null;
  state.trades = new Map();
  state.lastPriceTrade = -1;
  dirty.klines.clear();
  dirty.ticker = null;
  for (const b of document.querySelectorAll('#symbols button')) b.classList.toggle('active', b.dataset.symbol === symbol);
  renderTrades();
  connect();
}

function buildControls() {
  $('symbols').innerHTML = state.instruments.map((i) => `<button data-symbol="${i.symbol}" title="${i.name}">${i.name}</button>`).join('');
  for (const b of document.querySelectorAll('#symbols button')) b.onclick = () => select(b.dataset.symbol);
  $('intervals').innerHTML = INTERVALS.map((i) => `<button data-interval="${i}">${i}</button>`).join('');
  for (const b of document.querySelectorAll('#intervals button')) {
    b.classList.toggle('active', b.dataset.interval === state.interval);
    b.onclick = () => {
      state.interval = b.dataset.interval;
      for (const o of document.querySelectorAll('#intervals button')) o.classList.toggle('active', o === b);
      select(state.symbol);
    };
  }
}

// The venue's figures: '-' while they cannot be had (none is shown that
// is not current).
function clearStats() {
  for (const id of ['stat-seq', 'stat-orders', 'stat-trades', 'stat-sessions', 'stat-sockets']) $(id).textContent = '-';
  state.previousStats = null;
}

async function pollStats() {
  // Polls may overlap (one a second, each given 5 s): an answer older than
  // one already handled is dropped, so counters never seem to go back.
  const poll = ++state.pollsSent;
  let stats;
  try { stats = await getJSON('/crossbook/stats'); } catch (e) {
    if (poll > state.pollsHandled) { state.pollsHandled = poll; clearStats(); }
    return;
  }
  if (poll < state.pollsHandled) return;
  state.pollsHandled = poll;
  const now = performance.now();
  const previous = state.previousStats;
  $('stat-seq').textContent = stats.seq;
  // Counters that went back since the last answer (kept while the server
  // did not answer): the venue was started again on other data (a restart
  // on the same data carries them on). Nothing the page shows is current:
  // it starts over.
  const last = state.lastCounters;
  const restarted = last !== null && (stats.seq < last.seq || stats.orders < last.orders || stats.trades < last.trades);
  state.lastCounters = { seq: stats.seq, orders: stats.orders, trades: stats.trades };
  // The venue's instruments as they are now: one listed since the page
  // loaded (a configuration reload) gets its button; on a venue started
  // again on other data, those it does not have lose theirs, and one whose
  // decimals changed is drawn again with its new ones.
  const instruments = stats.instruments || [];
  const shape = (list) => JSON.stringify(list.map((i) => [i.symbol, i.name, i.pricePrecision, i.maxPrice]));
  let reselected = false;
  if (shape(instruments) !== shape(state.instruments)) {
    const before = state.instruments.find((i) => i.symbol === state.symbol);
    const now = instruments.find((i) => i.symbol === state.symbol);
    state.instruments = instruments;
    buildControls();
    if (!instruments.length) {
      if (state.ws) { const old = state.ws; state.ws = null; old.close(); }
      state.symbol = null;
      clearShown();
      state.waitingForInstruments = true;
      setStatus('down', 'no instruments');
    } else if (state.waitingForInstruments || !now) {
      state.waitingForInstruments = false;
      select(instruments[0].symbol);
      reselected = true;
    } else if (!before || before.pricePrecision !== now.pricePrecision || before.maxPrice !== now.maxPrice) {
      select(state.symbol);
      reselected = true;
    }
    for (const b of document.querySelectorAll('#symbols button')) b.classList.toggle('active', b.dataset.symbol === state.symbol);
  }
  if (restarted) state.venueRestarts += 1;
  if (restarted && !reselected && state.symbol) select(state.symbol);
  // An instrument the operator halted is marked on its button.
  for (const i of stats.instruments || []) {
    const button = document.querySelector(`#symbols button[data-symbol="${i.symbol}"]`);
    if (button) {
      button.classList.toggle('halted', i.status === 'HALT');
      button.title = i.status === 'HALT' ? `${i.name}: trading halted by the operator` : i.name;
    }
  }
  $('stat-sessions').textContent = stats.tradingSessions;
  $('stat-sockets').textContent = stats.webSockets;
  if (previous && !restarted) {
    const seconds = (now - previous.at) / 1000;
    $('stat-orders').textContent = Math.round((stats.orders - previous.orders) / seconds);
    $('stat-trades').textContent = Math.round((stats.trades - previous.trades) / seconds);
  } else {
    for (const id of ['stat-orders', 'stat-trades']) $(id).textContent = '-';
  }
  state.previousStats = { at: now, orders: stats.orders, trades: stats.trades };
}

async function start() {
  try {
    const stats = await getJSON('/crossbook/stats');
    state.instruments = stats.instruments;
  } catch (e) {
    setStatus('down', `disconnected: ${e.message}; reloading`);
    setTimeout(start, 2000);
    return;
  }
  setInterval(pollStats, 1000);
  if (!state.instruments.length) {
    // None yet (a replicated venue not yet set up): the first one listed
    // is shown when it comes.
    setStatus('down', 'no instruments');
    state.waitingForInstruments = true;
    return;
  }
  buildControls();
  select(state.instruments[0].symbol);
  pollStats();
}

// For the browser test (scripts/dashboard-test): the page's state, its
// handler of stream messages (to hand it a diff with a gap), and its price
// arithmetic (on prices longer than a float's digits).
window.crossbook = state;
window.crossbookOnMessage = onMessage;
window.crossbookPrices = { compare: comparePrices, difference: formatPriceDifference };
start();
