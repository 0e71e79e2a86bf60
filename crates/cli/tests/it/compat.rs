//! crossbook against exchange-core on exchange-core's own single-pair
//! benchmark flow: every trade, every reduce, the final book.

use crate::support::repo_root;
use std::process::Command;

#[test]
fn crossbook_matches_exchange_core_trade_for_trade() {
    let flow = repo_root().join("../shared/workloads/exchange-core-singlepair");
    if !flow.join("commands.csv.gz").is_file() {
        eprintln!(
            "SKIPPED: the exchange-core flow is not at {} (it lives in the shared folder beside the repository); \
             this test cannot run without it",
            flow.display()
        );
        return;
    }
    let output = Command::new(env!("CARGO_BIN_EXE_crossbook"))
        .args(["compat", "exchange-core", "--flow", flow.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("1001000 commands, 40430 trades and 140025 reduces checked"), "{stdout}");
    assert_eq!(stdout.lines().last(), Some("1001001 passed, 0 failed"), "{stdout}");
}
