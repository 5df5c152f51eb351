//! The one place where the domain meets the wire: manent-deploy's views, the engine's and
//! the model's enums and the API's own roles turned into `manent-contract`'s types, field by
//! field and with exhaustive matches (ARCHITECTURE.md: manent-deploy knows nothing of the
//! wire). A variant added on either side fails to compile here instead of being joined by
//! its text.

use manent_contract as contract;
use manent_deploy::{
    analysis, background::schedules::ScheduleView, history, request::Phase, run::targets,
    submission, views::deploy_views, views::platform, views::timeline,
};
use manent_engine::WorkflowStatus;
use manent_model::{Artifact, Missed, QueueKind};

use crate::auth::Role;

/// A domain value as the contract writes it.
pub trait ToWire {
    type Wire;
    fn to_wire(self) -> Self::Wire;
}

impl<T: ToWire> ToWire for Vec<T> {
    type Wire = Vec<T::Wire>;
    fn to_wire(self) -> Self::Wire {
        self.into_iter().map(ToWire::to_wire).collect()
    }
}

impl<T: ToWire> ToWire for Option<T> {
    type Wire = Option<T::Wire>;
    fn to_wire(self) -> Self::Wire {
        self.map(ToWire::to_wire)
    }
}

impl From<Role> for contract::Role {
    fn from(role: Role) -> Self {
        match role {
            Role::Viewer => contract::Role::Viewer,
            Role::Deployer => contract::Role::Deployer,
            Role::Approver => contract::Role::Approver,
            Role::Admin => contract::Role::Admin,
        }
    }
}

/// The role a request body names; a value this build does not know is refused, naming it.
pub fn role(role: &contract::Role) -> Result<Role, String> {
    match role {
        contract::Role::Viewer => Ok(Role::Viewer),
        contract::Role::Deployer => Ok(Role::Deployer),
        contract::Role::Approver => Ok(Role::Approver),
        contract::Role::Admin => Ok(Role::Admin),
        contract::Role::Other(text) => text.parse(),
    }
}

impl ToWire for manent_deploy::vars::listing::VariableRow {
    type Wire = manent_contract::VariableView;
    fn to_wire(self) -> Self::Wire {
        manent_contract::VariableView {
            target: self.target,
            name: self.name,
            value: self.value,
            source: self.source,
        }
    }
}

impl ToWire for WorkflowStatus {
    type Wire = contract::WorkflowStatus;
    fn to_wire(self) -> Self::Wire {
        match self {
            WorkflowStatus::Enqueued => contract::WorkflowStatus::Enqueued,
            WorkflowStatus::Pending => contract::WorkflowStatus::Pending,
            WorkflowStatus::Success => contract::WorkflowStatus::Success,
            WorkflowStatus::Error => contract::WorkflowStatus::Error,
            WorkflowStatus::Cancelled => contract::WorkflowStatus::Cancelled,
        }
    }
}

impl ToWire for submission::SubmittedStatus {
    type Wire = contract::SubmittedStatus;
    fn to_wire(self) -> Self::Wire {
        match self {
            submission::SubmittedStatus::Deploy(status) => status.to_wire().into(),
            submission::SubmittedStatus::Scheduled => contract::SubmittedStatus::Scheduled,
        }
    }
}

impl ToWire for submission::Submitted {
    type Wire = contract::Submitted;
    fn to_wire(self) -> Self::Wire {
        contract::Submitted {
            id: self.id,
            status: self.status.to_wire(),
            queue: self.queue,
        }
    }
}

impl ToWire for Phase {
    type Wire = contract::Phase;
    fn to_wire(self) -> Self::Wire {
        match self {
            Phase::Scheduled => contract::Phase::Scheduled,
            Phase::Queued => contract::Phase::Queued,
            Phase::WaitingApproval => contract::Phase::WaitingApproval,
            Phase::WaitingDependency => contract::Phase::WaitingDependency,
            Phase::WaitingDecision => contract::Phase::WaitingDecision,
            Phase::Running => contract::Phase::Running,
            Phase::Done => contract::Phase::Done,
            Phase::Refused => contract::Phase::Refused,
            // The workflow's own phases: an open set on the wire, written as their text.
            Phase::Fetching
            | Phase::Wave { .. }
            | Phase::PauseBeforeWave(_)
            | Phase::BakeAfterWave(_)
            | Phase::RollingBack
            | Phase::Other(_) => contract::Phase::Other(self.text().into_owned()),
        }
    }
}

