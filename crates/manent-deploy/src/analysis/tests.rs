//! The bake's judgement: counting a wave's measurements per metric against its limits.

use super::*;

fn analysis(failure_limit: u32, inconclusive_limit: u32) -> Analysis {
    Analysis {
        bake: Duration::from_secs(60),
        interval: Duration::from_secs(10),
        timeout: None,
        metrics: vec![Metric {
            name: "errors".into(),
            success: "result < 0.05".into(),
            failure_limit,
            inconclusive_limit,
            prometheus: None,
            http: None,
            command: None,
        }],
    }
}

fn measured(wave: usize, outcomes: &[Outcome]) -> Vec<Measurement> {
    outcomes
        .iter()
        .map(|&outcome| Measurement {
            wave,
            metric: "errors".into(),
            target: None,
            at_ms: 0,
            value: Some(0.5),
            baseline: None,
            outcome,
            detail: (outcome == Outcome::Inconclusive).then(|| "no data".to_string()),
            threshold: None,
        })
        .collect()
}

#[test]
fn a_failure_beyond_the_limit_fails_and_one_within_it_goes_on() {
    use Outcome::*;
    let verdict = judge(&analysis(0, 2), 1, &measured(1, &[Passed, Failed]));
    assert!(
        matches!(&verdict, Verdict::Failed(why) if why.contains("failed 1 of 2") && why.contains("result < 0.05")),
        "one failure over a limit of 0 fails, naming the count and the condition: {verdict:?}"
    );
    let verdict = judge(&analysis(1, 2), 1, &measured(1, &[Passed, Failed]));
    assert_eq!(verdict, Verdict::Going, "one failure within a limit of 1");
}

#[test]
fn inconclusive_measurements_beyond_the_limit_ask_for_a_decision() {
    use Outcome::*;
    let three = measured(1, &[Inconclusive, Inconclusive, Inconclusive]);
    let verdict = judge(&analysis(0, 2), 1, &three);
    assert!(
        matches!(&verdict, Verdict::Undecided(why) if why.contains("3 times") && why.contains("no data")),
        "three inconclusive over a limit of 2: {verdict:?}"
    );
    assert_eq!(
        judge(&analysis(0, 2), 2, &three),
        Verdict::Going,
        "another wave's measurements do not count for this one"
    );
    let mut both = three.clone();
    both.extend(measured(1, &[Failed]));
    assert!(
        matches!(judge(&analysis(0, 2), 1, &both), Verdict::Failed(_)),
        "a failure wins over a missing decision"
    );
}

#[test]
fn a_measurement_is_recorded_as_the_status_json_names_it() {
    let m = &measured(1, &[Outcome::Inconclusive])[0];
    let json = serde_json::to_value(m).expect("serialises");
    assert_eq!(json["outcome"], "inconclusive", "{json}");
    let back: Measurement = serde_json::from_value(json.clone()).expect("reads back");
    assert_eq!(&back, m, "{json}");
}
