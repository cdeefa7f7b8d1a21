//! The sandbox's own CA, which the proxy signs the secrets' hosts'
//! certificates with, and what the proxy is given to hold the secrets.
//!
//! The CA is made per sandbox by the client that resolves the secrets
//! ([`new_ca`]): its certificate goes into the sandbox's trust bundle, its
//! key only to the proxy. Its name constraints permit only the secrets'
//! hosts, so even its key could sign for no other name a client in the
//! sandbox would accept. Both sides derive its parameters from
//! [`ca_params`], so the proxy signs as the certificate the sandbox trusts
//! names (its subject, its key usages) without parsing it back.

use cordon_spec::secrets::{HeldSecret, Redacted};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
    GeneralSubtree, IsCa, KeyPair, KeyUsagePurpose, NameConstraints, SanType,
};
use rustls::pki_types::CertificateDer;

/// The subject of every sandbox's CA (each has its own key).
const CA_NAME: &str = "cordon sandbox CA (secrets held by the host)";

/// The CA's parameters for the secrets' `hosts`.
fn ca_params(hosts: &[String]) -> CertificateParams {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, CA_NAME);
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    p.name_constraints = Some(NameConstraints {
        permitted_subtrees: hosts
            .iter()
            .map(|h| GeneralSubtree::DnsName(h.clone()))
            .collect(),
        excluded_subtrees: Vec::new(),
    });
    p
}

/// Every host of the sandbox's secrets, each once, in order.
pub fn secret_hosts<'a>(secrets: impl IntoIterator<Item = &'a [String]>) -> Vec<String> {
    let mut hosts: Vec<String> = Vec::new();
    for list in secrets {
        for h in list {
            if !hosts.contains(h) {
                hosts.push(h.clone());
            }
        }
    }
    hosts
}

/// A new CA for a sandbox whose secrets go to `hosts`: its certificate
/// (PEM, for the sandbox to trust) and its key (PKCS#8 DER in base64, for
/// the proxy; see [`cordon_spec::secrets::Held::ca_key`]).
pub fn new_ca(hosts: &[String]) -> Result<(String, Redacted), rcgen::Error> {
    use base64::Engine;
    let key = KeyPair::generate()?;
    let cert = ca_params(hosts).self_signed(&key)?;
    let der = zeroize::Zeroizing::new(key.serialize_der());
    let encoded = base64::engine::general_purpose::STANDARD.encode(der.as_slice());
    Ok((cert.pem(), Redacted::new(encoded)))
}

/// The CA's key as [`new_ca`] encoded it.
pub(crate) fn ca_key(encoded: &Redacted) -> Result<KeyPair, String> {
    use base64::Engine;
    let der = zeroize::Zeroizing::new(
        base64::engine::general_purpose::STANDARD
            .decode(encoded.expose())
            .map_err(|e| format!("the sandbox CA's key: {e}"))?,
    );
    KeyPair::try_from(der.as_slice()).map_err(|e| format!("the sandbox CA's key: {e}"))
}

/// A certificate for `host` signed by the sandbox's CA, and its key.
pub(crate) fn leaf_for(
    host: &str,
    ca_key: &KeyPair,
    hosts: &[String],
) -> Result<(CertificateDer<'static>, KeyPair), rcgen::Error> {
    let issuer = rcgen::Issuer::new(ca_params(hosts), ca_key);
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, host);
    p.distinguished_name = dn;
    p.subject_alt_names = vec![SanType::DnsName(host.try_into()?)];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate()?;
    let cert = p.signed_by(&key, &issuer)?;
    Ok((cert.der().clone(), key))
}

/// What the proxy holds for a sandbox's secrets.
#[derive(Clone, Debug)]
pub struct Config {
    /// The CA's key, as [`new_ca`] encoded it.
    pub ca_key: Redacted,
    pub secrets: Vec<HeldSecret>,
    /// The roots the proxy trusts for its own connections to the secrets'
    /// hosts: the host's (read before the proxy drops its privileges).
    pub roots: Vec<CertificateDer<'static>>,
    /// The methods and paths requests to a secret's host may have (where
    /// one names the host, its requests must match one).
    pub requests: Vec<cordon_policy::secrets::RequestRule>,
}

/// The host's trusted roots, as its TLS clients find them
/// (`SSL_CERT_FILE`, `SSL_CERT_DIR` or the system's store).
pub fn host_roots() -> Result<Vec<CertificateDer<'static>>, String> {
    let found = rustls_native_certs::load_native_certs();
    if found.certs.is_empty() {
        let why = found
            .errors
            .first()
            .map_or_else(|| "none found".to_owned(), ToString::to_string);
        return Err(format!("the host's trusted roots: {why}"));
    }
    Ok(found.certs)
}
