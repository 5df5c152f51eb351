//! manent's deploys on the durable engine: which queues a worker serves, how a deploy is
//! submitted and routed, the deploy workflow itself, and the views (JSON shapes of
//! docs/cli.md) that the API and the CLI show.
//!
//! The crate is organised in rooms, one per capability, each a module folder whose
//! `mod.rs` is its map; a few records every room shares stay at the top:
//!
//! - `request`, `history`: what a deploy records, one environment's past (the leaves).
//! - `authority`: the token question, answered by manent-api. `queues`: the queues a
//!   worker serves. `notifications`: the outbox of notification events.
//! - [`submission`]: parse, check, route and enqueue; rollback, redeploy; approvals.
//! - [`irreversible`]: the rollback guard, which a rollback or redeploy passes first.
//! - [`workflow`]: the deploy workflow and its gate (approvals, dependencies, waits).
//! - [`run`]: what a deploy does on the worker and its targets: artifacts, secrets and
//!   masking, printed output, release scripts, target operations, work directories.
//! - [`vars`]: variables, secret providers and templates on the worker, `manent vars`.
//! - [`plugins`]: the `Plugin` trait, the built-in and the external plugins.
//! - [`tasks`]: `deploy.tasks`, on targets by role or once per deploy; irreversible deploys'
//!   automatic rollback.
//! - [`analysis`]: `rollout.analysis`, the bake between waves; promote and abort.
//! - [`drift`]: each target compared with its manifest, on demand or on a schedule.
//! - [`manifests`]: what a release holds once checked, recorded per target.
//! - [`plan`]: what a dry run would change on each target, against the live release.
//! - [`views`]: status, list, logs, timeline, the platform views, `/metrics`.
//! - [`background`]: what every worker runs beside deploys: schedules, retention.
//!
//! `tests/modules.rs` keeps the rooms a DAG.

pub mod analysis;
pub mod authority;
pub mod background;
pub mod containers;
pub mod drift;
pub mod history;
pub mod http;
pub mod irreversible;
pub mod manifests;
pub mod notifications;
pub mod plan;
pub mod plugins;
pub mod queues;
pub mod request;
pub mod run;
pub mod submission;
pub mod tasks;
pub mod vars;
pub mod views;
pub mod workflow;

pub use plugins::{Plugin, Plugins};
pub use queues::{DEFAULT_QUEUE, DeclaredQueue, QueueKind, declared_queues, worker_queues};
pub use request::{DEPLOY_WORKFLOW_VERSIONS, build_version};
pub use workflow::{DEPLOY_WORKFLOW, DeployRequest, Submitter, register_workflows};
