//! A pool's membership as its config file states it, and the changes to
//! it ([`Edit`]): the file is the whole truth, so that every process that
//! reads it places every key on the same server, whatever sequence of
//! changes led to it.
//!
//! For most distributions the placement depends only on the servers that
//! take keys and their order, so a change is an edit of the list: a server
//! appended, deleted, re-weighted, or marked `ejected` in its place (and
//! unmarked when restored, so that it comes back where it was).
//!
//! AnchorHash (`anchor`, `memento`) also depends on the order in which
//! buckets were freed. Its servers' lines are its buckets in order; a
//! removed server's line stays, marked `removed N` (the N-th bucket freed),
//! so that the servers after it keep their buckets, and a fresh build
//! replays the removals in order. A new server takes the last freed bucket
//! (AnchorHash's own rule: only the keys that move to it move), so it
//! takes that line's place. An ejected server's bucket is freed the same
//! way (`ejected N`); restoring it takes the last freed bucket, which is
//! its own unless another was freed after it.
//!
//! Jump numbers servers by their place in the list, so it can only grow
//! and shrink at the end; other changes are refused with what to do
//! instead.

use std::fmt;

use crate::algo::Anchor;
use crate::distribution::Distribution;
use crate::node::LineState;
use crate::{Error, KeyHasher, Node, PoolConfig, Result, ServerLine};

/// A change to a pool's membership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Edit {
    /// A new server (an active line).
    Add(ServerLine),
    /// A server leaves the pool.
    Remove(String),
    /// A server's new weight.
    Weight(String, u32),
    /// An operator takes a server out; it stays a member.
    Eject(String),
    /// An ejected server comes back.
    Restore(String),
}

impl fmt::Display for Edit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Edit::Add(line) => write!(f, "add {line}"),
            Edit::Remove(id) => write!(f, "remove {id}"),
            Edit::Weight(id, w) => write!(f, "weight {id} {w}"),
            Edit::Eject(id) => write!(f, "eject {id}"),
            Edit::Restore(id) => write!(f, "restore {id}"),
        }
    }
}

/// What an edit does to the `servers:` list, in order (indices are those
/// of the list as the previous operations left it): what a file editor
/// applies to keep the rest of the file as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LineOp {
    /// The line at this index becomes this one.
    Replace(usize, ServerLine),
    /// The line at this index goes.
    Delete(usize),
    /// A line is added at the end.
    Append(ServerLine),
}

/// The lines being edited and the operations done to them.
struct Lines {
    lines: Vec<ServerLine>,
    ops: Vec<LineOp>,
}

impl Lines {
    fn replace(&mut self, at: usize, line: ServerLine) {
        self.lines[at] = line.clone();
        self.ops.push(LineOp::Replace(at, line));
    }

    fn delete(&mut self, at: usize) {
        self.lines.remove(at);
        self.ops.push(LineOp::Delete(at));
    }

    fn append(&mut self, line: ServerLine) {
        self.lines.push(line.clone());
        self.ops.push(LineOp::Append(line));
    }

    /// The line of member `id` (active or ejected).
    fn member(&self, id: &str) -> Option<usize> {
        self.lines.iter().position(|l| l.is_member() && l.id == id)
    }

    /// The freed bucket freed last (anchor's next bucket), if any.
    fn top(&self) -> Option<usize> {
        (0..self.lines.len())
            .filter(|&i| self.lines[i].state.freed().is_some())
            .max_by_key(|&i| self.lines[i].state.freed())
    }

    fn next_order(&self) -> u32 {
        self.lines.iter().filter_map(|l| l.state.freed()).max().unwrap_or(0) + 1
    }

    /// Whether line `at` is the last of the buckets and no other bucket is
    /// free: then freeing it is the same as the list without it.
    fn last_and_only_free(&self, at: usize) -> bool {
        let is_bucket = |l: &ServerLine| !matches!(l.state, LineState::Ejected(None));
        !self.lines[at + 1..].iter().any(is_bucket)
            && !self.lines.iter().enumerate().any(|(i, l)| i != at && l.state.freed().is_some())
    }
}

fn unknown(l: &Lines, pool: &str, id: &str) -> Error {
    match l.lines.iter().find(|line| line.id == id) {
        Some(line) => {
            Error::Change(format!("server {id:?} of pool {pool} was removed already (its line says `{line}`)"))
        }
        None => Error::Change(format!("pool {pool} has no server {id:?}")),
    }
}

