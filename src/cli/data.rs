//! `attnlab data`: show what the model is trained and tested on, for any task, and bring
//! mad-lab's published data in.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};

use crate::report::{Format, Table};
use crate::tasks::{IGNORE, Row, Split, mad};

/// The most rows `attnlab data` prints.
const MAX_DATA_ROWS: u64 = 1000;

/// `attnlab data` options: a preset's rows, or an action.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct DataArgs {
    #[command(subcommand)]
    action: Option<DataAction>,
    /// The preset whose task's rows to print (MQAR, a MAD probe, a language model's corpus:
    /// any task).
    preset: Option<PathBuf>,
    /// Override one preset key, e.g. --set task.probe=selective-copying (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Number of rows (at most 1000).
    #[arg(long, default_value_t = 4, value_parser = super::bounded(1, MAX_DATA_ROWS))]
    n: usize,
    /// The split: its rows are seeded apart and may score other positions (MAD's recall
    /// probes score only the recalled values at test).
    #[arg(long, value_enum, default_value_t = SplitArg::Train)]
    split: SplitArg,
    /// JSON: a list of rows `{"inputs", "labels", "queries"}`, each label the target at its
    /// position (-100: not scored in this split), `queries` where each scored query must read
    /// (tasks with a ground truth).
    #[arg(long, value_enum, default_value_t = Format::Json)]
    format: Format,
}

#[derive(Debug, Subcommand)]
enum DataAction {
    /// The preset that trains on a folder of mad-lab's published data (Zenodo 10843663:
    /// train/ and test/, each inputs.npy and targets.npy): MAD's model and protocol, the task
    /// its folder's name states, every file checked; printed, or written to --out.
    ImportMad(ImportMadArgs),
}

#[derive(Debug, Args)]
struct ImportMadArgs {
    /// The data folder, named as mad-lab names it (t-CR_vs-16_sl-128_ntr-12800_…).
    dir: PathBuf,
    /// Write the preset here instead of printing it.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum SplitArg {
    Train,
    Test,
}

pub fn data(args: &DataArgs) -> anyhow::Result<()> {
    match (&args.action, &args.preset) {
        (Some(DataAction::ImportMad(import)), _) => import_mad(import),
        (None, Some(preset)) => rows(preset, args),
        (None, None) => anyhow::bail!("give a PRESET, or `import-mad DIR`"),
    }
}

/// `attnlab data PRESET`: the first rows of the preset's task in a split.
fn rows(path: &std::path::Path, args: &DataArgs) -> anyhow::Result<()> {
    let preset = crate::experiments::load_preset(path, &args.overrides)?;
    let split = match args.split {
        SplitArg::Train => Split::Train,
        SplitArg::Test => Split::Test,
    };
    let rows = preset.task.rows(split, args.n)?;
    match args.format {
        Format::Json => outln!("{}", serde_json::to_string_pretty(&rows)?),
        Format::Csv => out!("{}", tidy_rows(&rows).csv()),
        Format::Text => {
            for row in &rows {
                outln!("{}\n", row.text(usize::MAX));
            }
        }
    }
    Ok(())
}

/// `attnlab data import-mad DIR`: `mad_in_context_recall` (MAD's model and protocol) with the
/// task the folder's name states and `task.data` its absolute path, after reading every file.
fn import_mad(args: &ImportMadArgs) -> anyhow::Result<()> {
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

/// One line per token: its row, position, id and target (empty where nothing is scored).
fn tidy_rows(rows: &[Row]) -> Table {
    let mut table = Table::new(&["row", "position", "input", "label"]);
    for (i, row) in rows.iter().enumerate() {
        for (position, (&input, &label)) in row.inputs.iter().zip(&row.labels).enumerate() {
            let label = (label != IGNORE).then_some(label);
            table.push(vec![i.into(), position.into(), input.into(), label.into()]);
        }
    }
    table
}
