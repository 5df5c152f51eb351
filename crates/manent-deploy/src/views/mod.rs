//! What the API and the CLI show (docs/cli.md), as this crate's own types; manent-api
//! turns them into the contract's.
//!
//! - `deploy_views`: status, list, logs, output, activity, an environment's history.
//! - `timeline`: a deploy's steps and events in order.
//! - `platform`: workers, queues, tenants and applications.
//! - `metrics`: `/metrics`.

pub mod deploy_views;
pub mod metrics;
pub mod platform;
pub mod timeline;
