//! [`SentinelSettings`]: a Redis pool whose server lines name Redis
//! Sentinel master groups (`sentinels:`), and how its proxy uses the
//! groups' replicas. Placement is over the group names: a failover changes
//! where a group is reached, never which group a key belongs to.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::{Error, Result};

/// How long writes of a group wait for its new primary during a failover
/// when the pool does not say (`failover_hold`).
pub const DEFAULT_FAILOVER_HOLD: Duration = Duration::from_secs(5);

/// How often the proxy asks the Sentinels when the pool does not say
/// (`sentinel_poll`); their events switch it sooner.
pub const DEFAULT_SENTINEL_POLL: Duration = Duration::from_millis(1000);

/// The replication lag (Redis's `lag`, seconds since the replica's last
/// acknowledgement) past which a replica gets no reads, when the pool does
/// not say (`replica_max_lag`).
pub const DEFAULT_REPLICA_MAX_LAG: Duration = Duration::from_secs(10);

/// Where a Sentinel pool's read-only commands go (`read_policy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReadPolicy {
    /// The primary only (`primary`, the default).
    #[default]
    Primary,
    /// The primary; a replica when the primary cannot be reached
    /// (`prefer-primary`).
    PreferPrimary,
    /// Replicas only: none usable is an error (`replica`).
    Replica,
    /// A replica; the primary when none is usable (`prefer-replica`).
    PreferReplica,
    /// The primary or any usable replica, in turn (`any`).
    Any,
}

impl ReadPolicy {
    /// Every policy by its config name.
    pub const ALL: [(&'static str, ReadPolicy); 5] = [
        ("primary", ReadPolicy::Primary),
        ("prefer-primary", ReadPolicy::PreferPrimary),
        ("replica", ReadPolicy::Replica),
        ("prefer-replica", ReadPolicy::PreferReplica),
        ("any", ReadPolicy::Any),
    ];

    /// Its name in the config file.
    pub fn name(self) -> &'static str {
        ReadPolicy::ALL.iter().find(|(_, p)| *p == self).map_or("primary", |(n, _)| n)
    }
}

impl std::str::FromStr for ReadPolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<ReadPolicy> {
        let spelled = s.replace('_', "-");
        ReadPolicy::ALL.iter().find(|(n, _)| *n == spelled).map(|(_, p)| *p).ok_or_else(|| {
            let names: Vec<&str> = ReadPolicy::ALL.iter().map(|(n, _)| *n).collect();
            Error::Config(format!("read_policy: {s:?}: use one of {}", names.join(", ")))
        })
    }
}

/// A Sentinel pool's settings: where its Sentinels are, how writes wait
/// through a failover, and where reads go.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SentinelSettings {
    /// The Sentinels, `HOST:PORT` each (`sentinels`).
    pub sentinels: Vec<String>,
    /// The Sentinels' password (`sentinel_password`), when they require one.
    pub password: Option<String>,
    /// How long a group's requests wait for its new primary while it fails
    /// over (`failover_hold` in ms; default 5000). Zero answers them at once
    /// with a retryable error (`TRYAGAIN`).
    pub failover_hold: Duration,
    /// How often the Sentinels are asked, besides their events
    /// (`sentinel_poll` in ms; default 1000).
    pub poll: Duration,
    /// Where read-only commands go (`read_policy`; default `primary`).
    pub read_policy: ReadPolicy,
    /// Replicas lagging more than this get no reads (`replica_max_lag` in
    /// seconds; default 10).
    pub replica_max_lag: Duration,
    /// Servers' zones, by `HOST:PORT` (`server_zones`): with the proxy's
    /// zone (`chash proxy --zone`), reads prefer replicas of its zone.
    pub zones: BTreeMap<String, String>,
}

impl SentinelSettings {
    /// Settings for these Sentinels with every default.
    pub fn new(sentinels: Vec<String>) -> SentinelSettings {
        SentinelSettings {
            sentinels,
            password: None,
            failover_hold: DEFAULT_FAILOVER_HOLD,
            poll: DEFAULT_SENTINEL_POLL,
            read_policy: ReadPolicy::Primary,
            replica_max_lag: DEFAULT_REPLICA_MAX_LAG,
            zones: BTreeMap::new(),
        }
    }

