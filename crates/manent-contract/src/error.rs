//! The JSON body of every failure of `/api/v1`: `{"error": {"code", "message", "field"?}}`.

use serde::{Deserialize, Serialize};

use manent_enum::string_enum;

string_enum!(
    /// What kind of failure, one per HTTP status (docs/api.md).
    ErrorCode, listed: true,
    "bad_request (400), unauthorized (401), forbidden (403), not_found (404), \
     method_not_allowed (405), conflict (409), payload_too_large (413), \
     unsupported_media_type (415), too_many_requests (429), internal (500), \
     unavailable (503)." {
        BadRequest = "bad_request",
        Unauthorized = "unauthorized",
        Forbidden = "forbidden",
        NotFound = "not_found",
        MethodNotAllowed = "method_not_allowed",
        Conflict = "conflict",
        PayloadTooLarge = "payload_too_large",
        UnsupportedMediaType = "unsupported_media_type",
        TooManyRequests = "too_many_requests",
        Internal = "internal",
        Unavailable = "unavailable",
    }
);

impl ErrorCode {
    /// The code of an HTTP status (`404` → `not_found`); a status without its own code is
    /// `bad_request` below 500 and `internal` from 500.
    pub fn for_status(status: u16) -> Self {
        match status {
            401 => ErrorCode::Unauthorized,
            403 => ErrorCode::Forbidden,
            404 => ErrorCode::NotFound,
            405 => ErrorCode::MethodNotAllowed,
            409 => ErrorCode::Conflict,
            413 => ErrorCode::PayloadTooLarge,
            415 => ErrorCode::UnsupportedMediaType,
            429 => ErrorCode::TooManyRequests,
            503 => ErrorCode::Unavailable,
            s if s >= 500 => ErrorCode::Internal,
            _ => ErrorCode::BadRequest,
        }
    }
}

/// Every failure of `/api/v1`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = Error))]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// What failed, and what to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorDetail {
    pub code: ErrorCode,
    /// What is wrong and how to fix it.
    pub message: String,
    /// Only on a 400 that names its field: the key path of the bad field, e.g.
    /// `environment` or `artifacts[0].sha256`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

impl ErrorBody {
    pub fn new(code: ErrorCode, message: impl Into<String>, field: Option<String>) -> Self {
        ErrorBody {
            error: ErrorDetail {
                code,
                message: message.into(),
                field,
            },
        }
    }
}
