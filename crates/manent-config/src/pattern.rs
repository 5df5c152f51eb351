//! Owns the glob patterns of routed queue matches (`ml/*`, `trainer`, `staging-?`): `*`
//! matches any run of characters (`/` included), `?` one character, everything else itself;
//! and what makes an application pattern valid (qualified with its tenant).

/// Whether `text` matches the glob `pattern` (case-sensitive, whole text).
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let text: Vec<char> = text.chars().collect();
    let (mut p, mut t) = (0, 0);
    // Where the last `*` was, and the text position it currently stands for.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(&c) if c == '?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                // Let the last `*` swallow one more character and retry.
                Some((star_p, star_t)) => {
                    p = star_p + 1;
                    t = star_t + 1;
                    star = Some((star_p, star_t + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

/// Checks an application pattern (a queue's `match.applications`, an API token's scope):
/// `*`, or qualified with the tenant (`ml/*`, `ml/trainer`). The error says what to write.
pub fn check_application_pattern(pattern: &str) -> Result<(), String> {
    if pattern.trim().is_empty() {
        return Err("empty application pattern: write e.g. `ml/*`".into());
    }
    if pattern == "*" {
        return Ok(());
    }
    match pattern.split_once('/') {
        Some((tenant, _)) if !tenant.is_empty() => Ok(()),
        Some(_) => Err(format!(
            "application pattern `{pattern}` names no tenant before `/`; write e.g. `ml/*`"
        )),
        None => Err(format!(
            "application pattern `{pattern}` is not qualified with the tenant; write e.g. \
             `{pattern}/*` (all of tenant {pattern}'s applications) or `ml/{pattern}`"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::{check_application_pattern, glob_match};

    #[test]
    fn an_application_pattern_must_name_its_tenant() {
        for ok in ["*", "ml/*", "ml/trainer", "*/api"] {
            assert!(check_application_pattern(ok).is_ok(), "`{ok}` is valid");
        }
        let message = check_application_pattern("shop").unwrap_err();
        assert!(
            message.contains("`shop/*`"),
            "a bare tenant is refused with a hint to write `shop/*`: {message}"
        );
        assert!(
            check_application_pattern("/web").is_err(),
            "an empty tenant is refused"
        );
        assert!(check_application_pattern(" ").is_err(), "blank is refused");
    }

    #[test]
    fn globs() {
        for (pattern, text, expected) in [
            ("ml/*", "ml/trainer", true),
            ("ml/*", "ml/", true),
            ("ml/*", "mlx/trainer", false),
            ("ml/*", "web/ml", false),
            ("*", "anything/at/all", true),
            ("*", "", true),
            ("trainer", "trainer", true),
            ("trainer", "trainer2", false),
            ("staging-?", "staging-1", true),
            ("staging-?", "staging-12", false),
            ("*/api", "web/api", true),
            ("*/api", "web/api2", false),
            ("a*b*c", "aXXbYYc", true),
            ("a*b*c", "aXXbYY", false),
            ("", "", true),
            ("", "x", false),
        ] {
            assert_eq!(glob_match(pattern, text), expected, "{pattern} ~ {text}");
        }
    }
}
