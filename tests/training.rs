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
        attnlab::attention::MechanismSpec::Softmax(Default::default()),
        EncodingSpec::Alibi(Default::default()),
    );
    assert_eq!(losses(&preset, 3), losses(&preset, 3));
    let mut other = preset.clone();
    other.train.seed = 1;
    assert_ne!(losses(&preset, 3), losses(&other, 3));
}

/// Two runs with the same seed and threads give the same numbers, bit for bit (issue 32:
/// they differed from about step 10 on 2 threads, as rayon's `reduce` summed the parallel
/// partial sums of the LayerNorm and bias gradients in an order that followed work
/// stealing). Big enough batches that those sums split into blocks (64 × 64 rows), Based for
/// its short convolution's and feature map's gradients; every parameter compared.
#[test]
fn same_seed_and_threads_give_the_same_weights_bit_for_bit() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let overrides = [
        "model.d_model=16",
        "attention.feature_dim=4",
        "task.train_examples=1280",
        "train.seed=3",
    ]
    .map(String::from);
    let preset = Preset::load(&root.join("presets/mqar_based.toml"), &overrides).unwrap();
    let trained = || {
        let mut trainer = Trainer::new(&preset).unwrap();
        let losses: Vec<u32> = (0..30)
            .map(|_| trainer.train_step().unwrap().loss.to_bits())
            .collect();
        let weights: Vec<(String, Vec<u32>)> = trainer
            .params()
            .vars()
            .into_iter()
            .map(|(name, var)| {
                let values = var.as_tensor().flatten_all().unwrap().to_vec1::<f32>();
                (name, values.unwrap().iter().map(|v| v.to_bits()).collect())
            })
            .collect();
        (losses, weights)
    };
    let first = trained();
    for _ in 0..2 {
        let again = trained();
        assert_eq!(first.0, again.0, "losses");
        for ((name, a), (_, b)) in first.1.iter().zip(&again.1) {
            assert!(a == b, "{name} differs");
        }
    }
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
        attnlab::attention::MechanismSpec::Softmax(Default::default()),
        EncodingSpec::Learned(Default::default()),
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

/// Drives `trainer` into a new folder under `root`, calling `on_event` with each event and
/// checking that a failure's summary is on disk before `Failed` goes out (the CLI exits on
/// it); the run's error and its folder.
fn failed_run(
    trainer: Trainer,
    root: &Path,
    mut on_event: impl FnMut(&TrainEvent),
) -> (String, std::path::PathBuf) {
    let mut dir = None;
    let result = attnlab::train::run::run_trainer(
        trainer,
        root,
        &std::sync::atomic::AtomicBool::new(false),
        &mut |event| {
            on_event(&event);
            match event {
                TrainEvent::Started { run_dir, .. } => dir = Some(run_dir),
                TrainEvent::Failed { .. } => {
                    let dir = attnlab::train::RunDir::open(dir.as_ref().unwrap()).unwrap();
                    assert_eq!(dir.read_summary().unwrap().status, RunStatus::Failed);
                }
                _ => {}
            }
        },
    );
    (result.unwrap_err().to_string(), dir.unwrap())
}

/// A trainer of the tiny softmax model that evaluates (and saves a checkpoint) every step,
/// and its parameter `name`.
fn trainer_and(name: &str) -> (Trainer, candle_core::Var) {
    let mut preset = common::tiny(
        attnlab::attention::MechanismSpec::Softmax(Default::default()),
        EncodingSpec::Learned(Default::default()),
    );
    preset.train.eval_every = 1;
    let trainer = Trainer::new(&preset).unwrap();
    let (_, var) = trainer
        .params()
        .vars()
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap();
    (trainer, var)
}

fn fill(var: &candle_core::Var, value: f32) {
    var.set(&Tensor::full(value, var.shape(), var.device()).unwrap())
        .unwrap();
}

