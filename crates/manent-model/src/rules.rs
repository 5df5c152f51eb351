//! Owns the rules on single values shared by descriptors and environment files: names,
//! `tenant/app`, artifact names, versions, URLs, sha256, placeholders in templates, RFC 3339
//! times, cron expressions, time zone names and one-line reasons. Each rule returns what to
//! do when it fails.

/// Letters, digits, `-`, `_`, `.`: the characters of tenants, apps, environments, targets.
pub(crate) fn name(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("is empty; write a name of letters, digits, `-`, `_` or `.`".to_owned());
    }
    if let Some(c) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "contains {c:?}; use only letters, digits, `-`, `_` and `.`"
        ));
    }
    if value == "." || value == ".." {
        return Err("cannot be `.` or `..`; use a real name".to_owned());
    }
    Ok(())
}

/// `tenant/app`, each part a [`name`].
pub(crate) fn application(value: &str) -> Result<(), String> {
    let Some((tenant, app)) = value.split_once('/') else {
        return Err(format!(
            "must be qualified with its tenant, as `tenant/app` (e.g. `ml/{value}`)"
        ));
    };
    name(tenant).map_err(|e| format!("tenant part {e}"))?;
    name(app).map_err(|e| format!("application part {e}"))
}

/// An artifact name is a file name on the targets: no `/`, `\`, `..` or control character.
pub(crate) fn artifact_name(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("is empty; name the artifact (it is its file name on the targets)".to_owned());
    }
    if value.contains(['/', '\\']) || value.contains("..") || value == "." {
        return Err(
            "is used as a file name on the targets: remove `/`, `\\` and `..` from it".to_owned(),
        );
    }
    if value.chars().any(char::is_control) {
        return Err("contains a control character; remove it".to_owned());
    }
    refuse_invisible(value)
}

/// Refuses characters that change how a name reads without showing (U+202E and the other
/// bidirectional controls, zero-width ones): an approver must read the name that is
/// deployed.
fn refuse_invisible(value: &str) -> Result<(), String> {
    match value.chars().find(|c| is_invisible_or_bidi(*c)) {
        Some(c) => Err(format!(
            "contains U+{:04X}, an invisible or direction-changing character; remove it",
            u32::from(c)
        )),
        None => Ok(()),
    }
}

/// A version may be expanded into paths (`{version}` in `dest`): no `/`, `\`, `..`, spaces,
/// and no leading `.`: as a release directory `.` is the releases directory itself and
/// `.shared` a hidden one beside the releases (docs/environments.md, "Release
/// directories"), which `keep_releases` and `shared` must never take for a release.
pub(crate) fn version(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("is empty; write the artifact's version, e.g. \"1.4.2\"".to_owned());
    }
    if value.starts_with('.') {
        return Err(
            "starts with `.`: as a release directory ({version} in dest) it would be hidden \
             or the releases directory itself; start it with a letter or digit, e.g. \"1.4.2\""
                .to_owned(),
        );
    }
    if value.contains(['/', '\\']) || value.contains("..") {
        return Err("can be expanded into paths ({version}): remove `/`, `\\` and `..`".to_owned());
    }
    if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("contains a space or a control character; remove it".to_owned());
    }
    refuse_invisible(value)
}

/// The most characters an `irreversible` reason may have: a sentence, shown in a refusal
/// and a table cell, not a document.
pub(crate) const REASON_MAX_CHARS: usize = 200;

/// A one-line reason a person reads in a refusal (`irreversible: "…"`): not empty, at most
/// [`REASON_MAX_CHARS`] characters, one line, no control or invisible character.
pub(crate) fn reason(value: &str) -> Result<(), String> {
    if value.trim().is_empty() {
        return Err(
            "is empty; say in a few words why this deploy cannot be undone (e.g. \
             \"drops column users.legacy_name\"), or remove the field"
                .to_owned(),
        );
    }
    if value.eq_ignore_ascii_case("true") || value.eq_ignore_ascii_case("false") {
        // `irreversible: false` must not mark a deploy irreversible.
        return Err(format!(
            "is `{value}`, not a reason: the field marks the deploy by saying why it cannot be \
             undone (e.g. \"drops column users.legacy_name\"); remove it for a deploy that can"
        ));
    }
    let chars = value.chars().count();
    if chars > REASON_MAX_CHARS {
        return Err(format!(
            "is {chars} characters long; write at most {REASON_MAX_CHARS} (a sentence: it is \
             shown in refusals and tables; link to the details)"
        ));
    }
    if value.contains(['\n', '\r']) {
        return Err("spans several lines; write the reason on one line".to_owned());
    }
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return Err(format!(
            "contains the control character U+{:04X}; remove it",
            u32::from(c)
        ));
    }
    refuse_invisible(value)
}

