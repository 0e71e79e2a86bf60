use super::*;

fn client_samples() -> Vec<ClientMessage> {
    let mut key = [0u8; API_KEY_BYTES];
    key[..6].copy_from_slice(b"secret");
    vec![
        ClientMessage::Login { account: 42, api_key: key, last_seen: 7 },
        ClientMessage::NewOrder(NewOrder {
            cid: 9,
            instrument: 3,
            side: Side::Sell,
            order_type: OrderType::Limit,
            tif: TimeInForce::Ioc,
            post_only: false,
            stp: SelfTradePrevention::CancelBoth,
            price: -5,
            qty: 100,
            budget: None,
        }),
        ClientMessage::NewOrder(NewOrder {
            cid: u64::MAX,
            instrument: u32::MAX,
            side: Side::Buy,
            order_type: OrderType::Market,
            tif: TimeInForce::Fok,
            post_only: true,
            stp: SelfTradePrevention::None,
            price: 0,
            qty: 1,
            budget: Some(1_000),
        }),
        ClientMessage::Cancel { order: 77 },
        ClientMessage::Replace { order: 77, price: 101, qty: 3 },
        ClientMessage::CancelAll { instrument: None },
        ClientMessage::CancelAll { instrument: Some(2) },
        ClientMessage::Heartbeat,
        ClientMessage::Logout,
        ClientMessage::QueryBalances { request: 12 },
        ClientMessage::QueryOpenOrders { request: u64::MAX, instrument: None },
        ClientMessage::QueryOpenOrders { request: 0, instrument: Some(7) },
    ]
}

fn server_samples() -> Vec<ServerMessage> {
    vec![
        ServerMessage::LoginAccepted { seq: 1, account: 42, next_seq: 2 },
        ServerMessage::LoginRejected { reason: ProtocolError::BadCredentials },
        ServerMessage::ExecutionReport(ExecutionReport {
            seq: 5,
            kind: ReportKind::PartialFill,
            order: 10,
            cid: 9,
            instrument: 1,
            side: Side::Buy,
            price: 101,
            last_qty: 4,
            last_price: 100,
            cum_qty: 4,
            leaves_qty: 6,
            fee: -1,
            reason: 0,
        }),
        ServerMessage::Heartbeat,
        ServerMessage::Logout { reason: 0 },
        ServerMessage::Error { reason: ProtocolError::FrameTooLong },
        ServerMessage::Balance { request: 12, asset: 2, available: u64::MAX, locked: 5 },
        ServerMessage::OpenOrder(OpenOrder { request: 13, order: 99, cid: 4, instrument: 1, side: Side::Sell, price: -3, qty: 10, cum_qty: 4, leaves_qty: 6 }),
        ServerMessage::QueryDone { request: 13, count: 1, as_of: 1234 },
        ServerMessage::Redirect { leader: redirect_field("127.0.0.1:7710") },
    ]
}

#[test]
fn every_message_round_trips_and_every_prefix_needs_more() {
    for message in client_samples() {
        let mut bytes = Vec::new();
        encode_client(&message, &mut bytes);
        assert_eq!(decode_client(&bytes, MAX_FRAME), Ok(Decoded::Message(message, bytes.len())));
        for cut in 0..bytes.len() {
            assert_eq!(decode_client(&bytes[..cut], MAX_FRAME), Ok(Decoded::NeedMore), "{message:?} cut at {cut}");
        }
    }
    for message in server_samples() {
        let mut bytes = Vec::new();
        encode_server(&message, &mut bytes);
        assert_eq!(decode_server(&bytes, MAX_FRAME), Ok(Decoded::Message(message, bytes.len())));
    }
}

#[test]
fn frames_follow_each_other_in_a_stream() {
    let mut stream = Vec::new();
    for message in client_samples() {
        encode_client(&message, &mut stream);
    }
    let mut at = 0;
    let mut decoded = Vec::new();
    while let Ok(Decoded::Message(message, used)) = decode_client(&stream[at..], MAX_FRAME) {
        decoded.push(message);
        at += used;
    }
    assert_eq!(at, stream.len());
    assert_eq!(decoded, client_samples());
}

