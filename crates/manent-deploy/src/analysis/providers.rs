//! Taking one measurement of a metric (docs/analysis.md, "Providers"): the placeholders
//! filled in, then an instant query to Prometheus (`GET /api/v1/query`), a GET whose JSON
//! answer holds the number at a JSON pointer (both through the HTTP port, `crate::http`,
//! following redirects), or a command (on the worker, or on a target over its transport)
//! whose stdout is the number. Every failure is a sentence: the bake records it as an
//! inconclusive measurement, never as a pass.

use std::time::Duration;

use manent_model::{EffectiveDescriptor, Metric, Provider, RunOn, Target};
use manent_ssh::{Connection, ConnectionPool, LocalConnection};

use crate::http::{HttpFetch, HttpResponse};

/// The longest one measurement may take (a query, a GET, a command).
pub const MEASUREMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// The most of a command's stdout or an HTTP answer quoted in a message.
const QUOTED: usize = 200;

/// The largest HTTP answer read: a metric is one number, an instant query one series.
const MAX_ANSWER: usize = 4 * 1024 * 1024;

/// What a measurement is taken over: the wave's targets, the targets not reached yet, and
/// the one target a per-target metric is measured on.
#[derive(Debug, Clone, Copy)]
pub struct Over<'a> {
    pub eff: &'a EffectiveDescriptor,
    pub targets: &'a [Target],
    pub baseline: &'a [Target],
    pub target: Option<&'a Target>,
}

impl Over<'_> {
    /// `text` with the placeholders filled in; with `as_baseline`, `{targets}` names the
    /// baseline targets (the same query over `{baseline}`).
    pub fn fill(&self, text: &str, as_baseline: bool) -> String {
        let names = |targets: &[Target]| {
            targets
                .iter()
                .map(|t| t.name.as_str())
                .collect::<Vec<_>>()
                .join("|")
        };
        let targets = if as_baseline {
            names(self.baseline)
        } else {
            names(self.targets)
        };
        let mut text = text
            .replace("{targets}", &targets)
            .replace("{baseline}", &names(self.baseline))
            .replace("{version}", &self.eff.version)
            .replace("{application}", &self.eff.application)
            .replace("{environment}", &self.eff.environment);
        if let Some(target) = self.target {
            text = text
                .replace("{target}", &target.name)
                .replace("{host}", &target.host);
        }
        text
    }
}

/// One value of `metric` over `over` (with `as_baseline`, its baseline); `http` asks the
/// HTTP providers.
pub async fn measure(
    metric: &Metric,
    over: Over<'_>,
    as_baseline: bool,
    pool: &ConnectionPool,
    http: &dyn HttpFetch,
) -> Result<f64, String> {
    let Some(provider) = metric.provider() else {
        return Err(format!("metric `{}` has no single provider", metric.name));
    };
    let taken = async {
        match provider {
            Provider::Prometheus(p) => {
                let address = over.fill(&p.address, as_baseline);
                prometheus(http, &address, &over.fill(&p.query, as_baseline)).await
            }
            Provider::Http(h) => {
                json_pointer(http, &over.fill(&h.url, as_baseline), &h.value).await
            }
            Provider::Command(c) => {
                let run = over.fill(&c.run, as_baseline);
                match (c.on, over.target) {
                    (RunOn::Target, Some(target)) => {
                        let conn = crate::run::targets::connection(pool, over.eff, target)
                            .await
                            .map_err(|e| e.to_string())?;
                        command(conn.as_ref(), &run, over).await
                    }
                    _ => command(&LocalConnection::new(), &run, over).await,
                }
            }
        }
    };
    let value = tokio::time::timeout(MEASUREMENT_TIMEOUT, taken)
        .await
        .map_err(|_| {
            format!(
                "no answer within {}",
                humantime::format_duration(MEASUREMENT_TIMEOUT)
            )
        })??;
    if value.is_finite() {
        Ok(value)
    } else {
        Err(format!("the value is {value}, not a number to judge"))
    }
}

