//! Ids on the command line: a deploy's or a schedule's whole id, or a unique prefix of at
//! least six characters, resolved against what the server lists.

use manent_contract::{DeployStatus, ScheduleView};
use serde_json::Value;

use crate::{
    client::{Answer, ApiClient, CliError},
    deploy_path,
};

/// The full id of a deploy given as its id or a unique prefix of 6 or more characters
/// (among the 1,000 most recent deploys the token may see).
pub async fn resolve_deploy(api: &ApiClient, id: &str) -> Result<String, CliError> {
    match api.get::<Value>(&deploy_path(id, "")).await {
        Ok(_) => return Ok(id.to_string()),
        Err(CliError::NotFound(_)) => {}
        Err(other) => return Err(other),
    }
    check_prefix_length("deploy", id, "manent list")?;
    let recent: Answer<Vec<DeployStatus>> = api
        .get_query("/api/v1/deploys", &[("limit", "1000".to_string())])
        .await?;
    one_match(
        "deploy",
        id,
        recent.body.iter().map(|d| d.id.as_str()),
        "manent list",
    )
}

/// A schedule's whole id from `id`: the whole id, or a unique prefix of one, by the same
/// rule as deploys'.
pub async fn resolve_schedule(api: &ApiClient, id: &str) -> Result<String, CliError> {
    let all: Answer<Vec<ScheduleView>> = api.get("/api/v1/schedules").await?;
    if all.body.iter().any(|s| s.id == id) {
        return Ok(id.to_string());
    }
    check_prefix_length("schedule", id, "manent schedules")?;
    one_match(
        "schedule",
        id,
        all.body.iter().map(|s| s.id.as_str()),
        "manent schedules",
    )
}

/// The fewest characters a prefix of an id may have.
pub(crate) const MIN_PREFIX: usize = 6;

/// One rule for every id on the command line: the whole id, or a unique prefix of at least
/// [`MIN_PREFIX`] characters. A shorter one is refused as too short, not as unknown.
pub(crate) fn check_prefix_length(kind: &str, id: &str, lister: &str) -> Result<(), CliError> {
    if id.chars().count() < MIN_PREFIX {
        return Err(CliError::Usage(format!(
            "no {kind} `{id}`, and `{id}` is too short to be a prefix: give the whole id or \
             at least {MIN_PREFIX} of its first characters (`{lister}` shows them)"
        )));
    }
    Ok(())
}

/// The one id of `candidates` that starts with `prefix`.
pub(crate) fn one_match<'a>(
    kind: &str,
    prefix: &str,
    candidates: impl Iterator<Item = &'a str>,
    lister: &str,
) -> Result<String, CliError> {
    let matches: Vec<&str> = candidates.filter(|full| matches_id(full, prefix)).collect();
    match matches.as_slice() {
        [one] => Ok((*one).to_string()),
        [] => Err(CliError::NotFound(format!(
            "no {kind} `{prefix}`, nor one whose id starts with it: see `{lister}`"
        ))),
        many => Err(CliError::Usage(format!(
            "`{prefix}` starts {} {kind} ids ({}); give more characters",
            many.len(),
            many.iter().take(5).copied().collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// Whether `given` names the id `full`: a prefix of it, or the short form of a scheduled
/// run (`sch-1a2b3c4d@1796224050`, as tables show it): a prefix of its schedule's id and
/// its whole tick.
pub(crate) fn matches_id(full: &str, given: &str) -> bool {
    if full.starts_with(given) {
        return true;
    }
    match (full.split_once('@'), given.split_once('@')) {
        (Some((schedule, tick)), Some((schedule_prefix, given_tick))) => {
            schedule.starts_with(schedule_prefix) && tick == given_tick
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render;

    #[test]
    fn one_prefix_rule_for_every_id() {
        let ids = ["a3b2010e-1111", "a3b2010e-2222", "c0ffee12-3333"];
        let check = |id: &str| -> Result<String, String> {
            check_prefix_length("deploy", id, "manent list")
                .and_then(|()| one_match("deploy", id, ids.iter().copied(), "manent list"))
                .map_err(|e| format!("{} {e}", e.exit_code()))
        };
        assert_eq!(check("c0ffee").as_deref(), Ok("c0ffee12-3333"), "unique");
        let short = check("c0ff").unwrap_err();
        assert!(
            short.starts_with("2 ") && short.contains("too short"),
            "a 4-character prefix is refused as too short, not as unknown: {short}"
        );
        let many = check("a3b2010e").unwrap_err();
        assert!(
            many.starts_with("2 ") && many.contains("starts 2 deploy ids"),
            "an ambiguous prefix lists the candidates: {many}"
        );
        let none = check("ffffff").unwrap_err();
        assert!(none.contains("no deploy `ffffff`"), "{none}");
    }

    #[test]
    fn a_short_id_as_tables_show_it_names_its_deploy() {
        let schedule = "sch-1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d";
        let ids = [
            format!("{schedule}@1796224050"),
            format!("{schedule}@1796224110"),
            "3f2a9c71-aaaa-4bbb-8ccc-000000000001".to_string(),
        ];
        for id in &ids {
            let short = render::short_id(id);
            assert_eq!(
                one_match(
                    "deploy",
                    &short,
                    ids.iter().map(String::as_str),
                    "manent list"
                )
                .as_deref()
                .ok(),
                Some(id.as_str()),
                "the short id {short} a table shows resolves to its deploy, not to its \
                 schedule's other runs"
            );
        }
        assert_eq!(
            render::short_id(&ids[0]),
            "sch-1a2b3c4d@1796224050",
            "a scheduled run's id keeps its tick"
        );
        assert_eq!(
            render::short_id(&ids[2]),
            "3f2a9c71",
            "an id shortened to 8 characters"
        );
    }
}
