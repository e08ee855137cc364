//! `attnlab encodings`, `attnlab mechanisms` and `attnlab tasks`: the catalogues
//! (`encodings/catalogue.rs`, `attention/catalogue.rs`, `tasks/catalogue.rs`) as a table, CSV or
//! JSON, with every setting, its default and (for the first two) the values it takes.

use serde_json::{Value, json};

use crate::attention::{MechanismSpec, Mixing};
use crate::encodings::{EncodingSpec, Family};
use crate::report::Format;
use crate::settings::{Choices, Section};
use crate::tasks::TaskSpec;

/// One entry as the listing prints it.
struct Row {
    name: &'static str,
    /// What the text table shows between the name and the formula (17 characters wide).
    tags: String,
    /// The CSV columns between the name and the formula.
    csv_tags: String,
    formula: &'static str,
    summary: &'static str,
    settings: Vec<String>,
    json: Value,
}

/// `attnlab encodings`.
pub fn encodings(format: Format) -> anyhow::Result<()> {
    let rows = EncodingSpec::all_defaults()
        .iter()
        .map(encoding_row)
        .collect();
    print(rows, "name,family,learnable", format)
}

/// `attnlab tasks`: each task's summary, paper and default settings.
pub fn tasks(format: Format) -> anyhow::Result<()> {
    let rows = TaskSpec::all_defaults()
        .iter()
        .map(task_row)
        .collect::<anyhow::Result<_>>()?;
    print(rows, "name,needs_causal", format)
}

fn task_row(spec: &TaskSpec) -> anyhow::Result<Row> {
    let facts = spec.facts();
    let mut table = toml::Table::try_from(spec)?;
    table.remove("kind");
    let settings = table.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let causal = if facts.needs_causal { "causal" } else { "any" };
    Ok(Row {
        name: facts.name,
        tags: format!("{causal} mixer"),
        csv_tags: facts.needs_causal.to_string(),
        formula: facts.paper,
        summary: facts.summary,
        settings,
        json: json!({"name": facts.name, "needs_causal": facts.needs_causal,
                     "summary": facts.summary, "paper": facts.paper, "defaults": table}),
    })
}

/// `attnlab mechanisms`.
pub fn mechanisms(format: Format) -> anyhow::Result<()> {
    let rows = MechanismSpec::all_defaults()
        .iter()
        .map(mechanism_row)
        .collect();
    print(rows, "name,causal,mixing", format)
}

fn encoding_row(spec: &EncodingSpec) -> Row {
    let family = family_name(spec.family());
    let learnable = if spec.is_learnable() {
        "learned"
    } else {
        "fixed"
    };
    Row {
        name: spec.name(),
        tags: format!("{family:<8} {learnable}"),
        csv_tags: format!("{family},{}", spec.is_learnable()),
        formula: spec.formula(),
        summary: spec.summary(),
        settings: settings(spec),
        json: json!({"name": spec.name(), "family": family, "learnable": spec.is_learnable(),
                     "formula": spec.formula(), "summary": spec.summary(),
                     "settings": numbers(spec), "switches": switches(spec)}),
    }
}

fn mechanism_row(spec: &MechanismSpec) -> Row {
    let causal = spec.is_causal();
    let mixing = match spec.mixing() {
        Mixing::RowStochastic => "row-stochastic",
        Mixing::Signed => "signed",
    };
    Row {
        name: spec.name(),
        tags: format!(
            "{:<10} {mixing}",
            if causal { "causal" } else { "non-causal" }
        ),
        csv_tags: format!("{causal},{mixing}"),
        formula: spec.formula(),
        summary: spec.summary(),
        settings: std::iter::once(format!("state: {}", spec.facts().state))
            .chain(settings(spec))
            .collect(),
        json: json!({"name": spec.name(), "causal": causal, "mixing": mixing,
                     "formula": spec.formula(),
                     "summary": spec.summary(), "state": spec.facts().state,
                     "settings": numbers(spec), "switches": switches(spec)}),
    }
}

/// `key=default [min..max]` per number (`key=(unset)` for an optional one left out of
/// presets by default: a literal word there would read as a value `--set` takes), `key=default
/// {a|b}` per switch.
fn settings(spec: &impl Section) -> Vec<String> {
    let numbers = spec.hyperparameters().iter().map(|h| {
        let value = spec
            .value(h.key)
            .map_or("(unset)".into(), |v| v.to_string());
        format!("{}={value} [{}..{}]", h.key, h.min, h.max)
    });
    let switches = spec.switches().iter().map(|s| {
        let value = spec.word(s.key).unwrap_or_default();
        format!("{}={value} {{{}}}", s.key, choices(s.choices).join("|"))
    });
    numbers.chain(switches).collect()
}

/// The numeric settings as JSON: key, default, range and help.
fn numbers(spec: &impl Section) -> Vec<Value> {
    spec.hyperparameters()
        .iter()
        .map(|h| {
            json!({"key": h.key, "value": spec.value(h.key), "min": h.min, "max": h.max,
                   "integer": h.integer, "help": h.help})
        })
        .collect()
}

/// The switches as JSON: key, default and the values it takes.
fn switches(spec: &impl Section) -> Vec<Value> {
    spec.switches()
        .iter()
        .map(|s| json!({"key": s.key, "value": spec.word(s.key), "choices": choices(s.choices)}))
        .collect()
}

fn choices(choices: Choices) -> Vec<&'static str> {
    match choices {
        Choices::Toggle => vec!["true", "false"],
        Choices::Words(words) => words.to_vec(),
    }
}

fn print(rows: Vec<Row>, csv_tags: &str, format: Format) -> anyhow::Result<()> {
    match format {
        Format::Json => {
            let rows: Vec<&Value> = rows.iter().map(|r| &r.json).collect();
            outln!("{}", serde_json::to_string_pretty(&rows)?);
        }
        Format::Csv => {
            outln!("{csv_tags},formula,settings");
            for r in &rows {
                let settings = r.settings.join("; ");
                outln!("{},{},\"{}\",\"{settings}\"", r.name, r.csv_tags, r.formula);
            }
        }
        Format::Text => {
            for r in &rows {
                let settings = match r.settings.is_empty() {
                    true => "(no settings)".into(),
                    false => r.settings.join("  "),
                };
                outln!("{:<13} {:<17} {}", r.name, r.tags, r.formula);
                outln!("{:<31}{}\n{:<31}{settings}", "", r.summary, "");
            }
        }
    }
    Ok(())
}

fn family_name(family: Family) -> &'static str {
    match family {
        Family::None => "none",
        Family::Absolute => "absolute",
        Family::Bias => "bias",
        Family::Rotary => "rotary",
    }
}
