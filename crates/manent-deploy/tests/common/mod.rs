//! What the view tests share: a deploy request recorded as submission stores it.

use serde_json::{Value, json};

/// A recorded deploy request of `application` in prod on `queue`, as submission stores it.
pub fn recorded_request(application: &str, queue: &str, dry_run: bool) -> Value {
    json!({
        "descriptor": {
            "application": application,
            "environment": "prod",
            "artifacts": [{
                "name": "app.tar.gz", "type": "file", "version": "1.0",
                "url": "file:///srv/app.tar.gz",
                "sha256": "239f59ed55e737c77147cf55ad0c1b030b6d7ee748a7426952f9b852d5a935e5",
            }],
            "dry_run": dry_run,
        },
        "effective": null,
        "route": {"queue": queue, "kind": "default", "plugin": null},
        "submitted_by": "test",
        "submitted_at_ms": 0,
    })
}