    /// Checks the Sentinels' addresses.
    ///
    /// # Errors
    /// [`Error::Config`] for an empty list or an address that is not
    /// `HOST:PORT`.
    pub fn check(&self) -> Result<()> {
        if self.sentinels.is_empty() {
            return Err(Error::Config("sentinels: the list is empty: name at least one HOST:PORT".into()));
        }
        for s in &self.sentinels {
            let ok = s.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !ok {
                return Err(Error::Config(format!("sentinels: {s:?} is not HOST:PORT")));
            }
        }
        if self.poll < Duration::from_millis(10) {
            return Err(Error::Config("sentinel_poll: at least 10 ms".into()));
        }
        Ok(())
    }
}

/// The Sentinel keys of a pool as written, before they are checked
/// together.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SentinelKeys {
    /// `sentinels`.
    pub sentinels: Option<Vec<String>>,
    /// `sentinel_password`.
    pub password: Option<String>,
    /// `failover_hold` (ms).
    pub failover_hold_ms: Option<u64>,
    /// `sentinel_poll` (ms).
    pub poll_ms: Option<u64>,
    /// `read_policy`.
    pub read_policy: Option<String>,
    /// `replica_max_lag` (s).
    pub replica_max_lag_secs: Option<u64>,
    /// `server_zones`.
    pub zones: Option<BTreeMap<String, String>>,
}

impl SentinelKeys {
    /// The settings these keys make, `None` without `sentinels`.
    ///
    /// # Errors
    /// [`Error::Config`] for a key without `sentinels`, or one of a
    /// memcached pool, or a bad value.
    pub fn resolve(&self, redis: bool) -> Result<Option<SentinelSettings>> {
        let Some(sentinels) = &self.sentinels else {
            let stray = [
                ("sentinel_password", self.password.is_some()),
                ("failover_hold", self.failover_hold_ms.is_some()),
                ("sentinel_poll", self.poll_ms.is_some()),
                ("read_policy", self.read_policy.is_some()),
                ("replica_max_lag", self.replica_max_lag_secs.is_some()),
                ("server_zones", self.zones.is_some()),
            ];
            if let Some((key, _)) = stray.iter().find(|(_, set)| *set) {
                return Err(Error::Config(format!(
                    "{key} applies to pools whose servers are Sentinel groups (sentinels: is not set)"
                )));
            }
            return Ok(None);
        };
        if !redis {
            return Err(Error::Config("sentinels applies to Redis pools (redis is not true)".into()));
        }
        let mut s = SentinelSettings::new(sentinels.clone());
        s.password.clone_from(&self.password);
        if let Some(ms) = self.failover_hold_ms {
            s.failover_hold = Duration::from_millis(ms);
        }
        if let Some(ms) = self.poll_ms {
            s.poll = Duration::from_millis(ms);
        }
        if let Some(p) = &self.read_policy {
            s.read_policy = p.parse()?;
        }
        if let Some(secs) = self.replica_max_lag_secs {
            s.replica_max_lag = Duration::from_secs(secs);
        }
        s.zones = self.zones.clone().unwrap_or_default();
        s.check()?;
        Ok(Some(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_resolve_with_defaults_and_checks() {
        let keys = SentinelKeys { sentinels: Some(vec!["127.0.0.1:26379".into()]), ..SentinelKeys::default() };
        let s = keys.resolve(true).unwrap().unwrap();
        assert_eq!(
            (s.failover_hold, s.poll, s.read_policy),
            (DEFAULT_FAILOVER_HOLD, DEFAULT_SENTINEL_POLL, ReadPolicy::Primary)
        );
        assert!(keys.resolve(false).unwrap_err().to_string().contains("Redis pools"));
        let stray = SentinelKeys { read_policy: Some("any".into()), ..SentinelKeys::default() };
        assert!(stray.resolve(true).unwrap_err().to_string().contains("read_policy applies"));
        let bad = SentinelKeys { sentinels: Some(vec!["nohost".into()]), ..SentinelKeys::default() };
        assert!(bad.resolve(true).unwrap_err().to_string().contains("HOST:PORT"));
        let policy = SentinelKeys { read_policy: Some("prefer_replica".into()), ..keys.clone() };
        assert_eq!(policy.resolve(true).unwrap().unwrap().read_policy, ReadPolicy::PreferReplica);
        let wrong = SentinelKeys { read_policy: Some("replicas".into()), ..keys };
        assert!(wrong.resolve(true).unwrap_err().to_string().contains("prefer-replica"));
        for (name, p) in ReadPolicy::ALL {
            assert_eq!(p.name(), name);
        }
    }
}
