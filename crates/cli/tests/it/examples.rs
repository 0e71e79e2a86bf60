//! The hand-written scenarios in `reference/examples/`: each `NAME.txt` is a
//! command file and `NAME.events` the events the rules in `docs/engine.md`
//! call for, worked out by hand. Both implementations must produce them.

use crate::support::*;

#[test]
fn engine_reproduces_every_hand_written_example() {
    let dir = repo_root().join("reference/examples");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "txt"))
        .collect();
    names.sort();
    assert!(names.len() >= 8, "expected the example scenarios in {}", dir.display());
    let mut failures = Vec::new();
    for path in &names {
        let text = std::fs::read_to_string(path).unwrap();
        let commands = crossbook_text::parse_commands(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let expected = std::fs::read(path.with_extension("events")).unwrap();
        if let Some((line, ours, want)) = first_difference(&events_text(&commands), &expected) {
            failures.push(format!("{}: line {line}\n  engine:   {ours}\n  expected: {want}", path.display()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn reference_model_reproduces_every_hand_written_example() {
    let script = repo_root().join("reference/check_examples.py");
    let output = std::process::Command::new("python3").arg(&script).output().expect("run python3");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.trim_end().ends_with(" 0 failed"), "{stdout}");
}

/// A command file is refused at its first bad line, whether that line is
/// a syntax error or not UTF-8 (docs/formats.md, "Command file").
#[test]
fn a_command_file_is_refused_at_its_first_bad_line() {
    let dir = TempDir::new("first-bad-line");
    let run = |name: &str, bytes: &[u8]| {
        let path = dir.0.join(name);
        std::fs::write(&path, bytes).unwrap();
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_crossbook")).args(["run", "--commands", path.to_str().unwrap()]).output().unwrap();
        assert!(!output.status.success() && output.stdout.is_empty(), "{name}");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let said = run("syntax-first.txt", b"asset id=x name=A\nasset id=2 name=\xff\n");
    assert!(said.contains("line 1"), "{said}");
    let said = run("utf8-first.txt", b"asset id=1 name=A\nasset id=2 name=\xff\nasset id=x name=B\n");
    assert!(said.contains("line 2: not UTF-8"), "{said}");
}
