//! manent's API contract: every `/api/v1` request and response body, the JSON error
//! body, and the enums of their statuses, phases, kinds and states (docs/api.md).
//!
//! The server builds these types and the CLI reads them, so a field renamed on one side
//! no longer compiles on the other. Field names and JSON shapes are a stable interface
//! (PRODUCT.md §11): add, never rename. With the `openapi` feature every type is also a
//! `utoipa::ToSchema`, from which the server generates its OpenAPI document.
//!
//! An enum read from JSON never fails on a value this build does not know (a row written
//! by another version of manent): it keeps it as `Other(text)`, which is printed as it
//! was written.

mod admin;
mod deploys;
mod drift;
mod error;
mod fleet;
mod schedules;

pub use admin::{
    AuditEntry, AuditQuery, CreateTokenBody, CreatedToken, Role, TokenRevoked, TokenView, WhoAmI,
};
#[cfg(feature = "openapi")]
pub use deploys::StatusFilter;
pub use deploys::{
    ApprovalView, Artifact, BatchEntry, ContainerProxyView, ContainerView, Decision, DecisionBody,
    Dependency, DeployAction, DeployLogs, DeployOutput, DeployOverrides, DeployStatus, Descriptor,
    InterruptionView, Measurement, MeasurementOutcome, Missed, OutputLine, OutputStream, PassMode,
    PassView, Phase, PlannedBakeView, PlannedMetricView, PlannedQueryView, Recovered, RedeployBody,
    RedeployKind, Resubmitted, RollbackBody, Schedule, StepStatus, StepView, SubmitBatch,
    Submitted, SubmittedStatus, TargetState, TargetView, WaveView, WorkflowStatus,
};
pub use drift::{
    ApprovalPlanView, ApprovalTargetView, ChangeKind, ChangeView, DifferenceView, DriftState,
    DriftView, PlanView, TargetDriftView, TargetPlanView,
};
pub use error::{ErrorBody, ErrorCode, ErrorDetail};
pub use fleet::{
    ApplicationView, DriftCheckView, LimitUse, LiveVersion, QueueKind, QueueView, TenantView,
    VariableView, WorkerState, WorkerView,
};
pub use schedules::{MissedPolicy, RefusedTick, ScheduleDeleted, ScheduleView};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_known_value_round_trips_and_an_unknown_one_is_kept_as_written() {
        let known: TargetState = serde_json::from_str("\"rolled_back\"").expect("a string");
        assert_eq!(
            known,
            TargetState::RolledBack,
            "a known value is its variant"
        );
        assert_eq!(
            serde_json::to_string(&known).expect("serialises"),
            "\"rolled_back\"",
            "and is written back as it was read"
        );
        let unknown: TargetState = serde_json::from_str("\"teleported\"").expect("a string");
        assert_eq!(
            unknown,
            TargetState::Other("teleported".into()),
            "an unknown value is kept, not refused or replaced"
        );
        assert_eq!(unknown.to_string(), "teleported", "and printed as written");
    }

    #[test]
    fn a_value_compares_with_its_text() {
        assert!(
            WorkflowStatus::Success == "SUCCESS",
            "tests and renderers compare with the documented text"
        );
        assert!(
            Phase::Other("wave 1/2 (web)".into()) == "wave 1/2 (web)",
            "an unknown phase compares equal to its text"
        );
    }
}
