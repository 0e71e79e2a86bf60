//! FIX 4.4 for crossbook (no I/O): the tag=value codec ([`wire`]), the data
//! dictionary and message validation ([`dictionary`], [`validate`]), UTC
//! time stamps ([`time`]), exact decimals ([`decimal`]) and the session
//! layer as a state machine that is handed bytes and the time and answers
//! with what to send ([`session`]).

mod builtin;
pub mod decimal;
pub mod dictionary;
pub mod session;
pub mod time;
pub mod validate;
pub mod wire;
