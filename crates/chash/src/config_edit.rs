//! Editing a config file the way the proxy changes its pools: a membership
//! [`Edit`] applied to one pool's `servers:` lines, everything else in the
//! file (other pools, key order, comments, quoting) kept as written, so
//! the file can live in version control. Writes are atomic
//! ([`write_atomically`]).

use std::path::Path;

use crate::config::Config;
use crate::membership::{Edit, LineOp};
use crate::{Error, PoolConfig, Result, ServerLine};

/// A config file's text after an edit, with the pool before and after.
#[derive(Clone, Debug)]
pub struct Edited {
    /// The whole new file.
    pub text: String,
    /// The pool as it was.
    pub before: PoolConfig,
    /// The pool as it is now.
    pub after: PoolConfig,
}

/// The pool an edit is for: `pool` when given, else the file's only pool.
///
/// # Errors
/// [`Error::Config`] for an unknown pool, or no name in a file of several.
pub fn pick_pool(config: &Config, pool: Option<&str>) -> Result<String> {
    match pool {
        Some(p) => {
            config.pool(Some(p))?;
            Ok(p.to_owned())
        }
        None if config.pools.len() == 1 => Ok(config.pools[0].0.clone()),
        None => {
            let names: Vec<&str> = config.pools.iter().map(|(n, _)| n.as_str()).collect();
            Err(Error::Config(format!(
                "the file has {} pools ({}): name one with --pool",
                names.len(),
                names.join(", ")
            )))
        }
    }
}

/// Applies `edit` to pool `pool` (or the only pool) of the config `text`.
///
/// # Errors
/// The file's own errors, the edit's ([`PoolConfig::apply`]), and a
/// `servers:` list not written one `- ` line per server (a flow list
/// `[a, b]` cannot be edited in place).
pub fn edit_text(text: &str, pool: Option<&str>, edit: &Edit) -> Result<Edited> {
    let config = Config::from_yaml(text)?;
    let name = pick_pool(&config, pool)?;
    let before = config.pool(Some(&name))?;
    let (after, ops) = before.apply(edit)?;
    let list = ServerList::find(text, &name, &before)?;
    let new_text = list.apply(text, &ops);
    // The result must read back as the edited pool, and the other pools as
    // they were.
    let check = Config::from_yaml(&new_text)?;
    let reread = check.pool(Some(&name))?;
    if reread.version() != after.version() {
        return Err(Error::Config(format!("pool {name}: the edited file does not read back as the edit (a bug)")));
    }
    Ok(Edited { text: new_text, before, after })
}

/// Sets pool `pool`'s `drain:` key to `{ID: UNTIL}` (one removed server
/// and the Unix time its warm-up window ends), in place of any `drain:`
/// line the pool has, or as a new line before its `servers:` key; the rest
/// of the file stays as it is. A proxy that reloads the file keeps the
/// server as a warm-up source until then.
///
/// # Errors
/// [`Error::Config`] when the pool or its `servers:` key cannot be found,
/// or its `drain:` key is written over several lines.
pub fn set_drain(text: &str, pool: &str, id: &str, until: u64) -> Result<String> {
    let mut lines: Vec<String> = text.split('\n').map(str::to_owned).collect();
    let cannot = |why: &str| Error::Config(format!("pool {pool}: cannot write its drain: {why}"));
    let (start, end, servers) = pool_block(&lines, pool).map_err(cannot)?;
    let key_indent = indent(&lines[servers]);
    let cr = if lines[servers].ends_with('\r') { "\r" } else { "" };
    let id_text = format!("\"{}\"", id.replace('\\', "\\\\").replace('"', "\\\""));
    let line = format!("{}drain: {{{id_text}: {until}}}{cr}", " ".repeat(key_indent));
    let existing =
        (start + 1..end).find(|&i| indent(&lines[i]) == key_indent && lines[i].trim_start().starts_with("drain:"));
    match existing {
        Some(i) => {
            let value = lines[i].trim_start()["drain:".len()..].trim();
            if value.is_empty() || value.starts_with('#') {
                return Err(cannot("its `drain:` key spans several lines; write it as `drain: {ID: UNTIL}`"));
            }
            lines[i] = line;
        }
        None => lines.insert(servers, line),
    }
    let new_text = lines.join("\n");
    let check = Config::from_yaml(&new_text)?;
    let reread = check.pool(Some(pool))?;
    if !reread.drain.iter().any(|(d, u)| d == id && *u == until) {
        return Err(Error::Config(format!("pool {pool}: the drain does not read back (a bug)")));
    }
    Ok(new_text)
}

