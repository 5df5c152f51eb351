//! Owns how the model writes durations (`10s`, `5m`, `250ms`, also when optional), over the
//! shared helpers of [`manent_config::yaml`], which also reads values written empty
//! (`checks:` with nothing under it) as defaults.

use std::time::Duration;

use manent_config::yaml;
#[cfg(test)]
use serde::Deserialize;
use serde::Deserializer;

pub(crate) use manent_config::yaml::nullable;

/// What a duration looks like, in messages.
const DURATIONS: yaml::DurationText = yaml::DurationText {
    expected: "a duration such as 10s, 5m, 1h or 250ms",
    examples: "10s, 5m, 1h or 250ms",
};

/// `#[serde(with = "serde_util::duration")]`: a `Duration` written `10s`.
pub(crate) mod duration {
    use super::*;

    pub(crate) use manent_config::yaml::serialize_duration as serialize;

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Duration, D::Error> {
        yaml::deserialize_duration(deserializer, DURATIONS)
    }
}

/// `#[serde(with = "serde_util::opt_duration")]`: an optional `Duration` written `10s`.
pub(crate) mod opt_duration {
    use super::*;

    pub(crate) use manent_config::yaml::serialize_opt_duration as serialize;

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Duration>, D::Error> {
        yaml::deserialize_opt_duration(deserializer, DURATIONS)
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
        assert_eq!(
            json, r#"{"d":"1m 30s","o":"1s 500ms"}"#,
            "durations are written in words"
        );
        assert_eq!(
            serde_json::from_str::<D>(&json).unwrap(),
            value,
            "and read back"
        );
    }
}