/// Characters that change how text reads without showing (bidirectional overrides and
/// isolates, direction marks, the zero-width ones): a URL an approver reads must be the
/// URL that is fetched.
fn is_invisible_or_bidi(c: char) -> bool {
    matches!(c,
        '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2069}'
        | '\u{061C}' | '\u{FEFF}')
}

/// `file:///path`, `http://host/…` or `https://host/…`: no credentials, no `..;` path
/// parameter trick, nothing invisible.
pub(crate) fn url(value: &str) -> Result<(), String> {
    if let Some(c) = value
        .chars()
        .find(|&c| c.is_control() || is_invisible_or_bidi(c))
    {
        return Err(format!(
            "contains the invisible or direction-changing character U+{:04X}; a URL approvers \
             read must be the one fetched: remove it",
            u32::from(c)
        ));
    }
    let lower = value.to_ascii_lowercase();
    if lower.contains("..;")
        || lower.contains("%2e%2e;")
        || lower.contains(".%2e;")
        || lower.contains("%2e.;")
    {
        return Err(
            "contains `..;`, which some servers read as `..` (outside the allowed sources): \
             write the path without it"
                .to_owned(),
        );
    }
    if let Some(path) = value.strip_prefix("file://") {
        if path.is_empty() {
            return Err("has no path; write file:///absolute/path".to_owned());
        }
        return Ok(());
    }
    for scheme in ["http://", "https://"] {
        if let Some(rest) = value.strip_prefix(scheme) {
            let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
            if host.contains('@') {
                return Err(
                    "carries credentials (`user:password@`): a descriptor is stored and shown \
                     with its deploy; configure the source's credentials on the workers instead \
                     and remove them from the URL"
                        .to_owned(),
                );
            }
            if host.is_empty() {
                return Err(format!("has no host; write {scheme}HOST/PATH"));
            }
            if value.chars().any(char::is_whitespace) {
                return Err("contains a space; percent-encode it as %20".to_owned());
            }
            return Ok(());
        }
    }
    Err("must start with file://, http:// or https://; other schemes are not supported".to_owned())
}

/// 64 hexadecimal digits.
pub(crate) fn sha256(value: &str) -> Result<(), String> {
    if value.len() == 64 && value.chars().all(|c| c.is_ascii_hexdigit()) {
        Ok(())
    } else if value.chars().count() == 64 {
        let c = value
            .chars()
            .find(|c| !c.is_ascii_hexdigit())
            .unwrap_or_default();
        Err(format!(
            "contains {c:?}, which is not a hexadecimal digit (0-9, a-f); write the output of \
             `sha256sum FILE`"
        ))
    } else {
        Err(format!(
            "must be 64 hexadecimal digits (found {} characters); write the output of \
             `sha256sum FILE`",
            value.chars().count()
        ))
    }
}

/// Every `{placeholder}` of `template` is one of `allowed`.
pub(crate) fn placeholders(template: &str, allowed: &[&str]) -> Result<(), String> {
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        let after = &rest[start + 1..];
        let Some(end) = after.find('}') else { break };
        let name = &after[..end];
        if !allowed.contains(&name) {
            let list = allowed
                .iter()
                .map(|a| format!("{{{a}}}"))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(format!(
                "unknown placeholder `{{{name}}}`; the placeholders allowed here are {list}"
            ));
        }
        rest = &after[end + 1..];
    }
    Ok(())
}

