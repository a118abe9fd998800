//! `chash fleet check` (and `chash fleet status --etcd`, in `etcd.rs`):
//! do the proxies of a fleet place keys alike? Each
//! proxy's admin endpoint reports, per pool, the membership version and
//! the placement fingerprint; they must be equal everywhere (and equal to
//! a config file's, when one is given).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use chash::config::Config;
use clap::{Args, Subcommand};
use serde_json::Value;

#[derive(Args, Debug)]
pub struct FleetArgs {
    #[command(subcommand)]
    command: FleetCommand,
}

#[derive(Subcommand, Debug)]
enum FleetCommand {
    /// Fetch every proxy's membership versions and placement fingerprints
    /// and compare them; exit 1 when any pool disagrees.
    #[command(after_help = "\
Each ADMIN_URL is a proxy's admin endpoint (http://HOST:PORT, or HOST:PORT;
chash proxy --admin, default 127.0.0.1:22223). Prints one row per proxy and
pool: the membership version (a hash of everything that decides placement:
distribution, hash, settings, every server line) and the placement
fingerprint (the owners of 4,096 probe keys), and the servers the proxy's
own health checks took out, which are local and not part of either.

With -c FILE the file's versions and fingerprints are the reference (what a
proxy started from it would run). Exit 0 when every pool agrees everywhere,
1 when a pool disagrees, is missing, or a proxy cannot be asked, 2 on a
usage error.

