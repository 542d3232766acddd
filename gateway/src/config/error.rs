//! Configuration errors.

use std::path::PathBuf;

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read configuration file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// TOML syntax or a value of the wrong type or format; the message names line and column.
    #[error("invalid configuration: {0}")]
    Syntax(String),
    /// A value that parses but breaks a rule.
    #[error("invalid configuration at line {line}, column {column}: {message}")]
    Invalid {
        /// 1-based line of the offending value.
        line: usize,
        /// 1-based column of the offending value.
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// A rule broken by flags (no line to name).
    #[error("invalid arguments: {0}")]
    Arguments(String),
}