/// An instant query: `GET <address>/api/v1/query?query=…`; its answer must be a scalar or
/// a vector of exactly one series.
pub async fn prometheus(http: &dyn HttpFetch, address: &str, query: &str) -> Result<f64, String> {
    let url = format!("{}/api/v1/query", address.trim_end_matches('/'));
    let mut asked = url::Url::parse(&url).map_err(|e| format!("GET {url}: not a URL: {e}"))?;
    asked.query_pairs_mut().append_pair("query", query);
    let mut answer = crate::http::get_following_redirects(http, asked.as_str())
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    let status = answer.status_text();
    let body = json(&mut answer)
        .await
        .map_err(|why| format!("GET {url}: {status}, {why}"))?;
    if body["status"] != "success" {
        return Err(format!(
            "Prometheus refused `{query}`: {}",
            body["error"].as_str().unwrap_or("no error given")
        ));
    }
    let data = &body["data"];
    let sample = match data["resultType"].as_str() {
        Some("scalar") => &data["result"],
        Some("vector") => {
            let series = data["result"].as_array().map_or(0, Vec::len);
            match series {
                0 => return Err(format!("no data: `{query}` returned no series")),
                1 => &data["result"][0]["value"],
                n => {
                    return Err(format!(
                        "`{query}` returned {n} series; aggregate it to one (sum, avg, max)"
                    ));
                }
            }
        }
        other => {
            return Err(format!(
                "`{query}` returned a {}, not a scalar or a vector",
                other.unwrap_or("nothing")
            ));
        }
    };
    number(&sample[1]).ok_or_else(|| format!("`{query}` returned {sample}, not a sample"))
}

/// A GET whose JSON answer holds the number at the JSON pointer `pointer`.
pub async fn json_pointer(http: &dyn HttpFetch, url: &str, pointer: &str) -> Result<f64, String> {
    let mut answer = crate::http::get_following_redirects(http, url)
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    if !answer.is_success() {
        return Err(format!("GET {url}: {}", answer.status_text()));
    }
    let body = json(&mut answer)
        .await
        .map_err(|why| format!("GET {url}: {why}"))?;
    let found = body
        .pointer(pointer)
        .ok_or_else(|| format!("GET {url}: the answer has nothing at {pointer}"))?;
    number(found).ok_or_else(|| {
        let mut shown = found.to_string();
        shown.truncate(QUOTED);
        format!("GET {url}: {pointer} is {shown}, not a number")
    })
}

/// The JSON of `answer`'s body, at most [`MAX_ANSWER`] bytes; why not, in words.
async fn json(answer: &mut HttpResponse) -> Result<serde_json::Value, String> {
    let body = crate::http::read_body(answer, MAX_ANSWER)
        .await
        .map_err(|e| format!("the answer could not be read: {e}"))?
        .ok_or_else(|| format!("an answer larger than {MAX_ANSWER} bytes"))?;
    serde_json::from_slice(&body).map_err(|e| format!("an answer that is not JSON: {e}"))
}

