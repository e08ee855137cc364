//! MAD's score over a sweep's runs (mad-lab `mad/analysis.py:120-197`): per task setting the
//! highest last-evaluation accuracy over the (learning rate, weight decay) runs, per probe the
//! mean of those over its settings; and the published rows to draw beside it.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::preset::{Metric, Preset};
use crate::tasks::TaskSpec;
use crate::tasks::mad::Probe;
use crate::train::Summary;

/// The epochs MAD trains every run for (`mad/configs.py`): a sweep's epoch scale is its
/// epochs over these.
pub const MAD_EPOCHS: usize = 200;

/// What a finished run of a MAD probe adds to the score.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MadCell {
    pub probe: String,
    /// The task's settings, every one resolved: runs with equal settings are one setting of
    /// the score.
    pub setting: String,
    pub weight_decay: f64,
    /// The run's last test accuracy in `metric` (MAD scores the last model, not the best).
    pub last_accuracy: f64,
    pub metric: Metric,
    /// The epochs the run was planned for: its steps (`max_steps` included) over an epoch's.
    pub epochs: f64,
}

impl MadCell {
    /// The run's part of the score, or `None` when its task is not a MAD probe.
    pub fn of(preset: &Preset, summary: &Summary) -> Option<Self> {
        let TaskSpec::Mad(config) = &preset.task else {
            return None;
        };
        let resolved = config.resolved();
        let per_epoch = preset.train.steps_per_epoch(resolved.train_examples);
        Some(Self {
            probe: resolved.probe.name().into(),
            setting: format!("{resolved:?}"),
            weight_decay: preset.train.weight_decay,
            last_accuracy: summary.last_accuracy.unwrap_or(0.0),
            metric: summary.metric,
            epochs: summary.total_steps as f64 / per_epoch as f64,
        })
    }

    /// What tells two runs of one cell apart beyond the MQAR keys: the setting and the decay.
    pub fn key(&self) -> String {
        format!("{} wd {}", self.setting, self.weight_decay)
    }
}

/// The runs of MAD's grid for each task setting (mad-lab `benchmark.py`: lr {1e-4, 5e-4,
/// 1e-3} × weight decay {0, 0.1}): a setting's best of fewer is a lower bound of MAD's.
pub const GRID_RUNS: usize = 6;

/// What the mean over MAD's six probes goes by where a probe's name would stand: the published
/// tables' "Avg" column.
pub const AVERAGE: &str = "average";

/// A mechanism's MAD score on one probe, or its mean over the six.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MadScore {
    pub mechanism: String,
    /// A probe's name, or [`AVERAGE`].
    pub probe: String,
    /// The mean over settings of each setting's best last accuracy.
    pub score: f64,
    pub settings: usize,
    pub runs: usize,
    /// The fewest runs any of its settings took the best of: below [`GRID_RUNS`] the score is a
    /// lower bound of MAD's (`sweeps/mad_lite_quick.toml` trains one a setting).
    pub fewest_runs: usize,
    /// The runs' epochs over MAD's 200 (the largest, where runs differ): below 1, the score is
    /// not MAD's and says so.
    pub epoch_scale: f64,
    /// Whether every run scored macro accuracy, MAD's metric.
    pub macro_metric: bool,
}

/// How `scores` were made, in words: MAD's rule, and where some setting had fewer runs than
/// MAD's grid, that they are lower bounds of MAD's.
pub fn rule(scores: &[MadScore]) -> String {
    let rule = "per setting the best lr x weight decay run's last test accuracy";
    match scores.iter().map(|s| s.fewest_runs).min() {
        Some(fewest) if fewest < GRID_RUNS => format!(
            "{rule} (from as few as {fewest} of MAD's {GRID_RUNS} runs: a lower bound of \
             MAD's)"
        ),
        _ => rule.into(),
    }
}

/// The MAD score of each (mechanism, probe) among `runs`, (mechanism, `cell`) pairs, then each
/// mechanism's [`AVERAGE`] where it has all six.
pub fn scores<'a>(runs: impl IntoIterator<Item = (&'a str, &'a MadCell)>) -> Vec<MadScore> {
    let mut scores = probe_scores(runs);
    scores.extend(averages(&scores));
    scores
}

