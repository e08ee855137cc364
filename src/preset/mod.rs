//! Experiment presets: one TOML file describes a whole experiment.
//!
//! ```toml
//! schema = 1
//! name = "mqar-softmax"
//! [model]      # d_model, n_layers, n_heads, mlp_ratio, mixers, …
//! [attention]  # kind = "softmax" | "linear" | "based" | "rebased" | "linformer", + its settings
//! [encoding]   # kind = any name of `attnlab encodings` ("alibi", "kerple-log", "rerope", …),
//!              # + its settings
//! [task]       # kind = "mqar", + generator settings
//! [train]      # optimiser, schedule, stopping, seed, device
//! [eval]       # what is saved for the views
//! ```
//!
//! Every section has defaults, so a preset only states what differs; the run folder keeps the
//! fully resolved preset. Unknown keys and variants are errors, and [`Preset::validate`] checks
//! ranges and combinations before any work starts, naming the key, the bad value and what is
//! allowed.

mod command;
mod estimate;
mod state;
mod train;

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::attention::MechanismSpec;
use crate::encodings::{EncodingShape, EncodingSpec, Family};
use crate::model::ModelConfig;
use crate::settings::Settings;
use crate::tasks::TaskSpec;
use crate::{Error, Result};
pub use command::{changed_settings, train_command};
pub use estimate::{MemoryEstimate, bytes};
pub use state::ModelState;
pub use train::{Metric, Schedule, TrainConfig};

/// The preset schema this build reads and writes.
pub const SCHEMA: u32 = 1;

/// A whole experiment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preset {
    /// Schema version; must be [`SCHEMA`].
    pub schema: u32,
    /// Short name, used in run folder names.
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub model: ModelConfig,
    #[serde(default)]
    pub attention: MechanismSpec,
    #[serde(default)]
    pub encoding: EncodingSpec,
    #[serde(default)]
    pub task: TaskSpec,
    #[serde(default)]
    pub train: TrainConfig,
    #[serde(default)]
    pub eval: EvalConfig,
}

/// What a run saves for the views and analyses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvalConfig {
    /// Number of test rows (the first ones) whose attention matrices are saved.
    pub attention_examples: usize,
}

impl Default for EvalConfig {
    fn default() -> Self {
        Self {
            attention_examples: 8,
        }
    }
}

impl Default for Preset {
    fn default() -> Self {
        Self {
            schema: SCHEMA,
            name: "untitled".into(),
            description: String::new(),
            model: ModelConfig::default(),
            attention: MechanismSpec::default(),
            encoding: EncodingSpec::default(),
            task: TaskSpec::default(),
            train: TrainConfig::default(),
            eval: EvalConfig::default(),
        }
    }
}

