//! A model's recurrent state: what it carries from token to token at the end of a sequence,
//! summed over its layers. The recall-vs-state plots of the Based paper and zoology put MQAR
//! accuracy against it; zoology reports 4 × Σ of its per-mixer formulas (fp32 bytes) at the
//! longest test length, which [`ModelState::zoology_units`] reproduces.

use serde::{Deserialize, Serialize};

use super::Preset;
use crate::attention::{MechanismSpec, StateShape};
use crate::model::MixerKind;

/// A model's recurrent state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelState {
    /// Floats attnlab's recurrent forms keep, over all layers.
    pub floats: usize,
    /// zoology's count: 4 × the sum of its per-mixer `state_size` formulas.
    pub zoology_units: usize,
}

impl Preset {
    /// The model's recurrent state at the task's sequence length; `None` when a layer has
    /// none (Linformer) or the encoding makes attnlab run it in its explicit form
    /// ([`Self::why_no_state`]). A short convolution keeps its k last inputs (d·k, zoology's
    /// count), the previous-token layer its last input (d); MLPs keep nothing.
    pub fn state(&self) -> Option<ModelState> {
        if self.encoding_breaks_recurrence() {
            return None;
        }
        let m = &self.model;
        let layer = self.state_shape();
        let (mut floats, mut zoology) = (0, 0);
        for l in 0..m.n_layers {
            let (exact, zoology_count) = match m.mixer(l) {
                MixerKind::Attention => {
                    let state = self.attention.state(&layer)?;
                    (state.floats, state.zoology)
                }
                MixerKind::ShortConv => (m.d_model * m.conv_kernel, m.d_model * m.conv_kernel),
                MixerKind::PrevToken => (m.d_model, m.d_model),
            };
            floats += exact;
            zoology += zoology_count;
        }
        Some(ModelState {
            floats,
            zoology_units: 4 * zoology,
        })
    }

    /// One attention layer's shape, as the mechanisms count their state.
    fn state_shape(&self) -> StateShape {
        let m = &self.model;
        StateShape {
            heads: m.n_heads,
            qk_dim: self.attention.qk_dim(m.head_dim()),
            head_dim: m.head_dim(),
            len: self.task.seq_len(),
        }
    }

    /// Whether the encoding turns the mechanism's recurrence into its explicit T × T form (a
    /// logit bias, ReRoPE's two score matrices): then it keeps every key as attention does,
    /// not a state of fixed size. Softmax's state is its cache of keys and values, which holds
    /// whatever the encoding does with them.
    fn encoding_breaks_recurrence(&self) -> bool {
        !self.encoding.positions_q_and_k_alone()
            && !matches!(self.attention, MechanismSpec::Softmax(_))
    }

    /// Why [`Self::state`] is `None`, in words.
    pub fn why_no_state(&self) -> String {
        let mechanism = self.attention.name();
        let recurrent = self.attention.state(&self.state_shape()).is_some();
        match recurrent && self.encoding_breaks_recurrence() {
            true => format!(
                "with {}, {mechanism} runs its explicit T × T form, without a recurrence: \
                 the encoding is not a map of q and k alone (a logit bias, ReRoPE's two scores)",
                self.encoding.name()
            ),
            false => format!("{mechanism} has no recurrent form"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::{BasedConfig, MechanismSpec, SoftmaxConfig};

    /// The Based paper's Figure 2 models: 2 layers, a BaseConv (k = 3) and the mixer, at the
    /// longest test length 1,024.
    fn figure2(mechanism: MechanismSpec, d_model: usize, n_heads: usize) -> Preset {
        let mut preset = Preset {
            attention: mechanism,
            ..Preset::default()
        };
        preset.model.d_model = d_model;
        preset.model.n_heads = n_heads;
        preset.model.n_layers = 2;
        preset.model.conv_kernel = 3;
        preset.model.mixers = vec![MixerKind::ShortConv, MixerKind::Attention];
        if let crate::tasks::TaskSpec::Mqar(c) = &mut preset.task {
            c.seq_len = 1024;
        }
        preset
    }

    /// zoology's anchor points (its `state_size` formulas, × 4).
    #[test]
    fn zoology_units_match_its_anchor_points() {
        let softmax = MechanismSpec::Softmax(SoftmaxConfig::default());
        let units = |p: &Preset| p.state().unwrap().zoology_units;
        assert_eq!(units(&figure2(softmax.clone(), 64, 1)), 525_056);
        assert_eq!(units(&figure2(softmax, 128, 2)), 1_050_112);
        // zoology's window b = 8 is attnlab's w = 9.
        let window = MechanismSpec::Softmax(SoftmaxConfig {
            window: Some(9),
            ..Default::default()
        });
        assert_eq!(units(&figure2(window, 128, 2)), 9_728);
        // Based keeps one key-value head in zoology: d_v = d, H = 1.
        let based = |f| MechanismSpec::Based(BasedConfig { feature_dim: f });
        assert_eq!(units(&figure2(based(8), 48, 1)), 9_396);
        assert_eq!(units(&figure2(based(24), 128, 1)), 169_236);
    }

    /// attnlab's own count: softmax keeps every key and value, a window w of them.
    #[test]
    fn exact_floats_count_what_the_recurrent_forms_keep() {
        let window = MechanismSpec::Softmax(SoftmaxConfig {
            window: Some(9),
            ..Default::default()
        });
        let state = figure2(window, 128, 2).state().unwrap();
        assert_eq!(state.floats, 128 * 3 + 9 * 2 * 128);
        // A window wider than the sequence keeps the sequence, in both counts.
        let wide = |w| {
            let window = MechanismSpec::Softmax(SoftmaxConfig {
                window: Some(w),
                ..Default::default()
            });
            figure2(window, 128, 2).state().unwrap()
        };
        let full = figure2(MechanismSpec::Softmax(SoftmaxConfig::default()), 128, 2);
        assert_eq!(wide(5000), full.state().unwrap());
        let mut linformer = figure2(MechanismSpec::default(), 64, 1);
        linformer.attention = MechanismSpec::all_defaults()
            .into_iter()
            .find(|m| m.name() == "linformer")
            .unwrap();
        assert_eq!(linformer.attention.name(), "linformer");
        assert_eq!(linformer.state(), None);
    }

    /// An encoding that is not a map of q and k alone makes a recurrent mixer quadratic: it
    /// has no state of fixed size then, and says why; softmax's cache holds keys whatever
    /// the encoding does, and RoPE keeps every recurrence.
    #[test]
    fn a_logit_bias_takes_a_recurrent_mixer_s_state_away() {
        let with = |mechanism: &str, encoding: &str| {
            let mut specs = MechanismSpec::all_defaults().into_iter();
            let spec = specs.find(|m| m.name() == mechanism).unwrap();
            let mut preset = figure2(spec, 64, 2);
            preset.encoding = crate::encodings::EncodingSpec::from_name(encoding).unwrap();
            preset
        };
        for mechanism in ["linear", "retention", "deltanet", "mamba2"] {
            assert!(with(mechanism, "rope").state().is_some(), "{mechanism}");
            for encoding in ["alibi", "t5", "rerope"] {
                let preset = with(mechanism, encoding);
                assert_eq!(preset.state(), None, "{mechanism} {encoding}");
                assert!(preset.why_no_state().contains(encoding));
            }
        }
        assert_eq!(
            with("softmax", "alibi").state(),
            with("softmax", "none").state()
        );
    }
}
