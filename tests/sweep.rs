//! Sweeps: the grid trains once, a resumed sweep does not retrain finished cells, a planned
//! command trains exactly its cell, and collect merges the folders.

#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

mod common;

use std::path::Path;
use std::sync::atomic::AtomicBool;

use attnlab::sweep::{Sweep, SweepEvent, run_sweep};
use attnlab::train::TrainEvent;
use common::{TINY, attnlab, stderr};

/// A sweep file in `dir` over `axes`, on the softmax preset made tiny.
fn sweep_file(dir: &Path, axes: &str) -> std::path::PathBuf {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("presets/mqar_softmax.toml");
    let set: Vec<String> = TINY
        .iter()
        .filter(|w| **w != "--set")
        .map(|w| format!("{w:?}"))
        .collect();
    let text = format!(
        "name = \"t\"\nbase = {:?}\nout = {:?}\nset = [{}]\n[axes]\n{axes}\n",
        base,
        dir.join("out"),
        set.join(", ")
    );
    let path = dir.join("sweep.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Runs the sweep; returns the ids of skipped and of trained cells.
fn run(sweep: &Sweep) -> (Vec<String>, Vec<String>) {
    let (mut skipped, mut trained) = (Vec::new(), Vec::new());
    run_sweep(sweep, &AtomicBool::new(false), &mut |event| match event {
        SweepEvent::Skipped { cell, .. } => skipped.push(sweep.cells[cell].id.clone()),
        SweepEvent::Train {
            cell,
            event: TrainEvent::Finished(_),
        } => trained.push(sweep.cells[cell].id.clone()),
        _ => {}
    })
    .unwrap();
    skipped.sort();
    trained.sort();
    (skipped, trained)
}

#[test]
fn a_resumed_sweep_trains_only_unfinished_cells() {
    let dir = tempfile::tempdir().unwrap();
    let mut sweep =
        Sweep::load(&sweep_file(dir.path(), "lr = [1e-3, 3e-3]\nseed = [0, 1]")).unwrap();
    sweep.workers = 2;
    let ids: Vec<String> = sweep.cells.iter().map(|c| c.id.clone()).collect();
    assert_eq!(
        ids,
        ["lr0.001-s0", "lr0.001-s1", "lr0.003-s0", "lr0.003-s1"]
    );
    let (skipped, trained) = run(&sweep);
    assert!(skipped.is_empty());
    assert_eq!(trained.len(), 4);

    // One cell was interrupted (its summary says stopped), one lost its folder.
    let stopped = sweep.finished_run(&sweep.cells[1]).unwrap().unwrap();
    let summary = stopped.join("summary.json");
    let text = std::fs::read_to_string(&summary).unwrap();
    std::fs::write(&summary, text.replace("\"completed\"", "\"stopped\"")).unwrap();
    std::fs::remove_dir_all(sweep.cell_dir(&sweep.cells[2])).unwrap();

    let (skipped, trained) = run(&sweep);
    assert_eq!(skipped, ["lr0.001-s0", "lr0.003-s1"]);
    assert_eq!(trained, ["lr0.001-s1", "lr0.003-s0"]);
    let folders = |cell: usize| {
        std::fs::read_dir(sweep.cell_dir(&sweep.cells[cell]))
            .unwrap()
            .count()
    };
    assert_eq!(folders(0), 1, "a finished cell is not trained again");
    assert_eq!(folders(1), 2, "the stopped run stays beside the new one");

    let summary = attnlab::sweep::collect(&[sweep.out.clone()]).unwrap();
    assert_eq!(summary.runs.len(), 4);
    assert_eq!(summary.points.len(), 1, "one mechanism, length and width");
    assert_eq!(summary.points[0].seeds, 2);
    assert_eq!(summary.points[0].by_lr.len(), 2);
    assert!(summary.unreadable.is_empty());
    // The stopped run that a finished one replaced is no loss; a cell whose only run did not
    // finish is named, with its status.
    assert!(summary.unfinished.is_empty(), "{:?}", summary.unfinished);
    let only = sweep.finished_run(&sweep.cells[0]).unwrap().unwrap();
    let finished = std::fs::read_to_string(only.join("summary.json")).unwrap();
    let stopped = finished.replace("\"completed\"", "\"stopped\"");
    std::fs::write(only.join("summary.json"), stopped).unwrap();
    let summary = attnlab::sweep::collect(&[sweep.out.clone()]).unwrap();
    assert_eq!(summary.runs.len(), 3);
    assert_eq!(summary.unfinished.len(), 1, "{:?}", summary.unfinished);
    let name = only.file_name().unwrap().to_string_lossy();
    assert!(
        summary.unfinished[0].contains(&*name),
        "{:?}",
        summary.unfinished
    );
    assert!(
        summary.unfinished[0].contains("stopped"),
        "{:?}",
        summary.unfinished
    );
    // Its summary alone says it has not finished: a preset that no longer reads leaves it
    // unfinished, not unreadable.
    let preset = std::fs::read_to_string(only.join("preset.toml")).unwrap();
    std::fs::write(only.join("preset.toml"), "[model\n").unwrap();
    let summary = attnlab::sweep::collect(&[sweep.out.clone()]).unwrap();
    assert!(summary.unreadable.is_empty(), "{:?}", summary.unreadable);
    assert_eq!(summary.unfinished.len(), 1, "{:?}", summary.unfinished);
    std::fs::write(only.join("preset.toml"), preset).unwrap();
    std::fs::write(only.join("summary.json"), finished).unwrap();

    // A run whose summary no longer reads is named and left out; the others still count.
    let broken = sweep.finished_run(&sweep.cells[3]).unwrap().unwrap();
    std::fs::write(broken.join("summary.json"), "{ not json").unwrap();
    let summary = attnlab::sweep::collect(&[sweep.out.clone()]).unwrap();
    assert_eq!(summary.runs.len(), 3);
    assert_eq!(summary.unreadable.len(), 1);
    let name = broken.file_name().unwrap().to_string_lossy();
    assert!(
        summary.unreadable[0].contains(&*name),
        "{:?}",
        summary.unreadable
    );
}

#[test]
fn a_changed_sweep_does_not_take_the_old_runs_for_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let path = sweep_file(dir.path(), "lr = [1e-3]");
    let sweep = Sweep::load(&path).unwrap();
    let (_, trained) = run(&sweep);
    assert_eq!(trained, ["lr0.001"]);
    // The same cell and folder, another mechanism in `set`: the softmax run is not linear
    // attention's result, and training the cell again would mix the two in one folder.
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace("]\n[axes]", ", \"attention.kind=linear\"]\n[axes]"),
    )
    .unwrap();
    let changed = Sweep::load(&path).unwrap();
    let error = changed
        .finished_run(&changed.cells[0])
        .unwrap_err()
        .to_string();
    for part in [
        "cell lr0.001",
        "attention",
        "linear",
        "its own `out` folder",
    ] {
        assert!(error.contains(part), "{part:?} in {error}");
    }
    let stop = AtomicBool::new(false);
    assert!(run_sweep(&changed, &stop, &mut |_| {}).is_err());
    let o = attnlab(&["sweep", "plan", path.to_str().unwrap(), "--pending"]);
    assert!(
        !o.status.success() && stderr(&o).contains("another preset"),
        "{}",
        stderr(&o)
    );

    // What names a run may differ: a run renamed in the window is still the cell's.
    let (skipped, _) = run(&sweep);
    assert_eq!(
        skipped,
        ["lr0.001"],
        "the unchanged sweep still finds its run"
    );
    let run_dir = sweep.finished_run(&sweep.cells[0]).unwrap().unwrap();
    let saved = run_dir.join("preset.toml");
    let text = std::fs::read_to_string(&saved).unwrap();
    let renamed = text.replacen("name = \"t-lr0.001\"", "name = \"renamed\"", 1);
    assert_ne!(renamed, text);
    std::fs::write(&saved, renamed).unwrap();
    assert_eq!(sweep.finished_run(&sweep.cells[0]).unwrap(), Some(run_dir));
}

