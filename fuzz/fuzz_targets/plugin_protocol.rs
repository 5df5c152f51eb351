//! Fuzzes the plugin protocol decoder on both sides: a line from a plugin (a reply) and a
//! line from the host (a request). Errors, never panics; what decodes re-encodes to the same
//! message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use manent_plugin::protocol::{decode_reply, decode_request};

fuzz_target!(|data: &[u8]| {
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(reply) = decode_reply(line) {
        let again = decode_reply(&serde_json::to_string(&reply).expect("a reply serialises"))
            .expect("an encoded reply decodes");
        assert_eq!(again, reply, "a reply survives a round trip");
    }
    if let Ok(request) = decode_request(line) {
        let again = decode_request(&serde_json::to_string(&request).expect("a request serialises"))
            .expect("an encoded request decodes");
        assert_eq!(again, request, "a request survives a round trip");
    }
});
