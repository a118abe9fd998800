//! `scripts/soak`'s own checks can fail: short runs with a fault injected
//! (the script leaking client connections to the proxy, or values written
//! behind the proxy's back) end in FAIL for that reason. The soak itself
//! (minutes to hours) is not part of the test command: BENCHMARKS.md has a
//! 30-minute run.

use std::process::Command;

/// Runs `scripts/soak` for a short while against this build's `chash`;
/// (exit code, summary).
fn soak(extra: &[&str]) -> (Option<i32>, String) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/soak");
    let out_dir = std::env::temp_dir().join(format!("chash-soak-test-{}-{}", std::process::id(), extra.join("-")));
    let _ = std::fs::remove_dir_all(&out_dir);
    let out = Command::new("python3")
        .arg(script)
        .args(["--chash", env!("CARGO_BIN_EXE_chash"), "--seconds", "26", "--warmup-seconds", "8"])
        .args(["--sample-seconds", "2", "--mc-clients", "8", "--redis-clients", "4", "--no-chaos"])
        .arg("--out")
        .arg(&out_dir)
        .args(extra)
        .output()
        .expect("python3 runs scripts/soak");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let _ = std::fs::remove_dir_all(&out_dir);
    (out.status.code(), text)
}

#[test]
fn the_soak_fails_on_a_leak_and_on_a_wrong_value() {
    let (code, text) = soak(&["--inject", "leak"]);
    assert_eq!(code, Some(1), "an injected leak must fail the soak:\n{text}");
    assert!(text.contains("FAIL: open fds grew"), "the leak is named:\n{text}");
    let (code, text) = soak(&["--inject", "wrong-value"]);
    assert_eq!(code, Some(1), "an injected wrong value must fail the soak:\n{text}");
    assert!(text.lines().any(|l| l.starts_with("FAIL:") && l.contains("wrong value")), "named:\n{text}");
}