impl ToWire for QueueKind {
    type Wire = contract::QueueKind;
    fn to_wire(self) -> Self::Wire {
        match self {
            QueueKind::Default => contract::QueueKind::Default,
            QueueKind::Tenant => contract::QueueKind::Tenant,
            QueueKind::Region => contract::QueueKind::Region,
            QueueKind::Plugin => contract::QueueKind::Plugin,
            QueueKind::Routed => contract::QueueKind::Routed,
        }
    }
}

impl ToWire for platform::ShownKind {
    type Wire = contract::QueueKind;
    fn to_wire(self) -> Self::Wire {
        match self {
            platform::ShownKind::Known(kind) => kind.to_wire(),
            platform::ShownKind::Other(text) => contract::QueueKind::Other(text),
        }
    }
}

impl ToWire for targets::TargetState {
    type Wire = contract::TargetState;
    fn to_wire(self) -> Self::Wire {
        use targets::TargetState;
        match self {
            TargetState::Pending => contract::TargetState::Pending,
            TargetState::Deploying => contract::TargetState::Deploying,
            TargetState::Deployed => contract::TargetState::Deployed,
            TargetState::Failed => contract::TargetState::Failed,
            TargetState::RolledBack => contract::TargetState::RolledBack,
            TargetState::Planned => contract::TargetState::Planned,
            TargetState::Cancelled => contract::TargetState::Cancelled,
            TargetState::Other(text) => contract::TargetState::Other(text),
        }
    }
}

impl ToWire for deploy_views::StepState {
    type Wire = contract::StepStatus;
    fn to_wire(self) -> Self::Wire {
        use deploy_views::StepState;
        match self {
            StepState::Running => contract::StepStatus::Running,
            StepState::Interrupted => contract::StepStatus::Interrupted,
            StepState::Success => contract::StepStatus::Success,
            StepState::Error => contract::StepStatus::Error,
            StepState::Stopped => contract::StepStatus::Stopped,
        }
    }
}

impl ToWire for history::OriginKind {
    type Wire = contract::RedeployKind;
    fn to_wire(self) -> Self::Wire {
        match self {
            history::OriginKind::Rollback => contract::RedeployKind::Rollback,
            history::OriginKind::Redeploy => contract::RedeployKind::Redeploy,
        }
    }
}

impl ToWire for timeline::PassAction {
    type Wire = contract::PassMode;
    fn to_wire(self) -> Self::Wire {
        match self {
            timeline::PassAction::Deploy => contract::PassMode::Deploy,
            timeline::PassAction::Rollback => contract::PassMode::Rollback,
        }
    }
}

impl ToWire for platform::WorkerState {
    type Wire = contract::WorkerState;
    fn to_wire(self) -> Self::Wire {
        match self {
            platform::WorkerState::Running => contract::WorkerState::Running,
            platform::WorkerState::Draining => contract::WorkerState::Draining,
            platform::WorkerState::Stopped => contract::WorkerState::Stopped,
            platform::WorkerState::Suspect => contract::WorkerState::Suspect,
            platform::WorkerState::Dead => contract::WorkerState::Dead,
        }
    }
}

/// A schedule's `missed` policy; `None` for a schedule that cannot be read.
fn missed_policy(missed: Option<Missed>) -> contract::MissedPolicy {
    match missed {
        Some(Missed::RunOnce) => contract::MissedPolicy::RunOnce,
        Some(Missed::Skip) => contract::MissedPolicy::Skip,
        None => contract::MissedPolicy::Unreadable,
    }
}

impl ToWire for Artifact {
    type Wire = contract::Artifact;
    fn to_wire(self) -> Self::Wire {
        contract::Artifact {
            name: self.name,
            artifact_type: self.artifact_type,
            version: self.version,
            url: self.url,
            sha256: self.sha256,
            reference: self.reference,
        }
    }
}

impl ToWire for deploy_views::TargetView {
    type Wire = contract::TargetView;
    fn to_wire(self) -> Self::Wire {
        contract::TargetView {
            name: self.name,
            status: self.status.to_wire(),
            detail: self.detail,
            roles: self.roles,
            container: self.container.map(|c| contract::ContainerView {
                name: c.name,
                image: c.image,
                image_digest: c.image_digest,
                address: c.address,
                proxy: contract::ContainerProxyView {
                    listen: c.proxy.listen,
                    server: c.proxy.server,
                    upstream: c.proxy.upstream,
                },
            }),
        }
    }
}

