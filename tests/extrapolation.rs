//! Length extrapolation: block-wise evaluation equals the explicit matrices, perplexity matches a
//! hand computation, and `attnlab extrapolate` trains, evaluates and stores its results.

#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod common;

use std::sync::atomic::AtomicBool;

use attnlab::extrapolation::perplexity::{Pass, Protocol, score};
use attnlab::tasks::TaskSpec;
use attnlab::tasks::lm::LmConfig;
use candle_core::{DType, Device, Tensor};

/// Every causal mechanism with every encoding: logits from query blocks of 5 equal the
/// explicit-matrix forward on a length-16 sequence.
#[test]
fn block_evaluation_equals_the_explicit_matrices() {
    let (valid, _) = common::all_combinations();
    let ids: Vec<u32> = (0..32).map(|i| (i * 7 + 3) % 32).collect();
    let ids = Tensor::from_vec(ids, (2, 16), &Device::Cpu).unwrap();
    let mut checked = 0;
    for preset in valid.iter().filter(|p| p.attention.is_causal()) {
        let (model, _) = common::build(preset);
        let explicit = model.forward(&ids).unwrap().logits;
        let blocks = model.logits_blocks(&ids, 5).unwrap();
        let diff = common::max_abs_diff(&explicit, &blocks);
        assert!(diff < 1e-4, "{}: max difference {diff}", preset.name);
        checked += 1;
    }
    assert!(checked >= 60, "only {checked} combinations");
}

/// With every parameter 0 except the LM head's bias b = ln(1, 2, 3, 4), the model predicts
/// p = (0.1, 0.2, 0.3, 0.4) at every position, whatever the input.
fn known_model() -> (attnlab::model::Transformer, Device) {
    let mut preset = common::tiny(Default::default(), Default::default());
    preset.task = TaskSpec::Lm(LmConfig {
        tokens: attnlab::tasks::lm::Tokens::Chars,
        vocab_size: 4,
        seq_len: 4,
        ..LmConfig::default()
    });
    let (model, params) = common::build(&preset);
    for (name, var) in params.vars() {
        let value = if name == "head.bias" {
            Tensor::new(&[1f32, 2.0, 3.0, 4.0], &Device::Cpu)
                .unwrap()
                .log()
                .unwrap()
        } else {
            var.zeros_like().unwrap()
        };
        var.set(&value.to_dtype(DType::F32).unwrap()).unwrap();
    }
    (model, Device::Cpu)
}

#[test]
fn perplexity_matches_a_hand_computation() {
    let (model, device) = known_model();
    let tokens = [0u32, 1, 2, 3, 0];
    let mut pass = Pass {
        tokens: &tokens,
        span: 4,
        protocol: Protocol::NonOverlapping,
        stride: None,
        chunk: 1,
        batch_tokens: 2,
    };
    let cancel = AtomicBool::new(false);
    // Windows [0, 1] and [2, 3] predict 1, 2, 3, 0: p = 0.2, 0.3, 0.4, 0.1.
    let s = score(&model, &device, &pass, 2, &mut |_, _| {}, &cancel).unwrap();
    let want = (0.2f64 * 0.3 * 0.4 * 0.1).powf(-0.25);
    assert_eq!(s.tokens, 4);
    assert!(
        (s.perplexity() - want).abs() < 1e-4,
        "{} vs {want}",
        s.perplexity()
    );
    // Sliding, n = 4, stride 2: one window, its last two positions predict 3 and 0.
    pass.protocol = Protocol::Sliding;
    let s = score(&model, &device, &pass, 4, &mut |_, _| {}, &cancel).unwrap();
    assert_eq!(s.tokens, 2);
    assert!((s.perplexity() - (0.4f64 * 0.1).powf(-0.5)).abs() < 1e-4);
}

#[test]
fn cancelling_stops_the_evaluation() {
    let (model, device) = known_model();
    let tokens = [0u32; 9];
    let pass = Pass {
        tokens: &tokens,
        span: 8,
        protocol: Protocol::NonOverlapping,
        stride: None,
        chunk: 4,
        batch_tokens: 4,
    };
    let err = score(
        &model,
        &device,
        &pass,
        4,
        &mut |_, _| {},
        &AtomicBool::new(true),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("cancelled"), "{err}");
}

