//! Owns the serde helpers shared by YAML documents: values written empty (`dbos:` with every
//! key commented out) read as defaults, and human durations (`30s`, `5m`, `1h`, `250ms`).

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, Unexpected, Visitor};
use serde::{Deserialize, Serializer};

/// Deserializes `T`, reading an empty (null) value as `T::default()`.
pub fn nullable<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// How a kind of document speaks of durations in its messages.
#[derive(Debug, Clone, Copy)]
pub struct DurationText {
    /// The `expected` part of type errors, e.g. `a duration such as 30s, 5m, 1h or 250ms`.
    pub expected: &'static str,
    /// The examples of the hint for a text that is not a duration, e.g. `30s, 5m, 1h or 250ms`.
    pub examples: &'static str,
}

/// Serializes a `Duration` as `humantime` writes it (`1m 30s`).
pub fn serialize_duration<S: Serializer>(
    value: &Duration,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&humantime::format_duration(*value).to_string())
}

/// Deserializes a `Duration` written `30s`, `5m`, `1h`, `250ms`; a bare number is refused.
pub fn deserialize_duration<'de, D: Deserializer<'de>>(
    deserializer: D,
    text: DurationText,
) -> Result<Duration, D::Error> {
    deserializer.deserialize_str(DurationVisitor(text))
}

/// Serializes an optional `Duration` like [`serialize_duration`], `None` as none.
pub fn serialize_opt_duration<S: Serializer>(
    value: &Option<Duration>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match value {
        Some(value) => serialize_duration(value, serializer),
        None => serializer.serialize_none(),
    }
}

/// Deserializes an optional `Duration` like [`deserialize_duration`]; empty is `None`.
pub fn deserialize_opt_duration<'de, D: Deserializer<'de>>(
    deserializer: D,
    text: DurationText,
) -> Result<Option<Duration>, D::Error> {
    deserializer.deserialize_option(OptionVisitor(text))
}

struct DurationVisitor(DurationText);

impl Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.expected)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Duration, E> {
        humantime::parse_duration(text.trim()).map_err(|err| {
            E::custom(format_args!(
                "invalid duration {text:?} ({err}); write it like {}",
                self.0.examples
            ))
        })
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Duration, E> {
        Err(E::invalid_type(Unexpected::Unsigned(value), &self))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Duration, E> {
        Err(E::invalid_type(Unexpected::Signed(value), &self))
    }
}

struct OptionVisitor(DurationText);

impl<'de> Visitor<'de> for OptionVisitor {
    type Value = Option<Duration>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.expected)
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserialize_duration(deserializer, self.0).map(Some)
    }
}
