//! Counters, gauges and latency histograms: one list of each, from which
//! every rendering is made (memcached `stats`, Redis `INFO`, the admin
//! endpoint's JSON and Prometheus text, twemproxy's stats document).
//!
//! Counters that requests update are kept per worker thread ([`PerWorker`])
//! and summed when read, so the threads never write to the same cache line.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Whether a value only grows or goes up and down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Kind {
    /// Only grows (Prometheus `counter`).
    Counter,
    /// Goes up and down (Prometheus `gauge`).
    Gauge,
    /// 0 or 1 (a Prometheus `gauge`; `true`/`false` in JSON).
    Flag,
}

/// A counter's name, kind and meaning.
#[derive(Clone, Copy, Debug)]
pub struct Desc {
    /// Its name in every rendering (Prometheus adds a prefix and `_total`).
    pub name: &'static str,
    /// Counter or gauge.
    pub kind: Kind,
    /// One line saying what it counts.
    pub help: &'static str,
}

/// Declares a struct of atomic counters with its [`Desc`] list, in one
/// place: the field's doc comment is its help text.
macro_rules! counters {
    ($(#[$meta:meta])* pub struct $name:ident { $($(#[doc = $doc:literal])+ $field:ident: $kind:ident,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Default)]
        pub struct $name {
            $($(#[doc = $doc])+ pub $field: AtomicU64,)+
        }

        impl $name {
            /// Every counter, in rendering order.
            pub const DESCS: &'static [Desc] = &[
                $(Desc { name: stringify!($field), kind: Kind::$kind, help: concat!($($doc),+) },)+
            ];

            /// The values, in [`Self::DESCS`] order.
            pub fn values(&self) -> Vec<u64> {
                vec![$(self.$field.load(Relaxed),)+]
            }
        }
    };
}

counters! {
    /// A pool's counters (one set per worker thread).
    pub struct PoolCounters {
        /// Client connections open now.
        curr_connections: Gauge,
        /// Client connections accepted.
        total_connections: Counter,
        /// Client connections refused (over client_connections).
        rejected_connections: Counter,
        /// Client connections the client closed.
        client_eof: Counter,
        /// Client connections closed on an error (a read error, or a request that cannot be parsed).
        client_err: Counter,
        /// Client connections closed for holding too many unread reply bytes.
        client_overflows: Counter,
        /// Client connections closed for sending an HTTP request (a browser, or a request forgery aimed at the cache: nothing it sent was run).
        http_refused: Counter,
        /// Redis AUTH (or HELLO AUTH) refused: a wrong user or password.
        auth_failures: Counter,
        /// Commands refused to a read-only user (NOPERM).
        noperm: Counter,
        /// Redis clients blocked now (BLPOP, XREAD ... BLOCK, ...), each on a server connection of its own.
        blocked_clients: Gauge,
        /// Blocking commands sent (each on a server connection of its client's own).
        blocking_commands: Counter,
        /// Blocking commands refused: the server had blocking_connections clients blocked already.
        blocking_refused: Counter,
        /// Pub/sub messages the proxy's subscriptions received from servers (each fanned out to its listeners).
        pubsub_messages: Counter,
        /// Pub/sub clients disconnected for letting too many unread messages pile up.
        pubsub_slow_clients: Counter,
        /// Subscriptions moved to a channel's new server after a membership change.
        pubsub_moves: Counter,
        /// Pub/sub links to servers lost (and made again).
        pubsub_link_losses: Counter,
        /// Client requests (a multi-key request counts once).
        requests: Counter,
        /// Client requests answered with an error.
        errors: Counter,
        /// Client requests answered with an error the proxy made up because no server could answer.
        forward_errors: Counter,
        /// Parts sent to servers for multi-key requests split by server.
        fragments: Counter,
        /// Retrieval commands (`mg` included).
        cmd_get: Counter,
        /// Keys asked for by retrieval commands.
        get_keys: Counter,
        /// Keys found.
        get_hits: Counter,
        /// Storage commands (`ms` included).
        cmd_set: Counter,
        /// Meta commands (`mg`, `ms`, `md`, `ma`, `me`, `mn`).
        cmd_meta: Counter,
        /// Requests retried on a key's next server after its own failed them (failover, replicas; requests for a failed-over server's keys go to the next server directly and are not counted here).
        failover_requests: Counter,
        /// Writes a replica failed (the client got another replica's reply).
        replica_failures: Counter,
        /// Reads that missed on a key's first replica and were found on another.
        replica_reads: Counter,
        /// Warm-up: reads that missed on a key's server and found it on its previous one.
        warmup_hits: Counter,
        /// Warm-up: reads that missed on a key's server and on its previous ones too.
        warmup_misses: Counter,
        /// Warm-up: values copied to a key's new server (`add`: a concurrent write wins).
        warmup_copies: Counter,
        /// Warm-up: deletes sent to a key's previous servers for writes during the window.
        warmup_deletes: Counter,
        /// Large Redis replies passed on as they arrived.
        streamed_replies: Counter,
        /// TLS handshakes with clients completed.
        tls_handshakes: Counter,
        /// TLS handshakes with clients that failed (no or a bad client certificate, not TLS, an old protocol version, ...).
        tls_handshake_errors: Counter,
        /// TLS handshakes with clients not completed within the handshake timeout (the connection was closed).
        tls_handshake_timeouts: Counter,
    }
}

counters! {
    /// A pool's events that are not per request (one set per pool).
    pub struct PoolEvents {
        /// Membership changes applied.
        membership_changes: Counter,
        /// Times a server was ejected by health (auto_eject_hosts).
        server_ejects: Counter,
        /// Times a server was failed over (failover: next, replicas): its keys sent to their next servers.
        failovers: Counter,
        /// Load held on all its servers (distribution bounded: requests in flight).
        load: Gauge,
        /// Migrations (Redis, `migrate`) completed.
        migrations_completed: Counter,
    }
}

counters! {
    /// A server's counters (one set per worker thread).
    pub struct ServerCounters {
        /// Requests queued for the server.
        requests: Counter,
        /// Bytes of those requests.
        request_bytes: Counter,
        /// Replies read from the server.
        responses: Counter,
        /// Bytes of those replies.
        response_bytes: Counter,
        /// Requests answered with an error (no connection, timeout, connection lost).
        errors: Counter,
        /// Of those, timeouts.
        timeouts: Counter,
        /// Connections the server closed.
        server_eof: Counter,
        /// Connections that failed (refused, reset, failed set-up, bad reply).
        server_err: Counter,
        /// Connections closed because a reply timed out.
        server_timedout: Counter,
        /// Connections open now.
        server_connections: Gauge,
        /// Connections made.
        connections_made: Counter,
        /// Requests waiting to be written to the server.
        in_queue: Gauge,
        /// Bytes of those requests.
        in_queue_bytes: Gauge,
        /// Requests written and waiting for their reply.
        out_queue: Gauge,
        /// Bytes of those requests.
        out_queue_bytes: Gauge,
    }
}

counters! {
    /// A server's events that are not per request.
    pub struct ServerEvents {
        /// Times the server was ejected (by health or by hand).
        ejections: Counter,
        /// When it was last ejected by health, in µs since the Unix epoch (0: never).
        ejected_at_us: Gauge,
        /// Load held on the server (distribution bounded: requests in flight).
        load: Gauge,
    }
}

/// One value per worker thread, each on its own cache lines.
#[derive(Debug)]
pub(crate) struct PerWorker<T> {
    slots: Box<[Padded<T>]>,
}

#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded<T>(T);

impl<T: Default> PerWorker<T> {
    /// `workers` default values.
    pub(crate) fn new(workers: usize) -> PerWorker<T> {
        PerWorker { slots: (0..workers.max(1)).map(|_| Padded(T::default())).collect() }
    }
}

impl<T> PerWorker<T> {
    /// `workers` values made by `make`.
    pub(crate) fn with(workers: usize, mut make: impl FnMut() -> T) -> PerWorker<T> {
        PerWorker { slots: (0..workers.max(1)).map(|_| Padded(make())).collect() }
    }

    /// The calling worker thread's value.
    #[inline]
    pub(crate) fn local(&self) -> &T {
        // A worker's index is below the count its values were made for;
        // the first's otherwise (no division on every request).
        let slots = &self.slots;
        &slots.get(crate::workers::current_index()).unwrap_or(&slots[0]).0
    }

    /// Every worker's value.
    pub(crate) fn all(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().map(|p| &p.0)
    }
}

/// Sums the values of [`PoolCounters::values`]-like lists.
pub(crate) fn sum<'a>(lists: impl Iterator<Item = Vec<u64>> + 'a) -> Vec<u64> {
    let mut total: Vec<u64> = Vec::new();
    for list in lists {
        if total.is_empty() {
            total = list;
        } else {
            for (t, v) in total.iter_mut().zip(list) {
                // Gauges are kept per worker as increments and decrements
                // of a u64: wrapping sums give the right total.
                *t = t.wrapping_add(v);
            }
        }
    }
    total
}

/// Upper bounds of the latency buckets, in microseconds.
pub(crate) const LATENCY_BUCKETS_US: [u64; 15] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000, 2_500_000, 10_000_000,
];

