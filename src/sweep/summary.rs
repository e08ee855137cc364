//! A sweep's summary from its run folders: the best learning rate per cell by the mean over
//! seeds, as the ReBased paper's Figure 1 (`main_fig_parsing.ipynb`): for each mechanism,
//! length and width, the lr with the highest mean accuracy over seeds, with the mean and the
//! sample standard deviation (n − 1; 0 for one seed) over seeds at that lr. A run's accuracy is
//! its best test accuracy over evaluations (the paper's `max_accuracy`). Runs of MAD's probes
//! make MAD's score instead ([`super::mad`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::is_finished;
use super::mad::{self, MadCell, MadScore};
use crate::preset::Preset;
use crate::train::{RunDir, RunStatus, Summary};
use crate::{Error, Result};

/// How deep `collect` looks for run folders under each directory it is given (a sweep's
/// `out/<cell>/<run>` is depth 2).
const MAX_DEPTH: usize = 4;

/// One finished run of a sweep.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CellResult {
    pub run_dir: PathBuf,
    pub mechanism: String,
    pub seq_len: usize,
    pub num_kv_pairs: usize,
    pub d_model: usize,
    pub lr: f64,
    pub seed: u64,
    /// Best test accuracy over the run's evaluations.
    pub accuracy: f64,
    /// The model's recurrent state in zoology's units (`None`: it has none, as Linformer).
    pub state_zoology: Option<usize>,
    /// What a run of a MAD probe adds to MAD's score; such runs are no point of the MQAR plots.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mad: Option<MadCell>,
}

/// One point of the Figure-1 plot: a mechanism at one length and width, at its best lr.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SummaryPoint {
    pub mechanism: String,
    pub seq_len: usize,
    pub num_kv_pairs: usize,
    pub d_model: usize,
    pub best_lr: f64,
    /// Mean accuracy over seeds at `best_lr`.
    pub mean: f64,
    /// Sample standard deviation over seeds at `best_lr`.
    pub std: f64,
    pub seeds: usize,
    /// The model's recurrent state in zoology's units: the x axis of the recall-vs-state plot.
    pub state_zoology: Option<usize>,
    /// Every lr tried: (lr, mean over seeds, seeds).
    pub by_lr: Vec<(f64, f64, usize)>,
}

/// The summary of a set of finished runs.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SweepSummary {
    pub runs: Vec<CellResult>,
    pub points: Vec<SummaryPoint>,
    /// Runs left out because a later run had the same settings.
    pub duplicates: usize,
    /// MAD's score per mechanism and probe, from the runs of MAD's probes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mad: Vec<MadScore>,
    /// Run folders left out because their files did not read, each with why: one broken run
    /// costs its own result, not the others'.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<String>,
    /// Run folders left out because their run has not finished (running, stopped, failed),
    /// each with its status: a score read without them should say so.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unfinished: Vec<String>,
}

/// The name a run's mechanism gets in the summary: the kind, with what sets it apart as a
/// point of the plots (a softmax window, a ReBased ablation, Linformer's k).
pub fn mechanism_label(preset: &Preset) -> String {
    preset.attention.label()
}

/// Every finished run folder under `dirs` (searched a few levels deep), summarised.
pub fn collect(dirs: &[PathBuf]) -> Result<SweepSummary> {
    let mut found = Found::default();
    for dir in dirs {
        if !dir.is_dir() {
            return Err(Error::RunDir {
                message: "not a folder".into(),
                path: dir.clone(),
            });
        }
        find_runs(dir, MAX_DEPTH, &mut found)?;
    }
    found.runs.sort_by(|a, b| a.run_dir.cmp(&b.run_dir));
    // A stopped run that a finished run of the same settings replaced is no loss.
    let finished: std::collections::BTreeSet<RunKey> =
        found.runs.iter().map(CellResult::key).collect();
    let unfinished = (found.unfinished.into_iter())
        .filter(|run| run.key.as_ref().is_none_or(|key| !finished.contains(key)))
        .map(|run| format!("{} ({})", run.dir.display(), run.status.describe()))
        .collect();
    Ok(SweepSummary {
        unreadable: found.unreadable,
        unfinished,
        ..summarise(found.runs)
    })
}

