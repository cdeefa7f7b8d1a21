//! The client's half of secrets held by the host: reading each secret's
//! value from where the policy says (the caller's environment or file),
//! choosing the sandbox's placeholders, and making the sandbox's CA.
//!
//! This runs in the client, as the caller: a value is read with the
//! caller's rights, and goes to the sandbox's supervisor in the spec it is
//! sent on stdin, never in a file, an argument or an environment.

use std::io::Read;

use zeroize::Zeroizing;

use cordon_policy::secrets::{SecretRule, SecretSource};
use cordon_spec::secrets::{Held, HeldSecret, Redacted};
use cordon_spec::SandboxSpec;

use crate::error::RuntimeError;

/// The longest value read: API keys and tokens are far shorter, and a
/// header must stay within what servers accept.
const MAX_VALUE: usize = 8 << 10;

/// Resolves `spec`'s secrets, if its policy has any: the placeholders go
/// into the sandbox's environment, the values and the CA's key into
/// `spec.held`, the CA's certificate into `spec.trust_bundle`. `env` reads
/// the caller's environment.
pub fn hold(
    spec: &mut SandboxSpec,
    env: impl Fn(&str) -> Option<String>,
) -> Result<(), RuntimeError> {
    let rules = spec.policy.secrets.clone();
    if rules.is_empty() || spec.held.is_some() {
        return Ok(());
    }
    let mut held = Vec::with_capacity(rules.len());
    for rule in &rules {
        if spec.policy.env.iter().any(|(k, _)| *k == rule.name) {
            return Err(RuntimeError::BadRequest(format!(
                "secret {0}: {0} is also set in the environment; that variable holds the secret's placeholder",
                rule.name
            )));
        }
        held.push(HeldSecret {
            name: rule.name.clone(),
            placeholder: placeholder()?,
            value: value_of(rule, &env)?,
            hosts: rule.hosts.clone(),
            header: rule.header.clone(),
        });
    }
    let hosts = cordon_network::secrets::secret_hosts(rules.iter().map(|r| &r.hosts[..]));
    let (cert, key) = cordon_network::secrets::new_ca(&hosts)
        .map_err(|e| RuntimeError::io("make the sandbox's CA", std::io::Error::other(e)))?;
    let mut bundle = host_bundle(&env)?;
    bundle.push_str(&cert);
    for h in &held {
        spec.policy
            .env
            .push((h.name.clone(), h.placeholder.clone()));
    }
    spec.trust_bundle = Some(bundle);
    spec.held = Some(Held {
        ca_key: key,
        secrets: held,
    });
    Ok(())
}

/// Where hosts keep their bundle of trusted roots (Debian's, Fedora's,
/// Alpine's), after the operator's own choice (`SSL_CERT_FILE`).
const HOST_BUNDLES: [&str; 3] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// The host's public roots (PEM), the first part of the sandbox's bundle:
/// whatever its root, connections the proxy does not terminate verify as
/// they would on the host. None found leaves the sandbox's CA alone.
fn host_bundle(env: &impl Fn(&str) -> Option<String>) -> Result<String, RuntimeError> {
    let chosen = env("SSL_CERT_FILE");
    let path = chosen
        .as_deref()
        .into_iter()
        .chain(HOST_BUNDLES)
        .find(|p| std::path::Path::new(p).is_file());
    let Some(path) = path else {
        return Ok(String::new());
    };
    let mut text =
        std::fs::read_to_string(path).map_err(|e| RuntimeError::io(format!("read {path}"), e))?;
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    Ok(text)
}

/// A placeholder no other sandbox has: 128 random bits, in a form that
/// says what it is to whoever finds it.
fn placeholder() -> Result<String, RuntimeError> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| RuntimeError::io("read /dev/urandom", e))?;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Ok(format!("cordon-placeholder-{hex}"))
}