impl PoolConfig {
    /// The members (active and ejected servers), in the file's order.
    pub fn members(&self) -> impl Iterator<Item = &ServerLine> {
        self.lines.iter().filter(|l| l.is_member())
    }

    /// This pool after `edit`, and what it does to the `servers:` lines.
    ///
    /// # Errors
    /// [`Error::Change`] for an unknown or duplicate server, ejecting an
    /// ejected server or the last active one, restoring one that is not
    /// ejected, and changes jump cannot make without renumbering servers;
    /// placement errors of the result (weights the algorithm refuses, a full
    /// anchor).
    pub fn apply(&self, edit: &Edit) -> Result<(PoolConfig, Vec<LineOp>)> {
        if let Some(m) = &self.migration {
            return Err(Error::Change(format!(
                "pool {} is migrating (migrate_state: {}; from {} servers): no other change until it completes \
                 and its record is removed (chash migrate status, then chash migrate finish)",
                self.name,
                m.state.name(),
                m.from.iter().filter(|l| l.is_member()).count()
            )));
        }
        let mut l = Lines { lines: self.lines.clone(), ops: Vec::new() };
        let anchor = self.distribution == Distribution::Anchor;
        match edit {
            Edit::Add(line) => {
                if l.member(&line.id).is_some() {
                    return Err(Error::Change(format!("pool {} already has server {:?}", self.name, line.id)));
                }
                let line = line.with_state(LineState::Active);
                match l.top().filter(|_| anchor) {
                    Some(t) => take_bucket(&mut l, t, line),
                    None => l.append(line),
                }
            }
            Edit::Remove(id) => {
                let at = l.member(id).ok_or_else(|| unknown(&l, &self.name, id))?;
                match (anchor, l.lines[at].state) {
                    (true, LineState::Active) if l.last_and_only_free(at) => l.delete(at),
                    (true, LineState::Active) => {
                        let n = l.next_order();
                        l.replace(at, l.lines[at].with_state(LineState::Removed(n)));
                    }
                    (true, LineState::Ejected(Some(n))) => l.replace(at, l.lines[at].with_state(LineState::Removed(n))),
                    _ => l.delete(at),
                }
            }
            Edit::Weight(id, weight) => {
                let at = l.member(id).ok_or_else(|| unknown(&l, &self.name, id))?;
                if *weight == 0 {
                    return Err(Error::ZeroWeight(id.clone()));
                }
                l.replace(at, ServerLine { weight: *weight, ..l.lines[at].clone() });
            }
            Edit::Eject(id) => {
                let at = l.member(id).ok_or_else(|| unknown(&l, &self.name, id))?;
                if l.lines[at].state != LineState::Active {
                    return Err(Error::Change(format!("server {id:?} of pool {} is already ejected", self.name)));
                }
                if self.servers.len() == 1 {
                    return Err(Error::Change(format!(
                        "server {id:?} is the last one of pool {} that takes keys: it cannot be ejected",
                        self.name
                    )));
                }
                let state = if anchor { LineState::Ejected(Some(l.next_order())) } else { LineState::Ejected(None) };
                l.replace(at, l.lines[at].with_state(state));
            }
            Edit::Restore(id) => {
                let at = l.member(id).ok_or_else(|| unknown(&l, &self.name, id))?;
                let state = l.lines[at].state;
                if state == LineState::Active {
                    return Err(Error::Change(format!("server {id:?} of pool {} is not ejected", self.name)));
                }
                let line = l.lines[at].with_state(LineState::Active);
                match (anchor, l.top()) {
                    (false, _) => l.replace(at, line),
                    (true, Some(t)) if t == at => l.replace(at, line),
                    (true, Some(t)) => {
                        // AnchorHash gives back the bucket freed last; the
                        // server's own bucket (if it has one) stays free.
                        // (Replacing line t and appending leave `at` in place.)
                        take_bucket(&mut l, t, line);
                        match state {
                            LineState::Ejected(Some(n)) => l.replace(at, l.lines[at].with_state(LineState::Removed(n))),
                            _ => l.delete(at),
                        }
                    }
                    (true, None) => {
                        l.delete(at);
                        l.append(line);
                    }
                }
            }
        }
        let next = self.with_lines(l.lines)?;
        if matches!(self.distribution, Distribution::Jump | Distribution::JumpBack) {
            check_jump(self.distribution, &self.servers, &next.servers, edit)?;
        }
        Ok((next, l.ops))
    }

