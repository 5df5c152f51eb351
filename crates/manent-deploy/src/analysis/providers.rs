//! Taking one measurement of a metric (docs/analysis.md, "Providers"): the placeholders
//! filled in, then an instant query to Prometheus (`GET /api/v1/query`), a GET whose JSON
//! answer holds the number at a JSON pointer, or a command (on the worker, or on a target
//! over its transport) whose stdout is the number. Every failure is a sentence: the bake
//! records it as an inconclusive measurement, never as a pass.

use std::time::Duration;

use manent_model::{EffectiveDescriptor, Metric, Provider, RunOn, Target};
use manent_ssh::{Connection, ConnectionPool, LocalConnection};

/// The longest one measurement may take (a query, a GET, a command).
pub const MEASUREMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// The most of a command's stdout or an HTTP answer quoted in a message.
const QUOTED: usize = 200;

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

/// One value of `metric` over `over` (with `as_baseline`, its baseline).
pub async fn measure(
    metric: &Metric,
    over: Over<'_>,
    as_baseline: bool,
    pool: &ConnectionPool,
) -> Result<f64, String> {
    let Some(provider) = metric.provider() else {
        return Err(format!("metric `{}` has no single provider", metric.name));
    };
    let taken = async {
        match provider {
            Provider::Prometheus(p) => {
                let address = over.fill(&p.address, as_baseline);
                prometheus(&address, &over.fill(&p.query, as_baseline)).await
            }
            Provider::Http(h) => http(&over.fill(&h.url, as_baseline), &h.value).await,
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
pub async fn prometheus(address: &str, query: &str) -> Result<f64, String> {
    let url = format!("{}/api/v1/query", address.trim_end_matches('/'));
    let answer = reqwest::Client::new()
        .get(&url)
        .query(&[("query", query)])
        .send()
        .await
        .map_err(|e| format!("GET {url}: {}", crate::run::targets::with_causes(&e)))?;
    let status = answer.status();
    let body: serde_json::Value = answer
        .json()
        .await
        .map_err(|e| format!("GET {url}: {status}, an answer that is not JSON: {e}"))?;
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
pub async fn http(url: &str, pointer: &str) -> Result<f64, String> {
    let answer = reqwest::Client::new()
        .get(url)
        .send()
        .await
        .map_err(|e| format!("GET {url}: {}", crate::run::targets::with_causes(&e)))?;
    let status = answer.status();
    if !status.is_success() {
        return Err(format!("GET {url}: {status}"));
    }
    let body: serde_json::Value = answer
        .json()
        .await
        .map_err(|e| format!("GET {url}: an answer that is not JSON: {e}"))?;
    let found = body
        .pointer(pointer)
        .ok_or_else(|| format!("GET {url}: the answer has nothing at {pointer}"))?;
    number(found).ok_or_else(|| {
        let mut shown = found.to_string();
        shown.truncate(QUOTED);
        format!("GET {url}: {pointer} is {shown}, not a number")
    })
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// An HTTP server on loopback answering every request with `body` (JSON), once per
    /// connection; its address.
    async fn answering(body: &'static str) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut request = [0u8; 4096];
                let _ = stream.read(&mut request).await;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: \
                     {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            }
        });
        address
    }

    fn environment() -> EffectiveDescriptor {
        let env = manent_model::parse_environment(
            "targets: [{name: t1, host: local}, {name: t2, host: local}]\ndeploy: {dest: /srv}\n",
            "prod.yml",
            "ml/web",
            "prod",
        )
        .expect("an environment");
        let descriptor = manent_model::parse_descriptor(
            &format!(
                "application: ml/web\nenvironment: prod\nartifacts: [{{name: a, type: t, \
                 version: \"7\", url: \"file:///a\", sha256: {}}}]\n",
                "0".repeat(64)
            ),
            "d.yml",
        )
        .expect("a descriptor");
        EffectiveDescriptor::build(&descriptor, &env).expect("effective")
    }

    #[tokio::test]
    async fn an_http_metric_is_the_number_at_its_json_pointer() {
        let address = answering(r#"{"data": {"rate": 0.25, "text": "0.5", "no": [1]}}"#).await;
        let url = format!("{address}/stats");
        assert_eq!(http(&url, "/data/rate").await, Ok(0.25), "a number");
        assert_eq!(http(&url, "/data/text").await, Ok(0.5), "a number as text");
        let missing = http(&url, "/data/nope").await;
        assert!(
            missing
                .as_ref()
                .is_err_and(|e| e.contains("nothing at /data/nope")),
            "a pointer to nothing is no value: {missing:?}"
        );
        let list = http(&url, "/data/no").await;
        assert!(
            list.as_ref().is_err_and(|e| e.contains("not a number")),
            "a list is no number: {list:?}"
        );
    }

    #[tokio::test]
    async fn a_prometheus_answer_without_a_single_series_is_no_value() {
        let empty =
            answering(r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#).await;
        let said = prometheus(&empty, "up").await;
        assert!(
            said.as_ref().is_err_and(|e| e.starts_with("no data")),
            "no series: {said:?}"
        );
        let scalar =
            answering(r#"{"status":"success","data":{"resultType":"scalar","result":[1,"0.75"]}}"#)
                .await;
        assert_eq!(prometheus(&scalar, "0.75").await, Ok(0.75), "a scalar");
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
            measure(&metric, over, false, &pool).await,
            Ok(0.5),
            "the placeholders filled, stdout read"
        );
        let baseline = measure(&metric, over, true, &pool).await;
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
