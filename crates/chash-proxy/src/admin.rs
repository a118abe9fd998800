//! The admin/stats HTTP endpoint (loopback by default).
//!
//! | request | does |
//! | --- | --- |
//! | `GET /stats` | JSON: every pool and server, counters, latency, state |
//! | `GET /metrics` | the same in Prometheus text format |
//! | `GET /pools` | pools and their servers with state |
//! | `POST /pools/POOL/servers` (body `ID:WEIGHT [NAME]`) | adds a server |
//! | `DELETE /pools/POOL/servers/ID` | removes a server |
//! | `PUT /pools/POOL/servers/ID/weight` (body a number) | re-weights a server |
//! | `POST /pools/POOL/servers/ID/eject` | ejects a server (its keys move) |
//! | `POST /pools/POOL/servers/ID/restore` | brings it back |
//! | `POST /reload` | re-reads the config file (as SIGHUP does) |
//!
//! Changes answer with the share of the key space that moved, the new
//! membership version and placement fingerprint, and whether the change
//! was written to the config file (`--persist`). With a token
//! (`--admin-token-file`), requests other than `GET` need
//! `Authorization: Bearer <token>`. Server ids go
//! in the path percent-encoded where needed (`/` as `%2F`). Counters come
//! from the pools' stats snapshots, the same ones every other rendering
//! uses.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;

use chash::Edit;

use crate::pool::PoolError;
use crate::registry::Registry;
use crate::stats::{Desc, Kind, PoolSnapshot, ServerSnapshot};

const MAX_HEAD: usize = 16 * 1024;
const MAX_BODY: usize = 64 * 1024;

/// How long an admin connection may take, its TLS handshake included.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves admin requests until shutdown, over TLS when `tls` is given (its
/// current certificate: a reload swaps it for new connections).
pub(crate) async fn serve(
    listener: TcpListener,
    registry: Arc<Registry>,
    tls: Option<Arc<crate::tls::LiveTls>>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.changed() => return,
        };
        let Ok((stream, _)) = accepted else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let registry = registry.clone();
        let acceptor = tls.as_ref().and_then(|t| t.acceptor());
        tokio::spawn(async move {
            let _ = tokio::time::timeout(CONNECTION_TIMEOUT, async {
                match acceptor {
                    Some(acceptor) => match acceptor.accept(stream).await {
                        Ok(stream) => handle(stream, registry).await,
                        Err(e) => {
                            tracing::debug!("admin endpoint: TLS handshake failed: {e}");
                            Ok(())
                        }
                    },
                    None => handle(stream, registry).await,
                }
            })
            .await;
        });
    }
}

struct Response {
    status: u16,
    content_type: &'static str,
    body: String,
}

fn json_response(status: u16, body: Value) -> Response {
    Response { status, content_type: "application/json", body: format!("{body:#}\n") }
}

fn error(status: u16, message: impl Into<String>) -> Response {
    json_response(status, json!({ "error": message.into() }))
}

async fn handle<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, registry: Arc<Registry>) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > MAX_HEAD {
            return write(&mut stream, error(431, "request head too large")).await;
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or_default().to_owned(), parts.next().unwrap_or("/").to_owned());
    let headers: Vec<(&str, &str)> =
        lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim(), v.trim())).collect();
    let header = |name: &str| headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| *v);
    let length = header("content-length").and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
    if let Some(token) = &registry.shared().options.admin_token {
        if !matches!(method.as_str(), "GET" | "HEAD") && !bearer_matches(header("authorization"), token) {
            return write(
                &mut stream,
                error(
                    401,
                    "this request changes the proxy: it needs Authorization: Bearer <token> (--admin-token-file)",
                ),
            )
            .await;
        }
    }
    if length > MAX_BODY {
        return write(&mut stream, error(413, "body too large")).await;
    }
    let mut body = buf[head_end..].to_vec();
    while body.len() < length {
        let mut chunk = vec![0u8; length - body.len()];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    let body = String::from_utf8_lossy(&body[..length.min(body.len())]).trim().to_owned();
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let segments: Vec<String> = path.split('/').filter(|s| !s.is_empty()).map(percent_decode).collect();
    let query = query.to_owned();
    // Off the runtime's threads: a change may wait on files and servers
    // (a migrating change probes its servers first).
    let response = tokio::task::spawn_blocking(move || {
        let segs: Vec<&str> = segments.iter().map(String::as_str).collect();
        route(&registry, &method, &segs, &query, &body)
    })
    .await
    .unwrap_or_else(|_| error(500, "the request failed inside the proxy"));
    write(&mut stream, response).await
}

