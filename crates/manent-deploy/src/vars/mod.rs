//! Variables, secrets and templates on the worker (docs/environments.md, "Variables",
//! "Secret providers", "Templates"). The model (manent-model) says what they are and
//! renders a template; this room reads, holds and writes them.
//!
//! - `providers`: one secret's value from its provider: a file, a variable of the worker,
//!   a command run on the worker (with a timeout), an age-encrypted file.
//! - `run_values`: what one run of a deploy holds in memory, never recorded: each secret
//!   read once, each template rendered for each target before the first target changes;
//!   in scope for the run like its dead-man's switch.
//! - `writing`: a rendered template written onto a target like an artifact (`.part`,
//!   verified, renamed, its mode).
//! - `listing`: `manent vars`: each variable's effective value per target and its source.
//!
//! `run` reads its secrets through this room; the workflow prepares a run's values and the
//! plugins write the templates. This room uses nothing of `run` but its mask's text.

pub mod listing;
pub mod providers;
pub mod run_values;
pub mod writing;
