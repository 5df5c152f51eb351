//! The Platform page (docs/api.md): one self-contained HTML document served at `/` and
//! `/platform`, with its CSS and vanilla JavaScript inlined from `platform/` (no build
//! step, no external request). It holds no data and is served without a token; the script
//! asks for a token and reads everything from the token-protected `/api/v1`.

use std::sync::LazyLock;

use axum::{
    http::header,
    response::{IntoResponse, Response},
};

const INDEX: &str = include_str!("platform/index.html");
const STYLE: &str = include_str!("platform/style.css");
const SCRIPT: &str = include_str!("platform/app.js");

/// The document with the stylesheet and the script in place; `{{nonce}}` is left for each
/// response.
static PAGE: LazyLock<String> = LazyLock::new(|| {
    INDEX
        .replacen("/*STYLE*/", STYLE, 1)
        .replacen("/*SCRIPT*/", SCRIPT, 1)
});

/// `GET /` and `GET /platform`: the page, with a fresh nonce that lets only its own inline
/// script and style run (Content-Security-Policy), and no connection but to this origin.
pub async fn page() -> Response {
    let nonce = hex::encode(rand::random::<[u8; 16]>());
    let csp = format!(
        "default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; \
         connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
         frame-ancestors 'none'"
    );
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8".to_string()),
            (header::CONTENT_SECURITY_POLICY, csp),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_string()),
            (header::REFERRER_POLICY, "no-referrer".to_string()),
            (header::CACHE_CONTROL, "no-cache".to_string()),
        ],
        PAGE.replace("{{nonce}}", &nonce),
    )
        .into_response()
}
