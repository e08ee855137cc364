//! The report of `attnlab bench`: step time, replicas, time to the target accuracy and the
//! PyTorch references beside them. Its JSON is what `scripts/gpu-check.sh` and the tables of
//! docs/performance.md and docs/gpu.md are read from.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value, json};

use super::{Report, Table};
use crate::figures::Figure;

/// One benchmark of a preset.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// The preset's name.
    pub config: String,
    pub device: String,
    pub precision: String,
    /// Rayon's threads (the CPU path's parallelism).
    pub threads: usize,
    /// Mean milliseconds per training step over the timed steps.
    pub ms_per_step: f64,
    pub tokens_per_s: f64,
    /// Autograd nodes of one step.
    pub graph_nodes: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas: Option<ReplicaTiming>,
    /// The preset and another mechanism trained in alternation (`--against`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub against: Option<AgainstTiming>,
    /// Time to the target accuracy, unless only steps were timed.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub target: Option<TargetTime>,
    /// The plain PyTorch reference (`--torch`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub torch: Option<TorchTiming>,
    /// attnlab's step time over PyTorch's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_ratio: Option<f64>,
    /// attnlab's time to the target over PyTorch's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_to_99_ratio: Option<f64>,
    /// The fast GPU reference's modes (`--torch-fast`: eager, tf32, bf16, compile).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub torch_fast: BTreeMap<String, FastMode>,
}

/// N replicas trained as one group against N steps of one model alone.
#[derive(Clone, Debug, Serialize)]
pub struct ReplicaTiming {
    pub n: usize,
    pub ms_per_group_step: f64,
    pub ms_per_model_step: f64,
    /// N × the lone step time over the group's.
    pub speedup: f64,
}

/// The preset's step time beside another mechanism's, the two trained in alternation.
#[derive(Clone, Debug, Serialize)]
pub struct AgainstTiming {
    /// The other mechanism.
    pub kind: String,
    pub rounds: usize,
    /// The preset's mean milliseconds per step over the rounds (not the report's own
    /// `ms_per_step`, which is a run of the preset alone).
    pub own_ms_per_step: f64,
    /// The other mechanism's.
    pub other_ms_per_step: f64,
    /// The median over rounds of the preset's step time over the other's.
    pub ratio: f64,
    /// The lowest and highest ratio of a round.
    pub ratio_min: f64,
    pub ratio_max: f64,
}

impl AgainstTiming {
    /// From each round's [preset, other] milliseconds per step (at least one round), the
    /// other mechanism `kind`.
    pub fn of(kind: &str, rounds: &[[f64; 2]]) -> Self {
        let mean = |i: usize| rounds.iter().map(|r| r[i]).sum::<f64>() / rounds.len() as f64;
        let mut ratios: Vec<f64> = rounds.iter().map(|r| r[0] / r[1]).collect();
        ratios.sort_by(f64::total_cmp);
        let n = ratios.len();
        Self {
            kind: kind.to_string(),
            rounds: n,
            own_ms_per_step: mean(0),
            other_ms_per_step: mean(1),
            ratio: (ratios[(n - 1) / 2] + ratios[n / 2]) / 2.0,
            ratio_min: ratios[0],
            ratio_max: ratios[n - 1],
        }
    }
}

/// Training with an evaluation per epoch until the target accuracy.
#[derive(Clone, Debug, Serialize)]
pub struct TargetTime {
    /// The target (0.99 in the reference preset), for the text.
    #[serde(skip)]
    pub accuracy: f64,
    /// The epochs trained when it was never reached.
    #[serde(skip)]
    pub epochs: usize,
    /// Seconds to the target, evaluation included; `None`: not reached.
    pub time_to_99_s: Option<f64>,
    pub epochs_to_99: Option<usize>,
}

/// The plain PyTorch reference's numbers.
#[derive(Clone, Debug, Serialize)]
pub struct TorchTiming {
    pub ms_per_step: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_to_99_s: Option<Value>,
}

/// One mode of the fast GPU reference.
#[derive(Clone, Debug, Serialize)]
pub struct FastMode {
    pub ms_per_step: f64,
    /// attnlab's step time over this mode's.
    pub ratio: f64,
}

