//! The Rust engine against the Python reference model (`reference/model.py`),
//! byte for byte, over the `mixed` workload.

use crate::support::*;
use crossbook_workload::{Workload, generate};
use std::process::Command as Process;

fn python() -> &'static str {
    "python3"
}

fn model_events(file: &std::path::Path) -> Vec<u8> {
    let model = repo_root().join("reference/model.py");
    let output = Process::new(python())
        .arg(&model)
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} {}: {e}", python(), model.display()));
    assert!(
        output.status.success(),
        "reference model failed on {}: {}",
        file.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

fn check_seed(seed: u64, count: usize, dir: &std::path::Path) -> Result<(), String> {
    check_commands(seed, &generate(Workload::Mixed, seed, count), "mixed", dir)
}

fn check_commands(seed: u64, commands: &[crossbook_engine::Command], name: &str, dir: &std::path::Path) -> Result<(), String> {
    let count = commands.len();
    let file = dir.join(format!("{name}-{seed}.txt"));
    std::fs::write(&file, commands_text(commands)).map_err(|e| e.to_string())?;
    let ours = events_text(commands);
    let theirs = model_events(&file);
    match first_difference(&ours, &theirs) {
        None => Ok(()),
        Some((line, rust, python)) => Err(format!(
            "seed {seed}: event files differ at line {line}\n  rust:   {rust}\n  python: {python}\n  \
             reproduce ({name}): crossbook gen --workload mixed --seed {seed} --commands {count} > f && \
             diff <(crossbook run --commands f) <(python3 reference/model.py f)"
        )),
    }
}

/// 32 seeds x 20,000 commands by default (`CROSSBOOK_SEEDS`,
/// `CROSSBOOK_COMMANDS` to change), two seeds at a time.
#[test]
fn rust_engine_matches_python_reference_model() {
    let seeds = seeds(32);
    let count = commands_per_run(20_000);
    let dir = std::env::temp_dir().join(format!("crossbook-diff-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let failures: Vec<String> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..2)
            .map(|worker| {
                let seeds = &seeds;
                let dir = &dir;
                scope.spawn(move || {
                    seeds
                        .iter()
                        .skip(worker)
                        .step_by(2)
                        .filter_map(|&seed| check_seed(seed, count, dir).err())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().unwrap()).collect()
    });
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{} of {} seeds differ:\n{}", failures.len(), seeds.len(), failures.join("\n"));
}

/// The reference model checks the invariants itself after every command
/// (`--check`): a second, independent invariant checker.
#[test]
fn reference_model_invariants_hold_on_mixed_runs() {
    let dir = std::env::temp_dir().join(format!("crossbook-pycheck-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for seed in [101, 202] {
        let commands = generate(Workload::Mixed, seed, 10_000);
        let file = dir.join(format!("mixed-{seed}.txt"));
        std::fs::write(&file, commands_text(&commands)).unwrap();
        let model = repo_root().join("reference/model.py");
        let output = Process::new(python()).arg(&model).arg("--check").arg(&file).output().unwrap();
        assert!(output.status.success(), "seed {seed}: {}", String::from_utf8_lossy(&output.stderr));
        assert_eq!(output.stdout, events_text(&commands), "seed {seed}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Halts and resumes over `mixed`: places and replaces on a halted
/// instrument refused, cancels and amends taken, the same as the model.
#[test]
fn rust_engine_matches_python_reference_model_with_halts() {
    let dir = std::env::temp_dir().join(format!("crossbook-diff-halts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut failures = Vec::new();
    let mut refused = 0;
    for seed in seeds(8).into_iter().take(8) {
        let commands = with_halts(generate(Workload::Mixed, seed, commands_per_run(20_000)), seed);
        let events = events_text(&commands);
        refused += String::from_utf8_lossy(&events).matches("reason=instrument_halted").count();
        failures.extend(check_commands(seed, &commands, "halts", &dir).err());
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(refused > 100, "the runs refused only {refused} commands for a halt: they test little");
}
