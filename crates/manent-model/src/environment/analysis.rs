//! Owns `rollout.analysis` (docs/analysis.md): the bake after each wave but the last, its
//! metrics (one provider each: `prometheus`, `http` or `command`), their `success`
//! conditions (expressions over `result` and `baseline`, parsed with evalexpr when the
//! environment file is read), the placeholders of queries, URLs and commands, and their
//! validation.

use std::time::Duration;

use evalexpr::{ContextWithMutableVariables, DefaultNumericTypes, HashMapContext, Value};
use serde::{Deserialize, Serialize};

use super::EnvironmentFile;
use crate::serde_util::{duration, opt_duration};
use crate::source::Document;

/// How many measurements of a metric that could not be taken are tolerated when
/// `inconclusive_limit` is not written.
pub const DEFAULT_INCONCLUSIVE_LIMIT: u32 = 2;

/// The placeholders a query, URL or command may name.
pub const ANALYSIS_PLACEHOLDERS: &[&str] = &[
    "{targets}",
    "{baseline}",
    "{target}",
    "{host}",
    "{version}",
    "{application}",
    "{environment}",
];

/// `rollout.analysis`: after each wave but the last, once its checks pass, every metric is
/// measured every `interval` for `bake`; the next wave starts only when they pass.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Analysis {
    /// How long the wave is watched.
    #[serde(with = "duration")]
    pub bake: Duration,
    /// The time between two measurements (the first is taken one interval in).
    #[serde(with = "duration")]
    pub interval: Duration,
    /// How long a deploy waits in `waiting_decision` for `manent promote` or `manent
    /// abort`; past it, the deploy fails (and is rolled back as `rollback.on_failure`
    /// says). Without it, it waits until someone decides.
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub timeout: Option<Duration>,
    /// What is measured; at least one.
    pub metrics: Vec<Metric>,
}

impl Analysis {
    /// How many measurements of each metric a full bake takes: `bake / interval`, at least 1.
    pub fn rounds(&self) -> u32 {
        let interval = self.interval.as_millis().max(1);
        u32::try_from(self.bake.as_millis() / interval)
            .unwrap_or(u32::MAX)
            .max(1)
    }
}

/// One metric of `rollout.analysis.metrics`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metric {
    /// Unique among the metrics; shown in `status` and the measurements.
    pub name: String,
    /// An expression over `result` (and `baseline`) that is true when the measurement
    /// passes: `result < 0.05`, `result <= baseline * 1.2 + 0.01`.
    pub success: String,
    /// Failed measurements tolerated; one more fails the deploy.
    #[serde(default)]
    pub failure_limit: u32,
    /// Measurements that could not be taken tolerated; one more makes the deploy wait for
    /// a decision (`waiting_decision`).
    #[serde(default = "default_inconclusive_limit")]
    pub inconclusive_limit: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusQuery>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<MetricCommand>,
}

fn default_inconclusive_limit() -> u32 {
    DEFAULT_INCONCLUSIVE_LIMIT
}

/// `prometheus:`: an instant query against a Prometheus server's HTTP API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrometheusQuery {
    /// The server, `http://prometheus:9090`.
    pub address: String,
    /// PromQL; its answer must be one number (a scalar, or a vector of one series).
    pub query: String,
}

/// `http:`: a GET whose JSON answer holds the number at `value`, a JSON pointer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpValue {
    pub url: String,
    /// A JSON pointer (`/data/error_rate`); empty for the whole answer.
    pub value: String,
}

/// `command:`: a shell command whose stdout is the number.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricCommand {
    pub run: String,
    /// On the worker (the default) or on each target of the wave.
    #[serde(default)]
    pub on: RunOn,
}

/// `command.on`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunOn {
    #[default]
    Worker,
    Target,
}

