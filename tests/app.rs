//! The workbench driven like a user would, headless with egui_kittest: pick a mechanism and
//! an encoding, start a tiny run and watch it report, stop it, save and reload a preset, see
//! validation block Start, and export figures.

#![cfg(feature = "gui")]
#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

mod common;

use std::time::{Duration, Instant};

use attnlab::app::{AttnlabApp, Persisted, RunState, Tab};
use attnlab::train::RunStatus;
use eframe::egui;
use egui_kittest::Harness;
use egui_kittest::kittest::{NodeT as _, Queryable as _};

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

/// Captions, hints and compact legends are small text: egui's 9 points read as grey smudges.
#[test]
fn small_text_is_readable() {
    let root = tempfile::tempdir().unwrap();
    let mut harness = harness(app(root.path()));
    harness.run();
    let small = harness.ctx.global_style().text_styles[&egui::TextStyle::Small].size;
    assert!(small >= attnlab::app::SMALL_TEXT, "{small}");
    const { assert!(attnlab::app::SMALL_TEXT >= 10.0) };
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
    // The name follows: a Based/ALiBi run is not "mqar-softmax".
    assert_eq!(harness.state().editor.preset.name, "mqar-based-alibi");
}

/// The settings that are not numbers come from the catalogues: a choice of the mechanism and
/// a checkbox of the encoding, each written back to the preset by key.
#[test]
fn switches_drawn_from_the_catalogues_change_the_preset() {
    use attnlab::attention::{MechanismSpec, RebasedConfig, RebasedVariant};
    use attnlab::settings::Section as _;
    let root = tempfile::tempdir().unwrap();
    let mut harness = harness(app(root.path()));
    let preset = &mut harness.state_mut().editor.preset;
    preset.attention = MechanismSpec::Rebased(RebasedConfig::default());
    preset.encoding = attnlab::encodings::EncodingSpec::from_name("sandwich").unwrap();
    harness.run();
    harness.get_by_label("variant").click();
    harness.run();
    harness.get_by_label("x2").click();
    harness.run();
    harness
        .get_by_label("per-head scale k*H/(8h) (fairseq-evo)")
        .click();
    harness.run();
    let preset = &harness.state().editor.preset;
    let MechanismSpec::Rebased(c) = &preset.attention else {
        panic!("{:?}", preset.attention)
    };
    assert_eq!(c.variant, RebasedVariant::X2);
    assert_eq!(preset.encoding.word("per_head").as_deref(), Some("false"));
}

#[test]
fn a_run_reports_curves_and_attention_and_stops() {
    let root = tempfile::tempdir().unwrap();
    let mut harness = harness(app(root.path()));
    harness.get_by_label("Start").click();
    step_while_working(&mut harness);
    run_until(&mut harness, "steps and an evaluation", |app| {
        app.runs
            .selected()
            .is_some_and(|r| r.steps.len() >= 3 && r.attention.is_some())
    });
    harness.state_mut().tab = Tab::Attention;
    step_while_working(&mut harness);
    // Each map of the grid is labelled with its head, under its layer's label.
    assert_eq!(
        harness.get_all_by_label("head 1").count(),
        2,
        "two layers of two heads"
    );
    stop_the_selected_run(&mut harness);
    let run = harness.state().runs.selected().unwrap();
    assert_eq!(run.status, RunState::Trainer(RunStatus::Stopped));
    assert!(
        run.dir
            .as_ref()
            .unwrap()
            .join("model.safetensors")
            .is_file()
    );
    let attention = run.attention.as_ref().unwrap();
    assert_eq!(attention.layers[0].shape, [2, 2, 16, 16]);
    // The run list, the progress bar and the status bar say it in words.
    harness.run();
    harness.get_by_label_contains("(stopped)");
    assert_eq!(
        harness.get_all_by_label_contains("stopped at step").count(),
        2,
        "the progress bar and the status bar"
    );
}

/// A preset beyond the editor's field ranges (a file or `--set` may hold any valid value) is
/// shown as it is: egui's fields clamp what they show by default, and drawing the editor
/// turned a loaded d_model 8192 × 64 layers into 2048 × 24, which then trained unannounced.
#[test]
fn drawing_the_editor_leaves_a_preset_beyond_its_ranges_as_it_is() {
    let root = tempfile::tempdir().unwrap();
    let mut app = app(root.path());
    let p = &mut app.editor.preset;
    (p.model.d_model, p.model.n_layers) = (4096, 32);
    let loaded = app.editor.preset.clone();
    let mut harness = harness(app);
    harness.run();
    assert_eq!(harness.state().editor.preset, loaded);
}

#[test]
fn an_invalid_value_shows_its_message_and_disables_start() {
    let root = tempfile::tempdir().unwrap();
    let mut app = app(root.path());
    app.editor.preset.model.n_heads = 17; // more heads than the 16 channels
    let mut harness = harness(app);
    harness.run();
    harness.get_by_label_contains("must be at most model.d_model = 16");
    harness.get_by_label("Start").click();
    harness.run();
    assert!(
        harness.state().runs.runs.is_empty(),
        "a disabled Start started a run"
    );
}

#[test]
fn start_shows_the_memory_a_run_needs_and_is_disabled_when_it_cannot_fit() {
    let root = tempfile::tempdir().unwrap();
    let mut harness = harness(app(root.path()));
    harness.run();
    harness.get_by_label_contains("≈ ");
    // Within every control's range: 64 heads of length-8192 attention matrices (≈ 1.6 TB).
    let preset = &mut harness.state_mut().editor.preset;
    (preset.model.d_model, preset.model.n_heads) = (64, 64);
    let attnlab::tasks::TaskSpec::Mqar(t) = &mut preset.task else {
        unreachable!("the default task is MQAR")
    };
    (t.seq_len, t.vocab_size) = (8192, 16384);
    harness.run();
    harness.get_by_label_contains("this run needs ≈ ");
    harness.get_by_label("Start").click();
    harness.run();
    assert!(
        harness.state().runs.runs.is_empty(),
        "a run too large for memory started"
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
        app.views.encodings.results.is_some()
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
            harness.state().status.text()
        );
    }
    // The exported figure says what its axes are, as the plot on screen does.
    let svg = std::fs::read_to_string(root.path().join("trf.svg")).unwrap();
    for title in attnlab::analysis::figures::encodings::TRF_AXES {
        assert!(svg.contains(title), "no axis title {title:?} in the SVG");
    }
}

#[test]
fn a_run_that_ends_at_its_first_evaluation_shows_its_attention_on_one_colour_scale() {
    let root = tempfile::tempdir().unwrap();
    let mut app = app(root.path());
    app.editor.preset.train.max_steps = Some(2);
    let mut harness = harness(app);
    harness.get_by_label("Start").click();
    step_while_working(&mut harness);
    run_until(&mut harness, "the run to end with its attention", |app| {
        app.runs
            .selected()
            .is_some_and(|r| !r.is_running() && r.attention.is_some())
    });
    let run = harness.state().runs.selected().unwrap();
    assert_eq!(run.status, RunState::Trainer(RunStatus::Completed));
    assert_eq!(run.evals.len(), 1);
    harness.state_mut().tab = Tab::Attention;
    harness.run();
    // A colour bar always: each map's own range at first, one set of numbers for all after.
    harness.get_by_label("each map's lowest");
    harness.get_by_label("one scale for all maps").click();
    harness.run();
    harness.get_by_label("weight:");
    assert!(harness.query_by_label("each map's lowest").is_none());
    // Removing the ended run from the list keeps its folder.
    let dir = harness
        .state()
        .runs
        .selected()
        .unwrap()
        .dir
        .clone()
        .unwrap();
    harness.get_by_label("x").click();
    harness.run();
    assert!(harness.state().runs.runs.is_empty());
    assert!(dir.join("summary.json").is_file());
}

