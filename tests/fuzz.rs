//! Fuzzing what users type and what run folders hold, so the fixes of issue 19 stay fixed:
//! a few hundred shipped presets with mutated `--set` values go through validation and the
//! memory estimate (and the small accepted ones through a training step), and every file of a
//! trained run folder, corrupted in turn, goes through every analysis. Nothing may panic;
//! errors are the expected outcome. Deterministic (a fixed seed), so a failure reproduces.

#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use attnlab::Preset;
use attnlab::analysis::iou::{IouProtocol, run_iou};
use attnlab::analysis::spectrum::{SpectrumProtocol, run_spectrum};
use attnlab::analysis::{ErfProtocol, Heads, Rows, StudiedEncoding, TrainedRun};
use attnlab::report::encodings::ErfReport;
use attnlab::train::{RunDir, Trainer};

/// xorshift64*: enough randomness for picking mutations, and the same picks on every machine.
struct Picks(u64);

impl Picks {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }

    fn of<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Values a user might type (or a script might produce) for any key.
const VALUES: &[&str] = &[
    "-1",
    "0",
    "1",
    "2",
    "3",
    "64",
    "4096",
    "65537",
    "2147483648",
    "9223372036854775807",
    "18446744073709551615",
    "1e12",
    "-0.5",
    "0.5",
    "1e-320",
    "nan",
    "inf",
    "-inf",
    "true",
    "\"\"",
    "\"x\"",
    "\"../../x\"",
    "\"a\\u0000b\"",
    "[]",
    "{}",
    "[\"attention\", \"short-conv\"]",
    "{ kind = \"rebased\" }",
    "{ kind = \"linformer\", proj_dim = 0 }",
    "{ kind = \"nope\" }",
];

/// Every dotted leaf key of `table`, and each tagged section as a whole.
fn keys(prefix: &str, table: &toml::Table, out: &mut Vec<String>) {
    for (key, value) in table {
        let path = match prefix {
            "" => key.clone(),
            _ => format!("{prefix}.{key}"),
        };
        if let toml::Value::Table(inner) = value {
            out.push(path.clone());
            keys(&path, inner, out);
        } else {
            out.push(path);
        }
    }
}

const BASES: [&str; 4] = [
    "presets/mqar_softmax.toml",
    "presets/mqar_rebased.toml",
    "presets/lm_rope.toml",
    "presets/mqar_linformer.toml",
];

fn base(path: &str) -> (String, Vec<String>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    let text = std::fs::read_to_string(&path).unwrap();
    let table: toml::Table = Preset::parse(&text, &[], &path)
        .unwrap()
        .to_toml()
        .unwrap()
        .parse()
        .unwrap();
    let mut found = Vec::new();
    keys("", &table, &mut found);
    (text, found)
}

/// Parses, validates and estimates `text` with `overrides`; a step of training when it is
/// accepted and small. Returns whether it was accepted.
fn try_preset(text: &str, overrides: &[String], trainings: &mut usize) -> bool {
    let origin = Path::new("fuzz.toml");
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let Ok(mut preset) = Preset::parse(text, overrides, origin) else {
            return false;
        };
        let Ok(estimate) = preset.check_fits(Some(4e9)) else {
            return true;
        };
        if *trainings < 8 && estimate.total() < 160e6 {
            *trainings += 1;
            preset.train.max_steps = Some(1);
            if let Ok(mut trainer) = Trainer::new(&preset) {
                let _ = trainer.train_step();
            }
        }
        true
    }));
    outcome.unwrap_or_else(|_| panic!("panicked on --set {}", overrides.join(" --set ")))
}

#[test]
fn mutated_presets_are_accepted_or_refused_without_a_panic() {
    let bases: Vec<_> = BASES.iter().map(|p| base(p)).collect();
    let mut picks = Picks(0x5eed_1234_abcd_ef01);
    let (mut accepted, mut trainings) = (0, 0);
    let cases = 400;
    for _ in 0..cases {
        let (text, keys) = picks.of(&bases);
        let overrides: Vec<String> = (0..1 + picks.below(3))
            .map(|_| format!("{}={}", picks.of(keys), picks.of(VALUES)))
            .collect();
        if try_preset(text, &overrides, &mut trainings) {
            accepted += 1;
        }
    }
    // Both outcomes happen, so the test exercises validation and what follows it.
    assert!(
        accepted > 10 && accepted < cases,
        "{accepted} of {cases} accepted"
    );
    assert!(
        trainings > 0,
        "no accepted preset was small enough to train"
    );
}

/// Ways a file can be damaged: emptied, cut in half, overwritten with other bytes.
fn corruptions(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut garbage = bytes.to_vec();
    for (i, b) in garbage.iter_mut().enumerate().skip(8) {
        *b = (i as u8).wrapping_mul(31) ^ 0x5a;
    }
    vec![Vec::new(), bytes[..bytes.len() / 2].to_vec(), garbage]
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// Every analysis of the run folder at `dir`; errors are fine, panics are not.
fn analyse(dir: &Path) {
    let cancel = AtomicBool::new(false);
    let Ok(run) = RunDir::open(dir) else { return };
    let _ = run.read_preset();
    let _ = run.read_metrics();
    let _ = run.read_summary();
    let _ = run.read_attention_index();
    let _ = StudiedEncoding::from_run(&run, None);
    let protocol = ErfProtocol {
        layer: None,
        heads: Heads::Mean,
        rows: Rows::All,
    };
    let _ = ErfReport::new(&run, protocol, 5);
    if let Ok(trained) = TrainedRun::open(dir) {
        let iou = IouProtocol {
            examples: 8,
            ..IouProtocol::default()
        };
        let _ = run_iou(&trained, &iou, &mut |_| {}, &cancel);
        let spectrum = SpectrumProtocol {
            examples: 4,
            ..SpectrumProtocol::default()
        };
        let _ = run_spectrum(&trained, &spectrum, &mut |_| {}, &cancel);
    }
}

#[test]
fn corrupted_run_folder_files_give_errors_not_panics() {
    let root = tempfile::tempdir().unwrap();
    let preset = common::tiny(
        attnlab::attention::MechanismSpec::Softmax(Default::default()),
        attnlab::encodings::EncodingSpec::Learned(Default::default()),
    );
    let dir = common::trained_run(&preset, root.path());
    let mut originals = Vec::new();
    files(&dir, &mut originals);
    assert!(originals.len() >= 6, "{originals:?}");
    for original in &originals {
        let relative = original.strip_prefix(&dir).unwrap();
        for (i, damaged) in corruptions(&std::fs::read(original).unwrap())
            .into_iter()
            .enumerate()
        {
            let copy = root.path().join(format!("copy-{i}"));
            let _ = std::fs::remove_dir_all(&copy);
            copy_dir(&dir, &copy);
            std::fs::write(copy.join(relative), damaged).unwrap();
            let outcome = catch_unwind(AssertUnwindSafe(|| analyse(&copy)));
            assert!(
                outcome.is_ok(),
                "an analysis panicked on {} (corruption {i})",
                relative.display()
            );
        }
    }
}