    /// This pool (after a change) migrating from `before`: its moved keys'
    /// data moves from their servers in `before` to their servers here.
    ///
    /// # Errors
    /// [`Error::Change`] for a pool that is not a Redis pool, or a change
    /// that moves nothing between servers that stay (a reload with the
    /// same servers).
    pub fn migrating_from(&self, before: &PoolConfig, state: crate::MigrationState) -> Result<PoolConfig> {
        if !self.redis {
            return Err(Error::Change(format!(
                "pool {}: migrate applies to Redis pools (a memcached pool warms up instead: warmup)",
                self.name
            )));
        }
        if before.lines == self.lines {
            return Err(Error::Change(format!("pool {}: the change moves no key", self.name)));
        }
        let mut next = self.clone();
        next.migration = Some(crate::Migration::new(before.lines.clone(), state));
        Ok(next)
    }

    /// The pool as it was before the change a migration is for: its
    /// servers are [`Migration::from`](crate::Migration::from); `None`
    /// without a migration.
    ///
    /// # Errors
    /// Placement errors of those servers.
    pub fn migration_source(&self) -> Result<Option<PoolConfig>> {
        let Some(m) = &self.migration else { return Ok(None) };
        let mut before = self.with_lines(m.from.clone())?;
        before.migration = None;
        Ok(Some(before))
    }

    /// This pool with its migration in `state` (`None`: completed; the
    /// servers stay).
    pub fn with_migration_state(&self, state: Option<crate::MigrationState>) -> PoolConfig {
        let mut next = self.clone();
        next.migration = match (state, &self.migration) {
            (Some(state), Some(m)) => Some(crate::Migration::new(m.from.clone(), state)),
            _ => None,
        };
        next
    }

    /// This pool with other `servers:` lines (checked, and the placement
    /// built once to check it can be).
    ///
    /// # Errors
    /// As [`PoolConfig::check_lines`], and placement errors.
    pub fn with_lines(&self, lines: Vec<ServerLine>) -> Result<PoolConfig> {
        let mut next = self.clone();
        next.servers = lines.iter().filter(|l| l.state == LineState::Active).cloned().collect();
        next.lines = lines;
        next.check_lines()?;
        if next.distribution != Distribution::Random {
            next.snapshot()?;
        }
        Ok(next)
    }

