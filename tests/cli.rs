//! The command line, run as a user would: tiny presets, real run folders, real errors.

#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

mod common;

use std::path::{Path, PathBuf};

use common::{TINY, attnlab, stderr};

fn only_subfolder(dir: &Path) -> PathBuf {
    let entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    entries[0].clone()
}

#[test]
fn train_writes_a_complete_run_folder() {
    let out = tempfile::tempdir().unwrap();
    let mut args = vec![
        "train",
        "presets/mqar_based.toml",
        "--quiet",
        "--out",
        out.path().to_str().unwrap(),
    ];
    args.extend_from_slice(TINY);
    let o = attnlab(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("completed after 6 steps"), "{stdout}");

    let run = only_subfolder(out.path());
    assert!(
        run.file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .ends_with("-mqar-based")
    );
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let kinds: Vec<String> = metrics
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["kind"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(kinds.iter().filter(|k| *k == "step").count(), 6);
    assert_eq!(kinds.iter().filter(|k| *k == "eval").count(), 2);
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["status"], "completed");
    assert_eq!(summary["mechanism"], "based");
    assert!(run.join("model.safetensors").is_file());
    // The saved preset is the resolved one, with the overrides applied, and loads again.
    let saved = attnlab::Preset::load(&run.join("preset.toml"), &[]).unwrap();
    assert_eq!(saved.model.d_model, 16);
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("attention/index.json")).unwrap())
            .unwrap();
    // mqar_based is a hybrid: layer 0 is a short convolution, layer 1 is Based.
    assert_eq!(index["layers"].as_array().unwrap().len(), 1);
    assert_eq!(index["layers"][0]["layer"], 1);
    assert!(run.join("attention/layer1.npy").is_file());
}

#[test]
fn bad_presets_fail_before_any_work_with_the_key_named() {
    let out = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str)] = &[
        (
            "attention.kind=flash",
            "unknown variant `flash`, expected one of `softmax`, `linear`, `based`, `rebased`, `linformer`",
        ),
        (
            "model.n_heads=129",
            "model.n_heads = 129: must be at most model.d_model = 128",
        ),
        ("model.d_modle=3", "unknown field `d_modle`"),
        ("train.lr=0", "train.lr = 0: must be in (0, 10]"),
        ("train.device=cuda:0", "--features cuda"),
    ];
    for (override_, expected) in cases {
        let o = attnlab(&[
            "train",
            "presets/bench_mqar.toml",
            "--set",
            override_,
            "--out",
            out.path().to_str().unwrap(),
        ]);
        assert!(!o.status.success());
        assert!(stderr(&o).contains(expected), "{override_}: {}", stderr(&o));
    }
    let o = attnlab(&[
        "train",
        "presets/mqar_linformer.toml",
        "--set",
        "encoding.kind=alibi",
        "--out",
        out.path().to_str().unwrap(),
    ]);
    assert!(
        stderr(&o).contains("encoding.kind = alibi: cannot be combined with linformer"),
        "{}",
        stderr(&o)
    );
    let o = attnlab(&["train", "no/such/preset.toml"]);
    assert!(
        stderr(&o).contains("cannot read preset") && stderr(&o).contains("no/such/preset.toml"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        std::fs::read_dir(out.path()).unwrap().count(),
        0,
        "no run folder for a bad preset"
    );
}

