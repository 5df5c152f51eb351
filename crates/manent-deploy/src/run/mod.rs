//! What a deploy does on the worker and on its targets, below the workflow and the
//! plugins: the building blocks every plugin and the workflow use.
//!
//! - `artifacts`: fetched and verified on the worker (sha256, size limit, sources).
//! - `secrets`, `masking`, `printed`: values read on the worker, never recorded, masked
//!   in everything printed on the stream.
//! - `release_scripts`: the shell of release directories (prune, shared links, the fast
//!   rollback's check); no listing parsed, no symbolic link followed.
//! - `targets`: the built-in plugins' operations on one target, the checks, `MANENT_*`.
//! - `workdirs`: the lifetime of the worker's work directories.

pub mod artifacts;
pub mod masking;
pub mod printed;
pub mod release_scripts;
pub mod secrets;
pub mod targets;
pub mod workdirs;
