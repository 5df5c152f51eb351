//! The OpenAPI document of the API (docs/api.md), generated: the routes and their
//! operations come from the router itself (`routes()` in `lib.rs`, built with utoipa-axum,
//! so a route cannot be served undocumented), the schemas from `manent-contract`. This
//! module adds what holds for every operation: the bearer token on `/api/v1` (but the
//! document), and the error answers the token layer (401, and 429 for a client throttled
//! after failed authentications) and axum's extractors give.

use std::sync::LazyLock;

use axum::Json;
use manent_contract::ErrorBody;
use utoipa::{
    Modify, OpenApi, ToSchema,
    openapi::{
        self, ContentBuilder, ObjectBuilder, PathItem, Ref, RefOr, ResponseBuilder, Type,
        header::HeaderBuilder,
        path::Operation,
        security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme},
    },
};

/// Where the document is served, without a token.
pub const DOCUMENT_PATH: &str = "/api/v1/openapi.json";

/// The name of the bearer scheme in the document.
const BEARER: &str = "bearerAuth";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "manent API",
        description = "JSON REST under `/api/v1`. Every `/api/v1` operation needs an API token \
            sent as `Authorization: Bearer <token>` (create one with `manent-server admin token \
            create`); only this document is served without one. Failures answer \
            `{\"error\": {\"code\", \"message\", \"field\"?}}`; `field` names the bad field of a \
            400 when there is one. Times are RFC 3339 in UTC with milliseconds. Field names are \
            a stable interface: fields may be added, never renamed. `/healthz` and `/readyz` sit \
            outside `/api/v1`, answer plain text and need no token; so does the Platform page at \
            `/` (HTML), whose data all comes from `/api/v1` with a token. This document is \
            generated from the server's router and types.",
        license(name = "Apache-2.0"),
    ),
    servers((url = "/")),
    // Schemas only named by a parameter, which utoipa-axum does not collect.
    components(schemas(manent_contract::StatusFilter)),
    tags(
        (name = "deploys", description = "Submit deploys and follow them."),
        (name = "schedules", description = "Recurring schedules."),
        (name = "platform", description = "Tenants, applications, queues and workers."),
        (name = "admin", description = "API tokens and the audit trail (admin role)."),
        (name = "tokens", description = "The asking token."),
        (name = "meta", description = "The page, health, readiness, metrics and this document."),
    ),
)]
pub struct Base;

/// The error answers every operation may give, by status, as shared responses.
const SHARED_ERRORS: &[(&str, &str, &str)] = &[
    (
        "400",
        "BadRequest",
        "A request axum refuses before any handler (a body that is not UTF-8, a query string \
         that cannot be read) or that the handler refuses; `field` names the bad field when \
         there is one (`code` `bad_request`).",
    ),
    (
        "401",
        "Unauthorized",
        "No `Authorization: Bearer <token>` header, or a token this server never issued, \
         revoked or expired (`code` `unauthorized`).",
    ),
    (
        "413",
        "PayloadTooLarge",
        "The body is over the size limit (`code` `payload_too_large`).",
    ),
    (
        "429",
        "TooManyRequests",
        "Too many failed authentications from this client's address: answered until the \
         window ends, `Retry-After` says in how many seconds. A request with a valid token is \
         never throttled (`code` `too_many_requests`).",
    ),
    (
        "500",
        "Internal",
        "An internal error, or a stored record that cannot be read; the message names it \
         (`code` `internal`).",
    ),
    (
        "503",
        "Unavailable",
        "The database is unavailable; retry later (`code` `unavailable`).",
    ),
];

/// Adds the bearer scheme, every operation's security, and the shared error answers. Run
/// on the document once the router's routes are in it.
pub struct Conventions;

impl Modify for Conventions {
    fn modify(&self, doc: &mut openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            BEARER,
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        components
            .schemas
            .entry(ErrorBody::name().into_owned())
            .or_insert_with(<ErrorBody as utoipa::PartialSchema>::schema);
        for (status, name, description) in SHARED_ERRORS {
            let mut response = ResponseBuilder::new().description(*description).content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name(ErrorBody::name())))
                    .build(),
            );
            if *status == "429" {
                response = response.header(
                    "Retry-After",
                    HeaderBuilder::new()
                        .schema(Some(
                            ObjectBuilder::new()
                                .schema_type(Type::Integer)
                                .minimum(Some(1)),
                        ))
                        .description(Some("Seconds until the client's address is served again."))
                        .build(),
                );
            }
            components
                .responses
                .insert((*name).to_string(), RefOr::T(response.build()));
        }
        for (path, item) in doc.paths.paths.iter_mut() {
            let protected = path.starts_with("/api/v1/") && path != DOCUMENT_PATH;
            for operation in operations(item) {
                add_conventions(operation, protected);
            }
        }
    }
}

fn operations(item: &mut PathItem) -> impl Iterator<Item = &mut Operation> {
    [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.delete,
        &mut item.options,
        &mut item.head,
        &mut item.patch,
        &mut item.trace,
    ]
    .into_iter()
    .filter_map(Option::as_mut)
}

fn add_conventions(operation: &mut Operation, protected: bool) {
    if !protected {
        operation.security = Some(Vec::new());
        return;
    }
    operation.security = Some(vec![SecurityRequirement::new(BEARER, Vec::<String>::new())]);
    let mut shared = vec!["401", "429", "500", "503"];
    if operation.request_body.is_some() {
        shared.extend(["400", "413"]);
    }
    for (status, name, _) in SHARED_ERRORS {
        if shared.contains(status) {
            operation
                .responses
                .responses
                .entry((*status).to_string())
                .or_insert_with(|| RefOr::Ref(Ref::from_response_name(*name)));
        }
    }
}

/// The document, generated once per process from the router's routes.
static DOCUMENT: LazyLock<serde_json::Value> = LazyLock::new(|| {
    let mut doc = crate::routes().into_openapi();
    Conventions.modify(&mut doc);
    // Built from types that always serialise; a failure is a bug that every request of
    // the document reports, never an empty document.
    serde_json::to_value(doc).unwrap_or_else(|e| {
        tracing::error!(error = %e, "the OpenAPI document cannot be written");
        serde_json::Value::Null
    })
});

/// The generated document.
pub fn document() -> &'static serde_json::Value {
    &DOCUMENT
}

/// This OpenAPI document.
#[utoipa::path(
    get,
    path = "/api/v1/openapi.json",
    tag = "meta",
    operation_id = "openapi",
    responses(
        (status = 200, description = "This document (OpenAPI 3.1), generated from the server's \
            router and types.", content_type = "application/json", body = Object),
        (status = 500, description = "The document cannot be written (a bug).", body = ErrorBody),
    )
)]
pub async fn serve() -> Result<Json<serde_json::Value>, crate::AppError> {
    match document() {
        serde_json::Value::Null => Err(crate::AppError::Internal(
            "the OpenAPI document cannot be written; see the server's log".into(),
        )),
        doc => Ok(Json(doc.clone())),
    }
}
