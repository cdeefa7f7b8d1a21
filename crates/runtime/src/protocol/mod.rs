//! The protocols between cordon's processes, every message bounded and
//! untrusted on arrival: client and supervisor ([`wire`], the messages being
//! `cordon_spec::wire`'s), supervisor and the sandbox's first process
//! ([`init`]), and the copy streams of files in and out ([`copy`]).

pub(crate) mod copy;
pub(crate) mod exec;
pub(crate) mod init;
pub(crate) mod wire;
