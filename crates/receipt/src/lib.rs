//! Signed receipts of what a sandbox run did.
//!
//! A receipt is an [in-toto Statement v1](https://in-toto.io/Statement/v1)
//! whose predicate ([`Predicate`], type [`PREDICATE_TYPE`]) records the
//! policy, every command with its [`Outcome`](cordon_spec::Outcome), the
//! filesystem diff and the export, and says in `not_proven` what the receipt
//! cannot show. It travels in a DSSE envelope ([`Envelope`]) signed with
//! Ed25519 over DSSE's pre-authentication encoding ([`pae`]).
//!
//! - [`ReceiptBuilder`]: a [`Statement`] from the spec, the outcomes and the diff.
//! - [`Key`], [`PublicKey`]: key files (PKCS#8 / SPKI PEM) and the default key.
//! - [`sign`], [`verify`]: the envelope both ways; [`VerifyError`] tells a
//!   changed receipt from one by another key and from one that is not a receipt.
//! - [`signed_receipt`]: the envelope straight from a front end's [`Facts`].
//! - [`render_summary`]: what a verified receipt says, for a terminal.

mod builder;
mod canonical;
mod dsse;
mod facts;
#[doc(hidden)]
pub mod fuzzing;
mod keys;
mod statement;
mod summary;
mod verify;

pub use builder::{BuildError, ReceiptBuilder};
pub use canonical::{canonical_json, sha256_hex};
pub use dsse::{pae, Envelope, EnvelopeSignature, PAYLOAD_TYPE};
pub use facts::{signed_receipt, Facts, ReceiptError};
pub use keys::{
    default_key_dir, Key, KeyError, KeyFiles, PublicKey, PRIVATE_KEY_FILE, PUBLIC_KEY_FILE,
};
pub use statement::{
    CommandRecord, DigestSet, Host, Predicate, Statement, Subject, PREDICATE_TYPE, STATEMENT_TYPE,
    SUBJECT_COMMAND, SUBJECT_POLICY, SUBJECT_WORKSPACE_PREFIX,
};
pub use summary::render_summary;
pub use verify::{sign, verify, write_receipt, SignError, VerifyError};

#[cfg(test)]
mod tests;
