//! The fan-out benchmark's report: the table of every measurement, the ratios between
//! engines, the worker's memory, the goals (informational) and the JSON lines.

use anyhow::Result;

use crate::{Args, Measurement, loadavg};

/// The seconds `engine` took for workload `workload` at `targets` targets, if it ran and
/// succeeded.
fn seconds(results: &[Measurement], targets: usize, workload: &str, engine: &str) -> Option<f64> {
    results
        .iter()
        .find(|m| m.targets == targets && m.workload == workload && m.engine == engine)
        .and_then(|m| m.seconds)
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

fn fmt(r: Option<f64>) -> String {
    r.map(|r| format!("{r:.2}x"))
        .unwrap_or_else(|| "n/a".into())
}

fn verdict(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "PASS",
        Some(false) => "FAIL",
        None => "n/a",
    }
}

pub(crate) fn report(args: &Args, results: &[Measurement]) -> Result<()> {
    println!();
    println!(
        "Fan-out to {} loopback sshd targets ({} cores, load {})",
        args.targets
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg().unwrap_or_default()
    );
    println!();
    println!("| targets | workload | engine | seconds | load at start | note |");
    println!("| ---: | --- | --- | ---: | --- | --- |");
    for m in results {
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            m.targets,
            m.workload,
            m.engine,
            m.seconds
                .map(|s| format!("{s:.3}"))
                .unwrap_or_else(|| "FAILED".into()),
            m.load,
            m.note.replace('\n', " ").replace('|', "/")
        );
    }
    // The (targets, workload) pairs that ran, in run order.
    let mut pairs: Vec<(usize, String)> = Vec::new();
    for m in results {
        if !pairs
            .iter()
            .any(|(n, w)| *n == m.targets && *w == m.workload)
        {
            pairs.push((m.targets, m.workload.clone()));
        }
    }
    let mut json = ratios(results, &pairs);
    json.extend(to_the_fastest(results, &pairs));
    memory(results);
    goals(args, results, &pairs);
    if let Some(path) = &args.json {
        let lines: String = results
            .iter()
            .map(|m| {
                serde_json::json!({"workload": m.workload, "engine": m.engine,
                    "targets": m.targets, "seconds": m.seconds, "note": m.note,
                    "worker_rss_kib": m.worker_rss_kib, "load": m.load})
                .to_string()
                    + "\n"
            })
            .chain(json.iter().map(|j| j.to_string() + "\n"))
            .collect();
        std::fs::write(path, lines)?;
    }
    Ok(())
}

