//! The accounts' credentials, one table for every gateway: the binary
//! protocol's Login and FIX's Logon check an account's API key here, the
//! REST API finds the account and the signing secret behind a key here.
//! It starts as the configuration's `[[accounts]]` and changes when the
//! configuration is read again (SIGHUP, `Sequencer::reload`): a new
//! account's keys, a changed key or secret, an account taken out of the
//! file (it keeps its balances and orders in the engine, and can no longer
//! log in or sign). Credentials are not journaled: the file is their only
//! home.

use crate::config::AccountConfig;
use crossbook_engine::AccountId;
use std::collections::HashMap;
use std::sync::{Arc, RwLock, RwLockReadGuard};

/// What one account signs and logs in with.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Credential {
    pub(crate) api_key: String,
    /// What logs in on the binary and FIX ports: `login_key`, or the API
    /// key when the account has none.
    pub(crate) login_key: String,
    /// The REST API's HMAC-SHA256 secret; empty: no signed requests.
    pub(crate) secret: Arc<[u8]>,
}

#[derive(Default)]
struct Table {
    by_account: HashMap<AccountId, Credential>,
    by_key: HashMap<String, AccountId>,
    /// The accounts whose orders are cancelled when a session ends
    /// (`cancel_on_disconnect`).
    cancel_on_disconnect: std::collections::HashSet<AccountId>,
}

#[derive(Default)]
pub(crate) struct Keys(RwLock<Table>);

impl Keys {
    pub(crate) fn new(accounts: &[AccountConfig]) -> Keys {
        let keys = Keys::default();
        keys.replace(accounts);
        keys
    }

    fn table(&self) -> RwLockReadGuard<'_, Table> {
        self.0.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The key `account` logs in with, padded to the binary protocol's 32
    /// bytes (a key is 1 to 32 bytes: `Config::setup_commands`).
    pub(crate) fn wire_key(&self, account: AccountId) -> Option<[u8; crossbook_protocol::API_KEY_BYTES]> {
        let table = self.table();
        let bytes = table.by_account.get(&account)?.login_key.as_bytes();
        let mut key = [0u8; crossbook_protocol::API_KEY_BYTES];
        key.get_mut(..bytes.len())?.copy_from_slice(bytes);
        Some(key)
    }

    /// The key `account` logs in with (FIX's Password).
    pub(crate) fn login_key(&self, account: AccountId) -> Option<String> {
        self.table().by_account.get(&account).map(|c| c.login_key.clone())
    }

    /// Whether `account` has credentials (is in the configuration).
    pub(crate) fn has(&self, account: AccountId) -> bool {
        self.table().by_account.contains_key(&account)
    }

    /// Whether a session of `account` that ends takes its orders with it.
    pub(crate) fn cancels_on_disconnect(&self, account: AccountId) -> bool {
        self.table().cancel_on_disconnect.contains(&account)
    }

    /// The account behind API key `key`, and its signing secret.
    pub(crate) fn by_key(&self, key: &str) -> Option<(AccountId, Arc<[u8]>)> {
        let table = self.table();
        let account = *table.by_key.get(key)?;
        Some((account, table.by_account.get(&account)?.secret.clone()))
    }

    /// Makes `accounts` (a checked configuration's: no key shared) the
    /// whole table. Returns the accounts that had an API key and now have
    /// another or none (whoever logged in or opened a listen key with the
    /// old one is to be let go), and those whose signing secret alone
    /// changed (nothing to let go: no session holds a secret; the next
    /// signed request needs the new one).
    pub(crate) fn replace(&self, accounts: &[AccountConfig]) -> Changed {
        let by_account: HashMap<AccountId, Credential> =
            accounts.iter().map(|a| (a.id, Credential { api_key: a.api_key.clone(), login_key: if a.login_key.is_empty() { a.api_key.clone() } else { a.login_key.clone() }, secret: Arc::from(a.api_secret.as_bytes()) })).collect();
        let by_key = by_account.iter().map(|(&account, c)| (c.api_key.clone(), account)).collect();
        let cancel_on_disconnect = accounts.iter().filter(|a| a.cancel_on_disconnect).map(|a| a.id).collect();
        let mut table = self.0.write().unwrap_or_else(|e| e.into_inner());
        let mut changed = Changed::default();
        for (&account, old) in &table.by_account {
            let new = by_account.get(&account);
            if new.is_none_or(|new| new.login_key != old.login_key) {
                changed.logins.push(account);
            }
            match new {
                Some(new) if new.api_key == old.api_key => {
                    if new.secret != old.secret {
                        changed.secrets.push(account);
                    }
                }
                _ => changed.api_keys.push(account),
            }
        }
        changed.api_keys.sort_unstable();
        changed.logins.sort_unstable();
        changed.secrets.sort_unstable();
        *table = Table { by_account, by_key, cancel_on_disconnect };
        changed
    }
}

