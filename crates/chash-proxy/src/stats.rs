//! Counters and latency histograms, read by the admin endpoint (JSON and
//! Prometheus text) and the `stats` command.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds of the latency buckets, in microseconds.
pub const LATENCY_BUCKETS_US: [u64; 15] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000, 2_500_000, 10_000_000,
];

/// A latency histogram with fixed buckets (plus one for everything slower)
/// and the largest value seen.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS_US.len() + 1],
    sum_us: AtomicU64,
    count: AtomicU64,
    max_us: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let us = d.as_micros().min(u128::from(u64::MAX)) as u64;
        let i = LATENCY_BUCKETS_US.iter().position(|&b| us <= b).unwrap_or(LATENCY_BUCKETS_US.len());
        self.buckets[i].fetch_add(1, Relaxed);
        self.sum_us.fetch_add(us, Relaxed);
        self.count.fetch_add(1, Relaxed);
        self.max_us.fetch_max(us, Relaxed);
    }

    /// The largest observation, in µs.
    pub fn max_us(&self) -> u64 {
        self.max_us.load(Relaxed)
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    /// Mean in microseconds.
    pub fn mean_us(&self) -> f64 {
        let n = self.count();
        if n == 0 {
            0.0
        } else {
            self.sum_us.load(Relaxed) as f64 / n as f64
        }
    }

    /// An upper estimate of quantile `q`, in µs: the bound of the bucket
    /// it falls in, never more than the largest value seen (so the top
    /// bucket, which has no bound, reports that value).
    pub fn quantile_us(&self, q: f64) -> u64 {
        let n = self.count();
        if n == 0 {
            return 0;
        }
        let max = self.max_us();
        let target = ((q * n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b.load(Relaxed);
            if seen >= target {
                return LATENCY_BUCKETS_US.get(i).map_or(max, |&bound| bound.min(max));
            }
        }
        max
    }

    /// Prometheus histogram lines for `name{labels}` (seconds).
    pub fn prometheus(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            cumulative += b.load(Relaxed);
            let le = LATENCY_BUCKETS_US.get(i).map_or("+Inf".to_owned(), |us| format!("{}", *us as f64 / 1e6));
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum_us.load(Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count());
    }
}

/// Per-server counters.
#[derive(Debug, Default)]
pub struct ServerStats {
    /// Requests sent.
    pub requests: AtomicU64,
    /// Requests answered with an error by the proxy (connect failure, timeout, closed).
    pub errors: AtomicU64,
    /// Of those, timeouts.
    pub timeouts: AtomicU64,
    /// Times the server was ejected.
    pub ejections: AtomicU64,
    /// Connections made.
    pub connections: AtomicU64,
    /// Time from sending a request to its reply.
    pub latency: Histogram,
}

/// Per-pool counters.
#[derive(Debug, Default)]
pub struct PoolStats {
    /// Client connections open now.
    pub curr_connections: AtomicU64,
    /// Client connections accepted in all.
    pub total_connections: AtomicU64,
    /// Client connections refused (over `client_connections`).
    pub rejected_connections: AtomicU64,
    /// Client requests (a multi-key get counts once).
    pub requests: AtomicU64,
    /// Client requests answered with an error.
    pub errors: AtomicU64,
    /// Retrieval commands.
    pub cmd_get: AtomicU64,
    /// Keys asked for by retrieval commands.
    pub get_keys: AtomicU64,
    /// Keys found.
    pub get_hits: AtomicU64,
    /// Storage commands.
    pub cmd_set: AtomicU64,
    /// Membership changes applied.
    pub membership_changes: AtomicU64,
    /// Large Redis replies passed on as they arrived instead of whole.
    pub streamed_replies: AtomicU64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_bounded_by_the_largest_value() {
        let h = Histogram::default();
        assert_eq!(h.quantile_us(0.99), 0);
        for _ in 0..90 {
            h.observe(Duration::from_micros(80));
        }
        for _ in 0..10 {
            h.observe(Duration::from_millis(1300));
        }
        assert_eq!(h.quantile_us(0.5), 100);
        assert_eq!(h.quantile_us(0.99), 1_300_000, "the bucket's bound (2.5 s) is above anything seen");
        h.observe(Duration::from_secs(42));
        assert_eq!(h.quantile_us(1.0), 42_000_000, "the open top bucket reports the largest value");
        assert_eq!(h.max_us(), 42_000_000);
    }
}
