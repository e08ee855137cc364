//! The settings of a `kind`-tagged preset section (`[encoding]`, `[attention]`) as data: each
//! variant's entry in its catalogue lists its numeric settings with their valid ranges and its
//! switches (on/off, or one of a few words). They drive preset validation, the CLI's `--set`
//! and listings, and the GUI's widgets. Values are read and written by key through serde, so
//! the lists are the only per-setting code.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{Error, Result};

/// A numeric setting of a section's variant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hyperparameter {
    /// The key under the section (`[encoding]`, `[attention]`).
    pub key: &'static str,
    pub min: f64,
    pub max: f64,
    /// Whole numbers only.
    pub integer: bool,
    /// Best moved on a logarithmic slider.
    pub log_scale: bool,
    pub help: &'static str,
}

/// A real-valued setting on a linear slider; [`Hyperparameter::log`] and
/// [`Hyperparameter::whole`] make the other kinds.
pub(crate) const fn real(
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

impl Hyperparameter {
    /// The same, best moved on a logarithmic slider (it spans orders of magnitude).
    pub(crate) const fn log(self) -> Self {
        Self {
            log_scale: true,
            ..self
        }
    }

    /// The same, whole numbers only (on a logarithmic slider: counts span orders of magnitude).
    pub(crate) const fn whole(self) -> Self {
        Self {
            integer: true,
            ..self.log()
        }
    }

    /// `value` is finite, in range, and whole where it must be; errors name `section.key`.
    pub fn check(&self, section: &str, value: f64) -> Result<()> {
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
            format!("{section}.{}", self.key),
            crate::error::number(value),
            format!(
                "must be {kind} in {}..={} ({})",
                self.min, self.max, self.help
            ),
        ))
    }
}

/// A variant's settings, as its catalogue entry lists them.
#[derive(Debug)]
pub struct Settings {
    /// The numeric ones, with their ranges.
    pub numbers: &'static [Hyperparameter],
    /// The others.
    pub switches: &'static [Switch],
}

impl Settings {
    /// No settings at all.
    pub(crate) const NONE: Self = Self::of(&[]);

    /// Every setting's key, numbers first.
    pub fn keys(&self) -> impl Iterator<Item = &'static str> {
        let numbers = self.numbers.iter().map(|h| h.key);
        numbers.chain(self.switches.iter().map(|s| s.key))
    }

    /// Numeric settings only.
    pub(crate) const fn of(numbers: &'static [Hyperparameter]) -> Self {
        Self {
            numbers,
            switches: &[],
        }
    }
}

/// A setting that is not a number: a checkbox or a pick among a few words in the GUI.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Switch {
    /// The key under the section.
    pub key: &'static str,
    /// What the GUI writes beside it.
    pub label: &'static str,
    pub choices: Choices,
}

/// The values a [`Switch`] takes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Choices {
    /// `true` or `false`.
    Toggle,
    /// One of these words, as the preset spells them.
    Words(&'static [&'static str]),
}

/// A preset section whose variant is picked by `kind` and whose settings its catalogue lists;
/// the provided methods read and write any of them by key.
pub trait Section: Serialize + DeserializeOwned {
    /// The section's name, the first part of every key an error names (`encoding`).
    const SECTION: &'static str;

    /// The variant's name, its `kind`.
    fn kind(&self) -> &'static str;

    /// The variant's settings, from its catalogue entry.
    fn settings(&self) -> &'static Settings;

    /// The variant's numeric settings.
    fn hyperparameters(&self) -> &'static [Hyperparameter] {
        self.settings().numbers
    }

    /// The variant's other settings.
    fn switches(&self) -> &'static [Switch] {
        self.settings().switches
    }

    /// The current value of setting `key`, `None` when it is unset (e.g. DIET-ABS's rank,
    /// which then follows the model) or not a number.
    fn value(&self, key: &str) -> Option<f64> {
        match table(self).ok()?.get(key)? {
            toml::Value::Integer(i) => Some(*i as f64),
            toml::Value::Float(f) => Some(*f),
            _ => None,
        }
    }

    /// The current value of switch `key` as the preset writes it (`true`, `layerwise`).
    fn word(&self, key: &str) -> Option<String> {
        match table(self).ok()?.get(key)? {
            toml::Value::String(s) => Some(s.clone()),
            toml::Value::Boolean(b) => Some(b.to_string()),
            _ => None,
        }
    }

    /// A copy with setting `key` set to `value`, checked against its range.
    fn with_value(&self, key: &str, value: f64) -> Result<Self> {
        let hyper = self
            .hyperparameters()
            .iter()
            .find(|h| h.key == key)
            .ok_or_else(|| no_such_setting(self, key, value))?;
        hyper.check(Self::SECTION, value)?;
        let item = if hyper.integer {
            toml::Value::Integer(value as i64)
        } else {
            toml::Value::Float(value)
        };
        with_toml(self, key, item)
    }

    /// A copy with any setting (numeric or not, e.g. `sharing = "layerwise"`) set from text
    /// read as a TOML value, then validated.
    fn with_setting(&self, key: &str, raw: &str) -> Result<Self> {
        let value = parse_value(raw);
        if !table(self)?.contains_key(key) && self.hyperparameters().iter().all(|h| h.key != key) {
            return Err(no_such_setting(self, key, raw));
        }
        let spec = with_toml(self, key, value)?;
        spec.validate_ranges()?;
        Ok(spec)
    }

    /// Every set value within its range.
    fn validate_ranges(&self) -> Result<()> {
        for hyper in self.hyperparameters() {
            if let Some(value) = self.value(hyper.key) {
                hyper.check(Self::SECTION, value)?;
            }
        }
        Ok(())
    }
}