/// What [`Keys::replace`] changed for accounts that had credentials.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changed {
    /// API key changed, or the account left the file: its REST listen
    /// keys end.
    pub api_keys: Vec<AccountId>,
    /// The key that logs in on the binary and FIX ports changed (its
    /// `login_key`, or its API key without one), or the account left the
    /// file: its sessions there are let go.
    pub logins: Vec<AccountId>,
    /// Only the signing secret changed.
    pub secrets: Vec<AccountId>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account(id: AccountId, key: &str, secret: &str) -> AccountConfig {
        AccountConfig { id, api_key: key.into(), api_secret: secret.into(), login_key: String::new(), deposits: Vec::new(), cancel_on_disconnect: id == 4 }
    }

    #[test]
    fn a_replacement_names_the_accounts_whose_key_changed_or_went_and_those_with_a_new_secret() {
        let keys = Keys::new(&[account(1, "k1", "s1"), account(2, "k2", "s2"), account(3, "k3", "s3")]);
        assert_eq!(keys.by_key("k2").map(|(a, s)| (a, s.to_vec())), Some((2, b"s2".to_vec())));
        let mut wire = [0u8; crossbook_protocol::API_KEY_BYTES];
        wire[..2].copy_from_slice(b"k1");
        assert_eq!(keys.wire_key(1), Some(wire));
        // 1 unchanged, 2 a new secret, 3 gone, 4 new.
        let changed = keys.replace(&[account(1, "k1", "s1"), account(2, "k2", "s2b"), account(4, "k4", "s4")]);
        assert_eq!(changed, Changed { api_keys: vec![3], logins: vec![3], secrets: vec![2] });
        assert!(keys.by_key("k3").is_none() && !keys.has(3) && keys.wire_key(3).is_none());
        assert_eq!(keys.by_key("k2").map(|(_, s)| s.to_vec()), Some(b"s2b".to_vec()));
        assert_eq!(keys.login_key(4).as_deref(), Some("k4"));
        assert!(keys.cancels_on_disconnect(4) && !keys.cancels_on_disconnect(1));
        // A key moved to another account: both change.
        let moved = keys.replace(&[account(1, "k4", "s1"), account(2, "k2", "s2b"), account(4, "k1", "s4")]);
        assert_eq!((moved.api_keys, moved.logins), (vec![1, 4], vec![1, 4]));
        assert_eq!(keys.by_key("k1").map(|(a, _)| a), Some(4));
        // A login key of its own: the binary and FIX logins take it, not
        // the API key (which REST still finds the account by); setting or
        // changing it lets the account's sessions go.
        let mut separate = account(2, "k2", "s2b");
        separate.login_key = "login-2".into();
        assert_eq!(keys.replace(&[account(1, "k4", "s1"), separate.clone(), account(4, "k1", "s4")]), Changed { api_keys: vec![], logins: vec![2], secrets: vec![] });
        let mut wire = [0u8; crossbook_protocol::API_KEY_BYTES];
        wire[..7].copy_from_slice(b"login-2");
        assert_eq!((keys.wire_key(2), keys.login_key(2).as_deref()), (Some(wire), Some("login-2")));
        assert_eq!(keys.by_key("k2").map(|(a, _)| a), Some(2));
        assert!(keys.by_key("login-2").is_none());
        assert_eq!(keys.replace(&[account(1, "k4", "s1"), separate.clone(), account(4, "k1", "s4")]), Changed::default());
        // Its API key changed, its login key not: the listen keys end, the
        // sessions stay.
        separate.api_key = "k2b".into();
        assert_eq!(keys.replace(&[account(1, "k4", "s1"), separate, account(4, "k1", "s4")]), Changed { api_keys: vec![2], logins: vec![], secrets: vec![] });
    }
}
