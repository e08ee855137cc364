//! `attnlab sweep`: train a grid of runs, plan it for a scheduler, or collect finished runs.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use crate::report::sweep::SweepReport;
use crate::report::{Format, render};
use crate::sweep::{Eta, Sweep, SweepEvent, SweepSummary, collect, run_sweep};
use crate::train::TrainEvent;

/// `attnlab sweep` options.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct SweepArgs {
    #[command(subcommand)]
    action: Option<SweepAction>,
    /// The sweep file (TOML) to train; finished cells are skipped.
    file: Option<PathBuf>,
    /// Groups of cells trained at once, each on its share of the cores (overrides the file's
    /// `workers`; 0: one per core, one on a GPU).
    #[arg(long)]
    workers: Option<usize>,
    /// The most cells of one shape trained as replicas of one model (overrides the file's
    /// `replicas`; 1 trains cell by cell).
    #[arg(long)]
    replicas: Option<usize>,
    /// Train only group N (from 1) of `sweep plan --groups`.
    #[arg(long, value_name = "N")]
    group: Option<usize>,
    /// Train only the cells whose name matches this glob, e.g. 'in-context-recall-linear-*'
    /// (quoted for the shell); their groups are formed among themselves.
    #[arg(long, value_name = "GLOB", conflicts_with = "group")]
    cells: Option<String>,
}

#[derive(Debug, Subcommand)]
enum SweepAction {
    /// Print one self-contained `attnlab train` command per cell (for a Slurm array, GNU
    /// parallel, …), or write them to --out, one per line.
    Plan {
        file: PathBuf,
        #[arg(long)]
        out: Option<PathBuf>,
        /// List unfinished cells (or groups with an unfinished cell) only.
        #[arg(long)]
        pending: bool,
        /// One command per group of replicas (`attnlab sweep FILE --group N`) instead of one
        /// `attnlab train` per cell.
        #[arg(long)]
        groups: bool,
        /// With --groups: the most cells per group (overrides the file's `replicas`).
        #[arg(long)]
        replicas: Option<usize>,
    },
    /// Merge the finished run folders under DIRs into one summary and figures.
    Collect {
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        /// Where summary.json and the figures go (default: the first DIR).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// `attnlab sweep …`.
pub fn sweep(args: &SweepArgs) -> anyhow::Result<()> {
    match (&args.action, &args.file) {
        (
            Some(SweepAction::Plan {
                file,
                out,
                pending,
                groups,
                replicas,
            }),
            _,
        ) => plan(file, out.as_ref(), *pending, groups.then_some(*replicas)),
        (Some(SweepAction::Collect { dirs, out }), _) => {
            let summary = collect(dirs)?;
            report(summary, out.as_ref().unwrap_or(&dirs[0]))
        }
        (None, Some(file)) => train(file, args),
        (None, None) => anyhow::bail!("give a sweep file, or `plan FILE` / `collect DIR…`"),
    }
}

/// `sweep plan`: a command per cell, or per group of replicas when `groups` is `Some(the
/// --replicas given, if any)`.
fn plan(
    file: &std::path::Path,
    out: Option<&PathBuf>,
    pending: bool,
    groups: Option<Option<usize>>,
) -> anyhow::Result<()> {
    let mut sweep = Sweep::load(&crate::experiments::sweep_file(file)?)?;
    if let Some(Some(r)) = groups {
        anyhow::ensure!(
            r >= 1,
            "--replicas must be at least 1 (1 trains cell by cell)"
        );
        sweep.replicas = r;
    }
    // Read only for --pending: a plan of every cell does not depend on what has trained.
    let finished: Vec<bool> = match pending {
        true => (sweep.cells.iter())
            .map(|cell| Ok(sweep.finished_run(cell)?.is_some()))
            .collect::<crate::Result<_>>()?,
        false => vec![false; sweep.cells.len()],
    };
    let unfinished = |cell: &usize| !finished[*cell];
    let commands: Vec<String> = match groups {
        Some(_) => sweep
            .group_plan(file)?
            .into_iter()
            .zip(sweep.all_groups()?)
            .filter(|(_, group)| !pending || group.iter().any(unfinished))
            .map(|(command, _)| command)
            .collect(),
        None => sweep
            .plan()
            .into_iter()
            .enumerate()
            .filter(|(cell, _)| !pending || unfinished(cell))
            .map(|(_, command)| command)
            .collect(),
    };
    // A shipped sweep's base is a copy in this machine's temporary folder: name it instead.
    let base = sweep.base.to_string_lossy().into_owned();
    let commands: Vec<String> = match crate::experiments::shipped_preset_name(&sweep.base) {
        Some(name) => commands
            .iter()
            .map(|c| c.replacen(&base, name, 1))
            .collect(),
        None => commands,
    };
    match out {
        Some(path) => {
            crate::io::write_bytes(path, format!("{}\n", commands.join("\n")).as_bytes())?;
            eprintln!("{} commands written to {}", commands.len(), path.display());
        }
        None => {
            for command in commands {
                outln!("{command}");
            }
        }
    }
    Ok(())
}

fn train(file: &std::path::Path, args: &SweepArgs) -> anyhow::Result<()> {
    let mut sweep = Sweep::load(&crate::experiments::sweep_file(file)?)?;
    if let Some(w) = args.workers {
        sweep.workers = w;
    }
    if let Some(r) = args.replicas {
        anyhow::ensure!(
            r >= 1,
            "--replicas must be at least 1 (1 trains cell by cell)"
        );
        sweep.replicas = r;
    }
    if let Some(n) = args.group {
        sweep = sweep.only_group(n)?;
    }
    if let Some(pattern) = &args.cells {
        sweep = sweep.only_cells(pattern)?;
    }
    let bar = ProgressBar::new(sweep.cells.len() as u64);
    bar.set_style(ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} cells {msg}",
    )?);
    bar.enable_steady_tick(Duration::from_millis(200));
    let mut progress = Progress::new(sweep.cells.len());
    // One line per cell on stderr, through the bar: shown above it on a terminal, and plain
    // lines in a batch job's log, where the bar itself is hidden.
    let line = |text: String| bar.suspend(|| eprintln!("{text}"));
    // Ctrl-C or SIGTERM: no new groups start, the running cells stop after their step and
    // are trained again on resume.
    let stop = super::signals::install();
    let summary = run_sweep(&sweep, stop, &mut |event| match event {
        SweepEvent::Planned {
            groups,
            split,
            work,
        } => {
            progress.planned(&work);
            let cells: usize = groups.iter().map(Vec::len).sum();
            line(format!(
                "{cells} cells to train in {} groups of replicas, {} at a time on {} thread(s) each",
                groups.len(),
                split.workers,
                split.threads
            ));
        }
        SweepEvent::GroupStarted { cells } => {
            let ids: Vec<&str> = cells.iter().map(|&c| sweep.cells[c].id.as_str()).collect();
            line(format!(
                "training {} as one group: {}",
                ids.len(),
                ids.join(", ")
            ));
        }
        SweepEvent::Skipped { cell, run_dir } => {
            bar.inc(1);
            progress.skipped();
            let id = &sweep.cells[cell].id;
            line(format!(
                "{} {id}: done already ({})",
                progress.count(),
                run_dir.display()
            ));
        }
        SweepEvent::Train { cell, event } => {
            progress.record(cell, &event);
            match event {
                TrainEvent::Step(s) => bar.set_message(format!(
                    "{} step {}{}",
                    sweep.cells[cell].id,
                    s.step,
                    progress.time_left()
                )),
                TrainEvent::Finished(summary) => {
                    bar.inc(1);
                    line(format!(
                        "{} {}",
                        progress.count(),
                        cell_line(&sweep.cells[cell].id, &summary)
                    ));
                }
                TrainEvent::Failed { message, .. } => {
                    bar.inc(1);
                    line(format!(
                        "{} {} failed: {message}",
                        progress.count(),
                        sweep.cells[cell].id
                    ));
                }
                _ => {}
            }
        }
    })?;
    bar.finish_and_clear();
    report(summary, &sweep.out)
}

