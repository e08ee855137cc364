//! A preset as an `attnlab train` command line: a base preset file plus one `--set` per
//! setting that differs, so what was built in the window can be rerun (or put in a script)
//! from the command line, and the window teaches the CLI's keys.

use super::Preset;
use crate::{Error, Result};

/// `attnlab train BASE_FILE --set key=value …` that loads as `preset`, where `base` is what
/// `base_file` holds. A section whose kind changed, or that lost a setting the base has, is set
/// whole (`--set 'encoding={ kind = "t5", … }'`): a leaf `--set` cannot remove a key.
pub fn train_command(preset: &Preset, base_file: &str, base: &Preset) -> Result<String> {
    // The command line renames a run whose mechanism or encoding a `--set` changes: a preset
    // that kept its base's name anyway says so with `--set name=`.
    let mut base = base.clone();
    base.name = super::renamed(&base.name, base.kinds(), preset.kinds());
    let (want, have) = (table(preset)?, table(&base)?);
    let mut sets = Vec::new();
    differences("", &want, &have, &mut sets);
    let mut words = vec!["attnlab".to_string(), "train".into(), quote(base_file)];
    for set in sets {
        words.push("--set".into());
        words.push(quote(&set));
    }
    Ok(words.join(" "))
}

/// `key=value` for every setting of `want` that `have` lacks or holds differently, as
/// [`train_command`] sets them: empty when the two presets train the same run.
pub fn changed_settings(want: &Preset, have: &Preset) -> Result<Vec<String>> {
    let mut sets = Vec::new();
    differences("", &table(want)?, &table(have)?, &mut sets);
    Ok(sets)
}

fn table(preset: &Preset) -> Result<toml::Table> {
    toml::Table::try_from(preset)
        .map_err(|e| Error::Internal(format!("cannot write preset as TOML: {e}")))
}

/// Appends a `key=value` for every leaf of `want` that `have` lacks or holds differently.
fn differences(prefix: &str, want: &toml::Table, have: &toml::Table, sets: &mut Vec<String>) {
    for (key, value) in want {
        let path = format!("{prefix}{key}");
        match (value, have.get(key)) {
            (_, Some(old)) if old == value => {}
            (toml::Value::Table(new), Some(toml::Value::Table(old))) if replaceable(new, old) => {
                differences(&format!("{path}."), new, old, sets);
            }
            _ => sets.push(format!("{path}={}", inline(value))),
        }
    }
}

/// Whether `new` can be reached from `old` key by key: same kind, and no key of `old` gone.
fn replaceable(new: &toml::Table, old: &toml::Table) -> bool {
    new.get("kind") == old.get("kind") && old.keys().all(|k| new.contains_key(k))
}

/// A value as TOML on one line (tables inline).
fn inline(value: &toml::Value) -> String {
    match value {
        toml::Value::Table(table) => {
            let items: Vec<String> = table
                .iter()
                .map(|(k, v)| format!("{k} = {}", inline(v)))
                .collect();
            format!("{{ {} }}", items.join(", "))
        }
        toml::Value::Array(items) => {
            let items: Vec<String> = items.iter().map(inline).collect();
            format!("[{}]", items.join(", "))
        }
        other => other.to_string(),
    }
}

/// `word` as one POSIX shell word: as is when it is plain, else in single quotes.
fn quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const MQAR: &str = include_str!("../../presets/mqar_softmax.toml");
    const LM: &str = include_str!("../../presets/lm_alibi.toml");

    /// The words of a command line as a POSIX shell splits them (plain and single-quoted
    /// words and backslash escapes, which is all [`quote`] writes).
    fn split(line: &str) -> Vec<String> {
        let mut words = Vec::new();
        let mut word = String::new();
        let (mut quoted, mut started) = (false, false);
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            match c {
                '\'' => (quoted, started) = (!quoted, true),
                '\\' if !quoted => {
                    word.extend(chars.next());
                    started = true;
                }
                ' ' if !quoted => {
                    if started {
                        words.push(std::mem::take(&mut word));
                    }
                    started = false;
                }
                c => (word, started) = (word + &c.to_string(), true),
            }
        }
        if started {
            words.push(word);
        }
        words
    }

    /// The preset the printed command trains, `base` being what its preset file holds.
    fn parse_back(command: &str, base: &str) -> Preset {
        let words = split(command);
        assert_eq!(words[..2], ["attnlab", "train"]);
        let sets: Vec<String> = words[3..]
            .chunks(2)
            .map(|pair| {
                assert_eq!(pair[0], "--set");
                pair[1].clone()
            })
            .collect();
        Preset::parse(base, &sets, Path::new(&words[2])).unwrap()
    }

    fn parse(text: &str) -> Preset {
        Preset::parse(text, &[], Path::new("base")).unwrap()
    }

    #[test]
    fn the_base_itself_needs_no_set() {
        let base = parse(MQAR);
        let command = train_command(&base, "presets/mqar_softmax.toml", &base).unwrap();
        assert_eq!(command, "attnlab train presets/mqar_softmax.toml");
    }

    #[test]
    fn the_printed_command_parses_back_to_the_same_preset() {
        let mut preset = parse(MQAR);
        preset.name = "my run's name".into();
        preset.model.d_model = 32;
        preset.train.lr = 1e-3;
        preset.train.max_steps = Some(500);
        preset.encoding = crate::encodings::EncodingSpec::from_name("kerple-log").unwrap();
        let mut mechanisms = crate::attention::MechanismSpec::all_defaults().into_iter();
        preset.attention = mechanisms.find(|m| m.name() == "based").unwrap();
        let command = train_command(&preset, "presets/mqar_softmax.toml", &parse(MQAR)).unwrap();
        assert!(command.contains("--set model.d_model=32"), "{command}");
        assert_eq!(parse_back(&command, MQAR), preset);
    }

    /// The command line renames a run whose mechanism changes: a preset renamed so needs no
    /// `--set name=`, one that kept its base's name needs one.
    #[test]
    fn a_changed_mechanism_names_the_run_as_the_preset_does() {
        let mut preset = parse(MQAR);
        let mut mechanisms = crate::attention::MechanismSpec::all_defaults().into_iter();
        preset.attention = mechanisms.find(|m| m.name() == "based").unwrap();
        for (name, sets_name) in [("mqar-based", false), ("mqar-softmax", true)] {
            preset.name = name.into();
            let command = train_command(&preset, "mqar_softmax", &parse(MQAR)).unwrap();
            let names = split(&command).iter().any(|word| word.starts_with("name="));
            assert_eq!(names, sets_name, "{command}");
            assert_eq!(parse_back(&command, MQAR), preset);
        }
    }

    #[test]
    fn a_setting_the_base_has_and_the_preset_lacks_sets_its_section_whole() {
        let mut preset = parse(LM);
        preset.train.max_steps = None;
        let command = train_command(&preset, "presets/lm_alibi.toml", &parse(LM)).unwrap();
        assert!(command.contains("--set 'train={"), "{command}");
        assert_eq!(parse_back(&command, LM), preset);
    }
}
