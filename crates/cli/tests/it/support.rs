//! Shared helpers: running commands through the engine, locating the repo.

use crossbook_engine::{Command, Engine, Event};
use std::path::{Path, PathBuf};

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The event file text for `commands`, as `crossbook run` writes it.
pub fn events_text(commands: &[Command]) -> Vec<u8> {
    let mut engine = Engine::new();
    let mut events: Vec<Event> = Vec::new();
    let mut text = Vec::new();
    let mut balance_lines = crossbook_engine::BalanceLines::new();
    for command in commands {
        events.clear();
        engine.apply(command, &mut events);
        balance_lines.append(&engine, &mut events);
        for event in &events {
            crossbook_text::write_event(&mut text, event);
        }
    }
    text
}

/// The command file text for `commands`, as `crossbook gen` writes it.
pub fn commands_text(commands: &[Command]) -> String {
    let mut text = String::new();
    for command in commands {
        crossbook_text::write_command(&mut text, command);
        text.push('\n');
    }
    text
}

/// First differing line of two event files, for a readable failure.
pub fn first_difference(left: &[u8], right: &[u8]) -> Option<(usize, String, String)> {
    let left = String::from_utf8_lossy(left);
    let right = String::from_utf8_lossy(right);
    let mut a = left.lines();
    let mut b = right.lines();
    let mut line = 0;
    loop {
        line += 1;
        match (a.next(), b.next()) {
            (None, None) => return None,
            (x, y) if x == y => continue,
            (x, y) => return Some((line, x.unwrap_or("<end>").to_string(), y.unwrap_or("<end>").to_string())),
        }
    }
}

/// A seed list from `CROSSBOOK_SEEDS` (a count) or the default count.
pub fn seeds(default: u64) -> Vec<u64> {
    let count = std::env::var("CROSSBOOK_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    (1..=count).collect()
}

/// Commands per random run, from `CROSSBOOK_COMMANDS` or the default.
pub fn commands_per_run(default: usize) -> usize {
    std::env::var("CROSSBOOK_COMMANDS").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A directory under the system's temporary directory, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("crossbook-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
}

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // CROSSBOOK_KEEP=1 leaves it for a look after a failure.
        if std::env::var_os("CROSSBOOK_KEEP").is_some() {
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `a b` number pairs of a file, one per line (what `crossbook load
/// --acked-out` and `--last-seen-out` write).
pub fn number_pairs(path: &Path) -> Vec<(u64, u64)> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| {
            let (a, b) = l.split_once(' ').unwrap_or_else(|| panic!("{}: {l:?}", path.display()));
            (a.parse().unwrap(), b.parse().unwrap())
        })
        .collect()
}

/// `mixed` with trading halted and resumed now and then on its
/// instruments (and the refusals: a halt of a halted instrument, a resume
/// of one that trades, an unknown instrument), placed by a small
/// generator of its own so that `mixed` itself is unchanged.
pub fn with_halts(commands: Vec<crossbook_engine::Command>, seed: u64) -> Vec<crossbook_engine::Command> {
    use crossbook_engine::Command;
    let instruments: Vec<u32> = commands.iter().filter_map(|c| if let Command::AddInstrument(spec) = c { Some(spec.id) } else { None }).collect();
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut halted = std::collections::BTreeSet::new();
    let mut out = Vec::with_capacity(commands.len() + commands.len() / 100);
    for command in commands {
        let trading = matches!(command, Command::Place(_) | Command::Cancel { .. } | Command::Replace { .. } | Command::Amend { .. } | Command::CancelAll { .. });
        out.push(command);
        if !trading || next() % 150 != 0 {
            continue;
        }
        let roll = next();
        let instrument = instruments[(roll % instruments.len() as u64) as usize];
        out.push(match roll % 17 {
            // Now and then what the engine refuses.
            0 => Command::Halt { instrument: 999 },
            1 => Command::Resume { instrument },
            2 => Command::Halt { instrument },
            _ if halted.contains(&instrument) => {
                halted.remove(&instrument);
                Command::Resume { instrument }
            }
            _ => {
                halted.insert(instrument);
                Command::Halt { instrument }
            }
        });
    }
    out
}
