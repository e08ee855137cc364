//! Helpers shared by the integration tests.
#![allow(dead_code)]
#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

use attnlab::Preset;
use attnlab::attention::{MechanismSpec, SoftmaxConfig};
use attnlab::encodings::EncodingSpec;
use attnlab::model::{MixerKind, Transformer};
use attnlab::params::Params;
use attnlab::settings::Section;
use attnlab::tasks::TaskSpec;
use attnlab::tasks::mqar::MqarConfig;
use candle_core::Device;
use std::process::{Command, Output};

/// A tiny but complete preset: 2 layers, 2 heads, d_model 16, MQAR of length 16.
pub fn tiny(mechanism: MechanismSpec, encoding: EncodingSpec) -> Preset {
    let mut p = Preset {
        name: format!("tiny-{}-{}", mechanism.name(), encoding.name()),
        attention: mechanism,
        encoding,
        ..Preset::default()
    };
    p.model.d_model = 16;
    p.model.n_heads = 2;
    p.model.mlp_ratio = 2;
    p.task = TaskSpec::Mqar(MqarConfig {
        vocab_size: 32,
        seq_len: 16,
        num_kv_pairs: 2,
        train_examples: 64,
        test_examples: 16,
        ..MqarConfig::default()
    });
    p.train.batch_size = 8;
    p.train.max_steps = Some(4);
    p.eval.attention_examples = 2;
    p
}

/// The device tests that train whole runs (the resume tests) use: `ATTNLAB_TEST_DEVICE`
/// (`cpu`, `cuda:0`), so the GPU machine can run them unchanged on the GPU; the CPU otherwise.
pub fn test_device() -> attnlab::device::DeviceName {
    match std::env::var("ATTNLAB_TEST_DEVICE") {
        Ok(name) => name
            .parse()
            .unwrap_or_else(|e| panic!("ATTNLAB_TEST_DEVICE={name}: {e}")),
        Err(_) => attnlab::device::DeviceName::Cpu,
    }
}

/// Small settings for mechanisms with a feature dimension, so tiny models stay tiny.
pub fn small_mechanisms() -> Vec<MechanismSpec> {
    MechanismSpec::all_defaults()
        .into_iter()
        .map(|m| match m {
            MechanismSpec::Based(mut c) => {
                c.feature_dim = 4;
                MechanismSpec::Based(c)
            }
            MechanismSpec::Rebased(mut c) => {
                c.feature_dim = 4;
                MechanismSpec::Rebased(c)
            }
            MechanismSpec::Linformer(mut c) => {
                c.proj_dim = 4;
                MechanismSpec::Linformer(c)
            }
            // Chunks shorter than the tiny presets' 16 tokens, so state crosses chunks.
            MechanismSpec::Retention(mut c) => {
                c.chunk = 4;
                MechanismSpec::Retention(c)
            }
            MechanismSpec::Gla(mut c) => {
                c.chunk = 4;
                MechanismSpec::Gla(c)
            }
            MechanismSpec::Deltanet(mut c) => {
                c.chunk = 4;
                MechanismSpec::Deltanet(c)
            }
            MechanismSpec::GatedDeltanet(mut c) => {
                c.chunk = 4;
                MechanismSpec::GatedDeltanet(c)
            }
            MechanismSpec::Mamba2(mut c) => {
                (c.chunk, c.d_state) = (4, 4);
                MechanismSpec::Mamba2(c)
            }
            other => other,
        })
        // Sliding-window softmax: a window shorter than the tiny presets' 16 tokens.
        .chain([MechanismSpec::Softmax(SoftmaxConfig {
            window: Some(5),
            ..Default::default()
        })])
        .collect()
}

/// Every encoding with its defaults, except that windows are narrower than the tiny
/// sequences, so both sides of a window are exercised.
pub fn small_encodings() -> Vec<EncodingSpec> {
    EncodingSpec::all_defaults()
        .into_iter()
        .map(|e| {
            ["window", "width"]
                .iter()
                .filter(|key| e.value(key).is_some())
                .fold(e.clone(), |e, key| e.with_value(key, 4.0).unwrap())
        })
        .collect()
}

/// Every mechanism × encoding pair that the preset validation accepts, with the pairs it rejects.
pub fn all_combinations() -> (Vec<Preset>, Vec<Preset>) {
    let mut valid = Vec::new();
    let mut rejected = Vec::new();
    for mechanism in small_mechanisms() {
        for encoding in small_encodings() {
            let preset = tiny(mechanism.clone(), encoding);
            if preset.validate().is_ok() {
                valid.push(preset);
            } else {
                rejected.push(preset);
            }
        }
    }
    (valid, rejected)
}

