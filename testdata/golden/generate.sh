#!/usr/bin/env bash
# Regenerates the golden placement files of the native ring from keys.txt.
# Run it only when a placement change is intended (it never should be for an
# existing distribution): the golden test exists to catch silent changes.
set -euo pipefail
cd "$(dirname "$0")"
python3 gen_keys.py
root=$(git rev-parse --show-toplevel)
cargo build --release --manifest-path "$root/Cargo.toml" -p chash-cli
chash="$root/target/release/chash"
for pool in xxh3 md5_tag fnv_crc; do
  "$chash" route -c ring.yml --pool "$pool" < keys.txt > "ring-$pool.tsv"
done
wc -l keys.txt ring-*.tsv