/// The MAD score of each (mechanism, probe) among `runs`.
fn probe_scores<'a>(runs: impl IntoIterator<Item = (&'a str, &'a MadCell)>) -> Vec<MadScore> {
    // (mechanism, probe) → setting → the runs' last accuracies, epochs and metrics.
    type Settings<'a> = BTreeMap<&'a str, Vec<&'a MadCell>>;
    let mut grouped: BTreeMap<(&str, &str), Settings> = BTreeMap::new();
    for (mechanism, cell) in runs {
        grouped
            .entry((mechanism, &cell.probe))
            .or_default()
            .entry(&cell.setting)
            .or_default()
            .push(cell);
    }
    grouped
        .into_iter()
        .map(|((mechanism, probe), settings)| {
            let best: Vec<f64> = settings
                .values()
                .map(|cells| cells.iter().map(|c| c.last_accuracy).fold(0.0, f64::max))
                .collect();
            let cells: Vec<&MadCell> = settings.values().flatten().copied().collect();
            MadScore {
                mechanism: mechanism.into(),
                probe: probe.into(),
                score: best.iter().sum::<f64>() / best.len() as f64,
                settings: best.len(),
                runs: cells.len(),
                fewest_runs: settings.values().map(Vec::len).min().unwrap_or(0),
                epoch_scale: cells.iter().map(|c| c.epochs).fold(0.0, f64::max) / MAD_EPOCHS as f64,
                macro_metric: cells.iter().all(|c| c.metric == Metric::Macro),
            }
        })
        .collect()
}

/// Each mechanism's mean over the six probes, the published tables' "Avg", for the mechanisms
/// scored on all six: a mean over fewer would not compare with it.
fn averages(scores: &[MadScore]) -> Vec<MadScore> {
    let mut by_mechanism: BTreeMap<&str, Vec<&MadScore>> = BTreeMap::new();
    for s in scores {
        by_mechanism.entry(&s.mechanism).or_default().push(s);
    }
    by_mechanism
        .into_iter()
        .filter(|(_, probes)| probes.len() == Probe::ALL.len())
        .map(|(mechanism, probes)| MadScore {
            mechanism: mechanism.into(),
            probe: AVERAGE.into(),
            score: probes.iter().map(|s| s.score).sum::<f64>() / probes.len() as f64,
            settings: probes.iter().map(|s| s.settings).sum(),
            runs: probes.iter().map(|s| s.runs).sum(),
            fewest_runs: probes.iter().map(|s| s.fewest_runs).min().unwrap_or(0),
            epoch_scale: probes.iter().map(|s| s.epoch_scale).fold(0.0, f64::max),
            macro_metric: probes.iter().all(|s| s.macro_metric),
        })
        .collect()
}

