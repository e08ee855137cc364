//! A run's TensorBoard sink ([`crate::tensorboard`]): what `metrics.jsonl`, the attention
//! saved at each evaluation and `summary.json` hold, under the tags TensorBoard users know
//! (`../shared/reference/mixers-mad-checkpoints.md` §4.3), in `<run>/tensorboard/`.

use std::path::Path;

use candle_core::Tensor;

use super::{EvalRecord, RunStatus, StepRecord};
use crate::Result;
use crate::attention::{AttentionWeights, Mixing};
use crate::figures::{HeatmapPlot, heatmap_png};
use crate::preset::Preset;
use crate::tasks::truth::Crop;
use crate::tensorboard::{EventWriter, HParam, Image};

/// The folder of a run's event files.
pub const FOLDER: &str = "tensorboard";

/// The longest side of an attention map's image, in pixels: each cell a square of pixels.
const MAP_SIDE: usize = 256;

/// One run's event file.
pub struct Board {
    writer: EventWriter,
    /// Signed mixing matrices (diverging colours, entropy of |A| normalised).
    signed: bool,
}

impl Board {
    /// The sink of a new run in `run_dir`, its HParams session started with `preset`'s
    /// settings; `None` when the preset turns TensorBoard off.
    pub fn start(run_dir: &Path, preset: &Preset) -> Result<Option<Self>> {
        let Some(board) = Self::open(run_dir, preset)? else {
            return Ok(None);
        };
        board.writer.session_start(&hparams(preset)?)?;
        Ok(Some(board))
    }

    /// The sink of a run resumed from its checkpoint at `step`: a new file, which tells
    /// TensorBoard to drop what the earlier files hold after `step` (it is trained again).
    pub fn resume(run_dir: &Path, preset: &Preset, step: usize) -> Result<Option<Self>> {
        let Some(board) = Self::open(run_dir, preset)? else {
            return Ok(None);
        };
        board.writer.restart(step + 1)?;
        Ok(Some(board))
    }

    fn open(run_dir: &Path, preset: &Preset) -> Result<Option<Self>> {
        if !preset.train.tensorboard {
            return Ok(None);
        }
        Ok(Some(Self {
            writer: EventWriter::create(&run_dir.join(FOLDER))?,
            signed: preset.attention.mixing() == Mixing::Signed,
        }))
    }

    /// A training step's scalars.
    pub fn step(&self, record: &StepRecord) -> Result<()> {
        self.writer.scalars(
            record.step,
            &[
                ("train/loss", f64::from(record.loss)),
                ("train/lr", record.lr),
                ("train/grad_norm", record.grad_norm),
                ("train/tokens_per_s", record.tokens_per_s),
            ],
        )
    }

    /// An evaluation's scalars, and per attention layer (`attention[l]`, (B, H, Tq, Tk) over
    /// the saved test rows, `None` for a layer without attention) each head's map of the first
    /// row as an image, its mean row entropy and, where the task has a ground truth (`truth`:
    /// each saved row's crop, empty without one), its mean soft IoU over the saved rows.
    pub fn eval(
        &self,
        record: &EvalRecord,
        attention: &[Option<Tensor>],
        truth: &[Crop],
    ) -> Result<()> {
        let mut scalars = vec![
            ("test/accuracy".to_string(), record.accuracy),
            ("test/loss".to_string(), record.loss),
        ];
        if let Some(macro_accuracy) = record.macro_accuracy {
            scalars.push(("test/macro_accuracy".into(), macro_accuracy));
        }
        for (layer, weights) in attention.iter().enumerate() {
            let Some(weights) = weights else { continue };
            let weights = AttentionWeights::from_tensor(layer, weights)?;
            // Rows read as distributions: |A| scaled to sum 1 for a signed matrix.
            let rows = match self.signed {
                true => std::borrow::Cow::Owned(weights.magnitudes()),
                false => std::borrow::Cow::Borrowed(&weights),
            };
            for head in 0..weights.shape[1] {
                let tag = format!("L{layer}H{head}");
                let entropy = mean_row_entropy(&rows, head);
                scalars.push((format!("attention/entropy/{tag}"), entropy));
                if let Some(iou) = mean_soft_iou(&rows, head, truth) {
                    scalars.push((format!("attention/iou/{tag}"), iou));
                }
                let image = self.map_image(&weights, head)?;
                self.writer
                    .image(record.step, &format!("attention/{tag}"), &image)?;
            }
        }
        let scalars: Vec<(&str, f64)> = scalars.iter().map(|(t, v)| (t.as_str(), *v)).collect();
        self.writer.scalars(record.step, &scalars)
    }

