//! A filtered deploy list finds what it asks for however many other deploys are newer, on
//! both backends: an application's deploys (every environment, or one) come from the
//! partition index, and a filter the store cannot answer (an environment alone) reads page
//! after page of the newest until its page is full. `before` pages through them all, once
//! each.

mod common;

use manent_deploy::{
    DEPLOY_WORKFLOW,
    views::deploy_views::{self, ListFilter},
};
use manent_engine::{Client, Connections, Database, EnqueueRequest};
use manent_testkit::{Db, TestDb, on_both_backends};

on_both_backends!(a_filtered_list_finds_an_applications_deploys_behind_thousands_of_newer_ones);

/// Deploy requests of `application` to `environment`, queued on a queue no worker serves.
fn queued(application: &str, environment: &str, count: usize) -> Vec<EnqueueRequest> {
    let mut request = common::recorded_request(application, "parked", false);
    request["descriptor"]["environment"] = environment.into();
    (0..count)
        .map(|_| {
            EnqueueRequest::new(DEPLOY_WORKFLOW, "parked", request.clone())
                .partition(format!("{application}/{environment}"))
        })
        .collect()
}

async fn listed(client: &Client, application: Option<&str>, environment: Option<&str>) -> usize {
    deploy_views::list(
        client,
        &ListFilter {
            application: application.map(str::to_string),
            environment: environment.map(str::to_string),
            status: None,
            limit: Some(50),
            before: None,
        },
        &|_| true,
    )
    .await
    .expect("list")
    .len()
}

async fn a_filtered_list_finds_an_applications_deploys_behind_thousands_of_newer_ones(db: Db) {
    let test = TestDb::new(db).await;
    let client = Client::new(
        Database::open(&test.url, &Connections::default())
            .await
            .expect("open the test database"),
    );
    let mut first = queued("shop/old", "prod", 2);
    first.extend(queued("shop/old", "staging", 1));
    client.enqueue_many(first).await.expect("enqueue");
    // 3,000 newer deploys of another application (and one whose name extends the first's).
    for _ in 0..6 {
        client
            .enqueue_many(queued("shop/busy", "prod", 500))
            .await
            .expect("enqueue");
    }
    client
        .enqueue_many(queued("shop/older", "prod", 1))
        .await
        .expect("enqueue");

    assert_eq!(
        listed(&client, Some("shop/old"), None).await,
        3,
        "every environment of shop/old, not shop/older, however many deploys are newer"
    );
    assert_eq!(
        listed(&client, Some("shop/old"), Some("staging")).await,
        1,
        "one environment of it"
    );
    assert_eq!(
        listed(&client, None, Some("staging")).await,
        1,
        "an environment alone is found by paging back through the newer deploys"
    );
    assert_eq!(
        listed(&client, None, None).await,
        50,
        "without a filter, the newest page"
    );

    // Paging with the cursor: every deploy of shop/busy once, newest first, page after page.
    let mut seen: Vec<String> = Vec::new();
    let mut before: Option<String> = None;
    loop {
        let page = deploy_views::list(
            &client,
            &ListFilter {
                application: Some("shop/busy".into()),
                limit: Some(1000),
                before: before.clone(),
                ..Default::default()
            },
            &|_| true,
        )
        .await
        .expect("a page");
        let Some(last) = page.last() else { break };
        before = Some(last.id.clone());
        seen.extend(page.into_iter().map(|d| d.id));
    }
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        (seen.len(), unique.len()),
        (3000, 3000),
        "three full pages and an empty one: each deploy of shop/busy exactly once"
    );
    let history = deploy_views::history(&client, "shop/busy", "prod", Some(10), Some(&seen[2994]))
        .await
        .expect("history");
    let after: Vec<&str> = history.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(
        after,
        seen[2995..].iter().map(String::as_str).collect::<Vec<_>>(),
        "history pages with the same cursor: the five deploys older than the one given"
    );
}