#[test]
fn the_mixer_pattern_is_edited_entry_by_entry() {
    let root = tempfile::tempdir().unwrap();
    let mut harness = harness(app(root.path()));
    harness.get_by_label("+ mixer").click();
    harness.run();
    assert_eq!(harness.state().editor.preset.model.mixers.len(), 2);
    harness.get_by_label("mixer 0").click();
    harness.run();
    harness.get_by_label("PrevToken").click();
    harness.run();
    let mixers = &harness.state().editor.preset.model.mixers;
    assert_eq!(mixers[0], attnlab::model::MixerKind::PrevToken);
    assert!(harness.state().editor.is_dirty());
}

/// One frame after starting or stopping background work (training, an analysis job): its
/// events ask for repaints, so `harness.run()`, which fails unless the window settles within
/// a few frames, passes or fails on how fast the work goes. `run_until` does the waiting.
/// Every view of the registry draws in a window with no run, then with a finished run selected
/// (its folder and attention loaded), without a panic; showing a view starts no analysis of its
/// own (the analysis views compute when asked).
#[test]
fn every_view_draws_empty_and_with_a_run() {
    let root = tempfile::tempdir().unwrap();
    let mut empty = harness(AttnlabApp::new(Persisted::default()));
    let mut with_run = harness(app_with_finished_run(root.path()));
    wait_for_loaded_run(&mut with_run);
    for harness in [&mut empty, &mut with_run] {
        for &tab in Tab::ALL {
            harness.state_mut().tab = tab;
            harness.run_steps(3);
            let busy = harness.state_mut().views.view_mut(tab).is_busy();
            assert!(!busy, "{} started work on being shown", tab.label());
        }
    }
}

/// At a laptop's 1024x700 every control of every view, with a run selected and the IoU and
/// Spectra views computed, ends inside the window: rows of buttons wrap instead of running off
/// its right edge (the sweep view's shipped sweeps, the IoU table's exports and the figure
/// titles' buttons did).
#[test]
fn every_views_controls_fit_a_1024_px_window() {
    use attnlab::app::Command;
    use egui::accesskit::Role;
    let root = tempfile::tempdir().unwrap();
    let mut app = app_with_finished_run(root.path());
    app.views.iou.protocol.examples = 16;
    app.views.spectra.protocol.examples = 16;
    let mut harness = Harness::builder()
        .with_size(egui::vec2(1024.0, 700.0))
        .build_ui_state(|ui, app: &mut AttnlabApp| app.show(ui), app);
    wait_for_loaded_run(&mut harness);
    let controls = [
        Role::Button,
        Role::CheckBox,
        Role::ComboBox,
        Role::TextInput,
        Role::Slider,
        Role::SpinButton,
        Role::ProgressIndicator,
    ];
    for &tab in Tab::ALL {
        if matches!(tab, Tab::Iou | Tab::Spectra) {
            run_until(&mut harness, "the view's analysis", |app| {
                app.commands.push(Command::PrepareDemoTab(tab));
                app.demo_ready == Some(tab)
            });
        }
        harness.state_mut().tab = tab;
        settle(&mut harness);
        let figures = harness
            .query_all(egui_kittest::kittest::By::new().label("PNG"))
            .count();
        if matches!(
            tab,
            Tab::Training | Tab::Encodings | Tab::Iou | Tab::Spectra
        ) {
            assert!(figures > 0, "{}: no figure drawn", tab.label());
        }
        let outside: Vec<String> = harness
            .query_all(
                egui_kittest::kittest::By::new().predicate(|node| controls.contains(&node.role())),
            )
            .filter(|node| node.rect().right() > 1024.0)
            .map(|node| format!("{:?} {:?}", node.accesskit_node().label(), node.rect()))
            .collect();
        assert!(outside.is_empty(), "{}: {outside:?}", tab.label());
    }
}

/// A window whose editor's preset was started with Start, once the run has taken two steps.
fn harness_with_live_run(app: AttnlabApp) -> Harness<'static, AttnlabApp> {
    let mut harness = harness(app);
    harness.get_by_label("Start").click();
    step_while_working(&mut harness);
    run_until(&mut harness, "a few steps", |app| {
        app.runs.selected().is_some_and(|r| r.steps.len() >= 2)
    });
    step_while_working(&mut harness);
    harness
}

/// Clicks Stop and runs frames until the selected run has ended.
fn stop_the_selected_run(harness: &mut Harness<'_, AttnlabApp>) {
    harness.get_by_label("Stop").click();
    step_while_working(harness);
    run_until(harness, "the run to stop", |app| {
        app.runs.selected().is_some_and(|r| !r.is_running())
    });
}

fn step_while_working(harness: &mut Harness<'_, AttnlabApp>) {
    harness.step();
}

/// Runs frames until the selected run's folder and then its attention have loaded. Both come
/// from background threads that ask for a repaint when done, so a `harness.run()` started
/// before the second one could see it arrive past its frame limit.
fn wait_for_loaded_run(harness: &mut Harness<'_, AttnlabApp>) {
    run_until(harness, "the run folder and its attention to load", |app| {
        app.runs
            .selected()
            .is_some_and(|r| !r.steps.is_empty() && r.attention.is_some())
    });
    settle(harness);
}

/// Runs frames until no background job is live and the frames settle. A job that ends between
/// two frames asks for a repaint, so a plain `harness.run()` could see it arrive past its frame
/// limit on a loaded machine; this waits for the jobs first and tries again if one more began.
fn settle(harness: &mut Harness<'_, AttnlabApp>) {
    let start = Instant::now();
    loop {
        run_until(harness, "the background jobs to end", |app| {
            app.jobs.live().is_empty()
        });
        if harness.try_run().is_ok() {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the frames never settled"
        );
    }
}

/// A window with one finished tiny run (trained in-process) in its run list, exporting to `root`.
fn app_with_finished_run(root: &std::path::Path) -> AttnlabApp {
    let mut app = app(root);
    app.editor.preset.train.max_steps = Some(2);
    app.exporter.folder = Some(root.to_path_buf());
    let dir = common::trained_run(&app.editor.preset, root);
    app.runs.open(dir);
    app
}

#[test]
fn a_run_folder_that_reached_its_target_or_failed_says_so_in_words() {
    let root = tempfile::tempdir().unwrap();
    let mut app = app(root.path());
    app.editor.preset.train.max_steps = Some(2);
    // Two trained folders, their summaries rewritten as a run that reached its target and
    // one that failed would leave them.
    for (name, status, error) in [
        ("reached", RunStatus::TargetReached, None),
        (
            "broken",
            RunStatus::Failed,
            Some("out of memory".to_string()),
        ),
    ] {
        app.editor.preset.name = name.into();
        let dir = common::trained_run(&app.editor.preset, root.path());
        let run = attnlab::train::RunDir::open(&dir).unwrap();
        let mut summary = run.read_summary().unwrap();
        (summary.status, summary.error) = (status, error);
        run.write_summary(&summary).unwrap();
        app.runs.open(dir);
    }
    let mut harness = harness(app);
    run_until(&mut harness, "both run folders", |app| {
        app.runs.runs.iter().all(|r| !r.steps.is_empty())
    });
    harness.run();
    harness.get_by_label_contains("reached (reached target accuracy)");
    harness.get_by_label_contains("reached target accuracy at step 2 of 2");
    harness.get_by_label_contains("broken (failed: out of memory)");
    assert!(harness.query_by_label_contains("targetreached").is_none());
    // The progress bar's hover says at which CPU priority the window trains and how to change it.
    assert!(harness.query_by_label_contains("CPU priority").is_none());
    harness
        .get_by_label_contains("reached target accuracy at step 2 of 2")
        .hover();
    harness.run();
    harness.get_by_label_contains("CPU priority");
}

