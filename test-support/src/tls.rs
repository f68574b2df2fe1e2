//! Certificates made at test time: a CA and a server certificate it signs for
//! `localhost` and `127.0.0.1`, written as PEM files into a temporary directory.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// A test CA and one server certificate, as PEM files that live as long as this value.
#[derive(Debug)]
pub struct TestPki {
    dir: tempfile::TempDir,
    /// The CA certificate (PEM), for clients to trust.
    pub ca_pem: String,
}

impl TestPki {
    pub fn generate() -> TestPki {
        let ca_key = KeyPair::generate().expect("generate the CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(DnType::CommonName, "kvroute test CA");
        let ca_cert = ca_params.self_signed(&ca_key).expect("self-sign the CA");
        let issuer = Issuer::new(ca_params, ca_key);
        let server_key = KeyPair::generate().expect("generate the server key");
        let mut server_params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).expect("server parameters");
        server_params.distinguished_name.push(DnType::CommonName, "kvroute test server");
        let server_cert = server_params.signed_by(&server_key, &issuer).expect("sign the server certificate");
        let dir = tempfile::tempdir().expect("a temporary directory for certificates");
        let ca_pem = ca_cert.pem();
        std::fs::write(dir.path().join("ca.pem"), &ca_pem).expect("write ca.pem");
        std::fs::write(dir.path().join("server.pem"), server_cert.pem()).expect("write server.pem");
        std::fs::write(dir.path().join("server.key"), server_key.serialize_pem()).expect("write server.key");
        TestPki { dir, ca_pem }
    }

    pub fn ca_path(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The server certificate (valid for `localhost` and `127.0.0.1`).
    pub fn cert_path(&self) -> PathBuf {
        self.dir.path().join("server.pem")
    }

    pub fn key_path(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}
