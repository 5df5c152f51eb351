//! manent's deploys on the durable engine: which queues a worker serves,
//! how a deploy is submitted and routed, the deploy workflow itself, and the
//! views (JSON shapes of docs/cli.md) that the API and the CLI show.

pub mod approvals;
pub mod artifacts;
pub mod authority;
pub mod deploy_views;
pub mod gate;
pub mod history;
pub mod masking;
pub mod metrics;
pub mod notifications;
pub mod plugins;
pub mod printed;
pub mod queues;
pub mod release_scripts;
pub mod request;
pub mod retention;
pub mod schedules;
pub mod secrets;
pub mod submission;
pub mod targets;
pub mod timeline;
pub mod views;
pub mod workdirs;
pub mod workflow;

pub use plugins::{Plugin, Plugins};
pub use queues::{DEFAULT_QUEUE, DeclaredQueue, QueueKind, declared_queues, worker_queues};
pub use request::{DEPLOY_WORKFLOW_VERSIONS, build_version};
pub use workflow::{DEPLOY_WORKFLOW, DeployRequest, Submitter, register_workflows};