    /// The end of the run's session when `status` ends it for good (completed, target
    /// reached). A stopped or failed run can be resumed, and TensorBoard keeps the first
    /// session end it reads of a run, so those get none: TensorBoard's table shows their
    /// status as unknown, and `summary.json` says which it is.
    pub fn end(&self, step: usize, status: RunStatus) -> Result<()> {
        match status {
            RunStatus::Completed | RunStatus::TargetReached => self.writer.session_end(step),
            RunStatus::Failed | RunStatus::Stopped | RunStatus::Running => Ok(()),
        }
    }

    /// The first saved test row's map of `head` (query i down, key j across), coloured as the
    /// workbench colours it, over the map's own range: viridis, or for a signed matrix blue
    /// below 0 (white) and red above, over ± its largest magnitude.
    fn map_image(&self, weights: &AttentionWeights, head: usize) -> Result<Image> {
        let [_, _, tq, tk] = weights.shape;
        let plot = HeatmapPlot {
            rows: tq,
            cols: tk,
            values: weights
                .matrix(0, head)
                .iter()
                .map(|&w| f64::from(w))
                .collect(),
            x_label: String::new(),
            y_label: String::new(),
            value_label: String::new(),
            log_colour: false,
            signed: self.signed,
        };
        let (width, height, png) = heatmap_png(&plot, MAP_SIDE)?;
        Ok(Image { width, height, png })
    }
}

/// The mean entropy (nats) of `head`'s rows over every saved example: of every query, but
/// the first of a causal (square) map, which sees one key. Rows are read as distributions, so
/// `weights` should be [`AttentionWeights::magnitudes`] for a signed matrix.
fn mean_row_entropy(weights: &AttentionWeights, head: usize) -> f64 {
    let [b, _, tq, tk] = weights.shape;
    let first = usize::from(tq == tk);
    let rows: Vec<f64> = (0..b)
        .flat_map(|example| weights.matrix(example, head).chunks(tk.max(1)).skip(first))
        .map(|row| {
            -row.iter()
                .filter(|&&p| p > 0.0)
                .map(|&p| f64::from(p) * f64::from(p).ln())
                .sum::<f64>()
        })
        .collect();
    match rows.len() {
        0 => f64::NAN,
        n => rows.iter().sum::<f64>() / n as f64,
    }
}

/// The mean soft IoU ([`Crop::soft_iou`], the IoU analysis' headline) of `head`'s maps
/// against each saved row's ground truth, over the rows that have queries; `None` when none
/// has, or when the map's columns are not the row's tokens (Linformer's projected keys). Like
/// the entropy, it reads |A| normalised for a signed matrix.
fn mean_soft_iou(weights: &AttentionWeights, head: usize, truth: &[Crop]) -> Option<f64> {
    let [b, _, tq, tk] = weights.shape;
    if tq != tk {
        return None;
    }
    let scores: Vec<f64> = truth
        .iter()
        .take(b)
        .enumerate()
        .filter(|(_, crop)| !crop.query_positions.is_empty())
        .map(|(example, crop)| crop.soft_iou(&crop.of(weights.matrix(example, head), tk)))
        .collect();
    (!scores.is_empty()).then(|| scores.iter().sum::<f64>() / scores.len() as f64)
}