/// The model of `preset` with fresh parameters, on the CPU.
pub fn build(preset: &Preset) -> (Transformer, Params) {
    let params = Params::new(preset.train.seed, &Device::Cpu);
    let model = preset.build_model(&params).expect("model builds");
    (model, params)
}

/// The preset with a short convolution in front of attention (the ReBased MQAR model).
pub fn hybrid(mut preset: Preset) -> Preset {
    preset.model.mixers = vec![MixerKind::ShortConv, MixerKind::Attention];
    preset
}

/// Runs the attnlab binary in the crate root, as a user would.
pub fn attnlab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attnlab"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("attnlab runs")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `--set` overrides that make any MQAR preset tiny: 6 steps, evaluated at 3 and 6.
pub const TINY: &[&str] = &[
    "--set",
    "model.d_model=16",
    "--set",
    "task.seq_len=16",
    "--set",
    "task.vocab_size=32",
    "--set",
    "task.num_kv_pairs=2",
    "--set",
    "task.train_examples=64",
    "--set",
    "task.test_examples=16",
    "--set",
    "train.batch_size=8",
    "--set",
    "train.max_steps=6",
    "--set",
    "train.eval_every=3",
    "--set",
    "train.warmup_steps=1",
];

/// Trains `preset` (a few steps) into a new run folder under `root` and returns its path.
pub fn trained_run(preset: &Preset, root: &std::path::Path) -> std::path::PathBuf {
    let mut dir = None;
    attnlab::train::run::run(
        preset,
        root,
        &std::sync::atomic::AtomicBool::new(false),
        &mut |event| {
            if let attnlab::train::TrainEvent::Started { run_dir, .. } = event {
                dir = Some(run_dir);
            }
        },
    )
    .unwrap();
    dir.unwrap()
}

/// Loss and every parameter's gradient (by name, flattened to f32 on the host) of the first 8
/// training rows of `preset`'s MQAR task, on `device`.
pub fn loss_and_grads(preset: &Preset, device: &Device) -> (f32, Vec<(String, Vec<f32>)>) {
    let params = Params::new(preset.train.seed, device);
    let model = preset.build_model(&params).unwrap();
    let data = preset
        .task
        .mqar()
        .unwrap()
        .generate(attnlab::tasks::Split::Train);
    let batch = data.batch(&(0..8).collect::<Vec<_>>(), device).unwrap();
    let logits = model.logits_at(&batch.inputs, &batch.rows).unwrap();
    let loss = attnlab::ops::cross_entropy(&logits, &batch.targets).unwrap();
    let grads = loss.backward().unwrap();
    let host = |t: &candle_core::Tensor| {
        let t = t
            .to_device(&Device::Cpu)
            .unwrap()
            .to_dtype(candle_core::DType::F32);
        t.unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()
    };
    let named = params
        .vars()
        .into_iter()
        .map(|(name, var)| {
            let grad = grads
                .get(var.as_tensor())
                .unwrap_or_else(|| panic!("{}: no gradient for {name}", preset.name));
            (name, host(grad))
        })
        .collect();
    (host(&loss)[0], named)
}

/// Trains `preset` for at most `max_steps`, evaluating every 100 steps, until its test accuracy
/// reaches 99 %: (the last accuracy, steps taken).
pub fn train_to_99(preset: &Preset, max_steps: usize) -> (f64, usize) {
    let mut trainer = attnlab::train::Trainer::new(preset).unwrap();
    let mut accuracy = 0.0;
    while trainer.step() < max_steps {
        trainer.train_step().unwrap();
        if trainer.step().is_multiple_of(100) {
            accuracy = trainer.evaluate().unwrap().accuracy;
            if accuracy >= 0.99 {
                break;
            }
        }
    }
    (accuracy, trainer.step())
}

/// The largest absolute difference between two tensors of one shape.
pub fn max_abs_diff(a: &candle_core::Tensor, b: &candle_core::Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// Language modelling on generated text at L 8, small enough to train in a test.
pub fn tiny_language_model() -> TaskSpec {
    TaskSpec::Lm(attnlab::tasks::lm::LmConfig {
        corpus: "generated".into(),
        seq_len: 8,
        train_bytes: 4000,
        valid_bytes: 600,
        train_examples: 64,
        test_examples: 8,
        ..Default::default()
    })
}

/// `--set` overrides that make a language-modelling preset tiny: [`tiny_language_model`]'s
/// task (the corpus first) under a model of one layer at d 16. Tests add their training
/// settings.
pub const TINY_LM: &[&str] = &[
    "--set",
    "task.corpus=generated",
    "--set",
    "model.d_model=16",
    "--set",
    "model.n_layers=1",
    "--set",
    "task.seq_len=8",
    "--set",
    "task.train_bytes=4000",
    "--set",
    "task.valid_bytes=600",
    "--set",
    "task.train_examples=64",
    "--set",
    "task.test_examples=8",
];
