//! Placement algorithms other than rings of points, each behind the one
//! [`Placement`](crate::Placement) trait, one file each:
//!
//! | type | `distribution:` | balance | a change moves | lookup | weights |
//! |---|---|---|---|---|---|
//! | [`Jump`] | `jump` | at the sampling floor | the optimum; only the last node can leave | O(ln n) | no |
//! | [`Rendezvous`] | `rendezvous` | at the floor | the optimum | O(n) | yes |
//! | [`Maglev`] | `maglev` | at the floor | ≤ 1.6× the optimum | O(1), one table read | yes |
//! | [`Anchor`] | `anchor`, `memento` | at the floor | the optimum, any node can leave | O(1) expected | no |
//! | [`MultiProbe`] | `multiprobe` | peak/mean ≈ 1.05 at 21 probes | the optimum | O(probes) | no |
//! | [`Bounded`] | `bounded` | no node above ⌈c × mean⌉ (with load tracking) | as the ring while under cap | as the ring | yes |
//!
//! Every algorithm is deterministic across processes and platforms: the only
//! hashes are the pool's key hash, xxh3 of node ids with fixed seeds, and the
//! fixed mixing functions of `mix`. Lookups take `&self`, never allocate and
//! never panic.

mod anchor;
mod bounded;
mod jump;
mod maglev;
mod mix;
mod multiprobe;
mod rendezvous;

pub use anchor::{Anchor, AnchorCandidates, DEFAULT_ANCHOR_CAPACITY};
pub use bounded::{Bounded, LoadGuard, DEFAULT_BALANCE_FACTOR};
pub use jump::{jump_back_hash, jump_hash, Jump, JumpCandidates, JumpVariant};
pub use maglev::{next_prime, Maglev, MaglevBuilder, MaglevCandidates, DEFAULT_MAGLEV_TABLE_SIZE};
pub use mix::{fmix64, mix2, reduce};
pub use multiprobe::{MultiProbe, MultiProbeCandidates, DEFAULT_PROBES};
pub use rendezvous::{Rendezvous, RendezvousCandidates};
