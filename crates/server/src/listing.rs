//! What the venue lists: its assets and instruments with the settings
//! that only the configuration has (an asset's decimals, an instrument's
//! FIX units), shared by the sequencer, the FIX gateway and market data.
//!
//! At start it is the configuration's. A reload (SIGHUP) that adds an
//! asset or an instrument journals the engine's `AddAsset` or
//! `AddInstrument`; the sequencer lists it here as the engine adds it
//! ([`Listing::added`]), from the definition the reload read
//! ([`Listing::define`]), before any later command is applied. The FIX
//! gateway reads the list as it is at each message; market data lists an
//! instrument when the command that added it is durable and reaches it,
//! so a REST client never sees a symbol whose adding a crash could undo.
//!
//! A listed entry never changes while the venue runs (a reload that
//! changes an asset's decimals or an instrument's FIX units takes effect
//! at the next start, like every setting but the accounts): a client's
//! prices do not change scale under it.

use std::sync::{Arc, Mutex, RwLock};

use crossbook_engine::{Command, EventKind, InstrumentSpec};

use crate::config::{AssetConfig, Config, ConfigError, InstrumentConfig};
use crate::fix::venue::FixInstrument;

/// The venue's list as it is at one moment.
#[derive(Clone, Debug)]
pub(crate) struct Listed {
    pub(crate) assets: Vec<AssetConfig>,
    pub(crate) instruments: Vec<InstrumentConfig>,
    /// `instruments` as FIX sees them, in the same order.
    pub(crate) fix: Vec<FixInstrument>,
}

impl Listed {
    pub(crate) fn of(config: &Config) -> Result<Listed, ConfigError> {
        Ok(Listed { assets: config.assets.clone(), instruments: config.instruments.clone(), fix: crate::fix::venue::instruments(&config.instruments)? })
    }

    pub(crate) fn instrument(&self, id: u32) -> Option<&InstrumentConfig> {
        self.instruments.iter().find(|i| i.id == id)
    }

    pub(crate) fn asset(&self, id: u32) -> Option<&AssetConfig> {
        self.assets.iter().find(|a| a.id == id)
    }
}

/// The list, and the definitions new entries are taken from.
pub(crate) struct Listing {
    current: RwLock<Arc<Listed>>,
    /// The configuration last read (at start or by a reload).
    defined: Mutex<(Vec<AssetConfig>, Vec<InstrumentConfig>)>,
}

impl Listing {
    /// What `engine` has of `config`'s assets and instruments, listed
    /// (on a lone venue, all of them: start-up journals what it lacks; a
    /// replicated node lists the rest as the log brings them), the file
    /// the definitions of what comes.
    pub(crate) fn new(config: &Config, engine: &crossbook_engine::Engine) -> Result<Listing, ConfigError> {
        let mut listed = Listed::of(config)?;
        listed.assets.retain(|a| engine.asset_name(a.id).is_some());
        let has = |id: u32| engine.instrument_spec(id).is_some();
        listed.fix.retain(|i| has(i.id));
        listed.instruments.retain(|i| has(i.id));
        Ok(Listing { current: RwLock::new(Arc::new(listed)), defined: Mutex::new((config.assets.clone(), config.instruments.clone())) })
    }

    /// The list as it is now.
    pub(crate) fn get(&self) -> Arc<Listed> {
        crate::read(&self.current).clone()
    }

    /// Where the assets and instruments added from now on take their
    /// settings from: `config`, just read (checked).
    pub(crate) fn define(&self, config: &Config) {
        *crate::lock(&self.defined) = (config.assets.clone(), config.instruments.clone());
    }

    /// What `config` (a reload just read) says otherwise of what is
    /// listed, each as a line for the log: such settings are kept until
    /// the next start (a client's prices do not change scale under it),
    /// which takes them.
    pub(crate) fn changed_by(&self, config: &Config) -> Vec<String> {
        let listed = self.get();
        let mut lines = Vec::new();
        for asset in &listed.assets {
            match config.assets.iter().find(|a| a.id == asset.id) {
                Some(file) if file.decimals != asset.decimals => lines.push(format!(
                    "asset {} ({}): decimals {} in the file, {} in use until the next start, which shows every {} amount at the new scale",
                    asset.id, asset.name, file.decimals, asset.decimals, asset.name
                )),
                _ => {}
            }
        }
        for instrument in &listed.instruments {
            let Some(file) = config.instruments.iter().find(|i| i.id == instrument.id) else { continue };
            for (what, in_file, in_use) in [("fix_price_unit", &file.fix_price_unit, &instrument.fix_price_unit), ("fix_qty_unit", &file.fix_qty_unit, &instrument.fix_qty_unit)] {
                if in_file != in_use {
                    lines.push(format!("instrument {} ({}): {what} {in_file:?} in the file, {in_use:?} in use until the next start", instrument.id, instrument.symbol));
                }
            }
        }
        lines
    }

