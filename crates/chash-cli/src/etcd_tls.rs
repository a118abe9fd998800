//! The flags (and environment variables) that say how to speak TLS to
//! etcd, shared by every command that takes an etcd URL: `chash proxy
//! --membership`, `chash config ... --etcd`, `chash fleet status --etcd`.
//! They name files as etcdctl's `--cacert`, `--cert` and `--key` do, and
//! are used with `https://` (or `etcds://`) URLs.

use std::path::PathBuf;

use clap::Args;

/// TLS to etcd.
#[derive(Args, Debug, Clone, Default)]
pub struct EtcdTlsArgs {
    /// With an https:// etcd URL: the CA that etcd's certificate must chain
    /// to (default: the system's roots).
    #[arg(long, value_name = "FILE", env = "CHASH_ETCD_CA")]
    pub etcd_ca: Option<PathBuf>,

    /// With an https:// etcd URL: a client certificate (PEM), for an etcd
    /// that requires one (--client-cert-auth). Needs --etcd-key.
    #[arg(long, value_name = "FILE", env = "CHASH_ETCD_CERT")]
    pub etcd_cert: Option<PathBuf>,

    /// The private key (PEM) of --etcd-cert.
    #[arg(long, value_name = "FILE", env = "CHASH_ETCD_KEY")]
    pub etcd_key: Option<PathBuf>,
}

impl EtcdTlsArgs {
    /// `url` parsed, with these files.
    ///
    /// # Errors
    /// A URL that does not parse; files for a plaintext URL; a certificate
    /// without its key.
    #[cfg(feature = "etcd")]
    pub fn target(&self, url: &str) -> anyhow::Result<chash_proxy::etcd::EtcdTarget> {
        let target: chash_proxy::etcd::EtcdTarget = url.parse()?;
        let files = chash_proxy::etcd::EtcdTls {
            ca: self.etcd_ca.clone(),
            cert: self.etcd_cert.clone(),
            key: self.etcd_key.clone(),
        };
        Ok(target.with_tls_files(files)?)
    }
}
