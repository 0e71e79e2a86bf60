//! The binary command codec and the engine's canonical state encoding:
//! what the journal and snapshots are built on.

use crossbook_engine::codec::{DecodeError, decode_command, encode_command};
use crossbook_engine::{Engine, StateError};
use crossbook_workload::{Workload, generate};

#[test]
fn every_command_round_trips_through_the_binary_codec() {
    let mut commands = generate(Workload::Mixed, 4, 20_000);
    commands.extend([crossbook_engine::Command::Halt { instrument: 7 }, crossbook_engine::Command::Resume { instrument: u32::MAX }]);
    let mut buffer = Vec::new();
    for command in &commands {
        buffer.clear();
        encode_command(command, &mut buffer);
        assert_eq!(decode_command(&buffer).as_ref(), Ok(command));
        // Every strict prefix is refused, and so is a trailing byte.
        for cut in 0..buffer.len() {
            assert!(decode_command(&buffer[..cut]).is_err(), "{command:?} cut at {cut}");
        }
        buffer.push(0);
        assert!(matches!(decode_command(&buffer), Err(DecodeError::TrailingBytes(1))));
    }
}

#[test]
fn corrupt_command_bytes_give_errors_not_panics() {
    let commands = generate(Workload::Mixed, 5, 3_000);
    let mut buffer = Vec::new();
    let mut state = 0x1234_5678_u64;
    for command in &commands {
        buffer.clear();
        encode_command(command, &mut buffer);
        for _ in 0..8 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
            let mut corrupt = buffer.clone();
            let at = (state >> 33) as usize % corrupt.len();
            corrupt[at] ^= (state >> 8) as u8 | 1;
            let _ = decode_command(&corrupt);
        }
    }
}

/// Snapshot the engine at many points of a run, restore, and require the
/// restored engine to encode identically and to behave identically on the
/// rest of the run.
#[test]
fn restored_state_is_the_same_state() {
    for seed in [1, 2, 3] {
        let commands = generate(Workload::Mixed, seed, 12_000);
        let mut live = Engine::new();
        let mut events = Vec::new();
        for (index, command) in commands.iter().enumerate() {
            events.clear();
            live.apply(command, &mut events);
            if index % 2_500 != 1_999 {
                continue;
            }
            let mut bytes = Vec::new();
            live.encode_state(&mut bytes);
            let mut restored = Engine::decode_state(&bytes).unwrap_or_else(|e| panic!("seed {seed} at {index}: {e}"));
            let mut again = Vec::new();
            restored.encode_state(&mut again);
            assert_eq!(bytes, again, "seed {seed} at {index}: re-encoding differs");
            // Both engines go on with the same commands and must agree.
            let mut twin = Engine::decode_state(&bytes).unwrap();
            let mut a = Vec::new();
            let mut b = Vec::new();
            for command in &commands[index + 1..(index + 1500).min(commands.len())] {
                a.clear();
                b.clear();
                twin.apply(command, &mut a);
                restored.apply(command, &mut b);
                assert_eq!(a, b);
            }
        }
    }
}

#[test]
fn restored_engine_continues_exactly_like_the_original() {
    let commands = generate(Workload::Mixed, 8, 10_000);
    let (head, tail) = commands.split_at(6_000);
    let mut original = Engine::new();
    let mut events = Vec::new();
    for command in head {
        original.apply(command, &mut events);
    }
    let mut bytes = Vec::new();
    original.encode_state(&mut bytes);
    let mut restored = Engine::decode_state(&bytes).unwrap();
    let mut from_original = Vec::new();
    let mut from_restored = Vec::new();
    for command in tail {
        original.apply(command, &mut from_original);
        restored.apply(command, &mut from_restored);
    }
    assert_eq!(from_original, from_restored);
}

#[test]
fn damaged_state_bytes_are_refused_not_trusted() {
    let commands = generate(Workload::Mixed, 9, 5_000);
    let mut engine = Engine::new();
    let mut events = Vec::new();
    for command in &commands {
        engine.apply(command, &mut events);
    }
    let mut bytes = Vec::new();
    engine.encode_state(&mut bytes);
    assert!(matches!(Engine::decode_state(b"nope"), Err(StateError::BadMagic)));
    assert!(Engine::decode_state(&bytes[..bytes.len() - 1]).is_err());
    let mut state = 99u64;
    let mut refused = 0;
    for _ in 0..300 {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let mut corrupt = bytes.clone();
        let at = (state >> 33) as usize % corrupt.len();
        corrupt[at] ^= 1 << ((state >> 20) % 8);
        if Engine::decode_state(&corrupt).is_err() {
            refused += 1;
        }
    }
    // Some flips land in fields any value fits (a cid, say); most must be
    // caught by the decoder or the invariant check. The file checksum
    // catches the rest.
    assert!(refused > 150, "only {refused} of 300 corruptions refused");
}

/// A halted instrument is part of the state: restored halted (it refuses
/// a new order), and a state of version 1 (before `halt`) reads as every
/// instrument trading.
#[test]
fn a_halted_instrument_is_restored_halted_and_version_1_reads_as_trading() {
    use crossbook_engine::{Command, EventKind, RejectReason};
    let commands = generate(Workload::Mixed, 4, 3_000);
    let mut engine = Engine::new();
    let mut events = Vec::new();
    for command in &commands {
        engine.apply(command, &mut events);
    }
    let place = commands.iter().rev().find_map(|c| if let Command::Place(p) = c { Some(*p) } else { None }).unwrap();
    let mut trading = Vec::new();
    engine.encode_state(&mut trading);
    events.clear();
    engine.apply(&Command::Halt { instrument: place.instrument }, &mut events);
    assert!(matches!(events[..], [crossbook_engine::Event { kind: EventKind::Halted { .. }, .. }]), "{events:?}");
    let mut halted = Vec::new();
    engine.encode_state(&mut halted);
    let mut restored = Engine::decode_state(&halted).unwrap();
    assert_eq!(restored.is_halted(place.instrument), Some(true));
    let mut again = Vec::new();
    restored.encode_state(&mut again);
    assert_eq!(again, halted);
    events.clear();
    restored.apply(&Command::Place(crossbook_engine::PlaceOrder { cid: u64::MAX - 1, ..place }), &mut events);
    assert!(matches!(events[..], [crossbook_engine::Event { kind: EventKind::Rejected { reason: RejectReason::InstrumentHalted }, .. }]), "{events:?}");
    // Version 1: no `halted` byte after each instrument's spec.
    let assets = u32::from_le_bytes(trading[16..20].try_into().unwrap()) as usize;
    let mut at = 20 + assets * (4 + 33 + 8);
    let instruments = u32::from_le_bytes(trading[at..at + 4].try_into().unwrap()) as usize;
    at += 4;
    let mut v1 = trading[..at].to_vec();
    v1[4..8].copy_from_slice(&1u32.to_le_bytes());
    for _ in 0..instruments {
        assert_eq!(trading[at + 109], 0, "trading");
        v1.extend_from_slice(&trading[at..at + 109]);
        at += 110;
    }
    v1.extend_from_slice(&trading[at..]);
    let old = Engine::decode_state(&v1).expect("version 1 is read");
    let mut reencoded = Vec::new();
    old.encode_state(&mut reencoded);
    assert_eq!(reencoded, trading, "read as every instrument trading");
}
