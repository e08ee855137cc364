//! Training behaviour: reproducibility, learning MQAR, NaN handling, stopping.

#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

mod common;

use std::path::Path;

use attnlab::Preset;
use attnlab::encodings::EncodingSpec;
use attnlab::train::{RunStatus, TrainEvent, Trainer};
use candle_core::Tensor;

fn losses(preset: &Preset, steps: usize) -> Vec<f32> {
    let mut trainer = Trainer::new(preset).unwrap();
    (0..steps)
        .map(|_| trainer.train_step().unwrap().loss)
        .collect()
}

#[test]
fn same_preset_and_seed_give_the_same_numbers() {
    let preset = common::tiny(
        attnlab::attention::MechanismSpec::Softmax,
        EncodingSpec::Alibi(Default::default()),
    );
    assert_eq!(losses(&preset, 3), losses(&preset, 3));
    let mut other = preset.clone();
    other.train.seed = 1;
    assert_ne!(losses(&preset, 3), losses(&other, 3));
}

/// Softmax attention learns MQAR to ≥ 99% test accuracy within a bounded number of steps.
#[test]
fn softmax_learns_mqar() {
    let preset = Preset::load(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("presets/mqar_softmax.toml")
            .as_path(),
        &[
            "task.seq_len=32".into(),
            "model.layout=attnlab".into(),
            "task.vocab_size=64".into(),
            "train.eval_every=100".into(),
        ],
    )
    .unwrap();
    let (accuracy, steps) = common::train_to_99(&preset, 1000);
    assert!(
        accuracy >= 0.99,
        "test accuracy {accuracy} after {steps} steps"
    );
}

#[test]
fn non_finite_loss_is_an_error_naming_the_step() {
    let preset = common::tiny(
        attnlab::attention::MechanismSpec::Softmax,
        EncodingSpec::Learned,
    );
    let mut trainer = Trainer::new(&preset).unwrap();
    trainer.train_step().unwrap();
    let (_, var) = trainer
        .params()
        .vars()
        .into_iter()
        .find(|(n, _)| n == "head.bias")
        .unwrap();
    var.set(&Tensor::full(f32::NAN, var.shape(), var.device()).unwrap())
        .unwrap();
    let err = trainer.train_step().unwrap_err().to_string();
    assert!(err.contains("step 2") && err.contains("NaN"), "{err}");
}

/// Trains `preset` into a new folder under `root`; the run's error and its folder.
fn failed_run(preset: &Preset, root: &Path) -> (String, std::path::PathBuf) {
    let mut dir = None;
    let result = attnlab::train::run::run(
        preset,
        root,
        &std::sync::atomic::AtomicBool::new(false),
        &mut |event| {
            if let TrainEvent::Started { run_dir, .. } = event {
                dir = Some(run_dir);
            }
        },
    );
    (result.unwrap_err().to_string(), dir.unwrap())
}

/// A diverging run never writes a checkpoint holding NaN or infinity (one used to be saved
/// right after the update that diverged), and its message names the step and the checkpoint
/// it keeps, or says there is none (it used to claim "the last good checkpoint is kept").
#[test]
fn divergence_names_the_step_and_the_finite_checkpoint_kept() {
    let root = tempfile::tempdir().unwrap();
    let mut preset = common::tiny(
        attnlab::attention::MechanismSpec::Softmax,
        EncodingSpec::Learned,
    );
    preset.train.eval_every = 1;
    // ε = 5e-324 divides the first update by zero: parameters are NaN after step 1.
    let mut first_update = preset.clone();
    first_update.train.eps = 5e-324;
    let (err, dir) = failed_run(&first_update, root.path());
    assert!(
        err.contains("diverged at step 1") && err.contains("no checkpoint was saved"),
        "{err}"
    );
    assert!(!dir.join("model.safetensors").exists());
    let summary = attnlab::train::RunDir::open(&dir)
        .unwrap()
        .read_summary()
        .unwrap();
    assert_eq!(summary.status, RunStatus::Failed);
    let metrics = attnlab::train::RunDir::open(&dir)
        .unwrap()
        .read_metrics()
        .unwrap();
    assert!(
        metrics
            .iter()
            .any(|m| matches!(m, attnlab::train::MetricRecord::Eval(e) if e.loss.is_nan())),
        "the evaluation's NaN loss is kept in metrics.jsonl: {metrics:?}"
    );
    // Decay of lr·wd = 1e30 leaves finite parameters of ~1e28 after step 1 whose loss at step 2
    // is not finite.
    let mut later = preset;
    later.train.weight_decay = 1e33;
    let (err, dir) = failed_run(&later, root.path());
    let checkpoint = dir.join("model.safetensors");
    assert!(
        err.contains("diverged at step 2")
            && err.contains("the last finite checkpoint, from step 1, is kept")
            && err.contains(checkpoint.to_str().unwrap()),
        "{err}"
    );
    let saved = candle_core::safetensors::load(&checkpoint, &candle_core::Device::Cpu).unwrap();
    for (name, tensor) in saved {
        let values = tensor.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(values.iter().all(|v| v.is_finite()), "{name}");
    }
}

#[test]
fn stopping_a_run_keeps_its_results() {
    let dir = tempfile::tempdir().unwrap();
    let mut preset = common::tiny(
        attnlab::attention::MechanismSpec::Softmax,
        EncodingSpec::Rope(Default::default()),
    );
    preset.train.max_steps = Some(100_000);
    let handle = attnlab::train::spawn(preset, dir.path().to_path_buf(), || {});
    let mut run_dir = None;
    let mut summary = None;
    for event in handle.events.iter() {
        match event {
            TrainEvent::Started { run_dir: d, .. } => run_dir = Some(d),
            TrainEvent::Step(s) if s.step == 3 => handle.stop(),
            TrainEvent::Finished(s) => summary = Some(*s),
            TrainEvent::Failed { message, .. } => panic!("{message}"),
            _ => {}
        }
    }
    let summary = summary.expect("finished");
    assert_eq!(summary.status, RunStatus::Stopped);
    assert!(summary.steps >= 3 && summary.steps < 100);
    assert_eq!(
        (summary.device, summary.device_notice.as_deref()),
        (attnlab::device::DeviceName::Cpu, None)
    );
    let run_dir = attnlab::train::RunDir::open(&run_dir.unwrap()).unwrap();
    assert_eq!(run_dir.read_summary().unwrap(), summary);
    assert!(run_dir.checkpoint_path().is_file());
    let index = run_dir.read_attention_index().unwrap();
    // The stop evaluates and saves the weights of its own step, not those of the last
    // scheduled evaluation.
    assert_eq!(index.step, summary.steps);
    assert_eq!(index.layers.len(), 2);
    assert_eq!(
        run_dir.read_attention(&index.layers[1]).unwrap().dims(),
        &[2, 2, 16, 16]
    );
    handle.join().unwrap();
}

#[test]
fn checkpoint_restores_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let preset = common::tiny(
        attnlab::attention::MechanismSpec::Linear,
        EncodingSpec::Sinusoidal,
    );
    let mut trainer = Trainer::new(&preset).unwrap();
    trainer.train_step().unwrap();
    let path = dir.path().join("m.safetensors");
    trainer.params().save(&path).unwrap();
    let before = trainer.evaluate().unwrap();
    let fresh = Trainer::new(&preset).unwrap();
    fresh.params().load(&path).unwrap();
    let after = fresh.evaluate().unwrap();
    assert_eq!(before.loss, after.loss);
}
