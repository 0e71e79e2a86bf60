//! A paged slab: stable `u32` slot indices, a free list, and growth by whole
//! pages so that nothing already stored ever moves.
//!
//! Why pages rather than one `Vec`: a `Vec` that outgrows its capacity copies
//! every element (a latency spike proportional to the book's size, right in
//! the middle of a burst). Pages of `PAGE_SLOTS` (a power of two) are added
//! one at a time and never reallocated, and a slot index splits into page
//! and offset with a shift and a mask. Once the arena has grown to the
//! working set, inserting and removing allocate nothing: freed slots go on a
//! free stack and are reused first.

/// log2 of the slots per page.
const PAGE_SHIFT: u32 = 12;
pub const PAGE_SLOTS: usize = 1 << PAGE_SHIFT;
const PAGE_MASK: u32 = (PAGE_SLOTS as u32) - 1;

/// The "no slot" value, used as the null link in intrusive lists.
pub const NIL: u32 = u32::MAX;

pub struct Arena<T> {
    /// Fixed-size pages: the offset within a page is masked to
    /// `PAGE_SLOTS`, so only the page index needs a bounds check.
    pages: Vec<Box<[T; PAGE_SLOTS]>>,
    /// Slots handed out at least once (the high-water mark).
    used: u32,
    /// Freed slots, reused last-in first-out (the warmest in cache).
    free: Vec<u32>,
    live: u32,
}

impl<T: Copy + Default> Arena<T> {
    pub fn new() -> Self {
        Arena { pages: Vec::new(), used: 0, free: Vec::new(), live: 0 }
    }

    /// Stores `value` and returns its slot. Allocates only when every page
    /// is full (a new page) or the free stack must grow.
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

    /// A slot never handed out before, with a new page when the last is
    /// full.
    #[cold]
    fn fresh_slot(&mut self) -> u32 {
        let slot = self.used;
        assert!(slot != NIL, "arena full: {} slots", slot);
        if slot as usize == self.pages.len() * PAGE_SLOTS {
            let page: Box<[T]> = vec![T::default(); PAGE_SLOTS].into_boxed_slice();
            let page: Box<[T; PAGE_SLOTS]> = match page.try_into() {
                Ok(page) => page,
                Err(_) => unreachable!("a page has PAGE_SLOTS slots"),
            };
            self.pages.push(page);
        }
        self.used += 1;
        slot
    }

    /// Frees `slot`. The caller guarantees it is live.
    #[inline]
    pub fn remove(&mut self, slot: u32) {
        debug_assert!(slot < self.used);
        self.live -= 1;
        if self.free.len() == self.free.capacity() {
            // Grow the free stack ahead so that it can hold every slot ever
            // handed out: pushing onto it then never allocates.
            self.free.reserve(self.used as usize - self.free.len());
        }
        self.free.push(slot);
    }

    #[inline]
    pub fn get(&self, slot: u32) -> &T {
        &self.pages[(slot >> PAGE_SHIFT) as usize][(slot & PAGE_MASK) as usize]
    }

    #[inline]
    pub fn get_mut(&mut self, slot: u32) -> &mut T {
        &mut self.pages[(slot >> PAGE_SHIFT) as usize][(slot & PAGE_MASK) as usize]
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
        let slots: Vec<u32> = (0..(PAGE_SLOTS as u64 * 2 + 5)).map(|v| arena.insert(v)).collect();
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