/// A run is renamed from its entry's context menu: the list, its preset and its summary
/// take the new name, its folder keeps its own.
#[test]
fn a_run_is_renamed_from_the_run_list() {
    let root = tempfile::tempdir().unwrap();
    let mut app = app(root.path());
    app.editor.preset.train.max_steps = Some(2);
    app.editor.preset.name = "first-try".into();
    let dir = common::trained_run(&app.editor.preset, root.path());
    app.runs.open(dir.clone());
    let mut harness = harness(app);
    run_until(&mut harness, "the run folder", |app| {
        app.runs.runs.iter().all(|r| !r.steps.is_empty())
    });
    harness.run();
    harness
        .get_by_label_contains("first-try (")
        .click_secondary();
    harness.run();
    harness.get_by_label("Rename...").click();
    harness.run();
    let field = harness.get_by_label("new name");
    field.focus();
    field.type_text(" (lr 3e-3)");
    harness.run();
    harness.get_by_label("Rename").click();
    harness.run();
    harness.run();
    assert_eq!(harness.state().runs.runs[0].name, "first-try (lr 3e-3)");
    let run = attnlab::train::RunDir::open(&dir).unwrap();
    assert_eq!(run.read_summary().unwrap().name, "first-try (lr 3e-3)");
    assert_eq!(run.read_preset().unwrap().name, "first-try (lr 3e-3)");
    harness.get_by_label_contains("first-try (lr 3e-3) (");
}

/// A folder that is not a run says why in the run list (it said "(unreadable)" alone).
#[test]
fn a_folder_that_is_not_a_run_says_why_in_the_list() {
    let root = tempfile::tempdir().unwrap();
    let mut app = app(root.path());
    let empty = root.path().join("not-a-run");
    std::fs::create_dir(&empty).unwrap();
    app.runs.open(empty);
    let mut harness = harness(app);
    run_until(&mut harness, "the folder read", |app| {
        app.runs.runs[0].status == attnlab::app::RunState::Unreadable
    });
    harness.run();
    harness.get_by_label_contains("(unreadable: not a run folder (no preset.toml)");
}

/// The window names the text a language model trained on (a run of `corpus = "auto"` had
/// fallen back to generated prose without a word).
#[test]
fn a_language_model_run_names_the_text_it_trained_on() {
    let root = tempfile::tempdir().unwrap();
    let mut app = app(root.path());
    app.editor.preset.train.max_steps = Some(2);
    app.editor.preset.task = common::tiny_language_model();
    let dir = common::trained_run(&app.editor.preset, root.path());
    app.runs.open(dir);
    let mut harness = harness(app);
    run_until(&mut harness, "the run folder", |app| {
        app.runs.runs.iter().all(|r| !r.steps.is_empty())
    });
    harness.run();
    harness.get_by_label_contains("text: generated: seeded synthetic prose");
}

/// A character-level language model's maps name its tokens' characters, rebuilt from its
/// corpus (the run folder keeps only ids, numbered by the training text's frequencies): they
/// read `#5` before. A run that trained on text this machine does not have keeps the ids.
#[test]
fn a_character_language_models_maps_name_its_characters() {
    let root = tempfile::tempdir().unwrap();
    let mut app = app(root.path());
    app.editor.preset.train.max_steps = Some(2);
    let mut task = common::tiny_language_model();
    if let attnlab::tasks::TaskSpec::Lm(lm) = &mut task {
        (lm.tokens, lm.vocab_size) = (attnlab::tasks::lm::Tokens::Chars, 64);
    }
    app.editor.preset.task = task;
    let dir = common::trained_run(&app.editor.preset, root.path());
    // A run that says it trained on other text: its characters cannot be rebuilt here.
    let other = tempfile::tempdir().unwrap();
    let elsewhere = common::trained_run(&app.editor.preset, other.path());
    let summary = elsewhere.join("summary.json");
    let text = std::fs::read_to_string(&summary).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["corpus"] = "a file that is not here".into();
    std::fs::write(&summary, json.to_string()).unwrap();
    app.runs.open(elsewhere);
    app.runs.open(dir);
    app.tab = Tab::Attention;
    let mut harness = harness(app);
    run_until(&mut harness, "both runs' attention", |app| {
        app.runs.runs.iter().all(|r| r.attention.is_some())
    });
    settle(&mut harness);
    let characters: Vec<_> = harness
        .state()
        .runs
        .runs
        .iter()
        .map(|r| r.characters.is_some())
        .collect();
    assert_eq!(characters, [false, true]);
    harness.state_mut().runs.selected = Some(1);
    harness.run_steps(3);
    let run = harness.state().runs.selected().unwrap();
    assert!(run.characters.as_ref().is_some_and(|c| c.len() > 10));
    harness
        .get_all_by_role(egui::accesskit::Role::Image)
        .next()
        .unwrap()
        .hover();
    settle(&mut harness);
    let shown = |text| {
        let by = egui_kittest::kittest::By::new().label_contains(text);
        harness.query_all(by).count()
    };
    let (named, numbered) = (shown(", tokens '"), shown(", tokens #"));
    assert!(
        named > 0 && numbered == 0,
        "{named} named, {numbered} numbered"
    );
}

/// Where no file dialog opens (no desktop portal, no zenity: it returned at once, as if
/// cancelled), the app asks for the path in its own window and says why: here a run folder,
/// and a figure to export.
#[test]
fn a_typed_path_stands_in_for_a_file_dialog() {
    use attnlab::app::{Command, PathRequest};
    let root = tempfile::tempdir().unwrap();
    let mut app = app(root.path());
    app.editor.preset.train.max_steps = Some(2);
    let dir = common::trained_run(&app.editor.preset, root.path());
    let commands = app.commands.clone();
    let mut harness = harness(app);
    harness.run();
    commands.push(Command::AskPath(PathRequest {
        title: "Open run folder".into(),
        default: std::path::PathBuf::new(),
        why: "No file dialog can open here".into(),
        answer: Command::OpenRun,
    }));
    harness.run();
    harness.get_by_label_contains("No file dialog can open here");
    let field = harness.get_by_label("path");
    field.focus();
    field.type_text(dir.to_str().unwrap());
    harness.run();
    harness.get_by_label("OK").click();
    run_until(&mut harness, "the typed run folder", |app| {
        app.runs
            .runs
            .iter()
            .any(|r| r.dir.as_deref() == Some(dir.as_path()))
    });
    // The opened folder's reads (its metrics, then its attention) are jobs that ask for
    // repaints when they end: wait for them, or a later `harness.run()` sees them arrive.
    settle(&mut harness);
    assert!(harness.query_by_label_contains("No file dialog").is_none());
    // Cancel closes the window and does nothing.
    commands.push(Command::AskPath(PathRequest {
        title: "Open run folder".into(),
        default: dir.clone(),
        why: "No file dialog can open here".into(),
        answer: Command::OpenRun,
    }));
    harness.run();
    harness.get_by_label("Cancel").click();
    harness.run();
    assert!(harness.query_by_label_contains("No file dialog").is_none());
    assert_eq!(harness.state().runs.runs.len(), 1);
    // No figure waits: exporting to a typed path says so instead of failing silently.
    let typed = root.path().join("figure.svg");
    commands.push(Command::ExportTo(typed.clone()));
    harness.run();
    assert_eq!(
        harness.state().status.text(),
        "no figure is waiting to be exported"
    );
}

