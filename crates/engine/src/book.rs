//! One instrument's order book: two sides of price levels, each level a FIFO
//! of orders linked intrusively through their arena slots.
//!
//! # The price-level structure, and why
//!
//! The level bodies (FIFO head, tail, total quantity) live in a per-book
//! [`Arena`] and each order records its level's slot, so cancelling an
//! order is O(1) through its own `prev`/`next`. What varies is how a side
//! finds a level by price, files a new one, and knows its best.
//!
//! A side ([`BookSide`]) with up to 32 levels keeps them in a sorted
//! vector, best last: best is `last()`, a new level is a binary search and
//! a short shift, and a thin book costs no memory beyond its levels (a
//! venue with a thousand instruments, most of them quiet). Past 32 levels
//! the side gets a **price-indexed window** of 16,384 consecutive prices
//! (a `u32` level slot each, a two-level bitmap of the prices with orders
//! and a bitmap of the prices holding a level: 68 KiB a side), placed
//! so that the best price sits an eighth of the way in from its better
//! edge: finding, adding and removing a level is indexing plus a bit, and
//! the best is kept as levels come and go (when the best level empties,
//! the next is a few leading- or trailing-zero counts away). Levels outside
//! the window (far tails, or a book wider than it) stay in the sorted
//! vector; when that holds more than its limit (32, then twice what it held
//! after the last move) the window is moved to the touch and every level
//! filed again, so a drifting market costs an occasional O(levels) move.
//!
//! A window price keeps its level's slot when the level empties (an empty
//! level is already in its initial state), so a price that empties and
//! fills again costs two bits, not an allocation and a free in the level
//! arena: at `exchange-core-single`'s touch two moves in three open a level
//! and two in three close one, at `steady-deep`'s one rest in two. The kept
//! slots are freed when the window moves (a side keeps at most 16,384,
//! 512 KiB). And each side caches its best level, which the match loop asks
//! for on every step. Together, 2026-11-25 (`scripts/instructions W 200000
//! 400000`): `exchange-core-single` 574 -> 523, `steady-deep` 752 -> 724
//! (with the copies of whole orders removed from `unlink` and the engine's
//! cancel and rest paths).
//!
//! Measured when the window came (`scripts/instructions W 200000 1000000`, instructions per
//! command, the whole engine; the sorted vector alone before, this after):
//! `exchange-core-single` 1,203 -> 690 (its moves land on ~400 levels a
//! side spread over 4,000 ticks: inserting and removing a level in the
//! middle of a sorted vector was 31% of all instructions, in `memmove`),
//! `place-cancel` 1,027 -> 979, `steady-deep` 1,054 -> 1,056,
//! `multi-symbol` 840 -> 856 (its thousand books are mostly thin and stay
//! in the vector; the 2% is the extra branch on every level lookup).
//!
//! The alternatives set aside: a `BTreeMap<price, level>` allocates and
//! frees nodes as levels come and go (so the book would allocate in steady
//! state) and chases pointers to the best level; a dense array over the
//! whole price band costs memory in proportion to the band (megabytes per
//! instrument for a wide band) and is what the window bounds; a window
//! for every side from its first level (tried first) cost `multi-symbol`
//! 22% more instructions, all of it in zeroing 2,000 windows, and 130 MB.

use crate::arena::{Arena, NIL, boxed_array};
use crate::types::{SelfTradePrevention, Side};

/// A resting order. Lives in the engine's order arena.
#[derive(Clone, Copy, Debug)]
pub struct Order {
    pub id: u64,
    pub cid: u64,
    pub price: i64,
    /// Total quantity, filled lots included.
    pub qty: u64,
    pub filled: u64,
    /// What one remaining lot keeps locked: `unit_lock(price)` of the quote
    /// asset for a buy, `lot_size` of the base asset for a sell.
    pub unit_lock: u64,
    /// Index of the owning account in the engine's account table.
    pub account: u32,
    /// Index of the instrument in the engine's instrument table.
    pub instrument: u32,
    /// Level FIFO links.
    pub prev: u32,
    pub next: u32,
    /// Slot of the level in the book's level arena. Stale while the order
    /// is out of its level (only ever briefly, during a replace that
    /// matches, until it is filed again or freed).
    pub level: u32,
    /// The next order in its account's client-id chain ([`crate::cid`]).
    pub cid_next: u32,
    /// Where that chain's head is among all the accounts' heads
    /// ([`crate::cid::CidHeads`]), so that leaving the index needs no hash
    /// and no look at the account's table.
    pub cid_bucket: u32,
    pub side: Side,
    pub stp: SelfTradePrevention,
    pub post_only: bool,
}