Example:
  chash fleet check http://10.0.0.1:22223 http://10.0.0.2:22223 -c nutcracker.yml")]
    Check {
        /// The proxies' admin endpoints.
        #[arg(value_name = "ADMIN_URL", required = true)]
        urls: Vec<String>,
        /// The config file the fleet should run.
        #[arg(short = 'c', long = "config", value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Every proxy registered in etcd against the stored config: applied
    /// revision, membership versions and fingerprints; exit 1 when any
    /// lags past --max-lag or disagrees.
    #[command(after_help = "\
A fleet on etcd (chash proxy --membership etcd://HOST:PORT/PREFIX): each proxy
registers under PREFIX/proxies/<id> (with a lease: it goes when the proxy
dies) the revision of PREFIX/config it applied and each pool's membership
version and placement fingerprint. This prints them beside the stored
config's own. A proxy behind the stored revision is given --max-lag SECS to
catch up (a change may have just been made) before it counts as lagging.

Exit 0 when every registered proxy runs the stored revision with the same
versions and fingerprints, 1 when one lags, disagrees, or none is
registered, 2 when etcd cannot be asked.

Examples:
  chash fleet status --etcd etcd://10.0.0.1:2379/chash/web --max-lag 5
  chash fleet status --etcd https://10.0.0.1:2379/chash/web --etcd-ca ca.pem --etcd-cert c.pem --etcd-key c.key")]
    Status {
        /// Where the config is stored: etcd://HOST:PORT[,HOST:PORT...]/PREFIX.
        #[arg(long, value_name = "URL/PREFIX")]
        etcd: String,
        #[command(flatten)]
        tls: crate::etcd_tls::EtcdTlsArgs,
        /// Seconds a proxy may stay behind the stored revision before it
        /// counts as lagging.
        #[arg(long, value_name = "SECS", default_value_t = 5.0)]
        max_lag: f64,
    },
}

/// One pool as one proxy (or the file) runs it.
struct Row {
    source: String,
    pool: String,
    version: String,
    fingerprint: String,
    ejected: String,
}

pub fn run(args: FleetArgs) -> Result<bool> {
    match args.command {
        FleetCommand::Check { urls, config } => check(urls, config),
        FleetCommand::Status { etcd, tls, max_lag } => status(&etcd, &tls, max_lag),
    }
}

#[cfg(feature = "etcd")]
fn status(url: &str, tls: &crate::etcd_tls::EtcdTlsArgs, max_lag: f64) -> Result<bool> {
    crate::etcd::status(&tls.target(url)?, max_lag)
}

#[cfg(not(feature = "etcd"))]
fn status(_url: &str, _tls: &crate::etcd_tls::EtcdTlsArgs, _max_lag: f64) -> Result<bool> {
    bail!("--etcd needs etcd support, which this chash was built without (cargo feature `etcd`)")
}

fn check(urls: Vec<String>, config: Option<PathBuf>) -> Result<bool> {
    let mut rows: Vec<Row> = Vec::new();
    let mut problems: Vec<String> = Vec::new();
    let mut unreachable: Vec<String> = Vec::new();
    if urls.iter().any(|u| u.starts_with("https://")) {
        bail!("https is not supported: give each admin endpoint as http://HOST:PORT");
    }
    if let Some(path) = &config {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        let cfg = Config::from_yaml(&text).with_context(|| path.display().to_string())?;
        for (name, _) in &cfg.pools {
            let pool = cfg.pool(Some(name))?;
            let fingerprint = match pool.snapshot() {
                Ok(s) => s.fingerprint(),
                Err(_) => "random".into(),
            };
            rows.push(Row {
                source: path.display().to_string(),
                pool: name.clone(),
                version: pool.version(),
                fingerprint,
                ejected: String::new(),
            });
        }
    }
    for url in &urls {
        match fetch_stats(url) {
            Ok(stats) => {
                let pools = stats["pools"].as_array().cloned().unwrap_or_default();
                for p in pools {
                    let ejected: Vec<&str> = p["locally_ejected"]
                        .as_array()
                        .map(|a| a.iter().filter_map(Value::as_str).collect())
                        .unwrap_or_default();
                    rows.push(Row {
                        source: url.clone(),
                        pool: p["name"].as_str().unwrap_or("?").to_owned(),
                        version: p["membership_version"].as_str().unwrap_or("?").to_owned(),
                        fingerprint: p["placement_fingerprint"].as_str().unwrap_or("?").to_owned(),
                        ejected: ejected.join(","),
                    });
                }
            }
            Err(e) => unreachable.push(format!("{url}: cannot ask it: {e:#}")),
        }
    }
    // Every pool any source has must be on every source, alike.
    let sources: Vec<String> = config.iter().map(|p| p.display().to_string()).chain(urls.iter().cloned()).collect();
    let mut pools: Vec<String> = rows.iter().map(|r| r.pool.clone()).collect();
    pools.sort();
    pools.dedup();
    for pool in &pools {
        let of_pool: Vec<&Row> = rows.iter().filter(|r| r.pool == *pool).collect();
        for s in &sources {
            if !unreachable.iter().any(|p| p.starts_with(s.as_str())) && !of_pool.iter().any(|r| r.source == *s) {
                problems.push(format!("{s}: has no pool {pool}"));
            }
        }
        let first = of_pool[0];
        if of_pool.iter().any(|r| r.version != first.version || r.fingerprint != first.fingerprint) {
            let differ: Vec<&str> = of_pool
                .iter()
                .filter(|r| r.version != first.version || r.fingerprint != first.fingerprint)
                .map(|r| r.source.as_str())
                .collect();
            problems.push(format!(
                "pool {pool}: {} disagree{} with {}",
                differ.join(", "),
                if differ.len() == 1 { "s" } else { "" },
                first.source
            ));
        }
    }
    let mut out = std::io::stdout().lock();
    let w = rows.iter().map(|r| r.source.len()).max().unwrap_or(0).max(6);
    let pw = rows.iter().map(|r| r.pool.len()).max().unwrap_or(0).max(4);
    writeln!(out, "{:<w$}  {:<pw$}  {:<16}  {:<16}  locally ejected", "source", "pool", "version", "fingerprint")?;
    for r in &rows {
        let ej = if r.ejected.is_empty() { "-" } else { r.ejected.as_str() };
        writeln!(out, "{:<w$}  {:<pw$}  {:<16}  {:<16}  {ej}", r.source, r.pool, r.version, r.fingerprint)?;
    }
    if problems.is_empty() && unreachable.is_empty() {
        writeln!(out, "agree: {} pool(s) on {} source(s)", pools.len(), sources.len())?;
        return Ok(true);
    }
    for p in &unreachable {
        writeln!(out, "UNREACHABLE: {p}")?;
    }
    for p in &problems {
        writeln!(out, "DISAGREE: {p}")?;
    }
    Ok(false)
}

/// `GET /stats` of an admin endpoint, parsed.
pub(crate) fn fetch_stats(url: &str) -> Result<Value> {
    // (https URLs are refused before any is asked.)
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let (authority, base) = match rest.split_once('/') {
        // The endpoint's base; a URL given with /stats already is taken as is.
        Some((a, p)) => {
            let p = p.trim_end_matches('/');
            let p = p.strip_suffix("stats").unwrap_or(p).trim_end_matches('/');
            (a, if p.is_empty() { String::new() } else { format!("/{p}") })
        }
        None => (rest, String::new()),
    };
    let addr = authority
        .to_socket_addrs()
        .with_context(|| format!("{authority:?} is not HOST:PORT"))?
        .next()
        .with_context(|| format!("{authority} resolves to no address"))?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {base}/stats HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n")?;
    let mut response = String::new();
    s.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").context("not an HTTP response")?;
    let status = head.split_whitespace().nth(1).unwrap_or("?");
    if status != "200" {
        bail!("GET {base}/stats answered {status}");
    }
    serde_json::from_str(body).context("GET /stats did not answer JSON")
}
