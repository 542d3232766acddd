//! Go's duration syntax (`time.ParseDuration`), as etcd's flags and
//! `--auth-token` options take it.

use std::time::Duration;

/// Why a duration does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Nothing to parse.
    #[error("empty duration")]
    Empty,
    /// A number without a unit.
    #[error("missing unit in {0:?}")]
    MissingUnit(String),
    /// Not a number where one was expected.
    #[error("invalid duration {0:?}")]
    Invalid(String),
    /// A unit Go does not know.
    #[error("unknown unit {unit:?} in duration {input:?}")]
    UnknownUnit {
        /// The unit.
        unit: String,
        /// The whole input.
        input: String,
    },
}

/// Parses a Go duration ("10m", "1s", "1m30s", "250ms").
pub fn parse_go_duration(s: &str) -> Result<Duration, DurationError> {
    let mut total = Duration::ZERO;
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(DurationError::Empty);
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| DurationError::MissingUnit(s.to_string()))?;
        let value: f64 = rest[..digits]
            .parse()
            .map_err(|_| DurationError::Invalid(s.to_string()))?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            other => {
                return Err(DurationError::UnknownUnit {
                    unit: other.to_string(),
                    input: s.to_string(),
                })
            }
        };
        total += Duration::from_secs_f64(value * seconds);
        rest = &rest[unit_len..];
    }
    Ok(total)
}
