//! Any config text: an error or a pool that builds, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(cfg) = chash::config::Config::from_yaml(text) {
        for (name, _) in &cfg.pools {
            if let Ok(pool) = cfg.pool(Some(name)) {
                if let Ok(snapshot) = pool.snapshot() {
                    let _ = snapshot.route(b"key");
                }
            }
        }
    }
    let _ = text.parse::<chash::ServerLine>();
    let _ = text.parse::<chash::PointLabel>();
});