/// Sets pool `pool`'s migration record: `migrate_state:` and the
/// `migrate_from:` list (one `- ` line per server) before its `servers:`
/// key, in place of the ones it has; `None` removes them (the migration
/// completed). The rest of the file stays as it is.
///
/// # Errors
/// [`Error::Config`] when the pool or its `servers:` key cannot be found,
/// or the result does not read back as asked.
pub fn set_migration(text: &str, pool: &str, migration: Option<&crate::Migration>) -> Result<String> {
    let mut lines: Vec<String> = text.split('\n').map(str::to_owned).collect();
    let cannot = |why: &str| Error::Config(format!("pool {pool}: cannot write its migration: {why}"));
    let (start, _, servers) = pool_block(&lines, pool).map_err(cannot)?;
    let key_indent = indent(&lines[servers]);
    let cr = if lines[servers].ends_with('\r') { "\r" } else { "" };
    // The old record out: each key's line, and a list's items after it.
    let mut i = start + 1;
    loop {
        let (_, end, _) = pool_block(&lines, pool).map_err(cannot)?;
        if i >= end {
            break;
        }
        let t = lines[i].trim_start();
        if indent(&lines[i]) == key_indent && (t.starts_with("migrate_state:") || t.starts_with("migrate_from:")) {
            lines.remove(i);
            while i < lines.len() && !is_blank_or_comment(&lines[i]) && {
                let n = indent(&lines[i]);
                n > key_indent || (n == key_indent && lines[i].trim_start().starts_with("- "))
            } {
                lines.remove(i);
            }
            continue;
        }
        i += 1;
    }
    if let Some(m) = migration {
        let (_, _, servers) = pool_block(&lines, pool).map_err(cannot)?;
        let pad = " ".repeat(key_indent);
        let mut record = vec![format!("{pad}migrate_state: {}{cr}", m.state.name()), format!("{pad}migrate_from:{cr}")];
        for line in &m.from {
            record.push(format!("{pad} - {line}{cr}"));
        }
        for (k, line) in record.into_iter().enumerate() {
            lines.insert(servers + k, line);
        }
    }
    let new_text = lines.join("\n");
    let reread = Config::from_yaml(&new_text)?.pool(Some(pool))?;
    if reread.migration.as_ref() != migration {
        return Err(Error::Config(format!("pool {pool}: the migration does not read back (a bug)")));
    }
    Ok(new_text)
}

/// Where one pool's `servers:` items are in the file's lines.
struct ServerList {
    /// Index (in the file's lines) of each item line.
    items: Vec<usize>,
}

/// One item line taken apart: `<indent>- <quote><text><quote><rest>`.
struct Item<'a> {
    prefix: &'a str,
    quote: Option<char>,
    rest: &'a str,
    /// `\r` when the file's lines end with CRLF.
    cr: &'a str,
}

fn split_item(line: &str) -> Option<Item<'_>> {
    let (line, cr) = match line.strip_suffix('\r') {
        Some(l) => (l, "\r"),
        None => (line, ""),
    };
    let trimmed = line.trim_start();
    let after_dash = trimmed.strip_prefix('-')?;
    if !(after_dash.is_empty() || after_dash.starts_with(' ')) {
        return None;
    }
    let content_at = line.len() - after_dash.trim_start().len();
    let prefix = &line[..content_at];
    let content = &line[content_at..];
    let (quote, rest) = match content.chars().next() {
        Some(q @ ('"' | '\'')) => {
            let end = content[1..].find(q)? + 2;
            (Some(q), &content[end..])
        }
        _ => {
            // A plain scalar ends where a comment starts.
            let end = content.find(" #").unwrap_or(content.len());
            let value_end = content[..end].trim_end().len();
            (None, &content[value_end..])
        }
    };
    Some(Item { prefix, quote, rest, cr })
}

/// Where pool `pool` is in the file's lines: its name's line, the line
/// after its block, and its `servers:` key's line; or why it is not found.
fn pool_block<S: AsRef<str>>(lines: &[S], pool: &str) -> std::result::Result<(usize, usize, usize), &'static str> {
    let line = |i: usize| lines[i].as_ref();
    let names = [format!("{pool}:"), format!("\"{pool}\":"), format!("'{pool}':")];
    let start = (0..lines.len())
        .find(|&i| indent(line(i)) == 0 && names.iter().any(|n| line(i).starts_with(n.as_str())))
        .ok_or("its name is not a top-level key")?;
    let end = (start + 1..lines.len())
        .find(|&i| indent(line(i)) == 0 && !is_blank_or_comment(line(i)))
        .unwrap_or(lines.len());
    let servers =
        (start + 1..end).find(|&i| line(i).trim_start().starts_with("servers:")).ok_or("it has no `servers:` key")?;
    Ok((start, end, servers))
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

fn is_blank_or_comment(line: &str) -> bool {
    let t = line.trim();
    t.is_empty() || t.starts_with('#')
}

