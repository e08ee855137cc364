//! Every shipped preset parses, validates, builds and trains two steps.

#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

use std::path::Path;

use attnlab::Preset;
use attnlab::train::Trainer;

#[test]
fn every_shipped_preset_trains() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("presets");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let preset =
                Preset::load(&path, &[]).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            // Fewer rows keep the test quick; the model is exactly the preset's.
            let small = Preset::load(
                &path,
                &[
                    "task.train_examples=256".into(),
                    "task.test_examples=32".into(),
                    "train.batch_size=32".into(),
                ],
            )
            .unwrap();
            let mut trainer = Trainer::new(&small).unwrap();
            for _ in 0..2 {
                let loss = trainer.train_step().unwrap().loss;
                assert!(loss.is_finite(), "{}", path.display());
            }
            names.push(preset.attention.name());
        }
    }
    for mechanism in ["softmax", "linear", "based", "rebased", "linformer"] {
        assert!(
            names.contains(&mechanism),
            "no shipped preset uses {mechanism}: {names:?}"
        );
    }
}

/// Every shipped sweep file loads, and with it every cell's preset validates; the paper-scale
/// one has the ReBased paper's grid (1,200 cells, vocabulary 8,192).
#[test]
fn every_shipped_sweep_validates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("sweeps");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let sweep = attnlab::sweep::Sweep::load(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(!sweep.cells.is_empty(), "{}", path.display());
    }
    let paper = attnlab::sweep::Sweep::load(&dir.join("mqar_fig1_paper.toml")).unwrap();
    assert_eq!(paper.cells.len(), 3 * 4 * 5 * 4 * 5);
    let preset = paper.preset(&paper.cells[0]).unwrap();
    assert_eq!(preset.task.vocab_size(), 8192);
    assert_eq!(preset.model.layout, attnlab::model::Layout::Zoology);
}