impl Order {
    #[inline]
    pub fn remaining(&self) -> u64 {
        self.qty - self.filled
    }
}

impl Default for Order {
    fn default() -> Self {
        Order {
            id: 0,
            cid: 0,
            price: 0,
            qty: 0,
            filled: 0,
            unit_lock: 0,
            account: NIL,
            instrument: NIL,
            prev: NIL,
            next: NIL,
            level: NIL,
            cid_next: NIL,
            cid_bucket: 0,
            side: Side::Buy,
            stp: SelfTradePrevention::None,
            post_only: false,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Level {
    pub price: i64,
    pub head: u32,
    pub tail: u32,
    /// Sum of the remaining quantities of the level's orders. (How many
    /// orders it holds is not kept: only queries and snapshots ask, and
    /// they walk the list. Keeping it cost a write on every rest and
    /// exit.)
    pub total_qty: u64,
}

impl Default for Level {
    fn default() -> Self {
        Level { price: 0, head: NIL, tail: NIL, total_qty: 0 }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LevelRef {
    pub price: i64,
    pub level: u32,
}

/// log2 of the prices a side's window covers.
const WINDOW_SHIFT: u32 = 14;
/// Prices (ticks) a side's window covers: 16,384, with one `u32` each
/// (64 KiB) and a bit each (2 KiB), allocated when the side gets its first
/// level.
pub const WINDOW: usize = 1 << WINDOW_SHIFT;
const WORDS: usize = WINDOW / 64;
const SUMMARY_WORDS: usize = WORDS / 64;
/// Levels the far list may hold before the window is moved to the touch
/// (and afterwards twice what it held then, so that a book wider than the
/// window moves it rarely).
const FAR_LEVELS_MIN: usize = 32;

/// A run of `WINDOW` consecutive prices from `base`, each with the slot of
/// the level kept for it or `NIL`, and two bitmaps: the prices whose level
/// has orders (`words`, with a summary word of its non-zero words) and the
/// prices that hold a level slot at all (`kept`). A level whose last order
/// leaves keeps its slot (an empty level is already in its initial state),
/// so a price that empties and fills again, which is most of what a busy
/// touch does, costs neither an arena allocation nor a free: it is a bit
/// cleared and set again. Kept slots are freed when the window moves.
///
/// The arrays have fixed sizes so that an index known to be in the window
/// needs no bounds check.
struct Window {
    /// At most `i64::MAX - WINDOW`, so that `index` can subtract without
    /// overflow checks (prices lie in `1..2^62` anyway).
    base: i64,
    levels: Box<[u32; WINDOW]>,
    words: Box<[u64; WORDS]>,
    /// Bit `w` set when `words[w]` is not zero.
    summary: [u64; SUMMARY_WORDS],
    /// Bit `i` set when `levels[i]` holds a slot.
    kept: Box<[u64; WORDS]>,
    count: usize,
    /// The best occupied slot for the side (highest for bids, lowest for
    /// asks), kept as levels come and go.
    best: Option<usize>,
}

impl Window {
    fn new(base: i64) -> Box<Window> {
        Box::new(Window {
            base,
            levels: boxed_array(NIL),
            words: boxed_array(0),
            summary: [0; SUMMARY_WORDS],
            kept: boxed_array(0),
            count: 0,
            best: None,
        })
    }

    /// The slot of `price`, if the window covers it. With `base <=
    /// i64::MAX - WINDOW`, `price - base` taken modulo 2^64 is below
    /// `WINDOW` exactly when the window covers `price`.
    #[inline]
    fn index(&self, price: i64) -> Option<usize> {
        let offset = price.wrapping_sub(self.base) as u64;
        (offset < WINDOW as u64).then_some(offset as usize)
    }

    #[inline]
    fn occupied(&self, index: usize) -> bool {
        self.words[index >> 6] >> (index & 63) & 1 == 1
    }

    /// Marks `index` occupied and keeps `best` for `side`.
    #[inline]
    fn add(&mut self, side: Side, index: usize) {
        let word = index >> 6;
        self.words[word] |= 1 << (index & 63);
        self.summary[word >> 6] |= 1 << (word & 63);
        self.count += 1;
        let better = match (side, self.best) {
            (_, None) => true,
            (Side::Buy, Some(best)) => index > best,
            (Side::Sell, Some(best)) => index < best,
        };
        if better {
            self.best = Some(index);
        }
    }

    /// Marks `index` empty (its level slot stays kept) and keeps `best`
    /// for `side`.
    #[inline]
    fn take(&mut self, side: Side, index: usize) {
        let word = index >> 6;
        self.words[word] &= !(1 << (index & 63));
        if self.words[word] == 0 {
            self.summary[word >> 6] &= !(1 << (word & 63));
        }
        self.count -= 1;
        if self.best == Some(index) {
            self.best = match side {
                Side::Buy => self.highest(),
                Side::Sell => self.lowest(),
            };
        }
    }

    /// Records `level` as the slot kept for `index`.
    #[inline]
    fn keep(&mut self, index: usize, level: u32) {
        self.levels[index] = level;
        self.kept[index >> 6] |= 1 << (index & 63);
    }

    #[inline]
    fn highest(&self) -> Option<usize> {
        for s in (0..SUMMARY_WORDS).rev() {
            let mask = self.summary[s];
            if mask != 0 {
                let word = s * 64 + 63 - mask.leading_zeros() as usize;
                return Some(word * 64 + 63 - self.words[word].leading_zeros() as usize);
            }
        }
        None
    }

    #[inline]
    fn lowest(&self) -> Option<usize> {
        for s in 0..SUMMARY_WORDS {
            let mask = self.summary[s];
            if mask != 0 {
                let word = s * 64 + mask.trailing_zeros() as usize;
                return Some(word * 64 + self.words[word].trailing_zeros() as usize);
            }
        }
        None
    }

    /// The next occupied slot from `from` (included) toward the worse
    /// prices of `side`: down for bids, up for asks.
    fn next_worse(&self, side: Side, from: usize) -> Option<usize> {
        match side {
            Side::Buy => {
                let mut word = from >> 6;
                let mut mask = self.words[word] & (u64::MAX >> (63 - (from & 63)));
                loop {
                    if mask != 0 {
                        return Some(word * 64 + 63 - mask.leading_zeros() as usize);
                    }
                    if word == 0 {
                        return None;
                    }
                    word -= 1;
                    mask = self.words[word];
                }
            }
            Side::Sell => {
                let mut word = from >> 6;
                let mut mask = self.words[word] & (u64::MAX << (from & 63));
                loop {
                    if mask != 0 {
                        return Some(word * 64 + mask.trailing_zeros() as usize);
                    }
                    word += 1;
                    if word == WORDS {
                        return None;
                    }
                    mask = self.words[word];
                }
            }
        }
    }

    /// Empties the window: frees every kept level slot (the occupied ones
    /// are the caller's to re-file, and are not freed) and clears both
    /// bitmaps.
    fn clear_all(&mut self, levels: &mut Arena<Level>) {
        for word in 0..WORDS {
            let mut bits = self.kept[word];
            while bits != 0 {
                let index = word * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if !self.occupied(index) {
                    levels.remove(self.levels[index]);
                }
                self.levels[index] = NIL;
            }
            self.kept[word] = 0;
            self.words[word] = 0;
        }
        self.summary = [0; SUMMARY_WORDS];
        self.count = 0;
        self.best = None;
    }
}

/// Whether price `a` is better than `b` on `side`.
#[inline(always)]
fn better(side: Side, a: i64, b: i64) -> bool {
    match side {
        Side::Buy => a > b,
        Side::Sell => a < b,
    }
}

/// The better of the window's best level and `far`'s (its last).
#[inline(always)]
fn best_of(side: Side, window: Option<&Window>, far: Option<LevelRef>) -> Option<LevelRef> {
    let Some(w) = window else { return far };
    let in_window = w.best.map(|index| LevelRef { price: w.base + index as i64, level: w.levels[index] });
    match (in_window, far) {
        (Some(a), Some(b)) => Some(if better(side, a.price, b.price) { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// The levels of one side.
///
/// A side with up to `FAR_LEVELS_MIN` levels keeps them in `far`, a sorted
/// vector (few levels: a short binary search and a short shift, and no
/// memory beyond them). Past that, most levels sit in a price-indexed
/// [`Window`] placed around the touch;
/// levels outside it (the far tails, or a book wider than the window) are
/// kept in `far`, sorted so that the best is last. When `far` outgrows
/// its limit, the window is moved so that the best price sits near its
/// better edge and every level is filed again. The best level is cached
/// (`best_price`, `best_level`): the match loop asks for it on every
/// step.
pub struct BookSide {
    side: Side,
    window: Option<Box<Window>>,
    far: Vec<LevelRef>,
    far_limit: usize,
    /// Reused when the window moves (no allocation once grown).
    scratch: Vec<LevelRef>,
    best_price: i64,
    /// `NIL` when the side is empty.
    best_level: u32,
}

impl BookSide {
    pub fn new(side: Side) -> BookSide {
        BookSide { side, window: None, far: Vec::new(), far_limit: FAR_LEVELS_MIN, scratch: Vec::new(), best_price: 0, best_level: NIL }
    }

    /// Levels on this side.
    pub fn len(&self) -> usize {
        self.far.len() + self.window.as_ref().map_or(0, |w| w.count)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether price `a` is better than `b` on this side.
    #[inline]
    fn better(&self, a: i64, b: i64) -> bool {
        better(self.side, a, b)
    }

    #[inline(always)]
    pub fn best(&self) -> Option<LevelRef> {
        (self.best_level != NIL).then_some(LevelRef { price: self.best_price, level: self.best_level })
    }

    /// The best level worked out from the window and `far` (what `best`
    /// caches).
    fn compute_best(&self) -> Option<LevelRef> {
        best_of(self.side, self.window.as_deref(), self.far.last().copied())
    }

    #[inline]
    fn set_best(&mut self, best: Option<LevelRef>) {
        match best {
            Some(best) => {
                self.best_price = best.price;
                self.best_level = best.level;
            }
            None => self.best_level = NIL,
        }
    }

    /// A new level at `price` may be the best.
    #[inline]
    fn offer_best(&mut self, price: i64, level: u32) {
        if self.best_level == NIL || self.better(price, self.best_price) {
            self.best_price = price;
            self.best_level = level;
        }
    }

    /// Position of `price` in `far` (`Ok`) or where it would go (`Err`).
    #[inline]
    fn search_far(&self, price: i64) -> Result<usize, usize> {
        // Sorted worst first: ascending prices for bids, descending for asks.
        match self.side {
            Side::Buy => self.far.binary_search_by(|probe| probe.price.cmp(&price)),
            Side::Sell => self.far.binary_search_by(|probe| price.cmp(&probe.price)),
        }
    }

    /// The level slot at `price`, if a level there has orders.
    #[inline]
    pub fn find(&self, price: i64) -> Option<u32> {
        if let Some(window) = &self.window
            && let Some(index) = window.index(price)
        {
            return window.occupied(index).then(|| window.levels[index]);
        }
        self.search_far(price).ok().map(|position| self.far[position].level)
    }

    /// The slot of the level at `price`, filing a new one (from `levels`)
    /// if none has orders there; the caller puts an order in it.
    ///
    /// A level with orders in the window (half the rests of `steady-deep`)
    /// is found here, inline; the rest is out of line (`steady-deep` 548 ->
    /// 541 instructions a command).
    #[inline(always)]
    pub fn open(&mut self, price: i64, levels: &mut Arena<Level>) -> u32 {
        if let Some(window) = self.window.as_deref()
            && let Some(index) = window.index(price)
            && window.occupied(index)
        {
            return window.levels[index];
        }
        self.open_new(price, levels)
    }

    /// [`BookSide::open`] where the window has no level with orders at
    /// `price`.
    #[inline(never)]
    fn open_new(&mut self, price: i64, levels: &mut Arena<Level>) -> u32 {
        let side = self.side;
        if let Some(window) = self.window.as_deref_mut()
            && let Some(index) = window.index(price)
        {
            let mut level = window.levels[index];
            debug_assert!(!window.occupied(index));
            if level == NIL {
                level = levels.insert(Level { price, ..Level::default() });
                window.keep(index, level);
            }
            window.add(side, index);
            self.offer_best(price, level);
            return level;
        }
        let position = match self.search_far(price) {
            Ok(position) => return self.far[position].level,
            Err(position) => position,
        };
        let level = levels.insert(Level { price, ..Level::default() });
        self.far.insert(position, LevelRef { price, level });
        self.offer_best(price, level);
        if self.far.len() > self.far_limit {
            self.move_window(levels);
        }
        level
    }

    /// Takes the level at `price` off the side: its last order has left.
    /// A window level keeps its slot; a far one is freed.
    #[inline(always)]
    pub fn close(&mut self, price: i64, levels: &mut Arena<Level>) {
        let side = self.side;
        if let Some(window) = self.window.as_deref_mut()
            && let Some(index) = window.index(price)
        {
            debug_assert!(window.occupied(index), "level {price} missing from its side");
            window.take(side, index);
            if self.best_level != NIL && self.best_price == price {
                // `compute_best`, with the window at hand (a trade that
                // empties a level empties the best).
                let best = best_of(side, Some(window), self.far.last().copied());
                self.set_best(best);
            }
            return;
        }
        let at = match self.far.last() {
            Some(last) if last.price == price => self.far.len() - 1,
            _ => match self.search_far(price) {
                Ok(position) => position,
                Err(_) => unreachable!("level {price} missing from its side"),
            },
        };
        levels.remove(self.far.remove(at).level);
        if self.best_level != NIL && self.best_price == price {
            self.set_best(self.compute_best());
        }
    }

    /// Where a window goes so that `best` sits an eighth of the way in from
    /// its better edge (bids: near the top; asks: near the bottom), since
    /// a side's levels lie at or behind its best.
    fn base_around(&self, best: i64) -> i64 {
        let eighth = (WINDOW / 8) as i64;
        let base = match self.side {
            Side::Buy => best.saturating_sub(WINDOW as i64 - eighth),
            Side::Sell => best.saturating_sub(eighth),
        };
        base.min(i64::MAX - WINDOW as i64)
    }

    /// Moves the window to the best price and files every level again.
    #[cold]
    fn move_window(&mut self, levels: &mut Arena<Level>) {
        let Some(best) = self.best() else { return };
        let mut all = std::mem::take(&mut self.scratch);
        all.clear();
        all.extend(self.iter_best_first());
        let base = self.base_around(best.price);
        match self.window.as_mut() {
            Some(window) => {
                window.clear_all(levels);
                window.base = base;
            }
            // A side with few levels lives in `far` alone (no memory for a
            // window: a venue with many thin books); the window comes with
            // the `FAR_LEVELS_MIN + 1`th level.
            None => self.window = Some(Window::new(base)),
        }
        self.far.clear();
        for level in &all {
            let window = self.window.as_mut().map(|w| (w.index(level.price), w));
            match window {
                Some((Some(index), window)) => {
                    window.keep(index, level.level);
                    window.add(self.side, index);
                }
                _ => self.far.push(*level),
            }
        }
        // `all` ran best first; `far` keeps the best last.
        self.far.reverse();
        self.far_limit = FAR_LEVELS_MIN.max(2 * self.far.len());
        self.scratch = all;
        self.set_best(self.compute_best());
    }

    /// The levels from the best to the worst.
    pub fn iter_best_first(&self) -> LevelsBestFirst<'_> {
        let next_window = self.window.as_ref().and_then(|w| w.best);
        LevelsBestFirst { side: self, next_window, next_far: self.far.len() }
    }

    /// Checks the structure (`check_invariants`, after every command in
    /// tests, so it looks at the occupied slots only; `check_all_slots`
    /// looks at every one): occupied slots are kept, the summary, the far
    /// list's order, that no far level is one the window covers, and the
    /// cached best.
    pub fn check(&self) -> Result<(), String> {
        if let Some(w) = &self.window {
            let mut count = 0;
            for (word_index, &word) in w.words.iter().enumerate() {
                if word & !w.kept[word_index] != 0 {
                    return Err(format!("window word {word_index} marks a price with no level kept"));
                }
                let mut bits = word;
                while bits != 0 {
                    let index = word_index * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    if w.levels[index] == NIL {
                        return Err(format!("window slot {index} (price {}) is marked but empty", w.base + index as i64));
                    }
                    count += 1;
                }
            }
            let best = match self.side {
                Side::Buy => w.highest(),
                Side::Sell => w.lowest(),
            };
            if best != w.best {
                return Err(format!("window best slot {:?}, kept as {:?}", best, w.best));
            }
            if count != w.count {
                return Err(format!("window counts {} levels, holds {count}", w.count));
            }
            for word in 0..WORDS {
                if (w.summary[word >> 6] >> (word & 63) & 1 == 1) != (w.words[word] != 0) {
                    return Err(format!("window summary bit {word} is wrong"));
                }
            }
            if let Some(far) = self.far.iter().find(|l| w.index(l.price).is_some()) {
                return Err(format!("far level {} lies in the window", far.price));
            }
        }
        for pair in self.far.windows(2) {
            if !self.better(pair[1].price, pair[0].price) {
                return Err(format!("{:?} far levels out of order at {} / {}", self.side, pair[0].price, pair[1].price));
            }
        }
        if self.best() != self.compute_best() {
            return Err(format!("{:?} best cached as {:?}, is {:?}", self.side, self.best(), self.compute_best()));
        }
        Ok(())
    }

    /// [`BookSide::check`], and that every slot is kept exactly when it
    /// holds a level, and every kept level that has no orders is empty and
    /// at its price.
    pub fn check_all_slots(&self, levels: &Arena<Level>) -> Result<(), String> {
        self.check()?;
        if let Some(w) = &self.window {
            for index in 0..WINDOW {
                let kept = w.kept[index >> 6] >> (index & 63) & 1 == 1;
                if kept != (w.levels[index] != NIL) {
                    return Err(format!("window slot {index} (price {}): kept bit and slot disagree", w.base + index as i64));
                }
                if kept {
                    let level = levels.get(w.levels[index]);
                    if level.price != w.base + index as i64 {
                        return Err(format!("window slot {index} keeps the level of price {}", level.price));
                    }
                    if !w.occupied(index) && (level.head != NIL || level.tail != NIL || level.total_qty != 0) {
                        return Err(format!("window slot {index} (price {}) keeps a level that is not empty", level.price));
                    }
                }
            }
        }
        Ok(())
    }
}

/// See [`BookSide::iter_best_first`]: the window's levels and the far
/// ones, merged.
pub struct LevelsBestFirst<'a> {
    side: &'a BookSide,
    next_window: Option<usize>,
    /// `far[..next_far]` are still to come (best last).
    next_far: usize,
}

impl Iterator for LevelsBestFirst<'_> {
    type Item = LevelRef;

    fn next(&mut self) -> Option<LevelRef> {
        let side = self.side;
        let window = side.window.as_ref();
        let from_window = match (window, self.next_window) {
            (Some(w), Some(index)) => Some(LevelRef { price: w.base + index as i64, level: w.levels[index] }),
            _ => None,
        };
        let from_far = self.next_far.checked_sub(1).map(|at| side.far[at]);
        let take_window = match (from_window, from_far) {
            (Some(a), Some(b)) => side.better(a.price, b.price),
            (Some(_), None) => true,
            (None, _) => false,
        };
        if take_window {
            let (Some(w), Some(index)) = (window, self.next_window) else { return None };
            self.next_window = match side.side {
                Side::Buy => index.checked_sub(1).and_then(|from| w.next_worse(Side::Buy, from)),
                Side::Sell => (index + 1 < WINDOW).then(|| w.next_worse(Side::Sell, index + 1)).flatten(),
            };
            from_window
        } else {
            self.next_far = self.next_far.checked_sub(1)?;
            from_far
        }
    }
}


pub struct Book {
    pub bids: BookSide,
    pub asks: BookSide,
    pub levels: Arena<Level>,
}

impl Default for Book {
    fn default() -> Self {
        Book { bids: BookSide::new(Side::Buy), asks: BookSide::new(Side::Sell), levels: Arena::new() }
    }
}

impl Book {
    #[inline]
    pub fn side(&self, side: Side) -> &BookSide {
        match side {
            Side::Buy => &self.bids,
            Side::Sell => &self.asks,
        }
    }

    /// Best level of the side opposite to a taker on `taker_side`.
    #[inline(always)]
    pub fn best_opposite(&self, taker_side: Side) -> Option<LevelRef> {
        match taker_side {
            Side::Buy => self.asks.best(),
            Side::Sell => self.bids.best(),
        }
    }

    /// Links the order in `slot` at the back of the level of its price,
    /// creating the level if needed.
    #[inline(always)]
    pub fn push_back(&mut self, orders: &mut Arena<Order>, slot: u32) {
        let (price, side, remaining) = {
            let order = orders.get(slot);
            (order.price, order.side, order.remaining())
        };
        let (level, prev) = self.append(orders, side, price, remaining, slot);
        let order = orders.get_mut(slot);
        order.prev = prev;
        order.next = NIL;
        order.level = level;
    }

    /// Puts `slot` at the back of the level at `price` on `side` (filing the
    /// level if needed) with `remaining` lots, and links the old tail to it.
    /// Returns the level's slot and the old tail: the order's `level` and
    /// `prev`, which the caller writes (its `next` is `NIL`).
    #[inline(always)]
    pub fn append(&mut self, orders: &mut Arena<Order>, side: Side, price: i64, remaining: u64, slot: u32) -> (u32, u32) {
        let book_side = match side {
            Side::Buy => &mut self.bids,
            Side::Sell => &mut self.asks,
        };
        let level_slot = book_side.open(price, &mut self.levels);
        let level = self.levels.get_mut(level_slot);
        let old_tail = level.tail;
        level.tail = slot;
        level.total_qty += remaining;
        if old_tail == NIL {
            level.head = slot;
        } else {
            orders.get_mut(old_tail).next = slot;
        }
        (level_slot, old_tail)
    }

    /// Unlinks the order in `slot` from its level, removing the level if it
    /// becomes empty. The order's `remaining()` must be what the level
    /// counted for it. Its own links are left as they were: every caller
    /// either frees the slot or files the order again, which writes them.
    #[inline(always)]
    pub fn unlink(&mut self, orders: &mut Arena<Order>, slot: u32) {
        // Only the fields unlinking needs: copying the whole record showed
        // in the instruction counts.
        let order = orders.get(slot);
        let (prev, next, level_slot) = (order.prev, order.next, order.level);
        let (remaining, side) = (order.remaining(), order.side);
        self.unlink_read(orders, prev, next, level_slot, remaining, side);
    }

    /// [`Book::unlink`] for a caller that has read the order's links,
    /// its level, its `remaining()` and its side.
    #[inline(always)]
    pub fn unlink_read(&mut self, orders: &mut Arena<Order>, prev: u32, next: u32, level_slot: u32, remaining: u64, side: Side) {
        debug_assert!(level_slot != NIL);
        if prev != NIL {
            orders.get_mut(prev).next = next;
        }
        if next != NIL {
            orders.get_mut(next).prev = prev;
        }
        let level = self.levels.get_mut(level_slot);
        if prev == NIL {
            level.head = next;
        }
        if next == NIL {
            level.tail = prev;
        }
        level.total_qty -= remaining;
        // The order was the level's only one: it is empty now.
        if prev == NIL && next == NIL {
            let price = level.price;
            let book_side = match side {
                Side::Buy => &mut self.bids,
                Side::Sell => &mut self.asks,
            };
            book_side.close(price, &mut self.levels);
        }
    }

    /// Takes `qty` off a level's total after a partial fill or an in-place
    /// reduction of one of its orders.
    #[inline]
    pub fn reduce_level(&mut self, level_slot: u32, qty: u64) {
        self.levels.get_mut(level_slot).total_qty -= qty;
    }

    /// How many orders the level in `level_slot` holds (a walk of its
    /// queue: for queries and snapshots, not for matching).
    pub fn order_count(&self, orders: &Arena<Order>, level_slot: u32) -> u32 {
        let mut count = 0;
        let mut slot = self.levels.get(level_slot).head;
        while slot != NIL {
            count += 1;
            slot = orders.get(slot).next;
        }
        count
    }

    #[inline]
    pub fn level(&self, level_slot: u32) -> &Level {
        self.levels.get(level_slot)
    }

    /// [`BookSide::check_all_slots`] for both sides.
    pub fn check_all_slots(&self) -> Result<(), String> {
        self.bids.check_all_slots(&self.levels)?;
        self.asks.check_all_slots(&self.levels)
    }
}

/// Does a limit of `limit` on `taker_side` cross a resting price `maker`?
#[inline]
pub fn crosses(taker_side: Side, limit: i64, maker: i64) -> bool {
    match taker_side {
        Side::Buy => maker <= limit,
        Side::Sell => maker >= limit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A small deterministic generator (tests only).
    struct Lcg(u64);
    impl Lcg {
        fn below(&mut self, n: u64) -> u64 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (self.0 >> 33) % n
        }
    }

    /// The window-and-far structure against a sorted map, over random
    /// inserts and removes around a drifting touch with far outliers: the
    /// best level, finding, and the order of every level agree after every
    /// step, on both sides.
    #[test]
    fn a_side_agrees_with_a_sorted_map() {
        for (side, seed) in [(Side::Buy, 1u64), (Side::Sell, 2), (Side::Buy, 3), (Side::Sell, 4)] {
            let mut rng = Lcg(seed);
            let mut ours = BookSide::new(side);
            let mut levels: Arena<Level> = Arena::new();
            let mut model: BTreeMap<i64, u32> = BTreeMap::new();
            let mut centre: i64 = 1_000_000;
            for step in 0..20_000 {
                // The touch drifts, sometimes far (past the window).
                if rng.below(500) == 0 {
                    centre += rng.below(3 * WINDOW as u64) as i64 - (3 * WINDOW as i64) / 2;
                }
                let price = if rng.below(20) == 0 { centre + rng.below(200_000) as i64 - 100_000 } else { centre + rng.below(2_000) as i64 - 1_000 };
                if let Some(&level) = model.get(&price) {
                    assert_eq!(ours.find(price), Some(level), "step {step}");
                    assert_eq!(ours.open(price, &mut levels), level, "step {step}: an open level is reused");
                    if rng.below(2) == 0 {
                        ours.close(price, &mut levels);
                        model.remove(&price);
                    }
                } else if model.len() < 3_000 {
                    assert_eq!(ours.find(price), None, "step {step}");
                    let level = ours.open(price, &mut levels);
                    assert_eq!(levels.get(level).price, price, "step {step}");
                    assert!(!model.values().any(|&l| l == level), "step {step}: slot {level} handed out twice");
                    model.insert(price, level);
                } else if let Some((&any, _)) = model.iter().nth(rng.below(model.len() as u64) as usize) {
                    ours.close(any, &mut levels);
                    model.remove(&any);
                }
                let best_model = match side {
                    Side::Buy => model.iter().next_back(),
                    Side::Sell => model.iter().next(),
                }
                .map(|(&price, &level)| LevelRef { price, level });
                assert_eq!(ours.best(), best_model, "{side:?} step {step}");
                assert_eq!(ours.len(), model.len());
                if step % 997 == 0 {
                    ours.check_all_slots(&levels).unwrap_or_else(|e| panic!("{side:?} step {step}: {e}"));
                    let listed: Vec<LevelRef> = ours.iter_best_first().collect();
                    let expected: Vec<LevelRef> = match side {
                        Side::Buy => model.iter().rev().map(|(&price, &level)| LevelRef { price, level }).collect(),
                        Side::Sell => model.iter().map(|(&price, &level)| LevelRef { price, level }).collect(),
                    };
                    assert_eq!(listed, expected, "{side:?} step {step}");
                }
            }
        }
    }

    /// Prices at the ends of `i64` do not overflow the window's arithmetic.
    #[test]
    fn extreme_prices_are_filed_without_overflow() {
        for side in [Side::Buy, Side::Sell] {
            let mut ours = BookSide::new(side);
            let mut levels: Arena<Level> = Arena::new();
            for price in [i64::MAX, i64::MIN, 0, i64::MAX - 1, i64::MIN + 1] {
                ours.open(price, &mut levels);
            }
            ours.check_all_slots(&levels).unwrap();
            assert_eq!(ours.len(), 5);
            let prices: Vec<i64> = ours.iter_best_first().map(|l| l.price).collect();
            let mut sorted = prices.clone();
            sorted.sort();
            if side == Side::Buy {
                sorted.reverse();
            }
            assert_eq!(prices, sorted);
            for price in [i64::MAX, i64::MIN, 0, i64::MAX - 1, i64::MIN + 1] {
                ours.close(price, &mut levels);
            }
            assert!(ours.is_empty());
            assert!(levels.is_empty(), "far levels are freed");
        }
    }
}
