//! IoU against the MQAR ground truth on real (tiny) trained runs: the recomputed attention is the
//! one the run saved, the table has one cell per layer and head, the CLI writes what it says.

#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

mod common;

use std::sync::atomic::AtomicBool;

use attnlab::Preset;
use attnlab::analysis::TrainedRun;
use attnlab::analysis::iou::{Binarise, IouProtocol, Target, example_iou, run_iou};
use attnlab::attention::MechanismSpec;
use attnlab::encodings::EncodingSpec;
use attnlab::model::MixerKind;
use common::{attnlab, small_mechanisms, stderr, tiny, trained_run};

/// The tiny preset with the IoU protocol's layers: previous-token shift, then attention.
fn protocol_preset(mechanism: MechanismSpec) -> Preset {
    let mut p = tiny(mechanism, EncodingSpec::from_name("learned").unwrap());
    p.model.mixers = vec![MixerKind::PrevToken, MixerKind::Attention];
    p
}

fn protocol(examples: usize) -> IouProtocol {
    IouProtocol {
        binarise: Binarise::Argmax,
        target: Target::Value,
        examples,
        ..IouProtocol::default()
    }
}

#[test]
fn iou_of_a_trained_run_uses_the_saved_attention_and_ground_truth() {
    let root = tempfile::tempdir().unwrap();
    let dir = trained_run(
        &protocol_preset(MechanismSpec::Softmax(Default::default())),
        root.path(),
    );
    let run = TrainedRun::open(&dir).unwrap();

    // 40 rows: more than the 16 of the test set, which the generator continues.
    let table = run_iou(&run, &protocol(40), &mut |_| {}, &AtomicBool::new(false))
        .unwrap()
        .unwrap();
    assert_eq!(table.examples, 40);
    assert_eq!(table.layers, vec![1]);
    assert_eq!(table.hard.len(), 1);
    assert_eq!(table.hard[0].len(), 2, "one cell per head");
    for value in table.hard.iter().chain(&table.soft).flatten() {
        assert!((0.0..=1.0).contains(value), "{value}");
    }

    // The example view recomputes exactly the attention the run saved, on the saved rows.
    let saved = run.run.read_attention_index().unwrap();
    let weights = run.run.read_attention(&saved.layers[0]).unwrap();
    let saved_row0: Vec<Vec<f32>> = weights.get(0).unwrap().get(1).unwrap().to_vec2().unwrap();
    let example = example_iou(&run, 0, 1, 1, &protocol(1)).unwrap();
    let want: Vec<usize> = saved.examples[0]
        .queries
        .iter()
        .map(|q| q.position)
        .collect();
    assert_eq!(example.crop.query_positions, want);
    for (r, &p) in want.iter().enumerate() {
        let context = example.crop.context;
        let got = &example.attention[r * context..(r + 1) * context];
        for (g, &w) in got.iter().zip(&saved_row0[p][..context]) {
            assert!((g - f64::from(w)).abs() < 1e-5);
        }
        let truth_col = saved.examples[0].queries[r].value_positions[0];
        assert_eq!(
            example.crop.truth[r * example.crop.context + truth_col],
            1.0
        );
    }
    assert!((0.0..=1.0).contains(&example.hard));

    let err = example_iou(&run, 0, 0, 0, &protocol(1)).unwrap_err();
    assert!(
        err.to_string().contains("layer 0 has no attention"),
        "{err}"
    );
    assert!(
        matches!(&err, attnlab::Error::Argument { name, .. } if name == "layer"),
        "{err:?}"
    );
    let heads = run.preset.model.n_heads;
    for head in [heads, usize::MAX] {
        let err = example_iou(&run, 0, 1, head, &protocol(1)).unwrap_err();
        assert!(
            matches!(&err, attnlab::Error::Argument { name, .. } if name == "head"),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .contains(&format!("does not exist: heads are 0..{heads}")),
            "{err}"
        );
    }
    // Row r costs r generated rows: `--example 18446744073709551615` overflowed `row + 1`,
    // and 1e11 ran until memory ran out.
    for row in [usize::MAX, 100_000_000_000] {
        let err = example_iou(&run, row, 1, 1, &protocol(1)).unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("test row {row} is past the last row")),
            "{err}"
        );
    }
    assert!(run.test_examples(100_001).is_err());
}

#[test]
fn cancelled_iou_returns_nothing_and_linformer_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let dir = trained_run(
        &protocol_preset(MechanismSpec::Softmax(Default::default())),
        root.path(),
    );
    let run = TrainedRun::open(&dir).unwrap();
    let cancelled = run_iou(&run, &protocol(10), &mut |_| {}, &AtomicBool::new(true)).unwrap();
    assert!(cancelled.is_none());

    let linformer = small_mechanisms()
        .into_iter()
        .find(|m| m.name() == "linformer")
        .unwrap();
    let dir = trained_run(&protocol_preset(linformer), root.path());
    let run = TrainedRun::open(&dir).unwrap();
    let err = run_iou(&run, &protocol(10), &mut |_| {}, &AtomicBool::new(false)).unwrap_err();
    assert!(err.to_string().contains("projected positions"), "{err}");
}

