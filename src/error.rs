//! The library's error type.
//!
//! Every message says *what* went wrong and *where*; paths go last (rerun's rule), so
//! a user reading `attnlab: ...` in a terminal or in the app can act on it.

use std::path::PathBuf;

/// Errors returned by the attnlab library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A preset failed to parse or validate; `key` is the dotted path of the offending field.
    #[error("invalid preset: {key} = {value}: {reason}")]
    Preset {
        key: String,
        value: String,
        reason: String,
    },
    /// A preset or sweep file (`what` says which) is not valid TOML or does not match the
    /// schema.
    #[error("cannot read {what} {path}: {message}")]
    PresetSyntax {
        what: &'static str,
        path: PathBuf,
        message: String,
    },
    /// A device was requested that this build cannot provide.
    #[error("{0}")]
    Device(String),
    /// The loss or a parameter became NaN or infinite and training stopped; no checkpoint with
    /// a non-finite value is ever written. `kept` says which checkpoint the run folder still
    /// holds (set by the run, which knows; `None` without a run folder).
    #[error(
        "training diverged at step {step}: {what}{}",
        .kept.as_ref().map_or(String::new(), |k| format!("; {k}"))
    )]
    Diverged {
        step: usize,
        what: String,
        kept: Option<String>,
    },
    /// A run would need more memory than the machine (or its GPU) has; says how much, where,
    /// and what to lower.
    #[error("this run needs {needs}, more than the {available}; lower {lower}")]
    TooLarge {
        needs: String,
        available: String,
        lower: &'static str,
    },
    /// The device ran out of memory during a run; says what the run needs.
    #[error(
        "the device ran out of memory ({cause}); this run needs {needs}: lower train.batch_size, \
         task.seq_len or model.d_model (attnlab check shows the estimate)"
    )]
    OutOfMemory { cause: String, needs: String },
    /// A run folder or one of its files is missing or malformed.
    #[error("{message}: {path}")]
    RunDir { message: String, path: PathBuf },
    #[error("{context}: {cause}: {path}")]
    Io {
        context: String,
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// Work stopped because its cancel flag was set (the window's Cancel, Ctrl-C); what was
    /// finished before is kept.
    #[error("cancelled")]
    Cancelled,
    /// A figure or a screenshot could not be drawn, rasterised or encoded, or was asked for
    /// in a format it cannot be saved in.
    #[error("{0}")]
    Figure(String),
    /// A state that the code should make impossible (a frozen model asked to train, a
    /// worker thread that panicked): a bug to report, never a user's mistake.
    #[error("{0} (an internal error: please report it)")]
    Internal(String),
    /// An argument of a library call is out of range (a layer or head past the model, a
    /// length of 0, a test row past the last one generated). Reads as a sentence about the
    /// value, "{name} {value} {reason}": "head 9 does not exist: heads are 0..8"; `name`
    /// says which argument (with its command-line flag where it has one), so a front end
    /// can point at the field to fix.
    #[error("{name} {value} {reason}")]
    Argument {
        name: String,
        value: String,
        reason: String,
    },
    /// A name that is not among the known ones (an encoding, a shipped preset); lists them.
    #[error("unknown {what} '{name}', expected one of: {expected}")]
    Unknown {
        what: &'static str,
        name: String,
        expected: String,
    },
    /// A combination the code does not handle, each part valid alone (Linformer evaluated
    /// in blocks of queries, a classification run extrapolated, a replica group resumed).
    #[error("{what} is not supported: {reason}")]
    Unsupported { what: String, reason: String },
    /// The data a task or an evaluation reads is too small or unreadable (a corpus split
    /// without text, a validation stream shorter than the lengths asked); says what to raise.
    #[error("{0}")]
    Data(String),
    /// The system would not start a thread (the window's background task, a training run).
    #[error("cannot start a thread for {name}: {cause}")]
    Thread { name: String, cause: std::io::Error },
    /// Runs failed whose errors were reported where they happened and come here as text,
    /// since an `Error` cannot be cloned: the replicas of a group after the first (the first
    /// holds the error itself), a sweep's failed cells.
    #[error("{0}")]
    Failed(String),
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A preset error for `key`, naming the bad `value` and what would be accepted.
    pub fn preset(key: impl Into<String>, value: impl ToString, reason: impl Into<String>) -> Self {
        Self::Preset {
            key: key.into(),
            value: value.to_string(),
            reason: reason.into(),
        }
    }

    /// An argument error: `name` `value` `reason` reads as a sentence, e.g.
    /// `Error::argument("layer", 0, "has no attention")`.
    pub fn argument(
        name: impl Into<String>,
        value: impl ToString,
        reason: impl Into<String>,
    ) -> Self {
        Self::Argument {
            name: name.into(),
            value: value.to_string(),
            reason: reason.into(),
        }
    }

    /// A combination that is not supported: `what` was asked, `reason` says why it cannot be.
    pub fn unsupported(what: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Unsupported {
            what: what.into(),
            reason: reason.into(),
        }
    }

    /// Wraps an I/O error with what we were doing and the path involved.
    pub fn io(
        context: impl Into<String>,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Self::Io {
            context: context.into(),
            path: path.into(),
            cause: source,
        }
    }
}

/// A number as an error shows it: as written for everyday magnitudes, with an exponent past
/// them, so that a value refused for its range reads `1e308` (not its 309 digits) and
/// `1e-300` (not 300 zeros).
pub(crate) fn number(value: f64) -> String {
    let everyday = (1e-5..1e16).contains(&value.abs());
    match value == 0.0 || everyday || !value.is_finite() {
        true => value.to_string(),
        false => format!("{value:e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_far_from_one_are_shown_with_an_exponent() {
        let cases = [
            (1e308, "1e308"),
            (-1e20, "-1e20"),
            (1e-300, "1e-300"),
            (5e-324, "5e-324"),
            (1e12, "1000000000000"),
            (0.25, "0.25"),
            (0.0, "0"),
            (10.0, "10"),
            (f64::INFINITY, "inf"),
        ];
        for (value, shown) in cases {
            assert_eq!(number(value), shown);
        }
        let err = Error::preset("train.weight_decay", number(1e308), "must be in [0, 10]");
        assert_eq!(
            err.to_string(),
            "invalid preset: train.weight_decay = 1e308: must be in [0, 10]"
        );
    }
}
