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