/// A diverging run never writes a checkpoint holding NaN, infinity or exploded weights (one
/// used to be saved right after the update that diverged), its summary says failed before the
/// CLI hears of it, and its message names the step and the checkpoint it keeps, or says there
/// is none (it used to claim "the last good checkpoint is kept"). No valid preset diverges in
/// a few steps (weight decay and ε have ranges), so the parameters are poisoned here.
#[test]
fn divergence_names_the_step_and_the_finite_checkpoint_kept() {
    let root = tempfile::tempdir().unwrap();
    // NaN from the start: the first loss is NaN.
    let (trainer, bias) = trainer_and("head.bias");
    fill(&bias, f32::NAN);
    let (err, dir) = failed_run(trainer, root.path(), |_| {});
    assert!(
        err.contains("diverged at step 1") && err.contains("no checkpoint was saved"),
        "{err}"
    );
    assert!(!dir.join("model.safetensors").exists());

    // Weights past 1e8 are finite and their loss may be too, but the run has diverged: the
    // issue's weight decay of 1e12 had kept a checkpoint of weights near 9e18.
    let (trainer, bias) = trainer_and("head.bias");
    fill(&bias, 9e18);
    let (err, _) = failed_run(trainer, root.path(), |_| {});
    assert!(
        err.contains("diverged at step 1")
            && err.contains("parameter head.bias reached 9.00e18, past ±1e8"),
        "{err}"
    );

    // NaN after the first evaluation: the loss at step 2 is NaN, step 1's checkpoint stays.
    let (trainer, bias) = trainer_and("head.bias");
    let (err, dir) = failed_run(trainer, root.path(), |event| {
        if matches!(event, TrainEvent::Eval(e) if e.step == 1) {
            fill(&bias, f32::NAN);
        }
    });
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
    let metrics = attnlab::train::RunDir::open(&dir)
        .unwrap()
        .read_metrics()
        .unwrap();
    assert!(
        metrics.iter().all(|m| m.step() == 1) && metrics.len() == 2,
        "step 1 and its evaluation, nothing of the diverged step: {metrics:?}"
    );
}

#[test]
fn stopping_a_run_keeps_its_results() {
    let dir = tempfile::tempdir().unwrap();
    let mut preset = common::tiny(
        attnlab::attention::MechanismSpec::Softmax(Default::default()),
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
    // The checkpoint and the optimiser's state are readable by colleagues (the safetensors
    // crate creates its files 0600; the optimiser's state was left so).
    #[cfg(unix)]
    for file in ["model.safetensors", "optimizer.safetensors"] {
        use std::os::unix::fs::PermissionsExt as _;
        let path = run_dir.path().join(file);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o044, 0o044, "{file}: mode {mode:o}");
    }
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
        attnlab::attention::MechanismSpec::Linear(Default::default()),
        EncodingSpec::Sinusoidal(Default::default()),
    );
    let mut trainer = Trainer::new(&preset).unwrap();
    trainer.train_step().unwrap();
    let path = dir.path().join("m.safetensors");
    trainer.params().save(&path, None).unwrap();
    let before = trainer.evaluate().unwrap();
    let fresh = Trainer::new(&preset).unwrap();
    fresh.params().load(&path).unwrap();
    let after = fresh.evaluate().unwrap();
    assert_eq!(before.loss, after.loss);
}

/// The losses by step, the final summary and the run folder of a training.
struct Trained {
    losses: Vec<(usize, f32)>,
    summary: attnlab::train::Summary,
    dir: std::path::PathBuf,
}

/// Runs `train`, recording its events; `on_step` sees each step's number and the run folder.
fn trained(
    train: impl FnOnce(&mut dyn FnMut(TrainEvent)) -> attnlab::Result<attnlab::train::Summary>,
    mut on_step: impl FnMut(usize, &Path),
) -> Trained {
    let (mut losses, mut dir) = (Vec::new(), None);
    let summary = train(&mut |event| match event {
        TrainEvent::Started { run_dir, .. } => dir = Some(run_dir),
        TrainEvent::Step(s) => {
            losses.push((s.step, s.loss));
            on_step(s.step, dir.as_deref().unwrap());
        }
        TrainEvent::Failed { message, .. } => panic!("{message}"),
        _ => {}
    })
    .unwrap();
    let dir = dir.unwrap();
    Trained {
        losses,
        summary,
        dir,
    }
}

/// 20 steps over 2.5 epochs with warm-up, cosine decay and dropout: everything a resumed run
/// must continue exactly. On [`common::test_device`], so the GPU machine checks resuming there.
fn resumable_preset() -> Preset {
    let mut preset = common::tiny(
        attnlab::attention::MechanismSpec::Softmax(Default::default()),
        EncodingSpec::Rope(Default::default()),
    );
    preset.train.max_steps = Some(20);
    preset.train.warmup_steps = 3;
    preset.train.eval_every = 6;
    preset.model.embed_dropout = Some(0.1);
    preset.model.attention_dropout = Some(0.1);
    preset.train.device = common::test_device();
    preset
}

