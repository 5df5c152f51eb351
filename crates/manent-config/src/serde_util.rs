//! Owns the serde helpers of the configuration model: human durations (`30s`, `5m`, `1h`,
//! `250ms`) and sections or lists written empty (`dbos:` with every key commented out).

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, Unexpected, Visitor};
use serde::{Deserialize, Serializer};

/// Deserializes `T`, reading an empty (null) value as `T::default()`.
pub(crate) fn nullable<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// `#[serde(with = "serde_util::duration")]`: a `Duration` written `30s`, `5m`, `1h`, `250ms`.
pub(crate) mod duration {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(
        value: &Duration,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&humantime::format_duration(*value).to_string())
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Duration, D::Error> {
        deserializer.deserialize_str(DurationVisitor)
    }
}

/// The text of the `expected` part of duration type errors; [`crate::error`] recognises it.
pub(crate) const DURATION_EXPECTED: &str = "a duration such as 30s, 5m, 1h or 250ms";

struct DurationVisitor;

impl Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(DURATION_EXPECTED)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Duration, E> {
        humantime::parse_duration(text.trim()).map_err(|err| {
            E::custom(format_args!(
                "invalid duration {text:?} ({err}); write it like 30s, 5m, 1h or 250ms"
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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize, serde::Serialize, PartialEq)]
    struct D {
        #[serde(with = "duration")]
        d: Duration,
    }

    #[test]
    fn durations_round_trip() {
        for (text, expected) in [
            ("30s", Duration::from_secs(30)),
            ("5m", Duration::from_secs(300)),
            ("1h", Duration::from_secs(3600)),
            ("250ms", Duration::from_millis(250)),
            ("1m 30s", Duration::from_secs(90)),
        ] {
            let parsed: D = serde_json::from_value(serde_json::json!({ "d": text })).unwrap();
            assert_eq!(parsed.d, expected, "{text}");
            let back: D = serde_json::from_value(serde_json::to_value(&parsed).unwrap()).unwrap();
            assert_eq!(back, parsed);
        }
    }

    #[test]
    fn bare_numbers_are_not_durations() {
        let err = serde_json::from_value::<D>(serde_json::json!({ "d": 30 })).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid type: integer `30`, expected a duration such as 30s, 5m, 1h or 250ms"
        );
    }
}
