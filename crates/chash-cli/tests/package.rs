//! The Debian package (`scripts/package`), built from this test's binary:
//! its files, its control fields (it replaces nutcracker), its units as
//! `systemd-analyze verify` sees them, and the unit's command line run as
//! an unprivileged user, serving a pool and stopping on SIGTERM.

mod common;
use common::require;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{cmd:?}: {text}");
    text
}

#[test]
fn the_debian_package() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = std::env::temp_dir().join(format!("chash-package-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = dir.join("out");
    run(Command::new(root.join("scripts/package"))
        .args(["--binary", env!("CARGO_BIN_EXE_chash"), "--out"])
        .arg(&out)
        .current_dir(&root));
    let deb: PathBuf = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .expect("a .deb");
    let dpkg_deb = require("dpkg-deb", "dpkg");
    let fields =
        run(Command::new(&dpkg_deb).args(["-f"]).arg(&deb).args(["Package", "Conflicts", "Replaces", "Provides"]));
    for want in ["Package: chash", "Conflicts: nutcracker", "Replaces: nutcracker", "Provides: nutcracker"] {
        assert!(fields.contains(want), "{fields}");
    }
    let x = dir.join("x");
    run(Command::new(&dpkg_deb).arg("-x").arg(&deb).arg(&x));
    assert!(run(Command::new(x.join("usr/bin/chash")).arg("--version")).starts_with("chash "));
    assert_eq!(std::fs::read_link(x.join("usr/sbin/nutcracker")).unwrap(), Path::new("../bin/chash"));
    assert!(run(Command::new(x.join("usr/sbin/nutcracker")).arg("-V")).contains("nutcracker"));
    for file in [
        "etc/chash/chash.yml",
        "etc/logrotate.d/chash-proxy",
        "lib/systemd/system/chash-proxy.service",
        "lib/systemd/system/nutcracker.service",
        "usr/share/bash-completion/completions/chash",
        "usr/share/zsh/vendor-completions/_chash",
        "usr/share/fish/vendor_completions.d/chash.fish",
        "usr/share/doc/chash/copyright",
    ] {
        assert!(x.join(file).is_file(), "{file} is in the package");
    }
    let page = run(Command::new("gzip").arg("-dc").arg(x.join("usr/share/man/man1/chash-proxy.1.gz")));
    assert!(page.contains(".TH chash-proxy 1"), "{}", &page[..page.len().min(300)]);
    assert!(x.join("usr/share/man/man1/nutcracker.1.gz").is_file());
    // The example config is one `chash proxy -t` accepts.
    run(Command::new(x.join("usr/bin/chash")).args(["proxy", "-t", "-c"]).arg(x.join("etc/chash/chash.yml")));

    // The units, as systemd reads them, with the package's binary where
    // they name the installed one.
    let units = dir.join("units");
    std::fs::create_dir_all(&units).unwrap();
    let bin = x.join("usr/bin/chash").display().to_string();
    let sbin = x.join("usr/sbin/nutcracker").display().to_string();
    for unit in ["chash-proxy.service", "nutcracker.service"] {
        let text = std::fs::read_to_string(x.join("lib/systemd/system").join(unit)).unwrap();
        let text = text.replace("/usr/bin/chash", &bin).replace("/usr/sbin/nutcracker", &sbin);
        std::fs::write(units.join(unit), text).unwrap();
    }
    let verify = Command::new(require("systemd-analyze", "systemd"))
        .args(["verify", "--man=no"])
        .arg(units.join("chash-proxy.service"))
        .arg(units.join("nutcracker.service"))
        .env("SYSTEMD_LOG_LEVEL", "warning")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&verify.stderr).into_owned() + &String::from_utf8_lossy(&verify.stdout);
    assert!(verify.status.success() && said.trim().is_empty(), "systemd-analyze verify: {said}");

    // The unit's command line, run as an unprivileged user (nobody): it
    // serves its pool and stops on SIGTERM.
    let unit = std::fs::read_to_string(units.join("chash-proxy.service")).unwrap();
    let exec = unit.lines().find_map(|l| l.strip_prefix("ExecStart=")).unwrap();
    let config = dir.join("chash.yml");
    std::fs::write(&config, "cache:\n  listen: 127.0.0.1:0\n  servers:\n   - 127.0.0.1:1:1\n").unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&config, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let words: Vec<String> = exec
        .split_whitespace()
        .map(|w| if w == "/etc/chash/chash.yml" { config.display().to_string() } else { w.to_owned() })
        .collect();
    let mut child = Command::new(require("setpriv", "util-linux"))
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .args(&words)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 || Instant::now() > deadline {
            let _ = child.kill();
            panic!("the unit's command did not serve: {seen}");
        }
        seen.push_str(&line);
        if line.contains("serving memcached on") {
            break;
        }
    }
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "no exit within 10 s of SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut rest = String::new();
    let _ = err.read_to_string(&mut rest);
    assert!(status.success(), "exit {status:?}: {seen}{rest}");
    let _ = std::fs::remove_dir_all(&dir);
}
