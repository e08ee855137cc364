//! Length extrapolation: train at length L, measure validation perplexity at lengths up to 64L
//! (the central experiment of "Exploring Transformer Extrapolation", Tables 4–6).
//!
//! For every run (and, for RoPE runs, every inference-time scaling in [`variants`]) and every
//! length n, the model is rebuilt for n and its checkpoint loaded, then scored on the
//! validation stream in the chosen [`Protocol`]. Attention runs over blocks of `chunk` queries
//! ([`crate::model::Transformer::logits_blocks`]), so no layer holds an n×n matrix. Each point
//! records its time and peak memory.
//!
//! Choices the paper leaves open:
//! - Definition 0.1 is checked against the perplexity at the training length L (the first
//!   length when L is not among them): δ_n = |ppl_n − ppl_L| / ppl_L, and a curve extrapolates
//!   when every δ_n < δ (default 0.1).
//! - Learned absolute positions (and DIET-ABS) have a table of L positions: lengths beyond it
//!   are reported as missing (`null`, "n/a") with a note, not an error for the whole sweep.
//!   Sinusoidal positions are computed for any length, so they are evaluated everywhere.

pub mod figures;
pub mod perplexity;
pub mod pretrained;
pub mod variants;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use candle_core::Device;
use serde::{Deserialize, Serialize};

pub use perplexity::{Protocol, Scored, Window, windows};
pub use variants::{Variant, inference_variants};

use crate::analysis::StudiedEncoding;
use crate::encodings::EncodingSpec;
use crate::preset::Preset;
use crate::train::{LoadedRun, Opening, RunDir, TrainEvent};
use crate::{Error, Result};

/// How to evaluate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Options {
    /// Evaluation lengths; empty means L, 2L, 4L, …, 64L.
    pub lengths: Vec<usize>,
    pub protocol: Protocol,
    /// Sliding protocol's stride; `None` means n/2.
    pub stride: Option<usize>,
    /// Queries per attention block.
    pub chunk: usize,
    /// Tokens per forward pass (short windows are batched up to this).
    pub batch_tokens: usize,
    /// At most this many validation tokens are scored (rounded down to a multiple of the
    /// longest length).
    pub max_tokens: usize,
    /// Definition 0.1's δ.
    pub delta: f64,
    /// Also evaluate RoPE runs with PI, NTK, ReRoPE and Leaky ReRoPE at inference.
    pub rotary_variants: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            lengths: Vec::new(),
            protocol: Protocol::NonOverlapping,
            stride: None,
            chunk: 256,
            batch_tokens: 16_384,
            max_tokens: 65_536,
            delta: 0.1,
            rotary_variants: true,
        }
    }
}

impl Options {
    /// Settings no evaluation can use, refused before any run is read: a length of 0 divided
    /// the validation stream by zero, a chunk of 0 never advances.
    pub fn validate(&self) -> Result<()> {
        if let Some(&n) = self.lengths.iter().find(|&&n| n == 0) {
            return Err(Error::argument(
                "evaluation length (--lengths)",
                n,
                "is too short: every length must be at least 1 token",
            ));
        }
        if !(self.delta.is_finite() && self.delta > 0.0) {
            return Err(Error::argument(
                "delta (--delta)",
                self.delta,
                "must be a positive number: Definition 0.1's threshold on |ppl_n − ppl_L| / ppl_L",
            ));
        }
        let positive = [
            ("stride (--stride)", self.stride.unwrap_or(1)),
            ("chunk (--chunk)", self.chunk),
            ("batch_tokens", self.batch_tokens),
            ("max_tokens (--max-tokens)", self.max_tokens),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(Error::argument(
                *name,
                0,
                "is too small: it must be at least 1",
            ));
        }
        Ok(())
    }
}

/// L, 2L, 4L, …, 64L.
pub fn default_lengths(train_length: usize) -> Vec<usize> {
    (0..7).map(|k| train_length << k).collect()
}

