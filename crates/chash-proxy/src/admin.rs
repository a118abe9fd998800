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
//! Changes answer with the share of the key space that moved. Server ids go
//! in the path percent-encoded where needed (`/` as `%2F`).

use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::pool::{Ejection, Member, Pool};
use crate::proxy::Proxy;

const MAX_HEAD: usize = 16 * 1024;
const MAX_BODY: usize = 64 * 1024;

/// Serves admin requests until shutdown.
pub async fn serve(listener: TcpListener, proxy: Arc<Proxy>, mut stop: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.changed() => return,
        };
        let Ok((stream, _)) = accepted else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let proxy = proxy.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(10), handle(stream, proxy)).await;
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

async fn handle(mut stream: TcpStream, proxy: Arc<Proxy>) -> std::io::Result<()> {
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
    let length = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
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
    let path = target.split('?').next().unwrap_or("/");
    let segments: Vec<String> = path.split('/').filter(|s| !s.is_empty()).map(percent_decode).collect();
    let segs: Vec<&str> = segments.iter().map(String::as_str).collect();
    let response = route(&proxy, &method, &segs, &body);
    write(&mut stream, response).await
}

fn route(proxy: &Proxy, method: &str, segs: &[&str], body: &str) -> Response {
    match (method, segs) {
        ("GET", []) => Response {
            status: 200,
            content_type: "text/plain",
            body: "chash-proxy admin: GET /stats, GET /metrics, GET /pools, POST /pools/POOL/servers, \
                   DELETE /pools/POOL/servers/ID, PUT /pools/POOL/servers/ID/weight, \
                   POST /pools/POOL/servers/ID/eject|restore, POST /reload\n"
                .into(),
        },
        ("GET", ["stats"]) => json_response(200, stats_json(proxy, true)),
        ("GET", ["pools"]) => json_response(200, stats_json(proxy, false)),
        ("GET", ["metrics"]) => {
            Response { status: 200, content_type: "text/plain; version=0.0.4", body: metrics(proxy) }
        }
        ("POST", ["reload"]) => match proxy.reload() {
            Ok(results) => {
                let list: Vec<Value> = results
                    .into_iter()
                    .map(|(pool, r)| match r {
                        Ok(c) => json!({ "pool": pool, "change": c.change, "moved_fraction": c.moved_fraction, "live_servers": c.live_servers }),
                        Err(e) => json!({ "pool": pool, "error": e.0 }),
                    })
                    .collect();
                json_response(200, json!({ "reloaded": list }))
            }
            Err(e) => error(400, e.0),
        },
        (_, ["pools", pool, rest @ ..]) => {
            let Some(pool) = proxy.pool(pool) else { return error(404, format!("no pool {pool:?}")) };
            let result = match (method, rest) {
                ("POST", ["servers"]) => match body.parse::<chash::ServerLine>() {
                    Ok(line) => pool.add_server(line),
                    Err(e) => return error(400, e.to_string()),
                },
                ("DELETE", ["servers", id]) => pool.remove_server(id),
                ("PUT" | "POST", ["servers", id, "weight"]) => match body.parse::<u32>() {
                    Ok(w) => pool.set_weight(id, w),
                    Err(_) => return error(400, format!("weight {body:?} is not a whole number from 1")),
                },
                ("POST", ["servers", id, "eject"]) => pool.eject(id),
                ("POST", ["servers", id, "restore"]) => pool.restore(id),
                ("GET", []) => return json_response(200, pool_json(&pool, true)),
                _ => return error(404, format!("no such endpoint: {method} /pools/{}/{}", pool.name, rest.join("/"))),
            };
            match result {
                Ok(change) => json_response(200, json!(change)),
                Err(e) => error(400, e.0),
            }
        }
        _ => error(404, format!("no such endpoint: {method} /{}", segs.join("/"))),
    }
}

fn state_of(m: &Member) -> &'static str {
    match m.ejected {
        Some(Ejection::Admin) => "ejected",
        Some(Ejection::Auto(_)) => "auto-ejected",
        None if m.server.is_down() => "down",
        None => "up",
    }
}

