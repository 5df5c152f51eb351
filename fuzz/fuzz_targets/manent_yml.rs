//! Fuzzes `manent.yml`: any text is a configuration or an error naming what is wrong,
//! never a panic; an accepted one answers the questions the server asks of it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(config) = manent_config::Config::from_yaml_str(text, "manent.yml", std::iter::empty())
    {
        let sources = config.artifact_sources();
        let _ = sources.check("ml/trainer", "file:///srv/releases/a.bin");
        let _ = config.effective_executor_id();
        let _ = config.has_dedicated_queues();
    }
});
