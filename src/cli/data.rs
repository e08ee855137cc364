//! `attnlab data mqar`: show what the model is trained on.

use std::path::Path;

use crate::Preset;
use crate::tasks::IGNORE;
use crate::tasks::mqar::{Example, Split};

use super::SplitArg;
use crate::report::{Format, Table};

pub fn mqar(
    path: &Path,
    overrides: &[String],
    n: usize,
    split: SplitArg,
    format: Format,
) -> anyhow::Result<()> {
    let preset = Preset::load(path, overrides)?;
    let Some(config) = preset.task.mqar() else {
        anyhow::bail!(
            "preset {} has task {}, not mqar",
            path.display(),
            preset.task.name()
        );
    };
    let split = match split {
        SplitArg::Train => Split::Train,
        SplitArg::Test => Split::Test,
    };
    let examples = config.examples(split, n);
    match format {
        Format::Json => outln!("{}", serde_json::to_string_pretty(&examples)?),
        Format::Csv => out!("{}", tidy_rows(&examples).csv()),
        Format::Text => {
            for e in &examples {
                outln!("{}", text_row(e));
            }
        }
    }
    Ok(())
}

/// One line per token: its row, position, id and target (empty where nothing is scored).
fn tidy_rows(examples: &[Example]) -> Table {
    let mut table = Table::new(&["row", "position", "input", "label"]);
    for (row, e) in examples.iter().enumerate() {
        for (position, (&input, &label)) in e.inputs.iter().zip(&e.labels).enumerate() {
            let label = (label != IGNORE).then_some(label);
            table.push(vec![
                row.into(),
                position.into(),
                input.into(),
                label.into(),
            ]);
        }
    }
    table
}

/// Two aligned lines: tokens, and the targets under their query positions.
fn text_row(example: &Example) -> String {
    let width = example
        .inputs
        .iter()
        .map(|t| t.to_string().len())
        .max()
        .unwrap_or(1);
    let tokens: Vec<String> = example
        .inputs
        .iter()
        .map(|t| format!("{t:>width$}"))
        .collect();
    let labels: Vec<String> = example
        .labels
        .iter()
        .map(|&l| {
            if l == IGNORE {
                format!("{:>width$}", "-")
            } else {
                format!("{l:>width$}")
            }
        })
        .collect();
    format!(
        "inputs: {}\nlabels: {}\n",
        tokens.join(" "),
        labels.join(" ")
    )
}