/// What [`collect`] found: the finished runs, the run folders that did not read and the runs
/// that have not finished, with their status.
#[derive(Default)]
struct Found {
    runs: Vec<CellResult>,
    unreadable: Vec<String>,
    unfinished: Vec<Unfinished>,
}

/// A run that has not finished: its folder, its status and, where its preset reads, its
/// settings (a finished run of the same settings makes it no loss).
struct Unfinished {
    dir: PathBuf,
    status: RunStatus,
    key: Option<RunKey>,
}

/// Adds the runs at or under `dir` to `found`: a finished run whose summary or preset does not
/// read is named in `found.unreadable`, with the error; an unfinished one needs only its
/// summary, which says it has not finished.
fn find_runs(dir: &Path, depth: usize, found: &mut Found) -> Result<()> {
    if let Ok(run) = RunDir::open(dir) {
        match run.read_summary() {
            Ok(summary) if !is_finished(summary.status) => found.unfinished.push(Unfinished {
                dir: dir.to_path_buf(),
                status: summary.status,
                key: run_result(&run, dir, &summary).ok().map(|r| r.key()),
            }),
            Ok(summary) => match run_result(&run, dir, &summary) {
                Ok(result) => found.runs.push(result),
                Err(e) => found.unreadable.push(e.to_string()),
            },
            Err(e) => found.unreadable.push(e.to_string()),
        }
        return Ok(());
    }
    if depth == 0 {
        return Ok(());
    }
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io("cannot list folder", dir, e))?;
    let mut subdirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir() && !crate::train::run_dir::is_hidden(p))
        .collect();
    subdirs.sort();
    for sub in subdirs {
        find_runs(&sub, depth - 1, found)?;
    }
    Ok(())
}

/// The result so far of the run in `dir`, whose summary is `summary`.
fn run_result(run: &RunDir, dir: &Path, summary: &Summary) -> Result<CellResult> {
    let preset = run.read_preset()?;
    let (seq_len, num_kv_pairs) = preset
        .task
        .mqar()
        .map_or((preset.task.seq_len(), 0), |c| (c.seq_len, c.num_kv_pairs));
    Ok(CellResult {
        run_dir: dir.to_path_buf(),
        mechanism: mechanism_label(&preset),
        seq_len,
        num_kv_pairs,
        d_model: preset.model.d_model,
        lr: preset.train.lr,
        seed: preset.train.seed,
        accuracy: summary.best_accuracy.unwrap_or(0.0),
        state_zoology: preset.state().map(|s| s.zoology_units),
        mad: MadCell::of(&preset, summary),
    })
}

/// A point of the plot: mechanism, sequence length, pairs, d_model.
type CellKey = (String, usize, usize, usize);

/// A run's settings as the summary tells runs apart: a later run with the same replaces it.
type RunKey = (String, usize, usize, usize, u64, u64, Option<String>);

impl CellResult {
    fn key(&self) -> RunKey {
        (
            self.mechanism.clone(),
            self.seq_len,
            self.num_kv_pairs,
            self.d_model,
            self.lr.to_bits(),
            self.seed,
            self.mad.as_ref().map(MadCell::key),
        )
    }
}