#[test]
fn iou_of_a_run_fills_the_table_shows_an_example_and_exports() {
    let root = tempfile::tempdir().unwrap();
    let mut lm = app(root.path()).editor.preset;
    lm.name = "text".into();
    lm.train.max_steps = Some(2);
    lm.task = common::tiny_language_model();
    let text = common::trained_run(&lm, root.path());
    let mut app = app_with_finished_run(root.path());
    app.runs.open(text);
    app.tab = Tab::Iou;
    app.views.iou.protocol.examples = 100;
    let mut harness = harness(app);
    wait_for_loaded_run(&mut harness);
    // With the language model selected, its own Compute is disabled and the view says why
    // (it offered Compute only to fail).
    let text_run = harness
        .state()
        .runs
        .runs
        .iter()
        .position(|r| r.name == "text");
    let selected = std::mem::replace(&mut harness.state_mut().runs.selected, text_run);
    harness.run();
    harness.get_by_label_contains("No IoU table for the selected run: this analysis needs a task");
    harness.get_by_label("Compute for the selected run").click();
    step_while_working(&mut harness);
    settle(&mut harness);
    let iou = &harness.state().views.iou;
    assert!(
        iou.reports.is_empty() && iou.error.is_none(),
        "{:?}",
        iou.error
    );
    harness.state_mut().runs.selected = selected;
    // A language model in the list is left out with why; the MQAR run's table is kept. An
    // earlier error goes as the computation starts (it read as this one's until it ended).
    harness.state_mut().views.iou.error = Some("an earlier error".into());
    harness.get_by_label("Compute for every run").click();
    harness.step();
    assert_eq!(harness.state().views.iou.error, None);
    step_while_working(&mut harness);
    run_until(&mut harness, "the IoU table", |app| {
        !app.views.iou.reports.is_empty() || app.views.iou.error.is_some()
    });
    harness.run();
    assert_eq!(harness.state().views.iou.error, None);
    assert_eq!(harness.state().views.iou.reports.len(), 1);
    let left_out = harness
        .state()
        .views
        .iou
        .left_out
        .clone()
        .unwrap_or_default();
    assert!(left_out.contains("text ("), "{left_out}");
    let table = &harness.state().views.iou.reports[0].value.table;
    assert_eq!(table.examples, 100);
    assert_eq!((table.hard.len(), table.hard[0].len()), (2, 2));
    // One cell per layer and head, each with soft IoU first (the headline), then hard.
    assert_eq!(harness.get_all_by_label_contains("\nhard ").count(), 4);
    assert!(
        harness.query_by_label_contains("\nsoft ").is_none(),
        "soft leads"
    );
    // Hard IoU against its threshold τ, beside the bars.
    harness.get_by_label("Hard IoU against its threshold τ, soft IoU dashed");
    harness.get_all_by_label("PNG").next().unwrap().click();
    harness.run();
    assert!(root.path().join("iou-hard.png").is_file());
    harness.get_by_label("Show example").click();
    step_while_working(&mut harness);
    run_until(&mut harness, "the example", |app| {
        app.views.iou.error.is_some() || app.views.iou.has_example()
    });
    assert_eq!(harness.state().views.iou.error, None);
    harness.run();
    harness.get_by_label_contains("row 0, layer 1, head 0: hard IoU");
}

/// Spectra of every run: a language model in the list is left out with why (its maps have
/// no task ground truth to crop to), the MQAR run's curves are drawn and exported.
#[test]
fn spectra_of_a_run_are_plotted_and_exported() {
    let root = tempfile::tempdir().unwrap();
    let mut lm = app(root.path()).editor.preset;
    lm.name = "text".into();
    lm.train.max_steps = Some(2);
    lm.task = common::tiny_language_model();
    let text = common::trained_run(&lm, root.path());
    let mut app = app_with_finished_run(root.path());
    app.runs.open(text);
    app.tab = Tab::Spectra;
    app.views.spectra.protocol.examples = 20;
    let mut harness = harness(app);
    wait_for_loaded_run(&mut harness);
    harness.get_by_label("Compute for every run").click();
    step_while_working(&mut harness);
    run_until(&mut harness, "the spectrum", |app| {
        !app.views.spectra.report.runs.is_empty() || app.views.spectra.error.is_some()
    });
    harness.run();
    let spectra = &harness.state().views.spectra;
    assert_eq!(spectra.error, None);
    assert_eq!(spectra.report.runs.len(), 1);
    let left_out = spectra.left_out.clone().unwrap_or_default();
    assert!(left_out.contains("text ("), "{left_out}");
    let spectrum = &harness.state().views.spectra.report.runs[0].spectrum;
    assert_eq!(spectrum.at_value.len(), 2);
    let curve = spectrum.layer_curve(0);
    assert!(
        (curve.last().unwrap() - 1.0).abs() < 1e-9,
        "a cumulative curve ends at 1"
    );
    harness.get_all_by_label("SVG").next().unwrap().click();
    harness.run();
    assert!(root.path().join("spectrum.svg").is_file());
}

