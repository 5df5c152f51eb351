//! The dead-man's switch on what a worker starts (docs/scaling-and-recovery.md, "A frozen
//! worker's commands"): a command, local or on a target, and a plugin process live only
//! while the worker that started them keeps proving it may still act on the step.
//!
//! A process is started under a small POSIX-shell guardian that reads *pulses* (one byte
//! each) from the worker. The worker sends them only while its executor lease lets it act
//! for longer than the guardian's timeout; when they stop (the worker is frozen, its lease
//! ran out, or it died) the guardian kills the process group it leads, the command and all
//! it started, before `recovery.stale_after` lets another worker run the step again. A
//! killed worker's process is also caught at once: the pulses' pipe or channel closes.
//!
//! The switch rides with the future that runs a workflow (a task-local set by
//! [`guarded`]): the transports and the plugin host ask [`current`] when they start a
//! process, so no signature between the workflow and the process names it.

use std::{sync::Arc, time::Duration};

/// How long, from now, the worker may still act on its steps: its executor lease's
/// remaining window (zero once fenced or lost).
pub type MayActFor = Arc<dyn Fn() -> Duration + Send + Sync>;

/// One pulse: any byte that is not a newline (a shell's command substitution would drop
/// a newline, and the guardian would take the pulse for silence).
pub const PULSE: &[u8] = b".";

/// Fewest seconds a guardian waits for a pulse: `timeout(1)` counts whole seconds on
/// every implementation (busybox included).
const MIN_TIMEOUT_SECS: u64 = 1;

/// The switch a process runs under: how long it outlives the last pulse, and the worker's
/// lease, which says whether a pulse may be sent.
#[derive(Clone)]
pub struct DeadMansSwitch {
    timeout_secs: u64,
    may_act_for: MayActFor,
}

impl std::fmt::Debug for DeadMansSwitch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadMansSwitch")
            .field("timeout_secs", &self.timeout_secs)
            .finish_non_exhaustive()
    }
}

impl DeadMansSwitch {
    /// A process outlives its last pulse by `timeout`, floored to whole seconds;
    /// `may_act_for` is asked before each pulse. `None` under one second, which no
    /// guardian can count: such a worker's processes end only when their connection
    /// closes or the worker fences itself.
    pub fn new(timeout: Duration, may_act_for: MayActFor) -> Option<Self> {
        let timeout_secs = timeout.as_secs();
        (timeout_secs >= MIN_TIMEOUT_SECS).then_some(DeadMansSwitch {
            timeout_secs,
            may_act_for,
        })
    }

    /// How long a process outlives the last pulse.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_secs)
    }

    /// The guardian's argument: the timeout in whole seconds.
    pub fn timeout_arg(&self) -> String {
        self.timeout_secs.to_string()
    }

    /// Whether a pulse may be sent now. A pulse lets the process live `timeout` more, so
    /// one is sent only while the worker may act for longer than that: a process never
    /// outlives the window in which nobody else may run its step.
    pub fn may_pulse(&self) -> bool {
        (self.may_act_for)() > self.timeout()
    }

    /// How often pulses go out: four per timeout, so one late pulse costs nothing.
    pub fn pulse_every(&self) -> Duration {
        self.timeout() / 4
    }

    /// A ticker at [`DeadMansSwitch::pulse_every`] that skips the ticks a busy or frozen
    /// worker missed (a burst of pulses after a freeze would prove nothing).
    pub fn ticker(&self) -> tokio::time::Interval {
        let mut ticker = tokio::time::interval(self.pulse_every());
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        ticker
    }
}

tokio::task_local! {
    static SWITCH: DeadMansSwitch;
}

/// Runs `future` (a workflow's run) with `switch`: every command and plugin process it
/// starts runs under it. Without one, `future` runs as it is.
pub async fn guarded<F: std::future::Future>(
    switch: Option<DeadMansSwitch>,
    future: F,
) -> F::Output {
    match switch {
        Some(switch) => SWITCH.scope(switch, future).await,
        None => future.await,
    }
}

/// The switch of the workflow run this is called from, if any.
pub fn current() -> Option<DeadMansSwitch> {
    SWITCH.try_with(Clone::clone).ok()
}

