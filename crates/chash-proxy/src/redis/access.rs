//! Who logs in where in a Redis pool ([`chash::RedisAccess`]): secrets
//! named by file read into the config, and a client's `AUTH` checked
//! against the pool's `redis_auth` and `users`.

use chash::PoolConfig;

use crate::pool::PoolError;

/// One line of a secret file: its content without the line end.
fn read_secret(pool: &str, what: &str, path: &str) -> Result<String, PoolError> {
    let bad = |why: String| PoolError::Secret { pool: pool.to_owned(), why: format!("{what} {path}: {why}") };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let secret = text.strip_suffix('\n').map_or(text.as_str(), |t| t.strip_suffix('\r').unwrap_or(t));
    if secret.is_empty() {
        return Err(bad("it is empty".into()));
    }
    if secret.contains('\n') {
        return Err(bad("it has more than one line (the whole file is the secret, one line)".into()));
    }
    Ok(secret.to_owned())
}

/// Reads the secrets `pool` names by file (`server_password_file`, each
/// user's `password_file`) into their inline places, so that a running
/// pool never reads files and a changed file is a changed config.
///
/// # Errors
/// A file that cannot be read, or is empty.
pub(crate) fn resolve_secrets(pool: &mut PoolConfig) -> Result<(), PoolError> {
    let name = pool.name.clone();
    let access = &mut pool.access;
    if let Some(path) = &access.server_password_file {
        access.server_password = Some(read_secret(&name, "server_password_file", path)?);
    }
    for user in &mut access.users {
        if let Some(path) = &user.password_file {
            user.password = Some(read_secret(&name, &format!("users: {}: password_file", user.name), path)?);
        }
    }
    Ok(())
}

/// How the proxy logs in to its servers: (user, password).
pub(crate) fn server_login(config: &PoolConfig) -> Option<(&str, &str)> {
    match (&config.access.server_password, &config.redis_auth) {
        (Some(pw), _) => Some((config.access.server_user.as_deref().unwrap_or("default"), pw.as_str())),
        (None, Some(pw)) => Some(("default", pw.as_str())),
        (None, None) => None,
    }
}

/// Who a client is once it logged in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Login {
    /// The user's name (`default` for `redis_auth`).
    pub name: String,
    /// Commands that change data are refused to it.
    pub readonly: bool,
}

/// Equal bytes, compared in time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Whether a client must log in before its commands run.
pub(crate) fn needs_login(config: &PoolConfig) -> bool {
    config.redis_auth.is_some() || !config.access.users.is_empty()
}

/// Checks `AUTH [user] password` against the pool: `None` for a wrong
/// pair (Redis's `WRONGPASS`).
pub(crate) fn login(config: &PoolConfig, user: Option<&[u8]>, password: &[u8]) -> Option<Login> {
    let default =
        |pw: &String| same(pw.as_bytes(), password).then(|| Login { name: "default".into(), readonly: false });
    match user {
        None | Some(b"default") if config.redis_auth.is_some() => config.redis_auth.as_ref().and_then(default),
        None => None,
        Some(name) => config.access.users.iter().find(|u| u.name.as_bytes() == name).and_then(|u| {
            let pw = u.password.as_deref()?;
            same(pw.as_bytes(), password).then(|| Login { name: u.name.clone(), readonly: u.readonly })
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(yml: &str) -> PoolConfig {
        chash::config::Config::from_yaml(yml).unwrap().pool(None).unwrap()
    }

    #[test]
    fn logins_by_user_and_by_redis_auth() {
        let p = pool(
            "a:\n  redis: true\n  redis_auth: old\n  users:\n   - {name: app, password: s3cret}\n   - {name: ro, password: r, \
             readonly: true}\n  servers:\n   - 127.0.0.1:1:1\n",
        );
        assert_eq!(login(&p, None, b"old").unwrap().name, "default");
        assert_eq!(login(&p, Some(b"default"), b"old").unwrap().name, "default");
        assert_eq!(login(&p, Some(b"app"), b"s3cret"), Some(Login { name: "app".into(), readonly: false }));
        assert!(login(&p, Some(b"ro"), b"r").unwrap().readonly);
        assert_eq!(login(&p, Some(b"app"), b"wrong"), None);
        assert_eq!(login(&p, Some(b"nobody"), b"s3cret"), None);
        assert_eq!(login(&p, None, b"s3cret"), None);
        assert!(needs_login(&p));
        assert_eq!(server_login(&p), Some(("default", "old")));
    }

    #[test]
    fn secrets_come_from_files() {
        let dir = std::env::temp_dir().join(format!("chash-secrets-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (server, user, empty) = (dir.join("server"), dir.join("user"), dir.join("empty"));
        std::fs::write(&server, "proxy-pw\n").unwrap();
        std::fs::write(&user, "user-pw\r\n").unwrap();
        std::fs::write(&empty, "\n").unwrap();
        let yml = |server: &std::path::Path, user: &std::path::Path| {
            format!(
                "a:\n  redis: true\n  server_user: proxy\n  server_password_file: {}\n  users:\n   - {{name: app, \
                 password_file: {}}}\n  servers:\n   - 127.0.0.1:1:1\n",
                server.display(),
                user.display()
            )
        };
        let mut p = pool(&yml(&server, &user));
        assert_eq!(login(&p, Some(b"app"), b"user-pw"), None, "not read yet");
        resolve_secrets(&mut p).unwrap();
        assert_eq!(server_login(&p), Some(("proxy", "proxy-pw")));
        assert!(login(&p, Some(b"app"), b"user-pw").is_some());
        let e = resolve_secrets(&mut pool(&yml(&empty, &user))).unwrap_err().to_string();
        assert!(e.contains("server_password_file") && e.contains("empty"), "{e}");
        let e = resolve_secrets(&mut pool(&yml(&server, &dir.join("nope")))).unwrap_err().to_string();
        assert!(e.contains("users: app: password_file") && e.contains("nope"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_keys_are_checked() {
        let bad = |keys: &str| {
            chash::config::Config::from_yaml(&format!("a:\n  redis: true\n{keys}  servers:\n   - 127.0.0.1:1:1\n"))
                .and_then(|c| c.pool(None))
                .unwrap_err()
                .to_string()
        };
        assert!(bad("  server_user: u\n").contains("server_user needs server_password"));
        assert!(bad("  server_password: a\n  server_password_file: f\n").contains("give one of them"));
        assert!(bad("  users:\n   - {name: a}\n").contains("needs one of password and password_file"));
        assert!(bad("  users:\n   - {name: a, password: x}\n   - {name: a, password: y}\n").contains("named twice"));
        assert!(bad("  users:\n   - {name: a, pasword: x}\n").contains("pasword"));
        let memcached = chash::config::Config::from_yaml(
            "a:\n  users:\n   - {name: a, password: x}\n  servers:\n   - 127.0.0.1:1:1\n",
        )
        .and_then(|c| c.pool(None))
        .unwrap_err()
        .to_string();
        assert!(memcached.contains("apply to Redis pools"), "{memcached}");
    }
}
