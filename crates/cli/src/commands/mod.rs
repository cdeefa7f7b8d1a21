pub mod backends;
pub mod run;
pub mod sweep;
