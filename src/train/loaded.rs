//! A run folder opened into its model: the one loader behind `attnlab eval`, the perplexity
//! against length, the analyses of trained runs (IoU, spectra, encoding studies) and the window.

use candle_core::Device;

use super::RunDir;
use crate::Result;
use crate::model::Transformer;
use crate::params::Params;
use crate::preset::Preset;

/// A run's model, built from its preset (with any overrides) and holding its last checkpoint.
pub struct LoadedRun {
    pub run: RunDir,
    /// The preset the model was built from: the run's, with the overrides applied.
    pub preset: Preset,
    pub model: Transformer,
    pub device: Device,
    /// Why the model runs on the CPU instead of the run's device (e.g. a GPU run opened on a
    /// machine without one), if it does.
    pub device_notice: Option<String>,
}

/// How a run's model is opened. The default is the run as it trained: its own preset, its
/// training length, on its own device (the CPU, with a notice, where that is missing), with
/// its last checkpoint.
#[derive(Clone, Debug)]
pub struct Opening {
    overrides: Vec<String>,
    max_len: Option<usize>,
    device: Option<Device>,
    checkpoint: bool,
}

impl Default for Opening {
    fn default() -> Self {
        Self {
            overrides: Vec::new(),
            max_len: None,
            device: None,
            checkpoint: true,
        }
    }
}

impl Opening {
    /// Preset keys changed before the model is built, as `--set` changes them (a RoPE run
    /// evaluated with ReRoPE, PI or NTK at inference).
    pub fn overrides(mut self, overrides: &[String]) -> Self {
        self.overrides = overrides.to_vec();
        self
    }

    /// The longest sequence the model must take, when longer than its training length
    /// (rotary and bias encodings build their tables for it; learned tables keep theirs).
    pub fn max_len(mut self, max_len: usize) -> Self {
        self.max_len = Some(max_len);
        self
    }

    /// Computes on `device` instead of the run's own.
    pub fn on(mut self, device: &Device) -> Self {
        self.device = Some(device.clone());
        self
    }

    /// Whether the checkpoint is loaded; without it the parameters are the run's
    /// initialisation (an encoding with nothing learned needs no checkpoint to be studied).
    pub fn checkpoint(mut self, load: bool) -> Self {
        self.checkpoint = load;
        self
    }
}

impl LoadedRun {
    /// Opens `run` as `opening` says.
    pub fn open(run: &RunDir, opening: &Opening) -> Result<Self> {
        let preset = run.preset_with(&opening.overrides)?;
        let (device, device_notice) = match &opening.device {
            Some(device) => (device.clone(), None),
            None => {
                let opened = preset.train.device.open_or_fallback()?;
                (opened.device, opened.notice)
            }
        };
        let params = Params::new(preset.train.seed, &device);
        let max_len = opening.max_len.unwrap_or(preset.task.seq_len());
        let model = preset.build_model_at(max_len, &params)?;
        if opening.checkpoint {
            run.load_checkpoint(&params)?;
        }
        Ok(Self {
            run: run.clone(),
            preset,
            model,
            device,
            device_notice,
        })
    }
}
