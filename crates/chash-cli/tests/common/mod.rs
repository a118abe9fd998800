//! Running the `chash` binary from the CLI tests.

#![allow(dead_code)]

pub mod cluster;

use std::io::Write;
use std::process::{Command, Output, Stdio};

/// Runs `chash ARGS` with `stdin` as standard input and collects its output.
pub fn chash(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_chash"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chash runs");
    // Written from a thread: a large input and a large output would otherwise
    // fill both pipes and wait on each other.
    let mut input = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        // A command that exits without reading all of it closes the pipe.
        let _ = input.write_all(&data);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

/// Standard output as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// Standard error as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

/// The path of `program` (from PATH, /usr/sbin or /usr/bin); a test that
/// needs one that is missing fails, naming the Debian package that has it.
pub fn require(program: &str, package: &str) -> String {
    for dir in std::env::var("PATH").unwrap_or_default().split(':').chain(["/usr/sbin", "/usr/bin", "/bin"]) {
        let p = format!("{dir}/{program}");
        if std::path::Path::new(&p).exists() {
            return p;
        }
    }
    panic!("{program} is not installed: run scripts/test as root (it installs the Debian package {package})")
}