    /// Checks the `servers:` lines: at least one active server, member ids
    /// unique, freed-bucket orders (`removed N`, `ejected N`) only in an
    /// anchor pool and each used once.
    ///
    /// # Errors
    /// [`Error::Config`] saying which line is wrong.
    pub fn check_lines(&self) -> Result<()> {
        if self.servers.is_empty() {
            return Err(Error::Config(if self.lines.is_empty() {
                "it has no servers".into()
            } else {
                "none of its servers takes keys (every one is ejected or removed)".into()
            }));
        }
        let mut ids: Vec<&str> = self.members().map(|l| l.id.as_str()).collect();
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::DuplicateNode(w[0].to_owned()));
        }
        let mut orders: Vec<u32> = self.lines.iter().filter_map(|l| l.state.freed()).collect();
        if !orders.is_empty() && self.distribution != Distribution::Anchor {
            let line = self.lines.iter().find(|l| l.state.freed().is_some()).map(ToString::to_string);
            return Err(Error::Config(format!(
                "server line {:?}: `removed N` and `ejected N` keep freed buckets of anchor pools; this pool's \
                 distribution is {} (delete removed lines; write ejected servers as `... ejected`)",
                line.unwrap_or_default(),
                self.distribution
            )));
        }
        orders.sort_unstable();
        if let Some(w) = orders.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::Config(format!(
                "two server lines are marked as bucket number {} freed (each `removed N`/`ejected N` is a different N)",
                w[0]
            )));
        }
        Ok(())
    }

    /// AnchorHash for these lines: their buckets in order (active servers,
    /// and the freed buckets of removed and ejected ones), the freed ones
    /// freed again in their order.
    pub(crate) fn anchor(&self) -> Result<Anchor> {
        let buckets: Vec<&ServerLine> =
            self.lines.iter().filter(|l| !matches!(l.state, LineState::Ejected(None))).collect();
        let free_id = |i: usize| format!("\u{0}free bucket {i}");
        let nodes = buckets
            .iter()
            .enumerate()
            .map(|(i, l)| match l.state {
                LineState::Active => l.to_node(),
                _ => Node::new(free_id(i), 1),
            })
            .collect::<Result<Vec<Node>>>()?;
        let mut anchor = Anchor::with_capacity(nodes, self.hash, self.anchor_capacity)?;
        let mut freed: Vec<(u32, usize)> =
            buckets.iter().enumerate().filter_map(|(i, l)| Some((l.state.freed()?, i))).collect();
        freed.sort_unstable();
        for (_, i) in freed {
            anchor = anchor.without_node(&free_id(i))?;
        }
        Ok(anchor)
    }

    /// A version of what decides this pool's placement (distribution,
    /// hash, hash tag, the algorithm's parameters, every server line with
    /// its state): equal versions place every key alike. 16 hex digits.
    pub fn version(&self) -> String {
        let mut text = format!(
            "{}|{}|{:?}|{}|{:?}|{}|{}|{}|{}",
            self.distribution,
            self.hash,
            self.hash_tag,
            self.vnodes,
            self.point_label,
            self.maglev_table_size,
            self.probes,
            self.balance_factor,
            self.anchor_capacity
        );
        for line in &self.lines {
            text.push('\n');
            text.push_str(&line.to_string());
        }
        // A migration changes where moved keys are read and written: it is
        // part of the version (proxies armed and moving differ).
        if let Some(m) = &self.migration {
            text.push_str("\nmigrate ");
            text.push_str(m.state.name());
            for line in &m.from {
                text.push('\n');
                text.push_str(&line.to_string());
            }
        }
        format!("{:016x}", KeyHasher::Xxh3.hash(text.as_bytes()))
    }

    /// Checks that a reloaded file does not renumber an order-dependent
    /// placement: in an anchor pool a server's line is its bucket, in a
    /// jump pool its place is its bucket, so a server that stays must keep
    /// its place, and one that leaves from the middle must be marked, not
    /// deleted.
    ///
    /// # Errors
    /// [`Error::Change`] naming the server and the command to use instead.
    pub fn check_reload(&self, new: &PoolConfig) -> Result<()> {
        if self.distribution != new.distribution
            || !matches!(new.distribution, Distribution::Anchor | Distribution::Jump | Distribution::JumpBack)
        {
            return Ok(());
        }
        let places = |c: &PoolConfig| -> Vec<(String, LineState)> {
            if c.distribution == Distribution::Anchor {
                c.lines
                    .iter()
                    .filter(|l| !matches!(l.state, LineState::Ejected(None)))
                    .map(|l| (l.id.clone(), l.state))
                    .collect()
            } else {
                c.servers.iter().map(|l| (l.id.clone(), l.state)).collect()
            }
        };
        let (old, now) = (places(self), places(new));
        for (i, (id, state)) in old.iter().enumerate() {
            if *state != LineState::Active {
                continue;
            }
            let kept = now.get(i).is_some_and(|(n, s)| n == id || matches!(s, LineState::Removed(_)));
            let truncated = i >= now.len();
            if kept || truncated {
                continue;
            }
            let how = if new.distribution == Distribution::Anchor {
                format!(
                    "in an anchor pool a server's line is its bucket: put the line back where it was, then remove \
                     the server with `chash config remove -c FILE --pool {} {id}` (which keeps its line, marked \
                     `removed N`)",
                    self.name
                )
            } else {
                format!(
                    "jump numbers servers by their place: put {id} back where it was; only the last server can \
                     leave (chash config remove -c FILE --pool {} ID, for the last one)",
                    self.name
                )
            };
            let what = if now.iter().any(|(n, _)| n == id) { "moved from its place" } else { "deleted from the list" };
            return Err(Error::Change(format!(
                "server {id} (line {}) was {what}, which moves the keys of every server after it; {how}",
                i + 1
            )));
        }
        Ok(())
    }
}

