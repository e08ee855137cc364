//! Replicas (issue 16): cells that share a shape train as one batched model, and each replica
//! trains exactly as it would alone: the same losses step by step, the same final weights, the
//! same accuracy, for every mechanism × encoding, in both model layouts; one that reaches its
//! target or diverges is frozen while the others train on, and every replica's run folder reads
//! like a lone run's.

#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

mod common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use attnlab::Preset;
use attnlab::model::{Layout, MixerKind};
use attnlab::train::{MetricRecord, ReplicaStep, RunDir, RunStatus, TrainEvent, Trainer};
use candle_core::Tensor;

/// Steps each comparison trains: enough for the learning rates, moments and data orders of the
/// replicas to have pulled them apart.
const STEPS: usize = 3;

/// Three cells of one shape: other seeds, learning rates, weight decay, warm-up and clipping.
fn cells(base: &Preset) -> Vec<Preset> {
    let mut cells = vec![base.clone(), base.clone(), base.clone()];
    cells[0].train.seed = 1;
    cells[1].train.seed = 2;
    cells[1].train.lr = 3e-3;
    cells[1].train.weight_decay = 0.0;
    cells[2].train.seed = 3;
    cells[2].train.warmup_steps = 2;
    cells[2].train.grad_clip = 0.5;
    for (i, cell) in cells.iter_mut().enumerate() {
        cell.name = format!("{}-{i}", base.name);
    }
    cells
}

fn assert_close(what: &str, a: f64, b: f64, tolerance: f64) {
    assert!(
        (a - b).abs() <= tolerance * (1.0 + b.abs()),
        "{what}: {a} as a replica, {b} alone"
    );
}

/// Trains `base`'s cells alone and as one group for [`STEPS`] steps and compares them.
fn check_equivalence(base: &Preset) {
    let cells = cells(base);
    let mut group = Trainer::group(&cells).unwrap();
    assert_eq!(group.replicas(), cells.len());
    let mut group_losses = vec![Vec::new(); cells.len()];
    for _ in 0..STEPS {
        for (r, outcome) in group.train_step_replicas().unwrap().into_iter().enumerate() {
            let ReplicaStep::Trained(stats) = outcome else {
                panic!("{}: replica {r} did not train: {outcome:?}", base.name)
            };
            group_losses[r].push(stats);
        }
    }
    let evals = group.evaluate_replicas().unwrap();
    let stacked: Vec<(String, Tensor)> = group
        .params()
        .vars()
        .into_iter()
        .map(|(name, var)| (name, var.as_tensor().clone()))
        .collect();
    for (r, cell) in cells.iter().enumerate() {
        let mut lone = Trainer::new(cell).unwrap();
        for (step, grouped) in group_losses[r].iter().enumerate() {
            let alone = lone.train_step().unwrap();
            let what = format!("{} step {} loss", cell.name, step + 1);
            assert_close(&what, f64::from(grouped.loss), f64::from(alone.loss), 1e-4);
            assert_close(&format!("{what} lr"), grouped.lr, alone.lr, 1e-9);
            assert_close(
                &format!("{what} norm"),
                grouped.grad_norm,
                alone.grad_norm,
                1e-3,
            );
        }
        let eval = lone.evaluate().unwrap();
        assert_close(
            &format!("{} accuracy", cell.name),
            evals[r].1.accuracy,
            eval.accuracy,
            1e-9,
        );
        assert_close(
            &format!("{} test loss", cell.name),
            evals[r].1.loss,
            eval.loss,
            1e-4,
        );
        for ((name, lone_var), (_, stacked)) in lone.params().vars().into_iter().zip(&stacked) {
            let diff = common::max_abs_diff(&stacked.get(r).unwrap(), lone_var.as_tensor());
            assert!(diff < 1e-4, "{}: {name} differs by {diff}", cell.name);
        }
    }
}

/// Every mechanism × encoding the presets accept, in attnlab's layout.
#[test]
fn every_combination_trains_as_replicas_exactly_as_alone() {
    let (valid, _) = common::all_combinations();
    for preset in &valid {
        check_equivalence(preset);
    }
}

/// zoology's layout (dropout, tied head, the short convolution in front, no MLP) for every
/// mechanism: each replica draws its own dropout masks, as it does alone.
#[test]
fn the_zoology_layout_with_dropout_trains_as_replicas_exactly_as_alone() {
    for mechanism in common::small_mechanisms() {
        let mut preset = common::hybrid(common::tiny(
            mechanism,
            attnlab::encodings::EncodingSpec::Learned(Default::default()),
        ));
        preset.model.layout = Layout::Zoology;
        preset.model.mixers = vec![MixerKind::ShortConv, MixerKind::Attention];
        preset.validate().unwrap();
        check_equivalence(&preset);
    }
}