/// Every parameter of a run folder's checkpoint, by name.
fn checkpoint(dir: &Path) -> Vec<(String, Vec<f32>)> {
    let mut tensors: Vec<_> =
        candle_core::safetensors::load(dir.join("model.safetensors"), &candle_core::Device::Cpu)
            .unwrap()
            .into_iter()
            .map(|(name, t)| (name, t.flatten_all().unwrap().to_vec1::<f32>().unwrap()))
            .collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    tensors
}

/// A resumed run goes on as the uninterrupted one: the same losses from its checkpoint on,
/// the same final weights (bit for bit) and accuracy, and each step once in its metrics.
fn assert_continues(reference: &Trained, resumed: &Trained, from_step: usize) {
    for run in [reference, resumed] {
        assert_eq!(
            (run.summary.device, run.summary.device_notice.as_deref()),
            (common::test_device(), None)
        );
    }
    let after: Vec<_> = reference.losses[from_step..].to_vec();
    assert_eq!(resumed.losses, after);
    assert_eq!(resumed.summary.status, RunStatus::Completed);
    assert_eq!(resumed.summary.steps, 20);
    assert_eq!(
        resumed.summary.last_accuracy,
        reference.summary.last_accuracy
    );
    assert_eq!(checkpoint(&resumed.dir), checkpoint(&reference.dir));
    let metrics = attnlab::train::RunDir::open(&resumed.dir)
        .unwrap()
        .read_metrics()
        .unwrap();
    let steps: Vec<usize> = metrics
        .iter()
        .filter_map(|m| match m {
            attnlab::train::MetricRecord::Step(s) => Some(s.step),
            _ => None,
        })
        .collect();
    assert_eq!(steps, (1..=20).collect::<Vec<_>>());
}

#[test]
fn a_stopped_run_resumes_as_if_never_stopped() {
    let preset = resumable_preset();
    let never_stop = std::sync::atomic::AtomicBool::new(false);
    let root = tempfile::tempdir().unwrap();
    let reference = trained(
        |emit| attnlab::train::run::run(&preset, root.path(), &never_stop, emit),
        |_, _| {},
    );
    // Stopped after step 9: mid-epoch, not an evaluation step; the stop saves a checkpoint.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let stopped = trained(
        |emit| attnlab::train::run::run(&preset, root.path(), &stop, emit),
        |step, _| {
            if step == 9 {
                stop.store(true, std::sync::atomic::Ordering::Relaxed)
            }
        },
    );
    assert_eq!(stopped.summary.status, RunStatus::Stopped);
    assert_eq!(stopped.summary.steps, 9);
    let resumed = trained(
        |emit| attnlab::train::run::resume(&stopped.dir, &never_stop, emit),
        |_, _| {},
    );
    assert_eq!(resumed.dir, stopped.dir);
    assert_continues(&reference, &resumed, 9);
    assert_tensorboard_restarts(&resumed.dir, 10, 20);
}

/// A resumed run's TensorBoard events: the first file the steps before the checkpoint, a
/// second one a restart at `step` (SessionLog START, which makes TensorBoard drop what the
/// first holds from it on) and the steps from it to `last`, and the session's end.
fn assert_tensorboard_restarts(dir: &Path, step: usize, last: usize) {
    let mut files: Vec<_> = std::fs::read_dir(dir.join("tensorboard"))
        .unwrap()
        .map(|f| f.unwrap().path())
        .collect();
    files.sort();
    let contents: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    let [first, second] = &contents[..] else {
        panic!("two event files: {files:?}")
    };
    let (first, second) = (
        attnlab::tensorboard::read_records(first).unwrap(),
        attnlab::tensorboard::read_records(second).unwrap(),
    );
    // Event { step (field 2) = step, session_log (field 7) = SessionLog { status: START } }:
    // the step as a one-byte varint.
    assert!(step < 128);
    let restart = [0x10, step as u8, 0x3a, 0x02, 0x08, 0x01];
    assert_eq!(
        (holding(&first, &restart), holding(&second, &restart)),
        (0, 1)
    );
    assert_eq!(holding(&first, b"train/loss"), step - 1);
    assert_eq!(holding(&second, b"train/loss"), last - (step - 1));
    let end = b"_hparams_/session_end_info";
    assert_eq!((holding(&first, end), holding(&second, end)), (0, 1));
}

