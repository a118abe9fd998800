//! Where a read goes in a Sentinel pool (`read_policy`): the group's
//! primary or one of its usable replicas, those in the proxy's zone first.
//! Writes, scripts, blocking commands and transactions never come here:
//! they go to the primary.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use bytes::Bytes;
use chash::ReadPolicy;

use crate::backend::{Address, Server, Standby};

/// Whether a command only reads (its command-table flags say it does not
/// write and does not block; scripts and functions are never reads here).
pub(crate) fn is_read(args: &[Bytes]) -> bool {
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
    let replica = || (!pick.is_empty()).then(|| pick[turn % pick.len()].server.clone());
    let primary_usable = m.target.borrow().usable().is_some() && !primary.is_down();
    Ok(match policy {
        ReadPolicy::Primary => primary.clone(),
        ReadPolicy::PreferPrimary if primary_usable => primary.clone(),
        ReadPolicy::PreferPrimary | ReadPolicy::PreferReplica => replica().unwrap_or_else(|| primary.clone()),
        ReadPolicy::Replica => replica().ok_or_else(|| {
            format!("no replica of group {} may serve reads now (read_policy: replica); see /stats", m.name)
        })?,
        ReadPolicy::Any => match turn % (pick.len() + 1) {
            0 => primary.clone(),
            _ => replica().unwrap_or_else(|| primary.clone()),
        },
    })
}
