//! Certificates made by a test with openssl: two CAs, servers' and
//! clients' certificates (shared by the TLS tests of both crates, included
//! with `#[path]`).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Certificates in a directory of their own, removed when dropped.
pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    pub fn new() -> Pki {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("chash-tls-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pki = Pki { dir };
        pki.ca("ca");
        pki.ca("other-ca");
        pki.leaf("server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost");
        pki.leaf("stranger", "other-ca", "subjectAltName=IP:127.0.0.1,DNS:localhost");
        pki.leaf("client", "ca", "extendedKeyUsage=clientAuth");
        pki.leaf("other-client", "other-ca", "extendedKeyUsage=clientAuth");
        pki
    }

    pub fn path(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }

    fn openssl(&self, args: &[&str]) {
        let openssl = ["/usr/bin/openssl", "/usr/local/bin/openssl"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("openssl is not installed: run scripts/test as root (it installs the Debian package openssl)");
        let out = Command::new(openssl).args(args).current_dir(&self.dir).output().unwrap();
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    pub fn ca(&self, name: &str) {
        let (key, pem, subject) = (format!("{name}.key"), format!("{name}.pem"), format!("/CN=chash test {name}"));
        self.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &pem,
            "-days",
            "30",
            "-subj",
            &subject,
        ]);
    }

    /// A certificate `name` signed by CA `ca`, with extension `ext`.
    pub fn leaf(&self, name: &str, ca: &str, ext: &str) {
        self.leaf_for_days(name, ca, ext, 30);
    }

    /// As [`Pki::leaf`], valid for `days` days from now.
    pub fn leaf_for_days(&self, name: &str, ca: &str, ext: &str, days: i32) {
        let (key, csr, pem) = (format!("{name}.key"), format!("{name}.csr"), format!("{name}.pem"));
        let ext_file = format!("{name}.ext");
        std::fs::write(self.dir.join(&ext_file), format!("{ext}\n")).unwrap();
        self.openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={name}"),
        ]);
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            &days.to_string(),
            "-extfile",
            &ext_file,
        ]);
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