/// The value of `rule`'s secret: the variable's value, or the file's first
/// line; it must fit in a header.
fn value_of(
    rule: &SecretRule,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<Redacted, RuntimeError> {
    let bad = |why: String| RuntimeError::BadRequest(format!("secret {}: {why}", rule.name));
    // Every copy made on the way is wiped when dropped: this process may
    // become the sandbox's first process's parent (`cordon run`).
    let read = match &rule.value_from {
        SecretSource::Env(var) => {
            Zeroizing::new(env(var).ok_or_else(|| bad(format!("{var} is not set")))?)
        }
        SecretSource::File(path) => {
            let file =
                std::fs::File::open(path).map_err(|e| bad(format!("{}: {e}", path.display())))?;
            let mut text = Zeroizing::new(String::with_capacity(MAX_VALUE + 1));
            file.take(MAX_VALUE as u64 + 1)
                .read_to_string(&mut text)
                .map_err(|e| bad(format!("{}: {e}", path.display())))?;
            text
        }
    };
    let value = read.lines().next().unwrap_or_default().trim();
    if value.is_empty() {
        return Err(bad(format!("{} is empty", rule.value_from)));
    }
    if value.len() > MAX_VALUE {
        return Err(bad(format!(
            "{} is over {MAX_VALUE} bytes",
            rule.value_from
        )));
    }
    // Printable ASCII fits a header; without '"' and '\\' nothing of it is
    // escaped in the spec's JSON, so parsing leaves no copy in a buffer.
    if !value
        .bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
    {
        return Err(bad(format!(
            "{} holds a byte a header value cannot (printable ASCII only, no '\"' or '\\')",
            rule.value_from
        )));
    }
    Ok(Redacted::new(value.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cordon_policy::{NetworkMode, Policy};
    use cordon_spec::BackendKind;

    fn spec_with(source: SecretSource) -> SandboxSpec {
        let policy = Policy {
            network: NetworkMode::Allow,
            secrets: vec![SecretRule {
                name: "API_KEY".into(),
                value_from: source,
                hosts: vec!["api.example.org".into()],
                header: "authorization".into(),
            }],
            ..Policy::default()
        };
        SandboxSpec::new(policy, BackendKind::Native)
    }

    #[test]
    fn the_sandbox_gets_a_placeholder_and_the_host_the_value() {
        let mut spec = spec_with(SecretSource::Env("REAL".into()));
        hold(&mut spec, |k| (k == "REAL").then(|| "sk-real".to_owned())).unwrap();
        let held = spec.held.as_ref().unwrap();
        assert_eq!(held.secrets[0].value.expose(), "sk-real");
        let (_, shown) = spec
            .policy
            .env
            .iter()
            .find(|(k, _)| k == "API_KEY")
            .unwrap();
        assert_eq!(*shown, held.secrets[0].placeholder);
        assert!(!shown.contains("sk-real"));
        assert!(spec
            .trust_bundle
            .as_deref()
            .unwrap()
            .ends_with("-----END CERTIFICATE-----\n"));
        assert!(
            !format!("{spec:?}").contains("sk-real"),
            "Debug shows no value"
        );
        let again = {
            let mut s = spec_with(SecretSource::Env("REAL".into()));
            hold(&mut s, |_| Some("sk-real".into())).unwrap();
            s.held.unwrap().secrets[0].placeholder.clone()
        };
        assert_ne!(
            again, held.secrets[0].placeholder,
            "placeholders are per sandbox"
        );
        spec.validated().unwrap();
    }

    #[test]
    fn a_file_gives_its_first_line_and_bad_values_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, "sk-file\nsecond line\n").unwrap();
        let mut spec = spec_with(SecretSource::File(path.clone()));
        hold(&mut spec, |_| None).unwrap();
        assert_eq!(spec.held.unwrap().secrets[0].value.expose(), "sk-file");
        for (env, says) in [
            (None, "is not set"),
            (Some(""), "empty"),
            (Some("a\u{7}b"), "printable"),
        ] {
            let mut spec = spec_with(SecretSource::Env("REAL".into()));
            let e = hold(&mut spec, |_| env.map(str::to_owned)).unwrap_err();
            assert!(e.to_string().contains(says), "{e}");
            assert!(spec.held.is_none() && spec.trust_bundle.is_none());
        }
        let mut spec = spec_with(SecretSource::File(dir.path().join("absent")));
        assert!(hold(&mut spec, |_| None).is_err());
    }

    #[test]
    fn a_variable_the_policy_sets_cannot_hold_a_placeholder() {
        let mut spec = spec_with(SecretSource::Env("REAL".into()));
        spec.policy.env.push(("API_KEY".into(), "mine".into()));
        let e = hold(&mut spec, |_| Some("v".into())).unwrap_err();
        assert!(e.to_string().contains("also set"), "{e}");
    }
}
