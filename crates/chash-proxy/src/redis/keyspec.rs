//! Redis's key specs: where a command's keys are among its arguments, as
//! Redis describes its own commands (`COMMAND INFO`), and finding them in a
//! command as Redis does.

use crate::redis::resp::Args;

/// One command as Redis describes it.
#[derive(Debug)]
pub(crate) struct Spec {
    /// Lower-case name; a subcommand as `container|sub`.
    pub name: &'static str,
    /// Arguments including the name; negative: at least that many.
    pub arity: i32,
    /// Whether it may block its connection.
    pub blocking: bool,
    /// Whether it may change data (Redis's `write` flag): refused to
    /// read-only users.
    pub write: bool,
    /// Where its keys are.
    pub keys: &'static [KeySpec],
}

/// Where one group of a command's keys is.
#[derive(Debug)]
pub(crate) struct KeySpec {
    /// Where the group starts.
    pub begin: Begin,
    /// Which arguments from there are keys.
    pub find: Find,
}

/// Where a key group starts.
#[derive(Debug)]
pub(crate) enum Begin {
    /// At this argument.
    Index(i32),
    /// After this keyword, searched from argument `start` (negative: from the
    /// end, backwards).
    Keyword(&'static str, i32),
    /// Not described (keys named by patterns, such as `SORT ... BY`).
    Unknown,
}

/// Which arguments of a group are keys.
#[derive(Debug)]
pub(crate) enum Find {
    /// From the start to `last` (relative to the start; negative: from the
    /// end, and with a `limit`, that share of what remains), every `step`.
    Range { last: i32, step: i32, limit: i32 },
    /// The argument at `at` (relative to the start) holds how many keys
    /// there are, the first at `first` (relative to the start), every `step`.
    Keynum { at: i32, first: i32, step: i32 },
    /// Not described.
    Unknown,
}

impl Spec {
    /// Whether `argc` arguments (name included) fit its arity.
    pub(crate) fn fits(&self, argc: usize) -> bool {
        let argc = argc as i64;
        let arity = i64::from(self.arity);
        if arity >= 0 {
            argc == arity
        } else {
            argc >= -arity
        }
    }

    /// Whether some of its keys cannot be found from its arguments.
    pub(crate) fn has_unknown_keys(&self) -> bool {
        self.keys.iter().any(|k| matches!(k.begin, Begin::Unknown) || matches!(k.find, Find::Unknown))
    }

    /// The position of its one key when it always has exactly one, at a
    /// fixed place, and `argc` arguments reach it (most commands: the
    /// fast path, no search and no allocation).
    pub(crate) fn single_key(&self, argc: usize) -> Option<usize> {
        match self.keys {
            [KeySpec { begin: Begin::Index(i), find: Find::Range { last: 0, .. } }]
                if *i >= 1 && (*i as usize) < argc =>
            {
                Some(*i as usize)
            }
            _ => None,
        }
    }

    /// The positions of the keys in `args` (the name first), in order; `None`
    /// when the arguments do not match the specs (a key count that is not
    /// a number, or points past the end).
    pub(crate) fn key_positions(&self, args: &Args) -> Option<Vec<usize>> {
        let argc = args.len() as i64;
        let mut out = Vec::new();
        for spec in self.keys {
            let first = match spec.begin {
                Begin::Index(i) => i64::from(i),
                Begin::Keyword(word, start) => {
                    let start = i64::from(start);
                    let from = if start > 0 { start } else { argc + start };
                    let found = if start > 0 {
                        (from..argc).find(|&i| args[i as usize].eq_ignore_ascii_case(word.as_bytes()))
                    } else {
                        (1..=from.min(argc - 1)).rev().find(|&i| args[i as usize].eq_ignore_ascii_case(word.as_bytes()))
                    };
                    match found {
                        Some(i) => i + 1,
                        // No such keyword: this group is not there.
                        None => continue,
                    }
                }
                Begin::Unknown => continue,
            };
            let (first, last, step) = match spec.find {
                Find::Range { last, step, limit } => {
                    let (last, limit) = (i64::from(last), i64::from(limit));
                    let end = if last >= 0 {
                        first + last
                    } else if limit == 0 {
                        argc + last
                    } else {
                        first + ((argc - first) / limit + last)
                    };
                    (first, end, i64::from(step))
                }
                Find::Keynum { at, first: first_key, step } => {
                    let n: i64 = std::str::from_utf8(args.get((first + i64::from(at)) as usize)?).ok()?.parse().ok()?;
                    if n < 0 {
                        return None;
                    }
                    let start = first + i64::from(first_key);
                    (start, start + n - 1, i64::from(step))
                }
                Find::Unknown => continue,
            };
            let mut i = first;
            while i <= last {
                if i >= argc || i < 1 || step < 1 {
                    return None;
                }
                out.push(i as usize);
                i += step;
            }
        }
        Some(out)
    }
}