#[test]
fn presets_of_other_shapes_do_not_group() {
    let base = common::tiny(
        attnlab::attention::MechanismSpec::Softmax(Default::default()),
        attnlab::encodings::EncodingSpec::Rope(Default::default()),
    );
    let mut wider = base.clone();
    wider.model.d_model = 32;
    let err = Trainer::group(&[base, wider]).err().unwrap();
    assert!(
        matches!(&err, attnlab::Error::Unsupported { .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("cannot train as replicas"),
        "{err}"
    );
}

/// A replica whose parameters went NaN diverges and is frozen, and dropped from the model; the
/// others train on exactly as they would alone.
#[test]
fn a_diverging_replica_is_frozen_and_the_others_train_on() {
    let base = common::tiny(
        attnlab::attention::MechanismSpec::Softmax(Default::default()),
        attnlab::encodings::EncodingSpec::Alibi(Default::default()),
    );
    let cells = cells(&base);
    let mut group = Trainer::group(&cells).unwrap();
    let (_, embedding) = group.params().vars().into_iter().next().unwrap();
    let broken = embedding
        .as_tensor()
        .get(1)
        .unwrap()
        .affine(0.0, f64::NAN)
        .unwrap();
    let mut parts: Vec<Tensor> = (0..3)
        .map(|r| embedding.as_tensor().get(r).unwrap())
        .collect();
    parts[1] = broken;
    embedding.set(&Tensor::stack(&parts, 0).unwrap()).unwrap();
    let outcomes = group.train_step_replicas().unwrap();
    assert!(
        matches!(outcomes[1], ReplicaStep::Diverged(_)),
        "{outcomes:?}"
    );
    let outcomes = group.train_step_replicas().unwrap();
    assert!(matches!(outcomes[1], ReplicaStep::Frozen), "{outcomes:?}");
    // The model no longer computes the diverged replica: its parameters hold two.
    let (_, embedding) = group.params().vars().into_iter().next().unwrap();
    assert_eq!(embedding.dims()[0], 2);
    let ReplicaStep::Trained(grouped) = &outcomes[2] else {
        panic!("replica 2 stopped: {outcomes:?}")
    };
    let mut lone = Trainer::new(&cells[2]).unwrap();
    lone.train_step().unwrap();
    let alone = lone.train_step().unwrap();
    assert_close(
        "loss beside a diverged replica",
        f64::from(grouped.loss),
        f64::from(alone.loss),
        1e-4,
    );
}

/// Events of a group run, per replica.
type Events = Vec<Vec<TrainEvent>>;

fn run_group(
    cells: &[Preset],
    root: &std::path::Path,
) -> (Vec<attnlab::Result<attnlab::train::Summary>>, Events) {
    let members: Vec<(Preset, PathBuf)> = cells
        .iter()
        .map(|c| (c.clone(), root.join(&c.name)))
        .collect();
    let mut events: Events = vec![Vec::new(); cells.len()];
    let results = attnlab::train::run::run_group(&members, &AtomicBool::new(false), &mut |r, e| {
        events[r].push(e)
    });
    (results, events)
}

/// A run folder's checkpoint, by parameter name.
fn checkpoint(dir: &RunDir) -> Vec<(String, Tensor)> {
    let loaded =
        candle_core::safetensors::load(dir.checkpoint_path(), &candle_core::Device::Cpu).unwrap();
    let mut tensors: Vec<_> = loaded.into_iter().collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    tensors
}

fn run_dir_of(events: &[TrainEvent]) -> RunDir {
    let Some(TrainEvent::Started { run_dir, .. }) = events.first() else {
        panic!("no Started event: {events:?}")
    };
    RunDir::open(run_dir).unwrap()
}

/// Through `run_group`: a replica that reaches its target is finished at that evaluation (its
/// folder holds what a lone run to its target holds), the others complete their steps, and an
/// invalid preset fails alone.
#[test]
fn a_group_run_finishes_each_replica_as_a_lone_run_would() {
    let mut base = common::tiny(
        attnlab::attention::MechanismSpec::Softmax(Default::default()),
        attnlab::encodings::EncodingSpec::Rope(Default::default()),
    );
    base.train.max_steps = Some(6);
    base.train.eval_every = 2;
    base.train.target_accuracy = 0.0;
    let mut cells = cells(&base);
    cells[1].train.target_accuracy = 1e-9; // reached at the first evaluation
    let mut invalid = cells[0].clone();
    invalid.name = "invalid".into();
    invalid.train.lr = -1.0;
    cells.push(invalid);
    let root = tempfile::tempdir().unwrap();
    let (results, events) = run_group(&cells, root.path());
    assert!(
        results[3]
            .as_ref()
            .err()
            .unwrap()
            .to_string()
            .contains("train.lr")
    );
    assert!(matches!(
        events[3].as_slice(),
        [TrainEvent::Failed { run_dir: None, .. }]
    ));
    let statuses: Vec<RunStatus> = results[..3]
        .iter()
        .map(|r| r.as_ref().unwrap().status)
        .collect();
    assert_eq!(
        statuses,
        [
            RunStatus::Completed,
            RunStatus::TargetReached,
            RunStatus::Completed
        ]
    );
    for (r, cell) in cells[..3].iter().enumerate() {
        let grouped = run_dir_of(&events[r]);
        let alone = run_dir_of(&{
            let mut events = Vec::new();
            attnlab::train::run::run(
                cell,
                &root.path().join("alone"),
                &AtomicBool::new(false),
                &mut |e| events.push(e),
            )
            .unwrap();
            events
        });
        let (a, b) = (
            grouped.read_summary().unwrap(),
            alone.read_summary().unwrap(),
        );
        assert_eq!((a.status, a.steps), (b.status, b.steps), "{}", cell.name);
        assert_eq!(a.replicas, Some(3));
        assert_close(
            &format!("{} accuracy", cell.name),
            a.last_accuracy.unwrap(),
            b.last_accuracy.unwrap(),
            1e-9,
        );
        let (ma, mb) = (
            grouped.read_metrics().unwrap(),
            alone.read_metrics().unwrap(),
        );
        assert_eq!(ma.len(), mb.len(), "{}: metrics lines", cell.name);
        for (a, b) in ma.iter().zip(&mb) {
            if let (MetricRecord::Step(a), MetricRecord::Step(b)) = (a, b) {
                assert_eq!(a.step, b.step);
                assert_close(
                    &format!("{} step {}", cell.name, a.step),
                    f64::from(a.loss),
                    f64::from(b.loss),
                    1e-4,
                );
            }
        }
        for ((name, a), (_, b)) in checkpoint(&grouped).iter().zip(checkpoint(&alone)) {
            assert_eq!(a.dims(), b.dims(), "{name}");
            assert!(common::max_abs_diff(a, &b) < 1e-4, "{}: {name}", cell.name);
        }
        let (ia, ib) = (
            grouped.read_attention_index().unwrap(),
            alone.read_attention_index().unwrap(),
        );
        assert_eq!((ia.step, ia.layers.len()), (ib.step, ib.layers.len()));
        for (la, lb) in ia.layers.iter().zip(&ib.layers) {
            let (a, b) = (
                grouped.read_attention(la).unwrap(),
                alone.read_attention(lb).unwrap(),
            );
            assert_eq!(a.dims(), b.dims());
            assert!(
                common::max_abs_diff(&a, &b) < 1e-4,
                "{}: attention",
                cell.name
            );
        }
    }
}

/// A replica of a stopped group resumes alone ([`attnlab::train::run::resume`]) and ends where
/// the lone run of its preset ends, up to the rounding in which replicas and lone runs differ.
#[test]
fn a_replica_of_a_stopped_group_resumes_as_a_lone_run() {
    let mut base = common::tiny(
        attnlab::attention::MechanismSpec::Softmax(Default::default()),
        attnlab::encodings::EncodingSpec::Rope(Default::default()),
    );
    base.train.max_steps = Some(12);
    base.train.eval_every = 4;
    base.train.target_accuracy = 0.0;
    let cells = cells(&base);
    let root = tempfile::tempdir().unwrap();
    let members: Vec<(Preset, PathBuf)> = cells
        .iter()
        .map(|c| (c.clone(), root.path().join(&c.name)))
        .collect();
    let stop = AtomicBool::new(false);
    let mut started = Vec::new();
    let stopped = attnlab::train::run::run_group(&members, &stop, &mut |_, e| match e {
        TrainEvent::Started { run_dir, .. } => started.push(run_dir),
        TrainEvent::Step(s) if s.step == 7 => stop.store(true, Ordering::Relaxed),
        _ => {}
    });
    assert_eq!(stopped[1].as_ref().unwrap().status, RunStatus::Stopped);
    let never = AtomicBool::new(false);
    let resumed = attnlab::train::run::resume(&started[1], &never, &mut |_| {}).unwrap();
    assert_eq!((resumed.status, resumed.steps), (RunStatus::Completed, 12));
    assert_eq!(resumed.replicas, None);
    let mut events = Vec::new();
    let alone = attnlab::train::run::run(&cells[1], &root.path().join("alone"), &never, &mut |e| {
        events.push(e)
    })
    .unwrap();
    assert_close(
        "accuracy",
        resumed.last_accuracy.unwrap(),
        alone.last_accuracy.unwrap(),
        1e-9,
    );
    let (a, b) = (RunDir::open(&started[1]).unwrap(), run_dir_of(&events));
    for ((name, x), (_, y)) in checkpoint(&a).iter().zip(checkpoint(&b)) {
        assert!(common::max_abs_diff(x, &y) < 1e-4, "{name}");
    }
}