impl ToWire for deploy_views::StepView {
    type Wire = contract::StepView;
    fn to_wire(self) -> Self::Wire {
        contract::StepView {
            name: self.name,
            status: self.status.to_wire(),
            attempts: self.attempts,
            started_at: self.started_at,
            finished_at: self.finished_at,
            executor_id: self.executor_id,
            error: self.error,
        }
    }
}

impl ToWire for deploy_views::ApprovalView {
    type Wire = contract::ApprovalView;
    fn to_wire(self) -> Self::Wire {
        contract::ApprovalView {
            by: self.by,
            decision: if self.approve {
                contract::Decision::Approved
            } else {
                contract::Decision::Rejected
            },
            reason: self.reason,
            at: self.at,
        }
    }
}

impl ToWire for timeline::WaveView {
    type Wire = contract::WaveView;
    fn to_wire(self) -> Self::Wire {
        contract::WaveView {
            name: self.name,
            targets: self.targets,
        }
    }
}

impl ToWire for timeline::PassView {
    type Wire = contract::PassView;
    fn to_wire(self) -> Self::Wire {
        contract::PassView {
            id: self.id,
            region: self.region,
            mode: self.action.to_wire(),
            status: self.status.to_wire(),
            executor_id: self.executor_id,
            targets: self.targets,
            started_at: self.started_at,
            finished_at: self.finished_at,
        }
    }
}

/// Without `actions`: what the asking token may do is the API's to say (`fill_actions`);
/// `waiting_for` as said to every reader (`routes::deploys::for_caller` says the
/// recoverers' to an admin).
impl ToWire for deploy_views::DeployStatus {
    type Wire = contract::DeployStatus;
    fn to_wire(self) -> Self::Wire {
        contract::DeployStatus {
            id: self.id,
            application: self.application,
            environment: self.environment,
            version: self.version,
            status: self.status.to_wire(),
            phase: self.phase.to_wire(),
            queue: self.queue,
            route_kind: self.route_kind.to_wire(),
            executor_id: self.executor_id,
            dry_run: self.dry_run,
            targets: self.targets.to_wire(),
            steps: self.steps.to_wire(),
            error: self.error,
            submitted_by: self.submitted_by,
            created_at: self.created_at,
            updated_at: self.updated_at,
            waiting_for: self.waiting_for,
            approvals: self.approvals.to_wire(),
            artifacts: self.artifacts.to_wire(),
            overrides: self.overrides,
            effective: self.effective,
            deployed_now: self.deployed_now,
            plan: self.plan.map(crate::routes::plans::approval_plan),
            actions: Vec::new(),
            started_at: self.started_at,
            finished_at: self.finished_at,
            duration_ms: self.duration_ms,
            redeploy_of: self.redeploy_of,
            redeploy_kind: self.redeploy_kind.to_wire(),
            irreversible: self.irreversible,
            waves: self.waves.to_wire(),
            passes: self.passes.to_wire(),
            interruptions: self.interruptions.to_wire(),
            measurements: self.measurements.to_wire(),
        }
    }
}

impl ToWire for timeline::InterruptionView {
    type Wire = contract::InterruptionView;
    fn to_wire(self) -> Self::Wire {
        use manent_deploy::request::rfc3339;
        contract::InterruptionView {
            interrupted_at: self.interrupted_at.map(rfc3339),
            interruption: self.interruption,
            recovered_at: rfc3339(self.recovered_at),
            recovery: self.recovery,
            resumed_by: self.resumed_by,
            resumed_at: self.resumed_at.map(rfc3339),
        }
    }
}

impl ToWire for analysis::Measurement {
    type Wire = contract::Measurement;
    fn to_wire(self) -> Self::Wire {
        contract::Measurement {
            wave: u32::try_from(self.wave).unwrap_or(u32::MAX),
            metric: self.metric,
            target: self.target,
            at: manent_deploy::request::rfc3339(self.at_ms),
            value: self.value,
            baseline: self.baseline,
            outcome: self.outcome.to_wire(),
            detail: self.detail,
            threshold: self.threshold,
        }
    }
}

