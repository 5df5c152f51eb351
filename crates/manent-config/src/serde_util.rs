//! Owns how the configuration model writes durations (`30s`, `5m`, `1h`, `250ms`), over the
//! shared helpers of [`crate::yaml`].

use std::time::Duration;

#[cfg(test)]
use serde::Deserialize;
use serde::Deserializer;

use crate::yaml;

/// `#[serde(with = "serde_util::duration")]`: a `Duration` written `30s`, `5m`, `1h`, `250ms`.
pub(crate) mod duration {
    use super::*;

    pub(crate) use crate::yaml::serialize_duration as serialize;

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Duration, D::Error> {
        yaml::deserialize_duration(deserializer, DURATIONS)
    }
}

/// The text of the `expected` part of duration type errors; [`crate::error`] recognises it.
pub(crate) const DURATION_EXPECTED: &str = "a duration such as 30s, 5m, 1h or 250ms";

const DURATIONS: yaml::DurationText = yaml::DurationText {
    expected: DURATION_EXPECTED,
    examples: "30s, 5m, 1h or 250ms",
};

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
            assert_eq!(back, parsed, "a duration reads back as written");
        }
    }

    #[test]
    fn bare_numbers_are_not_durations() {
        let err = serde_json::from_value::<D>(serde_json::json!({ "d": 30 })).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid type: integer `30`, expected a duration such as 30s, 5m, 1h or 250ms",
            "a number without a unit is refused in words"
        );
    }
}
