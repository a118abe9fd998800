//! chash against placements recorded from the real programs: twemproxy
//! (nutcracker) in front of memcached, libmemcached through pylibmc, and
//! nginx's `hash ... consistent`. See `testdata/compat/README.md` for how each
//! file was made. Every key must land where the program put it.

use std::path::{Path, PathBuf};

use chash::config::Config;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/compat")
}

/// `(key, server)` rows of a TSV file: split on LF only, the server after the last tab.
fn rows(path: &Path) -> Vec<(Vec<u8>, String)> {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    data.split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| {
            let tab = l.iter().rposition(|&b| b == b'\t').expect("KEY<TAB>SERVER");
            (l[..tab].to_vec(), String::from_utf8(l[tab + 1..].to_vec()).unwrap())
        })
        .collect()
}

fn check(name: &str) -> usize {
    let yml = dir().join(format!("{name}.yml"));
    let text = std::fs::read_to_string(&yml).unwrap_or_else(|e| panic!("{}: {e}", yml.display()));
    let snapshot = Config::from_yaml(&text).unwrap().pool(None).unwrap().snapshot().unwrap();
    let rows = rows(&dir().join(format!("{name}.tsv")));
    assert!(rows.len() >= 20_000 || name.starts_with("nginx"), "{name}: only {} keys", rows.len());
    let wrong: Vec<String> = rows
        .iter()
        .filter(|(k, server)| snapshot.route(k) != Some(server.as_str()))
        .take(5)
        .map(|(k, server)| format!("{:?}: program {server}, chash {:?}", String::from_utf8_lossy(k), snapshot.route(k)))
        .collect();
    assert!(wrong.is_empty(), "{name}: keys placed differently, e.g. {wrong:#?}");
    rows.len()
}

/// Every recorded file, so a file added later is tested too.
#[test]
fn every_recorded_placement_agrees() {
    let mut names: Vec<String> = std::fs::read_dir(dir())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok()?.strip_suffix(".tsv").map(str::to_owned))
        .collect();
    names.sort();
    // The variants the README promises must all be there.
    for required in [
        "tw-ketama-md5",
        "tw-ketama-md5-weighted-named",
        "tw-ketama-fnv1a_32",
        "tw-ketama-default",
        "tw-ketama-md5-removed",
        "tw-modula-md5",
        "tw-modula-fnv1a_64",
        "tw-ketama-md5-hashtag",
        "tw-modula-crc32a-hashtag",
        "tw-modula-md5-unsorted",
        "lm-ketama-weighted-equal",
        "nginx-chash",
        "nginx-chash-equal",
    ] {
        assert!(names.iter().any(|n| n == required), "missing {required}.tsv");
    }
    let mut total = 0;
    for name in &names {
        total += check(name);
    }
    assert!(names.len() >= 24, "{names:?}");
    assert!(total > 500_000, "{total} keys checked");
}