/// A new server on freed bucket `t` (anchor): the line of a removed server
/// becomes the new one; an ejected server there loses the bucket and stays
/// a member at the end of the list.
fn take_bucket(l: &mut Lines, t: usize, line: ServerLine) {
    let old = l.lines[t].clone();
    l.replace(t, line);
    if let LineState::Ejected(Some(_)) = old.state {
        l.append(old.with_state(LineState::Ejected(None)));
    }
}

/// Refuses a jump change that renumbers servers: the servers that take keys
/// may only grow or shrink at the end.
fn check_jump(distribution: Distribution, old: &[ServerLine], new: &[ServerLine], edit: &Edit) -> Result<()> {
    let same_prefix = old.iter().zip(new).all(|(a, b)| a.id == b.id);
    if same_prefix {
        return Ok(());
    }
    let id = match edit {
        Edit::Remove(id) | Edit::Eject(id) | Edit::Restore(id) | Edit::Weight(id, _) => id.clone(),
        Edit::Add(line) => line.id.clone(),
    };
    let last = old.last().map_or("", |l| l.id.as_str());
    Err(Error::Change(format!(
        "{distribution} numbers servers by their place in the list: `{edit}` would renumber the servers after {id} \
         and move their keys. {distribution} pools grow and shrink at the end only (the last server now is {last}); to take a server \
         out of the middle, give its line to another server (same place), or use distribution anchor (memento), \
         whose servers can leave in any order"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::Placement;
    use crate::AnyPlacement;

    fn pool(distribution: &str, lines: &[&str]) -> PoolConfig {
        let mut b = PoolConfig::builder("p").distribution(distribution);
        if !matches!(distribution, "ketama" | "modula" | "nginx") {
            b = b.hash("xxh3");
        }
        for l in lines {
            b = b.server_line(l);
        }
        b.build().unwrap()
    }

    fn owners(p: &PoolConfig) -> Vec<String> {
        let s = p.snapshot().unwrap();
        (0..20_000).map(|i| s.route(format!("k{i}").as_bytes()).unwrap().to_owned()).collect()
    }

    fn reparse(p: &PoolConfig) -> PoolConfig {
        let lines: Vec<String> = p.lines.iter().map(ToString::to_string).collect();
        let mut b = PoolConfig::builder("p").distribution(p.distribution.name()).hash(&p.hash.to_string());
        for l in &lines {
            b = b.server_line(l);
        }
        b.build().unwrap()
    }

    #[test]
    fn anchor_lines_keep_their_buckets() {
        let p = pool("anchor", &["a:1", "b:1", "c:1", "d:1"]);
        let (p1, ops) = p.apply(&Edit::Remove("b".into())).unwrap();
        assert_eq!(ops, vec![LineOp::Replace(1, "b:1 removed 1".parse().unwrap())]);
        // The last line, with no other bucket free: simply gone.
        let (p2, ops) = p.apply(&Edit::Remove("d".into())).unwrap();
        assert_eq!(ops, vec![LineOp::Delete(3)]);
        assert_eq!(owners(&p2), owners(&pool("anchor", &["a:1", "b:1", "c:1"])));
        // A new server takes the bucket freed last: only keys moving to it move.
        let (p3, ops) = p1.apply(&Edit::Add("e:1".parse().unwrap())).unwrap();
        assert_eq!(ops, vec![LineOp::Replace(1, "e:1".parse().unwrap())]);
        let (before, after) = (owners(&p1), owners(&p3));
        assert!(before.iter().zip(&after).all(|(x, y)| x == y || y == "e"));
        // The file says it all: written and read back, the same placement.
        assert_eq!(owners(&reparse(&p1)), owners(&p1));
        let incremental = AnyPlacement::Anchor(Box::new(p.anchor().unwrap().without_node("b").unwrap()));
        let s = p1.snapshot().unwrap();
        for i in 0..20_000u64 {
            let h = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            assert_eq!(
                incremental.locate_hash(h).map(|n| incremental.nodes()[n].id().to_owned()),
                s.placement().locate_hash(h).map(|n| s.nodes()[n].id().to_owned())
            );
        }
    }

    #[test]
    fn ejections_and_restores() {
        let p = pool("anchor", &["a:1", "b:1", "c:1"]);
        let (p1, _) = p.apply(&Edit::Eject("a".into())).unwrap();
        assert_eq!(p1.lines[0].state, LineState::Ejected(Some(1)));
        let (p2, _) = p1.apply(&Edit::Restore("a".into())).unwrap();
        assert_eq!(owners(&p2), owners(&p));
        // A server added while a is out takes a's bucket; a comes back on the
        // next freed one.
        let (p3, _) = p1.apply(&Edit::Add("d:1".parse().unwrap())).unwrap();
        assert_eq!(p3.lines.iter().map(ToString::to_string).collect::<Vec<_>>(), ["d:1", "b:1", "c:1", "a:1 ejected"]);
        let (p4, _) = p3.apply(&Edit::Restore("a".into())).unwrap();
        assert_eq!(p4.lines.iter().map(ToString::to_string).collect::<Vec<_>>(), ["d:1", "b:1", "c:1", "a:1"]);
        let ring = pool("ring", &["a:1", "b:2", "c:1"]);
        let (r1, ops) = ring.apply(&Edit::Eject("b".into())).unwrap();
        assert_eq!(ops, vec![LineOp::Replace(1, "b:2 ejected".parse().unwrap())]);
        assert!(r1.apply(&Edit::Eject("b".into())).unwrap_err().to_string().contains("already ejected"));
        let (r2, _) = r1.apply(&Edit::Restore("b".into())).unwrap();
        assert_eq!(owners(&r2), owners(&ring));
        assert!(r1.apply(&Edit::Eject("a".into())).unwrap().0.apply(&Edit::Eject("c".into())).is_err());
    }

    #[test]
    fn jump_changes_only_at_the_end() {
        let p = pool("jump", &["a:1", "b:1", "c:1"]);
        let err = p.apply(&Edit::Remove("b".into())).unwrap_err().to_string();
        assert!(err.contains("grow and shrink at the end") && err.contains("anchor"), "{err}");
        assert!(p.apply(&Edit::Remove("c".into())).is_ok());
        assert!(p.apply(&Edit::Eject("b".into())).is_err());
        assert!(p.apply(&Edit::Add("d:1".parse().unwrap())).is_ok());
    }

    #[test]
    fn reloads_that_renumber_are_refused() {
        let p = pool("anchor", &["a:1", "b:1", "c:1"]);
        let err = p.check_reload(&pool("anchor", &["a:1", "c:1"])).unwrap_err().to_string();
        assert!(err.contains("server b") && err.contains("chash config remove"), "{err}");
        assert!(p.check_reload(&pool("anchor", &["a:1", "b:1 removed 1", "c:1"])).is_ok());
        assert!(p.check_reload(&pool("anchor", &["a:1", "b:1"])).is_ok());
        assert!(p.check_reload(&pool("anchor", &["a:1", "b:1", "c:1", "d:1"])).is_ok());
        let j = pool("jump", &["a:1", "b:1", "c:1"]);
        assert!(j.check_reload(&pool("jump", &["a:1", "c:1"])).is_err());
        assert!(pool("ring", &["a:1", "b:1"]).check_reload(&pool("ring", &["b:1"])).is_ok());
    }

    #[test]
    fn lines_are_checked() {
        let err = |d: &str, lines: &[&str]| {
            let mut b = PoolConfig::builder("p").distribution(d).hash("xxh3");
            for l in lines {
                b = b.server_line(l);
            }
            b.build().unwrap_err().to_string()
        };
        assert!(err("ring", &["a:1", "b:1 removed 1"]).contains("anchor pools"));
        assert!(err("anchor", &["a:1 removed 1", "b:1 removed 1", "c:1"]).contains("bucket number 1 freed"));
        assert!(err("ring", &["a:1 ejected"]).contains("none of its servers"));
        assert!(err("ring", &["a:1", "a:1 ejected"]).contains("duplicate"));
    }

    #[test]
    fn versions_follow_the_placement_inputs() {
        let p = pool("ring", &["a:1", "b:1"]);
        assert_eq!(p.version(), pool("ring", &["a:1", "b:1"]).version());
        assert_ne!(p.version(), pool("ring", &["a:1", "b:2"]).version());
        assert_ne!(p.version(), pool("ring", &["a:1", "b:1 ejected"]).version());
        assert_eq!(p.version().len(), 16);
    }
}
