//! The CLI's side of a fleet on etcd: `chash config ... --etcd` (the file
//! editor's change written with compare-and-swap, `--retry`, `--wait`),
//! `chash config put|get --etcd`, and `chash fleet status --etcd`.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use chash::config::Config;
use chash::config_edit::Edited;
use chash_proxy::etcd::{self, Client, EtcdError, EtcdTarget, PoolReport, ProxyReport, Stored};

/// How often `--wait` and `fleet status` ask etcd for the proxies' reports.
const POLL: Duration = Duration::from_millis(5);

/// Runs `f` on a small runtime of its own (the CLI is otherwise
/// synchronous).
pub(crate) fn block_on<T>(f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start the runtime")?;
    runtime.block_on(f)
}

/// Every pool of `text` checked as a proxy starts it: `origin` names it.
pub fn validate(text: &str, origin: &str) -> Result<Config> {
    let config = Config::from_yaml(text).with_context(|| origin.to_owned())?;
    for (name, _) in &config.pools {
        let pool = config.pool(Some(name)).with_context(|| origin.to_owned())?;
        if pool.distribution != chash::Distribution::Random {
            pool.snapshot().with_context(|| format!("{origin}: pool {name:?}"))?;
        }
        chash_proxy::check_servers(&pool).with_context(|| origin.to_owned())?;
        // The files a stored config names are read on each proxy's host;
        // here they may not exist, so they are not read.
    }
    Ok(config)
}

/// What a change did: the stored config before and after it.
pub struct Written {
    /// The edit as the file editor made it.
    pub edited: Edited,
    /// The revision the edit was made on.
    pub read: i64,
    /// The new revision.
    pub revision: i64,
    /// The stored text the edit was made on.
    pub before_text: String,
}

/// Applies `change` (the file editor, given the stored text and its
/// revision) to the stored config with compare-and-swap; on a conflict,
/// reads again and re-applies up to `retry` times. Says what it wrote on
/// standard output.
pub fn edit(target: &EtcdTarget, retry: u32, change: impl Fn(&str) -> Result<Edited>, what: &str) -> Result<Written> {
    block_on(async {
        let mut client = etcd::connect(target).await?;
        let key = target.config_key();
        let mut attempt = 0;
        let written = loop {
            let stored = etcd::read_config(&mut client, target).await?;
            let edited = change(&stored.text).with_context(|| format!("{key} (revision {})", stored.revision))?;
            test_barrier(attempt).await;
            match etcd::store::write_config(&mut client, target, &edited.text, Some(stored.revision)).await {
                Ok(revision) => break Written { edited, read: stored.revision, revision, before_text: stored.text },
                Err(e @ EtcdError::Conflict { .. }) if attempt < retry => {
                    attempt += 1;
                    eprintln!("chash config: {e}; retrying ({attempt} of {retry})");
                }
                Err(e) => return Err(e.into()),
            }
        };
        println!(
            "{key}: {what} (pool {}): revision {} -> {}",
            written.edited.after.name, written.read, written.revision
        );
        Ok(written)
    })
}

/// The race test's hook between a writer's read and its compare-and-swap:
/// with `CHASH_TEST_EDIT_BARRIER=DIR` set, the writer creates
/// `DIR/read-PID-ATTEMPT` and waits (up to 30 s) for `DIR/go` to exist, so
/// that a test can make two writers read the same revision before either
/// writes. Unset (always, outside that test), it does nothing.
async fn test_barrier(attempt: u32) {
    let Some(dir) = std::env::var_os("CHASH_TEST_EDIT_BARRIER").map(std::path::PathBuf::from) else { return };
    let _ = std::fs::write(dir.join(format!("read-{}-{attempt}", std::process::id())), b"");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !dir.join("go").exists() && Instant::now() < deadline {
        tokio::time::sleep(POLL).await;
    }
}