#[test]
fn a_sweep_fills_its_grid_and_shows_its_summary() {
    let root = tempfile::tempdir().unwrap();
    let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("presets/mqar_softmax.toml");
    let file = root.path().join("sweep.toml");
    let tiny = "model.d_model=16 task.seq_len=16 task.vocab_size=32 task.num_kv_pairs=2 \
                task.train_examples=64 task.test_examples=16 train.batch_size=8 \
                train.max_steps=4 train.eval_every=2 train.warmup_steps=1";
    let set: Vec<String> = tiny.split(' ').map(|o| format!("{o:?}")).collect();
    let text = format!(
        "name = \"t\"\nbase = {base:?}\nout = {:?}\nworkers = 2\nset = [{}]\n\
         [axes]\nmechanism = [\"softmax\", \"based\"]\nseed = [0, 1]\n",
        root.path().join("out"),
        set.join(", ")
    );
    std::fs::write(&file, text).unwrap();
    let mut app = app(root.path());
    app.exporter.folder = Some(root.path().to_path_buf());
    app.tab = Tab::Sweep;
    let mut harness = harness(app);
    harness.state_mut().views.sweep.path = root.path().join("missing.toml").display().to_string();
    harness.run();
    harness.get_by_label("Load").click();
    harness.run();
    harness.get_by_label_contains("missing.toml");
    assert!(harness.state().views.sweep.loaded.is_none());
    harness.state_mut().views.sweep.path = file.display().to_string();
    harness.run();
    harness.get_by_label("Load").click();
    harness.run();
    assert_eq!(harness.state().views.sweep.error, None);
    harness.get_by_label("softmax d16");
    harness.get_by_label("seed 1");
    assert_eq!(harness.get_all_by_label("pending").count(), 4);
    // Two workers: one group per mechanism, whatever the cores (auto halves groups to fill them).
    harness
        .state_mut()
        .views
        .sweep
        .loaded
        .as_mut()
        .unwrap()
        .sweep
        .workers = 2;
    harness.get_by_label("Run sweep").click();
    step_while_working(&mut harness);
    run_until(&mut harness, "the sweep's summary", |app| {
        app.views.sweep.report.is_some()
    });
    harness.run();
    let view = &harness.state().views.sweep;
    assert_eq!(view.error, None);
    assert!(view.cells.iter().all(|c| c.is_done()), "{:?}", view.cells);
    let summary = &view.report.as_ref().unwrap().summary;
    assert_eq!(summary.runs.len(), 4);
    assert_eq!(summary.points.len(), 2, "softmax and based, two seeds each");
    assert_eq!(harness.get_all_by_label_contains("done ").count(), 4);
    // One group of replicas per mechanism (the two seeds of each).
    harness.get_by_label_contains("2 groups of replicas");
    harness.get_by_label_contains("group 1: 2 cells like softmax-s0: ended, 2 done");
    harness.get_by_label_contains("group 2: 2 cells like based-s0: ended, 2 done");
    harness.get_by_label("MQAR accuracy, length 16, 2 pairs");
    harness.get_by_label("Recall against state, length 16, 2 pairs");
    // Every cell trained through the run list.
    assert_eq!(harness.state().runs.runs.len(), 4);
    // The first CSV button is the accuracy panel's (the frontier's follows).
    harness.get_all_by_label("CSV").next().unwrap().click();
    harness.run();
    let csv = std::fs::read_to_string(root.path().join("sweep-accuracy-L16-N2.csv")).unwrap();
    assert!(csv.contains("based") && csv.contains("softmax"), "{csv}");
    // The summary files are written beside the runs, as `attnlab sweep` does.
    assert!(root.path().join("out/summary.json").is_file());
}

/// The window on the Sweep view with a sweep written into `root` and loaded: over the shipped
/// preset `base` with the `set` overrides (space-separated), then `rest`, the file's lines
/// after them (its `[axes]`).
fn loaded_sweep(
    root: &std::path::Path,
    (base, set, rest): (&str, &str, &str),
) -> Harness<'static, AttnlabApp> {
    let base =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("presets/{base}.toml"));
    let set: Vec<String> = set.split(' ').map(|o| format!("{o:?}")).collect();
    let text = format!(
        "name = \"s\"\nbase = {base:?}\nout = {:?}\nset = [{}]\n{rest}",
        root.join("out"),
        set.join(", ")
    );
    let file = root.join("sweep.toml");
    std::fs::write(&file, text).unwrap();
    let mut app = app(root);
    app.tab = Tab::Sweep;
    let mut harness = harness(app);
    harness.state_mut().views.sweep.path = file.display().to_string();
    harness.run();
    harness.get_by_label("Load").click();
    harness.run();
    assert_eq!(harness.state().views.sweep.error, None);
    harness
}

/// Stop answers at once: the button says "Stopping…" (disabled) until the running cells end
/// their step, and the cells then say they were stopped.
#[test]
fn stopping_a_sweep_says_so_until_its_cells_stop() {
    let root = tempfile::tempdir().unwrap();
    // Steps long enough (a wide model at length 256) that the cells are still in one when
    // the frame after the click is drawn.
    let slow = "model.d_model=256 task.seq_len=256 task.vocab_size=512 task.train_examples=256 \
                task.test_examples=16 train.batch_size=32 train.max_steps=1000";
    let sweep = ("mqar_softmax", slow, "workers = 1\n[axes]\nseed = [0, 1]\n");
    let mut harness = loaded_sweep(root.path(), sweep);
    harness.get_by_label("Run sweep").click();
    run_until(&mut harness, "a cell training", |app| {
        app.runs.runs.iter().any(|r| !r.steps.is_empty())
    });
    harness.get_by_label("Stop sweep").click();
    // One frame takes the click, the next draws its answer.
    harness.step();
    harness.step();
    // The job ends once its cells end their step (hundreds of ms for this model: 722 ms at batch
    // 64 on the development machine, against a few ms for two frames): while it has not, as the
    // status line's "stopping" says, the button must say so too.
    let live = harness.state().jobs.live();
    if live.iter().any(|job| job.contains("stopping")) {
        let stopping = harness.get_by_label("Stopping…");
        assert!(
            stopping.accesskit_node().is_disabled(),
            "clicked once is enough"
        );
    }
    // Once the job has ended the button reads "Stop sweep" again and Run is offered.
    settle(&mut harness);
    harness.get_by_label("Stop sweep");
    let run = harness.get_by_label("Run sweep");
    assert!(!run.accesskit_node().is_disabled(), "it can run again");
    // A grid cell's label is its state alone (the run list says "<name> (stopped)").
    assert!(harness.get_all_by_label("stopped").count() >= 1);
}

/// MAD-lite's shape in small: one probe, two decays; the view shows MAD's score beside the
/// published row and its bar figure.
#[test]
fn a_mad_sweep_shows_mads_score_beside_the_published_row() {
    let root = tempfile::tempdir().unwrap();
    let tiny = "model.d_model=16 model.n_heads=2 task.train_examples=32 task.test_examples=16 \
                train.batch_size=8 train.max_steps=2";
    let axes = "[axes]\nprobe = [\"memorization\"]\nweight_decay = [0.0, 0.1]\n";
    let mut harness = loaded_sweep(root.path(), ("mad_in_context_recall", tiny, axes));
    harness.get_by_label("Run sweep").click();
    step_while_working(&mut harness);
    run_until(&mut harness, "the sweep's summary", |app| {
        app.views.sweep.report.is_some()
    });
    harness.run();
    let summary = &harness.state().views.sweep.report.as_ref().unwrap().summary;
    assert_eq!(summary.runs.len(), 2);
    assert!(summary.points.is_empty(), "MAD runs are no MQAR point");
    assert_eq!(summary.mad.len(), 1);
    assert_eq!((summary.mad[0].runs, summary.mad[0].settings), (2, 1));
    harness.get_by_label("memorization");
    harness.get_by_label("0.852 (Transformer)");
    harness.get_by_label("MAD score per task");
}