/// Which provider a metric has, borrowed.
#[derive(Debug, Clone, Copy)]
pub enum Provider<'a> {
    Prometheus(&'a PrometheusQuery),
    Http(&'a HttpValue),
    Command(&'a MetricCommand),
}

impl Metric {
    /// Its provider; `None` when it has none or several (refused at load).
    pub fn provider(&self) -> Option<Provider<'_>> {
        match (&self.prometheus, &self.http, &self.command) {
            (Some(p), None, None) => Some(Provider::Prometheus(p)),
            (None, Some(h), None) => Some(Provider::Http(h)),
            (None, None, Some(c)) => Some(Provider::Command(c)),
            _ => None,
        }
    }

    /// The texts placeholders are replaced in: the query, the URL or the command.
    pub fn templated(&self) -> Vec<&str> {
        let mut texts = Vec::new();
        if let Some(p) = &self.prometheus {
            texts.extend([p.address.as_str(), p.query.as_str()]);
        }
        if let Some(h) = &self.http {
            texts.push(h.url.as_str());
        }
        if let Some(c) = &self.command {
            texts.push(c.run.as_str());
        }
        texts
    }

    /// Whether the metric is measured once per target of the wave (it names `{target}` or
    /// `{host}`, or runs on the targets).
    pub fn per_target(&self) -> bool {
        self.command.as_ref().is_some_and(|c| c.on == RunOn::Target)
            || self
                .templated()
                .iter()
                .any(|t| t.contains("{target}") || t.contains("{host}"))
    }

    /// Whether it has a baseline: its provider names `{targets}`, and the same measurement
    /// over `{baseline}` is `baseline`.
    pub fn has_baseline(&self) -> bool {
        self.templated().iter().any(|t| t.contains("{targets}"))
    }

    /// Whether a measurement `result` (with `baseline`) passes. An error when the condition
    /// does not read, names what it may not, or is not true or false.
    pub fn passes(&self, result: f64, baseline: Option<f64>) -> Result<bool, String> {
        evaluate(&self.success, result, baseline)
    }
}

/// Evaluates `condition` with `result` and, when given, `baseline`.
pub fn evaluate(condition: &str, result: f64, baseline: Option<f64>) -> Result<bool, String> {
    let tree = evalexpr::build_operator_tree::<DefaultNumericTypes>(condition)
        .map_err(|e| format!("`{condition}` is not an expression: {e}"))?;
    let mut context = HashMapContext::<DefaultNumericTypes>::new();
    let mut set = |name: &str, value: f64| {
        context
            .set_value(name.into(), Value::from_float(value))
            .map_err(|e| format!("`{condition}`: {e}"))
    };
    set("result", result)?;
    if let Some(baseline) = baseline {
        set("baseline", baseline)?;
    }
    tree.eval_boolean_with_context(&context)
        .map_err(|e| format!("`{condition}` could not be evaluated: {e}"))
}

/// Checks `rollout.analysis`, pushing each issue to `doc` with its key.
pub(super) fn validate(doc: &mut Document<'_>, env: &EnvironmentFile) {
    let Some(analysis) = &env.rollout.analysis else {
        return;
    };
    let at = "rollout.analysis";
    if analysis.bake.is_zero() {
        doc.issue(
            format!("{at}.bake"),
            "is 0; write how long a wave is watched, e.g. 5m",
        );
    }
    if analysis.interval.is_zero() {
        doc.issue(
            format!("{at}.interval"),
            "is 0; write the time between two measurements, e.g. 30s",
        );
    } else if analysis.interval > analysis.bake {
        doc.issue(
            format!("{at}.interval"),
            "is longer than bake: no measurement would be taken; shorten it or lengthen bake",
        );
    }
    if analysis.timeout.is_some_and(|t| t.is_zero()) {
        doc.issue(
            format!("{at}.timeout"),
            "is 0; write a wait such as 1h, or remove it",
        );
    }
    if analysis.metrics.is_empty() {
        doc.issue(
            format!("{at}.metrics"),
            "is empty; list what is measured (name, success and one of prometheus, http, command)",
        );
    }
    for (i, metric) in analysis.metrics.iter().enumerate() {
        validate_metric(doc, &format!("{at}.metrics[{i}]"), metric);
        if analysis.metrics[..i].iter().any(|m| m.name == metric.name) {
            doc.issue(
                format!("{at}.metrics[{i}].name"),
                format!(
                    "`{}` is the name of an earlier metric; metric names must be unique",
                    metric.name
                ),
            );
        }
    }
}

fn validate_metric(doc: &mut Document<'_>, at: &str, metric: &Metric) {
    if let Err(e) = crate::rules::name(&metric.name) {
        doc.issue(format!("{at}.name"), format!("`{}` {e}", metric.name));
    }
    if metric.provider().is_none() {
        doc.issue(
            at.to_string(),
            format!(
                "metric `{}` needs exactly one provider: prometheus: {{address, query}}, http: \
                 {{url, value}} or command: {{run, on}}",
                metric.name
            ),
        );
    }
    if let Some(message) = condition_problem(&metric.success, metric.has_baseline()) {
        doc.issue(format!("{at}.success"), message);
    }
    if let Some(p) = &metric.prometheus {
        url_issue(doc, &format!("{at}.prometheus.address"), &p.address);
        if p.query.trim().is_empty() {
            doc.issue(
                format!("{at}.prometheus.query"),
                "is empty; write a PromQL query",
            );
        }
    }
    if let Some(h) = &metric.http {
        url_issue(doc, &format!("{at}.http.url"), &h.url);
        if !h.value.is_empty() && !h.value.starts_with('/') {
            doc.issue(
                format!("{at}.http.value"),
                format!(
                    "`{}` is not a JSON pointer; write it from the root, e.g. /data/error_rate",
                    h.value
                ),
            );
        }
    }
    if let Some(c) = &metric.command
        && c.run.trim().is_empty()
    {
        doc.issue(
            format!("{at}.command.run"),
            "is empty; write the command whose stdout is the number",
        );
    }
    for text in metric.templated() {
        if let Some(unknown) = unknown_placeholder(text) {
            doc.issue(
                at.to_string(),
                format!(
                    "`{unknown}` is not a placeholder of analysis; use {}",
                    ANALYSIS_PLACEHOLDERS.join(", ")
                ),
            );
        }
    }
}

fn url_issue(doc: &mut Document<'_>, field: &str, url: &str) {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        doc.issue(
            field.to_string(),
            format!("`{url}` is not an http:// or https:// address"),
        );
    }
}