impl ServerList {
    fn find(text: &str, pool: &str, config: &PoolConfig) -> Result<ServerList> {
        let lines: Vec<&str> = text.split('\n').collect();
        let cannot = |why: &str| Error::Config(format!("pool {pool}: cannot edit its servers in place: {why}"));
        let (_, end, key) = pool_block(&lines, pool).map_err(cannot)?;
        let after_key = lines[key].trim_start()["servers:".len()..].trim();
        if !(after_key.is_empty() || after_key.starts_with('#')) {
            return Err(cannot("its servers are written as a flow list `[...]`; write one `- ` line per server"));
        }
        let key_indent = indent(lines[key]);
        let mut items = Vec::new();
        for (i, line) in lines.iter().enumerate().take(end).skip(key + 1) {
            if is_blank_or_comment(line) {
                continue;
            }
            if indent(line) < key_indent || (indent(line) == key_indent && !line.trim_start().starts_with('-')) {
                break;
            }
            if split_item(line).is_none() {
                return Err(cannot(&format!("line {} is not a `- ` item", i + 1)));
            }
            items.push(i);
        }
        if items.len() != config.lines.len() {
            return Err(cannot("its items are not one line per server"));
        }
        Ok(ServerList { items })
    }

    /// The text with the operations applied to the item lines.
    fn apply(&self, text: &str, ops: &[LineOp]) -> String {
        let mut lines: Vec<String> = text.split('\n').map(str::to_owned).collect();
        let mut items = self.items.clone();
        let render = |template: &str, line: &ServerLine, keep_rest: bool| -> String {
            let item = split_item(template).expect("an item line");
            let body = match item.quote {
                Some(q) => format!("{q}{line}{q}"),
                None => line.to_string(),
            };
            let rest = if keep_rest { item.rest } else { "" };
            format!("{}{body}{rest}{}", item.prefix, item.cr)
        };
        for op in ops {
            match op {
                LineOp::Replace(at, line) => {
                    let i = items[*at];
                    lines[i] = render(&lines[i], line, true);
                }
                LineOp::Delete(at) => {
                    let i = items.remove(*at);
                    lines.remove(i);
                    for later in items.iter_mut().filter(|j| **j > i) {
                        *later -= 1;
                    }
                }
                LineOp::Append(line) => {
                    let last = *items.last().expect("a pool has servers");
                    let new = render(&lines[last], line, false);
                    lines.insert(last + 1, new);
                    items.push(last + 1);
                }
            }
        }
        lines.join("\n")
    }
}

