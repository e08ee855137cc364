//! Gradients must flow: after one step, every trainable tensor of every mechanism × encoding
//! combination has a finite, non-zero gradient. candle's fused softmax / layer_norm / rope have
//! no backward pass, and using one anywhere would silently freeze the parameters behind it.

#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

mod common;

use attnlab::Preset;
use attnlab::tasks::Split;

fn assert_every_parameter_gets_a_gradient(preset: &Preset) {
    let (model, params) = common::build(preset);
    let data = preset.task.mqar().expect("mqar").generate(Split::Train);
    let batch = data
        .batch(&(0..8).collect::<Vec<_>>(), &candle_core::Device::Cpu)
        .unwrap();
    let logits = model.logits_at(&batch.inputs, &batch.rows).unwrap();
    let loss = attnlab::ops::cross_entropy(&logits, &batch.targets).unwrap();
    let grads = loss.backward().unwrap();
    let vars = params.vars();
    assert!(!vars.is_empty());
    for (name, var) in vars {
        let grad = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("{}: no gradient for {name}", preset.name));
        let values = grad.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(
            values.iter().all(|g| g.is_finite()),
            "{}: non-finite gradient for {name}",
            preset.name
        );
        assert!(
            values.iter().any(|g| *g != 0.0),
            "{}: zero gradient for {name}",
            preset.name
        );
    }
}

#[test]
fn every_combination_trains() {
    let (valid, rejected) = common::all_combinations();
    // 9 mechanisms and windowed softmax × 20 encodings, plus Linformer with the 3 that are
    // not relative.
    assert_eq!(
        valid.len(),
        203,
        "{:?}",
        rejected.iter().map(|p| &p.name).collect::<Vec<_>>()
    );
    for preset in &valid {
        assert_every_parameter_gets_a_gradient(preset);
    }
}

#[test]
fn hybrid_models_with_short_convolutions_train() {
    for mechanism in common::small_mechanisms() {
        let preset = common::hybrid(common::tiny(
            mechanism,
            attnlab::encodings::EncodingSpec::Learned(Default::default()),
        ));
        assert_every_parameter_gets_a_gradient(&preset);
    }
}

/// Heads that do not divide the width (3 at d 16: 5 value channels each, 15 in all, as the
/// ReBased paper's 12 heads at d 64) train with every mechanism.
#[test]
fn heads_that_do_not_divide_the_width_train() {
    for mechanism in common::small_mechanisms() {
        let mut preset = common::tiny(
            mechanism,
            attnlab::encodings::EncodingSpec::Learned(Default::default()),
        );
        preset.model.n_heads = 3;
        preset.validate().unwrap();
        assert_every_parameter_gets_a_gradient(&preset);
    }
}

#[test]
fn every_rebased_ablation_trains() {
    use attnlab::attention::{MechanismSpec, RebasedConfig, RebasedVariant};
    for variant in [
        RebasedVariant::Rebased,
        RebasedVariant::X2,
        RebasedVariant::Norm,
        RebasedVariant::Gamma,
        RebasedVariant::GammaBeta,
    ] {
        let mechanism = MechanismSpec::Rebased(RebasedConfig {
            feature_dim: 4,
            variant,
        });
        assert_every_parameter_gets_a_gradient(&common::tiny(
            mechanism,
            attnlab::encodings::EncodingSpec::None(Default::default()),
        ));
    }
}

#[test]
fn every_linformer_sharing_mode_trains() {
    use attnlab::attention::{LinformerConfig, LinformerSharing, MechanismSpec};
    for sharing in [
        LinformerSharing::None,
        LinformerSharing::Headwise,
        LinformerSharing::Kv,
        LinformerSharing::Layerwise,
    ] {
        let mechanism = MechanismSpec::Linformer(LinformerConfig {
            proj_dim: 4,
            sharing,
        });
        let preset = common::tiny(
            mechanism,
            attnlab::encodings::EncodingSpec::Sinusoidal(Default::default()),
        );
        assert_every_parameter_gets_a_gradient(&preset);
        let (_, params) = common::build(&preset);
        let projections = params
            .vars()
            .iter()
            .filter(|(n, _)| n.contains("proj"))
            .count();
        let expected = match sharing {
            LinformerSharing::None | LinformerSharing::Headwise => 4, // E and F in each of 2 layers
            LinformerSharing::Kv => 2,
            LinformerSharing::Layerwise => 1,
        };
        assert_eq!(projections, expected, "{sharing:?}");
    }
}

/// DIET without sharing has one table per attention layer, and none for convolution layers.
#[test]
fn per_layer_encodings_train_in_hybrid_models() {
    use attnlab::encodings::{DietRelConfig, DietSharing, EncodingSpec};
    for sharing in [DietSharing::None, DietSharing::Layerwise] {
        let encoding = EncodingSpec::DietRel(DietRelConfig {
            max_distance: Some(8),
            sharing,
        });
        let mut preset = common::tiny(
            attnlab::attention::MechanismSpec::Softmax(Default::default()),
            encoding,
        );
        preset.model.n_layers = 3;
        preset.model.mixers = vec![
            attnlab::model::MixerKind::Attention,
            attnlab::model::MixerKind::ShortConv,
        ];
        assert_every_parameter_gets_a_gradient(&preset);
        let (_, params) = common::build(&preset);
        let tables: Vec<String> = params
            .vars()
            .into_iter()
            .map(|(n, _)| n)
            .filter(|n| n.contains("diet_rel"))
            .collect();
        let expected: &[&str] = match sharing {
            DietSharing::None => &["blocks.0.pos.diet_rel.table", "blocks.2.pos.diet_rel.table"],
            DietSharing::Layerwise => &["diet_rel.table"],
        };
        assert_eq!(tables, expected);
    }
}

/// MAD's auto-encoder head (`model.head = "autoencoder"`): its decoder, and every block under
/// it through the one pooled position, in both layouts its init differs in.
#[test]
fn the_auto_encoder_head_trains() {
    use attnlab::model::{Head, Layout};
    for layout in [Layout::Mad, Layout::Attnlab] {
        let mut preset = common::tiny(
            attnlab::attention::MechanismSpec::Softmax(Default::default()),
            attnlab::encodings::EncodingSpec::Rope(Default::default()),
        );
        preset.model.layout = layout;
        preset.model.head = Head::Autoencoder;
        assert_every_parameter_gets_a_gradient(&preset);
    }
}
