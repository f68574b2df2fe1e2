//! Cache salts: the string the agent passes to the engine as a request's `cache_salt` so the engine keeps
//! each cache scope's blocks apart, and the bounded registry that maps a salt seen in an event back to its
//! scope.
//!
//! A salt is [`SALT_PREFIX`] and the hex of the first 16 bytes of
//! `blake3::derive_key("kvroute/cache-salt/v1", scope)`: deterministic (an agent restart derives the same
//! salts, so blocks the engine still holds keep their scope once the scope is seen again), 37 ASCII
//! characters, none of `@`, `/` or `\`. The global (empty) scope has no salt: the engine shares those
//! blocks with every request that has none. A request that must not share anything gets
//! [`one_off_salt`], which is never registered, so its blocks are never indexed.

use std::collections::{HashMap, VecDeque};

/// The start of every salt [`salt_for_scope`] makes.
pub const SALT_PREFIX: &str = "kvr1-";
/// The start of every [`one_off_salt`]: distinct from [`SALT_PREFIX`], so the two never collide.
pub const ONE_OFF_PREFIX: &str = "kvr1x-";
/// The blake3 key-derivation context of salts.
pub const SALT_CONTEXT: &str = "kvroute/cache-salt/v1";
/// Salts a [`SaltRegistry`] remembers by default.
pub const DEFAULT_SALT_CAPACITY: usize = 65_536;

/// The engine `cache_salt` of `scope`; `None` for the global (empty) scope, which gets no salt.
pub fn salt_for_scope(scope: &[u8]) -> Option<String> {
    if scope.is_empty() {
        return None;
    }
    let digest = blake3::derive_key(SALT_CONTEXT, scope);
    Some(format!("{SALT_PREFIX}{}", hex(&digest[..16])))
}

/// A salt for one request whose blocks must be shared with no other (caching disabled), from 16 random
/// bytes the caller draws. Never registered, so the translator does not index what it stores.
pub fn one_off_salt(nonce: [u8; 16]) -> String {
    format!("{ONE_OFF_PREFIX}{}", hex(&nonce))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut out, byte| {
        let _ = write!(out, "{byte:02x}");
        out
    })
}

/// Salt -> scope for the most recently registered salts (at most `capacity`; registering a salt again
/// makes it the most recent).
#[derive(Debug)]
pub struct SaltRegistry {
    capacity: usize,
    scopes: HashMap<String, (Vec<u8>, u64)>,
    /// (salt, stamp) in registration order; an entry whose stamp no longer matches is stale.
    order: VecDeque<(String, u64)>,
    next_stamp: u64,
}

impl SaltRegistry {
    /// A registry of at most `capacity` salts (at least 1).
    pub fn new(capacity: usize) -> SaltRegistry {
        SaltRegistry { capacity: capacity.max(1), scopes: HashMap::new(), order: VecDeque::new(), next_stamp: 0 }
    }

    /// Registers `scope` and returns its salt to send with the request; `None` (nothing registered) for
    /// the global scope.
    pub fn register(&mut self, scope: &[u8]) -> Option<String> {
        let salt = salt_for_scope(scope)?;
        self.insert(&salt, scope);
        Some(salt)
    }

    /// Registers a salt that [`salt_for_scope`] did not make (a fixed salt some deployment already uses,
    /// a test's) as `scope`'s.
    pub fn insert(&mut self, salt: &str, scope: &[u8]) {
        let salt = salt.to_string();
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        self.scopes.insert(salt.clone(), (scope.to_vec(), stamp));
        self.order.push_back((salt, stamp));
        while self.scopes.len() > self.capacity {
            let Some((oldest, oldest_stamp)) = self.order.pop_front() else { break };
            if self.scopes.get(&oldest).is_some_and(|(_, current)| *current == oldest_stamp) {
                self.scopes.remove(&oldest);
            }
        }
        if self.order.len() > 2 * self.capacity {
            self.order.retain(|(salt, stamp)| self.scopes.get(salt).is_some_and(|(_, current)| current == stamp));
        }
    }

    /// The scope `salt` was registered for.
    pub fn scope(&self, salt: &str) -> Option<&[u8]> {
        self.scopes.get(salt).map(|(scope, _)| scope.as_slice())
    }

    pub fn len(&self) -> usize {
        self.scopes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.scopes.is_empty()
    }
}

impl Default for SaltRegistry {
    fn default() -> Self {
        SaltRegistry::new(DEFAULT_SALT_CAPACITY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn salts_are_deterministic_short_and_plain() {
        let salt = salt_for_scope(b"t:acme").unwrap();
        assert_eq!(salt_for_scope(b"t:acme").as_deref(), Some(salt.as_str()));
        assert_ne!(salt_for_scope(b"t:other"), Some(salt.clone()));
        assert!(salt.starts_with(SALT_PREFIX));
        assert_eq!(salt.len(), SALT_PREFIX.len() + 32);
        assert!(salt.len() <= 128);
        assert!(salt.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'-'), "{salt}");
        assert_eq!(salt_for_scope(b""), None, "the global scope has no salt");
        // Pinned: agents of different versions must agree on a scope's salt.
        assert_eq!(
            salt_for_scope(b"t:acme").unwrap(),
            format!("kvr1-{}", hex(&blake3::derive_key("kvroute/cache-salt/v1", b"t:acme")[..16]))
        );
    }

    #[test]
    fn one_off_salts_never_look_registered() {
        let salt = one_off_salt([0xab; 16]);
        assert!(salt.starts_with(ONE_OFF_PREFIX) && !salt.starts_with(SALT_PREFIX));
        assert_eq!(salt.len(), ONE_OFF_PREFIX.len() + 32);
        let mut registry = SaltRegistry::new(4);
        registry.register(b"a");
        assert_eq!(registry.scope(&salt), None);
    }

    #[test]
    fn registry_forgets_the_least_recently_registered() {
        let mut registry = SaltRegistry::new(2);
        let a = registry.register(b"a").unwrap();
        let b = registry.register(b"b").unwrap();
        assert_eq!(registry.register(b""), None);
        assert_eq!(registry.len(), 2);
        registry.register(b"a"); // a is the most recent again
        let c = registry.register(b"c").unwrap();
        assert_eq!(registry.scope(&a), Some(&b"a"[..]));
        assert_eq!(registry.scope(&b), None);
        assert_eq!(registry.scope(&c), Some(&b"c"[..]));
        for _ in 0..100 {
            registry.register(b"a");
        }
        assert!(registry.order.len() <= 4, "stale order entries are compacted");
        assert_eq!(registry.scope(&c), Some(&b"c"[..]));
        registry.insert("tenant-a", b"t:a");
        assert_eq!(registry.scope("tenant-a"), Some(&b"t:a"[..]));
        assert_eq!(registry.len(), 2);
    }
}
