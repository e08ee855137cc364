//! A trained run reloaded from its folder, for analyses that need attention on more rows than the
//! run saved: IoU over 10,000 examples, spectra over many matrices.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::{Device, Tensor};

use crate::attention::AttentionWeights;
use crate::model::Transformer;
use crate::preset::Preset;
use crate::tasks::Row;
use crate::train::{LoadedRun, Opening, RunDir};
use crate::{Error, Result};

/// Rows per forward pass: large enough to keep the matrix products busy, small enough that a
/// batch of (B, H, T, T) weights stays in the tens of megabytes at T = 128.
const BATCH_ROWS: usize = 128;

/// The most test rows an analysis generates, ten times the ReBased paper's 10,000: rows come
/// one after another from the test seed and are held together, so row r costs r rows.
pub const MAX_TEST_ROWS: usize = 100_000;

/// What [`TrainedRun::for_each_batch`] calls with each batch's rows and per-layer attention.
pub type BatchVisitor<'a> = dyn FnMut(&[Row], &[Option<AttentionWeights>]) -> Result<()> + 'a;

/// A run's model with its checkpoint loaded.
pub struct TrainedRun {
    pub run: RunDir,
    pub preset: Preset,
    /// Why the model runs on the CPU instead of the run's device (e.g. a GPU run opened on a
    /// machine without one), if it does.
    pub device_notice: Option<String>,
    model: Transformer,
    device: Device,
}

impl TrainedRun {
    /// Loads the preset and checkpoint of the run folder at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let LoadedRun {
            run,
            preset,
            model,
            device,
            device_notice,
        } = LoadedRun::open(&RunDir::open(path)?, &Opening::default())?;
        Ok(Self {
            run,
            preset,
            device_notice,
            model,
            device,
        })
    }

    /// An error naming the run and its task: the analysis needs a ground truth it lacks.
    fn no_ground_truth(&self) -> Error {
        Error::RunDir {
            message: self.preset.task.lacks_ground_truth().unwrap_or_default(),
            path: self.run.path().to_path_buf(),
        }
    }

    /// How many positions from the start of a row hold what the queries read: MQAR's context
    /// of key-value pairs; for MAD's probes the whole row (pairs run through it).
    pub fn context_len(&self) -> Result<usize> {
        self.preset
            .task
            .truth_context()
            .ok_or_else(|| self.no_ground_truth())
    }

    /// The first `n` rows of the run's test split (the generator continues past
    /// `task.test_examples` with the same seed, so larger `n` adds unseen rows), at most
    /// [`MAX_TEST_ROWS`].
    pub fn test_examples(&self, n: usize) -> Result<Vec<Row>> {
        if n > MAX_TEST_ROWS {
            return Err(Error::argument(
                "number of test rows",
                n,
                format!("is too many: an analysis generates at most {MAX_TEST_ROWS}"),
            ));
        }
        match self.preset.task.truth_context() {
            Some(_) => self.preset.task.truth_examples(n),
            None => Err(self.no_ground_truth()),
        }
    }

    /// Model layers whose mixer is attention.
    pub fn attention_layers(&self) -> Vec<usize> {
        self.preset.model.attention_layers()
    }

    /// The attention of every layer (`None` for convolutions) on `rows` token rows.
    pub fn attention(&self, rows: &[&[u32]]) -> Result<Vec<Option<AttentionWeights>>> {
        let t = rows.first().map_or(0, |r| r.len());
        let flat: Vec<u32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        let ids = Tensor::from_vec(flat, (rows.len(), t), &self.device)?;
        self.model
            .attention_weights(&ids)?
            .iter()
            .enumerate()
            .map(|(layer, w)| {
                w.as_ref()
                    .map(|w| AttentionWeights::from_tensor(layer, w))
                    .transpose()
            })
            .collect()
    }

    /// Calls `visit(examples, attention)` for consecutive batches of `examples`,
    /// reporting the fraction done to `progress` after each. Returns `Ok(false)` when `cancel`
    /// was set (checked before every batch), `Ok(true)` when every batch was visited.
    pub fn for_each_batch(
        &self,
        examples: &[Row],
        progress: &mut dyn FnMut(f32),
        cancel: &AtomicBool,
        visit: &mut BatchVisitor<'_>,
    ) -> Result<bool> {
        for (i, batch) in examples.chunks(BATCH_ROWS).enumerate() {
            if cancel.load(Ordering::Relaxed) {
                return Ok(false);
            }
            let rows: Vec<&[u32]> = batch.iter().map(|e| e.inputs.as_slice()).collect();
            visit(batch, &self.attention(&rows)?)?;
            progress(((i * BATCH_ROWS + batch.len()) as f32 / examples.len() as f32).min(1.0));
        }
        Ok(true)
    }
}
