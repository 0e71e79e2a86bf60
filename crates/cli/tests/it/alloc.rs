//! Zero heap allocations per order in steady state, counted by a global
//! allocator that tallies the allocations of the current thread only (other
//! tests run on other threads at the same time).

use crossbook_engine::Engine;
use crossbook_workload::{Workload, generate};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(|c| c.get())
}

fn steady_state_allocations(workload: crossbook_workload::Workload, warm: usize, measured: usize) -> u64 {
    let commands = generate(workload, 1, warm + measured);
    let mut engine = Engine::new();
    let mut events = Vec::with_capacity(4096);
    for command in &commands[..warm] {
        events.clear();
        engine.apply(command, &mut events);
    }
    let before = allocations();
    for command in &commands[warm..] {
        events.clear();
        engine.apply(command, &mut events);
    }
    allocations() - before
}

#[test]
fn steady_deep_allocates_nothing_once_warm() {
    let count = steady_state_allocations(Workload::SteadyDeep, 50_000, 200_000);
    assert_eq!(count, 0, "{count} heap allocations in 200,000 steady-state commands");
}

#[test]
fn the_counter_sees_allocations() {
    let before = allocations();
    let v: Vec<u64> = Vec::with_capacity(10);
    drop(v);
    assert_eq!(allocations() - before, 1);
}