fn pool_json(pool: &Pool, counters: bool) -> Value {
    let state = pool.state();
    let servers: Vec<Value> = state
        .members
        .iter()
        .map(|m| {
            let s = &m.server.stats;
            let mut v = json!({
                "id": m.line.id,
                "weight": m.line.weight,
                "name": m.line.name,
                "state": state_of(m),
            });
            if counters {
                v["requests"] = json!(s.requests.load(Relaxed));
                v["errors"] = json!(s.errors.load(Relaxed));
                v["timeouts"] = json!(s.timeouts.load(Relaxed));
                v["ejections"] = json!(s.ejections.load(Relaxed));
                v["connections_made"] = json!(s.connections.load(Relaxed));
                v["latency_us"] = json!({
                    "mean": s.latency.mean_us(),
                    "p50": s.latency.quantile_us(0.5),
                    "p99": s.latency.quantile_us(0.99),
                    "max": s.latency.max_us(),
                });
            }
            v
        })
        .collect();
    let st = &pool.stats;
    let mut v = json!({
        "name": pool.name,
        "listen": pool.settings.listen,
        "distribution": pool.distribution().name(),
        "servers": servers,
        "live_servers": state.live().count(),
    });
    if counters {
        v["client_connections"] = json!(st.curr_connections.load(Relaxed));
        v["total_connections"] = json!(st.total_connections.load(Relaxed));
        v["rejected_connections"] = json!(st.rejected_connections.load(Relaxed));
        v["requests"] = json!(st.requests.load(Relaxed));
        v["errors"] = json!(st.errors.load(Relaxed));
        v["get_keys"] = json!(st.get_keys.load(Relaxed));
        v["get_hits"] = json!(st.get_hits.load(Relaxed));
        v["membership_changes"] = json!(st.membership_changes.load(Relaxed));
        v["streamed_replies"] = json!(st.streamed_replies.load(Relaxed));
    }
    v
}

fn stats_json(proxy: &Proxy, counters: bool) -> Value {
    let pools: Vec<Value> = proxy.pools().iter().map(|p| pool_json(p, counters)).collect();
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_s": proxy.shared.started.elapsed().as_secs(),
        "pools": pools,
    })
}

fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// A metric: name, Prometheus type, help text, and how to read it.
type Metric<T> = (&'static str, &'static str, &'static str, fn(&T) -> u64);

fn metrics(proxy: &Proxy) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# HELP chash_uptime_seconds Seconds since the proxy started.");
    let _ = writeln!(out, "# TYPE chash_uptime_seconds gauge");
    let _ = writeln!(out, "chash_uptime_seconds {}", proxy.shared.started.elapsed().as_secs());
    let pools = proxy.pools();
    let pool_counters: [Metric<Pool>; 7] = [
        ("chash_pool_client_connections", "gauge", "Client connections open.", |p| {
            p.stats.curr_connections.load(Relaxed)
        }),
        ("chash_pool_requests_total", "counter", "Client requests.", |p| p.stats.requests.load(Relaxed)),
        ("chash_pool_errors_total", "counter", "Client requests answered with an error.", |p| {
            p.stats.errors.load(Relaxed)
        }),
        ("chash_pool_get_keys_total", "counter", "Keys asked for by retrieval commands.", |p| {
            p.stats.get_keys.load(Relaxed)
        }),
        ("chash_pool_get_hits_total", "counter", "Keys found.", |p| p.stats.get_hits.load(Relaxed)),
        ("chash_pool_membership_changes_total", "counter", "Membership changes applied.", |p| {
            p.stats.membership_changes.load(Relaxed)
        }),
        ("chash_pool_streamed_replies_total", "counter", "Large Redis replies passed on as they arrived.", |p| {
            p.stats.streamed_replies.load(Relaxed)
        }),
    ];
    for (name, kind, help, get) in pool_counters {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for p in &pools {
            let _ = writeln!(out, "{name}{{pool=\"{}\"}} {}", label(&p.name), get(p));
        }
    }
    let server_counters: [Metric<Member>; 5] = [
        ("chash_server_requests_total", "counter", "Requests sent to the server.", |m| {
            m.server.stats.requests.load(Relaxed)
        }),
        ("chash_server_errors_total", "counter", "Requests that failed at the server.", |m| {
            m.server.stats.errors.load(Relaxed)
        }),
        ("chash_server_timeouts_total", "counter", "Requests that timed out.", |m| {
            m.server.stats.timeouts.load(Relaxed)
        }),
        ("chash_server_ejections_total", "counter", "Times the server was ejected.", |m| {
            m.server.stats.ejections.load(Relaxed)
        }),
        ("chash_server_up", "gauge", "1 when the server takes keys.", |m| u64::from(state_of(m) == "up")),
    ];
    for (name, kind, help, get) in server_counters {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for p in &pools {
            for m in &p.state().members {
                let _ =
                    writeln!(out, "{name}{{pool=\"{}\",server=\"{}\"}} {}", label(&p.name), label(&m.line.id), get(m));
            }
        }
    }
    let _ = writeln!(out, "# HELP chash_server_latency_seconds Time from request to reply.");
    let _ = writeln!(out, "# TYPE chash_server_latency_seconds histogram");
    for p in &pools {
        for m in &p.state().members {
            let labels = format!("pool=\"{}\",server=\"{}\"", label(&p.name), label(&m.line.id));
            m.server.stats.latency.prometheus(&mut out, "chash_server_latency_seconds", &labels);
        }
    }
    out
}

async fn write(stream: &mut TcpStream, r: Response) -> std::io::Result<()> {
    let reason = match r.status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
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
