//! Fuzzes descriptor parsing: any text gets a descriptor or an error, never a panic, and an
//! accepted descriptor survives a round trip through JSON unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(descriptor) = manent_model::parse_descriptor(text, "fuzz.yml") {
        let json = serde_json::to_string(&descriptor).expect("an accepted descriptor serialises");
        let again = manent_model::parse_descriptor(&json, "fuzz.json")
            .expect("an accepted descriptor, written as JSON, is accepted again");
        assert_eq!(again, descriptor, "the JSON round trip changes nothing");
    }
});
