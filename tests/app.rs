//! The workbench driven like a user would, headless with egui_kittest: pick a mechanism and
//! an encoding, start a tiny run and watch it report, stop it, save and reload a preset, see
//! validation block Start, and export figures.

#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

use std::time::{Duration, Instant};

use attnlab::app::{AttnlabApp, Persisted, Tab};
use eframe::egui;
use egui_kittest::Harness;
use egui_kittest::kittest::Queryable as _;

/// A window whose runs go to `root`, with a tiny preset in the editor.
fn app(root: &std::path::Path) -> AttnlabApp {
    let mut app = AttnlabApp::new(Persisted::default());
    app.runs_root = root.to_path_buf();
    let p = &mut app.editor.preset;
    p.model.d_model = 16;
    let attnlab::tasks::TaskSpec::Mqar(t) = &mut p.task else {
        unreachable!("the default task is MQAR")
    };
    t.seq_len = 16;
    t.vocab_size = 32;
    t.num_kv_pairs = 2;
    t.train_examples = 64;
    t.test_examples = 16;
    p.train.batch_size = 8;
    p.train.warmup_steps = 1;
    p.train.epochs = 1000;
    p.train.eval_every = 2;
    p.train.target_accuracy = 0.0;
    p.eval.attention_examples = 2;
    app
}

fn harness(app: AttnlabApp) -> Harness<'static, AttnlabApp> {
    Harness::builder()
        .with_size(egui::vec2(1400.0, 900.0))
        .build_ui_state(|ui, app: &mut AttnlabApp| app.show(ui), app)
}

/// Runs frames until `done` holds (the worker threads need wall-clock time).
fn run_until(
    harness: &mut Harness<'_, AttnlabApp>,
    what: &str,
    done: impl Fn(&AttnlabApp) -> bool,
) {
    let start = Instant::now();
    while !done(harness.state()) {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
        harness.step();
    }
}

#[test]
fn picking_mechanism_and_encoding_changes_the_preset() {
    let root = tempfile::tempdir().unwrap();
    let mut harness = harness(app(root.path()));
    harness.get_by_label("mechanism").click();
    harness.run();
    harness.get_by_label("based").click();
    harness.run();
    assert_eq!(harness.state().editor.preset.attention.name(), "based");
    harness.get_by_label("encoding").click();
    harness.run();
    harness.get_by_label("alibi").click();
    harness.run();
    assert_eq!(harness.state().editor.preset.encoding.name(), "alibi");
}

#[test]
fn a_run_reports_curves_and_attention_and_stops() {
    let root = tempfile::tempdir().unwrap();
    let mut harness = harness(app(root.path()));
    harness.get_by_label("Start").click();
    harness.run();
    run_until(&mut harness, "steps and an evaluation", |app| {
        app.runs
            .selected()
            .is_some_and(|r| r.steps.len() >= 3 && r.attention.is_some())
    });
    harness.state_mut().tab = Tab::Attention;
    harness.run();
    harness.get_by_label("Stop").click();
    harness.run();
    run_until(&mut harness, "the run to stop", |app| {
        app.runs.selected().is_some_and(|r| !r.is_running())
    });
    let run = harness.state().runs.selected().unwrap();
    assert_eq!(run.status, "stopped");
    assert!(
        run.dir
            .as_ref()
            .unwrap()
            .join("model.safetensors")
            .is_file()
    );
    let attention = run.attention.as_ref().unwrap();
    assert_eq!(attention.layers[0].shape, [2, 2, 16, 16]);
}

#[test]
fn an_invalid_value_shows_its_message_and_disables_start() {
    let root = tempfile::tempdir().unwrap();
    let mut app = app(root.path());
    app.editor.preset.model.n_heads = 3; // 16 is not divisible by 3
    let mut harness = harness(app);
    harness.run();
    harness.get_by_label_contains("must be divisible by model.n_heads = 3");
    harness.get_by_label("Start").click();
    harness.run();
    assert!(
        harness.state().runs.runs.is_empty(),
        "a disabled Start started a run"
    );
}

#[test]
fn a_saved_preset_loads_back_identical() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("mine.toml");
    let mut harness = harness(app(root.path()));
    harness.state_mut().editor.preset.encoding =
        attnlab::encodings::EncodingSpec::from_name("kerple-log").unwrap();
    harness.state_mut().save_preset(&path);
    let saved = harness.state().editor.preset.clone();
    assert!(!harness.state().editor.is_dirty());
    // The CLI reads what the app wrote.
    assert_eq!(attnlab::Preset::load(&path, &[]).unwrap(), saved);
    harness.state_mut().editor.preset.name = "changed".into();
    harness
        .state_mut()
        .editor
        .mark_saved(root.path().join("other.toml"));
    harness.state_mut().open_preset(&path);
    harness.run();
    assert_eq!(harness.state().editor.preset, saved);
}

#[test]
fn exporting_writes_png_svg_and_csv() {
    let root = tempfile::tempdir().unwrap();
    let mut app = app(root.path());
    app.exporter.folder = Some(root.path().to_path_buf());
    app.tab = Tab::Encodings;
    let mut harness = harness(app);
    run_until(&mut harness, "the encoding analyses", |app| {
        app.encodings.results.is_some()
    });
    harness.run();
    for format in ["PNG", "SVG", "CSV"] {
        let buttons = harness.get_all_by_label(format).collect::<Vec<_>>();
        assert!(!buttons.is_empty(), "no {format} button");
        buttons[0].click();
        harness.run();
    }
    for extension in ["png", "svg", "csv"] {
        let file = root.path().join(format!("trf.{extension}"));
        assert!(
            file.is_file(),
            "{} missing; status: {}",
            file.display(),
            harness.state().status
        );
    }
}