#[test]
fn extrapolation_of_a_language_model_fills_the_table_and_exports() {
    let root = tempfile::tempdir().unwrap();
    let mut app = app(root.path());
    app.exporter.folder = Some(root.path().to_path_buf());
    // An MQAR run in the list too: "every run" leaves it out, saying why, and keeps the rest.
    app.editor.preset.train.max_steps = Some(2);
    app.editor.preset.name = "recall".into();
    let mqar = common::trained_run(&app.editor.preset, root.path());
    app.runs.open(mqar);
    let p = &mut app.editor.preset;
    p.name = "text".into();
    p.encoding = attnlab::encodings::EncodingSpec::from_name("alibi").unwrap();
    p.model.n_layers = 1;
    p.train.max_steps = Some(2);
    p.task = common::tiny_language_model();
    let dir = common::trained_run(&app.editor.preset, root.path());
    app.runs.open(dir.clone());
    app.tab = Tab::Extrapolation;
    app.views.extrapolation.lengths = "8, 16, 32".into();
    let mut harness = harness(app);
    wait_for_loaded_run(&mut harness);
    harness.get_by_label("Compute for every run").click();
    step_while_working(&mut harness);
    run_until(&mut harness, "the perplexity table", |app| {
        app.views.extrapolation.report.is_some() || app.views.extrapolation.error.is_some()
    });
    assert_eq!(harness.state().views.extrapolation.error, None);
    harness.run();
    harness.get_by_label_contains("recall (a mqar run, not a language model)");
    let result = &harness
        .state()
        .views
        .extrapolation
        .report
        .as_ref()
        .unwrap()
        .sweep;
    assert_eq!(result.lengths, [8, 16, 32]);
    assert!(result.curves[0].points.iter().all(|p| p.ppl.is_some()));
    harness.get_by_label("Def. 0.1 (δ = 0.1)");
    harness.get_by_label("8 (L)");
    // Each verdict's header says on hover what it is.
    for (header, says) in [
        ("max δ", "the largest δ_n = |ppl_n − ppl_L| / ppl_L"),
        ("Def. 0.1 (δ = 0.1)", "Definition 0.1 of the RPE paper"),
        ("Thm 0.4", "Theorem 0.4 of the RPE paper"),
    ] {
        assert!(harness.query_by_label_contains(says).is_none());
        harness.get_by_label(header).hover();
        harness.run_steps(4);
        harness.get_by_label_contains(says);
    }
    // The results are kept in the run folder too.
    assert!(dir.join("extrapolation-non-overlapping.json").is_file());
    harness.get_all_by_label("SVG").next().unwrap().click();
    harness.run();
    assert!(root.path().join("perplexity-vs-length.svg").is_file());
}

/// The Encodings view computes `attnlab bias`, `trf` and `erf`'s reports, and draws the
/// selected run's ERF on the TRF's axes.
#[test]
fn the_encodings_view_overlays_the_selected_runs_erf_on_the_trf() {
    let root = tempfile::tempdir().unwrap();
    let mut app = app(root.path());
    app.editor.preset.encoding = attnlab::encodings::EncodingSpec::from_name("alibi").unwrap();
    app.editor.preset.train.max_steps = Some(2);
    let dir = common::trained_run(&app.editor.preset, root.path());
    app.runs.open(dir);
    app.tab = Tab::Encodings;
    let mut harness = harness(app);
    wait_for_loaded_run(&mut harness);
    run_until(&mut harness, "the run's ERF", |app| {
        let results = app.views.encodings.results.as_ref();
        results.is_some_and(|r| r.run.is_some())
    });
    harness.run();
    let results = harness.state().views.encodings.results.as_ref().unwrap();
    let erf = results.run.as_ref().unwrap().as_ref().unwrap();
    assert_eq!(erf.encoding, "alibi (run, layer 0)");
    assert!(results.trf.trf.contains_key("alibi"), "the editor's TRF");
    assert_eq!(
        results.bias.entries().next().unwrap().1.verdict,
        "converges"
    );
}

#[test]
fn a_hidden_views_finished_task_is_taken_in_without_showing_it() {
    let root = tempfile::tempdir().unwrap();
    let mut app = app_with_finished_run(root.path());
    app.views.spectra.protocol.examples = 20;
    let mut harness = harness(app);
    wait_for_loaded_run(&mut harness);
    let state = harness.state_mut();
    let run = state.runs.selected().unwrap();
    let list = vec![(run.name.clone(), run.dir.clone().unwrap())];
    state
        .views
        .view_mut(Tab::Spectra)
        .analyse(&state.jobs, list);
    assert_eq!(state.tab, Tab::Welcome);
    // The task shows in the status bar while it runs, and its result lands while the
    // Spectra view stays hidden.
    run_until(&mut harness, "the spectrum, with its view hidden", |app| {
        !app.views.spectra.report.runs.is_empty()
    });
    assert_eq!(harness.state().tab, Tab::Welcome);
    assert!(harness.state().views.spectra.error.is_none());
}

/// The screenshot demo's commands: a view asked to get ready shows, computes its analysis
/// of the selected run, and is reported ready once it has it.
#[test]
fn the_demo_readies_a_view_through_commands() {
    use attnlab::app::Command;
    let root = tempfile::tempdir().unwrap();
    let mut app = app_with_finished_run(root.path());
    app.views.spectra.protocol.examples = 20;
    let mut harness = harness(app);
    wait_for_loaded_run(&mut harness);
    run_until(&mut harness, "the spectra view ready", |app| {
        app.commands.push(Command::PrepareDemoTab(Tab::Spectra));
        app.demo_ready == Some(Tab::Spectra)
    });
    assert_eq!(harness.state().tab, Tab::Spectra);
    assert!(!harness.state().views.spectra.report.runs.is_empty());
}

#[test]
fn commands_from_menus_and_other_threads_are_carried_out_between_frames() {
    use attnlab::app::Command;
    let root = tempfile::tempdir().unwrap();
    let mut harness = harness(app(root.path()));
    harness.run();
    let commands = harness.state().commands.clone();
    std::thread::spawn(move || {
        commands.push(Command::Status("from a thread".into()));
        commands.push(Command::Show(Tab::Sweep));
    })
    .join()
    .unwrap();
    harness.run();
    assert_eq!(harness.state().status.text(), "from a thread");
    assert_eq!(harness.state().tab, Tab::Sweep);
    // A menu entry pushes its command: "New" puts the default preset back in the editor.
    harness.state_mut().editor.preset.model.d_model = 16;
    harness
        .state_mut()
        .editor
        .mark_saved(root.path().join("tiny.toml"));
    harness.get_by_label("Preset").click();
    harness.run();
    harness.get_by_label("New").click();
    harness.run();
    assert_ne!(harness.state().editor.preset.model.d_model, 16);
    assert_eq!(harness.state().editor.path, None);
}

#[test]
fn an_experiment_on_the_welcome_page_loads_its_preset_trains_and_shows_its_view() {
    let root = tempfile::tempdir().unwrap();
    let mut app = AttnlabApp::new(Persisted::default());
    app.runs_root = root.path().to_path_buf();
    app.views.spectra.protocol.examples = 20;
    let mut harness = harness(app);
    harness.run();
    assert_eq!(
        harness.state().tab,
        Tab::Welcome,
        "the first view on a first start"
    );
    // Each experiment's time says what it was measured on.
    assert!(harness.query_all_by_label("Takes (2 CPU cores):").count() >= 5);
    // Another preset in the editor, saved (so replacing it asks nothing).
    harness.state_mut().editor.preset.name = "mine".into();
    let mine = root.path().join("mine.toml");
    harness.state_mut().editor.mark_saved(mine);
    harness
        .get_by_label("Run: Linformer's attention spectrum")
        .click();
    // One frame pushes the command, the next carries it out.
    step_while_working(&mut harness);
    step_while_working(&mut harness);
    let state = harness.state();
    assert_eq!(state.editor.preset.name, "mqar-softmax");
    assert_eq!(state.runs.runs.len(), 1);
    assert!(state.runs.runs[0].is_running());
    assert_eq!(state.tab, Tab::Spectra);
    // Its analysis starts by itself once the run has ended (here: stopped early).
    run_until(&mut harness, "the run's folder", |app| {
        app.runs.selected().is_some_and(|r| !r.steps.is_empty())
    });
    harness.get_by_label("Stop").click();
    step_while_working(&mut harness);
    run_until(&mut harness, "the spectrum of the stopped run", |app| {
        !app.views.spectra.report.runs.is_empty() || app.views.spectra.error.is_some()
    });
    assert_eq!(harness.state().views.spectra.error, None);
}