/// A published MAD row: the model, the attnlab mechanism it corresponds to, and its score per
/// probe (by [`crate::tasks::mad::Probe::name`]), as fractions.
pub struct PublishedRow {
    pub model: &'static str,
    pub mechanism: &'static str,
    pub scores: [(&'static str, f64); 6],
}

/// The DeltaNet paper's MAD table (Yang et al. 2024, arXiv 2406.06484), the baselines later
/// papers reprint (../shared/reference/mixers-mad-checkpoints.md §1.4), for the mechanisms
/// attnlab has.
pub const PUBLISHED: [PublishedRow; 3] = [
    PublishedRow {
        model: "Transformer",
        mechanism: "softmax",
        scores: table_row([51.6, 29.8, 94.1, 85.2, 86.8, 99.6]),
    },
    PublishedRow {
        model: "GLA",
        mechanism: "gla",
        scores: table_row([38.8, 6.9, 80.8, 63.3, 81.6, 88.6]),
    },
    PublishedRow {
        model: "DeltaNet",
        mechanism: "deltanet",
        scores: table_row([42.2, 35.7, 100.0, 52.8, 100.0, 100.0]),
    },
];

/// The paper's row in its column order (compress, fuzzy, in-context recall, memorise, noisy,
/// selective copy; percent), named by probe.
const fn table_row(percent: [f64; 6]) -> [(&'static str, f64); 6] {
    [
        ("compression", percent[0] / 100.0),
        ("fuzzy-in-context-recall", percent[1] / 100.0),
        ("in-context-recall", percent[2] / 100.0),
        ("memorization", percent[3] / 100.0),
        ("noisy-in-context-recall", percent[4] / 100.0),
        ("selective-copying", percent[5] / 100.0),
    ]
}

/// The published score of the model that `mechanism` stands for on `probe` (or its
/// [`AVERAGE`]), with its name.
pub fn published(mechanism: &str, probe: &str) -> Option<(&'static str, f64)> {
    let row = PUBLISHED.iter().find(|r| r.mechanism == mechanism)?;
    if probe == AVERAGE {
        // Rounded as the table's "Avg" column, to a tenth of a percent.
        let sum: f64 = row.scores.iter().map(|(_, score)| score).sum();
        let average = (sum / row.scores.len() as f64 * 1000.0).round() / 1000.0;
        return Some((row.model, average));
    }
    let (_, score) = row.scores.iter().find(|(p, _)| *p == probe)?;
    Some((row.model, *score))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(probe: &str, setting: &str, wd: f64, accuracy: f64) -> MadCell {
        MadCell {
            probe: probe.into(),
            setting: setting.into(),
            weight_decay: wd,
            last_accuracy: accuracy,
            metric: Metric::Macro,
            epochs: 10.0,
        }
    }

    /// mad-lab's rule: the best (lr, wd) run per setting, then the mean over settings; each
    /// mechanism and probe apart.
    #[test]
    fn the_score_is_the_mean_over_settings_of_the_best_run() {
        let cells = [
            cell("in-context-recall", "a", 0.0, 0.5),
            cell("in-context-recall", "a", 0.1, 0.9),
            cell("in-context-recall", "b", 0.0, 0.3),
            cell("memorization", "m", 0.0, 0.2),
        ];
        let runs = cells
            .iter()
            .map(|c| ("softmax", c))
            .chain([("linear", &cells[2])]);
        let scores = scores(runs);
        let at = |mechanism: &str, probe: &str| {
            scores
                .iter()
                .find(|s| s.mechanism == mechanism && s.probe == probe)
                .unwrap()
        };
        let recall = at("softmax", "in-context-recall");
        assert!((recall.score - (0.9 + 0.3) / 2.0).abs() < 1e-12);
        assert_eq!((recall.settings, recall.runs), (2, 3));
        assert_eq!(recall.epoch_scale, 0.05);
        assert!(recall.macro_metric);
        assert_eq!(at("softmax", "memorization").score, 0.2);
        assert_eq!(at("linear", "in-context-recall").score, 0.3);
        assert_eq!(
            scores.len(),
            3,
            "no mechanism has all six probes: no average"
        );
    }

    /// The average is the mean over the six probes' scores, only for a mechanism that has all
    /// six, as the published tables' "Avg" column.
    #[test]
    fn a_mechanism_with_all_six_probes_gets_their_mean() {
        let cells: Vec<MadCell> = (Probe::ALL.iter().enumerate())
            .map(|(i, p)| cell(p.name(), "s", 0.0, i as f64 / 10.0))
            .collect();
        let runs = cells
            .iter()
            .map(|c| ("softmax", c))
            .chain(cells[..5].iter().map(|c| ("linear", c)));
        let scores = scores(runs);
        let averages: Vec<&MadScore> = scores.iter().filter(|s| s.probe == AVERAGE).collect();
        assert_eq!(averages.len(), 1, "linear has five probes");
        assert_eq!(averages[0].mechanism, "softmax");
        assert!((averages[0].score - 0.25).abs() < 1e-12);
        assert_eq!((averages[0].settings, averages[0].runs), (6, 6));
    }

    /// A setting's score is the best of its runs: where some setting has fewer than MAD's six
    /// (the quick sweep trains one), the score is a lower bound of MAD's and the rule says so.
    #[test]
    fn the_rule_says_when_a_setting_had_fewer_runs_than_mads_grid() {
        let grid: Vec<MadCell> = [0.0, 0.1]
            .iter()
            .flat_map(|&decay| [0.1, 0.2, 0.3].map(|a| cell("memorization", "s", decay, a)))
            .collect();
        let one = cell("compression", "s", 0.1, 0.4);
        // Two settings of one probe, of six runs and of one: the fewest is one.
        let other = cell("memorization", "t", 0.1, 0.5);
        let runs = grid.iter().chain([&other]).map(|c| ("softmax", c));
        let uneven = scores(runs);
        assert_eq!((uneven[0].settings, uneven[0].runs), (2, 7));
        assert_eq!(uneven[0].fewest_runs, 1);
        assert!(
            rule(&uneven).contains("as few as 1 of MAD's 6 runs"),
            "{}",
            rule(&uneven)
        );
        let full = scores(grid.iter().map(|c| ("softmax", c)));
        assert_eq!(full[0].fewest_runs, 6);
        assert!(!rule(&full).contains("lower bound"), "{}", rule(&full));
        let quick = scores(grid.iter().chain([&one]).map(|c| ("linear", c)));
        assert_eq!(
            quick.iter().map(|s| s.fewest_runs).collect::<Vec<_>>(),
            [1, 6]
        );
        assert!(rule(&quick).contains("a lower bound"), "{}", rule(&quick));
    }

    #[test]
    fn published_rows_are_read_by_probe() {
        assert_eq!(
            published("softmax", "in-context-recall"),
            Some(("Transformer", 0.941))
        );
        let (model, score) = published("deltanet", "compression").unwrap();
        assert_eq!(model, "DeltaNet");
        assert!((score - 0.422).abs() < 1e-12);
        assert_eq!(published("rebased", "compression"), None);
        // The DeltaNet paper's "Avg" column.
        assert_eq!(published("softmax", AVERAGE), Some(("Transformer", 0.745)));
        assert_eq!(published("gla", AVERAGE), Some(("GLA", 0.6)));
        assert_eq!(published("deltanet", AVERAGE), Some(("DeltaNet", 0.718)));
    }
}
