//! The bench report and `--compare`: the JSON round-trips, an identical
//! build passes, a deliberately slowed one and one that computes different
//! events are caught.

use std::process::{Command, Output};

fn crossbook(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_crossbook")).args(args).output().expect("run crossbook")
}

fn baseline(dir: &std::path::Path) -> std::path::PathBuf {
    let output = crossbook(&["bench", "--workload", "mixed", "--commands", "100000", "--seed", "3", "--format", "json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("the report is JSON");
    for field in [
        "commands_per_s",
        "orders_per_s",
        "trades_per_s",
        "latency_ns",
        "stages_ns_per_command",
        "events_sha256",
        "command_line",
        "git_commit",
        "git_dirty",
        "build_profile",
        "cpu_model",
        "date",
    ] {
        assert!(report.get(field).is_some(), "report lacks {field}: {report}");
    }
    assert_eq!(report["commands"], 100000);
    assert!(report["latency_ns"]["p99.9"].as_u64().is_some());
    let path = dir.join("baseline.json");
    std::fs::write(&path, &output.stdout).unwrap();
    path
}

#[test]
fn compare_passes_the_same_build_and_flags_a_slow_or_different_one() {
    let dir = std::env::temp_dir().join(format!("crossbook-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = baseline(&dir);
    let path_str = path.to_str().unwrap();

    // The same build, with room for a shared machine's noise (another
    // test's server on the same cores can halve a short run's speed and
    // double its latency: only a p50 three times the baseline's is
    // flagged); the slow build below is 10 times slower.
    let same = crossbook(&["bench", "--compare", path_str, "--threshold", "200"]);
    let text = String::from_utf8_lossy(&same.stdout);
    assert!(same.status.success(), "{text}\n{}", String::from_utf8_lossy(&same.stderr));
    assert!(text.contains("events_sha256 same") && text.contains("no regression"), "{text}");

    // A build that spends 5 us more on every command.
    let slow = crossbook(&["bench", "--compare", path_str, "--threshold", "75", "--slow-ns", "5000"]);
    let text = String::from_utf8_lossy(&slow.stdout);
    assert!(!slow.status.success(), "a 5 us/command slowdown passed:\n{text}");
    assert!(text.contains("REGRESSION"), "{text}");
    assert!(String::from_utf8_lossy(&slow.stderr).contains("commands_per_s"));

    // A build whose events differ from the baseline's.
    let mut report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    report["events_sha256"] = serde_json::Value::String("0".repeat(64));
    let altered = dir.join("altered.json");
    std::fs::write(&altered, serde_json::to_string(&report).unwrap()).unwrap();
    let different = crossbook(&["bench", "--compare", altered.to_str().unwrap(), "--threshold", "75"]);
    assert!(!different.status.success());
    assert!(String::from_utf8_lossy(&different.stderr).contains("different events"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--journal DIR` writes and removes journals there: a directory with
/// anything else in it is refused and left as it was; a new one is made
/// and gone at the end; one an earlier bench left (its marker) is taken.
#[test]
fn the_journal_bench_never_empties_a_directory_it_does_not_own() {
    let dir = std::env::temp_dir().join(format!("crossbook-bench-scratch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let bench = |dir: &std::path::Path| crossbook(&["bench", "--workload", "mixed", "--commands", "2000", "--no-latency", "--journal", dir.to_str().unwrap()]);

    let theirs = dir.join("theirs");
    std::fs::create_dir_all(theirs.join("sync")).unwrap();
    std::fs::write(theirs.join("notes.txt"), "keep me").unwrap();
    let output = bench(&theirs);
    assert!(!output.status.success(), "a directory with files in it is refused");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("is not empty") && stderr.contains(".crossbook-bench"), "{stderr}");
    assert_eq!(std::fs::read_to_string(theirs.join("notes.txt")).unwrap(), "keep me");
    assert!(theirs.join("sync").is_dir());

    let new = dir.join("new");
    let output = bench(&new);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stdout).contains("journal"), "the report has the journal's figures");
    assert!(!new.exists(), "the bench's own directory is removed at the end");

    // One a bench left (stopped before its end, say): taken again.
    let left = dir.join("left");
    std::fs::create_dir_all(left.join("sync")).unwrap();
    std::fs::write(left.join(".crossbook-bench"), "").unwrap();
    let output = bench(&left);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    std::fs::remove_dir_all(&dir).unwrap();
}