/// Whether `Authorization: Bearer <token>` carries `token` (compared in
/// time that does not depend on where they differ).
fn bearer_matches(header: Option<&str>, token: &str) -> bool {
    let Some(given) = header.and_then(|h| h.strip_prefix("Bearer ")) else { return false };
    let (a, b) = (given.trim().as_bytes(), token.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// The value of `name` in a query string (`a=1&b=2`).
fn query_value<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query.split('&').find_map(|kv| kv.split_once('=').filter(|(k, _)| *k == name).map(|(_, v)| v))
}

fn route(registry: &Registry, method: &str, segs: &[&str], query: &str, body: &str) -> Response {
    match (method, segs) {
        ("GET", []) => Response {
            status: 200,
            content_type: "text/plain",
            body: "chash-proxy admin: GET /stats, GET /metrics, GET /pools, POST /pools/POOL/servers, \
                   DELETE /pools/POOL/servers/ID[?drain=SECS], PUT /pools/POOL/servers/ID/weight, \
                   POST /pools/POOL/servers/ID/eject|restore, POST /reload\n"
                .into(),
        },
        ("GET", ["stats"]) => json_response(200, stats_json(registry, true)),
        ("GET", ["pools"]) => json_response(200, stats_json(registry, false)),
        ("GET", ["metrics"]) => {
            Response { status: 200, content_type: "text/plain; version=0.0.4", body: metrics(registry) }
        }
        (method, ["reload"] | ["pools", _, "servers", ..]) if method != "GET" && registry.membership().is_some() => {
            let m = registry.membership().unwrap_or_default();
            error(
                409,
                format!(
                    "this proxy's membership comes from {} {} and follows it: change it there (chash config \
                     add|remove|weight|eject|restore --etcd URL/PREFIX ...), every proxy then applies it",
                    m.source, m.key
                ),
            )
        }
        ("POST", ["reload"]) => match registry.reload() {
            Ok(results) => {
                let list: Vec<Value> = results
                    .into_iter()
                    .map(|(pool, r)| match r {
                        Ok(c) => json!({ "pool": pool, "change": c.change, "moved_fraction": c.moved_fraction, "live_servers": c.live_servers, "warmup_seconds": c.warmup_seconds }),
                        Err(e @ PoolError::NeedsRestart { .. }) => json!({ "pool": pool, "warning": e.to_string() }),
                        Err(e) => json!({ "pool": pool, "error": e.to_string() }),
                    })
                    .collect();
                // Refused (409) when a pool kept its last good config.
                let refused = list.iter().any(|v| v.get("error").is_some());
                json_response(if refused { 409 } else { 200 }, json!({ "reloaded": list }))
            }
            Err(e) => error(400, e.to_string()),
        },
        (_, ["pools", pool, rest @ ..]) => {
            let Some(pool) = registry.pool(pool) else { return error(404, format!("no pool {pool:?}")) };
            if let Some(unknown) = query
                .split('&')
                .filter(|kv| !kv.is_empty())
                .find(|kv| !kv.starts_with("drain=") && !kv.starts_with("migrate="))
            {
                return error(
                    400,
                    format!(
                        "unknown query parameter {unknown:?}: the ones there are drain=SECS and migrate=true|false"
                    ),
                );
            }
            let migrate = match query_value(query, "migrate") {
                None => None,
                Some("1" | "true" | "yes") => Some(true),
                Some("0" | "false" | "no") => Some(false),
                Some(other) => return error(400, format!("migrate={other:?}: give true or false")),
            };
            if migrate == Some(true) && query_value(query, "drain").is_some() {
                return error(
                    400,
                    "drain and migrate do not go together: a Redis pool migrates, a memcached pool drains",
                );
            }
            let drain = match (method, query_value(query, "drain")) {
                (_, None) => None,
                ("DELETE", Some(secs)) => match secs.parse::<u64>() {
                    Ok(secs) if crate::protocols::of(pool.spec()).drains() => {
                        Some(std::time::Duration::from_secs(secs))
                    }
                    Ok(_) => {
                        return error(
                            400,
                            format!(
                                "drain applies to memcached pools (warm-up reads memcached values); this pool \
                                 speaks {}",
                                pool.protocol()
                            ),
                        )
                    }
                    Err(_) => return error(400, format!("drain={secs:?}: give whole seconds, e.g. drain=60")),
                },
                (_, Some(_)) => return error(400, "drain goes with DELETE /pools/POOL/servers/ID"),
            };
            let edit = match (method, rest) {
                ("POST", ["servers"]) => match body.parse::<chash::ServerLine>() {
                    Ok(line) => Edit::Add(line),
                    Err(e) => return error(400, e.to_string()),
                },
                ("DELETE", ["servers", id]) => Edit::Remove((*id).to_owned()),
                ("PUT" | "POST", ["servers", id, "weight"]) => match body.parse::<u32>() {
                    Ok(w) => Edit::Weight((*id).to_owned(), w),
                    Err(_) => return error(400, format!("weight {body:?} is not a whole number from 1")),
                },
                ("POST", ["servers", id, "eject"]) => Edit::Eject((*id).to_owned()),
                ("POST", ["servers", id, "restore"]) => Edit::Restore((*id).to_owned()),
                ("GET", []) => return json_response(200, pool_json(&pool.stats(), true)),
                _ => {
                    return error(404, format!("no such endpoint: {method} /pools/{}/{}", pool.name(), rest.join("/")))
                }
            };
            let result = match drain {
                Some(_) => registry.edit_draining(pool.name(), &edit, drain),
                None => registry.edit_migrating(pool.name(), &edit, migrate),
            };
            match result {
                Ok(change) => {
                    let mut v = json!(change);
                    if !change.persisted {
                        v["note"] = json!(
                            "not persisted: the config file still has the old membership; a proxy started from it places \
                             keys differently (chash proxy --persist writes changes back; chash config edits the file)"
                        );
                    }
                    json_response(200, v)
                }
                Err(e @ PoolError::Persist { .. }) => error(409, e.to_string()),
                Err(e @ (PoolError::UnknownServer { .. } | PoolError::UnknownPool(_))) => error(404, e.to_string()),
                Err(e) => error(400, e.to_string()),
            }
        }
        _ => error(404, format!("no such endpoint: {method} /{}", segs.join("/"))),
    }
}

fn counters_json(v: &mut Value, counters: &[(Desc, u64)]) {
    for (d, value) in counters {
        v[d.name] = json!(value);
    }
}

fn pool_json(p: &PoolSnapshot, counters: bool) -> Value {
    let servers: Vec<Value> = p
        .servers
        .iter()
        .map(|s| {
            let mut v = json!({
                "id": s.id,
                "weight": s.weight,
                "name": s.name,
                "address": s.address,
                "state": s.state,
            });
            if let Some(g) = &s.group {
                v["group"] = json!({
                    "primary": g.primary,
                    "failing_over": g.switching,
                    "failovers": g.failovers,
                    "config_epoch": g.epoch,
                    "replicas": g.replicas.iter().map(|r| json!({
                        "address": r.address,
                        "usable": r.usable,
                        "why": r.why,
                        "lag_seconds": r.lag,
                        "reads": r.reads,
                        "zone": r.zone,
                    })).collect::<Vec<Value>>(),
                });
            }
            if counters {
                counters_json(&mut v, &s.counters);
                v["latency_us"] = json!({
                    "count": s.latency.count,
                    "mean": s.latency.mean_us(),
                    "p50": s.latency.quantile_us(0.5),
                    "p99": s.latency.quantile_us(0.99),
                    "max": s.latency.max_us,
                });
            }
            v
        })
        .collect();
    let mut v = json!({
        "name": p.name,
        "listen": p.listen,
        "distribution": p.distribution,
        "protocol": p.protocol,
        "servers": servers,
        "live_servers": p.live_servers,
        "membership_version": p.version,
        "placement_fingerprint": p.fingerprint,
        "locally_ejected": p.locally_ejected,
    });
    if counters {
        counters_json(&mut v, &p.counters);
    }
    if let Some(m) = &p.migration {
        let large: Vec<Value> = m.large_keys.iter().map(|(k, n)| json!({ "key": k, "bytes": n })).collect();
        v["migration"] = json!({
            "state": m.state,
            "phase": m.phase,
            "from": m.from,
            "last_error": m.last_error,
            "large_keys": large,
        });
    }
    v
}

fn stats_json(registry: &Registry, counters: bool) -> Value {
    let membership = registry.membership();
    let mut pools: Vec<Value> = registry.stats().iter().map(|p| pool_json(p, counters)).collect();
    if let Some(m) = &membership {
        // The membership version from a store: its revision with the
        // placement's hash.
        for p in &mut pools {
            p["membership_revision"] = json!(m.revision);
        }
    }
    let c = registry.config_status();
    let mut config = json!({
        "path": c.path.as_ref().map(|p| p.display().to_string()),
        "persist": c.persist,
        "watch": c.watch,
        "last_error": c.last_error,
    });
    put_values(&mut config, &c.values());
    let mut v = json!({
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_s": registry.shared().started.elapsed().as_secs(),
        "config": config,
        "pools": pools,
    });
    if let Some(m) = membership {
        let mut membership = json!({
            "source": m.source,
            "endpoints": m.endpoints,
            "key": m.key,
            "config_hash": m.config_hash,
            "last_error": m.last_error,
            "proxy_id": m.proxy_id,
        });
        put_values(&mut membership, &m.values());
        v["membership"] = membership;
    }
    if let Some((Some(left), _)) = registry.admin_tls().map(|t| t.expiry()) {
        v["admin_tls_cert_expiry_seconds"] = json!(left);
    }
    v
}

/// Described numbers into a JSON object: flags as booleans.
fn put_values(object: &mut Value, values: &[(Desc, u64)]) {
    for (d, value) in values {
        object[d.name] = match d.kind {
            Kind::Flag => json!(*value != 0),
            Kind::Counter | Kind::Gauge => json!(value),
        };
    }
}

fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// A metric's name in Prometheus: prefixed, and `_total` for counters
/// (memcached's `total_connections` is `..._connections_total`).
fn metric_name(prefix: &str, d: &Desc) -> String {
    match d.kind {
        Kind::Counter => format!("{prefix}_{}_total", d.name.strip_prefix("total_").unwrap_or(d.name)),
        Kind::Gauge | Kind::Flag => format!("{prefix}_{}", d.name),
    }
}

fn metric_head(out: &mut String, name: &str, d: &Desc) {
    let kind = match d.kind {
        Kind::Counter => "counter",
        Kind::Gauge | Kind::Flag => "gauge",
    };
    let _ = writeln!(out, "# HELP {name} {}", d.help.trim());
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Metric families from labelled lists of numbers: each family once, in
/// the order its number first appears, with a line per list that has it.
fn families<'a>(out: &mut String, prefix: &str, lists: impl Iterator<Item = (String, &'a Vec<(Desc, u64)>)>) {
    let mut order: Vec<(Desc, String)> = Vec::new();
    for (labels, list) in lists {
        for (d, value) in list {
            let at = match order.iter().position(|(o, _)| o.name == d.name) {
                Some(at) => at,
                None => {
                    order.push((*d, String::new()));
                    order.len() - 1
                }
            };
            let name = metric_name(prefix, d);
            let _ = writeln!(order[at].1, "{name}{{{labels}}} {value}");
        }
    }
    for (d, lines) in order {
        metric_head(out, &metric_name(prefix, &d), &d);
        out.push_str(&lines);
    }
}