/// A latency histogram with fixed buckets (plus one for everything slower)
/// and the largest value seen.
#[derive(Debug, Default)]
pub(crate) struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS_US.len() + 1],
    sum_us: AtomicU64,
    count: AtomicU64,
    max_us: AtomicU64,
}

/// A histogram's values at one moment (several histograms merged).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HistogramValues {
    /// Observations per bucket ([`LATENCY_BUCKETS_US`], then the rest).
    pub buckets: Vec<u64>,
    /// Sum of all observations, µs.
    pub sum_us: u64,
    /// Observations.
    pub count: u64,
    /// The largest observation, µs.
    pub max_us: u64,
}

/// One observation, placed in its bucket: made once, recorded as often
/// as it happened (the requests of one batch, answered in one read).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sample {
    us: u64,
    bucket: usize,
}

impl Sample {
    /// `d`, to be recorded.
    pub(crate) fn of(d: Duration) -> Sample {
        let us = d.as_micros().min(u128::from(u64::MAX)) as u64;
        let bucket = LATENCY_BUCKETS_US.iter().position(|&b| us <= b).unwrap_or(LATENCY_BUCKETS_US.len());
        Sample { us, bucket }
    }
}

impl Histogram {
    /// Records one observation.
    pub(crate) fn observe(&self, d: Duration) {
        self.record_n(Sample::of(d), 1);
    }

