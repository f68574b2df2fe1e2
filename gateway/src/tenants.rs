//! API keys, tenants and their cache scopes.
//!
//! `--api-keys FILE` maps keys to tenants, one per line: `KEY TENANT [SCOPE]`,
//! where SCOPE is `private` (default: the tenant's own cache, scope
//! `t:<tenant>`), `global` (prefixes shared with every global tenant, empty
//! scope) or `off` (no cross-request reuse at all, the mitigation for the
//! prefix-hit timing side channel). `#` starts a comment. Without a file the
//! gateway is open: every request belongs to one anonymous, global tenant.
//! Keys are looked up by their blake3 digest and never logged.

use std::collections::HashMap;
use std::path::Path;

/// How a tenant's requests may share cached prefixes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScopeMode {
    Private,
    Global,
    Off,
}

impl ScopeMode {
    pub fn parse(text: &str) -> Option<ScopeMode> {
        match text {
            "private" => Some(ScopeMode::Private),
            "global" => Some(ScopeMode::Global),
            "off" => Some(ScopeMode::Off),
            _ => None,
        }
    }
}

/// Who a request is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenant {
    pub name: String,
    pub mode: ScopeMode,
}

impl Tenant {
    /// The tenant of an open gateway.
    pub fn anonymous() -> Tenant {
        Tenant { name: "anonymous".into(), mode: ScopeMode::Global }
    }

    /// The cache scope (BRIEF §3) of a request, or None when caching is off.
    /// A `cache_salt` narrows the scope further.
    pub fn scope(&self, cache_salt: Option<&str>) -> Option<Vec<u8>> {
        let mut scope = match self.mode {
            ScopeMode::Off => return None,
            ScopeMode::Global => String::new(),
            ScopeMode::Private => format!("t:{}", self.name),
        };
        if let Some(salt) = cache_salt.filter(|salt| !salt.is_empty()) {
            scope.push_str("|s:");
            scope.push_str(salt);
        }
        Some(scope.into_bytes())
    }
}

/// Why a key file was refused.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    #[error("cannot read the API key file: {0}")]
    Io(#[from] std::io::Error),
    #[error("API key file line {line}: {reason}")]
    Line { line: usize, reason: String },
}

/// Why a request's key was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthError {
    Missing,
    Invalid,
}

/// The key-to-tenant map; `None` inside means open mode.
#[derive(Clone, Debug, Default)]
pub struct Tenants {
    keys: Option<HashMap<[u8; 32], Tenant>>,
}

impl Tenants {
    /// Open mode: no keys required.
    pub fn open() -> Tenants {
        Tenants { keys: None }
    }

    pub fn load(path: &Path) -> Result<Tenants, KeyFileError> {
        Tenants::parse(&std::fs::read_to_string(path)?)
    }

    pub fn parse(text: &str) -> Result<Tenants, KeyFileError> {
        let mut keys = HashMap::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let error = |reason: &str| KeyFileError::Line { line: index + 1, reason: reason.to_string() };
            let (key, tenant, mode) = match fields.as_slice() {
                [key, tenant] => (*key, *tenant, ScopeMode::Private),
                [key, tenant, mode] => (
                    *key,
                    *tenant,
                    ScopeMode::parse(mode).ok_or_else(|| error("scope must be private, global or off"))?,
                ),
                _ => return Err(error("expected KEY TENANT [SCOPE]")),
            };
            if !tenant.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
                return Err(error("tenant names use letters, digits, '-', '_' and '.'"));
            }
            if keys.insert(digest(key), Tenant { name: tenant.to_string(), mode }).is_some() {
                return Err(error("duplicate key"));
            }
        }
        Ok(Tenants { keys: Some(keys) })
    }

    pub fn is_open(&self) -> bool {
        self.keys.is_none()
    }

    /// The tenant called `name` (in open mode, only the anonymous tenant).
    pub fn by_name(&self, name: &str) -> Option<Tenant> {
        match &self.keys {
            None => Some(Tenant::anonymous()).filter(|tenant| tenant.name == name),
            Some(keys) => keys.values().find(|tenant| tenant.name == name).cloned(),
        }
    }

    /// Whether `key` is one of the tenants' keys.
    pub fn has_key(&self, key: &str) -> bool {
        self.keys.as_ref().is_some_and(|keys| keys.contains_key(&digest(key)))
    }

    /// The tenant of a bearer key (the `Authorization: Bearer KEY` value).
    pub fn authenticate(&self, key: Option<&str>) -> Result<Tenant, AuthError> {
        let Some(keys) = &self.keys else { return Ok(Tenant::anonymous()) };
        let key = key.filter(|k| !k.is_empty()).ok_or(AuthError::Missing)?;
        // Keys are looked up by their digest: comparing digests leaks nothing useful.
        keys.get(&digest(key)).cloned().ok_or(AuthError::Invalid)
    }
}

fn digest(key: &str) -> [u8; 32] {
    *blake3::hash(key.as_bytes()).as_bytes()
}

/// Extracts the key from an `Authorization` header value.
pub fn bearer(header: Option<&str>) -> Option<&str> {
    let value = header?.trim();
    value.strip_prefix("Bearer ").or_else(|| value.strip_prefix("bearer ")).map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_keys_and_scopes() {
        let tenants = Tenants::parse("# keys\nsk-a acme\nsk-b beta global\nsk-c secret off  # sensitive\n").unwrap();
        let acme = tenants.authenticate(Some("sk-a")).unwrap();
        assert_eq!(acme.scope(None), Some(b"t:acme".to_vec()));
        assert_eq!(acme.scope(Some("x")), Some(b"t:acme|s:x".to_vec()));
        assert_eq!(tenants.authenticate(Some("sk-b")).unwrap().scope(None), Some(Vec::new()));
        assert_eq!(tenants.authenticate(Some("sk-c")).unwrap().scope(Some("x")), None);
        assert_eq!(tenants.authenticate(Some("nope")), Err(AuthError::Invalid));
        assert_eq!(tenants.authenticate(None), Err(AuthError::Missing));
    }

    #[test]
    fn tenants_by_name_and_key() {
        let tenants = Tenants::parse("sk-a acme\nsk-b beta global\n").unwrap();
        assert_eq!(tenants.by_name("beta").map(|tenant| tenant.mode), Some(ScopeMode::Global));
        assert_eq!(tenants.by_name("nobody"), None);
        assert!(tenants.has_key("sk-a") && !tenants.has_key("acme"));
        assert_eq!(Tenants::open().by_name("anonymous"), Some(Tenant::anonymous()));
        assert!(!Tenants::open().has_key("anything"));
    }

    #[test]
    fn open_mode_is_one_global_tenant() {
        let tenants = Tenants::open();
        assert_eq!(tenants.authenticate(None).unwrap(), Tenant::anonymous());
        assert_eq!(Tenant::anonymous().scope(Some("s")), Some(b"|s:s".to_vec()));
    }

    #[test]
    fn bad_files_name_the_line() {
        let error = Tenants::parse("sk-a acme\nsk-b\n").unwrap_err().to_string();
        assert!(error.contains("line 2"), "{error}");
        assert!(Tenants::parse("k t weird").is_err());
        assert!(Tenants::parse("k t\nk u").unwrap_err().to_string().contains("duplicate"));
        assert!(Tenants::parse("k bad/name").is_err());
    }

    #[test]
    fn bearer_header() {
        assert_eq!(bearer(Some("Bearer sk-1")), Some("sk-1"));
        assert_eq!(bearer(Some("Basic x")), None);
        assert_eq!(bearer(None), None);
    }
}
