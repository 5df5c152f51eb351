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
    ApprovalView, Artifact, BatchEntry, Decision, DecisionBody, Dependency, DeployAction,
    DeployLogs, DeployOutput, DeployOverrides, DeployStatus, Descriptor, Missed, OutputLine,
    OutputStream, PassMode, PassView, Phase, Recovered, RedeployBody, RedeployKind, Resubmitted,
    RollbackBody, Schedule, StepStatus, StepView, SubmitBatch, Submitted, SubmittedStatus,
    TargetState, TargetView, WaveView, WorkflowStatus,
};
pub use drift::{
    ChangeKind, ChangeView, DifferenceView, DriftState, DriftView, PlanView, TargetDriftView,
    TargetPlanView,
};
pub use error::{ErrorBody, ErrorCode, ErrorDetail};
pub use fleet::{
    ApplicationView, LimitUse, LiveVersion, QueueKind, QueueView, TenantView, VariableView,
    WorkerState, WorkerView,
};
pub use schedules::{MissedPolicy, RefusedTick, ScheduleDeleted, ScheduleView};

/// A string enum of the contract: known values as variants, anything else kept as
/// `Other(text)` (see the crate's documentation). `listed` says whether the schema lists
/// the known values (`enum`); an open set (a workflow's own phases) is a plain string.
macro_rules! string_enum {
    (
        $(#[$meta:meta])*
        $name:ident, listed: $listed:literal, $description:literal {
            $($(#[$vmeta:meta])* $variant:ident = $text:literal),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
            /// A value this build does not know, kept as it was written.
            Other(String),
        }

        impl $name {
            /// Every value this build knows.
            pub const KNOWN: &'static [&'static str] = &[$($text),+];

            pub fn as_str(&self) -> &str {
                match self {
                    $($name::$variant => $text,)+
                    $name::Other(text) => text,
                }
            }
        }

        impl From<&str> for $name {
            fn from(text: &str) -> Self {
                match text {
                    $($text => $name::$variant,)+
                    other => $name::Other(other.to_string()),
                }
            }
        }

        impl From<String> for $name {
            fn from(text: String) -> Self {
                match $name::from(text.as_str()) {
                    $name::Other(_) => $name::Other(text),
                    known => known,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.as_str() == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                String::deserialize(deserializer).map($name::from)
            }
        }

        #[cfg(feature = "openapi")]
        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                let schema = utoipa::openapi::schema::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::String)
                    .description(Some($description));
                if $listed {
                    schema.enum_values(Some(Self::KNOWN.iter().copied())).into()
                } else {
                    schema.into()
                }
            }
        }

        #[cfg(feature = "openapi")]
        impl utoipa::ToSchema for $name {}
    };
}
pub(crate) use string_enum;

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
        assert!(Phase::Other("wave 1/2 (web)".into()) == "wave 1/2 (web)");
    }
}