#[test]
fn data_prints_mqar_rows_with_ground_truth() {
    let o = attnlab(&[
        "data",
        "presets/bench_mqar.toml",
        "--n",
        "3",
        "--format",
        "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 3);
    for row in rows {
        assert_eq!(row["inputs"].as_array().unwrap().len(), 64);
        let queries = row["queries"].as_array().unwrap();
        assert_eq!(queries.len(), 4);
        for q in queries {
            let position = q["position"].as_u64().unwrap() as usize;
            assert_eq!(row["labels"][position], q["value"]);
            assert_eq!(
                row["inputs"][q["value_positions"][0].as_u64().unwrap() as usize],
                q["value"]
            );
        }
    }
}

#[test]
fn check_prints_a_preset_that_loads_back() {
    let o = attnlab(&[
        "check",
        "presets/mqar_rebased.toml",
        "--set",
        "train.lr=0.01",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8(o.stdout).unwrap();
    let preset = attnlab::Preset::parse(&text, &[], Path::new("stdout")).unwrap();
    assert_eq!(preset.train.lr, 0.01);
    assert_eq!(preset.attention.name(), "rebased");
    // A corpus that is not there is refused by check, not first by training.
    let o = attnlab(&[
        "check",
        "presets/lm_rope.toml",
        "--set",
        "task.corpus=\"/nonexistent/corpus.txt\"",
    ]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("task.corpus") && err.contains("/nonexistent"),
        "{err}"
    );
    // Nor is a folder without text, which had passed check and failed training.
    let empty = tempfile::tempdir().unwrap();
    let corpus = format!("task.corpus={:?}", empty.path().to_str().unwrap());
    let o = attnlab(&["check", "presets/lm_rope.toml", "--set", &corpus]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("a folder with no non-empty files"), "{err}");
}

/// `--set` of the mechanism renames the run as the window's editor does ("mqar-softmax"
/// trained Based), unless the same command sets `name`.
#[test]
fn a_set_mechanism_renames_the_run() {
    let name = |sets: &[&str]| {
        let o = attnlab(&[&["check", "mqar_softmax"], sets].concat());
        assert!(o.status.success(), "{sets:?}: {}", stderr(&o));
        let text = String::from_utf8(o.stdout).unwrap();
        attnlab::Preset::parse(&text, &[], Path::new("stdout"))
            .unwrap()
            .name
    };
    assert_eq!(name(&["--set", "attention=based"]), "mqar-based");
    let named = ["--set", "attention.kind=based", "--set", "name=mine"];
    assert_eq!(name(&named), "mine");
}

/// The help says a preset can be named (shipped presets work from any folder), and what
/// `check` checks.
#[test]
fn train_and_check_help_name_presets_by_name() {
    for command in ["train", "check"] {
        let o = attnlab(&[command, "--help"]);
        let help = String::from_utf8_lossy(&o.stdout);
        assert!(
            help.contains("shipped preset's name, e.g. mqar_softmax")
                && !help.contains("presets/mqar_softmax.toml"),
            "{help}"
        );
    }
    let o = attnlab(&["check", "--help"]);
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(
        help.contains("memory estimate") && help.contains("corpus"),
        "{help}"
    );
}

/// --head and --layer choose the example's map: without --example they were silently ignored.
#[test]
fn iou_refuses_an_example_head_without_an_example() {
    let o = attnlab(&["iou", "runs/any", "--head", "99"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--example"), "{}", stderr(&o));
}

#[test]
fn bench_reports_json() {
    let o = attnlab(&[
        "bench",
        "--steps-only",
        "--steps",
        "1",
        "--format",
        "json",
        "--set",
        "model.d_model=16",
        "--set",
        "task.train_examples=128",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(report["ms_per_step"].as_f64().unwrap() > 0.0);
    assert!(report.get("time_to_99_s").is_none(), "steps only: {report}");
}

/// --against times another mechanism in alternation with the preset; an unknown one is
/// refused with the catalogue's names, and --rounds means nothing without it.
#[test]
fn bench_times_a_mechanism_against_another_in_alternation() {
    let tiny = [
        "--set",
        "model.d_model=16",
        "--set",
        "task.train_examples=128",
    ];
    let run = |extra: &[&str]| {
        let mut args = vec!["bench", "--steps-only", "--steps", "1", "--format", "json"];
        args.extend(tiny);
        args.extend(extra);
        attnlab(&args)
    };
    let o = run(&[
        "--set",
        "attention.kind=linear",
        "--against",
        "softmax",
        "--rounds",
        "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let against = &report["against"];
    assert_eq!(against["kind"], "softmax", "{report}");
    assert_eq!(against["rounds"], 2, "{report}");
    let number = |key: &str| {
        against[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key}: {report}"))
    };
    assert!(number("own_ms_per_step") > 0.0 && number("other_ms_per_step") > 0.0);
    let ratio = number("ratio");
    assert!(
        number("ratio_min") <= ratio && ratio <= number("ratio_max"),
        "{report}"
    );
    let o = run(&["--against", "nope"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--against nope: not a mechanism"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("gated-deltanet"), "{}", stderr(&o));
    let o = run(&["--rounds", "3"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--against"), "{}", stderr(&o));
}

/// `attnlab … | head` must end quietly: a closed pipe is not a crash.
#[test]
fn a_closed_output_pipe_ends_quietly() {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_attnlab"))
        .args(["bias", "--format", "csv", "--length", "1000"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader goes away before the first line
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
}

#[test]
fn devices_lists_what_this_build_can_open() {
    let o = attnlab(&["devices"]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.starts_with("cpu      ok\n"), "{stdout}");
    if cfg!(feature = "cuda") {
        // One line for cuda:0: ok, or why not (and then a failing exit status).
        let line = stdout.lines().nth(1).unwrap();
        assert!(line.starts_with("cuda:0"), "{stdout}");
        assert_eq!(o.status.success(), line.ends_with(" ok"), "{}", stderr(&o));
    } else {
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(stdout.lines().count(), 1, "{stdout}");
    }
}

/// The run folder `attnlab train --out root` created, once its metrics have `lines` lines.
fn run_folder_with_metrics(root: &std::path::Path, lines: usize) -> std::path::PathBuf {
    let started = std::time::Instant::now();
    loop {
        let found = std::fs::read_dir(root)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|dir| {
                std::fs::read_to_string(dir.join("metrics.jsonl"))
                    .is_ok_and(|m| m.lines().count() >= lines)
            });
        if let Some(dir) = found {
            return dir;
        }
        assert!(
            started.elapsed().as_secs() < 120,
            "no run with {lines} steps"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn ctrl_c_and_sigterm_stop_training_with_a_fresh_checkpoint_and_a_stopped_summary() {
    for signal in ["-INT", "-TERM"] {
        let root = tempfile::tempdir().unwrap();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_attnlab"))
            .args(["train", "presets/mqar_softmax.toml", "--quiet", "--out"])
            .arg(root.path())
            .args([
                "--set",
                "train.eval_every=100000",
                "--set",
                "task.train_examples=2000",
                // Far longer than the test waits, however fast a step is.
                "--set",
                "train.epochs=1000",
            ])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Several steps, and no evaluation yet: the checkpoint can only come from the stop.
        let dir = run_folder_with_metrics(root.path(), 3);
        let killed = std::process::Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{signal}: {}", common::stderr(&out));
        let summary: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap())
                .unwrap();
        assert_eq!(summary["status"], "stopped", "{signal}: {summary}");
        assert!(summary["last_accuracy"].is_number(), "{signal}: {summary}");
        assert!(dir.join("model.safetensors").is_file(), "{signal}");
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{signal}: {leftovers:?}");
    }
}

/// Counts and lengths too large to hold used to panic ("capacity overflow") or abort on the
/// allocation; every one is refused by clap with its range (exit 2), before any work.
#[test]
fn huge_numeric_options_are_refused_with_their_range() {
    let huge = "18446744073709551615";
    let cases: [(&[&str], &str); 11] = [
        (&["bench", "--steps", huge], "not in 1..=100000"),
        (
            &["bench", "--against", "softmax", "--rounds", "1"],
            "not in 2..=1000",
        ),
        (&["bench", "--replicas", huge], "not in 1..=64"),
        (&["trf", "--points", huge], "not in 2..=10000"),
        (&["trf", "--length", "1000000000000"], "not in 1..=65536"),
        (&["bias", "--length", huge], "not in 2..=65536"),
        (&["bias", "--heads", huge], "not in 1..=256"),
        (&["erf", "run", "--points", huge], "not in 2..=10000"),
        (&["iou", "run", "--examples", huge], "not in 1..=100000"),
        (
            &["spectrum", "run", "--examples", huge],
            "not in 1..=100000",
        ),
        (
            &["data", "presets/mqar_softmax.toml", "--n", huge],
            "not in 1..=1000",
        ),
    ];
    for (args, range) in cases {
        let o = attnlab(args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(range), "{args:?}: {err}");
    }
}

/// Settings that diverge a run before it learns anything are refused before it starts,
/// naming the range: ε = 5e-324 rounds to 0 in f32 (a parameter without gradient took 0/0),
/// a weight decay of 1e12 had kept a checkpoint of weights near 9e18. (Divergence itself, and
/// the summary saved before the CLI exits on it, are tested in tests/training.rs.)
#[test]
fn settings_that_diverge_a_run_are_refused_with_their_range() {
    let cases: [(&[&str], &str); 4] = [
        (&["--set", "train.eps=5e-324"], "must be in [1e-30, 1)"),
        (&["--set", "train.weight_decay=1e12"], "must be in [0, 10]"),
        // Shown as written, not as the 309 digits of its value.
        (
            &["--set", "train.weight_decay=1e308"],
            "train.weight_decay = 1e308: must be in [0, 10]",
        ),
        (
            &["--set", "train.lr=0.5", "--set", "train.weight_decay=5"],
            "times train.lr = 0.5 must be below 1",
        ),
    ];
    for (sets, range) in cases {
        let args = [&["check", "presets/mqar_softmax.toml"], sets].concat();
        let o = attnlab(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{sets:?}: {err}");
        assert!(err.contains(range), "{sets:?}: {err}");
    }
}

/// `train --resume` refuses a run that has ended, saying so, and one whose preset no longer
/// fits its checkpoint; a stopped one goes on to its end in the same folder (here at its last
/// step already: it only completes).
#[test]
fn resume_refuses_an_ended_run_and_finishes_a_stopped_one() {
    let out = tempfile::tempdir().unwrap();
    let mut args = vec![
        "train",
        "presets/mqar_softmax.toml",
        "--quiet",
        "--out",
        out.path().to_str().unwrap(),
    ];
    args.extend_from_slice(TINY);
    let o = attnlab(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let run = only_subfolder(out.path());
    let resume = ["train", "--quiet", "--resume", run.to_str().unwrap()];
    let o = attnlab(&resume);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("cannot resume: the run has already ended (completed)"),
        "{err}"
    );
    assert!(err.contains(run.to_str().unwrap()), "{err}");
    let summary = run.join("summary.json");
    let text = std::fs::read_to_string(&summary).unwrap();
    std::fs::write(&summary, text.replace("\"completed\"", "\"stopped\"")).unwrap();
    // A preset edited since: its model no longer fits the checkpoint, which is named.
    let preset = run.join("preset.toml");
    let text = std::fs::read_to_string(&preset).unwrap();
    assert!(text.contains("d_model = 16"), "{text}");
    std::fs::write(&preset, text.replace("d_model = 16", "d_model = 32")).unwrap();
    let o = attnlab(&resume);
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(
        err.contains("checkpoint parameter") && err.contains("shape"),
        "{err}"
    );
    std::fs::write(&preset, text).unwrap();
    let o = attnlab(&resume);
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("completed after 6 steps"), "{stdout}");
    assert_eq!(only_subfolder(out.path()), run);
}

/// A language model of a few steps on the generated corpus.
fn tiny_lm() -> Vec<&'static str> {
    let steps = [
        "--set",
        "train.max_steps=2",
        "--set",
        "train.warmup_steps=0",
    ];
    [common::TINY_LM, &steps].concat()
}

/// The text a language model trained on, its run folder and its evaluations are printed
/// when the output is piped too: the progress bar's `println` printed nothing then.
#[test]
fn train_says_what_it_read_when_piped() {
    let out = tempfile::tempdir().unwrap();
    let mut args = vec!["train", "lm_rope", "--out", out.path().to_str().unwrap()];
    args.extend(tiny_lm());
    let o = attnlab(&args);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("text: generated: seeded synthetic prose") && err.contains("run folder "),
        "{err}"
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("test acc"), "{stdout}");
}

/// The run folder of `attnlab train preset args --out out`, its summary rewritten as a run
/// that was stopped (so it can be resumed).
fn stopped_run(out: &Path, preset: &str, args: &[&str]) -> PathBuf {
    let mut command = vec!["train", preset, "--quiet", "--out", out.to_str().unwrap()];
    command.extend_from_slice(args);
    let o = attnlab(&command);
    assert!(o.status.success(), "{}", stderr(&o));
    let run = only_subfolder(out);
    let summary = run.join("summary.json");
    let text = std::fs::read_to_string(&summary).unwrap();
    std::fs::write(&summary, text.replace("\"completed\"", "\"stopped\"")).unwrap();
    run
}

#[cfg(unix)]
/// `attnlab args`, failed within a minute (a read that waits on a FIFO would hang the suite:
/// it is killed and the test fails instead); returns its error output.
fn fails_promptly(args: &[&str]) -> String {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_attnlab"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed().as_secs() > 60 {
            child.kill().unwrap();
            panic!("attnlab {args:?} still running after a minute");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "attnlab {args:?} succeeded");
    stderr(&out)
}

/// A FIFO in place of a run's checkpoint, optimiser state or metrics hung `eval` and
/// `train --resume`, and `/dev/zero` as the checkpoint was read to the memory cap: each is
/// refused at once, naming the file.
#[test]
#[cfg(unix)]
fn run_files_that_are_not_regular_files_are_refused_not_waited_on() {
    let out = tempfile::tempdir().unwrap();
    let run = stopped_run(out.path(), "presets/mqar_softmax.toml", TINY);
    let run_arg = run.to_str().unwrap();
    // A FIFO, or (`/dev/zero`) a link to a device, in place of `name`; restored after.
    let replaced = |name: &str, device: bool| {
        let path = run.join(name);
        let kept = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        if device {
            std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
        } else {
            let made = std::process::Command::new("mkfifo").arg(&path).status();
            assert!(made.unwrap().success());
        }
        move || {
            std::fs::remove_file(&path).unwrap();
            std::fs::write(&path, &kept).unwrap();
        }
    };
    let eval = ["eval", run_arg];
    let resume = ["train", "--quiet", "--resume", run_arg];
    let cases = [
        ("model.safetensors", false, &eval[..]),
        ("model.safetensors", true, &eval),
        ("model.safetensors", false, &resume),
        ("optimizer.safetensors", false, &resume),
        ("metrics.jsonl", false, &resume),
    ];
    for (name, device, command) in cases {
        let restore = replaced(name, device);
        let err = fails_promptly(command);
        assert!(
            err.contains("not a regular file") && err.contains(name),
            "{name} for {command:?}: {err}"
        );
        restore();
    }
    let o = attnlab(&resume);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// A language model resumed where its `task.corpus` names other text than it trained on (a
/// path edited, or `auto` on another machine) is refused, naming both.
#[test]
fn resume_refuses_a_language_model_whose_corpus_changed() {
    let out = tempfile::tempdir().unwrap();
    let run = stopped_run(out.path(), "lm_rope", &tiny_lm());
    let other = out.path().join("other.txt");
    std::fs::write(&other, "other text ".repeat(500)).unwrap();
    let preset = run.join("preset.toml");
    let text = std::fs::read_to_string(&preset).unwrap();
    assert!(text.contains("corpus = \"generated\""), "{text}");
    let edited = text.replace(
        "corpus = \"generated\"",
        &format!("corpus = {:?}", other.to_str().unwrap()),
    );
    std::fs::write(&preset, edited).unwrap();
    let o = attnlab(&["train", "--quiet", "--resume", run.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("cannot resume: the run trained on generated: seeded synthetic prose")
            && err.contains(other.to_str().unwrap()),
        "{err}"
    );
}

#[test]
fn curves_compares_run_folders_as_lines_points_and_figures() {
    use attnlab::attention::MechanismSpec;
    use attnlab::encodings::EncodingSpec;
    let root = tempfile::tempdir().unwrap();
    let preset = common::tiny(
        MechanismSpec::Softmax(Default::default()),
        EncodingSpec::Rope(Default::default()),
    );
    let runs = [
        common::trained_run(&preset, root.path()),
        common::trained_run(&preset, root.path()),
    ];
    let names = runs
        .clone()
        .map(|r| r.file_name().unwrap().to_str().unwrap().to_owned());
    assert_ne!(names[0], names[1], "two runs of one preset are told apart");
    let dirs: Vec<&str> = runs.iter().map(|r| r.to_str().unwrap()).collect();

    let o = attnlab(&[&["curves"], &dirs[..]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8(o.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    for (line, name) in lines.iter().zip(&names) {
        assert!(
            line.starts_with(&format!("{name}: softmax / rope, 4 steps, last loss ")),
            "{line}"
        );
        assert!(line.contains("best test accuracy 0."), "{line}");
    }

    let figure = root.path().join("curves.csv");
    let mut args = vec![
        "curves",
        "--format",
        "csv",
        "--figure",
        figure.to_str().unwrap(),
    ];
    args.extend(&dirs);
    let o = attnlab(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let csv = String::from_utf8(o.stdout).unwrap();
    assert!(csv.starts_with("run,curve,step,value\n"), "{csv}");
    for name in &names {
        // Four losses and four learning rates per run, and its evaluations' accuracies.
        assert_eq!(csv.matches(&format!("{name},loss,")).count(), 4, "{csv}");
        assert_eq!(csv.matches(&format!("{name},lr,")).count(), 4, "{csv}");
        assert!(csv.contains(&format!("{name},accuracy,4,")), "{csv}");
    }
    for file in ["curves.csv", "curves-accuracy.csv", "curves-lr.csv"] {
        assert!(root.path().join(file).is_file(), "{file}");
    }

    let o = attnlab(&["curves", dirs[0], root.path().to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("not a run folder (no preset.toml)"),
        "{}",
        stderr(&o)
    );
}

/// A folder in mad-lab's published layout (here: attnlab's own rows written as int64 `.npy`)
/// becomes a preset with `data import-mad`; `data` then shows the folder's rows, ground
/// truth included, and the preset trains on them.
#[test]
fn import_mad_reads_a_published_folder_into_a_preset_that_trains() {
    let tmp = tempfile::tempdir().unwrap();
    let name = "t-CR_vs-16_sl-128_ntr-6_nte-8_km-1_vm-1_mq-1_fn-0#0_nvs-0_ntc-0_s-12345";
    let dir = tmp.path().join(name);
    let rows = |split: &str, n: &str| {
        let o = attnlab(&[
            "data",
            "presets/mad_in_context_recall.toml",
            "--set",
            "task.train_examples=6",
            "--set",
            "task.test_examples=8",
            "--set",
            "train.batch_size=2",
            "--split",
            split,
            "--n",
            n,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    for (split, n) in [("train", 6), ("test", 8)] {
        let generated = rows(split, &n.to_string());
        std::fs::create_dir_all(dir.join(split)).unwrap();
        for (field, file) in [("inputs", "inputs.npy"), ("labels", "targets.npy")] {
            let values: Vec<i64> = generated
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|r| r[field].as_array().unwrap().clone())
                .map(|v| v.as_i64().unwrap())
                .collect();
            let tensor = candle_core::Tensor::from_vec(values, (n, 127), &candle_core::Device::Cpu);
            tensor
                .unwrap()
                .write_npy(dir.join(split).join(file))
                .unwrap();
        }
    }
    let preset = tmp.path().join("imported.toml");
    let dir_arg = dir.to_str().unwrap();
    let o = attnlab(&[
        "data",
        "import-mad",
        dir_arg,
        "--out",
        preset.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("6 training and 8 test rows"),
        "{}",
        stderr(&o)
    );
    // `check` reads the folder as training does: settings that do not describe it fail there.
    let o = attnlab(&["check", preset.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = attnlab(&[
        "check",
        preset.to_str().unwrap(),
        "--set",
        "task.train_examples=7",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("7 rows"), "{}", stderr(&o));
    let o = attnlab(&["data", preset.to_str().unwrap(), "--split", "test"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let read: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(read, rows("test", "4"));
    let out = tmp.path().join("runs");
    let o = attnlab(&[
        "train",
        preset.to_str().unwrap(),
        "--set",
        "train.max_steps=2",
        "--quiet",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // IoU reads the folder's 8 test rows, says so, and refuses a row past them.
    let run = std::fs::read_dir(&out)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let o = attnlab(&["iou", run.to_str().unwrap(), "--examples", "50"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report = String::from_utf8_lossy(&o.stdout);
    assert!(report.contains("mean over 8 test rows"), "{report}");
    let o = attnlab(&["iou", run.to_str().unwrap(), "--example", "10"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("holds 8"), "{}", stderr(&o));
    // A folder whose name the settings cannot come from is refused naming it.
    let o = attnlab(&["data", "import-mad", tmp.path().to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("paths.py"), "{}", stderr(&o));
}

/// The tasks' catalogue, as the editor's picker reads it.
#[test]
fn tasks_lists_the_catalogue() {
    let o = attnlab(&["tasks", "--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let tasks: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<&str> = tasks
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["mqar", "lm", "mad"]);
    assert_eq!(tasks[0]["needs_causal"], false);
    assert_eq!(tasks[0]["defaults"]["num_kv_pairs"], 4);
    assert_eq!(tasks[2]["needs_causal"], true);
}

/// Shipped presets and sweeps work by name from a folder that is not a checkout, as "Copy as
/// CLI command" writes them; a file of that name, where there is one, is read instead.
#[test]
fn shipped_presets_and_sweeps_work_by_name_from_any_folder() {
    let scratch = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_attnlab"))
            .args(args)
            .current_dir(scratch.path())
            .output()
            .unwrap()
    };
    for name in ["mqar_softmax", "presets/mqar_softmax.toml"] {
        let o = run(&["check", name, "--set", "model.d_model=32"]);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        assert!(String::from_utf8_lossy(&o.stdout).contains("d_model = 32"));
    }
    let o = run(&["sweep", "plan", "mad_lite"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 36);
    std::fs::write(scratch.path().join("mqar_softmax"), "not a preset").unwrap();
    let o = run(&["check", "mqar_softmax"]);
    assert!(!o.status.success());
    // A name that is neither a file nor shipped is refused with the shipped names.
    let o = run(&["train", "mad_compresion"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("mad_in_context_recall"),
        "{}",
        stderr(&o)
    );
}
