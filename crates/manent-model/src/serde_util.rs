//! Owns the serde helpers of the model: human durations (`10s`, `5m`, `250ms`, also when
//! optional) and values written empty (`checks:` with nothing under it) read as defaults.

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

/// What a duration looks like, in type errors.
const DURATION_EXPECTED: &str = "a duration such as 10s, 5m, 1h or 250ms";

/// `#[serde(with = "serde_util::duration")]`: a `Duration` written `10s`.
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

/// `#[serde(with = "serde_util::opt_duration")]`: an optional `Duration` written `10s`.
pub(crate) mod opt_duration {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(
        value: &Option<Duration>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(value) => super::duration::serialize(value, serializer),
            None => serializer.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Duration>, D::Error> {
        deserializer.deserialize_option(OptionVisitor)
    }

    struct OptionVisitor;

    impl<'de> Visitor<'de> for OptionVisitor {
        type Value = Option<Duration>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str(DURATION_EXPECTED)
        }

        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(
            self,
            deserializer: D,
        ) -> Result<Self::Value, D::Error> {
            super::duration::deserialize(deserializer).map(Some)
        }
    }
}

struct DurationVisitor;

impl Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(DURATION_EXPECTED)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Duration, E> {
        humantime::parse_duration(text.trim()).map_err(|err| {
            E::custom(format_args!(
                "invalid duration {text:?} ({err}); write it like 10s, 5m, 1h or 250ms"
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
        #[serde(with = "opt_duration", default)]
        o: Option<Duration>,
    }

    fn check(yaml: &str, expected: Result<(Duration, Option<Duration>), &str>) {
        let parsed = yaml_serde::from_str::<D>(yaml)
            .map(|d| (d.d, d.o))
            .map_err(|e| e.to_string());
        assert_eq!(parsed, expected.map_err(str::to_owned), "{yaml}");
    }

    #[test]
    fn durations() {
        check("d: 10s", Ok((Duration::from_secs(10), None)));
        check(
            "d: 1m 30s\no: 250ms",
            Ok((Duration::from_secs(90), Some(Duration::from_millis(250)))),
        );
        check("d: 1s\no:", Ok((Duration::from_secs(1), None)));
        check(
            "d: 30",
            Err(
                "d: invalid duration \"30\" (time unit needed, for example 30sec or 30ms); write it like 10s, 5m, 1h or 250ms at line 1 column 4",
            ),
        );
        check(
            "d: 1s\no: [5]",
            Err(
                "o: invalid type: sequence, expected a duration such as 10s, 5m, 1h or 250ms at line 2 column 4",
            ),
        );
    }

    #[test]
    fn durations_round_trip() {
        let value = D {
            d: Duration::from_secs(90),
            o: Some(Duration::from_millis(1500)),
        };
        let json = serde_json::to_string(&value).unwrap();
        assert_eq!(json, r#"{"d":"1m 30s","o":"1s 500ms"}"#);
        assert_eq!(serde_json::from_str::<D>(&json).unwrap(), value);
    }
}