/// One evaluation length of one curve.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LengthPoint {
    pub length: usize,
    /// `None` where the model cannot run at this length (see `note`).
    pub ppl: Option<f64>,
    /// Tokens scored.
    pub tokens: usize,
    pub secs: f64,
    /// Peak resident memory of the process during this length (Linux), bytes.
    pub peak_bytes: Option<u64>,
    /// The largest attention-weight block one layer holds at once, bytes (f32).
    pub attention_block_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl LengthPoint {
    /// A length the model cannot run at, and why.
    fn missing(length: usize, why: String) -> Self {
        Self {
            length,
            ppl: None,
            tokens: 0,
            secs: 0.0,
            peak_bytes: None,
            attention_block_bytes: 0,
            note: Some(why),
        }
    }
}

/// One model's perplexity against length, with both extrapolation verdicts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Curve {
    /// The run's name, plus ` + <variant>` for an inference-time scaling.
    pub name: String,
    pub run: PathBuf,
    /// The encoding the curve was evaluated with.
    pub encoding: String,
    /// The inference-time change, when there is one.
    pub inference: Option<String>,
    pub points: Vec<LengthPoint>,
    /// Definition 0.1: |ppl_n − ppl_L| / ppl_L per length.
    pub delta: Vec<Option<f64>>,
    /// Whether every δ_n < δ (`None` without any perplexity beyond L).
    pub extrapolates: Option<bool>,
    /// Theorem 0.4 from the encoding's formula: converges, diverges, undetermined, not-applicable.
    pub theorem: String,
    pub theorem_evidence: String,
    /// Why the CPU stood in for the preset's device, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_notice: Option<String>,
}

/// The result of an extrapolation sweep: the JSON (`protocol`, `train_length`,
/// `lengths`, `ppl`, `delta`) plus every curve's details.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Extrapolation {
    pub protocol: Protocol,
    /// What the protocol scores, in words (the figures' caption).
    pub protocol_description: String,
    pub train_length: usize,
    pub lengths: Vec<usize>,
    /// δ of Definition 0.1.
    pub delta_threshold: f64,
    pub ppl: BTreeMap<String, Vec<Option<f64>>>,
    pub delta: BTreeMap<String, Vec<Option<f64>>>,
    /// In evaluation order.
    pub curves: Vec<Curve>,
    /// Runs whose curves are missing, with why: one that failed (out of memory at a long
    /// length, say) or that a cancel came before. The table keeps every run finished.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<String>,
}

impl Extrapolation {
    fn new(options: &Options, train_length: usize, lengths: Vec<usize>) -> Self {
        Self {
            protocol: options.protocol,
            protocol_description: options.protocol.describe(options.stride),
            train_length,
            lengths,
            delta_threshold: options.delta,
            ppl: BTreeMap::new(),
            delta: BTreeMap::new(),
            curves: Vec::new(),
            left_out: Vec::new(),
        }
    }

    fn push(&mut self, curve: Curve) {
        let ppl = curve.points.iter().map(|p| p.ppl).collect();
        self.ppl.insert(curve.name.clone(), ppl);
        self.delta.insert(curve.name.clone(), curve.delta.clone());
        self.curves.push(curve);
    }

    /// The file a run folder keeps this protocol's results in.
    pub fn file_name(protocol: Protocol) -> String {
        format!("extrapolation-{}.json", protocol.name())
    }
}

/// Definition 0.1 for a perplexity series: δ_n against the value at the training length.
pub fn relative_change(
    ppl: &[Option<f64>],
    lengths: &[usize],
    train_length: usize,
) -> Vec<Option<f64>> {
    let reference = lengths.iter().position(|&n| n == train_length).unwrap_or(0);
    let Some(base) = ppl.get(reference).copied().flatten() else {
        return vec![None; ppl.len()];
    };
    ppl.iter()
        .map(|p| p.map(|p| (p - base).abs() / base))
        .collect()
}

