//! crossbook's integration tests: one binary, a module per area.

mod alloc;
mod bench;
mod compat;
mod determinism;
mod differential;
mod examples;
mod failures;
mod fix;
mod hostile;
mod invariants;
mod journal;
mod marketdata;
mod powercut;
mod replication;
mod restart;
mod rules;
mod serve;
mod snapshot;
mod trading;
mod workloads;
mod support;
