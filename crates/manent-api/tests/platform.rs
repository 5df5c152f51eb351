//! The Platform page (docs/api.md) as the router serves it, in-process with
//! `tower::ServiceExt::oneshot`: one self-contained HTML document at `/` and `/platform`,
//! served without a token, naming no external URL, its script and style allowed by nonce.
//! The page in a real browser is `crates/manent-server/tests/platform.rs`.

mod common;

use axum::{
    body::Body,
    http::{Request, StatusCode, header},
};
use common::Api;
use tower::ServiceExt;

/// `GET path` without a token: status, headers and body as text.
async fn fetch(api: &Api, path: &str) -> (StatusCode, axum::http::HeaderMap, String) {
    let response = api
        .router
        .clone()
        .oneshot(Request::get(path).body(Body::empty()).expect("a request"))
        .await
        .expect("the router answers");
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("read the body");
    let body = String::from_utf8(bytes.to_vec()).expect("the page is UTF-8");
    (status, headers, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_served_without_a_token_as_one_html_document_with_no_external_url() {
    let api = Api::new().await;
    for path in ["/", "/platform"] {
        let (status, headers, body) = fetch(&api, path).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "{path} answers without a token: the page holds no data"
        );
        let content_type = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        assert!(
            content_type.starts_with("text/html"),
            "{path} is HTML, not {content_type:?}"
        );
        let lower = body.to_ascii_lowercase();
        assert!(
            lower.contains("<!doctype html>") && lower.contains("</html>"),
            "{path} is a whole HTML document"
        );
        for external in ["http://", "https://", "//cdn", "src=\"//"] {
            assert!(
                !lower.contains(external),
                "{path} names no external URL (`{external}`): the page needs no network but its API"
            );
        }
        assert!(
            !lower.contains("<script src") && !lower.contains("<link"),
            "{path} loads no script or stylesheet from elsewhere: they are inline"
        );
        assert!(
            !body.contains("/*SCRIPT*/") && !body.contains("/*STYLE*/"),
            "{path} has its script and stylesheet inlined in place of the markers"
        );
        assert!(
            body.contains("/api/v1") && body.contains("Authorization"),
            "{path}'s script reads the token-protected API with the bearer token"
        );
        assert!(
            !body.contains("innerHTML"),
            "{path}'s script puts data into the DOM as text only, never as markup"
        );

        let csp = headers
            .get(header::CONTENT_SECURITY_POLICY)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let nonce = csp
            .split(';')
            .find_map(|d| d.trim().strip_prefix("script-src 'nonce-"))
            .and_then(|n| n.strip_suffix('\''))
            .unwrap_or_else(|| panic!("{path}'s policy allows scripts by nonce only: {csp:?}"));
        assert!(
            body.contains(&format!("<script nonce=\"{nonce}\">")),
            "{path}'s own inline script carries the policy's nonce"
        );
        assert!(
            csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"),
            "{path}'s policy forbids everything but its own API: {csp:?}"
        );
    }
    let (_, first, _) = fetch(&api, "/").await;
    let (_, second, _) = fetch(&api, "/").await;
    assert_ne!(
        first.get(header::CONTENT_SECURITY_POLICY),
        second.get(header::CONTENT_SECURITY_POLICY),
        "each response has a fresh nonce, so a nonce seen once is of no use later"
    );
}
