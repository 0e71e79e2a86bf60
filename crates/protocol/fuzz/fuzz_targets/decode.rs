//! Any bytes fed to either decoder give a message, "need more", or an
//! error from the allow-list: never a panic, never a hang. A message that
//! decodes must encode back to the very bytes it came from.
#![no_main]

use crossbook_protocol::*;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut at = 0;
    while at < data.len() {
        match decode_client(&data[at..], MAX_FRAME) {
            Ok(Decoded::Message(message, used)) => {
                let mut again = Vec::new();
                encode_client(&message, &mut again);
                assert_eq!(&again[..], &data[at..at + used]);
                at += used;
            }
            Ok(Decoded::NeedMore) => break,
            Err(_) => break,
        }
    }
    let _ = decode_server(data, MAX_FRAME);
});