/// Cells done so far and the work left, for the running count and the ETA of the per-cell
/// lines.
struct Progress {
    total: usize,
    done: usize,
    eta: Eta,
    started: Instant,
}

impl Progress {
    fn new(total: usize) -> Self {
        Self {
            total,
            done: 0,
            eta: Eta::default(),
            started: Instant::now(),
        }
    }

    fn planned(&mut self, work: &[f64]) {
        self.eta = Eta::new(work);
    }

    fn skipped(&mut self) {
        self.done += 1;
    }

    fn record(&mut self, cell: usize, event: &TrainEvent) {
        self.eta.record(cell, event);
        if matches!(event, TrainEvent::Finished(_) | TrainEvent::Failed { .. }) {
            self.done += 1;
        }
    }

    /// `, ETA …`: the time left at the pace of the work done so far ([`Eta`]); empty before
    /// any is done and after the last.
    fn time_left(&self) -> String {
        self.eta
            .seconds_left(self.started.elapsed().as_secs_f64())
            .map_or(String::new(), |left| format!(", ETA {}", duration(left)))
    }

    /// `[done/total, ETA …]`.
    fn count(&self) -> String {
        format!("[{}/{}{}]", self.done, self.total, self.time_left())
    }
}

/// Seconds as `1h02m`, `3m05s` or `12s`.
fn duration(secs: f64) -> String {
    let s = secs.round() as u64;
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s:02}s"),
        (h, m, _) => format!("{h}h{m:02}m"),
    }
}

/// A finished cell in one line: its id, status, best accuracy and seconds.
fn cell_line(id: &str, s: &crate::train::Summary) -> String {
    let accuracy = s
        .best_accuracy
        .map_or("-".into(), |a| format!("{:.2}%", 100.0 * a));
    format!(
        "{id}: {}, best test accuracy ({}) {accuracy}, {} steps in {:.1} s",
        s.status.describe(),
        s.metric.name(),
        s.steps,
        s.elapsed_secs
    )
}

/// Writes the summary files beside the runs and prints the best-lr table.
fn report(summary: SweepSummary, dir: &std::path::Path) -> anyhow::Result<()> {
    let report = SweepReport { summary };
    for path in report.write(dir)? {
        eprintln!("wrote {}", path.display());
    }
    out!("{}", render(&report, Format::Text)?);
    for why in &report.summary.unreadable {
        eprintln!("left out, unreadable: {why}");
    }
    for run in &report.summary.unfinished {
        eprintln!("left out, not finished: {run}");
    }
    if report.summary.runs.is_empty() {
        eprintln!("no finished run under {}", dir.display());
    }
    if report.summary.duplicates > 0 {
        eprintln!(
            "{} runs repeated the settings of a later run and were left out",
            report.summary.duplicates
        );
    }
    Ok(())
}
