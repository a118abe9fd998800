//! The CLI's tenant: the compare-and-swap writer of `PREFIX/config`
//! (`chash config --etcd`) and the reader of every proxy's report (`chash
//! fleet status`). The proxy's runtime only reads the config and keeps its
//! own report ([`super::follow`]).

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};

use super::{Client, EtcdError, EtcdTarget, ProxyReport};

/// Writes `text` to `PREFIX/config` if the key's revision is still `read`
/// (`None`: if the key does not exist yet): a compare-and-swap, so two
/// writers never overwrite each other's change unknowingly. Returns the
/// new revision.
///
/// # Errors
/// [`EtcdError::Conflict`] when the key changed since it was read (nothing
/// is written), etcd's errors.
pub async fn write_config(
    client: &mut Client,
    target: &EtcdTarget,
    text: &str,
    read: Option<i64>,
) -> Result<i64, EtcdError> {
    let key = target.config_key();
    let compare = match read {
        Some(revision) => Compare::mod_revision(key.as_str(), CompareOp::Equal, revision),
        None => Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
    };
    let txn = Txn::new()
        .when([compare])
        .and_then([TxnOp::put(key.as_str(), text, None)])
        .or_else([TxnOp::get(key.as_str(), None)]);
    let response = client.txn(txn).await.map_err(|e| target.error(&format!("cannot write {key}"), &e))?;
    if response.succeeded() {
        return Ok(response.header().map_or(0, |h| h.revision()));
    }
    let now = response
        .op_responses()
        .into_iter()
        .find_map(|r| match r {
            TxnOpResponse::Get(g) => Some(g.kvs().first().map_or(0, |kv| kv.mod_revision())),
            _ => None,
        })
        .unwrap_or(0);
    Err(EtcdError::Conflict { key, read: read.unwrap_or(0), now })
}

/// Every proxy registered under `PREFIX/proxies/`, by id; a value that
/// does not parse is reported with its key as id and no pools.
///
/// # Errors
/// etcd's.
pub async fn read_proxies(client: &mut Client, target: &EtcdTarget) -> Result<Vec<ProxyReport>, EtcdError> {
    let prefix = target.proxies_prefix();
    let response = client
        .get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
        .await
        .map_err(|e| target.error(&format!("cannot read {prefix}"), &e))?;
    let mut proxies: Vec<ProxyReport> = response
        .kvs()
        .iter()
        .map(|kv| {
            serde_json::from_slice(kv.value()).unwrap_or_else(|_| ProxyReport {
                id: String::from_utf8_lossy(kv.key()).into_owned(),
                revision: -1,
                ..ProxyReport::default()
            })
        })
        .collect();
    proxies.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(proxies)
}
