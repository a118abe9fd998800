//! Placement is a stable contract: the golden files under `testdata/golden/`
//! pin where the native ring puts every key, so that no version can change it
//! silently. See `testdata/README.md`.

use std::path::PathBuf;

use chash::config::Config;

fn testdata(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/golden").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Splits on LF only; nothing after a final LF.
fn lines(data: &[u8]) -> Vec<&[u8]> {
    let mut v: Vec<&[u8]> = data.split(|&b| b == b'\n').collect();
    if v.last() == Some(&&b""[..]) {
        v.pop();
    }
    v
}

#[test]
fn native_ring_placements_never_change() {
    let config = Config::from_yaml(std::str::from_utf8(&testdata("ring.yml")).unwrap()).unwrap();
    let keys_data = testdata("keys.txt");
    let keys = lines(&keys_data);
    assert!(keys.len() > 3000);
    for pool in ["xxh3", "md5_tag", "fnv_crc"] {
        let snapshot = config.pool(Some(pool)).unwrap().snapshot().unwrap();
        let expected_data = testdata(&format!("ring-{pool}.tsv"));
        let expected = lines(&expected_data);
        assert_eq!(expected.len(), keys.len(), "{pool}");
        let mut mismatches = 0;
        for (key, line) in keys.iter().zip(&expected) {
            // KEY<TAB>ID; keys may contain tabs, ids never do.
            let tab = line.iter().rposition(|&b| b == b'\t').unwrap();
            assert_eq!(&line[..tab], *key, "{pool}: key order");
            let want = std::str::from_utf8(&line[tab + 1..]).unwrap();
            if snapshot.route(key) != Some(want) {
                mismatches += 1;
            }
        }
        assert_eq!(mismatches, 0, "{pool}: {mismatches} of {} keys moved", keys.len());
    }
}