/// `chash config put --etcd URL/PREFIX FILE`: validated, then written with
/// compare-and-swap against what is stored (renumbering an anchor or jump
/// pool refused unless `force`).
pub fn put(target: &EtcdTarget, file: &std::path::Path, force: bool, retry: u32, wait: Option<f64>) -> Result<bool> {
    let text = std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let new = validate(&text, &file.display().to_string())?;
    block_on(async {
        let mut client = etcd::connect(target).await?;
        let key = target.config_key();
        let mut attempt = 0;
        let (read, revision) = loop {
            let read = match etcd::read_config(&mut client, target).await {
                Ok(stored) => Some(stored),
                Err(EtcdError::NoConfig { .. }) => None,
                Err(e) => return Err(e.into()),
            };
            if let (Some(stored), false) = (&read, force) {
                check_renumbering(stored, &new, &key)?;
            }
            let expected = read.as_ref().map(|s| s.revision);
            test_barrier(attempt).await;
            match etcd::store::write_config(&mut client, target, &text, expected).await {
                Ok(revision) => break (expected, revision),
                Err(e @ EtcdError::Conflict { .. }) if attempt < retry => {
                    attempt += 1;
                    eprintln!("chash config: {e}; retrying ({attempt} of {retry})");
                }
                Err(e) => return Err(e.into()),
            }
        };
        let pools: Vec<&str> = new.pools.iter().map(|(n, _)| n.as_str()).collect();
        match read {
            Some(r) => println!("{key}: {} ({}): revision {r} -> {revision}", file.display(), pools.join(", ")),
            None => println!("{key}: {} ({}): created at revision {revision}", file.display(), pools.join(", ")),
        }
        match wait {
            Some(secs) => wait_for(&mut client, target, revision, secs).await,
            None => Ok(true),
        }
    })
}

/// Refuses a whole new config that renumbers an anchor or jump pool of the
/// stored one (every key of the servers after the change would move).
fn check_renumbering(stored: &Stored, new: &Config, key: &str) -> Result<()> {
    let Ok(old) = Config::from_yaml(&stored.text) else { return Ok(()) };
    for (name, _) in &new.pools {
        let (Ok(before), Ok(after)) = (old.pool(Some(name)), new.pool(Some(name))) else { continue };
        before.check_reload(&after).with_context(|| {
            format!("against {key} (revision {}), pass --force to upload it anyway", stored.revision)
        })?;
    }
    Ok(())
}