/// Evaluates every run in `runs` and saves each run's curves in its folder
/// (`extrapolation-<protocol>.json`, atomically). `progress` gets the done fraction in [0, 1].
/// A run that fails is left out with its error ([`Extrapolation::left_out`]) and the others go
/// on; a cancel keeps the runs finished and leaves out the rest. Only when no run is left is
/// the failure (or the cancel) the error.
pub fn extrapolate_runs(
    runs: &[RunDir],
    options: &Options,
    progress: &mut dyn FnMut(f32),
    cancel: &AtomicBool,
) -> Result<Extrapolation> {
    options.validate()?;
    let presets = runs
        .iter()
        .map(|r| r.read_preset())
        .collect::<Result<Vec<_>>>()?;
    let Some(first) = presets.first() else {
        return Err(Error::argument(
            "number of runs",
            0,
            "is too few: there is no run to evaluate",
        ));
    };
    let train_length = first.task.seq_len();
    if let Some(other) = presets.iter().find(|p| p.task.seq_len() != train_length) {
        return Err(Error::unsupported(
            format!(
                "one table for runs trained at different lengths ({train_length} and {})",
                other.task.seq_len()
            ),
            "evaluate them separately",
        ));
    }
    let lengths = match options.lengths.is_empty() {
        true => default_lengths(train_length),
        false => options.lengths.clone(),
    };
    let mut all = Extrapolation::new(options, train_length, lengths.clone());
    let jobs: usize = presets
        .iter()
        .map(|p| 1 + curve_variants(p, options).len())
        .sum();
    let (mut before, mut cancelled, mut failed) = (0usize, false, false);
    for (run, preset) in runs.iter().zip(&presets) {
        let planned = 1 + curve_variants(preset, options).len();
        // The run's name, as the window's list and the curves name it.
        let name = &preset.name;
        if cancelled {
            all.left_out.push(format!("{name} (cancelled before it)"));
            continue;
        }
        let mut tick = |f: f32| progress((before as f32 + f * planned as f32) / jobs as f32);
        let evaluated = extrapolate_run(run, preset, options, &lengths, &mut tick, cancel);
        before += planned;
        match evaluated {
            Ok(own) => own.curves.into_iter().for_each(|curve| all.push(curve)),
            Err(e) => {
                cancelled = matches!(e, Error::Cancelled);
                failed |= !cancelled;
                all.left_out.push(format!("{name} ({e})"));
            }
        }
    }
    progress(1.0);
    match (all.curves.is_empty(), failed) {
        (true, true) => Err(Error::argument(
            "runs",
            all.left_out.join("; "),
            "could not be evaluated",
        )),
        (true, false) if cancelled => Err(Error::Cancelled),
        _ => Ok(all),
    }
}

/// One run's curves (the run as trained, and the variants `options` asks for), saved in its
/// folder; `progress` gets this run's done fraction.
fn extrapolate_run(
    run: &RunDir,
    preset: &Preset,
    options: &Options,
    lengths: &[usize],
    progress: &mut dyn FnMut(f32),
    cancel: &AtomicBool,
) -> Result<Extrapolation> {
    let mut own = Extrapolation::new(options, preset.task.seq_len(), lengths.to_vec());
    let tokens = validation_tokens(preset)?;
    let opened = preset.train.device.open_or_fallback()?;
    let mut variants = vec![None];
    variants.extend(curve_variants(preset, options).into_iter().map(Some));
    let count = variants.len() as f32;
    for (i, variant) in variants.into_iter().enumerate() {
        let mut tick = |f: f32| progress((i as f32 + f) / count);
        let mut curve = evaluate_curve(
            run,
            preset,
            variant.as_ref(),
            (&tokens, lengths),
            options,
            &opened.device,
            &mut tick,
            cancel,
        )?;
        curve.device_notice.clone_from(&opened.notice);
        own.push(curve);
    }
    crate::io::write_json(
        &run.path().join(Extrapolation::file_name(options.protocol)),
        &own,
    )?;
    Ok(own)
}

