//! `model.layout = "zoology"` builds zoology's MQAR model (zoology/model.py): its parameter
//! count, its initialisation statistics, its tied head without a bias, the LayerNorm its
//! Identity state mixer adds, and dropout while training only. The attnlab layout keeps
//! PyTorch's module defaults (tests/training.rs and the benchmark rely on those).

#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

mod common;

use attnlab::Preset;
use attnlab::attention::MechanismSpec;
use attnlab::encodings::EncodingSpec;
use attnlab::model::Layout;
use attnlab::tasks::Split;
use candle_core::{Device, Tensor};

/// zoology's basic MQAR configuration: d_model 64, 2 layers, one head, no MLP (Identity state
/// mixer), learned positions for 64 tokens, vocabulary 256.
fn zoology_preset(layout: Layout) -> Preset {
    let mut preset = common::tiny(
        MechanismSpec::Softmax(Default::default()),
        EncodingSpec::Learned(Default::default()),
    );
    preset.model.d_model = 64;
    preset.model.n_heads = 1;
    preset.model.mlp_ratio = 0;
    preset.model.layout = layout;
    let attnlab::tasks::TaskSpec::Mqar(mqar) = &mut preset.task else {
        unreachable!("tiny presets are MQAR")
    };
    mqar.seq_len = 64;
    mqar.vocab_size = 256;
    mqar.num_kv_pairs = 4;
    preset.validate().unwrap();
    preset
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

fn std(v: &[f32]) -> f64 {
    let n = v.len() as f64;
    let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
    (v.iter()
        .map(|&x| (f64::from(x) - mean).powi(2))
        .sum::<f64>()
        / n)
        .sqrt()
}

/// zoology's count: embedding V·d + positions T·d; per layer LayerNorm 2d, Wqkv 3d² + 3d,
/// out_proj d² + d, the state mixer's LayerNorm 2d; ln_f 2d; the head tied (nothing).
#[test]
fn the_zoology_layout_has_zoologys_parameter_count() {
    let (v, t, d, layers) = (256, 64, 64, 2);
    let zoology = v * d + t * d + layers * (2 * d + 3 * d * d + 3 * d + d * d + d + 2 * d) + 2 * d;
    let (_, params) = common::build(&zoology_preset(Layout::Zoology));
    assert_eq!(params.count(), zoology);
    // attnlab: no state-mixer norm, an untied head with a bias.
    let (_, params) = common::build(&zoology_preset(Layout::Attnlab));
    assert_eq!(params.count(), zoology - layers * 2 * d + v * d + v);
}

/// N(0, 0.02) weights, the residual outputs N(0, 0.02/√(2·layers)), zero biases, LayerNorm
/// at (1, 0), the head the embedding itself.
#[test]
fn the_zoology_layout_starts_as_zoology_does() {
    let (_, params) = common::build(&zoology_preset(Layout::Zoology));
    let vars: std::collections::BTreeMap<String, Vec<f32>> = params
        .vars()
        .into_iter()
        .map(|(name, var)| (name, values(var.as_tensor())))
        .collect();
    let close = |name: &str, want: f64| {
        let got = std(&vars[name]);
        assert!(
            (got - want).abs() < 0.1 * want,
            "{name}: std {got}, want {want}"
        );
    };
    close("embedding.weight", 0.02);
    close("blocks.0.attn.qkv.weight", 0.02);
    close("blocks.1.attn.out.weight", 0.02 / 2.0);
    for (name, v) in &vars {
        if name.ends_with("qkv.bias") || name.ends_with("out.bias") || name.ends_with("norm.bias") {
            assert!(v.iter().all(|x| *x == 0.0), "{name} starts at 0");
        }
        if name.ends_with("norm.weight") {
            assert!(v.iter().all(|x| *x == 1.0), "{name} starts at 1");
        }
    }
    assert!(
        vars.contains_key("blocks.0.mlp_norm.weight"),
        "the Identity state mixer's norm"
    );
    assert!(
        !vars.keys().any(|n| n.starts_with("head")),
        "the head is the embedding"
    );
}

/// Dropout acts in training steps only: evaluation is deterministic and equal across calls,
/// training logits change with the step's seed; the attnlab layout has no dropout.
#[test]
fn dropout_acts_while_training_only() {
    for (layout, has_dropout) in [(Layout::Zoology, true), (Layout::Attnlab, false)] {
        let preset = zoology_preset(layout);
        let (model, _) = common::build(&preset);
        let data = preset.task.mqar().unwrap().generate(Split::Train);
        let batch = data
            .batch(&(0..4).collect::<Vec<_>>(), &Device::Cpu)
            .unwrap();
        let eval = values(&model.logits_at(&batch.inputs, &batch.rows).unwrap());
        assert_eq!(
            eval,
            values(&model.logits_at(&batch.inputs, &batch.rows).unwrap())
        );
        let train = |seed| {
            values(
                &model
                    .train_logits(&batch.inputs, &batch.rows, &[seed])
                    .unwrap(),
            )
        };
        assert_eq!(train(1), train(1), "the same seed drops the same units");
        assert_eq!(train(1) != eval, has_dropout, "{layout:?}");
        assert_eq!(train(1) != train(2), has_dropout, "{layout:?}");
    }
}

/// A zoology-layout preset with its dropout set to 0 trains exactly like evaluation computes.
#[test]
fn dropout_rates_are_settings() {
    let mut preset = zoology_preset(Layout::Zoology);
    preset.model.embed_dropout = Some(0.0);
    preset.model.attention_dropout = Some(0.0);
    let (model, _) = common::build(&preset);
    let data = preset.task.mqar().unwrap().generate(Split::Train);
    let batch = data.batch(&[0, 1], &Device::Cpu).unwrap();
    assert_eq!(
        values(&model.logits_at(&batch.inputs, &batch.rows).unwrap()),
        values(
            &model
                .train_logits(&batch.inputs, &batch.rows, &[5])
                .unwrap()
        )
    );
    preset.model.attention_dropout = Some(1.0);
    let error = preset.validate().unwrap_err().to_string();
    assert!(
        error.contains("model.attention_dropout = 1: must be in [0, 1)"),
        "{error}"
    );
}