/// A run whose evaluation fails is left out with its error and the others' curves are kept
/// ("Compute for every run" lost every finished run to one failure); a cancel keeps what was
/// finished, and with nothing finished it is the error.
#[test]
fn a_failing_run_is_left_out_and_the_others_are_kept() {
    let root = tempfile::tempdir().unwrap();
    let mut preset = common::tiny(Default::default(), Default::default());
    preset.task = common::tiny_language_model();
    preset.train.max_steps = Some(2);
    let good = common::trained_run(&preset, root.path());
    preset.name = "broken".into();
    let bad = common::trained_run(&preset, root.path());
    std::fs::write(bad.join("model.safetensors"), b"not a checkpoint").unwrap();
    let open = |paths: &[&std::path::PathBuf]| -> Vec<attnlab::train::RunDir> {
        paths
            .iter()
            .map(|p| attnlab::train::RunDir::open(p).unwrap())
            .collect()
    };
    let options = attnlab::extrapolation::Options {
        lengths: vec![8, 16],
        ..Default::default()
    };
    let cancel = AtomicBool::new(false);
    let extrapolate = |runs: &[attnlab::train::RunDir], progress: &mut dyn FnMut(f32)| {
        attnlab::extrapolation::extrapolate_runs(runs, &options, progress, &cancel)
    };
    let table = extrapolate(&open(&[&bad, &good]), &mut |_| {}).unwrap();
    assert!(!table.curves.is_empty());
    assert!(
        table.curves.iter().all(|c| good.ends_with(&c.run)),
        "{:?}",
        table.curves
    );
    assert_eq!(table.left_out.len(), 1, "{:?}", table.left_out);
    assert!(
        table.left_out[0].starts_with("broken ("),
        "{:?}",
        table.left_out
    );
    // Alone, the broken run's failure is the error, naming it.
    let err = extrapolate(&open(&[&bad]), &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("broken ("), "{err}");
    // Cancelled as the first of two runs ends (its share of the progress is half): its
    // curves are kept, the second is left out as cancelled.
    let runs = open(&[&good, &good]);
    let table = extrapolate(&runs, &mut |done| {
        if done >= 0.5 {
            cancel.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    })
    .unwrap();
    assert!(!table.curves.is_empty());
    assert_eq!(table.left_out.len(), 1, "{:?}", table.left_out);
    assert!(
        table.left_out[0].contains("cancelled"),
        "{:?}",
        table.left_out
    );
    // With nothing finished, the cancel is the error.
    let err = extrapolate(&runs, &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("cancelled"), "{err}");
}

/// `--set` overrides that make an LM preset tiny, on the generated corpus, evaluated once.
fn tiny_lm() -> Vec<&'static str> {
    let train = [
        "--set",
        "train.batch_size=8",
        "--set",
        "train.max_steps=4",
        "--set",
        "train.eval_every=4",
        "--set",
        "train.warmup_steps=1",
    ];
    [common::TINY_LM, &train].concat()
}

#[test]
fn cli_trains_presets_then_stores_perplexity_by_length() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().to_str().unwrap();
    let out = dir.path().join("all.json");
    let figure = dir.path().join("ppl.svg");
    let mut args = vec![
        "extrapolate",
        "presets/lm_learned.toml",
        "presets/lm_rope.toml",
        "--lengths",
        "8,16,32",
        "--format",
        "json",
        "--quiet",
        "--runs",
        runs,
        "--out",
        out.to_str().unwrap(),
        "--figure",
        figure.to_str().unwrap(),
    ];
    args.extend(tiny_lm());
    let o = common::attnlab(&args);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(json["protocol"], "non-overlapping");
    assert_eq!(json["train_length"], 8);
    assert_eq!(json["lengths"], serde_json::json!([8, 16, 32]));
    let learned = json["ppl"]["lm-learned"].as_array().unwrap();
    assert!(learned[0].as_f64().unwrap() > 1.0);
    assert!(
        learned[1].is_null() && learned[2].is_null(),
        "no positions past L"
    );
    for name in [
        "lm-rope",
        "lm-rope + pi",
        "lm-rope + rerope",
        "lm-rope + rerope w=L/2",
        "lm-rope + leaky-rerope",
    ] {
        let ppl = json["ppl"][name].as_array().unwrap();
        assert!(
            ppl.iter().all(|p| p.as_f64().is_some_and(|p| p > 1.0)),
            "{name}"
        );
        assert_eq!(json["delta"][name][0], 0.0);
    }
    assert!(
        std::fs::read_to_string(&figure)
            .unwrap()
            .contains("non-overlapping")
    );
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(written, json);
    let saved = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.path()
                .join("extrapolation-non-overlapping.json")
                .is_file()
        })
        .count();
    assert_eq!(saved, 2, "each run folder keeps its results");
    // Each run names the text it trained on (`auto` fell back unseen before).
    let corpora: Vec<serde_json::Value> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path().join("summary.json"))
        .filter(|summary| summary.is_file())
        .map(|summary| serde_json::from_str(&std::fs::read_to_string(summary).unwrap()).unwrap())
        .map(|summary: serde_json::Value| summary["corpus"].clone())
        .collect();
    assert_eq!(corpora, vec!["generated: seeded synthetic prose"; 2]);
}

#[test]
fn linformer_cannot_model_language() {
    let mut args = vec![
        "check",
        "presets/lm_alibi.toml",
        "--set",
        "attention.kind=linformer",
        "--set",
        "encoding.kind=none",
    ];
    args.extend_from_slice(&common::TINY_LM[..2]);
    let o = common::attnlab(&args);
    assert!(!o.status.success());
    let err = common::stderr(&o);
    assert!(
        err.contains("attention.kind = linformer") && err.contains("lm task"),
        "{err}"
    );
}