/// Replaces each `{name}` of `template` by its value in `values`; others are left as written.
pub(crate) fn expand(template: &str, values: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        match after.find('}').and_then(|end| {
            values
                .iter()
                .find(|(k, _)| *k == &after[..end])
                .map(|kv| (end, kv))
        }) {
            Some((end, (_, value))) => {
                out.push_str(value);
                rest = &after[end + 1..];
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// An RFC 3339 date-time with its offset: `2025-03-01T02:00:00Z`, `2025-03-01T02:00:00+01:00`.
pub(crate) fn rfc3339(value: &str) -> Result<(), String> {
    const HINT: &str = "write an RFC 3339 time with its offset, e.g. 2025-03-01T02:00:00Z or \
                        2025-03-01T02:00:00+01:00";
    let bad = |what: &str| Err(format!("{what}; {HINT}"));
    let b = value.as_bytes();
    let digits = |range: std::ops::Range<usize>| -> Option<u32> {
        let part = b.get(range)?;
        if part.iter().all(u8::is_ascii_digit) {
            std::str::from_utf8(part).ok()?.parse().ok()
        } else {
            None
        }
    };
    let (Some(year), Some(month), Some(day)) = (digits(0..4), digits(5..7), digits(8..10)) else {
        return bad("is not a date-time");
    };
    if b.get(4) != Some(&b'-') || b.get(7) != Some(&b'-') {
        return bad("is not a date-time");
    }
    if !matches!(b.get(10), Some(b'T' | b't' | b' ')) {
        return bad("has no time (`T` after the date)");
    }
    let (Some(hour), Some(minute), Some(second)) = (digits(11..13), digits(14..16), digits(17..19))
    else {
        return bad("has no valid time HH:MM:SS");
    };
    if b.get(13) != Some(&b':') || b.get(16) != Some(&b':') {
        return bad("has no valid time HH:MM:SS");
    }
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return bad("has a month out of range"),
    };
    if day == 0 || day > days {
        return bad("has a day out of range");
    }
    if hour > 23 || minute > 59 || second > 60 {
        return bad("has a time out of range");
    }
    let mut rest = &value[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return bad("has an empty fraction of second");
        }
        rest = &frac[n..];
    }
    match rest.as_bytes() {
        [b'Z' | b'z'] => Ok(()),
        [b'+' | b'-', h1, h2, b':', m1, m2]
            if [h1, h2, m1, m2].iter().all(|c| c.is_ascii_digit())
                && (h1 - b'0') * 10 + (h2 - b'0') <= 23
                && (m1 - b'0') * 10 + (m2 - b'0') <= 59 =>
        {
            Ok(())
        }
        [] => bad("has no offset (add Z for UTC, or +HH:MM)"),
        _ => bad("has an invalid offset"),
    }
}

/// A five-field cron expression (`minute hour day-of-month month day-of-week`), or one of
/// `@yearly`, `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight`, `@hourly`.
pub(crate) fn cron(value: &str) -> Result<(), String> {
    const MACROS: [&str; 7] = [
        "@yearly",
        "@annually",
        "@monthly",
        "@weekly",
        "@daily",
        "@midnight",
        "@hourly",
    ];
    let value = value.trim();
    if value.starts_with('@') {
        return if MACROS.contains(&value) {
            Ok(())
        } else {
            Err(format!(
                "unknown macro `{value}`; use one of {}",
                MACROS.join(", ")
            ))
        };
    }
    let fields: Vec<&str> = value.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(format!(
            "has {} fields; write five: minute hour day-of-month month day-of-week, e.g. \
             \"30 2 * * 1-5\"",
            fields.len()
        ));
    }
    const MONTHS: [&str; 12] = [
        "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
    ];
    const DAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];
    let specs: [(&str, u32, u32, &[&str], u32); 5] = [
        ("minute", 0, 59, &[], 0),
        ("hour", 0, 23, &[], 0),
        ("day-of-month", 1, 31, &[], 0),
        ("month", 1, 12, &MONTHS, 1),
        ("day-of-week", 0, 7, &DAYS, 0),
    ];
    for (field, (what, min, max, names, first)) in fields.iter().zip(specs) {
        cron_field(field, min, max, names, first)
            .map_err(|e| format!("{what} field `{field}` {e}"))?;
    }
    Ok(())
}

fn cron_field(field: &str, min: u32, max: u32, names: &[&str], first: u32) -> Result<(), String> {
    let value = |text: &str| -> Result<u32, String> {
        let n = match names.iter().position(|n| n.eq_ignore_ascii_case(text)) {
            Some(i) => i as u32 + first,
            None => text
                .parse::<u32>()
                .map_err(|_| format!("has `{text}`, not a number; use {min}-{max}"))?,
        };
        if n < min || n > max {
            return Err(format!("has {n}, out of range {min}-{max}"));
        }
        Ok(n)
    };
    for item in field.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((range, step)) => (range, Some(step)),
            None => (item, None),
        };
        if let Some(step) = step
            && step.parse::<u32>().map_or(true, |s| s == 0)
        {
            return Err(format!("has step `{step}`; write a whole number above 0"));
        }
        if range == "*" || (range == "?" && names.len() == 7) {
            continue;
        }
        match range.split_once('-') {
            Some((from, to)) => {
                if value(from)? > value(to)? {
                    return Err(format!("has range `{range}` backwards; write it low-high"));
                }
            }
            None => {
                value(range)?;
            }
        }
    }
    Ok(())
}