impl ToWire for analysis::Outcome {
    type Wire = contract::MeasurementOutcome;
    fn to_wire(self) -> Self::Wire {
        match self {
            analysis::Outcome::Passed => contract::MeasurementOutcome::Passed,
            analysis::Outcome::Failed => contract::MeasurementOutcome::Failed,
            analysis::Outcome::Inconclusive => contract::MeasurementOutcome::Inconclusive,
        }
    }
}

impl ToWire for deploy_views::DeployLogs {
    type Wire = contract::DeployLogs;
    fn to_wire(self) -> Self::Wire {
        contract::DeployLogs {
            id: self.id,
            lines: self.lines,
            output_seq: self.output_seq,
        }
    }
}

impl ToWire for deploy_views::OutputLine {
    type Wire = contract::OutputLine;
    fn to_wire(self) -> Self::Wire {
        contract::OutputLine {
            seq: self.seq,
            at: self.at,
            attempt: self.attempt,
            source: self.source,
            // The engine stores the stream as text; the contract keeps one it does not know.
            stream: contract::OutputStream::from(self.stream),
            line: self.line,
        }
    }
}

impl ToWire for platform::WorkerView {
    type Wire = contract::WorkerView;
    fn to_wire(self) -> Self::Wire {
        contract::WorkerView {
            executor_id: self.executor_id,
            host: self.host,
            region: self.region,
            state: self.state.to_wire(),
            heartbeat_at: self.heartbeat_at,
            running: self.running,
            pid: self.pid,
            started_at: self.started_at,
            queues: self.queues,
            heartbeat_age_secs: self.heartbeat_age_secs,
            stale: self.stale,
            version: self.version,
        }
    }
}

impl ToWire for platform::LimitUse {
    type Wire = contract::LimitUse;
    fn to_wire(self) -> Self::Wire {
        contract::LimitUse {
            key: self.key,
            counts: self.counts,
            limit: self.limit,
            in_use: self.in_use,
            by: self.by,
        }
    }
}

impl ToWire for platform::QueueView {
    type Wire = contract::QueueView;
    fn to_wire(self) -> Self::Wire {
        contract::QueueView {
            name: self.name,
            kind: self.kind.to_wire(),
            concurrency: self.concurrency,
            environment_concurrency: self.environment_concurrency,
            global_concurrency: self.global_concurrency,
            enqueued: self.enqueued,
            running: self.running,
            workers: self.workers,
            queue_concurrency: self.queue_concurrency,
            limits: self.limits.to_wire(),
        }
    }
}

impl ToWire for platform::TenantView {
    type Wire = contract::TenantView;
    fn to_wire(self) -> Self::Wire {
        contract::TenantView {
            name: self.name,
            queue: self.queue,
            declared: self.declared,
            applications: self.applications,
        }
    }
}

impl ToWire for history::LiveVersion {
    type Wire = contract::LiveVersion;
    fn to_wire(self) -> Self::Wire {
        contract::LiveVersion {
            version: self.version,
            deploy_id: self.deploy_id,
            finished_at: self.finished_at,
            submitted_by: Some(self.submitted_by),
            container: self.container,
        }
    }
}

impl ToWire for platform::ApplicationView {
    type Wire = contract::ApplicationView;
    fn to_wire(self) -> Self::Wire {
        contract::ApplicationView {
            application: self.application,
            tenant: self.tenant,
            environments: self.environments,
            live: self
                .live
                .into_iter()
                .map(|(environment, live)| (environment, live.to_wire()))
                .collect(),
            // The route fills it for the asking token.
            can_deploy: false,
            // The route fills it from the drift records.
            drift: Default::default(),
            drift_checks: Default::default(),
        }
    }
}

impl ToWire for ScheduleView {
    type Wire = contract::ScheduleView;
    fn to_wire(self) -> Self::Wire {
        contract::ScheduleView {
            id: self.id,
            application: self.application,
            environment: self.environment,
            version: self.version,
            cron: self.cron,
            timezone: self.timezone,
            missed: missed_policy(self.missed),
            paused: self.paused,
            queue: self.queue,
            next_tick: self.next_tick,
            last_tick: self.last_tick,
            last_deploy: self.last_deploy,
            created_by: self.created_by,
            created_at: self.created_at,
            error: self.error,
            refused_ticks: self
                .refused_ticks
                .into_iter()
                .map(|refused| contract::RefusedTick {
                    tick: refused.tick,
                    reason: refused.reason,
                })
                .collect(),
        }
    }
}
