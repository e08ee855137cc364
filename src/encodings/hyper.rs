//! The numeric settings of an encoding with their valid ranges (each encoding's list is in its
//! entry of the catalogue): they drive preset validation, the CLI's `--set` and the GUI's
//! sliders. Values are read and written through serde, so the lists are the only per-setting
//! code.

use super::EncodingSpec;
use crate::{Error, Result};

/// A numeric setting of an encoding.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hyperparameter {
    /// The key under `[encoding]`.
    pub key: &'static str,
    pub min: f64,
    pub max: f64,
    /// Whole numbers only.
    pub integer: bool,
    /// Best moved on a logarithmic slider.
    pub log_scale: bool,
    pub help: &'static str,
}

pub(super) const fn real(
    key: &'static str,
    min: f64,
    max: f64,
    help: &'static str,
) -> Hyperparameter {
    Hyperparameter {
        key,
        min,
        max,
        integer: false,
        log_scale: false,
        help,
    }
}

pub(super) const fn log(
    key: &'static str,
    min: f64,
    max: f64,
    help: &'static str,
) -> Hyperparameter {
    Hyperparameter {
        log_scale: true,
        ..real(key, min, max, help)
    }
}

pub(super) const fn int(
    key: &'static str,
    min: f64,
    max: f64,
    help: &'static str,
) -> Hyperparameter {
    Hyperparameter {
        integer: true,
        log_scale: true,
        ..real(key, min, max, help)
    }
}

impl EncodingSpec {
    fn as_table(&self) -> Result<toml::Table> {
        toml::Table::try_from(self)
            .map_err(|e| Error::Internal(format!("cannot serialise encoding {}: {e}", self.name())))
    }

    /// The current value of setting `key`, `None` when it is unset (e.g. DIET-ABS's rank,
    /// which then follows the model).
    pub fn value(&self, key: &str) -> Option<f64> {
        match self.as_table().ok()?.get(key)? {
            toml::Value::Integer(i) => Some(*i as f64),
            toml::Value::Float(f) => Some(*f),
            _ => None,
        }
    }

    /// A copy with setting `key` set to `value`, checked against its range.
    pub fn with_value(&self, key: &str, value: f64) -> Result<Self> {
        let hyper = self
            .hyperparameters()
            .iter()
            .find(|h| h.key == key)
            .ok_or_else(|| self.no_such_setting(key, value))?;
        hyper.check(value)?;
        let item = if hyper.integer {
            toml::Value::Integer(value as i64)
        } else {
            toml::Value::Float(value)
        };
        self.with_toml(key, item)
    }

    /// A copy with any setting (numeric or not, e.g. `sharing = "layerwise"`) set from text
    /// read as a TOML value, then validated.
    pub fn with_setting(&self, key: &str, raw: &str) -> Result<Self> {
        let value = parse_value(raw);
        if !self.as_table()?.contains_key(key)
            && self.hyperparameters().iter().all(|h| h.key != key)
        {
            return Err(self.no_such_setting(key, raw));
        }
        let spec = self.with_toml(key, value)?;
        spec.validate_ranges()?;
        Ok(spec)
    }

    fn with_toml(&self, key: &str, value: toml::Value) -> Result<Self> {
        let mut table = self.as_table()?;
        let shown = value.to_string();
        table.insert(key.to_string(), value);
        table
            .try_into()
            .map_err(|e| Error::preset(format!("encoding.{key}"), shown, e.to_string()))
    }

    fn no_such_setting(&self, key: &str, value: impl ToString) -> Error {
        let mut keys: Vec<String> = self
            .as_table()
            .map(|t| t.keys().filter(|k| *k != "kind").cloned().collect())
            .unwrap_or_default();
        for h in self.hyperparameters() {
            if !keys.iter().any(|k| k == h.key) {
                keys.push(h.key.to_string());
            }
        }
        keys.sort();
        let has = if keys.is_empty() {
            "it has no settings".to_string()
        } else {
            format!("it has: {}", keys.join(", "))
        };
        Error::preset(
            format!("encoding.{key}"),
            value,
            format!("{} has no such setting ({has})", self.name()),
        )
    }

    /// Every set value within its range.
    pub(super) fn validate_ranges(&self) -> Result<()> {
        for hyper in self.hyperparameters() {
            if let Some(value) = self.value(hyper.key) {
                hyper.check(value)?;
            }
        }
        Ok(())
    }
}

/// `raw` as a TOML value (`3e-3`, `true`, `"x"`), or as a string when it is not valid TOML
/// (`layerwise`), the way `--set` reads values.
pub fn parse_value(raw: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.trim().to_string()))
}

impl Hyperparameter {
    /// `value` is finite, in range, and whole where it must be.
    pub fn check(&self, value: f64) -> Result<()> {
        let whole = !self.integer || value.fract() == 0.0;
        if value.is_finite() && whole && (self.min..=self.max).contains(&value) {
            return Ok(());
        }
        let kind = if self.integer {
            "a whole number"
        } else {
            "a number"
        };
        Err(Error::preset(
            format!("encoding.{}", self.key),
            value,
            format!(
                "must be {kind} in {}..={} ({})",
                self.min, self.max, self.help
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_is_within_its_ranges() {
        for spec in EncodingSpec::all_defaults() {
            spec.validate_ranges().unwrap();
        }
    }

    #[test]
    fn values_are_read_and_written_through_serde() {
        let spec = EncodingSpec::from_name("leaky-rerope").unwrap();
        assert_eq!(spec.value("window"), Some(16.0));
        let wider = spec.with_value("window", 32.0).unwrap();
        assert_eq!(wider.value("window"), Some(32.0));
        assert_eq!(wider.value("scale"), Some(16.0));
    }

    #[test]
    fn non_numeric_settings_are_read_as_toml() {
        let spec = EncodingSpec::from_name("diet-rel").unwrap();
        let shared = spec.with_setting("sharing", "layerwise").unwrap();
        assert!(!shared.is_per_layer() && spec.is_per_layer());
        let sandwich = EncodingSpec::from_name("sandwich").unwrap();
        assert_eq!(
            sandwich
                .with_setting("per_head", "true")
                .unwrap()
                .value("k"),
            Some(1.0)
        );
        assert!(sandwich.with_setting("per_head", "maybe").is_err());
        assert!(sandwich.with_setting("k", "-1").is_err());
    }

    #[test]
    fn out_of_range_values_name_the_key_and_the_range() {
        let spec = EncodingSpec::from_name("kerple-power").unwrap();
        let err = spec.with_value("r", 3.0).unwrap_err().to_string();
        assert!(
            err.contains("encoding.r = 3") && err.contains("0.01..=2"),
            "{err}"
        );
        let err = spec.with_value("slope", 1.0).unwrap_err().to_string();
        assert!(err.contains("has no such setting (it has: k, r)"), "{err}");
        let window = EncodingSpec::from_name("window").unwrap();
        assert!(window.with_value("width", 2.5).is_err());
    }
}