    /// Records `n` observations of one value.
    #[inline]
    pub(crate) fn record_n(&self, s: Sample, n: u64) {
        self.buckets[s.bucket].fetch_add(n, Relaxed);
        self.sum_us.fetch_add(s.us.wrapping_mul(n), Relaxed);
        self.count.fetch_add(n, Relaxed);
        // Looked at first: the largest rarely changes, and a look is
        // cheaper than an exchange.
        if self.max_us.load(Relaxed) < s.us {
            self.max_us.fetch_max(s.us, Relaxed);
        }
    }

    /// The values now.
    pub(crate) fn values(&self) -> HistogramValues {
        HistogramValues {
            buckets: self.buckets.iter().map(|b| b.load(Relaxed)).collect(),
            sum_us: self.sum_us.load(Relaxed),
            count: self.count.load(Relaxed),
            max_us: self.max_us.load(Relaxed),
        }
    }
}

impl HistogramValues {
    /// Adds another histogram's values.
    pub fn merge(&mut self, other: &HistogramValues) {
        if self.buckets.is_empty() {
            self.buckets = vec![0; other.buckets.len()];
        }
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
        self.sum_us += other.sum_us;
        self.count += other.count;
        self.max_us = self.max_us.max(other.max_us);
    }

    /// Mean in microseconds.
    pub fn mean_us(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum_us as f64 / self.count as f64
        }
    }

    /// An upper estimate of quantile `q`, in µs: the bound of the bucket
    /// it falls in, never more than the largest value seen (so the top
    /// bucket, which has no bound, reports that value).
    pub fn quantile_us(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let target = ((q * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b;
            if seen >= target {
                return LATENCY_BUCKETS_US.get(i).map_or(self.max_us, |&bound| bound.min(self.max_us));
            }
        }
        self.max_us
    }

    /// Prometheus histogram lines for `name{labels}` (seconds).
    pub fn prometheus(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            cumulative += b;
            let le = LATENCY_BUCKETS_US.get(i).map_or("+Inf".to_owned(), |us| format!("{}", *us as f64 / 1e6));
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum_us as f64 / 1e6);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_bounded_by_the_largest_value() {
        let h = Histogram::default();
        assert_eq!(h.values().quantile_us(0.99), 0);
        for _ in 0..90 {
            h.observe(Duration::from_micros(80));
        }
        for _ in 0..10 {
            h.observe(Duration::from_millis(1300));
        }
        let v = h.values();
        assert_eq!(v.quantile_us(0.5), 100);
        assert_eq!(v.quantile_us(0.99), 1_300_000, "the bucket's bound (2.5 s) is above anything seen");
        h.observe(Duration::from_secs(42));
        let v = h.values();
        assert_eq!(v.quantile_us(1.0), 42_000_000, "the open top bucket reports the largest value");
        let mut merged = HistogramValues::default();
        merged.merge(&v);
        merged.merge(&v);
        assert_eq!((merged.count, merged.max_us), (202, 42_000_000));
    }

    #[test]
    fn counters_are_listed_with_their_help() {
        assert_eq!(PoolCounters::DESCS[0].name, "curr_connections");
        assert_eq!(PoolCounters::DESCS[0].kind, Kind::Gauge);
        assert!(PoolCounters::DESCS.iter().all(|d| !d.help.trim().is_empty()));
        let c = PoolCounters::default();
        c.requests.fetch_add(3, Relaxed);
        let at = PoolCounters::DESCS.iter().position(|d| d.name == "requests").unwrap();
        assert_eq!(c.values()[at], 3);
        // Gauges go below zero on one worker and above on another.
        let a = ServerCounters::default();
        let b = ServerCounters::default();
        a.in_queue.fetch_sub(1, Relaxed);
        b.in_queue.fetch_add(3, Relaxed);
        let at = ServerCounters::DESCS.iter().position(|d| d.name == "in_queue").unwrap();
        assert_eq!(sum([a.values(), b.values()].into_iter())[at], 2);
    }
}