#[test]
fn planned_commands_train_their_cell_and_collect_merges_them() {
    let dir = tempfile::tempdir().unwrap();
    let file = sweep_file(
        dir.path(),
        "mechanism = [\"softmax\", { kind = \"based\", feature_dim = 4 }]\nseed = [3]",
    );
    let o = attnlab(&["sweep", "plan", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let plan = String::from_utf8(o.stdout).unwrap();
    let commands: Vec<&str> = plan.lines().collect();
    assert_eq!(commands.len(), 2);
    assert!(commands[1].contains("--set attention=based --set attention.feature_dim=4"));
    // No quotes or backslashes: xargs (which strips them), GNU parallel and a Slurm array
    // reading line N all pass the line on unchanged.
    assert!(!plan.contains(['\'', '"', '\\']), "{plan}");
    // Run the second command as `sweep plan | xargs -I{} sh -c '{}'` does.
    let command = commands[1].replacen("attnlab", env!("CARGO_BIN_EXE_attnlab"), 1);
    let mut xargs = std::process::Command::new("xargs")
        .args(["-I{}", "sh", "-c", "{}"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    writeln!(xargs.stdin.take().unwrap(), "{command}").unwrap();
    assert!(xargs.wait().unwrap().success());
    let sweep = Sweep::load(&file).unwrap();
    let run = sweep.finished_run(&sweep.cells[1]).unwrap().unwrap();
    let trained = attnlab::Preset::load(&run.join("preset.toml"), &[]).unwrap();
    assert_eq!(
        trained,
        sweep.preset(&sweep.cells[1]).unwrap(),
        "the plan's preset is the sweep's"
    );
    assert!(sweep.finished_run(&sweep.cells[0]).unwrap().is_none());
    let o = attnlab(&["sweep", "plan", file.to_str().unwrap(), "--pending"]);
    assert_eq!(String::from_utf8(o.stdout).unwrap().lines().count(), 1);

    let out = dir.path().join("out");
    let o = attnlab(&["sweep", "collect", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = String::from_utf8(o.stdout).unwrap();
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[..4], ["based", "16", "2", "16"], "{table}");
    assert!(out.join("summary.json").is_file());
    assert!(out.join("accuracy-L16-N2.svg").is_file());
}

/// A batch job's log (stderr not a terminal) gets one line per cell with the running count,
/// the ETA while work is left, and each cell's accuracy and seconds.
#[test]
fn the_sweep_logs_a_line_per_cell_without_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let file = sweep_file(dir.path(), "seed = [0, 1]");
    // One cell after the other: two side by side can both end their last step before the
    // first one's line, with no work left to time.
    let one_by_one = ["--workers", "1", "--replicas", "1"];
    let o = attnlab(&[&["sweep", file.to_str().unwrap()][..], &one_by_one].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let log = stderr(&o);
    let lines: Vec<&str> = log.lines().filter(|l| l.starts_with('[')).collect();
    assert_eq!(lines.len(), 2, "{log}");
    assert!(lines[0].starts_with("[1/2, ETA "), "{log}");
    assert!(lines[1].starts_with("[2/2] "), "{log}");
    for cell in ["s0: ", "s1: "] {
        assert_eq!(
            lines.iter().filter(|l| l.contains(cell)).count(),
            1,
            "{log}"
        );
    }
    assert!(
        lines
            .iter()
            .all(|l| l.contains("best test accuracy") && l.ends_with(" s"))
    );
    let again = stderr(&attnlab(&["sweep", file.to_str().unwrap()]));
    assert!(again.contains("[1/2] s0: done already"), "{again}");
}

/// `RAYON_NUM_THREADS` bounds a sweep's threads as it bounds a run's: a sweep used to split all
/// the cores among its workers whatever it said, so two sweeps side by side, each asked to keep
/// to one core, took turns on both. (On one core both split one thread: CI has two.)
#[test]
fn a_sweep_keeps_to_the_threads_rayon_num_threads_gives_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = sweep_file(dir.path(), "seed = [0]");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_attnlab"))
        .args(["sweep", file.to_str().unwrap()])
        .env("RAYON_NUM_THREADS", "1")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let log = stderr(&o);
    assert!(log.contains("1 at a time on 1 thread(s) each"), "{log}");
}

/// Cells of one shape train as one group of replicas, and each ends exactly where it ends
/// when the sweep trains cell by cell (`replicas = 1`): same steps, same accuracy, same loss.
#[test]
fn same_shape_cells_train_as_one_group_with_the_results_of_cell_by_cell() {
    let results = |replicas: usize| {
        let dir = tempfile::tempdir().unwrap();
        let axes = "mechanism = [\"softmax\", \"based\"]\nlr = [1e-3, 3e-3]\nseed = [0, 1]";
        let mut sweep = Sweep::load(&sweep_file(dir.path(), axes)).unwrap();
        sweep.replicas = replicas;
        sweep.workers = 2; // one group per mechanism, whatever the cores
        let mut groups = Vec::new();
        run_sweep(&sweep, &AtomicBool::new(false), &mut |event| {
            if let SweepEvent::GroupStarted { cells } = event {
                groups.push(cells);
            }
        })
        .unwrap();
        let summaries: Vec<attnlab::train::Summary> = sweep
            .cells
            .iter()
            .map(|cell| {
                let run = sweep.finished_run(cell).unwrap().unwrap();
                attnlab::train::RunDir::open(&run)
                    .unwrap()
                    .read_summary()
                    .unwrap()
            })
            .collect();
        groups.sort();
        (groups, summaries)
    };
    let (grouped, together) = results(8);
    assert_eq!(
        grouped,
        [vec![0, 1, 2, 3], vec![4, 5, 6, 7]],
        "a group per mechanism"
    );
    let (alone, one_by_one) = results(1);
    assert_eq!(alone.len(), 8);
    for (a, b) in together.iter().zip(&one_by_one) {
        assert_eq!((a.replicas, b.replicas), (Some(4), None), "{}", a.name);
        assert_eq!((a.status, a.steps), (b.status, b.steps), "{}", a.name);
        assert!(
            (a.best_accuracy.unwrap() - b.best_accuracy.unwrap()).abs() < 1e-9,
            "{}",
            a.name
        );
        let (la, lb) = (a.last_loss.unwrap(), b.last_loss.unwrap());
        assert!(
            (la - lb).abs() < 1e-4 * (1.0 + lb.abs()),
            "{}: {la} vs {lb}",
            a.name
        );
    }
}

/// `attnlab sweep FILE --cells GLOB` trains the cells whose names match, whatever the
/// grouping, and names what is wrong with a pattern that matches none or does not parse.
#[test]
fn a_glob_trains_the_cells_it_names() {
    let dir = tempfile::tempdir().unwrap();
    let file = sweep_file(
        dir.path(),
        "mechanism = [\"softmax\", \"based\"]\nseed = [0, 1]",
    );
    let path = file.to_str().unwrap();
    let o = attnlab(&["sweep", path, "--cells", "based-*", "--replicas", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let sweep = Sweep::load(&file).unwrap();
    let finished: Vec<(&str, bool)> = (sweep.cells.iter())
        .map(|c| (c.id.as_str(), sweep.finished_run(c).unwrap().is_some()))
        .collect();
    let want = [
        ("softmax-s0", false),
        ("softmax-s1", false),
        ("based-s0", true),
        ("based-s1", true),
    ];
    assert_eq!(finished, want);
    let o = attnlab(&["sweep", path, "--cells", "rebased-*"]);
    assert!(
        stderr(&o).contains(
            "cells (--cells) rebased-* matches none of the 4 cells of sweep t, \
             named like softmax-s0, softmax-s1, based-s0, …"
        ),
        "{}",
        stderr(&o)
    );
    let o = attnlab(&["sweep", path, "--cells", "["]);
    assert!(
        stderr(&o).contains("[ is not a glob pattern"),
        "{}",
        stderr(&o)
    );
}

/// `sweep plan --groups` prints one command per group of replicas; each, run as a scheduler
/// runs it (through xargs), trains exactly its group's cells.
#[test]
fn planned_groups_train_their_cells() {
    let dir = tempfile::tempdir().unwrap();
    let file = sweep_file(
        dir.path(),
        "mechanism = [\"softmax\", \"based\"]\nseed = [0, 1]",
    );
    let o = attnlab(&["sweep", "plan", file.to_str().unwrap(), "--groups"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let plan = String::from_utf8(o.stdout).unwrap();
    let commands: Vec<&str> = plan.lines().collect();
    assert_eq!(commands.len(), 2, "{plan}");
    assert!(
        commands[1].contains("--group 2 --replicas 8 --workers 1  # cells: based-s0 based-s1"),
        "{plan}"
    );
    assert!(!plan.contains(['\'', '"', '\\']), "{plan}");
    let command = commands[1].replacen("attnlab", env!("CARGO_BIN_EXE_attnlab"), 1);
    let mut xargs = std::process::Command::new("xargs")
        .args(["-I{}", "sh", "-c", "{}"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    writeln!(xargs.stdin.take().unwrap(), "{command}").unwrap();
    let done = xargs.wait_with_output().unwrap();
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let sweep = Sweep::load(&file).unwrap();
    let finished: Vec<bool> = sweep
        .cells
        .iter()
        .map(|c| sweep.finished_run(c).unwrap().is_some())
        .collect();
    assert_eq!(
        finished,
        [false, false, true, true],
        "group 2 is based's two seeds"
    );
    let o = attnlab(&[
        "sweep",
        "plan",
        file.to_str().unwrap(),
        "--groups",
        "--pending",
    ]);
    assert_eq!(String::from_utf8(o.stdout).unwrap().lines().count(), 1);
    let o = attnlab(&["sweep", file.to_str().unwrap(), "--group", "3"]);
    assert!(
        stderr(&o).contains("group (--group) 3 does not exist: sweep")
            && stderr(&o).contains("has groups 1 to 2\n"),
        "{}",
        stderr(&o)
    );
}
