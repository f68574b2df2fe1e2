//! The operator's admin key, which `/debug/route` requires: it shows which replica holds which of a
//! tenant's prefixes, exactly what cache scope `off` hides from tenants, so tenant keys cannot use it.
//! Set with `--admin-api-key` or the environment variable `KVROUTE_ADMIN_API_KEY`; without one the
//! endpoint is off. Keys are compared by their blake3 digest and never logged.

use crate::tenants::Tenants;

/// The admin key's digest, if one is configured.
#[derive(Clone, Debug, Default)]
pub struct AdminKey {
    digest: Option<[u8; 32]>,
}

/// Why an admin request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminDenied {
    /// No admin key is configured: the admin endpoints are off.
    Off,
    /// The request carries no key.
    Missing,
    /// The key is a tenant's, not the admin key.
    TenantKey,
    /// The key is nobody's.
    Invalid,
}

fn digest(key: &str) -> [u8; 32] {
    *blake3::hash(key.as_bytes()).as_bytes()
}

impl AdminKey {
    /// No admin key: the admin endpoints are off.
    pub fn off() -> AdminKey {
        AdminKey { digest: None }
    }

    /// The admin key `key`; refused when it is empty, has white space, or is also a tenant's key.
    pub fn new(key: &str, tenants: &Tenants) -> Result<AdminKey, String> {
        if key.is_empty() || key.chars().any(char::is_whitespace) {
            return Err("the admin API key must be non-empty and have no white space".into());
        }
        if tenants.has_key(key) {
            return Err("the admin API key is also a tenant's key in --api-keys: give it a key of its own".into());
        }
        Ok(AdminKey { digest: Some(digest(key)) })
    }

    pub fn is_on(&self) -> bool {
        self.digest.is_some()
    }

    /// Checks the bearer key of a request to an admin endpoint.
    pub fn check(&self, key: Option<&str>, tenants: &Tenants) -> Result<(), AdminDenied> {
        let Some(expected) = &self.digest else { return Err(AdminDenied::Off) };
        let key = key.filter(|key| !key.is_empty()).ok_or(AdminDenied::Missing)?;
        if digest(key) == *expected {
            Ok(())
        } else if tenants.has_key(key) {
            Err(AdminDenied::TenantKey)
        } else {
            Err(AdminDenied::Invalid)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_admin_key_passes() {
        let tenants = Tenants::parse("sk-tenant acme\n").unwrap();
        assert_eq!(AdminKey::off().check(Some("anything"), &tenants), Err(AdminDenied::Off));
        let admin = AdminKey::new("sk-admin", &tenants).unwrap();
        assert!(admin.is_on());
        assert_eq!(admin.check(Some("sk-admin"), &tenants), Ok(()));
        assert_eq!(admin.check(None, &tenants), Err(AdminDenied::Missing));
        assert_eq!(admin.check(Some(""), &tenants), Err(AdminDenied::Missing));
        assert_eq!(admin.check(Some("sk-tenant"), &tenants), Err(AdminDenied::TenantKey));
        assert_eq!(admin.check(Some("sk-other"), &tenants), Err(AdminDenied::Invalid));
        assert!(AdminKey::new("sk-tenant", &tenants).is_err());
        assert!(AdminKey::new("", &tenants).is_err());
        assert!(AdminKey::new("two words", &tenants).is_err());
    }
}