/// The watcher's shell text: with `$t` set (the timeout in seconds), it reads pulses from
/// fd 3 and returns once none came for `$t` seconds or fd 3 closed; with `$t` empty, once
/// fd 3 closed. What follows it kills the process group. `timeout(1)` and `dd(1)` are
/// needed for the first; [`NO_TIMEOUT_WARNING`] is printed where they are missing.
pub const WATCH_PULSES: &str = "if [ -n \"$t\" ]; then
while [ -n \"$(timeout \"$t\" dd bs=4096 count=1 <&3 2>/dev/null)\" ]; do :; done
else
while read -r _ <&3; do :; done
fi";

/// Clears `$t` (with a line on stderr) where the watcher's tools are missing.
pub const CHECK_TOOLS: &str = "if [ -n \"$t\" ] && ! { command -v timeout && command -v dd; } >/dev/null 2>&1; then
echo \"manent: timeout(1) or dd(1) is missing here: this process stops when its worker's connection closes, not when the worker stops answering\" >&2
t=
fi";

/// The watcher beside a plugin process (arguments: the timeout in seconds, the process's
/// pid, and `group` or `process`): it reads pulses on its stdin and, once none came for
/// the timeout, stops the process: `group` sends SIGTERM to the process group the pid
/// leads (a plugin served by `manent_plugin::serve` then kills every process it started,
/// its forks in sessions of their own included), then SIGKILL a second later; `process`
/// sends SIGKILL to the pid alone (bwrap, whose sandbox dies with it). Its stdin closing
/// is not silence: the worker died (the process dies of that on its own) or stopped the
/// process itself. The pid cannot be reused meanwhile: the worker is the process's parent
/// and, frozen, reaps nothing. Where `timeout(1)` or `dd(1)` is missing, it watches
/// nothing.
pub const PLUGIN_WATCHER: &str = "t=$1; pid=$2; how=$3
{ command -v timeout && command -v dd; } >/dev/null 2>&1 || exit 0
while :; do
p=$(timeout \"$t\" dd bs=4096 count=1 2>/dev/null); rc=$?
[ -n \"$p\" ] && continue
[ \"$rc\" -eq 124 ] || exit 0
if [ \"$how\" = group ]; then
kill -s TERM -- \"-$pid\"; sleep 1; kill -s KILL -- \"-$pid\"
else
kill -s KILL \"$pid\"
fi
exit 0
done";

#[cfg(test)]
mod tests {
    use super::*;

    fn acting_for(d: Duration) -> MayActFor {
        Arc::new(move || d)
    }

    #[test]
    fn a_pulse_goes_out_only_while_the_worker_may_act_for_longer_than_the_timeout() {
        let check = |may_act_for: Duration, want: bool| {
            let switch =
                DeadMansSwitch::new(Duration::from_secs(2), acting_for(may_act_for)).unwrap();
            assert_eq!(
                switch.may_pulse(),
                want,
                "may act for {may_act_for:?}, timeout 2 s"
            );
        };
        check(Duration::from_secs(60), true);
        check(Duration::from_millis(2001), true);
        check(Duration::from_secs(2), false);
        check(Duration::ZERO, false);
    }

    #[test]
    fn the_timeout_is_whole_seconds_and_there_is_no_switch_under_one() {
        let timeout = |d: Duration| {
            DeadMansSwitch::new(d, acting_for(Duration::MAX)).map(|s| s.timeout_arg())
        };
        assert_eq!(
            timeout(Duration::from_millis(1125)).as_deref(),
            Some("1"),
            "floored"
        );
        assert_eq!(
            timeout(Duration::from_secs(11)).as_deref(),
            Some("11"),
            "a timeout in whole seconds"
        );
        assert_eq!(
            timeout(Duration::from_millis(999)),
            None,
            "a guardian counts whole seconds: no switch rather than one that kills every command"
        );
    }

    #[tokio::test]
    async fn the_switch_is_current_inside_guarded_and_nowhere_else() {
        assert!(current().is_none(), "no switch outside a run");
        let switch = DeadMansSwitch::new(Duration::from_secs(3), acting_for(Duration::MAX));
        let inside = guarded(switch, async { current().map(|s| s.timeout_arg()) }).await;
        assert_eq!(
            inside.as_deref(),
            Some("3"),
            "the run's switch is seen inside it"
        );
    }
}