/// Trains each preset into a new run folder under `runs_root`; `progress` gets the fraction
/// of all planned steps done, `events` every training event with its preset's index (the
/// window's run list follows them). Returns the run folders in preset order, or
/// [`Error::Cancelled`] once `cancel` is set.
pub fn train_presets(
    presets: &[Preset],
    runs_root: &Path,
    progress: &mut dyn FnMut(f32),
    events: &mut dyn FnMut(usize, &TrainEvent),
    cancel: &AtomicBool,
) -> Result<Vec<RunDir>> {
    let mut runs = Vec::new();
    let steps = |p: &Preset| p.train.total_steps(p.task.train_examples()).max(1);
    let total: usize = presets.iter().map(steps).sum();
    let mut before = 0;
    for (index, preset) in presets.iter().enumerate() {
        let mut run_dir = None;
        crate::train::run::run(preset, runs_root, cancel, &mut |event| {
            events(index, &event);
            match event {
                TrainEvent::Started { run_dir: dir, .. } => run_dir = Some(dir),
                TrainEvent::Step(step) => progress((before + step.step) as f32 / total as f32),
                _ => {}
            }
        })?;
        if cancel.load(std::sync::atomic::Ordering::Relaxed) {
            // The stopped run is kept; the presets after it are not started.
            return Err(Error::Cancelled);
        }
        before += steps(preset);
        let dir = run_dir.ok_or_else(|| {
            Error::Internal(format!("training {} made no run folder", preset.name))
        })?;
        runs.push(RunDir::open(&dir)?);
    }
    Ok(runs)
}

/// Trains each preset, then evaluates them all: what the GUI's "train and evaluate" button
/// calls. Progress: the first half is training, the second evaluation; `events` as
/// [`train_presets`] gives them.
pub fn train_and_extrapolate(
    presets: &[Preset],
    runs_root: &Path,
    options: &Options,
    progress: &mut dyn FnMut(f32),
    events: &mut dyn FnMut(usize, &TrainEvent),
    cancel: &AtomicBool,
) -> Result<(Vec<RunDir>, Extrapolation)> {
    let halved = &mut |f| progress(0.5 * f);
    let runs = train_presets(presets, runs_root, halved, events, cancel)?;
    let sweep = extrapolate_runs(&runs, options, &mut |f| progress(0.5 + 0.5 * f), cancel)?;
    Ok((runs, sweep))
}

fn curve_variants(preset: &Preset, options: &Options) -> Vec<Variant> {
    if options.rotary_variants {
        inference_variants(&preset.encoding)
    } else {
        Vec::new()
    }
}

/// The validation stream of an LM run.
fn validation_tokens(preset: &Preset) -> Result<Vec<u32>> {
    match preset.task.lm() {
        Some(lm) => lm.validation_tokens(),
        None => Err(Error::unsupported(
            format!(
                "extrapolating {}, a {} run,",
                preset.name,
                preset.task.name()
            ),
            NOT_A_LANGUAGE_MODEL,
        )),
    }
}

/// Why a run that is not a language model cannot be extrapolated.
pub const NOT_A_LANGUAGE_MODEL: &str =
    "extrapolation needs a language-modelling run (task.kind = \"lm\")";

/// The longest sequence `encoding` has positions for, when it has a table (of the
/// `trained` positions).
fn position_limit(encoding: &EncodingSpec, trained: usize) -> Option<usize> {
    matches!(
        encoding,
        EncodingSpec::Learned(_) | EncodingSpec::DietAbs(_)
    )
    .then_some(trained)
}

