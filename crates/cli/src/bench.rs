//! `crossbook bench`: the harness lives in `crossbook-bench`
//! (`crossbook_bench::harness`); this binary parses the flags into its
//! options.

pub use crossbook_bench::harness::{EXCHANGE_CORE_SINGLE, Options, WorkloadSource, run};
