//! A slab: stable `u32` slot indices into one `Vec`, and a free list.
//!
//! Once the arena has grown to the working set, inserting and removing
//! allocate nothing: freed slots go on a free stack and are reused first.
//!
//! # One `Vec`, not pages
//!
//! This arena was paged until 2026-11-25 (pages of 4,096 slots added one at
//! a time, never moved), so that outgrowing the capacity never copied the
//! book. Every access then went through the page table: a shift, a bounds
//! check on the page vector, a load of the page pointer and a mask, on
//! every order and level touched. One `Vec` is a bounds check and an
//! index: `steady-deep` 727 -> 699 and `exchange-core-single` 520 -> 490
//! instructions per command (`scripts/instructions W 200000 400000`).
//!
//! What the pages bought is small on Linux: a `Vec` of orders that doubles
//! past a few megabytes is a block glibc `realloc`s with `mremap`, which
//! moves page-table entries, not the bytes. Growing 1,048,576 -> 2,097,152
//! orders (80 -> 160 MiB) took 0.5 ms and 4,194,304 -> 8,388,608 1.2 ms on
//! this machine, in line with the page faults of first touching fresh
//! memory that either design pays (0.1-0.4 ms here and there), and it
//! happens only when the number of resting orders reaches a new
//! power-of-two high.

/// The least a growing arena adds (slots).
const MIN_GROWTH: usize = 4096;

/// A boxed array of `N` copies of `value`, built on the heap (`Box::new` of
/// a large array may build it on the stack first). Fixed-size arrays let an
/// index known to be in range go without a bounds check.
pub(crate) fn boxed_array<T: Copy, const N: usize>(value: T) -> Box<[T; N]> {
    match vec![value; N].into_boxed_slice().try_into() {
        Ok(array) => array,
        Err(_) => unreachable!("a vector of N elements"),
    }
}

/// The "no slot" value, used as the null link in intrusive lists.
pub const NIL: u32 = u32::MAX;

pub struct Arena<T> {
    slots: Vec<T>,
    /// Freed slots, reused last-in first-out (the warmest in cache).
    free: Vec<u32>,
    live: u32,
}

impl<T: Copy + Default> Arena<T> {
    pub fn new() -> Self {
        Arena { slots: Vec::new(), free: Vec::new(), live: 0 }
    }

    /// Stores `value` and returns its slot.
    #[inline]
    pub fn insert(&mut self, value: T) -> u32 {
        let slot = self.alloc();
        *self.get_mut(slot) = value;
        slot
    }

    /// A slot to fill: its contents are whatever it held last. Writing the
    /// value through [`Arena::get_mut`] builds it in place (`insert` of a
    /// large value copies it from the stack).
    #[inline]
    pub fn alloc(&mut self) -> u32 {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => self.fresh_slot(),
        };
        self.live += 1;
        slot
    }

    #[cold]
    fn fresh_slot(&mut self) -> u32 {
        let slot = self.slots.len() as u32;
        assert!(slot != NIL, "arena full: {} slots", slot);
        if self.slots.len() == self.slots.capacity() {
            self.slots.reserve(self.slots.len().max(MIN_GROWTH));
        }
        self.slots.push(T::default());
        slot
    }

    /// Frees `slot`. The caller guarantees it is live.
    #[inline]
    pub fn remove(&mut self, slot: u32) {
        debug_assert!((slot as usize) < self.slots.len());
        self.live -= 1;
        if self.free.len() == self.free.capacity() {
            // Grow the free stack ahead so that it can hold every slot ever
            // handed out: pushing onto it then never allocates.
            self.free.reserve(self.slots.len() - self.free.len());
        }
        self.free.push(slot);
    }

    #[inline]
    pub fn get(&self, slot: u32) -> &T {
        &self.slots[slot as usize]
    }

    #[inline]
    pub fn get_mut(&mut self, slot: u32) -> &mut T {
        &mut self.slots[slot as usize]
    }

    /// Number of live slots.
    pub fn len(&self) -> usize {
        self.live as usize
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }
}

impl<T: Copy + Default> Default for Arena<T> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_stable_and_reused() {
        let mut arena: Arena<u64> = Arena::new();
        let slots: Vec<u32> = (0..(MIN_GROWTH as u64 * 2 + 5)).map(|v| arena.insert(v)).collect();
        for (value, &slot) in slots.iter().enumerate() {
            assert_eq!(*arena.get(slot), value as u64);
        }
        arena.remove(slots[7]);
        arena.remove(slots[8000]);
        assert_eq!(arena.len(), slots.len() - 2);
        // Last freed, first reused.
        assert_eq!(arena.insert(42), slots[8000]);
        assert_eq!(arena.insert(43), slots[7]);
        assert_eq!(*arena.get(slots[7]), 43);
        assert_eq!(*arena.get(slots[8]), 8, "neighbours untouched");
    }
}
