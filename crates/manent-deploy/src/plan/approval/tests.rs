//! The approval plan of one target, against a live manifest.

use super::*;

fn eff() -> EffectiveDescriptor {
    let mut eff = crate::tasks::effective_for_tests(
        "targets: [{name: t1, host: local}]\ndeploy:\n  dest: /srv/web/{version}\n\
         variables: {GREETING: bonjour}\nsecrets: {TOKEN: {env: T}}\n",
        "",
    );
    eff.templates.push(manent_model::Template {
        src: "app.conf.j2".into(),
        dest: "app.conf".into(),
        mode: manent_model::FileMode(0o640),
        text: "greeting={{ GREETING }}".into(),
    });
    eff
}

fn live() -> Manifest {
    let mut live = Manifest {
        version: "1.1".into(),
        ..Manifest::default()
    };
    live.variables.insert("GREETING".into(), "hello".into());
    live.templates.insert("app.conf".into(), "ab".repeat(32));
    live.templates.insert("old.conf".into(), "cd".repeat(32));
    for (path, sum) in [("bin/app", "11"), ("lib/same", "22")] {
        live.snapshot.files.insert(path.into(), sum.into());
    }
    live
}

fn shown(changes: &[Change]) -> Vec<String> {
    changes
        .iter()
        .map(|c| {
            let short = |v: &Option<String>| match v.as_deref() {
                Some(s) if s.len() == 64 => "sha".to_string(),
                Some(s) => s.to_string(),
                None => "-".to_string(),
            };
            let note = c.note.as_deref().unwrap_or("");
            format!("{} {} {} {note}", c.name, short(&c.from), short(&c.to))
        })
        .collect()
}

#[test]
fn a_target_shows_its_versions_the_changed_files_first_and_counted_and_secrets_masked() {
    let eff = eff();
    let mut files: BTreeMap<String, String> =
        (0..8).map(|i| (format!("new/{i}"), "ff".into())).collect();
    files.insert("bin/app".into(), "12".into());
    files.insert("lib/same".into(), "22".into());
    let plan = target_plan(&eff, &eff.targets[0], Some(&live()), &files);
    assert_eq!(
        (plan.from_version.as_deref(), plan.to_version.as_str()),
        (Some("1.1"), "1.2"),
        "from the live release's version to the deploy's: {plan:?}"
    );
    let first: Vec<String> = ["bin/app", "new/0", "new/1", "new/2", "new/3"]
        .map(String::from)
        .to_vec();
    assert_eq!(
        (plan.files_changed, plan.files.clone()),
        (9, first),
        "a changed and 8 new files count, an unchanged one does not; the first {FIRST_FILES} \
         are named: {plan:?}"
    );
    assert_eq!(
        shown(&plan.variables),
        ["GREETING hello bonjour ", "TOKEN - *** secret"],
        "a variable from → to, a secret only as ***: {plan:?}"
    );
    assert_eq!(
        shown(&plan.templates),
        [
            "app.conf sha - rendered once approved",
            "old.conf sha - no longer written"
        ],
        "templates by dest, never rendered at the gate: {plan:?}"
    );
    assert_eq!(
        shown(&plan.artifacts),
        ["a - sha "],
        "the artifact, new against a manifest that had none: {plan:?}"
    );
}

#[test]
fn a_target_without_a_manifest_has_every_file_and_variable_as_new() {
    let eff = eff();
    let files = BTreeMap::from([("bin/app".to_string(), "12".to_string())]);
    let plan = target_plan(&eff, &eff.targets[0], None, &files);
    assert_eq!(
        (
            plan.from_version,
            plan.files_changed,
            shown(&plan.variables)
        ),
        (
            None,
            1,
            vec![
                "GREETING - bonjour ".to_string(),
                "TOKEN - *** secret".to_string()
            ]
        ),
        "nothing recorded there: everything is new"
    );
}

#[test]
fn a_recorded_plan_is_read_back_from_the_deploys_steps_and_a_damaged_one_is_an_error() {
    let plan = ApprovalPlan {
        more_targets: 2,
        ..ApprovalPlan::default()
    };
    let step = |output: String| StepRecord {
        workflow_id: "d1".into(),
        index: 3,
        name: APPROVAL_PLAN_STEP.into(),
        status: manent_engine::StepStatus::Success,
        output: Some(output),
        error: None,
        attempts: 1,
        started_at_ms: 0,
        finished_at_ms: Some(1),
        executor_id: "w1".into(),
    };
    let recorded = step(serde_json::to_string(&plan).unwrap());
    assert_eq!(
        from_steps("d1", &[recorded]).expect("readable"),
        Some(plan),
        "the plan as recorded"
    );
    assert_eq!(
        from_steps("d1", &[]).expect("readable"),
        None,
        "no step: no plan"
    );
    assert!(
        from_steps("d1", &[step("{".into())]).is_err(),
        "a damaged record is an error, never no plan"
    );
}
