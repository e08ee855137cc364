//! Attention spectra of real (tiny) trained runs, and the `attnlab spectrum` command.

#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

mod common;

use std::sync::atomic::AtomicBool;

use attnlab::analysis::TrainedRun;
use attnlab::analysis::spectrum::{SpectrumProtocol, run_spectrum};
use attnlab::attention::MechanismSpec;
use attnlab::encodings::EncodingSpec;
use common::{attnlab, small_mechanisms, stderr, tiny, trained_run};

/// The tiny preset's positions: learned, which every mechanism accepts.
fn learned() -> EncodingSpec {
    EncodingSpec::from_name("learned").unwrap()
}

#[test]
fn spectra_have_one_curve_per_layer_and_head_ending_at_one() {
    let root = tempfile::tempdir().unwrap();
    let run = TrainedRun::open(&trained_run(
        &tiny(MechanismSpec::Softmax(Default::default()), learned()),
        root.path(),
    ))
    .unwrap();
    let protocol = SpectrumProtocol {
        examples: 20,
        ..SpectrumProtocol::default()
    };
    let s = run_spectrum(&run, &protocol, &mut |_| {}, &AtomicBool::new(false))
        .unwrap()
        .unwrap();
    assert_eq!(s.layers, vec![0, 1]);
    assert_eq!(s.shape, (16, 16));
    assert_eq!(s.at, 4, "a quarter of the columns by default");
    for (l, layer) in s.cumulative.iter().enumerate() {
        assert_eq!(layer.len(), 2, "one curve per head");
        for (h, curve) in layer.iter().enumerate() {
            assert!(curve.windows(2).all(|w| w[0] <= w[1] + 1e-12));
            assert!((curve[15] - 1.0).abs() < 1e-9);
            assert_eq!(s.at_value[l][h], curve[3]);
        }
    }
    // A causal row-stochastic matrix is lower triangular with a positive diagonal: full rank.
    assert!(s.singular_values[0][0][15] > 0.0);
    let cancelled = run_spectrum(&run, &protocol, &mut |_| {}, &AtomicBool::new(true)).unwrap();
    assert!(cancelled.is_none());
}

#[test]
fn linformer_spectra_are_bounded_by_k_and_the_command_overlays_runs() {
    let root = tempfile::tempdir().unwrap();
    let linformer = small_mechanisms()
        .into_iter()
        .find(|m| m.name() == "linformer")
        .unwrap();
    let lin = trained_run(&tiny(linformer, learned()), root.path());
    let soft = trained_run(
        &tiny(MechanismSpec::Softmax(Default::default()), learned()),
        root.path(),
    );
    let figure = root.path().join("spectrum.svg");
    let o = attnlab(&[
        "spectrum",
        lin.to_str().unwrap(),
        soft.to_str().unwrap(),
        "--examples",
        "10",
        "--at",
        "2",
        "--squared",
        "--format",
        "json",
        "--figure",
        figure.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let lin = &json["runs"][0];
    assert_eq!(lin["label"], "linformer k=4");
    // n × k matrices: k = 4 singular values, so the curve has 4 points and ends at 1.
    let curve = lin["spectrum"]["cumulative"][0][0].as_array().unwrap();
    assert_eq!(curve.len(), 4);
    assert!((curve[3].as_f64().unwrap() - 1.0).abs() < 1e-9);
    assert_eq!(json["runs"][1]["spectrum"]["protocol"]["squared"], true);
    let svg = std::fs::read_to_string(&figure).unwrap();
    assert!(svg.contains("linformer k=4, layer 0") && svg.contains("softmax, layer 1"));
    for n in [1, 2] {
        let heatmap = root.path().join(format!("spectrum-heatmap-{n}.svg"));
        assert!(
            std::fs::read_to_string(heatmap)
                .unwrap()
                .contains("index 2")
        );
    }

    let o = attnlab(&["spectrum", soft.to_str().unwrap(), "--at", "99"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("index 99 is out of range"),
        "{}",
        stderr(&o)
    );
}