#[test]
fn bad_frames_are_refused_with_their_reason() {
    let mut cancel = Vec::new();
    encode_client(&ClientMessage::Cancel { order: 1 }, &mut cancel);
    // A 4 GiB length is refused from the length alone.
    assert_eq!(decode_client(&[0xff, 0xff, 0xff, 0xff], MAX_FRAME), Err(ProtocolError::FrameTooLong));
    // A length too short to hold version and type.
    assert_eq!(decode_client(&[1, 0, 0, 0, 1], MAX_FRAME), Err(ProtocolError::BadLength));
    // Another version, even before the body is complete.
    let mut wrong = cancel.clone();
    wrong[4] = 2;
    assert_eq!(decode_client(&wrong, MAX_FRAME), Err(ProtocolError::UnsupportedVersion));
    assert_eq!(decode_client(&wrong[..5], MAX_FRAME), Err(ProtocolError::UnsupportedVersion));
    // An unknown type.
    let mut unknown = cancel.clone();
    unknown[5] = 99;
    assert_eq!(decode_client(&unknown, MAX_FRAME), Err(ProtocolError::UnknownType));
    // A body of the wrong length for its type.
    let mut long = cancel.clone();
    long[0] += 1;
    long.push(0);
    assert_eq!(decode_client(&long, MAX_FRAME), Err(ProtocolError::BadLength));
    // An enumeration out of range: side 2.
    let mut order = Vec::new();
    encode_client(&client_samples()[1], &mut order);
    order[6 + 8 + 4] = 2;
    assert_eq!(decode_client(&order, MAX_FRAME), Err(ProtocolError::BadValue));
    // Instrument 0 is reserved.
    let mut zero = Vec::new();
    encode_client(&client_samples()[1], &mut zero);
    zero[6 + 8..6 + 12].copy_from_slice(&0u32.to_le_bytes());
    assert_eq!(decode_client(&zero, MAX_FRAME), Err(ProtocolError::BadValue));
}

/// Random and mutated bytes: the decoder answers every time without
/// panicking, and whatever it accepts encodes back to the same bytes.
#[test]
fn random_and_mutated_bytes_never_panic() {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut valid = Vec::new();
    for message in client_samples() {
        encode_client(&message, &mut valid);
    }
    let mut accepted = 0;
    for round in 0..200_000u32 {
        let bytes: Vec<u8> = if round % 2 == 0 {
            let len = (next() % 80) as usize;
            (0..len).map(|_| next() as u8).collect()
        } else {
            let mut copy = valid.clone();
            for _ in 0..1 + next() % 4 {
                let at = (next() as usize) % copy.len();
                copy[at] = next() as u8;
            }
            copy
        };
        if let Ok(Decoded::Message(message, used)) = decode_client(&bytes, MAX_FRAME) {
            let mut again = Vec::new();
            encode_client(&message, &mut again);
            assert_eq!(&again[..], &bytes[..used]);
            accepted += 1;
        }
        let _ = decode_server(&bytes, MAX_FRAME);
    }
    assert!(accepted > 1_000, "mutations should still often decode ({accepted})");
}

#[test]
fn messages_map_onto_engine_commands_for_the_session_account() {
    let place = client_samples()[2].to_command(5);
    assert!(matches!(place, Some(Command::Place(p)) if p.account == 5 && p.budget == Some(1_000) && p.post_only));
    assert_eq!(ClientMessage::Cancel { order: 8 }.to_command(5), Some(Command::Cancel { account: 5, order: 8 }));
    assert_eq!(ClientMessage::CancelAll { instrument: None }.to_command(5), Some(Command::CancelAll { account: 5, instrument: None }));
    assert_eq!(ClientMessage::Heartbeat.to_command(5), None);
}