#[allow(clippy::too_many_arguments)]
fn evaluate_curve(
    run: &RunDir,
    preset: &Preset,
    variant: Option<&Variant>,
    (tokens, lengths): (&[u32], &[usize]),
    options: &Options,
    device: &Device,
    progress: &mut dyn FnMut(f32),
    cancel: &AtomicBool,
) -> Result<Curve> {
    let train_length = preset.task.seq_len();
    let longest = lengths.iter().copied().max().unwrap_or(train_length);
    let available = tokens.len().saturating_sub(1).min(options.max_tokens);
    let span = available / longest * longest;
    if span == 0 {
        return Err(Error::Data(format!(
            "{}: the validation stream has {} tokens, fewer than the longest length {longest} + 1; \
             raise task.valid_bytes or --max-tokens",
            preset.name,
            tokens.len()
        )));
    }
    let mut points = Vec::new();
    let mut evaluated = preset.clone();
    for (i, &n) in lengths.iter().enumerate() {
        let overrides = variant
            .map(|v| v.overrides(n, train_length))
            .unwrap_or_default();
        evaluated = run.preset_with(&overrides)?;
        let pass = perplexity::Pass {
            tokens,
            span,
            protocol: options.protocol,
            stride: options.stride,
            chunk: options.chunk,
            batch_tokens: options.batch_tokens,
        };
        let mut tick = |done: usize, total: usize| {
            progress((i as f32 + done as f32 / total.max(1) as f32) / lengths.len() as f32)
        };
        points.push(evaluate_length(
            run,
            (&evaluated, &overrides),
            &pass,
            (n, device),
            &mut tick,
            cancel,
        )?);
    }
    let verdict = match variant {
        None => StudiedEncoding::from_run(run, None)?.verdict()?,
        Some(_) => StudiedEncoding::untrained(
            &evaluated.encoding,
            evaluated.model.n_heads,
            evaluated.attention.qk_dim(evaluated.model.head_dim()),
        )?
        .verdict()?,
    };
    let curve = Curve {
        name: match variant {
            Some(v) => format!("{} + {}", preset.name, v.label),
            None => preset.name.clone(),
        },
        run: run.path().to_path_buf(),
        encoding: evaluated.encoding.name().into(),
        inference: variant.map(|v| v.description.to_string()),
        points,
        extrapolates: None,
        delta: Vec::new(),
        theorem: verdict.verdict,
        theorem_evidence: verdict.evidence,
        device_notice: None,
    };
    Ok(curve.judged(lengths, train_length, options.delta))
}

impl Curve {
    /// Definition 0.1 on the curve's points: δ_n per length, and whether every δ_n beyond the
    /// training length is below `threshold`.
    fn judged(mut self, lengths: &[usize], train_length: usize, threshold: f64) -> Self {
        let ppl: Vec<Option<f64>> = self.points.iter().map(|p| p.ppl).collect();
        self.delta = relative_change(&ppl, lengths, train_length);
        let beyond: Vec<f64> = lengths
            .iter()
            .zip(&self.delta)
            .filter(|(n, _)| **n > train_length)
            .filter_map(|(_, d)| *d)
            .collect();
        self.extrapolates = (!beyond.is_empty()).then(|| beyond.iter().all(|&d| d < threshold));
        self
    }
}

/// Builds the model of `preset` (the run's with `overrides`) for length `n` on `device`
/// (opened once per run), loads the checkpoint and scores it.
fn evaluate_length(
    run: &RunDir,
    (preset, overrides): (&Preset, &[String]),
    pass: &perplexity::Pass<'_>,
    (n, device): (usize, &Device),
    tick: &mut dyn FnMut(usize, usize),
    cancel: &AtomicBool,
) -> Result<LengthPoint> {
    let limit = position_limit(&preset.encoding, preset.task.seq_len());
    let build = || {
        let opening = Opening::default()
            .overrides(overrides)
            .on(device)
            .max_len(limit.unwrap_or(n.max(preset.task.seq_len())));
        Ok(LoadedRun::open(run, &opening)?.model)
    };
    let at = Length {
        n,
        heads: preset.model.n_heads,
        encoding: &preset.encoding,
        limit,
    };
    score_length(at, pass, device, build, tick, cancel)
}

