//! Fuzzes environment-file parsing and the effective descriptor built from it: errors,
//! never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

const DESCRIPTOR: &str = "application: acme/web\nenvironment: prod\nartifacts:\n  - {name: a.bin, type: binary, version: \"1\", url: \"file:///srv/releases/a.bin\", sha256: \"0000000000000000000000000000000000000000000000000000000000000000\"}\ndeploy: {params: {x: 1}}\n";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(env) = manent_model::parse_environment(text, "prod.yml", "acme/web", "prod") {
        let descriptor =
            manent_model::parse_descriptor(DESCRIPTOR, "d.yml").expect("the fixed descriptor parses");
        let _ = manent_model::EffectiveDescriptor::build(&descriptor, &env);
    }
});
