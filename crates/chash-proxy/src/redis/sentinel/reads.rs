//! Where a read goes in a Sentinel pool (`read_policy`): the group's
//! primary or one of its usable replicas, those in the proxy's zone first.
//! Writes, scripts, blocking commands and transactions never come here:
//! they go to the primary.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use crate::redis::resp::Args;
use chash::ReadPolicy;

use crate::backend::{Address, Server, Standby};

/// Whether a command only reads (its command-table flags say it does not
/// write and does not block; scripts and functions are never reads here).
pub(crate) fn is_read(args: &Args) -> bool {
    let Some(name) = args.first() else { return false };
    let script = [&b"EVAL"[..], b"EVALSHA", b"EVAL_RO", b"EVALSHA_RO", b"FCALL", b"FCALL_RO"]
        .iter()
        .any(|s| name.eq_ignore_ascii_case(s));
    !script && crate::redis::command::spec_of(args).is_some_and(|spec| !spec.write && !spec.blocking)
}

/// Turns over the replicas read from.
static TURN: AtomicU64 = AtomicU64::new(0);

/// Where a read for `primary` (a group's server) goes under `policy`.
///
/// # Errors
/// `read_policy: replica` with no usable replica: the message says so.
pub(crate) fn read_server(
    primary: &Arc<Server>,
    standbys: &[Standby],
    policy: ReadPolicy,
) -> Result<Arc<Server>, String> {
    let Address::Moving(m) = primary.address() else { return Ok(primary.clone()) };
    // The proxy's zone first, when it has replicas there.
    let near: Vec<&Standby> = standbys.iter().filter(|s| s.near).collect();
    let pick: Vec<&Standby> = if near.is_empty() { standbys.iter().collect() } else { near };
    let turn = TURN.fetch_add(1, Relaxed) as usize;
    let primary_usable = m.target.borrow().usable().is_some() && !primary.is_down();
    match choose(policy, primary_usable, pick.len(), turn) {
        Some(Pick::Primary) => Ok(primary.clone()),
        Some(Pick::Replica(i)) => Ok(pick[i].server.clone()),
        None => Err(format!("no replica of group {} may serve reads now (read_policy: replica); see /stats", m.name)),
    }
}

/// Where a read goes.
#[derive(Debug, PartialEq, Eq)]
enum Pick {
    Primary,
    /// The replica at this index of those read from.
    Replica(usize),
}

/// The policy's choice among the primary (usable or not) and `replicas`
/// usable replicas, taken in turn (`turn` counts reads); `None`: none may
/// serve it (`replica` with no replica).
fn choose(policy: ReadPolicy, primary_usable: bool, replicas: usize, turn: usize) -> Option<Pick> {
    let replica = (replicas > 0).then(|| Pick::Replica(turn % replicas));
    match policy {
        ReadPolicy::Primary => Some(Pick::Primary),
        ReadPolicy::PreferPrimary if primary_usable => Some(Pick::Primary),
        ReadPolicy::PreferPrimary | ReadPolicy::PreferReplica => replica.or(Some(Pick::Primary)),
        ReadPolicy::Replica => replica,
        ReadPolicy::Any => match turn % (replicas + 1) {
            0 => Some(Pick::Primary),
            _ => replica.or(Some(Pick::Primary)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_policy_reads_where_it_says() {
        use ReadPolicy::*;
        for turn in 0..6 {
            // Two usable replicas, a usable primary.
            assert_eq!(choose(Primary, true, 2, turn), Some(Pick::Primary));
            assert_eq!(choose(PreferPrimary, true, 2, turn), Some(Pick::Primary));
            assert_eq!(choose(PreferReplica, true, 2, turn), Some(Pick::Replica(turn % 2)));
            assert_eq!(choose(Replica, true, 2, turn), Some(Pick::Replica(turn % 2)));
            // The primary down: prefer-primary falls back to a replica;
            // primary stays (its requests wait for the failover).
            assert_eq!(choose(PreferPrimary, false, 2, turn), Some(Pick::Replica(turn % 2)));
            assert_eq!(choose(Primary, false, 2, turn), Some(Pick::Primary));
            // No usable replica: replica refuses, the preferences fall back.
            assert_eq!(choose(Replica, true, 0, turn), None);
            assert_eq!(choose(PreferReplica, true, 0, turn), Some(Pick::Primary));
            assert_eq!(choose(Any, true, 0, turn), Some(Pick::Primary));
        }
        // Any: the primary and each replica in turn.
        let any: Vec<_> = (0..6).map(|t| choose(ReadPolicy::Any, true, 2, t)).collect();
        let want =
            [Pick::Primary, Pick::Replica(1), Pick::Replica(0), Pick::Primary, Pick::Replica(0), Pick::Replica(1)];
        assert_eq!(any, want.map(Some));
    }
}