#[test]
fn an_experiment_leaves_unsaved_edits_in_the_editor_and_asks_nothing() {
    let root = tempfile::tempdir().unwrap();
    let mut app = AttnlabApp::new(Persisted::default());
    app.runs_root = root.path().to_path_buf();
    let mut harness = harness(app);
    harness.run();
    harness.state_mut().editor.preset.name = "unsaved".into();
    harness
        .get_by_label("Run: Linformer's attention spectrum")
        .click();
    step_while_working(&mut harness);
    step_while_working(&mut harness);
    let state = harness.state();
    assert_eq!(state.editor.preset.name, "unsaved");
    assert_eq!(state.runs.runs.len(), 1, "the experiment's run starts");
    assert!(
        state.status.text().contains("keeps your unsaved preset"),
        "{}",
        state.status.text()
    );
    assert!(
        harness.query_by_label("Unsaved changes").is_none(),
        "no dialog"
    );
    harness.get_by_label("Stop").click();
    step_while_working(&mut harness);
}

#[test]
/// The menu's presets are compiled in (`experiments::PRESETS`), so they open whatever the
/// working folder; the editor keeps no path, so Save asks where to write.
fn a_shipped_preset_opens_from_the_menu() {
    let root = tempfile::tempdir().unwrap();
    let mut harness = harness(AttnlabApp::new(Persisted::default()));
    harness.state_mut().runs_root = root.path().to_path_buf();
    harness.run();
    harness.get_by_label("Preset").click();
    harness.run();
    harness.get_by_label("lm_alibi").click();
    harness.run();
    assert_eq!(harness.state().editor.preset.name, "lm-alibi");
    assert_eq!(harness.state().editor.path, None);
}

#[test]
fn before_its_first_evaluation_a_run_says_when_accuracy_comes_and_exports_titled_axes() {
    let root = tempfile::tempdir().unwrap();
    let mut app = app(root.path());
    app.editor.preset.train.eval_every = 1000;
    app.exporter.folder = Some(root.path().to_path_buf());
    app.tab = Tab::Training;
    let mut harness = harness_with_live_run(app);
    harness.get_by_label_contains("No test accuracy yet: the first evaluation is at step 1000");
    // The loss plot's export carries its axis titles.
    harness.get_all_by_label("SVG").next().unwrap().click();
    step_while_working(&mut harness);
    let svg = root.path().join("training-loss.svg");
    run_until(&mut harness, "the exported loss figure", |_| svg.is_file());
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.contains(attnlab::train::figures::STEP_AXIS),
        "no step axis"
    );
    assert!(text.contains("training loss (cross-entropy, nats)"));
    stop_the_selected_run(&mut harness);
}

/// A live run with a target accuracy shows its ETA as a bound ("eta ≤ …"), and the progress
/// bar's hover says why: the ETA counts to the last step, the target can end the run earlier.
#[test]
fn a_live_runs_eta_is_a_bound_when_its_target_can_end_it_earlier() {
    let root = tempfile::tempdir().unwrap();
    let mut app = app(root.path());
    // No evaluation before the run's last step, so the target cannot end it during the test.
    app.editor.preset.train.eval_every = 100_000;
    app.editor.preset.train.target_accuracy = 0.99;
    app.tab = Tab::Training;
    let mut harness = harness_with_live_run(app);
    let why = "The ETA counts to the last step";
    assert!(harness.query_by_label_contains(why).is_none());
    harness.get_by_label_contains(", eta ≤ ").hover();
    // egui shows a tooltip once the pointer has rested; each frame is a quarter of a second
    // of the harness's own clock.
    harness.run_steps(4);
    harness.get_by_label_contains(why);
    harness.get_by_label_contains("reaches 99%");
    stop_the_selected_run(&mut harness);
    // "stopping …" does not outlive the run: the status bar says how it ended.
    let status = harness.state().status.text().to_string();
    let name = &harness.state().runs.runs[0].name;
    assert!(
        status.starts_with(&format!("{name}: stopped at step ")),
        "{status}"
    );
}

#[test]
fn an_absolute_encoding_says_it_has_no_bias_and_long_evidence_is_cut_with_hover() {
    let root = tempfile::tempdir().unwrap();
    let mut app = app(root.path());
    app.tab = Tab::Encodings;
    assert_eq!(app.editor.preset.encoding.name(), "learned");
    let mut harness = harness(app);
    run_until(&mut harness, "the encoding analyses", |app| {
        app.views.encodings.results.is_some()
    });
    // The view's other studies may still be ending: a plain run() could see one arrive
    // past its frame limit on a loaded machine (it did once, beside a training job).
    settle(&mut harness);
    // The TRF and exp(bias) panels say why they are empty instead of drawing an empty grid.
    let empty = harness.get_all_by_label_contains("adds no relative bias to the attention logits");
    assert_eq!(empty.count(), 2);
    // The evidence cell ends inside the window, and hovering it shows the whole text.
    let evidence = harness
        .state()
        .views
        .encodings
        .results
        .as_ref()
        .unwrap()
        .bias
        .entries()
        .next()
        .unwrap()
        .1
        .evidence
        .clone();
    let cell = harness.get_by_label(&evidence);
    assert!(cell.rect().right() <= 1400.0, "{:?}", cell.rect());
    cell.hover();
    settle(&mut harness);
    // The cell and one tooltip (egui's own for a cut label had shown it a second time).
    assert_eq!(
        harness.get_all_by_label(&evidence).count(),
        2,
        "one tooltip"
    );
}

#[test]
fn f1_or_a_question_mark_shows_the_shortcuts_and_controls_name_their_preset_keys() {
    let root = tempfile::tempdir().unwrap();
    let mut harness = harness(app(root.path()));
    harness.run();
    assert!(harness.query_by_label("Keyboard shortcuts").is_none());
    harness.key_press(egui::Key::F1);
    harness.run();
    harness.get_by_label("Keyboard shortcuts");
    harness.get_by_label("train the preset");
    harness.key_press(egui::Key::Questionmark);
    harness.run();
    assert!(harness.query_by_label("Keyboard shortcuts").is_none());
    // Hovering an editor control names the key it sets.
    let d_model = harness.get_all_by_label("d_model").last().unwrap();
    d_model.hover();
    harness.run();
    harness.get_by_label_contains("--set model.d_model=");
}

#[test]
fn the_preset_is_copied_as_a_cli_command() {
    let root = tempfile::tempdir().unwrap();
    let mut harness = harness(app(root.path()));
    harness.run();
    harness.get_by_label("Preset").click();
    harness.run();
    harness.get_by_label("Copy as CLI command").click();
    // One frame pushes the command, the next carries it out and hands egui the text.
    harness.step();
    harness.step();
    let copied = harness
        .output()
        .platform_output
        .commands
        .iter()
        .find_map(|c| match c {
            egui::OutputCommand::CopyText(text) => Some(text.clone()),
            _ => None,
        });
    let status = harness.state().status.text().to_string();
    // The tiny preset of these tests is the default one with a few settings changed.
    assert!(
        status.starts_with("copied: attnlab train mqar_softmax --set "),
        "{status}"
    );
    for set in [
        "model.d_model=16",
        "train.batch_size=8",
        "train.eval_every=2",
    ] {
        assert!(status.contains(&format!("--set {set}")), "{status}");
    }
    assert!(copied.is_some_and(|text| status.ends_with(&text)));
}