impl BenchReport {
    /// The numbers as one row of a table, for CSV.
    fn table(&self) -> Table {
        let mut table = Table::new(&[
            "config",
            "device",
            "precision",
            "threads",
            "ms_per_step",
            "tokens_per_s",
            "graph_nodes",
            "replicas",
            "ms_per_group_step",
            "replica_speedup",
            "against",
            "against_rounds",
            "against_own_ms_per_step",
            "against_other_ms_per_step",
            "against_ratio",
            "against_ratio_min",
            "against_ratio_max",
            "time_to_99_s",
            "epochs_to_99",
            "step_ratio",
            "time_to_99_ratio",
        ]);
        let replicas = self.replicas.as_ref();
        let target = self.target.as_ref();
        let against = self.against.as_ref();
        table.push(vec![
            json!(self.config),
            json!(self.device),
            json!(self.precision),
            json!(self.threads),
            json!(self.ms_per_step),
            json!(self.tokens_per_s),
            json!(self.graph_nodes),
            json!(replicas.map(|r| r.n)),
            json!(replicas.map(|r| r.ms_per_group_step)),
            json!(replicas.map(|r| r.speedup)),
            json!(against.map(|a| &a.kind)),
            json!(against.map(|a| a.rounds)),
            json!(against.map(|a| a.own_ms_per_step)),
            json!(against.map(|a| a.other_ms_per_step)),
            json!(against.map(|a| a.ratio)),
            json!(against.map(|a| a.ratio_min)),
            json!(against.map(|a| a.ratio_max)),
            json!(target.and_then(|t| t.time_to_99_s)),
            json!(target.and_then(|t| t.epochs_to_99)),
            json!(self.step_ratio),
            json!(self.time_to_99_ratio),
        ]);
        table
    }
}

impl Report for BenchReport {
    fn text(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "{} ({}, {}): {:.1} ms per training step ({:.0} tokens/s, {} autograd nodes per step)",
            self.config,
            self.device,
            self.precision,
            self.ms_per_step,
            self.tokens_per_s,
            self.graph_nodes
        )];
        if let Some(r) = &self.replicas {
            lines.push(format!(
                "{} replicas as one group: {:.1} ms per step of all ({:.1} ms per model, {:.2}x faster than one after another)",
                r.n, r.ms_per_group_step, r.ms_per_model_step, r.speedup
            ));
        }
        if let Some(a) = &self.against {
            lines.push(format!(
                "beside {} in alternation ({} rounds): {:.1} against {:.1} ms per step, ratio {:.2} (median of the rounds; {:.2}–{:.2})",
                a.kind, a.rounds, a.own_ms_per_step, a.other_ms_per_step, a.ratio, a.ratio_min, a.ratio_max
            ));
        }
        if let Some(t) = &self.target {
            let percent = 100.0 * t.accuracy;
            lines.push(match (t.time_to_99_s, t.epochs_to_99) {
                (Some(secs), Some(epochs)) => {
                    format!("time to {percent:.0}% test accuracy: {secs:.1} s ({epochs} epochs)")
                }
                _ => format!("did not reach the target accuracy in {} epochs", t.epochs),
            });
        }
        if let Some(torch) = &self.torch {
            lines.push(format!(
                "PyTorch reference: {}",
                serde_json::to_string(torch).unwrap_or_default()
            ));
            let ratio = |r: Option<f64>| r.map_or("null".to_string(), |r| r.to_string());
            lines.push(format!(
                "ratio attnlab / PyTorch: step {}, time to 99% {}",
                ratio(self.step_ratio),
                ratio(self.time_to_99_ratio)
            ));
        }
        for (name, mode) in &self.torch_fast {
            lines.push(format!(
                "PyTorch {name}: {:.1} ms per step; ratio attnlab / PyTorch {:.2}",
                mode.ms_per_step, mode.ratio
            ));
        }
        lines
    }

    fn figures(&self) -> Vec<(String, Figure)> {
        Vec::new()
    }

    fn csv(&self) -> String {
        self.table().csv()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ratio is the median of the rounds' ratios (the middle two averaged for an even
    /// count), the step times the means over rounds.
    #[test]
    fn rounds_give_the_median_ratio_and_the_mean_steps() {
        let odd = AgainstTiming::of("softmax", &[[3.0, 2.0], [2.0, 2.0], [8.0, 4.0]]);
        assert_eq!((odd.ratio, odd.ratio_min, odd.ratio_max), (1.5, 1.0, 2.0));
        assert_eq!(
            (odd.own_ms_per_step, odd.other_ms_per_step),
            (13.0 / 3.0, 8.0 / 3.0)
        );
        let even = AgainstTiming::of("softmax", &[[3.0, 2.0], [2.0, 2.0], [8.0, 4.0], [1.0, 4.0]]);
        assert_eq!((even.ratio, even.ratio_min, even.rounds), (1.25, 0.25, 4));
    }
}