/// Writes `text` to `path` so that a reader sees the old file or the new
/// one, never half of it: a temporary file beside the target (a symlink is
/// followed to its file), synced, then renamed over it. A target that is
/// not a file (a device such as `/dev/null` or `/dev/stdout`, a pipe) is
/// written to as it is: renamed over, it would be replaced by a file.
///
/// # Errors
/// The file system's.
pub fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let target = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    if let Ok(meta) = std::fs::metadata(&target) {
        if !meta.is_file() && !meta.is_dir() {
            return std::fs::OpenOptions::new().write(true).open(&target)?.write_all(text.as_bytes());
        }
    }
    let dir = target.parent().unwrap_or_else(|| Path::new("."));
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.chash-{}.tmp", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        if let Ok(meta) = std::fs::metadata(&target) {
            std::fs::set_permissions(&tmp, meta.permissions())?;
        }
        std::fs::rename(&tmp, &target)?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pipe (as `/dev/null` or `/dev/stdout` would be a device) is
    /// written to, not replaced by a file renamed over it.
    #[cfg(unix)]
    #[test]
    fn what_is_not_a_file_is_written_to_not_replaced() {
        use std::io::Read;
        use std::os::unix::fs::FileTypeExt;
        let dir = std::env::temp_dir().join(format!("chash-write-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("out");
        let _ = std::fs::remove_file(&fifo);
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo runs");
        assert!(made.success(), "mkfifo: {made}");
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || {
                let mut got = String::new();
                std::fs::File::open(&fifo).unwrap().read_to_string(&mut got).unwrap();
                got
            })
        };
        write_atomically(&fifo, "servers:\n").unwrap();
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo(), "still a pipe, not a file");
        assert_eq!(reader.join().unwrap(), "servers:\n", "written through the pipe");
        let _ = std::fs::remove_dir_all(&dir);
    }

    const FILE: &str = "# The cache tier.\nweb:\n  listen: 127.0.0.1:22121\n  distribution: anchor\n  hash: xxh3\n  servers:   # one per line\n   - 10.0.0.1:11211:1 a   # rack 1\n   - \"10.0.0.2:11211:1 b\"\n   - 10.0.0.3:11211:1 c\n  timeout: 400\n\nsessions:   # the other pool\n  servers:\n  - 10.0.1.1:6379:1\n  redis: true\n";

    #[test]
    fn edits_keep_the_rest_of_the_file() {
        let e = edit_text(FILE, Some("web"), &Edit::Remove("10.0.0.2:11211".into())).unwrap();
        assert_eq!(e.text, FILE.replace("   - \"10.0.0.2:11211:1 b\"", "   - \"10.0.0.2:11211:1 b removed 1\""));
        let e = edit_text(&e.text, Some("web"), &Edit::Add("10.0.0.4:11211:1 d".parse().unwrap())).unwrap();
        assert!(e.text.contains("   - \"10.0.0.4:11211:1 d\"\n   - 10.0.0.3:11211:1 c\n"), "{}", e.text);
        let e = edit_text(FILE, Some("web"), &Edit::Eject("10.0.0.1:11211".into())).unwrap();
        assert!(e.text.contains("   - 10.0.0.1:11211:1 a ejected 1   # rack 1\n"), "{}", e.text);
        let e = edit_text(FILE, Some("sessions"), &Edit::Add("10.0.1.2:6379:1".parse().unwrap())).unwrap();
        assert!(e.text.ends_with("  - 10.0.1.1:6379:1\n  - 10.0.1.2:6379:1\n  redis: true\n"), "{}", e.text);
        let e = edit_text(FILE, Some("web"), &Edit::Remove("10.0.0.3:11211".into())).unwrap();
        assert_eq!(e.text, FILE.replace("   - 10.0.0.3:11211:1 c\n", ""));
        let crlf = FILE.replace('\n', "\r\n");
        let e = edit_text(&crlf, Some("web"), &Edit::Weight("10.0.0.3:11211".into(), 1)).unwrap();
        assert_eq!(e.text, crlf);
    }

    #[test]
    fn a_migration_is_recorded_and_removed_in_place() {
        use crate::{Migration, MigrationState};
        let e = edit_text(FILE, Some("sessions"), &Edit::Add("10.0.1.2:6379:1".parse().unwrap())).unwrap();
        let after = e.after.migrating_from(&e.before, MigrationState::Armed).unwrap();
        let armed = set_migration(&e.text, "sessions", after.migration.as_ref()).unwrap();
        assert!(
            armed.contains("  migrate_state: armed\n  migrate_from:\n   - 10.0.1.1:6379:1\n  servers:\n"),
            "{armed}"
        );
        let reread = Config::from_yaml(&armed).unwrap().pool(Some("sessions")).unwrap();
        assert_eq!(reread.migration, after.migration);
        assert_ne!(reread.version(), e.after.version(), "a migration is part of the version");
        assert_eq!(reread.migration_source().unwrap().unwrap().servers, e.before.servers);
        // Moving: the record replaced, not added to.
        let moving = Migration::new(e.before.lines.clone(), MigrationState::Moving);
        let text = set_migration(&armed, "sessions", Some(&moving)).unwrap();
        assert_eq!(text, armed.replace("migrate_state: armed", "migrate_state: moving"));
        // No other change while it lasts.
        let refused = edit_text(&text, Some("sessions"), &Edit::Remove("10.0.1.1:6379".into())).unwrap_err();
        assert!(refused.to_string().contains("is migrating"), "{refused}");
        // Completed: the file as the change left it.
        assert_eq!(set_migration(&text, "sessions", None).unwrap(), e.text);
        // Only Redis pools migrate.
        let web = Config::from_yaml(FILE).unwrap().pool(Some("web")).unwrap();
        assert!(web.migrating_from(&web, MigrationState::Moving).is_err());
        let bad = "p:\n  migrate: true\n  servers:\n   - a:1\n";
        assert!(Config::from_yaml(bad).unwrap_err().to_string().contains("Redis pools"));
        let half = "p:\n  redis: true\n  migrate_from:\n   - a:1\n  servers:\n   - a:1\n";
        assert!(Config::from_yaml(half).unwrap_err().to_string().contains("migrate_state"));
    }

    #[test]
    fn what_cannot_be_edited_says_why() {
        let err = edit_text(FILE, None, &Edit::Remove("x".into())).unwrap_err().to_string();
        assert!(err.contains("2 pools") && err.contains("--pool"), "{err}");
        let flow = "p:\n  servers: [a:1, b:1]\n";
        assert!(edit_text(flow, None, &Edit::Remove("a".into())).unwrap_err().to_string().contains("flow list"));
        assert!(edit_text(FILE, Some("web"), &Edit::Remove("nope".into())).unwrap_err().to_string().contains("nope"));
    }

    #[test]
    fn atomic_writes_replace_the_file() {
        let dir = std::env::temp_dir().join(format!("chash-edit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("n.yml");
        std::fs::write(&path, "old").unwrap();
        let link = dir.join("link.yml");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&path, &link).unwrap();
        write_atomically(&link, "new").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
