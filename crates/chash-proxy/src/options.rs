//! Process-level settings (command-line flags rather than pool settings),
//! shared by every connection.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Default time a graceful shutdown waits for in-flight requests.
pub(crate) const DEFAULT_DRAIN: Duration = Duration::from_secs(5);

/// Default budget of reply bytes a client may leave unread before the
/// proxy stops reading its requests.
pub const DEFAULT_CLIENT_BUFFER: usize = 4 << 20;

/// How often a watched config file is checked for changes; a change is
/// applied once the file has stayed the same for one more interval.
pub(crate) const WATCH_INTERVAL: Duration = Duration::from_millis(250);

/// Default interval of twemproxy's stats aggregation (its `-i`).
pub(crate) const DEFAULT_STATS_INTERVAL: Duration = Duration::from_secs(30);

/// Process-level options.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ProxyOptions {
    /// The admin HTTP endpoint's address (`None`: none). Defaults to none.
    pub admin_addr: Option<SocketAddr>,
    /// When `admin_addr` is taken by another process, serve the admin
    /// endpoint on a free port of the same address instead (logged)
    /// rather than refuse to start. Defaults to false.
    pub admin_fallback: bool,
    /// Where twemproxy's stats document is served (`None`: not served).
    /// Defaults to none.
    pub stats_addr: Option<SocketAddr>,
    /// How often the stats document's counters are refreshed. Defaults to
    /// 30 s, as twemproxy's.
    pub stats_interval: Duration,
    /// Largest value (memcached) or argument (Redis) accepted from clients;
    /// larger ones are refused without being buffered. `None`: 1 MiB for
    /// memcached pools, 64 MiB for Redis pools.
    pub max_value_size: Option<usize>,
    /// Close client connections idle this long. Defaults to never.
    pub client_idle_timeout: Option<Duration>,
    /// Reply bytes a client may leave unread before the proxy stops
    /// reading its requests (16 times that and it is disconnected).
    /// Defaults to 4 MiB.
    pub client_buffer: usize,
    /// How long a client's TLS handshake may take before its connection
    /// is closed. Defaults to 10 s.
    pub tls_handshake_timeout: Duration,
    /// The config file, for reloads (SIGHUP, `POST /reload`, and when it
    /// changes on disk, with `watch_config`).
    pub config_path: Option<PathBuf>,
    /// Write every admin-endpoint membership change back to the config
    /// file (atomically), so that a restart places keys as the live proxy
    /// does. Defaults to false: changes live in memory only (and say so).
    pub persist: bool,
    /// Reload when the config file is replaced or rewritten (a rename, a
    /// rewrite, a ConfigMap's symlink swap), checked every
    /// `WATCH_INTERVAL`. Defaults to true.
    pub watch_config: bool,
    /// Requests to the admin endpoint that change anything need
    /// `Authorization: Bearer <token>`; reading stays open. Defaults to
    /// none.
    pub admin_token: Option<String>,
    /// Serve the admin endpoint on a non-loopback address without a token.
    /// Defaults to false (refused at start).
    pub admin_insecure: bool,
    /// Serve the admin endpoint over TLS with this certificate and key
    /// (`cert`, `key`; `client_ca`: clients must present a certificate
    /// chaining to it), reloaded with the pools' TLS files. Defaults to
    /// none (plain HTTP).
    pub admin_tls: Option<chash::PoolTls>,
    /// How long a graceful shutdown waits for in-flight requests. Defaults
    /// to 5 s.
    pub drain: Duration,
    /// Accept keys with control bytes, as memcached and twemproxy do
    /// (protocol.txt forbids them; refused by default).
    pub lenient_keys: bool,
    /// Worker threads, each a single-threaded runtime with its own client
    /// and backend connections (see the `workers` module). `None`: no
    /// worker threads; connections run on the runtime that calls
    /// [`start`](crate::start).
    pub threads: Option<usize>,
    /// Pool name to listen address, in place of the config's `listen`
    /// (several proxies from one stored config on one host). Defaults to
    /// none.
    pub listen_overrides: std::collections::HashMap<String, String>,
    /// How fast a migration's mover moves keys (Redis pools, `migrate`).
    pub migrate: crate::pool::MoveSettings,
}

impl Default for ProxyOptions {
    fn default() -> Self {
        ProxyOptions {
            admin_addr: None,
            admin_fallback: false,
            stats_addr: None,
            stats_interval: DEFAULT_STATS_INTERVAL,
            max_value_size: None,
            client_idle_timeout: None,
            client_buffer: DEFAULT_CLIENT_BUFFER,
            tls_handshake_timeout: crate::tls::HANDSHAKE_TIMEOUT,
            config_path: None,
            persist: false,
            watch_config: true,
            admin_token: None,
            admin_insecure: false,
            admin_tls: None,
            drain: DEFAULT_DRAIN,
            lenient_keys: false,
            threads: None,
            listen_overrides: std::collections::HashMap::new(),
            migrate: crate::pool::MoveSettings::default(),
        }
    }
}

impl ProxyOptions {
    /// The largest value a pool's clients may send: `--max-value-size`,
    /// else the protocol's `default`.
    pub fn max_value(&self, default: usize) -> usize {
        self.max_value_size.unwrap_or(default)
    }
}

/// Process-wide settings and state shared by every connection.
#[derive(Debug)]
pub struct Shared {
    /// The options the proxy was started with.
    pub options: ProxyOptions,
    /// When it started.
    pub started: Instant,
}
