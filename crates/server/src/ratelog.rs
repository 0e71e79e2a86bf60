//! Log lines that a flood could multiply (a refused or evicted connection,
//! a failed login), kept to a few a second per kind: past
//! `LINES_PER_SECOND` in a second, lines of that kind are counted, and one
//! line says how many were left out once the second is over.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Lines of one kind logged in full per second.
const LINES_PER_SECOND: u32 = 5;
const WINDOW: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Kind {
    logged: u32,
    left_out: u64,
}

pub(crate) struct RateLog {
    since: Instant,
    kinds: BTreeMap<&'static str, Kind>,
}

impl Default for RateLog {
    fn default() -> Self {
        RateLog { since: Instant::now(), kinds: BTreeMap::new() }
    }
}

impl RateLog {
    /// Logs `line()` unless `kind` already had its lines this second.
    pub(crate) fn line(&mut self, kind: &'static str, line: impl FnOnce() -> String) {
        self.tick();
        let entry = self.kinds.entry(kind).or_default();
        if entry.logged < LINES_PER_SECOND {
            entry.logged += 1;
            crate::log(&line());
        } else {
            entry.left_out += 1;
        }
    }

    /// Ends the second once it is over: one line per kind with lines left
    /// out.
    pub(crate) fn tick(&mut self) {
        if self.since.elapsed() >= WINDOW {
            self.flush();
        }
    }

    /// Says what was left out so far (at shutdown), and starts a new second.
    pub(crate) fn flush(&mut self) {
        for (kind, entry) in std::mem::take(&mut self.kinds) {
            if entry.left_out > 0 {
                crate::log(&format!("... and {} more {kind} lines in the last {:.1} s", entry.left_out, self.since.elapsed().as_secs_f64()));
            }
        }
        self.since = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_logs_a_few_lines_and_a_count() {
        let mut log = RateLog::default();
        for _ in 0..1000 {
            log.line("refused", || "refused connection".into());
        }
        assert_eq!(log.kinds["refused"].logged, LINES_PER_SECOND);
        assert_eq!(log.kinds["refused"].left_out, 1000 - u64::from(LINES_PER_SECOND));
        log.since -= WINDOW;
        log.tick();
        assert!(log.kinds.is_empty());
    }
}