/// One evaluation length of one model: n, the model's heads and encoding, and the longest
/// input its positions allow where they are a table.
struct Length<'a> {
    n: usize,
    heads: usize,
    encoding: &'a EncodingSpec,
    limit: Option<usize>,
}

/// Scores the model `build` makes at length `at.n`, with its time and peak memory; a length
/// past the encoding's table is a point without perplexity and a note saying why.
fn score_length(
    at: Length<'_>,
    pass: &perplexity::Pass<'_>,
    device: &Device,
    build: impl FnOnce() -> Result<crate::model::Transformer>,
    tick: &mut dyn FnMut(usize, usize),
    cancel: &AtomicBool,
) -> Result<LengthPoint> {
    let n = at.n;
    let windows = (pass.batch_tokens / n).max(1) as u64;
    let block = windows * at.heads as u64 * pass.chunk.min(n) as u64 * n as u64 * 4;
    if let Some(limit) = at.limit.filter(|&limit| n > limit) {
        let why = format!(
            "{} positions exist only for the first {limit} tokens (trained table)",
            at.encoding.name()
        );
        return Ok(LengthPoint {
            attention_block_bytes: block,
            ..LengthPoint::missing(n, why)
        });
    }
    let mut point = LengthPoint {
        attention_block_bytes: block,
        note: None,
        ..LengthPoint::missing(n, String::new())
    };
    let model = build()?;
    let reset = crate::memory::reset_peak();
    let started = Instant::now();
    let scored = perplexity::score(&model, device, pass, n, tick, cancel)?;
    point.secs = started.elapsed().as_secs_f64();
    point.peak_bytes = crate::memory::peak_bytes().filter(|_| reset);
    point.ppl = Some(scored.perplexity());
    point.tokens = scored.tokens;
    Ok(point)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_change_is_against_the_training_length() {
        let ppl = [Some(12.0), Some(10.0), Some(15.0), None];
        let d = relative_change(&ppl, &[32, 64, 128, 256], 64);
        assert_eq!(d, vec![Some(0.2), Some(0.0), Some(0.5), None]);
    }

    /// `--lengths 0` used to divide by zero; it is refused before any run is read.
    #[test]
    fn zero_lengths_and_chunks_are_refused() {
        let cancel = AtomicBool::new(false);
        let zero_length = Options {
            lengths: vec![64, 0],
            ..Options::default()
        };
        let err = extrapolate_runs(&[], &zero_length, &mut |_| {}, &cancel).unwrap_err();
        assert!(
            matches!(&err, Error::Argument { name, value, .. }
                if name == "evaluation length (--lengths)" && value == "0"),
            "{err}"
        );
        let zero_chunk = Options {
            chunk: 0,
            ..Options::default()
        };
        let err = zero_chunk.validate().unwrap_err().to_string();
        assert!(err.contains("--chunk"), "{err}");
        for delta in [f64::NAN, 0.0, -1.0, f64::INFINITY] {
            let err = Options {
                delta,
                ..Options::default()
            }
            .validate()
            .unwrap_err()
            .to_string();
            assert!(err.contains("--delta"), "{delta}: {err}");
        }
        assert!(Options::default().validate().is_ok());
    }

    /// The default preset is an MQAR run: extrapolating it names both the run and the task.
    #[test]
    fn a_classification_run_is_not_extrapolated() {
        let preset = Preset::default();
        let err = validation_tokens(&preset).unwrap_err();
        assert!(
            matches!(&err, Error::Unsupported { what, .. } if what.contains(&preset.name)),
            "{err}"
        );
        assert!(err.to_string().contains("task.kind = \"lm\""), "{err}");
    }

    #[test]
    fn default_lengths_double_up_to_64l() {
        assert_eq!(default_lengths(8), vec![8, 16, 32, 64, 128, 256, 512]);
    }
}
