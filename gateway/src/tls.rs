//! TLS of the gateway (rustls): its certificate for the HTTP and gRPC ingress,
//! and the CA it trusts for the agents' certificates. PEM files, read once at
//! start; a missing or unreadable file is an error that names it.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// The gateway's own certificate chain and private key.
#[derive(Clone)]
pub struct IngressTls {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
}

impl std::fmt::Debug for IngressTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IngressTls { .. }")
    }
}

impl IngressTls {
    /// Reads and checks a PEM certificate chain and its PEM private key.
    pub fn load(cert: &Path, key: &Path) -> anyhow::Result<IngressTls> {
        let cert_pem = std::fs::read(cert).with_context(|| format!("reading the certificate {}", cert.display()))?;
        let key_pem = std::fs::read(key).with_context(|| format!("reading the private key {}", key.display()))?;
        let tls = IngressTls { cert_pem, key_pem };
        tls.http_config().with_context(|| format!("{} and {}", cert.display(), key.display()))?;
        Ok(tls)
    }

    /// The rustls configuration of the HTTPS listener (HTTP/1.1).
    pub fn http_config(&self) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        let certs = CertificateDer::pem_slice_iter(&self.cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .context("the certificate file is not PEM")?;
        anyhow::ensure!(!certs.is_empty(), "the certificate file holds no certificate");
        let key = PrivateKeyDer::from_pem_slice(&self.key_pem).context("the key file holds no PEM private key")?;
        let mut config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .context("the private key does not match the certificate")?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// The tonic configuration of the gRPC listener.
    pub fn grpc_config(&self) -> ServerTlsConfig {
        ServerTlsConfig::new().identity(Identity::from_pem(&self.cert_pem, &self.key_pem))
    }
}

/// How the gateway verifies agents that serve gRPC over TLS: the CA that signed their certificates, and the
/// name to check them against (default: the host of each agent's address).
pub fn agent_client_config(ca: &Path, domain: Option<&str>) -> anyhow::Result<ClientTlsConfig> {
    let ca_pem = std::fs::read(ca).with_context(|| format!("reading the agents' CA {}", ca.display()))?;
    let found = CertificateDer::pem_slice_iter(&ca_pem).filter(Result::is_ok).count();
    anyhow::ensure!(found > 0, "{} holds no PEM certificate", ca.display());
    let config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem));
    Ok(match domain {
        Some(domain) => config.domain_name(domain),
        None => config,
    })
}
