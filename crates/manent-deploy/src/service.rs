//! The deploy service as the API and the CLI call it, one path for each concern:
//! [`crate::submission`] (parse, check, route, enqueue, resubmit), [`crate::deploy_views`]
//! (status, list, logs, output, activity, history) and [`crate::approvals`].

pub use crate::deploy_views::{
    ApprovalView, DeployLogs, DeployStatus, OutputLine, StepState, StepView, TargetView,
};
pub use crate::request::Phase;
pub use crate::submission::{Submitted, SubmittedStatus};
pub use crate::targets::TargetState;

pub use crate::approvals::{Approver, DecideError, decide};
pub use crate::deploy_views::{ListFilter, activity, history, list, logs, output, status};
pub use crate::history::{LiveVersion, Origin, OriginKind, live_version, previous_success};
pub use crate::submission::{
    MAX_BATCH, ResubmitError, SubmitError, parse, parse_many, recorded_request, resubmit,
    rollback_source, submit, submit_many,
};
