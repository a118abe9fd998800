//! `chash hash`.

use std::io::{self, Write};

use anyhow::Result;
use chash::KeyHasher;
use clap::Args;

use crate::keys::for_each_key;

#[derive(Args, Debug)]
#[command(after_help = "\
Examples:
  chash hash -H fnv1a_64 foo bar
  chash hash -H md5 < keys.txt

Values are printed in decimal, as the original program prints them. Names
shared with twemproxy give twemproxy's exact values.")]
pub struct HashArgs {
    /// Hash function.
    #[arg(short = 'H', long = "hash", value_name = "NAME", value_parser = parse_hasher)]
    hasher: KeyHasher,

    /// Keys to hash; without any, keys are read from standard input, one per line.
    #[arg(value_name = "KEY")]
    keys: Vec<String>,
}

fn parse_hasher(s: &str) -> Result<KeyHasher, String> {
    s.parse().map_err(|e: chash::Error| e.to_string())
}

pub fn run(args: HashArgs) -> Result<()> {
    let stdout = io::stdout();
    let mut out = io::BufWriter::with_capacity(1 << 16, stdout.lock());
    for_each_key(&args.keys, |key| {
        out.write_all(key)?;
        writeln!(out, "\t{}", args.hasher.value(key))
    })?;
    out.flush()?;
    Ok(())
}