/// Every counter of a pool and its servers at one moment: what each
/// rendering is made from.
#[derive(Clone, Debug)]
pub struct PoolSnapshot {
    /// The pool name.
    pub name: String,
    /// Its listen address as configured.
    pub listen: String,
    /// Its distribution's name.
    pub distribution: &'static str,
    /// The protocol it speaks (`memcached`, `redis`).
    pub protocol: &'static str,
    /// Servers taking keys now.
    pub live_servers: usize,
    /// `PoolCounters` then `PoolEvents`, summed over workers.
    pub counters: Vec<(Desc, u64)>,
    /// Its servers, in config order.
    pub servers: Vec<ServerSnapshot>,
    /// [`PoolConfig::version`](chash::PoolConfig::version) of its config:
    /// equal for proxies that place keys from the same membership.
    pub version: String,
    /// The config placement's [fingerprint](chash::Snapshot::fingerprint).
    pub fingerprint: String,
    /// Servers this proxy's health checks took out (`auto_eject_hosts`):
    /// local, not part of the version or fingerprint.
    pub locally_ejected: Vec<String>,
    /// A migration in progress (its numbers are in `counters`).
    pub migration: Option<MigrationView>,
}

/// A migration in progress, as `/stats` shows it.
#[derive(Clone, Debug)]
pub struct MigrationView {
    /// The config's `migrate_state` (`armed`, `moving`).
    pub state: &'static str,
    /// Where this proxy is: `hold`, `moving`, `done`.
    pub phase: &'static str,
    /// The server lines before the change.
    pub from: Vec<String>,
    /// The mover's last error.
    pub last_error: Option<String>,
    /// Large keys found (up to 100) and their sizes.
    pub large_keys: Vec<(String, u64)>,
}

/// One server's counters at one moment.
#[derive(Clone, Debug)]
pub struct ServerSnapshot {
    /// Its id.
    pub id: String,
    /// Its weight.
    pub weight: u32,
    /// Its name, if the server line gives one.
    pub name: Option<String>,
    /// Where it is reached.
    pub address: String,
    /// `up`, `down`, `ejected` or `auto-ejected`.
    pub state: &'static str,
    /// `ServerCounters` then `ServerEvents`, summed over workers.
    pub counters: Vec<(Desc, u64)>,
    /// Time from writing a request to reading its reply.
    pub latency: HistogramValues,
    /// A Sentinel group's state, when the server is one.
    pub group: Option<GroupView>,
}

/// A Sentinel master group as `/stats` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupView {
    /// Its primary now (`HOST:PORT`), once known.
    pub primary: Option<String>,
    /// A failover is under way: its requests wait for the new primary.
    pub switching: bool,
    /// Switches of primary this proxy has seen.
    pub failovers: u64,
    /// The config epoch of its primary.
    pub epoch: u64,
    /// Its replicas, as the Sentinels list them.
    pub replicas: Vec<ReplicaView>,
}

/// A group's replica as `/stats` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicaView {
    /// `HOST:PORT`.
    pub address: String,
    /// Whether it gets reads now (with a read policy that reads replicas).
    pub usable: bool,
    /// Why not, when it does not.
    pub why: Option<String>,
    /// Seconds since it last acknowledged the primary's stream (Redis's
    /// `lag`), when the primary lists it.
    pub lag: Option<u64>,
    /// Reads it has served through this proxy.
    pub reads: u64,
    /// Its zone (`server_zones`), when named.
    pub zone: Option<String>,
}

impl PoolSnapshot {
    /// The value of the pool counter `name` (0 if there is none).
    pub fn get(&self, name: &str) -> u64 {
        value(&self.counters, name)
    }
}

impl ServerSnapshot {
    /// The value of the server counter `name` (0 if there is none).
    pub fn get(&self, name: &str) -> u64 {
        value(&self.counters, name)
    }
}

fn value(counters: &[(Desc, u64)], name: &str) -> u64 {
    counters.iter().find(|(d, _)| d.name == name).map_or(0, |(_, v)| *v)
}

/// Pairs descriptions with values.
pub(crate) fn described(descs: &'static [Desc], values: Vec<u64>) -> impl Iterator<Item = (Desc, u64)> {
    descs.iter().copied().zip(values)
}
