//! `crossbook compat exchange-core`: the check of `crossbook-compat`,
//! printed.

use anyhow::{Result, bail};
use std::path::Path;

pub fn run(dir: &Path) -> Result<()> {
    let agreement = crossbook_compat::check(dir)?;
    println!("{} commands, {} trades and {} reduces checked, final book of {} levels", agreement.commands, agreement.trades, agreement.reduces, agreement.levels);
    if let Some(difference) = &agreement.first_difference {
        println!("{difference}");
    }
    println!("{} passed, {} failed", agreement.passed, agreement.failed);
    if agreement.failed > 0 {
        bail!("crossbook disagrees with exchange-core on {} check(s)", agreement.failed);
    }
    Ok(())
}