    /// Lists what `command` added, if its `events` say the engine added
    /// it: with the definition read last when it has one that matches
    /// what the engine added, or else with the engine's own definition
    /// (an asset with no decimals, an instrument whose FIX units are one
    /// tick and one lot: a follower whose file lacks what its leader
    /// added). Returns a warning for the log in that case.
    pub(crate) fn added(&self, command: &Command, events: &[crossbook_engine::Event]) -> Option<String> {
        let added = events.iter().any(|e| matches!(e.kind, EventKind::AssetAdded { .. } | EventKind::InstrumentAdded { .. }));
        if !added {
            return None;
        }
        let defined = crate::lock(&self.defined).clone();
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        let mut listed = Listed::clone(&current);
        let warning = match *command {
            Command::AddAsset { id, name } => {
                if listed.asset(id).is_some() {
                    return None;
                }
                match defined.0.iter().find(|a| a.id == id && a.name == name.as_str()) {
                    Some(asset) => {
                        listed.assets.push(asset.clone());
                        None
                    }
                    None => {
                        listed.assets.push(AssetConfig { id, name: name.as_str().to_string(), decimals: 0 });
                        Some(format!("asset {id} ({name}) was added but this node's configuration does not define it: its amounts show in whole units (decimals 0) until it does and the node restarts"))
                    }
                }
            }
            Command::AddInstrument(spec) => {
                if listed.instrument(spec.id).is_some() {
                    return None;
                }
                let (instrument, warning) = match defined.1.iter().find(|i| i.spec().is_some_and(|s| s == spec)) {
                    Some(instrument) => (instrument.clone(), None),
                    None => (
                        InstrumentConfig::of_spec(&spec),
                        Some(format!(
                            "instrument {} ({}) was added but this node's configuration does not define it so: its prices and quantities show in ticks and lots until it does and the node restarts",
                            spec.id, spec.symbol
                        )),
                    ),
                };
                match crate::fix::venue::instruments(std::slice::from_ref(&instrument)) {
                    Ok(mut fix) => {
                        listed.fix.append(&mut fix);
                        listed.instruments.push(instrument);
                        warning
                    }
                    Err(why) => {
                        listed.fix.push(FixInstrument::of_spec(&spec));
                        listed.instruments.push(InstrumentConfig::of_spec(&spec));
                        Some(format!("instrument {} ({}): {why}; its FIX units are one tick and one lot", spec.id, spec.symbol))
                    }
                }
            }
            _ => return None,
        };
        *current = Arc::new(listed);
        warning
    }
}

impl InstrumentConfig {
    /// The engine's definition of this instrument (`None`: its symbol is
    /// not one the engine takes).
    pub(crate) fn spec(&self) -> Option<InstrumentSpec> {
        Some(InstrumentSpec {
            id: self.id,
            symbol: crossbook_engine::Symbol::new(&self.symbol)?,
            base: self.base,
            quote: self.quote,
            tick_size: self.tick_size,
            lot_size: self.lot_size,
            min_qty: self.min_qty,
            max_qty: self.max_qty,
            min_price: self.min_price,
            max_price: self.max_price,
            maker_bps: self.maker_bps,
            taker_bps: self.taker_bps,
        })
    }