/// The resolved preset as HParams, one per setting (`model.d_model`, `attention.kind`, …):
/// numbers, booleans and text as such, lists as their JSON text; the description left out.
fn hparams(preset: &Preset) -> Result<Vec<(String, HParam)>> {
    let mut out = Vec::new();
    flatten("", &serde_json::to_value(preset)?, &mut out);
    out.retain(|(name, _)| name != "description");
    Ok(out)
}

fn flatten(prefix: &str, value: &serde_json::Value, out: &mut Vec<(String, HParam)>) {
    use serde_json::Value;
    let param = match value {
        Value::Object(fields) => {
            for (key, value) in fields {
                let name = match prefix {
                    "" => key.clone(),
                    _ => format!("{prefix}.{key}"),
                };
                flatten(&name, value, out);
            }
            return;
        }
        Value::Null => return,
        Value::Bool(b) => HParam::Bool(*b),
        Value::Number(n) => HParam::Number(n.as_f64().unwrap_or(f64::NAN)),
        Value::String(s) => HParam::Text(s.clone()),
        Value::Array(_) => HParam::Text(value.to_string()),
    };
    out.push((prefix.to_string(), param));
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    #[test]
    fn entropy_is_that_of_each_row_after_the_first() {
        // Query 1 spreads evenly over two keys (ln 2), query 2 puts all on one (0).
        let rows = [[1.0f32, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]];
        let tensor = Tensor::new(&[[rows]], &Device::Cpu).unwrap();
        let weights = AttentionWeights::from_tensor(0, &tensor).unwrap();
        let entropy = mean_row_entropy(&weights, 0);
        assert!(
            (entropy - std::f64::consts::LN_2 / 2.0).abs() < 1e-9,
            "{entropy}"
        );
    }

    #[test]
    fn soft_iou_is_the_mean_over_rows_with_queries_of_tokens() {
        use crate::tasks::mqar::QueryTruth;
        use crate::tasks::truth::Target;
        // Query at 2 should read position 1 of the context 0..2: row 0 puts all its weight
        // there (IoU 1), row 1 half (Σmin 0.5 / Σmax 1; its other half is past the context).
        let query = QueryTruth {
            position: 2,
            key: 0,
            value: 0,
            key_positions: vec![0],
            value_positions: vec![1],
        };
        let map = |p: f32| [[1.0f32, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, p, 1.0 - p]];
        let tensor = Tensor::new(&[[map(1.0)], [map(0.5)], [map(0.0)]], &Device::Cpu).unwrap();
        let weights = AttentionWeights::from_tensor(0, &tensor).unwrap();
        let crop = Crop::new(std::slice::from_ref(&query), 2, Target::Value);
        let empty = Crop::new(&[], 2, Target::Value);
        let iou = mean_soft_iou(&weights, 0, &[crop.clone(), crop, empty.clone()]).unwrap();
        assert!((iou - 0.75).abs() < 1e-9, "{iou}");
        assert_eq!(mean_soft_iou(&weights, 0, &[]), None);
        assert_eq!(mean_soft_iou(&weights, 0, &[empty]), None);
    }

    #[test]
    fn the_preset_flattens_to_dotted_settings() {
        let preset = Preset::default();
        let params = hparams(&preset).unwrap();
        let get = |name: &str| params.iter().find(|(n, _)| n == name).map(|(_, v)| v);
        assert_eq!(get("attention.kind"), Some(&HParam::Text("softmax".into())));
        assert_eq!(
            get("model.d_model"),
            Some(&HParam::Number(preset.model.d_model as f64))
        );
        assert_eq!(get("train.tensorboard"), Some(&HParam::Bool(true)));
        assert_eq!(get("description"), None);
        assert!(params.iter().all(|(n, _)| !n.is_empty()));
    }
}