#[test]
fn iou_command_prints_the_table_and_writes_figures() {
    let root = tempfile::tempdir().unwrap();
    let dir = trained_run(
        &protocol_preset(MechanismSpec::Softmax(Default::default())),
        root.path(),
    );
    let figure = root.path().join("iou.svg");
    let example = root.path().join("example.svg");
    let o = attnlab(&[
        "iou",
        dir.to_str().unwrap(),
        "--examples",
        "20",
        "--binarise",
        "topk:2",
        "--target",
        "key",
        "--format",
        "json",
        "--figure",
        figure.to_str().unwrap(),
        "--example",
        "3",
        "--example-figure",
        example.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(json["examples"], 20);
    assert_eq!(json["protocol"]["binarise"]["top-k"], 2);
    assert_eq!(json["protocol"]["target"], "key");
    assert_eq!(json["hard"].as_array().unwrap().len(), 1);
    assert_eq!(json["soft"][0].as_array().unwrap().len(), 2);
    // Hard IoU at each τ of the curve, for every layer and head.
    let curve = json["hard_by_threshold"].as_array().unwrap();
    assert_eq!(curve.len(), attnlab::analysis::iou::THRESHOLD_CURVE.len());
    assert_eq!(curve[0][0].as_array().unwrap().len(), 2);
    assert_eq!(json["example"]["row"], 3);
    for name in [
        "iou.svg",
        "iou-soft.svg",
        "iou-thresholds.svg",
        "example-attention.svg",
        "example-truth.svg",
    ] {
        let svg = std::fs::read_to_string(root.path().join(name)).unwrap();
        assert!(svg.contains("key position"), "{name} carries the protocol");
    }

    let o = attnlab(&["iou", dir.to_str().unwrap(), "--binarise", "topk:0"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("topk:K"), "{}", stderr(&o));
    // The example's head must exist (the model has 2).
    let o = attnlab(&[
        "iou",
        dir.to_str().unwrap(),
        "--example",
        "0",
        "--head",
        "99",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("head"), "{}", stderr(&o));
    assert!(stderr(&o).contains("heads are 0..2"), "{}", stderr(&o));
}

#[test]
fn iou_command_compares_runs_as_bars() {
    let root = tempfile::tempdir().unwrap();
    let softmax = trained_run(
        &protocol_preset(MechanismSpec::Softmax(Default::default())),
        root.path(),
    );
    let based = trained_run(
        &protocol_preset(MechanismSpec::all_defaults()[2].clone()),
        root.path(),
    );
    let bars = root.path().join("bars.csv");
    let o = attnlab(&[
        "iou",
        softmax.to_str().unwrap(),
        "--examples",
        "10",
        "--with",
        based.to_str().unwrap(),
        "--bars",
        bars.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let csv = std::fs::read_to_string(&bars).unwrap();
    let name = |dir: &std::path::Path| dir.file_name().unwrap().to_string_lossy().into_owned();
    // Two heads per run: a group per run and head, hard and soft each.
    for run in [name(&softmax), name(&based)] {
        assert_eq!(csv.matches(&run).count(), 4, "{csv}");
    }
    // Hard IoU against τ beside it: per run and head a curve and its soft IoU level.
    let curves = std::fs::read_to_string(root.path().join("bars-thresholds.csv")).unwrap();
    assert!(
        curves.contains(&format!("{} L1 H1: hard", name(&based))),
        "{curves}"
    );
    let o = attnlab(&["iou", softmax.to_str().unwrap(), "--with", "x"]);
    assert!(!o.status.success(), "--with without --bars is refused");
}

/// MAD's in-context recall and selective copying carry a ground truth (the value after the
/// key's latest earlier occurrence; the data token to copy), so IoU runs on their runs too;
/// memorisation has none and is refused in words.
#[test]
fn iou_runs_on_mads_retrieval_probes_and_refuses_memorisation() {
    use attnlab::tasks::TaskSpec;
    use attnlab::tasks::mad::{MadConfig, Probe};
    let root = tempfile::tempdir().unwrap();
    let mad = |probe: Probe, length: usize| {
        let mut p = protocol_preset(MechanismSpec::Softmax(Default::default()));
        p.task = TaskSpec::Mad(MadConfig {
            probe,
            length: Some(length),
            num_tokens_to_copy: Some(4),
            vocab_size: Some(if probe == Probe::Memorization { 32 } else { 16 }),
            train_examples: Some(32),
            test_examples: Some(8),
            ..MadConfig::default()
        });
        p
    };
    for probe in [Probe::InContextRecall, Probe::SelectiveCopying] {
        let run = TrainedRun::open(&trained_run(&mad(probe, 16), root.path())).unwrap();
        let table = run_iou(&run, &protocol(8), &mut |_| {}, &AtomicBool::new(false))
            .unwrap()
            .unwrap();
        assert_eq!(table.hard[0].len(), 2, "{probe:?}: one cell per head");
        for value in table.hard.iter().chain(&table.soft).flatten() {
            assert!((0.0..=1.0).contains(value), "{probe:?}: {value}");
        }
    }
    let run = TrainedRun::open(&trained_run(&mad(Probe::Memorization, 16), root.path())).unwrap();
    let error = run_iou(&run, &protocol(8), &mut |_| {}, &AtomicBool::new(false))
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("ground truth") && error.contains("memorization"),
        "{error}"
    );
}