/// A time zone name as in the IANA database (`UTC`, `Europe/Paris`); whether it exists is
/// checked where schedules are computed.
pub(crate) fn timezone(value: &str) -> Result<(), String> {
    let ok = !value.is_empty()
        && !value.starts_with('/')
        && !value.contains("..")
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '_' | '-' | '+'));
    if ok {
        Ok(())
    } else {
        Err("is not a time zone name; write an IANA name such as UTC or Europe/Paris".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(rule: fn(&str) -> Result<(), String>, value: &str, expected: Result<(), &str>) {
        assert_eq!(rule(value), expected.map_err(str::to_owned), "{value:?}");
    }

    #[test]
    fn names() {
        check(name, "prod-eu_1.a", Ok(()));
        check(
            name,
            "",
            Err("is empty; write a name of letters, digits, `-`, `_` or `.`"),
        );
        check(
            name,
            "a b",
            Err("contains ' '; use only letters, digits, `-`, `_` and `.`"),
        );
        check(name, "..", Err("cannot be `.` or `..`; use a real name"));
        check(application, "ml/trainer", Ok(()));
        check(
            application,
            "trainer",
            Err("must be qualified with its tenant, as `tenant/app` (e.g. `ml/trainer`)"),
        );
        check(
            application,
            "ml/a/b",
            Err("application part contains '/'; use only letters, digits, `-`, `_` and `.`"),
        );
        check(
            application,
            "/x",
            Err("tenant part is empty; write a name of letters, digits, `-`, `_` or `.`"),
        );
    }

    #[test]
    fn artifact_names_and_versions() {
        check(artifact_name, "app.tar.gz", Ok(()));
        check(
            artifact_name,
            "../etc/passwd",
            Err("is used as a file name on the targets: remove `/`, `\\` and `..` from it"),
        );
        check(
            artifact_name,
            "a\\b",
            Err("is used as a file name on the targets: remove `/`, `\\` and `..` from it"),
        );
        check(
            artifact_name,
            "app\u{202E}zg.rat",
            Err("contains U+202E, an invisible or direction-changing character; remove it"),
        );
        check(
            version,
            "1.0\u{200B}",
            Err("contains U+200B, an invisible or direction-changing character; remove it"),
        );
        check(version, "1.4.2+build.7", Ok(()));
        for working in [
            "1",
            "v2.0.0-rc.1",
            "2026.12.05_1",
            "1.0.",
            "a.b",
            "-1",
            "1~beta",
        ] {
            check(version, working, Ok(()));
        }
        let leading_dot = "starts with `.`: as a release directory ({version} in dest) it would \
             be hidden or the releases directory itself; start it with a letter or digit, e.g. \
             \"1.4.2\"";
        for hidden in [".", ".shared", ".1.0", "..."] {
            check(version, hidden, Err(leading_dot));
        }
        check(
            version,
            "1\n.shared",
            Err("contains a space or a control character; remove it"),
        );
        check(
            version,
            "1\0",
            Err("contains a space or a control character; remove it"),
        );
        check(
            version,
            "",
            Err("is empty; write the artifact's version, e.g. \"1.4.2\""),
        );
        check(
            version,
            "1/2",
            Err("can be expanded into paths ({version}): remove `/`, `\\` and `..`"),
        );
        check(
            version,
            "1 2",
            Err("contains a space or a control character; remove it"),
        );
    }

    #[test]
    fn urls_and_digests() {
        check(url, "file:///srv/a.tgz", Ok(()));
        check(url, "https://repo.example/a.tgz", Ok(()));
        check(url, "http://h:8080", Ok(()));
        check(
            url,
            "https:///a",
            Err("has no host; write https://HOST/PATH"),
        );
        check(
            url,
            "file://",
            Err("has no path; write file:///absolute/path"),
        );
        check(
            url,
            "s3://bucket/a",
            Err("must start with file://, http:// or https://; other schemes are not supported"),
        );
        check(
            url,
            "https://user:secret@repo.example/a.tgz",
            Err(
                "carries credentials (`user:password@`): a descriptor is stored and shown with its deploy; configure the source's credentials on the workers instead and remove them from the URL",
            ),
        );
        for sneaky in [
            "https://repo.example/releases/..;/private/a.tgz",
            "https://repo.example/releases/%2E%2E;/a.tgz",
        ] {
            check(
                url,
                sneaky,
                Err(
                    "contains `..;`, which some servers read as `..` (outside the allowed sources): write the path without it",
                ),
            );
        }
        check(
            url,
            "https://repo.example/gpj.\u{202E}exe",
            Err(
                "contains the invisible or direction-changing character U+202E; a URL approvers read must be the one fetched: remove it",
            ),
        );
        check(sha256, &"aB".repeat(32), Ok(()));
        check(
            sha256,
            "abc",
            Err(
                "must be 64 hexadecimal digits (found 3 characters); write the output of `sha256sum FILE`",
            ),
        );
        check(
            sha256,
            &"g".repeat(64),
            Err(
                "contains 'g', which is not a hexadecimal digit (0-9, a-f); write the output of `sha256sum FILE`",
            ),
        );
    }

    #[test]
    fn templates() {
        let allowed = &["version", "target"];
        assert_eq!(
            placeholders("/opt/{version}/{target}", allowed),
            Ok(()),
            "known placeholders are accepted"
        );
        assert_eq!(
            placeholders("no braces", allowed),
            Ok(()),
            "text without placeholders is accepted"
        );
        assert_eq!(
            placeholders("/opt/{ver}", allowed),
            Err("unknown placeholder `{ver}`; the placeholders allowed here are {version}, {target}".to_owned()), "an unknown placeholder is named with the allowed ones");
        assert_eq!(
            expand(
                "/a/{version}/{x}/{target}{",
                &[("version", "1.0"), ("target", "web-1")]
            ),
            "/a/1.0/{x}/web-1{",
            "known placeholders are filled, unknown ones and a lone brace kept"
        );
    }

    #[test]
    fn times() {
        check(rfc3339, "2025-03-01T02:00:00Z", Ok(()));
        check(rfc3339, "2024-02-29t23:59:60.123+01:00", Ok(()));
        check(rfc3339, "2025-03-01 02:00:00-05:30", Ok(()));
        for (value, what) in [
            (
                "2025-03-01T02:00:00",
                "has no offset (add Z for UTC, or +HH:MM)",
            ),
            ("2025-02-29T02:00:00Z", "has a day out of range"),
            ("2025-13-01T02:00:00Z", "has a month out of range"),
            ("2025-03-01T24:00:00Z", "has a time out of range"),
            ("2025-03-01", "has no time (`T` after the date)"),
            ("tomorrow", "is not a date-time"),
            ("2025-03-01T02:00:00+1", "has an invalid offset"),
            ("2025-03-01T02:00:00.Z", "has an empty fraction of second"),
        ] {
            let expected = format!(
                "{what}; write an RFC 3339 time with its offset, e.g. 2025-03-01T02:00:00Z or \
                 2025-03-01T02:00:00+01:00"
            );
            assert_eq!(rfc3339(value), Err(expected), "{value}");
        }
    }

    #[test]
    fn crons() {
        check(cron, "30 2 * * 1-5", Ok(()));
        check(cron, "*/15 0-23/2 1,15 JAN-jun sun", Ok(()));
        check(cron, "@daily", Ok(()));
        check(
            cron,
            "@sometimes",
            Err(
                "unknown macro `@sometimes`; use one of @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly",
            ),
        );
        check(
            cron,
            "* * * *",
            Err(
                "has 4 fields; write five: minute hour day-of-month month day-of-week, e.g. \"30 2 * * 1-5\"",
            ),
        );
        check(
            cron,
            "60 * * * *",
            Err("minute field `60` has 60, out of range 0-59"),
        );
        check(
            cron,
            "* * 0 * *",
            Err("day-of-month field `0` has 0, out of range 1-31"),
        );
        check(
            cron,
            "*/0 * * * *",
            Err("minute field `*/0` has step `0`; write a whole number above 0"),
        );
        check(
            cron,
            "* 5-2 * * *",
            Err("hour field `5-2` has range `5-2` backwards; write it low-high"),
        );
        check(
            cron,
            "* * * foo *",
            Err("month field `foo` has `foo`, not a number; use 1-12"),
        );
        check(timezone, "Europe/Paris", Ok(()));
        check(timezone, "Etc/GMT+5", Ok(()));
        check(
            timezone,
            "../etc",
            Err("is not a time zone name; write an IANA name such as UTC or Europe/Paris"),
        );
    }
}
