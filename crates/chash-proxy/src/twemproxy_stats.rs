//! twemproxy's stats port: to anyone who connects, one JSON document in
//! twemproxy's schema and byte layout (the one its monitoring integrations
//! read), then the connection closes; no request is read.
//!
//! As in twemproxy, the pool and server counters in the document are
//! refreshed every stats interval (`-i`), so they lag by up to one
//! interval; `uptime`, `timestamp` and the connection totals are read when
//! the document is written. Pools are listed sorted by name and servers by
//! their stats name, as twemproxy sorts them (shorter names first).

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::registry::Registry;
use crate::stats::{PoolSnapshot, ServerSnapshot};

/// A twemproxy counter: its name there, the chash counter it shows, and
/// what it counts.
pub(crate) type Field = (&'static str, &'static str, &'static str);

/// twemproxy's pool counters, in its order.
pub(crate) const POOL_FIELDS: [Field; 6] = [
    ("client_eof", "client_eof", "client connections the client closed"),
    ("client_err", "client_err", "client connections closed on an error"),
    ("client_connections", "curr_connections", "client connections open now"),
    ("server_ejects", "server_ejects", "times a server was ejected by health"),
    ("forward_error", "forward_errors", "requests answered with an error because no server could answer"),
    ("fragments", "fragments", "parts sent to servers for multi-key requests (twemproxy 0.5 leaves it at 0)"),
];

/// twemproxy's server counters, in its order.
pub(crate) const SERVER_FIELDS: [Field; 13] = [
    ("server_eof", "server_eof", "server connections the server closed"),
    ("server_err", "server_err", "server connections that failed (refused, reset, failed set-up)"),
    ("server_timedout", "server_timedout", "server connections closed because a reply timed out"),
    ("server_connections", "server_connections", "server connections open now"),
    ("server_ejected_at", "ejected_at_us", "when the server was last ejected, in usec since the epoch"),
    ("requests", "requests", "requests queued for the server"),
    ("request_bytes", "request_bytes", "bytes of those requests"),
    ("responses", "responses", "replies read from the server"),
    ("response_bytes", "response_bytes", "bytes of those replies"),
    ("in_queue", "in_queue", "requests waiting to be written to the server"),
    ("in_queue_bytes", "in_queue_bytes", "bytes of those requests"),
    ("out_queue", "out_queue", "requests written and waiting for their reply"),
    ("out_queue_bytes", "out_queue_bytes", "bytes of those requests"),
];

/// The description of the stats, as `nutcracker -D` lays it out.
pub fn describe() -> String {
    let mut out = String::from("pool stats:\n");
    for (name, _, help) in POOL_FIELDS {
        let _ = writeln!(out, "  {name:<20}\"{help}\"");
    }
    out.push_str("\nserver stats:\n");
    for (name, _, help) in SERVER_FIELDS {
        let _ = writeln!(out, "  {name:<20}\"{help}\"");
    }
    out
}

/// The name twemproxy gives a server in its stats: the server line's name,
/// else its `host:port` (just `host` for port 11211, as twemproxy keeps
/// libmemcached's naming), else its id.
fn stats_name(s: &ServerSnapshot) -> String {
    if let Some(name) = &s.name {
        return name.clone();
    }
    match s.id.rsplit_once(':') {
        Some((host, "11211")) if !host.is_empty() => host.to_owned(),
        _ => s.id.clone(),
    }
}

/// twemproxy's order of names: shorter first, then bytewise.
fn by_length_then_bytes(a: &str, b: &str) -> std::cmp::Ordering {
    a.len().cmp(&b.len()).then_with(|| a.as_bytes().cmp(b.as_bytes()))
}

/// A JSON string (names are escaped, unlike twemproxy's).
fn string(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// The document for `pools` (counters as of the last refresh), with the
/// live values read now.
pub(crate) fn document(registry: &Registry, pools: &[PoolSnapshot], listeners: usize) -> String {
    let live = registry.stats();
    let (mut curr, mut total) = (listeners as u64, listeners as u64);
    for p in &live {
        curr += p.get("curr_connections");
        total += p.get("total_connections");
        for s in &p.servers {
            curr += s.get("server_connections");
            total += s.get("connections_made");
        }
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut out = format!(
        "{{\"service\":\"chash-proxy\", \"source\":{}, \"version\":\"{}\", \"uptime\":{}, \"timestamp\":{now}, \
         \"total_connections\":{total}, \"curr_connections\":{curr}",
        string(&hostname()),
        env!("CARGO_PKG_VERSION"),
        registry.shared().started.elapsed().as_secs(),
    );
    let mut pools: Vec<&PoolSnapshot> = pools.iter().collect();
    pools.sort_by(|a, b| by_length_then_bytes(&a.name, &b.name));
    for (i, p) in pools.iter().enumerate() {
        out.push_str(if i == 0 { ", " } else { "," });
        let _ = write!(out, "{}: {{", string(&p.name));
        let fields: Vec<String> =
            POOL_FIELDS.iter().map(|(name, ours, _)| format!("\"{name}\":{}", p.get(ours))).collect();
        out.push_str(&fields.join(", "));
        let mut servers: Vec<(String, &ServerSnapshot)> = p.servers.iter().map(|s| (stats_name(s), s)).collect();
        servers.sort_by(|a, b| by_length_then_bytes(&a.0, &b.0));
        for (j, (name, s)) in servers.iter().enumerate() {
            out.push_str(if j == 0 { ", " } else { "," });
            let _ = write!(out, "{}: {{", string(name));
            let fields: Vec<String> =
                SERVER_FIELDS.iter().map(|(field, ours, _)| format!("\"{field}\":{}", s.get(ours))).collect();
            out.push_str(&fields.join(", "));
            out.push('}');
        }
        out.push('}');
    }
    out.push_str("}\n");
    out
}

/// Serves the stats document until shutdown, refreshing its counters every
/// `interval`. `listeners` is the number of pool listeners (twemproxy
/// counts them as connections).
pub(crate) async fn serve(
    listener: TcpListener,
    registry: Arc<Registry>,
    interval: Duration,
    listeners: usize,
    mut stop: watch::Receiver<bool>,
) {
    let latest = Arc::new(Mutex::new(registry.stats()));
    let refresh = {
        let (registry, latest) = (registry.clone(), latest.clone());
        let mut stop = stop.clone();
        async move {
            let mut tick = tokio::time::interval(interval.max(Duration::from_millis(1)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => *latest.lock().unwrap_or_else(|e| e.into_inner()) = registry.stats(),
                    _ = stop.changed() => return,
                }
            }
        }
    };
    let accept = async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = stop.changed() => return,
            };
            let Ok((mut stream, _)) = accepted else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let pools = latest.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let doc = document(&registry, &pools, listeners);
            tokio::spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(10), async {
                    stream.write_all(doc.as_bytes()).await?;
                    stream.shutdown().await
                })
                .await;
            });
        }
    };
    tokio::join!(refresh, accept);
}