/// `chash config get --etcd URL/PREFIX`: the stored config on standard
/// output, its revision on standard error.
pub fn get(target: &EtcdTarget) -> Result<()> {
    let stored = block_on(async {
        let mut client = etcd::connect(target).await?;
        Ok(etcd::read_config(&mut client, target).await?)
    })?;
    eprintln!(
        "# {} revision {} (config hash {})",
        target.config_key(),
        stored.revision,
        etcd::config_hash(&stored.text)
    );
    let mut out = std::io::stdout().lock();
    out.write_all(stored.text.as_bytes())?;
    if !stored.text.ends_with('\n') {
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

/// `--wait SECS` after a change: every registered proxy at `revision` (or
/// later); `false` when some lag.
pub fn wait(target: &EtcdTarget, revision: i64, secs: f64) -> Result<bool> {
    block_on(async {
        let mut client = etcd::connect(target).await?;
        wait_for(&mut client, target, revision, secs).await
    })
}

/// Waits up to `secs` until every registered proxy reports `revision` (or
/// a later one); prints who lags. `true` when all did.
async fn wait_for(client: &mut Client, target: &EtcdTarget, revision: i64, secs: f64) -> Result<bool> {
    let started = Instant::now();
    let limit = Duration::from_secs_f64(secs.max(0.0));
    loop {
        let proxies = etcd::store::read_proxies(client, target).await?;
        let lagging: Vec<&ProxyReport> = proxies.iter().filter(|p| p.revision < revision).collect();
        if lagging.is_empty() {
            let took = started.elapsed().as_secs_f64();
            if proxies.is_empty() {
                println!("no proxy is registered under {}: nothing to wait for", target.proxies_prefix());
            } else {
                println!(
                    "revision {revision} applied by {} of {} proxies in {took:.3} s",
                    proxies.len(),
                    proxies.len()
                );
            }
            return Ok(true);
        }
        // Proxies that refused this very revision will not apply it.
        let refused = format!("revision {revision} refused");
        let all_refused = lagging.iter().all(|p| p.last_error.as_deref().is_some_and(|e| e.starts_with(&refused)));
        if started.elapsed() >= limit || all_refused {
            let waited = started.elapsed().as_secs_f64();
            println!(
                "revision {revision}: applied by {} of {} proxies after {waited:.3} s; lagging:",
                proxies.len() - lagging.len(),
                proxies.len()
            );
            for p in lagging {
                println!("  {}", describe_proxy(p));
            }
            return Ok(false);
        }
        tokio::time::sleep(POLL).await;
    }
}

fn describe_proxy(p: &ProxyReport) -> String {
    let mut s = format!("{} at revision {}", p.id, p.revision);
    if let Some(admin) = &p.admin {
        s.push_str(&format!(" ({admin})"));
    }
    if let Some(e) = &p.last_error {
        s.push_str(&format!(": {e}"));
    }
    s
}

/// Each pool's membership version and placement fingerprint of a config.
fn pool_reports(config: &Config) -> BTreeMap<String, PoolReport> {
    config
        .pools
        .iter()
        .filter_map(|(name, _)| {
            let pool = config.pool(Some(name)).ok()?;
            let fingerprint = pool.snapshot().map_or_else(|_| "random".to_owned(), |s| s.fingerprint());
            Some((name.clone(), PoolReport { version: pool.version(), fingerprint, ..PoolReport::default() }))
        })
        .collect()
}

/// `chash fleet status --etcd URL/PREFIX`: every registered proxy against
/// the stored config; `true` when all run it (waiting up to `max_lag` for
/// those behind).
pub fn status(target: &EtcdTarget, max_lag: f64) -> Result<bool> {
    block_on(async {
        let mut client = etcd::connect(target).await?;
        let started = Instant::now();
        let limit = Duration::from_secs_f64(max_lag.max(0.0));
        let (stored, proxies) = loop {
            let stored = etcd::read_config(&mut client, target).await?;
            let proxies = etcd::store::read_proxies(&mut client, target).await?;
            let out_of_time = started.elapsed() >= limit;
            if proxies.iter().any(|p| p.revision > stored.revision) && !out_of_time {
                // Changed between the two reads: read both again.
                tokio::time::sleep(POLL).await;
                continue;
            }
            if proxies.iter().all(|p| p.revision == stored.revision) || out_of_time {
                break (stored, proxies);
            }
            tokio::time::sleep(POLL).await;
        };
        let key = target.config_key();
        let (expected, invalid) = match validate(&stored.text, &format!("{key} revision {}", stored.revision)) {
            Ok(c) => (pool_reports(&c), None),
            Err(e) => (BTreeMap::new(), Some(format!("{e:#}"))),
        };
        let ok = print_status(target, &stored, &expected, &proxies, max_lag)?;
        if let Some(e) = invalid {
            println!("INVALID: {e}: the proxies refuse it and keep their last good config");
            return Ok(false);
        }
        Ok(ok)
    })
}

fn print_status(
    target: &EtcdTarget,
    stored: &Stored,
    expected: &BTreeMap<String, PoolReport>,
    proxies: &[ProxyReport],
    max_lag: f64,
) -> Result<bool> {
    let key = target.config_key();
    let mut out = std::io::stdout().lock();
    let source = format!("{key}@{}", stored.revision);
    let w = proxies.iter().map(|p| p.id.len()).chain([source.len(), 6]).max().unwrap_or(6);
    let pw = expected.keys().map(String::len).max().unwrap_or(4).max(4);
    writeln!(
        out,
        "{:<w$}  {:>8}  {:<pw$}  {:<16}  {:<16}  admin",
        "source", "revision", "pool", "version", "fingerprint"
    )?;
    for (pool, r) in expected {
        writeln!(
            out,
            "{source:<w$}  {:>8}  {pool:<pw$}  {:<16}  {:<16}  -",
            stored.revision, r.version, r.fingerprint
        )?;
    }
    let mut problems = Vec::new();
    for p in proxies {
        let admin = p.admin.as_deref().unwrap_or("-");
        for (pool, r) in &p.pools {
            writeln!(
                out,
                "{:<w$}  {:>8}  {pool:<pw$}  {:<16}  {:<16}  {admin}",
                p.id, p.revision, r.version, r.fingerprint
            )?;
        }
        if p.revision < stored.revision {
            let mut why = format!(
                "LAGGING: {} is at revision {}, {key} at {} (waited {max_lag} s)",
                p.id, p.revision, stored.revision
            );
            if let Some(e) = &p.last_error {
                why.push_str(&format!(": {e}"));
            }
            problems.push(why);
            continue;
        }
        for (pool, want) in expected {
            match p.pools.get(pool) {
                None => problems.push(format!("DISAGREE: {} does not serve pool {pool}", p.id)),
                Some(have) if !have.places_as(want) => problems.push(format!(
                    "DISAGREE: {} pool {pool}: version {} fingerprint {}, the stored config's {} {}",
                    p.id, have.version, have.fingerprint, want.version, want.fingerprint
                )),
                Some(_) => {}
            }
        }
    }
    // Sentinel groups: every proxy should use the primary the others use.
    let mut groups: BTreeMap<(&str, &str), Vec<(&str, &str)>> = BTreeMap::new();
    for p in proxies {
        for (pool, r) in &p.pools {
            for (group, primary) in &r.primaries {
                groups.entry((pool, group)).or_default().push((&p.id, primary));
            }
        }
    }
    for ((pool, group), seen) in &groups {
        let named: Vec<String> = seen.iter().map(|(id, primary)| format!("{id}={}", or_unknown(primary))).collect();
        writeln!(out, "group {pool}/{group}: primary {}", named.join(" "))?;
        if seen.iter().any(|(_, primary)| *primary != seen[0].1 || primary.is_empty()) {
            problems.push(format!("DISAGREE: pool {pool} group {group}: the proxies use {}", named.join(", ")));
        }
    }
    if proxies.is_empty() {
        problems.push(format!("NONE: no proxy is registered under {}", target.proxies_prefix()));
    }
    if problems.is_empty() {
        writeln!(out, "agree: {} proxies run {key} revision {}", proxies.len(), stored.revision)?;
        return Ok(true);
    }
    for p in &problems {
        writeln!(out, "{p}")?;
    }
    Ok(false)
}

/// A primary, or `?` while a proxy knows none.
fn or_unknown(primary: &str) -> &str {
    if primary.is_empty() {
        "?"
    } else {
        primary
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy(id: &str, revision: i64, fingerprint: &str) -> ProxyReport {
        let report = PoolReport { version: "v1".into(), fingerprint: fingerprint.into(), ..PoolReport::default() };
        let pools = [("web".to_owned(), report)];
        ProxyReport { id: id.into(), revision, pools: pools.into_iter().collect(), ..ProxyReport::default() }
    }

    #[test]
    fn status_agrees_only_when_every_proxy_runs_the_stored_placement() {
        let target: EtcdTarget = "etcd://127.0.0.1:2379/p".parse().unwrap();
        let stored = Stored { text: String::new(), revision: 5, read_at: 7 };
        let expected: BTreeMap<String, PoolReport> = [(
            "web".to_owned(),
            PoolReport { version: "v1".into(), fingerprint: "f1".into(), ..PoolReport::default() },
        )]
        .into_iter()
        .collect();
        let status = |proxies: &[ProxyReport]| print_status(&target, &stored, &expected, proxies, 0.0).unwrap();
        assert!(status(&[proxy("a", 5, "f1"), proxy("b", 5, "f1")]));
        assert!(!status(&[proxy("a", 5, "f1"), proxy("b", 5, "f2")]), "a fingerprint differs");
        assert!(!status(&[proxy("a", 5, "f1"), proxy("b", 4, "f1")]), "a proxy lags");
        let mut no_pool = proxy("a", 5, "f1");
        no_pool.pools.clear();
        assert!(!status(&[no_pool]), "a pool is missing");
        assert!(!status(&[]), "no proxy is registered");
        // Sentinel groups: the proxies must use the same primary.
        let with = |id: &str, primary: &str| {
            let mut p = proxy(id, 5, "f1");
            p.pools.get_mut("web").unwrap().primaries.insert("g1".into(), primary.into());
            p
        };
        assert!(status(&[with("a", "10.0.0.1:6379"), with("b", "10.0.0.1:6379")]));
        assert!(!status(&[with("a", "10.0.0.1:6379"), with("b", "10.0.0.2:6379")]), "primaries differ");
        assert!(!status(&[with("a", "10.0.0.1:6379"), with("b", "")]), "a proxy knows no primary");
    }
}
