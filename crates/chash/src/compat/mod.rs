//! Byte-exact reproductions of placements other systems use, so that chash
//! routes every key where they already do:
//!
//! - [`Ketama`]: twemproxy's `distribution: ketama` and libmemcached's
//!   weighted ketama (pylibmc's `ketama_weighted`, spymemcached-style rings
//!   built the same way);
//! - [`Modula`]: twemproxy's `distribution: modula`;
//! - [`NginxChash`]: nginx's `hash $key consistent` (the Cache::Memcached::Fast
//!   scheme).
//!
//! Each is checked against data produced by running the real program (see
//! `testdata/README.md`).

mod ketama;
mod modula;
mod nginx;

pub use ketama::{ketama_label_base, ketama_points_per_server, twemproxy_order, Ketama};
pub use modula::{Modula, ModulaCandidates};
pub use nginx::{nginx_host_port, NginxChash};