/// Groups `runs` (later ones replace earlier ones with the same settings) into summary points.
pub fn summarise(runs: Vec<CellResult>) -> SweepSummary {
    let total = runs.len();
    let mut unique: BTreeMap<RunKey, CellResult> = BTreeMap::new();
    for run in runs {
        unique.insert(run.key(), run);
    }
    let runs: Vec<CellResult> = unique.into_values().collect();
    let mut cells: BTreeMap<CellKey, BTreeMap<u64, Vec<f64>>> = BTreeMap::new();
    let mut states: BTreeMap<CellKey, Option<usize>> = BTreeMap::new();
    for run in runs.iter().filter(|r| r.mad.is_none()) {
        let key = (
            run.mechanism.clone(),
            run.seq_len,
            run.num_kv_pairs,
            run.d_model,
        );
        states.insert(key, run.state_zoology);
        cells
            .entry((
                run.mechanism.clone(),
                run.seq_len,
                run.num_kv_pairs,
                run.d_model,
            ))
            .or_default()
            .entry(run.lr.to_bits())
            .or_default()
            .push(run.accuracy);
    }
    let points = cells
        .into_iter()
        .map(|((mechanism, seq_len, num_kv_pairs, d_model), by_lr)| {
            let (best_lr, seeds) = by_lr
                .iter()
                .max_by(|a, b| mean(a.1).total_cmp(&mean(b.1)))
                .map(|(lr, accs)| (f64::from_bits(*lr), accs.as_slice()))
                .unwrap_or((0.0, &[]));
            let state_zoology = states
                .get(&(mechanism.clone(), seq_len, num_kv_pairs, d_model))
                .copied()
                .flatten();
            SummaryPoint {
                state_zoology,
                mechanism,
                seq_len,
                num_kv_pairs,
                d_model,
                best_lr,
                mean: mean(seeds),
                std: sample_std(seeds),
                seeds: seeds.len(),
                by_lr: by_lr
                    .iter()
                    .map(|(lr, accs)| (f64::from_bits(*lr), mean(accs), accs.len()))
                    .collect(),
            }
        })
        .collect();
    SweepSummary {
        unreadable: Vec::new(),
        unfinished: Vec::new(),
        duplicates: total - runs.len(),
        mad: mad::scores(
            runs.iter()
                .filter_map(|r| Some((r.mechanism.as_str(), r.mad.as_ref()?))),
        ),
        runs,
        points,
    }
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// Sample standard deviation (n − 1 in the denominator); 0 for fewer than two values.
fn sample_std(values: &[f64]) -> f64 {
    if values.len() < 2 {
        return 0.0;
    }
    let m = mean(values);
    (values.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (values.len() - 1) as f64).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(mechanism: &str, d_model: usize, lr: f64, seed: u64, accuracy: f64) -> CellResult {
        CellResult {
            run_dir: PathBuf::from(format!("{mechanism}-{d_model}-{lr}-{seed}")),
            mechanism: mechanism.into(),
            seq_len: 64,
            num_kv_pairs: 4,
            d_model,
            lr,
            seed,
            accuracy,
            state_zoology: Some(4 * d_model),
            mad: None,
        }
    }

    #[test]
    fn best_lr_is_chosen_by_the_mean_over_seeds() {
        // lr 1e-3: one lucky seed (mean 0.55); lr 3e-3: steady (mean 0.6).
        let summary = summarise(vec![
            result("based", 32, 1e-3, 0, 1.0),
            result("based", 32, 1e-3, 1, 0.1),
            result("based", 32, 3e-3, 0, 0.5),
            result("based", 32, 3e-3, 1, 0.7),
            result("softmax", 32, 1e-3, 0, 0.9),
        ]);
        assert_eq!(summary.points.len(), 2);
        let based = &summary.points[0];
        assert_eq!(based.best_lr, 3e-3);
        assert!((based.mean - 0.6).abs() < 1e-12);
        // Sample std of {0.5, 0.7}: sqrt(0.02 / 1).
        assert!((based.std - 0.02f64.sqrt()).abs() < 1e-12);
        assert_eq!(based.seeds, 2);
        assert_eq!(summary.points[1].std, 0.0, "one seed: no spread");
    }

    #[test]
    fn a_later_run_with_the_same_settings_replaces_the_earlier() {
        let summary = summarise(vec![
            result("based", 32, 1e-3, 0, 0.2),
            result("based", 32, 1e-3, 0, 0.8),
        ]);
        assert_eq!(summary.duplicates, 1);
        assert_eq!(summary.points[0].mean, 0.8);
    }
}
