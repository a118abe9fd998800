//! Keys from arguments or from standard input, one per line.

use std::io::{self, BufRead};

/// Calls `f` for every key: the arguments if any, else each line of standard
/// input. Lines are split on LF only; every other byte (CR included) is part
/// of the key. A final line without LF is a key; nothing after a final LF is.
pub fn for_each_key(args: &[String], mut f: impl FnMut(&[u8]) -> io::Result<()>) -> io::Result<()> {
    if !args.is_empty() {
        for key in args {
            f(key.as_bytes())?;
        }
        return Ok(());
    }
    let stdin = io::stdin();
    let mut input = io::BufReader::with_capacity(1 << 16, stdin.lock());
    let mut line = Vec::with_capacity(256);
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line)? == 0 {
            return Ok(());
        }
        if line.last() == Some(&b'\n') {
            line.pop();
        }
        f(&line)?;
    }
}

/// Writes `s` as a JSON string literal (lossy for bytes that are not UTF-8).
pub fn write_json_string(out: &mut Vec<u8>, s: &[u8]) {
    let text = String::from_utf8_lossy(s);
    // serde_json's string escaping; writing to a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, &*text);
}