/// The section as a TOML table, `kind` included.
fn table<S: Section>(spec: &S) -> Result<toml::Table> {
    toml::Table::try_from(spec).map_err(|e| {
        Error::Internal(format!(
            "cannot serialise {} {}: {e}",
            S::SECTION,
            spec.kind()
        ))
    })
}

/// A copy with `key` set to `value`, as serde reads it back.
fn with_toml<S: Section>(spec: &S, key: &str, value: toml::Value) -> Result<S> {
    let mut table = table(spec)?;
    let shown = value.to_string();
    table.insert(key.to_string(), value);
    table
        .try_into()
        .map_err(|e| Error::preset(format!("{}.{key}", S::SECTION), shown, e.to_string()))
}

/// The error for a key the variant lacks, listing the ones it has.
fn no_such_setting<S: Section>(spec: &S, key: &str, value: impl ToString) -> Error {
    let mut keys: Vec<String> = table(spec)
        .map(|t| t.keys().filter(|k| *k != "kind").cloned().collect())
        .unwrap_or_default();
    for h in spec.hyperparameters() {
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
        format!("{}.{key}", S::SECTION),
        value,
        format!("{} has no such setting ({has})", spec.kind()),
    )
}

/// `raw` as a TOML value (`3e-3`, `true`, `"x"`), or as a string when it is not valid TOML
/// (`layerwise`), the way `--set` reads values.
pub fn parse_value(raw: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.trim().to_string()))
}

/// The test every catalogue passes: each entry's default finds its way back to its entry
/// (`facts()`), names are unique, texts are not empty, and each default is within its ranges
/// with every setting catalogued ([`assert_catalogued`]). `$catalogue` is a static array of
/// references to entries with `name`, `formula`, `summary` and `default`.
#[cfg(test)]
macro_rules! test_catalogue {
    ($catalogue:expr) => {
        #[test]
        fn every_entry_is_the_facts_of_its_own_default() {
            let mut names = std::collections::BTreeSet::new();
            for &facts in &$catalogue {
                let spec = (facts.default)();
                assert!(std::ptr::eq(spec.facts(), facts), "{}", facts.name);
                assert!(names.insert(facts.name), "{} twice", facts.name);
                assert!(!facts.formula.is_empty() && !facts.summary.is_empty());
                $crate::settings::assert_catalogued(&spec);
            }
        }
    };
}
#[cfg(test)]
pub(crate) use test_catalogue;

/// `spec` is within its ranges, every key it serialises is one of its hyperparameters or
/// switches, and every switch is a key it serialises, holding a value the switch offers: what the editor draws from the catalogue is every setting there is.
#[cfg(test)]
pub(crate) fn assert_catalogued<S: Section>(spec: &S) {
    if let Err(e) = spec.validate_ranges() {
        panic!("{}: {e}", spec.kind());
    }
    let Ok(table) = table(spec) else {
        panic!("{} does not serialise", spec.kind())
    };
    for key in table.keys().filter(|k| *k != "kind") {
        let numeric = spec.hyperparameters().iter().any(|h| h.key == key);
        let switch = spec.switches().iter().find(|s| s.key == key);
        assert!(
            numeric || switch.is_some(),
            "{}.{key} is not catalogued",
            spec.kind()
        );
        let Some(switch) = switch else { continue };
        let word = spec.word(key).unwrap_or_default();
        let offered = match switch.choices {
            Choices::Toggle => word == "true" || word == "false",
            Choices::Words(words) => words.contains(&word.as_str()),
        };
        assert!(offered, "{}.{key} = {word} is not offered", spec.kind());
    }
    for switch in spec.switches() {
        assert!(
            table.contains_key(switch.key),
            "{}.{}",
            spec.kind(),
            switch.key
        );
    }
}