    /// An instrument known from the engine's definition alone: FIX units
    /// of one tick and one lot.
    pub(crate) fn of_spec(spec: &InstrumentSpec) -> InstrumentConfig {
        InstrumentConfig {
            id: spec.id,
            symbol: spec.symbol.as_str().to_string(),
            base: spec.base,
            quote: spec.quote,
            tick_size: spec.tick_size,
            lot_size: spec.lot_size,
            min_qty: spec.min_qty,
            max_qty: spec.max_qty,
            min_price: spec.min_price,
            max_price: spec.max_price,
            maker_bps: spec.maker_bps,
            taker_bps: spec.taker_bps,
            fix_price_unit: "1".into(),
            fix_qty_unit: "1".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn added(kind: EventKind) -> Vec<crossbook_engine::Event> {
        vec![crossbook_engine::Event { seq: 9, kind }]
    }

    /// The listing of a venue set up from `config`.
    fn listing_of(config: &Config) -> Listing {
        let mut engine = crossbook_engine::Engine::new();
        let mut events = Vec::new();
        for command in config.setup_commands().expect("set-up") {
            engine.apply(&command, &mut events);
        }
        Listing::new(config, &engine).expect("listing")
    }

    #[test]
    fn lists_only_what_the_engine_has() {
        let config = Config::default();
        let listing = Listing::new(&config, &crossbook_engine::Engine::new()).expect("listing");
        assert!(listing.get().instruments.is_empty() && listing.get().assets.is_empty() && listing.get().fix.is_empty());
        let spec = config.instruments[0].spec().expect("spec");
        for asset in &config.assets {
            let name = crossbook_engine::Symbol::new(&asset.name).expect("name");
            assert_eq!(listing.added(&Command::AddAsset { id: asset.id, name }, &added(EventKind::AssetAdded { asset: asset.id, name })), None);
        }
        assert_eq!(listing.added(&Command::AddInstrument(spec), &added(EventKind::InstrumentAdded { instrument: spec.id, symbol: spec.symbol })), None, "defined by the file");
        assert_eq!(listing.get().instruments.len(), 1);
        assert_eq!(listing_of(&config).get().instruments.len(), 1);
    }

    #[test]
    fn lists_an_added_instrument_with_its_configured_units_and_keeps_listed_ones() {
        let config = Config::default();
        let listing = listing_of(&config);
        let mut next = config.clone();
        next.assets.push(AssetConfig { id: 3, name: "ETH".into(), decimals: 8 });
        let mut eth = next.instruments[0].clone();
        (eth.id, eth.symbol, eth.base, eth.fix_price_unit, eth.fix_qty_unit) = (2, "ETH-USD".into(), 3, "0.01".into(), "0.001".into());
        next.instruments.push(eth.clone());
        // What the file says of a listed instrument changes nothing now.
        next.instruments[0].fix_price_unit = "0.5".into();
        listing.define(&next);
        let name = crossbook_engine::Symbol::new("ETH").expect("name");
        assert_eq!(listing.added(&Command::AddAsset { id: 3, name }, &added(EventKind::AssetAdded { asset: 3, name })), None);
        let spec = eth.spec().expect("spec");
        // Refused by the engine: nothing listed.
        assert_eq!(listing.added(&Command::AddInstrument(spec), &[]), None);
        assert!(listing.get().instrument(2).is_none());
        assert_eq!(listing.added(&Command::AddInstrument(spec), &added(EventKind::InstrumentAdded { instrument: 2, symbol: spec.symbol })), None);
        let listed = listing.get();
        assert_eq!(listed.asset(3).map(|a| a.decimals), Some(8));
        let fix = listed.fix.iter().find(|f| f.id == 2).expect("fix");
        assert_eq!((fix.price_unit.to_text(), fix.qty_unit.to_text()), ("0.01".to_string(), "0.001".to_string()));
        assert_eq!(listed.fix[0].price_unit.to_text(), config.instruments[0].fix_price_unit);
        assert_eq!(listed.instruments.len(), listed.fix.len());
    }

    #[test]
    fn a_reload_that_changes_a_listed_setting_is_told_it_waits_for_the_next_start() {
        let config = Config::default();
        let listing = listing_of(&config);
        assert_eq!(listing.changed_by(&config), Vec::<String>::new());
        let mut next = config.clone();
        next.assets[1].decimals += 1;
        next.instruments[0].fix_qty_unit = "0.5".into();
        let lines = listing.changed_by(&next);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].starts_with(&format!("asset {} ({}): decimals {} in the file, {} in use", next.assets[1].id, next.assets[1].name, next.assets[1].decimals, config.assets[1].decimals)), "{lines:?}");
        assert!(lines[1].contains("fix_qty_unit \"0.5\" in the file"), "{lines:?}");
    }

    #[test]
    fn an_instrument_the_file_defines_otherwise_is_listed_from_the_engine_with_a_warning() {
        let config = Config::default();
        let listing = listing_of(&config);
        let mut spec = config.instruments[0].spec().expect("spec");
        (spec.id, spec.symbol) = (7, crossbook_engine::Symbol::new("X-USD").expect("symbol"));
        let warning = listing.added(&Command::AddInstrument(spec), &added(EventKind::InstrumentAdded { instrument: 7, symbol: spec.symbol }));
        assert!(warning.is_some_and(|w| w.contains("instrument 7 (X-USD)")), "a warning");
        let listed = listing.get();
        let fix = listed.fix.iter().find(|f| f.id == 7).expect("listed");
        assert_eq!((fix.price_unit.to_text(), fix.qty_unit.to_text()), ("1".to_string(), "1".to_string()));
    }
}
