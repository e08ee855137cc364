//! `attnlab data mqar` and `attnlab data mad`: show what the model is trained on.

use crate::tasks::IGNORE;
use crate::tasks::mad;
use crate::tasks::mqar::Split;

use super::{DataArgs, ImportMadArgs, SplitArg};
use crate::report::{Format, Table};

pub fn mqar(args: &DataArgs) -> anyhow::Result<()> {
    let (path, split, format) = (&args.preset, args.split, args.format);
    let preset = crate::experiments::load_preset(path, &args.overrides)?;
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
    let examples = config.examples(split, args.n);
    let rows = examples
        .iter()
        .map(|e| (e.inputs.as_slice(), e.labels.as_slice()));
    print_rows(&examples, rows, format)
}

/// `attnlab data mad`: rows of a MAD probe, `{"inputs": […], "labels": […]}` each, a label
/// -100 where nothing is scored in that split.
pub fn mad(args: &DataArgs) -> anyhow::Result<()> {
    let (path, split, format) = (&args.preset, args.split, args.format);
    let preset = crate::experiments::load_preset(path, &args.overrides)?;
    let crate::tasks::TaskSpec::Mad(config) = &preset.task else {
        anyhow::bail!(
            "preset {} has task {}, not mad",
            path.display(),
            preset.task.name()
        );
    };
    let split = match split {
        SplitArg::Train => mad::Split::Train,
        SplitArg::Test => mad::Split::Test,
    };
    let rows = config.rows(split, args.n)?;
    let pairs = rows
        .iter()
        .map(|r| (r.inputs.as_slice(), r.labels.as_slice()));
    print_rows(&rows, pairs, format)
}

/// `attnlab data import-mad DIR`: `mad_in_context_recall` (MAD's model and protocol) with the
/// task the folder's name states and `task.data` its absolute path, after reading every file.
pub fn import_mad(args: &ImportMadArgs) -> anyhow::Result<()> {
    let dir = std::fs::canonicalize(&args.dir)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", args.dir.display()))?;
    let task = mad::MadConfig {
        data: Some(dir.clone()),
        ..crate::tasks::mad_data::settings_of(&dir)?
    };
    let mut preset = crate::experiments::shipped("mad_in_context_recall")?.preset(&[])?;
    preset.name = format!("mad-{}", task.probe.name());
    preset.description = format!(
        "MAD's {} on mad-lab's published rows ({}), in MAD's model and protocol",
        task.probe.name(),
        dir.display()
    );
    // MAD's batch of 128 and the views' examples, unless the folder holds fewer rows.
    let resolved = task.resolved();
    preset.train.batch_size = preset.train.batch_size.min(resolved.train_examples);
    preset.eval.attention_examples = preset.eval.attention_examples.min(resolved.test_examples);
    preset.task = crate::tasks::TaskSpec::Mad(task);
    preset.validate()?;
    let (train, test) = preset.task.datasets()?;
    eprintln!(
        "{}: {} training and {} test rows of {} tokens read and checked",
        dir.display(),
        train.len(),
        test.len(),
        train.seq_len
    );
    match &args.out {
        Some(path) => {
            preset.save(path)?;
            outln!("wrote {}", path.display());
        }
        None => out!("{}", preset.to_toml()?),
    }
    Ok(())
}

/// `all` as JSON, or its rows (tokens and labels) as tidy CSV or aligned text.
fn print_rows<'a>(
    all: &impl serde::Serialize,
    rows: impl Iterator<Item = (&'a [u32], &'a [i32])> + Clone,
    format: Format,
) -> anyhow::Result<()> {
    match format {
        Format::Json => outln!("{}", serde_json::to_string_pretty(all)?),
        Format::Csv => out!("{}", tidy_rows(rows).csv()),
        Format::Text => {
            for (inputs, labels) in rows {
                outln!("{}", text_row(inputs, labels));
            }
        }
    }
    Ok(())
}

/// One line per token: its row, position, id and target (empty where nothing is scored).
fn tidy_rows<'a>(rows: impl Iterator<Item = (&'a [u32], &'a [i32])>) -> Table {
    let mut table = Table::new(&["row", "position", "input", "label"]);
    for (row, (inputs, labels)) in rows.enumerate() {
        for (position, (&input, &label)) in inputs.iter().zip(labels).enumerate() {
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
fn text_row(inputs: &[u32], labels: &[i32]) -> String {
    let width = inputs
        .iter()
        .map(|t| t.to_string().len())
        .max()
        .unwrap_or(1);
    let tokens: Vec<String> = inputs.iter().map(|t| format!("{t:>width$}")).collect();
    let labels: Vec<String> = labels
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
