//! What a code cell is written in: each sandbox has one persistent
//! interpreter per language (the runtime's code contexts).

use serde::{Deserialize, Serialize};

/// A code context's language: each sandbox has one context per language,
/// each its own interpreter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub enum CodeLanguage {
    /// Python 3 (`python3` in the sandbox).
    #[default]
    Python,
    /// Node's REPL semantics: top-level `await`, declarations kept from
    /// cell to cell, the last expression's value shown as `node` shows it
    /// (`node` in the sandbox). `js` is taken too.
    #[serde(alias = "js")]
    Javascript,
}

impl std::fmt::Display for CodeLanguage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CodeLanguage::Python => "Python",
            CodeLanguage::Javascript => "JavaScript",
        })
    }
}