/// A kill -9 leaves the run folder as it is between two steps: with checkpoints every 0 s,
/// the one after step 10 while step 11 is logged. Resuming drops step 11's line and trains
/// it again.
#[test]
fn a_crashed_run_resumes_from_its_time_based_checkpoint() {
    let preset = resumable_preset();
    let never_stop = std::sync::atomic::AtomicBool::new(false);
    let root = tempfile::tempdir().unwrap();
    let reference = trained(
        |emit| attnlab::train::run::run(&preset, root.path(), &never_stop, emit),
        |_, _| {},
    );
    let crashed = tempfile::tempdir().unwrap();
    let every_step = trained(
        |emit| {
            let zero = std::time::Duration::ZERO;
            attnlab::train::run::run_every(&preset, root.path(), zero, &never_stop, emit)
        },
        |step, dir| {
            if step == 11 {
                std::fs::create_dir(crashed.path().join("attention")).unwrap();
                // The optimiser's state before the weights, as a copy file by file may order
                // them: the steps in their headers, not their times, say the pair is complete.
                for file in [
                    "preset.toml",
                    "metrics.jsonl",
                    "summary.json",
                    "optimizer.safetensors",
                    "model.safetensors",
                ] {
                    std::fs::copy(dir.join(file), crashed.path().join(file)).unwrap();
                }
            }
        },
    );
    // Saving at every step changes nothing about the training.
    assert_eq!(every_step.losses, reference.losses);
    assert_eq!(checkpoint(&every_step.dir), checkpoint(&reference.dir));
    let summary = attnlab::train::RunDir::open(crashed.path())
        .unwrap()
        .read_summary()
        .unwrap();
    assert_eq!(summary.status, RunStatus::Running);
    let resumed = trained(
        |emit| attnlab::train::run::resume(crashed.path(), &never_stop, emit),
        |_, _| {},
    );
    assert_continues(&reference, &resumed, 10);
}

/// How many of a run's TensorBoard records hold `bytes` (a tag, a PNG's signature).
fn holding(records: &[&[u8]], bytes: &[u8]) -> usize {
    records
        .iter()
        .filter(|r| r.windows(bytes.len()).any(|w| w == bytes))
        .count()
}

#[test]
fn a_run_writes_what_tensorboard_reads() {
    let dir = tempfile::tempdir().unwrap();
    let mut preset = common::tiny(
        attnlab::attention::MechanismSpec::Softmax(Default::default()),
        EncodingSpec::None(Default::default()),
    );
    preset.train.eval_every = 2;
    let stop = std::sync::atomic::AtomicBool::new(false);
    attnlab::train::run::run(&preset, dir.path(), &stop, &mut |_| {}).unwrap();
    let run = std::fs::read_dir(dir.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let files: Vec<_> = std::fs::read_dir(run.join("tensorboard"))
        .unwrap()
        .map(|f| f.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let bytes = std::fs::read(&files[0]).unwrap();
    let records = attnlab::tensorboard::read_records(&bytes).unwrap();
    // Four steps, two evaluations (steps 2 and 4), one session from start to end.
    let tagged = |tag: &str| holding(&records, tag.as_bytes());
    assert_eq!(tagged("train/loss"), 4);
    assert_eq!(tagged("test/accuracy"), 2);
    for layer_head in ["L0H0", "L0H1", "L1H0", "L1H1"] {
        assert_eq!(tagged(&format!("attention/{layer_head}")), 2);
        assert_eq!(tagged(&format!("attention/entropy/{layer_head}")), 2);
        // MQAR has a ground truth: each head's soft IoU at each evaluation.
        assert_eq!(tagged(&format!("attention/iou/{layer_head}")), 2);
    }
    assert_eq!(
        holding(&records, b"\x89PNG\r\n\x1a\n"),
        4 * 2,
        "a PNG a map"
    );
    assert_eq!(tagged("_hparams_/session_start_info"), 1);
    assert_eq!(tagged("_hparams_/session_end_info"), 1);

    let off = tempfile::tempdir().unwrap();
    preset.train.tensorboard = false;
    attnlab::train::run::run(&preset, off.path(), &stop, &mut |_| {}).unwrap();
    let run = std::fs::read_dir(off.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert!(!run.join("tensorboard").exists());
}