/// A number, or a string holding one (Prometheus writes its samples as strings).
fn number(value: &serde_json::Value) -> Option<f64> {
    match value {
        serde_json::Value::Number(n) => n.as_f64(),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// Runs `run` through `conn` (`sh -c`); its stdout, trimmed, is the number.
async fn command(conn: &dyn Connection, run: &str, over: Over<'_>) -> Result<f64, String> {
    let mut env = vec![
        (
            "MANENT_APPLICATION".to_string(),
            over.eff.application.clone(),
        ),
        (
            "MANENT_ENVIRONMENT".to_string(),
            over.eff.environment.clone(),
        ),
        ("MANENT_VERSION".to_string(), over.eff.version.clone()),
    ];
    if let Some(target) = over.target {
        env.push(("MANENT_TARGET".to_string(), target.name.clone()));
    }
    let out = conn
        .exec(run, &env)
        .await
        .map_err(|e| format!("`{run}` could not be run: {e}"))?;
    let quoted = |text: &str| {
        let mut text = text.trim().to_string();
        text.truncate(QUOTED);
        text
    };
    if out.status != 0 {
        return Err(format!(
            "`{run}` exited {}: {}",
            out.status,
            quoted(&out.stderr)
        ));
    }
    out.stdout
        .trim()
        .parse::<f64>()
        .map_err(|_| format!("`{run}` printed `{}`, not a number", quoted(&out.stdout)))
}

#[cfg(test)]
mod tests {
    use crate::http::canned::{Answer, Canned};

    use super::*;

    /// An HTTP server answering every request with `body` (JSON).
    fn answering(body: &'static str) -> Canned {
        Canned::new(move |_| Answer::ok(body).header("content-type", "application/json"))
    }

    fn environment() -> EffectiveDescriptor {
        crate::run::targets::tests::local_environment()
    }

    #[tokio::test]
    async fn an_http_metric_is_the_number_at_its_json_pointer() {
        let http = answering(r#"{"data": {"rate": 0.25, "text": "0.5", "no": [1]}}"#);
        let url = "http://app.test/stats";
        let at = |pointer: &'static str| json_pointer(&http, url, pointer);
        assert_eq!(at("/data/rate").await, Ok(0.25), "a number");
        assert_eq!(at("/data/text").await, Ok(0.5), "a number as text");
        let missing = at("/data/nope").await;
        assert!(
            missing
                .as_ref()
                .is_err_and(|e| e.contains("nothing at /data/nope")),
            "a pointer to nothing is no value: {missing:?}"
        );
        let list = at("/data/no").await;
        assert!(
            list.as_ref().is_err_and(|e| e.contains("not a number")),
            "a list is no number: {list:?}"
        );
    }

    #[tokio::test]
    async fn a_prometheus_answer_without_a_single_series_is_no_value() {
        let address = "http://prometheus.test:9090/";
        let empty = answering(r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#);
        let said = prometheus(&empty, address, "up").await;
        assert!(
            said.as_ref().is_err_and(|e| e.starts_with("no data")),
            "no series: {said:?}"
        );
        let scalar =
            answering(r#"{"status":"success","data":{"resultType":"scalar","result":[1,"0.75"]}}"#);
        let query = "sum(rate(errors{job=\"web\"}[5m])) / 2";
        assert_eq!(
            prometheus(&scalar, address, query).await,
            Ok(0.75),
            "a scalar"
        );
        assert_eq!(
            scalar.urls(),
            [
                "http://prometheus.test:9090/api/v1/query?query=sum%28rate%28errors%7Bjob%3D%22web%22%7D%5B5m%5D%29%29+%2F+2"
            ],
            "the instant query's URL, the query encoded as a form value"
        );
    }

    #[tokio::test]
    async fn an_answer_that_is_not_json_or_too_large_is_no_value_and_says_so() {
        let http = Canned::new(|url| {
            if url.ends_with("/large") {
                Answer::ok(vec![b' '; MAX_ANSWER + 1])
            } else {
                Answer::ok("<html>")
            }
        });
        let said = json_pointer(&http, "http://app.test/page", "/a").await;
        assert!(
            said.as_ref().is_err_and(
                |e| e.starts_with("GET http://app.test/page: an answer that is not JSON")
            ),
            "HTML is no value: {said:?}"
        );
        let said = json_pointer(&http, "http://app.test/large", "/a").await;
        assert!(
            said.as_ref()
                .is_err_and(|e| e.contains("an answer larger than")),
            "an answer past the limit is not read whole: {said:?}"
        );
        let failed = Canned::new(|_| Answer::status(503));
        let said = json_pointer(&failed, "http://app.test/stats", "/a").await;
        assert_eq!(
            said,
            Err("GET http://app.test/stats: 503 Service Unavailable".to_string()),
            "a failed answer is named by its status"
        );
    }

    #[tokio::test]
    async fn a_command_metric_on_the_worker_is_its_stdout_with_the_placeholders_filled() {
        let eff = environment();
        let over = Over {
            eff: &eff,
            targets: &eff.targets[..1],
            baseline: &eff.targets[1..],
            target: Some(&eff.targets[0]),
        };
        let metric: Metric = serde_json::from_value(serde_json::json!({
            "name": "m",
            "success": "result < 1",
            "command": {"run": "test '{targets}/{baseline}/{target}/{version}' = 't1/t2/t1/7' && echo 0.5"},
        }))
        .expect("a metric");
        let pool = ConnectionPool::new(manent_ssh::SshAuth::new(
            std::path::PathBuf::from("/none"),
            std::path::PathBuf::from("/none"),
        ));
        assert_eq!(
            measure(&metric, over, false, &pool, &crate::http::NoClient).await,
            Ok(0.5),
            "the placeholders filled, stdout read"
        );
        let baseline = measure(&metric, over, true, &pool, &crate::http::NoClient).await;
        assert!(
            baseline.as_ref().is_err_and(|e| e.contains("exited 1")),
            "over the baseline, {{targets}} names t2: {baseline:?}"
        );
    }

    #[test]
    fn numbers_are_read_from_numbers_and_strings() {
        assert_eq!(number(&serde_json::json!(0.25)), Some(0.25));
        assert_eq!(number(&serde_json::json!("0.5")), Some(0.5));
        assert_eq!(
            number(&serde_json::json!("NaN")).map(f64::is_nan),
            Some(true)
        );
        assert_eq!(number(&serde_json::json!({"a": 1})), None);
    }
}