impl Preset {
    /// Reads, overrides (`key=value` pairs, e.g. `train.lr=3e-3`) and validates a preset file.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self> {
        let text = crate::io::read_text(path, "preset", crate::io::MAX_TEXT_FILE)?;
        Self::parse(&text, overrides, path)
    }

    /// Parses preset text; `origin` names it in errors.
    pub fn parse(text: &str, overrides: &[String], origin: &Path) -> Result<Self> {
        // With overrides, toml's line numbers refer to the overridden text, so say so.
        let path = if overrides.is_empty() {
            origin.to_path_buf()
        } else {
            format!("{} (with --set {})", origin.display(), overrides.join(" ")).into()
        };
        let syntax = |message: String| Error::PresetSyntax {
            what: "preset",
            path: path.clone(),
            message,
        };
        let overridden;
        let text = if overrides.is_empty() {
            text
        } else {
            let mut table: toml::Table = toml::from_str(text).map_err(|e| syntax(e.to_string()))?;
            let before = kinds_in(&table);
            for item in overrides {
                apply_override(&mut table, item)?;
            }
            follow_kinds(&mut table, before, overrides);
            overridden = toml::to_string(&table).map_err(|e| syntax(e.to_string()))?;
            &overridden
        };
        let raw: toml::Table = toml::from_str(text).map_err(|e| syntax(e.to_string()))?;
        Self::check_section_keys(&raw)?;
        let deserializer = toml::Deserializer::parse(text).map_err(|e| syntax(e.to_string()))?;
        let preset: Self = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let mut path = e.path().to_string();
            let error = e.into_inner();
            let mut message = error.to_string();
            if let Some(key) = tagged_key(text, &path) {
                // toml's snippet shows the section's header: show the key's line instead.
                // With overrides the text is re-serialised: its lines are not the file's.
                if let Some(span) = key_span(text, &path, &key).filter(|_| overrides.is_empty()) {
                    message = snippet(text, span, error.message());
                }
                path = format!("{path}.{key}");
            }
            syntax(if path == "." {
                message
            } else {
                format!("at key {path}: {message}")
            })
        })?;
        preset.validate()?;
        Ok(preset)
    }

    /// Keys in `[attention]` and `[encoding]` that the chosen kind does not have, checked
    /// against the catalogue before serde reads the text, so the error lists the settings the
    /// kind does have (serde would say only "unknown field"). An unknown kind is left to serde.
    fn check_section_keys(raw: &toml::Table) -> Result<()> {
        let kinds = [
            (
                "attention",
                kind_settings(raw, "attention", |name| {
                    crate::attention::CATALOGUE
                        .iter()
                        .find(|f| f.name == name)
                        .map(|f| &f.settings)
                }),
            ),
            (
                "encoding",
                kind_settings(raw, "encoding", |name| {
                    crate::encodings::CATALOGUE
                        .iter()
                        .find(|f| f.name == name)
                        .map(|f| &f.settings)
                }),
            ),
        ];
        for (section, found) in kinds {
            let Some((kind, settings, given)) = found else {
                continue;
            };
            let keys: Vec<&str> = settings.keys().collect();
            let stray = given
                .iter()
                .find(|(k, _)| *k != "kind" && !keys.contains(&k.as_str()));
            if let Some((key, value)) = stray {
                let has = match keys.is_empty() {
                    true => "it has no settings".to_string(),
                    false => format!("it has: {}", keys.join(", ")),
                };
                return Err(Error::preset(
                    format!("{section}.{key}"),
                    value,
                    format!("{kind} has no such setting ({has})"),
                ));
            }
        }
        Ok(())
    }

    /// The preset as TOML text (what "Save" writes and the run folder keeps).
    pub fn to_toml(&self) -> Result<String> {
        toml::to_string(self)
            .map_err(|e| Error::Internal(format!("cannot write preset as TOML: {e}")))
    }

    /// Writes the preset atomically.
    pub fn save(&self, path: &Path) -> Result<()> {
        crate::io::write_bytes(path, self.to_toml()?.as_bytes())
    }

    /// Its mechanism and encoding as presets spell them, which its name follows ([`renamed`]).
    pub fn kinds(&self) -> (&'static str, &'static str) {
        (self.attention.name(), self.encoding.name())
    }

    /// The shape encodings are built for.
    pub fn encoding_shape(&self) -> EncodingShape {
        EncodingShape {
            d_model: self.model.d_model,
            n_heads: self.model.n_heads,
            qk_dim: self.attention.qk_dim(self.model.head_dim()),
            max_len: self.task.seq_len(),
            embedding_std: crate::model::Build::embedding_std(self.model.layout),
        }
    }

    /// The model this preset describes, with its parameters created in `params`.
    pub fn build_model(&self, params: &crate::params::Params) -> Result<crate::model::Transformer> {
        self.build_model_at(self.task.seq_len(), params)
    }

    /// [`Preset::build_model`] for sequences of up to `max_len` tokens (evaluated past the
    /// training length). Settings that default to the training length keep it.
    pub fn build_model_at(
        &self,
        max_len: usize,
        params: &crate::params::Params,
    ) -> Result<crate::model::Transformer> {
        let model = crate::model::ModelConfig {
            head: self.head(),
            ..self.model.clone()
        };
        crate::model::Transformer::new(
            &model,
            &self.attention,
            &self.encoding.at_training_length(self.task.seq_len()),
            self.task.vocab_size(),
            max_len,
            self.train.precision,
            params,
        )
    }

    /// The model's head with `auto` resolved: MAD's auto-encoder for a task that scores every
    /// token against itself (compression), the LM head otherwise.
    pub fn head(&self) -> crate::model::Head {
        use crate::model::Head;
        match self.model.head {
            Head::Auto if self.task.scores_its_inputs() => Head::Autoencoder,
            Head::Auto => Head::Lm,
            head => head,
        }
    }

    /// Checks every section and the combinations between them.
    pub fn validate(&self) -> Result<()> {
        if self.schema != SCHEMA {
            return Err(Error::preset(
                "schema",
                self.schema,
                format!("this attnlab reads schema {SCHEMA}"),
            ));
        }
        check_name(&self.name)?;
        self.model.validate()?;
        self.task.validate()?;
        self.attention.validate(self.task.seq_len())?;
        self.encoding.validate(&self.encoding_shape())?;
        self.train.validate(&self.task)?;
        let test_rows = self.task.test_examples();
        if self.eval.attention_examples == 0 || self.eval.attention_examples > test_rows.min(256) {
            return Err(Error::preset(
                "eval.attention_examples",
                self.eval.attention_examples,
                format!("must be in 1..={}", test_rows.min(256)),
            ));
        }
        self.validate_combination()
    }

    /// Mechanism × encoding × task combinations that cannot work, as the mechanisms'
    /// catalogue says.
    fn validate_combination(&self) -> Result<()> {
        let autoencoder = self.head() == crate::model::Head::Autoencoder;
        if autoencoder && self.task.requires_causal() && !self.task.scores_its_inputs() {
            return Err(Error::preset(
                "model.head",
                "autoencoder",
                format!(
                    "decodes every position from the last one, which has read the whole row: \
                     the {} task is made for a causal model, and its targets can be later \
                     tokens of the row, which it would see; use \"lm\" (or \"auto\")",
                    self.task.name()
                ),
            ));
        }
        if autoencoder && self.model.tie_embeddings {
            return Err(Error::preset(
                "model.tie_embeddings",
                true,
                "has no head to tie with model.head = \"autoencoder\" (its unembedding is its own)",
            ));
        }
        if self.task.scores_its_inputs() && self.head() == crate::model::Head::Lm {
            return Err(Error::preset(
                "model.head",
                "lm",
                "cannot learn compression: the task scores every token against itself, which \
                 a causal language model copies from its input; MAD decodes the row from its \
                 last position: use model.head = \"autoencoder\" (or \"auto\")",
            ));
        }
        let mechanism = self.attention.facts();
        if !mechanism.causal && self.task.requires_causal() {
            return Err(Error::preset(
                "attention.kind",
                mechanism.name,
                format!(
                    "is not causal (it mixes future tokens into every key), so it cannot be used \
                     for the {} task; choose {}",
                    self.task.name(),
                    causal_mechanisms()
                ),
            ));
        }
        let relative = matches!(self.encoding.family(), Family::Bias | Family::Rotary);
        if !mechanism.keys_have_positions && relative {
            return Err(Error::preset(
                "encoding.kind",
                self.encoding.name(),
                format!(
                    "cannot be combined with {}: its keys are projected along the sequence, \
                     so there is no key position i − j to bias or rotate; use none, learned or \
                     sinusoidal",
                    mechanism.name
                ),
            ));
        }
        Ok(())
    }

    /// A file-name-safe version of the name; `run` for a name with no letter or digit to keep
    /// (`..` made run folders named `<stamp>-`, and a preset file `.toml`).
    pub fn slug(&self) -> String {
        let slug: String = self
            .name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        match slug.trim_matches('-') {
            "" => "run".into(),
            slug => slug.to_string(),
        }
    }
}

