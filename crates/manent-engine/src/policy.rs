//! How a step is retried, and whether its start is recorded.

use std::time::Duration;

/// Retry and recording policy of one step.
#[derive(Debug, Clone, PartialEq)]
pub struct StepPolicy {
    /// Attempts in all (1 = no retry).
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub backoff_factor: f64,
    pub max_backoff: Duration,
    /// Write a RUNNING record before the body runs, so status shows the step
    /// while it runs. Costs one more write; worth it for long steps.
    pub record_start: bool,
}

impl Default for StepPolicy {
    fn default() -> Self {
        StepPolicy {
            max_attempts: 1,
            initial_backoff: Duration::from_millis(200),
            backoff_factor: 2.0,
            max_backoff: Duration::from_secs(30),
            record_start: false,
        }
    }
}

impl StepPolicy {
    /// `attempts` tries with exponential backoff from `initial`.
    pub fn retry(attempts: u32, initial: Duration) -> Self {
        StepPolicy {
            max_attempts: attempts.max(1),
            initial_backoff: initial,
            ..Self::default()
        }
    }

    pub fn recording_start(mut self) -> Self {
        self.record_start = true;
        self
    }

    /// The wait after failed attempt number `attempt` (1-based).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = self
            .backoff_factor
            .max(1.0)
            .powi(attempt.saturating_sub(1).min(30) as i32);
        self.initial_backoff.mul_f64(factor).min(self.max_backoff)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_then_caps() {
        let p = StepPolicy {
            max_backoff: Duration::from_secs(1),
            ..StepPolicy::retry(10, Duration::from_millis(100))
        };
        let waits: Vec<_> = (1..=6).map(|a| p.backoff(a).as_millis()).collect();
        assert_eq!(
            waits,
            [100, 200, 400, 800, 1000, 1000],
            "doubling from the initial wait, capped at max_backoff"
        );
    }
}
