//! Owns the glob patterns of routed queue matches (`ml/*`, `trainer`, `staging-?`): `*`
//! matches any run of characters (`/` included), `?` one character, everything else itself.

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

#[cfg(test)]
mod tests {
    use super::glob_match;

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
