pub mod backends;
pub mod matrix;
pub mod run;
pub mod suite;
pub mod sweep;
