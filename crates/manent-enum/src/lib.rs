//! manent's string enums: one macro, [`string_enum!`], for the two kinds of enum whose
//! values are written as text. An **open** enum (the API contract's statuses, phases,
//! kinds) keeps a value this build does not know as `Other(text)`: a newer server's value
//! reaches an older CLI intact. A **closed** enum (the engine's stored statuses) has only
//! its variants: a stored value it does not know is damage, refused with [`UnknownValue`]
//! (ARCHITECTURE.md, invariant 10). The crates that call it depend on `serde` (and the
//! contract, behind its `openapi` feature, on `utoipa`).

/// A value a closed [`string_enum!`] does not know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownValue {
    /// The enum's name.
    pub what: &'static str,
    /// The text read.
    pub value: String,
}

impl std::fmt::Display for UnknownValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unknown {} value `{}`", self.what, self.value)
    }
}

impl std::error::Error for UnknownValue {}

/// A string enum. Open: `Name, listed: BOOL, "description" { Variant = "text", … }`: known
/// values as variants, anything else kept as `Other(text)`; serde as the text; `listed`
/// says whether the OpenAPI schema (behind the caller's `openapi` feature) lists the known
/// values (`enum`) or is a plain string (an open set, such as a workflow's own phases).
/// Closed: `Name, closed { Variant = "text", … }`: `Copy`, only its variants; `FromStr`
/// refuses any other text with [`UnknownValue`]; serde as the text.
#[macro_export]
macro_rules! string_enum {
    (
        $(#[$meta:meta])*
        $name:ident, listed: $listed:literal, $description:literal {
            $($(#[$vmeta:meta])* $variant:ident = $text:literal),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
            /// A value this build does not know, kept as it was written.
            Other(String),
        }

        impl $name {
            /// Every value this build knows.
            pub const KNOWN: &'static [&'static str] = &[$($text),+];

            pub fn as_str(&self) -> &str {
                match self {
                    $($name::$variant => $text,)+
                    $name::Other(text) => text,
                }
            }
        }

        impl From<&str> for $name {
            fn from(text: &str) -> Self {
                match text {
                    $($text => $name::$variant,)+
                    other => $name::Other(other.to_string()),
                }
            }
        }

        impl From<String> for $name {
            fn from(text: String) -> Self {
                match $name::from(text.as_str()) {
                    $name::Other(_) => $name::Other(text),
                    known => known,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.as_str() == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                String::deserialize(deserializer).map($name::from)
            }
        }

        #[cfg(feature = "openapi")]
        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                let schema = utoipa::openapi::schema::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::String)
                    .description(Some($description));
                if $listed {
                    schema.enum_values(Some(Self::KNOWN.iter().copied())).into()
                } else {
                    schema.into()
                }
            }
        }

        #[cfg(feature = "openapi")]
        impl utoipa::ToSchema for $name {}
    };
    (
        $(#[$meta:meta])*
        $name:ident, closed { $($variant:ident = $text:literal),+ $(,)? }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        pub enum $name { $(#[serde(rename = $text)] $variant),+ }

        impl $name {
            /// Every value this build knows.
            pub const KNOWN: &'static [&'static str] = &[$($text),+];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = $crate::UnknownValue;
            fn from_str(s: &str) -> Result<Self, $crate::UnknownValue> {
                match s {
                    $($text => Ok($name::$variant),)+
                    other => Err($crate::UnknownValue {
                        what: stringify!($name),
                        value: other.to_string(),
                    }),
                }
            }
        }
    };
}