/// The first `{word}` in `text` that is not one of [`ANALYSIS_PLACEHOLDERS`]. PromQL's
/// own braces (`{job="web"}`) hold `=` or `,` and are no placeholder.
fn unknown_placeholder(text: &str) -> Option<String> {
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        let after = &rest[open..];
        let Some(close) = after.find('}') else { break };
        let candidate = &after[..=close];
        let inner = &candidate[1..candidate.len() - 1];
        let word = !inner.is_empty() && inner.chars().all(|c| c.is_ascii_lowercase() || c == '_');
        if word && !ANALYSIS_PLACEHOLDERS.contains(&candidate) {
            return Some(candidate.to_string());
        }
        rest = &after[1..];
    }
    None
}

/// Why `condition` cannot be a `success` condition, if it cannot: it does not parse, names
/// a variable other than `result` (and `baseline` when the metric has one), or is not true
/// or false for numbers.
pub fn condition_problem(condition: &str, has_baseline: bool) -> Option<String> {
    let tree = match evalexpr::build_operator_tree::<DefaultNumericTypes>(condition) {
        Ok(tree) => tree,
        Err(e) => {
            return Some(format!(
                "`{condition}` is not an expression ({e}); write a condition over result, \
                 e.g. result < 0.05 or result <= baseline * 1.2 + 0.01"
            ));
        }
    };
    for name in tree.iter_variable_identifiers() {
        match name {
            "result" => {}
            "baseline" if has_baseline => {}
            "baseline" => {
                return Some(format!(
                    "`{condition}` names baseline, but the metric's query names no {{targets}}: \
                     baseline is the same query over {{baseline}}; name {{targets}} in it, or \
                     compare result with a number"
                ));
            }
            other => {
                return Some(format!(
                    "`{condition}` names `{other}`; a condition may name result{}",
                    if has_baseline { " and baseline" } else { "" }
                ));
            }
        }
    }
    // A tree that builds may still be no condition (`result <` misses an operand, `result
    // + 1` is a number): evaluated once with sample values to find out.
    let mut context = HashMapContext::<DefaultNumericTypes>::new();
    for name in ["result", "baseline"] {
        let _ = context.set_value(name.into(), Value::from_float(1.0));
    }
    match tree.eval_boolean_with_context(&context) {
        Ok(_) => None,
        Err(e) => Some(format!(
            "`{condition}` is not an expression that is true or false ({e}); write a \
             condition over result, e.g. result < 0.05"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_compare_result_and_baseline() {
        assert_eq!(
            evaluate("result < 0.05", 0.01, None),
            Ok(true),
            "a low rate passes"
        );
        assert_eq!(
            evaluate("result < 0.05", 0.5, None),
            Ok(false),
            "a high one fails"
        );
        assert_eq!(
            evaluate("result <= baseline * 1.2 + 0.01", 0.12, Some(0.1)),
            Ok(true),
            "within 20% of the baseline"
        );
        assert_eq!(
            evaluate("result <= baseline * 1.2 + 0.01", 0.5, Some(0.1)),
            Ok(false),
            "five times the baseline"
        );
        assert_eq!(
            evaluate("result < 1", 0.5, None),
            Ok(true),
            "an integer bound"
        );
        assert!(
            evaluate("result < baseline", 0.5, None).is_err(),
            "no baseline measured: an error, never a pass"
        );
    }

    #[test]
    fn a_condition_that_cannot_be_one_is_refused_with_why() {
        for (condition, has_baseline, said) in [
            ("result <", false, "is not an expression"),
            ("result < 0.05 &&", false, "is not an expression"),
            ("latency < 0.05", false, "names `latency`"),
            ("result < baseline", false, "names baseline"),
            ("result + 1", false, "true or false"),
            ("result < 0.05 ||", false, "is not an expression"),
        ] {
            let problem = condition_problem(condition, has_baseline);
            assert!(
                problem.as_deref().is_some_and(|p| p.contains(said)),
                "`{condition}` is refused saying {said}: {problem:?}"
            );
        }
        for fine in ["result < 0.05", "result >= 0.99 && result <= 1"] {
            assert_eq!(
                condition_problem(fine, false),
                None,
                "`{fine}` is a condition"
            );
        }
        assert_eq!(
            condition_problem("result <= baseline * 1.2 + 0.01", true),
            None,
            "baseline where the query names {{targets}}"
        );
    }

    /// The problems of `rollout.analysis` `text` as the file's reader reports them.
    fn refused(analysis: &str) -> String {
        let text = format!(
            "targets: [{{name: a, host: local}}, {{name: b, host: local}}]\nrollout:\n  waves: \
             [[a], [b]]\n  analysis:\n{analysis}"
        );
        match crate::parse_environment(&text, "prod.yml", "ml/web", "prod") {
            Ok(env) => format!("accepted: {:?}", env.rollout.analysis),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_condition_that_does_not_parse_is_refused_naming_file_line_and_key() {
        let said = refused(
            "    bake: 1m\n    interval: 10s\n    metrics:\n      - name: errors\n        \
             success: \"result <\"\n        prometheus: {address: \"http://p:9090\", query: \
             up}\n",
        );
        assert!(
            said.contains("prod.yml:9")
                && said.contains("rollout.analysis.metrics[0].success")
                && said.contains("is not an expression"),
            "the file, the line of `success`, its key and why: {said}"
        );
    }

    #[test]
    fn an_analysis_is_read_with_its_defaults_and_checked_whole() {
        let env = crate::parse_environment(
            "targets: [{name: a, host: local}]\nrollout:\n  analysis:\n    bake: 1m\n    \
             interval: 10s\n    metrics:\n      - {name: errors, success: \"result < 0.05\", \
             http: {url: \"http://m/{target}\", value: /rate}}\n",
            "prod.yml",
            "ml/web",
            "prod",
        )
        .expect("a valid analysis");
        let analysis = env.rollout.analysis.expect("read");
        assert_eq!(
            analysis.rounds(),
            6,
            "one measurement every 10s for a minute"
        );
        let metric = &analysis.metrics[0];
        assert_eq!(
            (
                metric.failure_limit,
                metric.inconclusive_limit,
                metric.per_target()
            ),
            (0, DEFAULT_INCONCLUSIVE_LIMIT, true),
            "the default limits; {{target}} measures per target"
        );
        let said = refused(
            "    bake: 10s\n    interval: 1m\n    metrics:\n      - name: errors\n        \
             success: \"result < 0.05\"\n        prometheus: {address: \"p:9090\", query: up}\n        \
             command: {run: \"echo {tagret}\"}\n",
        );
        for expected in [
            "rollout.analysis.interval",
            "exactly one provider",
            "rollout.analysis.metrics[0].prometheus.address",
            "`{tagret}` is not a placeholder",
        ] {
            assert!(said.contains(expected), "{expected} is reported: {said}");
        }
    }

    #[test]
    fn placeholders_are_told_from_promql_braces() {
        assert_eq!(
            unknown_placeholder(r#"sum(rate(x{instance=~"{targets}",code="500"}[1m]))"#),
            None
        );
        assert_eq!(
            unknown_placeholder("curl {tagret}"),
            Some("{tagret}".into())
        );
    }
}