fn metrics(registry: &Registry) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# HELP chash_uptime_seconds Seconds since the proxy started.");
    let _ = writeln!(out, "# TYPE chash_uptime_seconds gauge");
    let _ = writeln!(out, "chash_uptime_seconds {}", registry.shared().started.elapsed().as_secs());
    if let Some((Some(left), _)) = registry.admin_tls().map(|t| t.expiry()) {
        let _ = writeln!(
            out,
            "# HELP chash_admin_tls_cert_expiry_seconds Seconds until the admin endpoint's certificate expires."
        );
        let _ = writeln!(out, "# TYPE chash_admin_tls_cert_expiry_seconds gauge");
        let _ = writeln!(out, "chash_admin_tls_cert_expiry_seconds {left}");
    }
    for (d, value) in registry.config_status().values() {
        let name = metric_name("chash_config", &d);
        metric_head(&mut out, &name, &d);
        let _ = writeln!(out, "{name} {value}");
    }
    if let Some(m) = registry.membership() {
        for (d, value) in m.values() {
            let name = metric_name("chash_membership", &d);
            metric_head(&mut out, &name, &d);
            let _ = writeln!(out, "{name}{{source=\"{}\"}} {value}", label(&m.source));
        }
    }
    let pools = registry.stats();
    let _ = writeln!(out, "# HELP chash_pool_membership_info The pool's membership version and placement fingerprint (equal on proxies that place keys alike).");
    let _ = writeln!(out, "# TYPE chash_pool_membership_info gauge");
    for p in &pools {
        let _ = writeln!(
            out,
            "chash_pool_membership_info{{pool=\"{}\",version=\"{}\",fingerprint=\"{}\"}} 1",
            label(&p.name),
            p.version,
            p.fingerprint
        );
    }
    let _ = writeln!(
        out,
        "# HELP chash_pool_locally_ejected Servers this proxy's health checks took out (not in the version)."
    );
    let _ = writeln!(out, "# TYPE chash_pool_locally_ejected gauge");
    for p in &pools {
        let _ = writeln!(out, "chash_pool_locally_ejected{{pool=\"{}\"}} {}", label(&p.name), p.locally_ejected.len());
    }
    // Pools need not carry the same numbers (a TLS pool has its
    // certificates' expiry): each metric lists the pools that have it.
    families(&mut out, "chash_pool", pools.iter().map(|p| (format!("pool=\"{}\"", label(&p.name)), &p.counters)));
    let servers = || pools.iter().flat_map(|p| p.servers.iter().map(move |s| (p, s)));
    let labels =
        |p: &PoolSnapshot, s: &ServerSnapshot| format!("pool=\"{}\",server=\"{}\"", label(&p.name), label(&s.id));
    families(&mut out, "chash_server", servers().map(|(p, s)| (labels(p, s), &s.counters)));
    if servers().next().is_none() {
        return out;
    }
    let up = Desc { name: "up", kind: Kind::Gauge, help: "1 when the server takes keys and is reachable." };
    metric_head(&mut out, "chash_server_up", &up);
    for (p, s) in servers() {
        let _ = writeln!(out, "chash_server_up{{{}}} {}", labels(p, s), u64::from(s.state == "up"));
    }
    if servers().any(|(_, s)| s.group.is_some()) {
        type Gauge = (&'static str, &'static str, fn(&crate::stats::GroupView) -> u64);
        let gauges: [Gauge; 3] = [
            ("chash_server_group_failovers", "Sentinel groups: switches of primary this proxy has seen.", |g| {
                g.failovers
            }),
            (
                "chash_server_group_failing_over",
                "Sentinel groups: 1 while a failover holds the group's requests.",
                |g| u64::from(g.switching),
            ),
            ("chash_server_group_config_epoch", "Sentinel groups: the config epoch of the primary in use.", |g| {
                g.epoch
            }),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for (p, s) in servers() {
                if let Some(g) = &s.group {
                    let _ = writeln!(out, "{name}{{{}}} {}", labels(p, s), value(g));
                }
            }
        }
        let replicas =
            || servers().flat_map(|(p, s)| s.group.iter().flat_map(move |g| g.replicas.iter().map(move |r| (p, s, r))));
        let _ = writeln!(
            out,
            "# HELP chash_server_group_replica_usable Sentinel groups: 1 when the replica may serve reads."
        );
        let _ = writeln!(out, "# TYPE chash_server_group_replica_usable gauge");
        for (p, s, r) in replicas() {
            let _ = writeln!(
                out,
                "chash_server_group_replica_usable{{{},replica=\"{}\"}} {}",
                labels(p, s),
                label(&r.address),
                u64::from(r.usable)
            );
        }
        let _ = writeln!(out, "# HELP chash_server_group_replica_reads_total Sentinel groups: reads the replica served through this proxy.");
        let _ = writeln!(out, "# TYPE chash_server_group_replica_reads_total counter");
        for (p, s, r) in replicas() {
            let _ = writeln!(
                out,
                "chash_server_group_replica_reads_total{{{},replica=\"{}\"}} {}",
                labels(p, s),
                label(&r.address),
                r.reads
            );
        }
        let _ = writeln!(out, "# HELP chash_server_group_primary Sentinel groups: the primary in use (the label), 1.");
        let _ = writeln!(out, "# TYPE chash_server_group_primary gauge");
        for (p, s) in servers() {
            if let Some(primary) = s.group.as_ref().and_then(|g| g.primary.as_deref()) {
                let _ =
                    writeln!(out, "chash_server_group_primary{{{},primary=\"{}\"}} 1", labels(p, s), label(primary));
            }
        }
    }
    let _ = writeln!(out, "# HELP chash_server_latency_seconds Time from writing a request to reading its reply.");
    let _ = writeln!(out, "# TYPE chash_server_latency_seconds histogram");
    for (p, s) in servers() {
        s.latency.prometheus(&mut out, "chash_server_latency_seconds", &labels(p, s));
    }
    out
}

async fn write<S: AsyncWrite + Unpin>(stream: &mut S, r: Response) -> std::io::Result<()> {
    let reason = match r.status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        409 => "Conflict",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        _ => "Error",
    };
    let head = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        r.status,
        r.content_type,
        r.body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(r.body.as_bytes()).await?;
    stream.shutdown().await
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