#[test]
fn ticked_runs_are_drawn_and_exported_beside_the_selected_one() {
    let root = tempfile::tempdir().unwrap();
    let mut app = app(root.path());
    app.editor.preset.train.max_steps = Some(2);
    app.exporter.folder = Some(root.path().to_path_buf());
    for name in ["first", "second"] {
        app.editor.preset.name = name.into();
        let dir = common::trained_run(&app.editor.preset, root.path());
        app.runs.open(dir);
    }
    app.tab = Tab::Training;
    let mut harness = harness(app);
    run_until(&mut harness, "both run folders", |app| {
        app.runs.runs.iter().all(|r| !r.steps.is_empty())
    });
    harness.run();
    assert_eq!(harness.state().runs.selected().unwrap().name, "first");
    // The run list's unlabelled checkboxes are its compare ticks, one per run.
    // The run list's compare ticks, one per run.
    let ticks: Vec<_> = harness
        .get_all_by_label_contains("compare: draw this run's curves")
        .collect();
    assert_eq!(ticks.len(), 2);
    ticks[1].click();
    harness.run();
    assert!(harness.state().runs.runs[1].compare);
    // One legend entry per run in each of the three plots.
    let legend = |name| {
        harness
            .get_all_by_role_and_label(egui::accesskit::Role::CheckBox, name)
            .count()
    };
    assert_eq!((legend("first"), legend("second")), (3, 3));
    harness.get_all_by_label("SVG").next().unwrap().click();
    harness.run();
    let svg = root.path().join("training-loss.svg");
    run_until(&mut harness, "the exported loss figure", |_| svg.is_file());
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.contains("first") && text.contains("second"),
        "one legend, both runs"
    );
    // The analysis views offer the same pair.
    harness.state_mut().tab = Tab::Spectra;
    harness.run();
    harness.get_by_label("Compute for the selected and ticked runs");
}

/// Retention's hidden attention is signed: its maps take the diverging scale around 0 (the
/// legend says so) and the log colour option is off.
#[test]
fn a_signed_mixing_matrix_is_drawn_on_a_scale_centred_on_zero() {
    let root = tempfile::tempdir().unwrap();
    let mut app = app(root.path());
    app.editor.preset.attention = attnlab::attention::MechanismSpec::Retention(Default::default());
    app.editor.preset.train.max_steps = Some(2);
    let mut harness = harness(app);
    harness.get_by_label("Start").click();
    step_while_working(&mut harness);
    run_until(&mut harness, "the retention run's attention", |app| {
        app.runs
            .selected()
            .is_some_and(|r| !r.is_running() && r.attention.is_some())
    });
    harness.state_mut().tab = Tab::Attention;
    harness.run();
    harness.get_by_label("−(each map's largest |value|)");
    harness.get_by_label("one scale for all maps").click();
    harness.run();
    harness.get_by_label("A_ij (signed):");
    harness.get_by_label("(signed: 0 is white)");
    let log = harness.get_by_label("log colour");
    assert!(
        log.accesskit_node().is_disabled(),
        "log colour is off for a signed matrix"
    );
}

#[test]
fn clicking_an_attention_map_zooms_it_onto_plot_axes() {
    let root = tempfile::tempdir().unwrap();
    let mut app = app_with_finished_run(root.path());
    app.tab = Tab::Attention;
    let mut harness = harness(app);
    wait_for_loaded_run(&mut harness);
    settle(&mut harness);
    let maps: Vec<_> = harness
        .get_all_by_role(egui::accesskit::Role::Image)
        .collect();
    assert_eq!(maps.len(), 4, "2 layers x 2 heads");
    maps[1].click();
    settle(&mut harness);
    // The zoomed head is drawn on titled plot axes (painted text, checked in the view's unit
    // tests); here: the zoom itself, and the way back.
    harness.get_by_label("layer 0 head 1");
    harness.get_by_label("all heads").click();
    settle(&mut harness);
    assert_eq!(
        harness
            .get_all_by_role(egui::accesskit::Role::Image)
            .count(),
        4
    );
}

/// A pretrained model's folder opened from the command queue (as "Open model..." does) reads
/// the text box: its heads' score grid, a click on a cell shows that head's map, and ablating
/// every head fills the ablation grid.
#[test]
fn a_pretrained_model_reads_the_text_and_its_grids_click_through_to_heads() {
    let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/gpt2");
    let mut harness = harness(AttnlabApp::new(Persisted::default()));
    harness
        .state()
        .commands
        .push(attnlab::app::Command::OpenModel(folder.clone()));
    harness.step();
    assert_eq!(harness.state().tab, Tab::Pretrained);
    settle(&mut harness);
    assert_eq!(
        harness.state().views.pretrained.recent,
        vec![folder.clone()]
    );
    harness.get_by_label("Read").click();
    harness.step();
    settle(&mut harness);
    shown_head(&harness, "layer 0 head 0");
    let grids: Vec<_> = harness
        .get_all_by_role(egui::accesskit::Role::Image)
        .collect();
    // The score grid, then the layer's heads (the fixture has 4 heads).
    assert_eq!(grids.len(), 5, "the score grid and four head maps");
    grids[2].click();
    harness.step();
    settle(&mut harness);
    shown_head(&harness, "layer 0 head 1");
    // The grid's centre is the corner of layer 1 head 2 (2 layers × 4 heads).
    harness
        .get_all_by_role(egui::accesskit::Role::Image)
        .next()
        .unwrap()
        .click();
    harness.step();
    settle(&mut harness);
    shown_head(&harness, "layer 1 head 2");
    harness.get_by_label("zero").click();
    harness.step();
    settle(&mut harness);
    assert!(
        harness
            .query_by_label("ablate the heads to see this grid")
            .is_none(),
        "the ablation grid is shown once computed"
    );
    assert_eq!(
        harness.state().persisted().model_dirs,
        vec![folder],
        "the folder is remembered for the next start"
    );
}

/// The Pretrained view's heading of the head it shows on plot axes (the head maps carry the
/// same words on hover).
fn shown_head(harness: &Harness<'_, AttnlabApp>, label: &str) {
    harness.get_by_role_and_label(egui::accesskit::Role::Label, label);
}

/// The Extrapolation view scores a pretrained model's folder on a text file: perplexity at each
/// typed length, missing (with the reason) past GPT-2's learned positions.
#[test]
fn the_extrapolation_view_scores_a_pretrained_model_on_a_text_file() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut app = AttnlabApp::new(Persisted::default());
    app.tab = Tab::Extrapolation;
    let view = &mut app.views.extrapolation;
    view.model_folder = root.join("tests/fixtures/hf/gpt2").display().to_string();
    view.corpus = root.join("README.md").display().to_string();
    view.lengths = "32,64,128".into();
    let mut harness = harness(app);
    harness.run();
    harness.get_by_label("Evaluate model").click();
    harness.step();
    settle(&mut harness);
    let view = &harness.state().views.extrapolation;
    assert_eq!(view.error, None);
    let report = view.report.as_ref().expect("a report");
    let ppl = &report.sweep.ppl["gpt2"];
    assert!(ppl[0].is_some() && ppl[1].is_some(), "{ppl:?}");
    assert!(
        ppl[2].is_none(),
        "GPT-2 has 64 positions in the fixture: {ppl:?}"
    );
}
