//! The snapshotter thread: writes the states the sequencer offers, once
//! the journal has synced everything they cover.

use crate::checkpoint;
use crate::sink::Checkpoint;
use crate::{ServeError, log};
use crossbook_journal::{DurableWatch, Retention};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, sync_channel};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

/// Writes snapshots off the sequencer's thread: the sequencer encodes the
/// state (quick) and offers it; this thread waits until the journal has
/// *synced* every command the state covers (in async mode too: a snapshot
/// is never ahead of what a power cut leaves), binds it to the checksum of
/// its last record, writes it, syncs it, and prunes older ones. One at a
/// time: an offer made while one is being written is declined, and made
/// again later. A failed write (a full disk, say) removes its temporary
/// file and is logged; the next one is tried when it is due.
pub(crate) struct Snapshotter {
    offers: Option<SyncSender<Offer>>,
    /// 1 while a snapshot is being written.
    busy: Arc<AtomicU64>,
    /// Set when the server stops: a snapshot still waiting for the journal
    /// gives up (the final one is written after the journal closes).
    stopping: Arc<AtomicBool>,
    handle: Option<thread::JoinHandle<()>>,
}

/// Snapshots kept by `serve` besides those its report histories are
/// rebuilt from (`Retention::reach`).
pub(crate) const KEEP_SNAPSHOTS: usize = 2;

/// How long the snapshotter waits for a gateway's checkpoint made on a
/// thread of the gateway's own: past it the snapshot is written without
/// the gateways' checkpoints (it still serves the engine's recovery).
const CHECKPOINT_WAIT: Duration = Duration::from_secs(10);

/// A state offered for a snapshot: the engine's at `seq`, and every
/// gateway's checkpoint at the same command, by name (`None`: a gateway
/// keeps none, so the snapshot carries none).
pub(crate) struct Offer {
    pub(crate) seq: u64,
    pub(crate) state: Vec<u8>,
    pub(crate) checkpoints: Option<Vec<(String, Checkpoint)>>,
    /// Asked for (SIGUSR1): its writing is logged.
    pub(crate) announce: bool,
}

impl Snapshotter {
    pub(crate) fn start(dir: std::path::PathBuf, journal: DurableWatch, history_commands: u64) -> Result<Snapshotter, ServeError> {
        let (offers, receive) = sync_channel::<Offer>(1);
        let busy = Arc::new(AtomicU64::new(0));
        let stopping = Arc::new(AtomicBool::new(false));
        let (thread_busy, thread_stopping) = (busy.clone(), stopping.clone());
        let handle = thread::Builder::new()
            .name("snapshotter".into())
            .spawn(move || {
                let retention = Retention { newest: KEEP_SNAPSHOTS, reach: history_commands };
                while let Ok(offer) = receive.recv() {
                    write_when_durable(&dir, &journal, offer, retention, &thread_stopping);
                    thread_busy.store(0, Ordering::Release);
                }
            })
            .map_err(ServeError::io("starting the snapshotter thread"))?;
        Ok(Snapshotter { offers: Some(offers), busy, stopping, handle: Some(handle) })
    }

    pub(crate) fn is_free(&self) -> bool {
        self.busy.load(Ordering::Acquire) == 0
    }

    /// Hands a state over.
    pub(crate) fn offer(&self, offer: Offer) {
        self.busy.store(1, Ordering::Release);
        if self.offers.as_ref().is_none_or(|offers| offers.try_send(offer).is_err()) {
            self.busy.store(0, Ordering::Release);
        }
    }

    /// Lets the snapshot being written finish (one still waiting for the
    /// journal gives up) and stops the thread.
    pub(crate) fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        self.stopping.store(true, Ordering::Release);
        self.offers.take();
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

/// A venue that stops on an error (a replicated node that lost the lead
/// starts again in the same process) stops its snapshotter too: no
/// snapshot of the old run is written during the next one's start.
impl Drop for Snapshotter {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// The snapshotter's work for one offer: wait until the journal has synced
/// `seq`, then write the snapshot bound to that record. Failures are
/// logged, never fatal: the journal holds everything the snapshot would.
fn write_when_durable(dir: &Path, journal: &DurableWatch, offer: Offer, retention: Retention, stopping: &AtomicBool) {
    let Offer { seq, state, checkpoints, announce } = offer;
    loop {
        match journal.wait_durable(seq, Duration::from_millis(100)) {
            Ok(durable) if durable >= seq => break,
            Ok(_) if stopping.load(Ordering::Acquire) => return,
            Ok(_) => {}
            // The venue is stopping on the journal's failure (logged there).
            Err(_) => return,
        }
    }
    let Some(chain) = journal.chain_at(seq) else {
        log(&format!("snapshot at seq {seq} skipped: the journal no longer has its record's checksum at hand; the next one is taken when due"));
        return;
    };
    let attachments = checkpoints.and_then(|checkpoints| gather(seq, checkpoints, stopping)).map(|sections| checkpoint::encode(&sections)).unwrap_or_default();
    let header = crossbook_journal::SnapshotHeader { seq, chain };
    match crossbook_journal::write_snapshot_state(dir, header, &state, &attachments, retention) {
        Ok(_) if announce => log(&format!("snapshot written at seq {seq}")),
        Ok(_) => {}
        Err(e) => log(&format!("snapshot at seq {seq} failed: {e}; the temporary file is never left behind, the snapshots before it are kept, and the next one is tried when due")),
    }
}

/// The gateways' checkpoints for the snapshot at `seq`, once every one has
/// come; `None` (logged) if one does not come in time.
fn gather(seq: u64, checkpoints: Vec<(String, Checkpoint)>, stopping: &AtomicBool) -> Option<Vec<(String, Vec<u8>)>> {
    let mut sections = Vec::with_capacity(checkpoints.len());
    for (name, checkpoint) in checkpoints {
        let bytes = match checkpoint {
            Checkpoint::Now(bytes) => bytes,
            Checkpoint::Soon(answer) => {
                let deadline = std::time::Instant::now() + CHECKPOINT_WAIT;
                loop {
                    match answer.recv_timeout(Duration::from_millis(100)) {
                        Ok(bytes) => break bytes,
                        Err(std::sync::mpsc::RecvTimeoutError::Timeout) if !stopping.load(Ordering::Acquire) && std::time::Instant::now() < deadline => {}
                        Err(_) => {
                            log(&format!("snapshot at seq {seq}: the {name} gateway's checkpoint did not come; written without the gateways' checkpoints (report histories are rebuilt from an older one)"));
                            return None;
                        }
                    }
                }
            }
        };
        sections.push((name, bytes));
    }
    Some(sections)
}
