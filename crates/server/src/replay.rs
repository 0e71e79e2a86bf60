//! Start-up: every journaled command handed to the gateways again, so that
//! they rebuild what they had sent before the restart (reports are a
//! function of the journal: replaying it through a [`ReportBuilder`]
//! gives every report exactly as it was given live).
//!
//! One thread reads, checks and decodes the journal while this one applies
//! and hands each command to the sinks ([`ReportSink::recovered`]).

use crate::ServeError;
use crate::sink::{Durable, ReportSink};
use crossbook_engine::{Command, Engine};
use crossbook_journal::Corruption;
use crossbook_protocol::reports::ReportBuilder;
use std::path::{Path, PathBuf};
use std::sync::mpsc::sync_channel;
use std::thread;

/// Commands handed from the journal reader to the applying thread at a
/// time.
const BATCH: usize = 4096;

type Decoded = (u64, Command, Option<Vec<u8>>);

/// Re-applies the journal in `dir` up to `through` on a fresh engine and
/// hands every command, with its reports, to each of `sinks` in order.
pub(crate) fn replay_journal(dir: &Path, through: u64, sinks: &mut [&mut dyn ReportSink]) -> Result<(), ServeError> {
    let (sender, receiver) = sync_channel::<Vec<Decoded>>(4);
    let reader_dir: PathBuf = dir.to_path_buf();
    let reader = thread::Builder::new()
        .name("history-reader".into())
        .spawn(move || -> Result<(), Corruption> {
            let mut batch = Vec::with_capacity(BATCH);
            let result = crossbook_journal::scan(&reader_dir, |seq, payload| {
                if seq > through {
                    return Ok(());
                }
                let (command, annex) = crossbook_journal::format::split_payload(payload)?;
                batch.push((seq, command, annex.map(<[u8]>::to_vec)));
                if batch.len() == BATCH {
                    let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
                    sender.send(full).map_err(|_| "the applying thread stopped".to_string())?;
                }
                Ok(())
            });
            if result.is_ok() && !batch.is_empty() {
                let _ = sender.send(batch);
            }
            result.map(|_| ())
        })
        .map_err(ServeError::io("starting the history reader thread"))?;
    let mut engine = Engine::new();
    let mut builder = ReportBuilder::new();
    let mut events = Vec::new();
    let mut reports = Vec::new();
    for batch in receiver {
        for (seq, command, annex) in batch {
            events.clear();
            reports.clear();
            engine.apply(&command, &mut events);
            builder.reports(&command, &events, &mut reports);
            let durable = Durable { seq, command: &command, annex: annex.as_deref(), reports: &reports, events: &events };
            for sink in sinks.iter_mut() {
                sink.recovered(&durable);
            }
        }
    }
    match reader.join() {
        Ok(result) => result.map_err(ServeError::History),
        Err(_) => Err(ServeError::Io { what: "the history reader thread".into(), source: std::io::Error::other("panicked") }),
    }
}
