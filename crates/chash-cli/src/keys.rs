//! Keys from arguments or from standard input, one per line; key sets
//! for sampling and benchmarks.

use std::io::{self, BufRead, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

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

/// The keys a command samples or measures: `N` numbered keys `key:<i>`, or
/// the lines of a file (split on LF only, as standard input is).
#[derive(Debug)]
pub enum KeySet {
    /// `key:0` .. `key:<n-1>`.
    Numbered(u64),
    /// The lines of a file: key `i` is `bytes[spans[i].0..spans[i].1]`.
    File {
        /// The path as given.
        path: PathBuf,
        /// The file's contents.
        bytes: Vec<u8>,
        /// Where each key starts and ends in `bytes`.
        spans: Vec<(usize, usize)>,
    },
}

impl KeySet {
    /// The lines of `path` (`-` for standard input), split on LF only.
    ///
    /// # Errors
    /// The file cannot be read.
    pub fn from_file(path: &Path) -> anyhow::Result<KeySet> {
        let bytes = if path == Path::new("-") {
            let mut bytes = Vec::new();
            io::stdin().lock().read_to_end(&mut bytes).context("cannot read standard input")?;
            bytes
        } else {
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?
        };
        let mut spans = Vec::new();
        let mut start = 0;
        for (i, &b) in bytes.iter().enumerate() {
            if b == b'\n' {
                spans.push((start, i));
                start = i + 1;
            }
        }
        // A final line without LF is a key; nothing after a final LF is.
        if start < bytes.len() {
            spans.push((start, bytes.len()));
        }
        Ok(KeySet::File { path: path.to_owned(), bytes, spans })
    }

    /// Number of keys.
    pub fn len(&self) -> u64 {
        match self {
            KeySet::Numbered(n) => *n,
            KeySet::File { spans, .. } => spans.len() as u64,
        }
    }

    /// What the keys are, for reports: `100000 keys key:<i>` or `12 keys from F`.
    pub fn describe(&self) -> String {
        match self {
            KeySet::Numbered(n) => format!("{n} keys key:0..key:{}", n.saturating_sub(1)),
            KeySet::File { path, spans, .. } => format!("{} keys from {}", spans.len(), path.display()),
        }
    }

    /// Calls `f` with each key whose number is in `range`, in order.
    pub fn for_each_in(&self, range: std::ops::Range<u64>, mut f: impl FnMut(&[u8])) {
        match self {
            KeySet::Numbered(_) => {
                let mut key = Vec::with_capacity(32);
                for i in range {
                    key.clear();
                    // Writing to a Vec cannot fail.
                    let _ = write!(key, "key:{i}");
                    f(&key);
                }
            }
            KeySet::File { bytes, spans, .. } => {
                for &(a, b) in &spans[range.start as usize..range.end as usize] {
                    f(&bytes[a..b]);
                }
            }
        }
    }

    /// Calls `f` with every key, in order.
    pub fn for_each(&self, f: impl FnMut(&[u8])) {
        self.for_each_in(0..self.len(), f);
    }
}

/// `--keys N` or `--keys-file F`: the key set of `analyze` and `bench`.
#[derive(Args, Debug)]
pub struct KeyArgs {
    /// Number of keys `key:0`, `key:1`, ... to sample [default: 100000;
    /// bench: 1000000].
    #[arg(long = "keys", value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    keys: Option<u64>,

    /// Keys from a file instead, one per line (split on LF only; `-` for
    /// standard input).
    #[arg(long, value_name = "F", conflicts_with = "keys")]
    keys_file: Option<PathBuf>,
}

impl KeyArgs {
    /// The key set the arguments name.
    ///
    /// # Errors
    /// The key file cannot be read, or holds no keys.
    pub fn key_set(&self) -> anyhow::Result<KeySet> {
        self.key_set_or(100_000)
    }

    /// As [`KeyArgs::key_set`], with `default` keys when `--keys` is not
    /// given.
    ///
    /// # Errors
    /// As [`KeyArgs::key_set`].
    pub fn key_set_or(&self, default: u64) -> anyhow::Result<KeySet> {
        match &self.keys_file {
            None => Ok(KeySet::Numbered(self.keys.unwrap_or(default))),
            Some(path) => {
                let set = KeySet::from_file(path)?;
                if set.len() == 0 {
                    anyhow::bail!("{} holds no keys", path.display());
                }
                Ok(set)
            }
        }
    }
}
