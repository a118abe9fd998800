//! What the registry reports of its config's sources: the config file and
//! a membership store (etcd), for `/stats` and `/metrics`.

use std::path::PathBuf;

use crate::stats::{Desc, Kind};

/// The state of a membership source other than the config file (etcd), as
/// the task that follows it reports it; shown in `/stats` and `/metrics`.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct MembershipStatus {
    /// What it is: `etcd`.
    pub source: String,
    /// Where it is reached (`http://HOST:PORT`, ...).
    pub endpoints: Vec<String>,
    /// The key of the stored config (`PREFIX/config`).
    pub key: String,
    /// The revision of the config the proxy applied (the key's
    /// `mod_revision`): the membership version, with `config_hash`.
    pub revision: i64,
    /// A hash of the applied config's text (16 hex digits).
    pub config_hash: String,
    /// Whether the source is reachable now.
    pub connected: bool,
    /// Whether the proxy started from its cache file because the source
    /// was unreachable (until the source is reached again).
    pub cache_used: bool,
    /// Why the last revision was refused, or the source is unreachable.
    pub last_error: Option<String>,
    /// Revisions refused (invalid configs, a deleted key).
    pub invalid_revisions: u64,
    /// Revisions applied since the proxy started.
    pub applied_revisions: u64,
    /// Times the connection to the source was lost and made again.
    pub reconnects: u64,
    /// This proxy's id under `PREFIX/proxies/`.
    pub proxy_id: String,
    /// Whether this proxy's registration (its lease) is live.
    pub registered: bool,
}

impl MembershipStatus {
    /// A status for `source` at `endpoints`, config key `key`.
    pub fn new(source: &str, endpoints: Vec<String>, key: String) -> MembershipStatus {
        MembershipStatus { source: source.to_owned(), endpoints, key, ..MembershipStatus::default() }
    }

    /// Its numbers, each described once for every rendering (`/stats`
    /// under `membership`, `/metrics` as `chash_membership_*`).
    pub(crate) fn values(&self) -> [(Desc, u64); 7] {
        let d = |name, kind, help| Desc { name, kind, help };
        [
            (
                d("revision", Kind::Gauge, "The revision of the stored config this proxy applied."),
                self.revision.max(0) as u64,
            ),
            (d("connected", Kind::Flag, "1 while the membership store is reachable."), u64::from(self.connected)),
            (
                d(
                    "cache_used",
                    Kind::Flag,
                    "1 while the proxy serves the config of its cache file (the store was unreachable at start).",
                ),
                u64::from(self.cache_used),
            ),
            (
                d(
                    "invalid_revisions",
                    Kind::Counter,
                    "Stored config revisions refused (invalid); the last good config stays.",
                ),
                self.invalid_revisions,
            ),
            (d("applied_revisions", Kind::Counter, "Stored config revisions applied."), self.applied_revisions),
            (
                d("reconnects", Kind::Counter, "Times the connection to the membership store was lost and made again."),
                self.reconnects,
            ),
            (
                d("registered", Kind::Flag, "1 while this proxy's registration (its lease) is live."),
                u64::from(self.registered),
            ),
        ]
    }
}

/// The config file's state, for the stats.
#[derive(Clone, Debug)]
pub struct ConfigStatus {
    /// The file, if the proxy was started from one.
    pub path: Option<PathBuf>,
    /// Why the last reload was refused (`None`: it was applied).
    pub last_error: Option<String>,
    /// Reloads refused so far.
    pub reload_failures: u64,
    /// Reloads applied so far.
    pub reloads: u64,
    /// Whether admin changes are written back (`--persist`).
    pub persist: bool,
    /// Whether the file is watched for changes.
    pub watch: bool,
}

impl ConfigStatus {
    /// Its numbers, each described once for every rendering (`/stats`
    /// under `config`, `/metrics` as `chash_config_*`).
    pub(crate) fn values(&self) -> [(Desc, u64); 3] {
        let d = |name, kind, help| Desc { name, kind, help };
        [
            (d("reloads", Kind::Counter, "Config reloads applied."), self.reloads),
            (
                d("reload_failures", Kind::Counter, "Config reloads refused (a file that does not parse, or that a pool refuses); the last good config stays."),
                self.reload_failures,
            ),
            (
                d("last_reload_ok", Kind::Flag, "1 when the last reload was applied (or none was tried), 0 when it was refused."),
                u64::from(self.last_error.is_none()),
            ),
        ]
    }
}