/// Prints the ratios between engines for each (targets, workload) pair, and returns them
/// as the JSON lines of the pairs.
fn ratios(results: &[Measurement], pairs: &[(usize, String)]) -> Vec<serde_json::Value> {
    println!();
    println!(
        "| targets | workload | manent/scp | ansible/manent | manent-pg/scp | ansible/manent-pg | manent-warm/floor | transport/scp |"
    );
    println!("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    let mut json = Vec::new();
    for (n, w) in pairs {
        let g = |e: &str| seconds(results, *n, w, e);
        let (m, p, s, a, t, warm, floor) = (
            g("manent"),
            g("manent-pg"),
            g("scp"),
            g("ansible"),
            g("transport"),
            g("manent-warm"),
            g("floor"),
        );
        println!(
            "| {n} | {w} | {} | {} | {} | {} | {} | {} |",
            fmt(ratio(m, s)),
            fmt(ratio(a, m)),
            fmt(ratio(p, s)),
            fmt(ratio(a, p)),
            fmt(ratio(warm, floor)),
            fmt(ratio(t, s))
        );
        json.push(serde_json::json!({
            "workload": w, "targets": n, "manent_s": m, "manent_pg_s": p,
            "scp_s": s, "ansible_s": a, "transport_s": t, "floor_s": floor,
            "manent_warm_s": warm,
            "manent_warm_over_floor": ratio(warm, floor),
            "manent_over_scp": ratio(m, s), "ansible_over_manent": ratio(a, m),
            "manent_pg_over_scp": ratio(p, s), "ansible_over_manent_pg": ratio(a, p),
        }));
    }
    json
}

/// The rows that are not a tool doing the whole deploy: the floor (bytes only) and the
/// transport (manent's SSH without its engine). The fastest is chosen among the others.
const NOT_A_TOOL: [&str; 2] = ["floor", "transport"];

/// Prints, for each (targets, workload) pair, every engine's time as a ratio to the fastest
/// tool of that pair (manent against scp, ansible, mitogen and pyinfra alike), fastest
/// first; returns them as JSON lines.
fn to_the_fastest(results: &[Measurement], pairs: &[(usize, String)]) -> Vec<serde_json::Value> {
    println!();
    println!("Each engine against the fastest tool of its row (1.00x is the fastest):");
    println!();
    println!("| targets | workload | fastest | ratios |");
    println!("| ---: | --- | --- | --- |");
    let mut json = Vec::new();
    for (n, w) in pairs {
        let mut timed: Vec<(&str, f64)> = results
            .iter()
            .filter(|m| m.targets == *n && m.workload == *w)
            .filter_map(|m| Some((m.engine.as_str(), m.seconds?)))
            .collect();
        timed.sort_by(|a, b| a.1.total_cmp(&b.1));
        let Some(&(fastest, best)) = timed
            .iter()
            .find(|(engine, _)| !NOT_A_TOOL.contains(engine))
        else {
            continue;
        };
        let cells: Vec<String> = timed
            .iter()
            .map(|(engine, s)| format!("{engine} {:.2}x", s / best))
            .collect();
        println!("| {n} | {w} | {fastest} ({best:.3} s) | {} |", cells.join(", "));
        let ratios: serde_json::Map<String, serde_json::Value> = timed
            .iter()
            .map(|(engine, s)| ((*engine).to_string(), serde_json::json!(s / best)))
            .collect();
        json.push(serde_json::json!({
            "workload": w, "targets": n, "fastest": fastest, "fastest_s": best,
            "over_fastest": ratios,
        }));
    }
    json
}

/// Prints the worker's memory during each timed deploy that sampled it.
fn memory(results: &[Measurement]) {
    println!();
    println!("Worker memory during the timed deploy (the engine runs in this process):");
    for m in results.iter().filter(|m| m.worker_rss_kib.is_some()) {
        let (before, peak) = m.worker_rss_kib.unwrap_or_default();
        println!(
            "- {} targets, {}, {}: {:.1} MB before, peak +{:.1} MB, {} KiB per target",
            m.targets,
            m.workload,
            m.engine,
            before as f64 / 1024.0,
            peak.saturating_sub(before) as f64 / 1024.0,
            peak.saturating_sub(before) / m.targets as u64
        );
    }
}

/// Prints each goal (informational) with its verdict and the ratio it was judged on.
fn goals(args: &Args, results: &[Measurement], pairs: &[(usize, String)]) {
    println!();
    println!("Goals (informational):");
    for (n, w) in pairs {
        let g = |e: &str| seconds(results, *n, w, e);
        for engine in ["manent", "manent-pg"] {
            if g(engine).is_none() && !args.engines.iter().any(|e| e == engine) {
                continue;
            }
            let (m, s, a) = (g(engine), g("scp"), g("ansible"));
            if w == "50MB" {
                println!(
                    "- {}: {n} targets, 50 MB, {engine} <= 0.8x scp ({})",
                    verdict(ratio(m, s).map(|r| r <= 0.8)),
                    fmt(ratio(m, s))
                );
            }
            if w == "1MB" {
                println!(
                    "- {}: {n} targets, 1 MB, {engine} <= 0.5x scp ({})",
                    verdict(ratio(m, s).map(|r| r <= 0.5)),
                    fmt(ratio(m, s))
                );
                println!(
                    "- {}: {n} targets, 1 MB, {engine} >= 10x faster than ansible ({})",
                    verdict(ratio(a, m).map(|r| r >= 10.0)),
                    fmt(ratio(a, m))
                );
            }
        }
        if args.engines.iter().any(|e| e == "manent-warm") {
            // The goal is the bandwidth-bound workload's; at 1 MB the floor is a few
            // round trips and the ratio is shown for information.
            let (warm, floor) = (g("manent-warm"), g("floor"));
            let result = if w == "50MB" {
                verdict(ratio(warm, floor).map(|r| r <= 1.25))
            } else {
                "info"
            };
            println!(
                "- {result}: {n} targets, {w}, a second deploy (warm connections) <= 1.25x the \
                 floor (open OpenSSH connections, cat > file && sync) ({})",
                fmt(ratio(warm, floor))
            );
        }
    }
}