/// The causal mechanisms' names as a sentence lists them ("softmax, linear, based or rebased").
fn causal_mechanisms() -> String {
    let names: Vec<&str> = crate::attention::CATALOGUE
        .iter()
        .filter(|m| m.causal)
        .map(|m| m.name)
        .collect();
    match names.split_last() {
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// The key of a `kind`-tagged section (`[task]`, `[attention]`, `[encoding]`) that an error
/// reported at the section itself is about. serde reads such a section whole before it picks
/// the variant, so serde_path_to_error's path stops at the section ("at key task" for a bad
/// `task.seq_len`); each key is tried alone beside the `kind`, and the first one that fails on
/// its own is named (`kind` itself when it is missing or fails alone).
fn tagged_key(text: &str, section: &str) -> Option<String> {
    if !matches!(section, "task" | "attention" | "encoding") {
        return None;
    }
    let raw: toml::Table = toml::from_str(text).ok()?;
    let given = raw.get(section)?.as_table()?;
    let Some(kind) = given.get("kind") else {
        return Some("kind".into());
    };
    let fails = |key: Option<(&String, &toml::Value)>| {
        let mut probe = toml::Table::new();
        probe.insert("kind".into(), kind.clone());
        probe.extend(key.map(|(k, v)| (k.clone(), v.clone())));
        let probe = toml::Value::Table(probe);
        match section {
            "task" => probe.try_into::<TaskSpec>().is_err(),
            "attention" => probe.try_into::<MechanismSpec>().is_err(),
            _ => probe.try_into::<EncodingSpec>().is_err(),
        }
    };
    if fails(None) {
        return Some("kind".into());
    }
    given
        .iter()
        .filter(|(key, _)| *key != "kind")
        .find(|&entry| fails(Some(entry)))
        .map(|(key, _)| key.clone())
}

/// Where `section.key` is written in `text`, from the key to the end of its value.
fn key_span(text: &str, section: &str, key: &str) -> Option<std::ops::Range<usize>> {
    fn entry<'t, 'i>(
        table: &'t toml::de::DeTable<'i>,
        name: &str,
    ) -> Option<(
        std::ops::Range<usize>,
        &'t toml::Spanned<toml::de::DeValue<'i>>,
    )> {
        table
            .iter()
            .find(|(k, _)| k.get_ref() == name)
            .map(|(k, v)| (k.span(), v))
    }
    let document = toml::de::DeTable::parse(text).ok()?;
    let (_, table) = entry(document.get_ref(), section)?;
    let toml::de::DeValue::Table(table) = table.get_ref() else {
        return None;
    };
    let (at, value) = entry(table, key)?;
    Some(at.start..value.span().end)
}

/// `message` under the line of `text` that `span` starts on, the span underlined, as toml
/// shows a parse error.
fn snippet(text: &str, span: std::ops::Range<usize>, message: &str) -> String {
    let before = &text[..span.start];
    let line = before.matches('\n').count();
    let column = span.start - before.rfind('\n').map_or(0, |i| i + 1);
    let content = text
        .split('\n')
        .nth(line)
        .unwrap_or_default()
        .trim_end_matches('\r');
    let width = (span.end - span.start).clamp(1, content.len().saturating_sub(column).max(1));
    let number = (line + 1).to_string();
    let gutter = " ".repeat(number.len() + 1);
    format!(
        "TOML parse error at line {number}, column {}\n{gutter}|\n{number} | {content}\n{gutter}|{} \
         {}\n{message}\n",
        column + 1,
        " ".repeat(column),
        "^".repeat(width),
    )
}

/// The longest preset name: run folders are named `<time>-<name>` (plus `-N` when the time
/// repeats), and a folder name holds at most 255 bytes.
pub const MAX_NAME_CHARS: usize = 200;

/// A name must be something a run folder, a thread and a log line can carry: not empty, no
/// control characters (a NUL cannot be in a thread name, a newline splits a plan's command),
/// and at most [`MAX_NAME_CHARS`].
pub fn check_name(name: &str) -> Result<()> {
    let shown = || format!("{name:?}");
    if name.trim().is_empty() {
        return Err(Error::preset("name", shown(), "must not be empty"));
    }
    if name.chars().any(char::is_control) {
        return Err(Error::preset(
            "name",
            shown(),
            "must not contain control characters (NUL, newline, tab, …)",
        ));
    }
    let chars = name.chars().count();
    if chars > MAX_NAME_CHARS {
        return Err(Error::preset(
            "name",
            format!("{:?}…", name.chars().take(40).collect::<String>()),
            format!(
                "is {chars} characters long: at most {MAX_NAME_CHARS}, so the run folder's name fits"
            ),
        ));
    }
    Ok(())
}

/// The name a preset called `name` should take when its mechanism or encoding changes from
/// `before` to `after` (each `(mechanism, encoding)` as presets spell them), so that a run's name
/// says what trained. Only a name that says its mechanism changes (one the user chose stays):
/// the old mechanism's part becomes the new one (`mqar-softmax` → `mqar-based`), and so does
/// the old encoding's; a new encoding is added when the name had none (`mqar-based` →
/// `mqar-based-t5`), and `none` drops it. Parts are whole hyphen-separated words, so
/// `gated-deltanet` is not a `deltanet`.
pub fn renamed(name: &str, before: (&str, &str), after: (&str, &str)) -> String {
    let has = |name: &str, part: &str| format!("-{name}-").contains(&format!("-{part}-"));
    let swap = |name: &str, old: &str, new: &str| {
        let new = if new.is_empty() {
            "-".to_string()
        } else {
            format!("-{new}-")
        };
        let swapped = format!("-{name}-").replacen(&format!("-{old}-"), &new, 1);
        swapped.trim_matches('-').to_string()
    };
    let mut name = name.to_string();
    if before.0 != after.0 && has(&name, before.0) {
        name = swap(&name, before.0, after.0);
    }
    if before.1 != after.1 && has(&name, after.0) {
        let new = if after.1 == "none" { "" } else { after.1 };
        name = match has(&name, before.1) {
            true => swap(&name, before.1, new),
            false if new.is_empty() => name,
            false => format!("{name}-{new}"),
        };
    }
    name
}

/// Renames a preset whose `--set` overrides changed its mechanism or encoding from `before`
/// as the window's editor renames it ([`renamed`]): `attnlab train mqar_softmax --set
/// attention=based` trained a run called mqar-softmax. Overrides that set `name` keep theirs.
fn follow_kinds(
    table: &mut toml::Table,
    before: Option<(&'static str, &'static str)>,
    overrides: &[String],
) {
    let sets_name = |item: &String| {
        item.split_once('=')
            .is_some_and(|(k, _)| k.trim() == "name")
    };
    if overrides.iter().any(sets_name) {
        return;
    }
    let (Some(before), Some(after)) = (before, kinds_in(table)) else {
        return;
    };
    if let Some(toml::Value::String(name)) = table.get_mut("name") {
        *name = renamed(name, before, after);
    }
}

/// The mechanism and encoding a preset's `table` names (the defaults where it names none);
/// `None` where a section does not read, which parsing the whole preset then reports.
fn kinds_in(table: &toml::Table) -> Option<(&'static str, &'static str)> {
    fn section<T: serde::de::DeserializeOwned + Default>(
        table: &toml::Table,
        key: &str,
    ) -> Option<T> {
        table
            .get(key)
            .map_or(Some(T::default()), |value| value.clone().try_into().ok())
    }
    let attention: MechanismSpec = section(table, "attention")?;
    let encoding: EncodingSpec = section(table, "encoding")?;
    Some((attention.name(), encoding.name()))
}

/// `spec` with `overrides` applied, each spelled as `--set` spells it (`encoding.kind=pi`,
/// `encoding.scale=2`): the inference-time scalings of a model that has no preset file (a
/// pretrained one).
pub fn encoding_with(spec: &EncodingSpec, overrides: &[String]) -> Result<EncodingSpec> {
    let syntax = |e: &dyn std::fmt::Display| Error::preset("encoding", "", e.to_string());
    let section = toml::Value::try_from(spec).map_err(|e| syntax(&e))?;
    let mut table = toml::Table::new();
    table.insert("encoding".into(), section);
    for item in overrides {
        apply_override(&mut table, item)?;
    }
    let section = table
        .remove("encoding")
        .unwrap_or(toml::Value::Table(toml::Table::new()));
    section.try_into().map_err(|e| syntax(&e))
}

/// Applies `a.b.c=value` to a TOML table. The value is parsed as TOML (`3e-3`, `true`,
/// `"x"`, `[1, 2]`), and taken as a string when it is not valid TOML (`kind=based`).
fn apply_override(table: &mut toml::Table, item: &str) -> Result<()> {
    let Some((key, raw)) = item.split_once('=') else {
        return Err(Error::preset(
            item,
            "",
            "an override must look like key=value, e.g. train.lr=3e-3",
        ));
    };
    let key = key.trim();
    let mut value = crate::settings::parse_value(raw);
    // `attention=based` (a kind-tagged section given a bare name) is the whole section
    // `{ kind = "based" }`: the other settings start from the kind's defaults. Unlike the
    // inline table it needs no quotes, so a command line survives xargs and schedulers.
    if let ("attention" | "encoding" | "task", toml::Value::String(kind)) = (key, &value) {
        let mut section = toml::Table::new();
        section.insert("kind".into(), toml::Value::String(kind.clone()));
        value = toml::Value::Table(section);
    }
    let mut parts: Vec<&str> = key.split('.').collect();
    let Some(leaf) = parts.pop().filter(|s| !s.is_empty()) else {
        return Err(Error::preset(key, raw, "empty key"));
    };
    let mut current = table;
    for part in parts {
        let entry = current
            .entry(part)
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        current = entry
            .as_table_mut()
            .ok_or_else(|| Error::preset(key, raw, format!("'{part}' is not a section")))?;
    }
    current.insert(leaf.to_string(), value);
    Ok(())
}

/// The kind named in `[section]` of `raw`, its catalogued settings (`lookup` by name) and the
/// keys given there; `None` when the section, its kind or the kind's entry is missing.
fn kind_settings<'a>(
    raw: &'a toml::Table,
    section: &str,
    lookup: impl Fn(&str) -> Option<&'static Settings>,
) -> Option<(&'a str, &'static Settings, &'a toml::Table)> {
    let given = raw.get(section)?.as_table()?;
    let kind = given.get("kind")?.as_str()?;
    Some((kind, lookup(kind)?, given))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, overrides: &[&str]) -> Result<Preset> {
        let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        Preset::parse(text, &overrides, Path::new("test.toml"))
    }

    const MINIMAL: &str = "schema = 1\nname = \"t\"\n";

    /// The error the minimal preset with `overrides` is refused with, in words.
    fn refusal(overrides: &[&str]) -> String {
        parse(MINIMAL, overrides).unwrap_err().to_string()
    }

    #[test]
    fn defaults_fill_a_minimal_preset() {
        let p = parse(MINIMAL, &[]).unwrap();
        assert_eq!(p.model, ModelConfig::default());
        assert_eq!(p.attention.name(), "softmax");
    }

    /// `attention=rebased` replaces the section, as `attention={ kind = "rebased" }` does:
    /// the base's settings of another kind do not leak in.
    #[test]
    fn a_bare_kind_replaces_the_whole_section() {
        let base = format!("{MINIMAL}[attention]\nkind = \"based\"\nfeature_dim = 8\n");
        let bare = parse(&base, &["attention=rebased", "attention.variant=x2"]).unwrap();
        let table = parse(
            &base,
            &["attention={ kind = \"rebased\", variant = \"x2\" }"],
        )
        .unwrap();
        assert_eq!(bare.attention, table.attention);
        assert_eq!(
            bare.attention.qk_dim(64),
            16,
            "rebased's default feature_dim, not 8"
        );
        assert_eq!(
            parse(MINIMAL, &["encoding=alibi"]).unwrap().encoding.name(),
            "alibi"
        );
    }

    #[test]
    fn resolved_preset_round_trips() {
        let p = parse(
            MINIMAL,
            &[
                "attention.kind=based",
                "encoding.kind=rope",
                "train.lr=0.003",
            ],
        )
        .unwrap();
        let again = parse(&p.to_toml().unwrap(), &[]).unwrap();
        assert_eq!(p, again);
        assert_eq!(again.train.lr, 0.003);
    }

    #[test]
    fn unknown_key_is_named() {
        let err = parse(&format!("{MINIMAL}[model]\nd_modle = 3\n"), &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("d_modle") && err.contains("test.toml"),
            "{err}"
        );
    }

    /// Kinds without settings have no serde field list to reject a stray key with.
    #[test]
    fn stray_keys_of_kinds_without_settings_are_errors() {
        let err = refusal(&["encoding.kind=sinusoidal", "encoding.slope=0.5"]);
        assert!(
            err.contains(
                "encoding.slope = 0.5: sinusoidal has no such setting (it has no settings)"
            ),
            "{err}"
        );
        let err = refusal(&["attention.feature_dim=8"]);
        assert!(err.contains("attention.feature_dim"), "{err}");
        assert!(parse(MINIMAL, &["encoding.kind=alibi", "encoding.k=1"]).is_ok());
    }

    /// serde's internally tagged enums lose the path: a bad value inside `[task]`,
    /// `[attention]` or `[encoding]` used to be reported "at key task".
    #[test]
    fn errors_inside_kind_tagged_sections_name_the_key() {
        let cases: [(&[&str], &str); 6] = [
            (&["task=mqar", "task.seq_len=-1"], "at key task.seq_len: "),
            (
                &["task=mqar", "task.power_a=\"x\""],
                "at key task.power_a: ",
            ),
            (&["task.seq_len=64"], "at key task.kind: "),
            (
                &["attention.kind=based", "attention.feature_dim=-2"],
                "at key attention.feature_dim: ",
            ),
            (
                &["encoding.kind=alibi", "encoding.k=\"x\""],
                "at key encoding.k: ",
            ),
            (&["task.kind=mqr"], "at key task.kind: "),
        ];
        for (overrides, key) in cases {
            let err = parse(MINIMAL, overrides).unwrap_err().to_string();
            assert!(err.contains(key), "{overrides:?}: {err}");
        }
        let err = refusal(&["model.d_modle=3"]);
        assert!(!err.contains("model.kind"), "untagged sections: {err}");
    }

    /// An error in a `kind`-tagged section pointed at the section's header line; it points at
    /// the key's own line, the whole `key = value` underlined.
    #[test]
    fn errors_in_tagged_sections_show_the_keys_line() {
        let text = "schema = 1\nname = \"x\"\n\n[task]\nkind = \"mqar\"\nseq_len = \"long\"\n";
        let err = Preset::parse(text, &[], Path::new("p.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("at key task.seq_len: "), "{err}");
        assert!(
            err.contains("line 6, column 1\n  |\n6 | seq_len = \"long\"\n  | ^^^^^^^^^^^^^^^^\n"),
            "{err}"
        );
        assert!(err.contains("invalid type: string \"long\""), "{err}");
    }

    /// Compression takes MAD's auto-encoder by itself; asked for the LM head, which would copy
    /// each input to its own target, it is refused naming the key. Another task keeps the LM
    /// head under `auto`, and may ask for the auto-encoder.
    #[test]
    fn compression_decodes_through_the_auto_encoder() {
        use crate::model::Head;
        let compression = ["task.kind=\"mad\"", "task.probe=\"compression\""];
        assert_eq!(
            parse(MINIMAL, &compression).unwrap().head(),
            Head::Autoencoder
        );
        let err = refusal(&[compression[0], compression[1], "model.head=\"lm\""]);
        assert!(
            err.contains("model.head") && err.contains("autoencoder"),
            "{err}"
        );
        assert_eq!(parse(MINIMAL, &[]).unwrap().head(), Head::Lm);
        // MQAR's targets are earlier tokens: the pooled last position may read them.
        let asked = parse(MINIMAL, &["model.head=\"autoencoder\""]).unwrap();
        assert_eq!(asked.head(), Head::Autoencoder);
        // A recall probe's targets are later tokens, which the pool has read.
        let recall = ["task.kind=\"mad\"", "model.head=\"autoencoder\""];
        let err = refusal(&recall);
        assert!(
            err.contains("model.head") && err.contains("later tokens"),
            "{err}"
        );
    }

    #[test]
    fn a_bad_device_name_names_its_key() {
        let err = refusal(&["train.device=\"tpu\""]);
        assert!(
            err.contains("train.device") && err.contains("unknown device 'tpu'"),
            "{err}"
        );
    }

    #[test]
    fn unknown_variant_lists_the_allowed_ones() {
        let err = refusal(&["attention.kind=flash"]);
        assert!(
            err.contains("flash") && err.contains("rebased") && err.contains("linformer"),
            "{err}"
        );
    }

    #[test]
    fn out_of_range_value_names_key_value_and_range() {
        let err = refusal(&["model.n_heads=129"]);
        assert!(
            err.contains("model.n_heads = 129") && err.contains("at most model.d_model = 128"),
            "{err}"
        );
    }

    #[test]
    fn incompatible_combination_is_rejected() {
        let err = parse(
            MINIMAL,
            &["attention.kind=linformer", "encoding.kind=alibi"],
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("encoding.kind = alibi") && err.contains("linformer"),
            "{err}"
        );
    }

    /// A NUL used to panic spawning the training thread; a long name passed `check` and then
    /// failed creating the run folder.
    #[test]
    fn names_a_folder_cannot_hold_are_refused() {
        let err = refusal(&["name=\"a\\u0000b\""]);
        assert!(
            err.contains("name = \"a\\0b\"") && err.contains("control characters"),
            "{err}"
        );
        let err = refusal(&["name=\"a\\nb\""]);
        assert!(err.contains("control characters"), "{err}");
        let long = format!("name=\"{}\"", "x".repeat(MAX_NAME_CHARS + 1));
        let err = refusal(&[&long]);
        assert!(
            err.contains("invalid preset: name = ") && err.contains("201"),
            "{err}"
        );
        let longest = format!("name=\"{}\"", "é".repeat(MAX_NAME_CHARS));
        assert!(parse(MINIMAL, &[&longest]).is_ok());
    }

    #[test]
    fn a_name_follows_its_mechanism_and_encoding() {
        let softmax = ("softmax", "learned");
        // (name, before, after, renamed)
        let cases = [
            ("mqar-softmax", softmax, ("based", "learned"), "mqar-based"),
            (
                "mqar-based",
                ("based", "learned"),
                ("based", "t5"),
                "mqar-based-t5",
            ),
            (
                "mqar-based-t5",
                ("based", "t5"),
                ("based", "alibi"),
                "mqar-based-alibi",
            ),
            (
                "mqar-gated-deltanet",
                ("gated-deltanet", "none"),
                ("deltanet", "none"),
                "mqar-deltanet",
            ),
            (
                "mqar-deltanet",
                ("deltanet", "none"),
                ("gated-deltanet", "none"),
                "mqar-gated-deltanet",
            ),
            ("my-study", softmax, ("linear", "learned"), "my-study"),
            ("mqar-softmax", softmax, softmax, "mqar-softmax"),
            ("my-study", softmax, ("softmax", "t5"), "my-study"),
            (
                "mqar-based",
                ("based", "learned"),
                ("based", "none"),
                "mqar-based",
            ),
            ("mqar-gla-t5", ("gla", "t5"), ("gla", "none"), "mqar-gla"),
            (
                "mqar-gla",
                ("gla", "none"),
                ("gla", "rope"),
                "mqar-gla-rope",
            ),
        ];
        for (name, before, after, expected) in cases {
            assert_eq!(
                renamed(name, before, after),
                expected,
                "{name}: {before:?} → {after:?}"
            );
        }
    }

    /// `--set` of the mechanism or encoding renames the run as the window does; a `--set` of
    /// `name` in the same command keeps that name, and other settings keep the file's.
    #[test]
    fn a_name_follows_a_set_mechanism_or_encoding() {
        let base = "schema = 1\nname = \"mqar-softmax\"\n";
        let name = |overrides: &[&str]| parse(base, overrides).unwrap().name;
        assert_eq!(name(&["attention=based"]), "mqar-based");
        assert_eq!(name(&["attention.kind=\"based\""]), "mqar-based");
        assert_eq!(name(&["encoding=alibi"]), "mqar-softmax-alibi");
        assert_eq!(name(&["attention=based", "name=mine"]), "mine");
        assert_eq!(name(&["name=mine", "attention=based"]), "mine");
        assert_eq!(name(&["train.lr=0.01"]), "mqar-softmax");
        assert_eq!(name(&[]), "mqar-softmax");
    }

    /// A name with nothing a file name keeps gives a folder named `run`, not `<stamp>-`.
    #[test]
    fn a_name_without_letters_still_names_its_folder() {
        let slug = |name: &str| parse(MINIMAL, &[&format!("name={name:?}")]).unwrap().slug();
        assert_eq!(slug(".."), "run");
        assert_eq!(slug("日本"), "run");
        assert_eq!(slug("a b/c"), "a-b-c");
    }

    #[test]
    fn wrong_schema_is_rejected() {
        let err = parse("schema = 2\nname = \"t\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("schema = 2"), "{err}");
    }
}
