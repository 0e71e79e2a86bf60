//! Same seed, same commands; same commands, same events: in process and
//! through the `crossbook` binary.

use crate::support::*;
use crossbook_workload::{Workload, generate};
use std::process::Command as Process;

#[test]
fn generators_are_deterministic_and_seeds_differ() {
    for workload in Workload::ALL {
        // Past the set-up (multi-symbol's is about 400,000 commands long).
        let count = if workload == Workload::MultiSymbol { 420_000 } else { 8_000 };
        let a = commands_text(&generate(workload, 11, count));
        let b = commands_text(&generate(workload, 11, count));
        let c = commands_text(&generate(workload, 12, count));
        assert!(a == b, "{}: same seed, different commands", workload.name());
        assert!(a != c, "{}: seeds 11 and 12 gave the same commands", workload.name());
    }
}

#[test]
fn command_text_round_trips() {
    let commands = generate(Workload::Mixed, 5, 5_000);
    let text = commands_text(&commands);
    assert_eq!(crossbook_text::parse_commands(&text).unwrap(), commands);
}

fn crossbook(args: &[&str]) -> std::process::Output {
    let output = Process::new(env!("CARGO_BIN_EXE_crossbook")).args(args).output().expect("run crossbook");
    assert!(output.status.success(), "crossbook {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    output
}

#[test]
fn crossbook_run_is_repeatable_and_prints_the_event_hash() {
    let dir = std::env::temp_dir().join(format!("crossbook-det-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("mixed.txt");
    let generated = crossbook(&["gen", "--workload", "mixed", "--seed", "9", "--commands", "3000"]);
    std::fs::write(&file, &generated.stdout).unwrap();
    let path = file.to_str().unwrap();
    let first = crossbook(&["run", "--commands", path]);
    let second = crossbook(&["run", "--commands", path]);
    assert_eq!(first.stdout, second.stdout);
    assert_eq!(first.stderr, second.stderr);
    // The hash on stderr is the SHA-256 of exactly what went to stdout.
    let stderr = String::from_utf8(first.stderr).unwrap();
    let line = stderr.lines().find(|l| l.starts_with("events-sha256 ")).expect("hash line");
    let hash = line.trim_start_matches("events-sha256 ");
    assert_eq!(hash.len(), 64);
    let expected = sha256_hex(&first.stdout);
    assert_eq!(hash, expected);
    // And it is the same stream as the library produces.
    let commands = crossbook_text::parse_commands(&String::from_utf8(generated.stdout).unwrap()).unwrap();
    assert_eq!(events_text(&commands), first.stdout);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn crossbook_run_refuses_a_malformed_command_file_with_its_line() {
    let dir = std::env::temp_dir().join(format!("crossbook-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.txt");
    std::fs::write(&file, "open account=1\n# fine so far\nplace account=1 side=sideways\n").unwrap();
    let output = Process::new(env!("CARGO_BIN_EXE_crossbook"))
        .args(["run", "--commands", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(output.stdout.is_empty(), "nothing is run from a malformed file");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("line 3"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}
