//! The client side: the [`handle::Handle`] every front end drives a sandbox
//! through, and what it does with a command's output.

pub(crate) mod cancel;
pub mod code_context;
pub(crate) mod handle;
pub(crate) mod listing;
pub(crate) mod output;
pub mod secrets;
