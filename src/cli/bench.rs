//! `attnlab bench`: training throughput and time to 99% MQAR accuracy on the reference
//! configuration (`presets/bench_mqar.toml`), optionally side by side with the PyTorch
//! references: `../shared/bench/ref_mqar_torch.py` (plain eager, the same model) and, on a GPU,
//! `../shared/bench/ref_mqar_torch_fast.py` (fused attention, TF32, bf16 autocast).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::Context as _;
use serde_json::Value;

use crate::Preset;
use crate::attention::{CATALOGUE, MechanismSpec};
use crate::report::bench::{
    AgainstTiming, BenchReport, FastMode, ReplicaTiming, TargetTime, TorchTiming,
};
use crate::report::{Format, render};
use crate::train::Trainer;

/// The reference configuration, compiled in so `attnlab bench` works from any folder.
pub const REFERENCE_PRESET: &str = include_str!("../../presets/bench_mqar.toml");

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// `json` prints the report as one JSON object, `csv` as one row.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Timed training steps for the step time (after 5 warm-up steps), at most 100000.
    #[arg(long, default_value_t = 30, value_parser = super::bounded(1, 100_000))]
    steps: usize,
    /// Measure the step time only, not the time to 99% accuracy.
    #[arg(long)]
    steps_only: bool,
    /// Benchmark this preset instead of the reference configuration.
    #[arg(long)]
    preset: Option<PathBuf>,
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Also run this PyTorch reference script (ref_mqar_torch.py) and report the ratios.
    #[arg(long, value_name = "SCRIPT")]
    torch: Option<PathBuf>,
    /// Also run the GPU reference (ref_mqar_torch_fast.py) in each of `--torch-modes`.
    #[arg(long, value_name = "SCRIPT")]
    torch_fast: Option<PathBuf>,
    /// Modes of --torch-fast: eager, tf32, bf16, compile.
    #[arg(long, default_value = "eager,tf32,bf16")]
    torch_modes: String,
    /// Also time N replicas of the preset (seeds 0..N, learning rates alternating between the
    /// preset's and three times it) trained as one group, against N steps of one model alone.
    /// At most 64.
    #[arg(long, value_name = "N", value_parser = super::bounded(1, 64))]
    replicas: Option<usize>,
    /// Also time the preset beside this mechanism in its defaults (e.g. `softmax`), the two
    /// trained in alternation in this process (`--rounds` rounds of `--steps` steps each, the
    /// order swapped every round), so that a machine that drifts while it runs weighs on both
    /// alike: on the 2-core development machine the ratio of two separate runs read anywhere
    /// from 1.31 to 1.66 within ten minutes.
    #[arg(long, value_name = "KIND")]
    against: Option<String>,
    /// Rounds of --against, 2 to 1000; an even count puts each mechanism first equally often.
    #[arg(long, default_value_t = 8, requires = "against", value_parser = super::bounded(2, 1000))]
    rounds: usize,
    /// Python interpreter for --torch.
    #[arg(long, default_value = "python3")]
    python: String,
}

/// A trainer of `presets` (one model, or replicas) on their own device: a benchmark that
/// quietly fell back to the CPU would report CPU numbers under the GPU's name, so the fallback
/// notice is an error here.
fn bench_trainer(presets: &[Preset]) -> anyhow::Result<Trainer> {
    let trainer = Trainer::group(presets)?;
    if let Some(notice) = trainer.device_notice() {
        anyhow::bail!("{notice}; not benchmarking the CPU in its place");
    }
    Ok(trainer)
}

/// What the step-time measurement gives.
pub struct StepTime {
    /// Mean milliseconds per step over the timed steps.
    pub ms: f64,
    /// Autograd nodes of one step ([`Trainer::graph_nodes`]).
    pub graph_nodes: usize,
}

/// Measures the mean time of `steps` training steps after 5 warm-up steps.
pub fn step_time(preset: &Preset, steps: usize) -> anyhow::Result<StepTime> {
    group_step_time(std::slice::from_ref(preset), steps)
}

/// [`step_time`] of `presets` trained as replicas of one group: the time of a step of all.
fn group_step_time(presets: &[Preset], steps: usize) -> anyhow::Result<StepTime> {
    let mut trainer = bench_trainer(presets)?;
    for _ in 0..5 {
        trainer.train_step_replicas()?;
    }
    let started = Instant::now();
    for _ in 0..steps {
        trainer.train_step_replicas()?;
    }
    let ms = started.elapsed().as_secs_f64() * 1e3 / steps.max(1) as f64;
    let graph_nodes = trainer.graph_nodes()?;
    Ok(StepTime { ms, graph_nodes })
}

/// `preset` with the mechanism `kind` in its defaults in place of its own (`--against`).
fn against_preset(preset: &Preset, kind: &str) -> anyhow::Result<Preset> {
    let Some(facts) = CATALOGUE.iter().find(|facts| facts.name == kind) else {
        let names: Vec<_> = CATALOGUE.iter().map(|facts| facts.name).collect();
        anyhow::bail!(
            "--against {kind}: not a mechanism; the mechanisms are {}",
            names.join(", ")
        );
    };
    let mut other = preset.clone();
    other.attention = (facts.default)();
    other
        .validate()
        .with_context(|| format!("--against {kind}"))?;
    Ok(other)
}

/// The preset and `other` trained in alternation, each round's milliseconds per step of
/// [preset, other] ([`alternating_rounds`]).
fn alternating_step_times(
    (preset, other): (&Preset, &Preset),
    steps: usize,
    rounds: usize,
) -> anyhow::Result<Vec<[f64; 2]>> {
    let mut trainers = [
        bench_trainer(std::slice::from_ref(preset))?,
        bench_trainer(std::slice::from_ref(other))?,
    ];
    alternating_rounds(
        |which| {
            trainers[which].train_step_replicas()?;
            Ok(())
        },
        steps,
        rounds,
    )
}

/// Each round's milliseconds per step of `step(0)` and `step(1)` (one training step of the
/// first or the second): after 5 warm-up steps of each, `rounds` rounds of `steps` steps of
/// each, the order swapped every round.
fn alternating_rounds(
    mut step: impl FnMut(usize) -> anyhow::Result<()>,
    steps: usize,
    rounds: usize,
) -> anyhow::Result<Vec<[f64; 2]>> {
    for which in [0, 1] {
        for _ in 0..5 {
            step(which)?;
        }
    }
    let mut round_ms = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let mut ms = [0.0; 2];
        for which in [round % 2, 1 - round % 2] {
            let started = Instant::now();
            for _ in 0..steps {
                step(which)?;
            }
            ms[which] = started.elapsed().as_secs_f64() * 1e3 / steps as f64;
        }
        round_ms.push(ms);
    }
    Ok(round_ms)
}

/// `n` cells of `preset`'s shape, as a sweep over seeds and two learning rates makes them.
fn replica_presets(preset: &Preset, n: usize) -> Vec<Preset> {
    (0..n)
        .map(|r| {
            let mut cell = preset.clone();
            cell.train.seed = r as u64;
            if r % 2 == 1 {
                cell.train.lr *= 3.0;
            }
            cell
        })
        .collect()
}

/// Trains with an evaluation per epoch until the preset's target accuracy, like the reference
/// script; returns (seconds including evaluation, epochs) or `None` if it was never reached.
fn time_to_target(preset: &Preset, verbose: bool) -> anyhow::Result<Option<(f64, usize)>> {
    let mut trainer = bench_trainer(std::slice::from_ref(preset))?;
    let started = Instant::now();
    let epochs = preset.train.epochs;
    for epoch in 1..=epochs {
        for _ in 0..trainer.steps_per_epoch() {
            trainer.train_step()?;
        }
        let eval = trainer.evaluate()?;
        let secs = started.elapsed().as_secs_f64();
        if verbose {
            eprintln!(
                "epoch {epoch:>3}  test acc {:>6.2}%  {secs:>7.1} s",
                100.0 * eval.accuracy
            );
        }
        if eval.accuracy >= preset.train.target_accuracy {
            return Ok(Some((secs, epoch)));
        }
    }
    Ok(None)
}

/// The reference script's arguments for the preset's model, data and schedule, so an
/// overridden configuration (e.g. `--set model.d_model=512`) is compared with the same one.
/// The script's model is always softmax attention with learned positions.
fn torch_args(preset: &Preset) -> Vec<String> {
    let (m, t) = (&preset.model, &preset.train);
    let mut args = vec![
        (
            "--threads",
            candle_core::utils::get_num_threads().to_string(),
        ),
        ("--d", m.d_model.to_string()),
        ("--heads", m.n_heads.to_string()),
        ("--layers", m.n_layers.to_string()),
        ("--batch", t.batch_size.to_string()),
        ("--lr", t.lr.to_string()),
        ("--epochs", t.epochs.to_string()),
    ];
    if let Some(mqar) = preset.task.mqar() {
        args.push(("--T", mqar.seq_len.to_string()));
        args.push(("--kv", mqar.num_kv_pairs.to_string()));
        args.push(("--vocab", mqar.vocab_size.to_string()));
    }
    // Any mechanism but full softmax goes as its [attention] table, for a reference that ports
    // it (scripts/ref_mqar_torch_mixers.py); the softmax references refuse the flag, so a
    // mixer is never timed against softmax by mistake.
    if preset.attention != MechanismSpec::Softmax(Default::default()) {
        let table = serde_json::to_value(&preset.attention).unwrap_or_default();
        args.push(("--mixer", table.to_string()));
    }
    args.into_iter()
        .flat_map(|(key, value)| [key.to_string(), value])
        .collect()
}

/// The fast GPU reference's arguments: the model and data of [`torch_args`] (it takes no
/// thread count, learning rate or epochs) and the modes to run.
fn torch_fast_args(preset: &Preset, modes: &str) -> Vec<String> {
    let keep = [
        "--d", "--heads", "--layers", "--batch", "--T", "--kv", "--vocab",
    ];
    let args = torch_args(preset);
    let mut kept: Vec<String> = args
        .chunks(2)
        .filter(|pair| keep.contains(&pair[0].as_str()))
        .flatten()
        .cloned()
        .collect();
    kept.extend(["--modes".to_string(), modes.to_string()]);
    kept
}

/// Runs a PyTorch script with `args` and returns every JSON line it printed.
fn run_torch(python: &str, script: &Path, args: &[String]) -> anyhow::Result<Vec<Value>> {
    let output = Command::new(python)
        .arg(script)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {python} {}", script.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    anyhow::ensure!(
        output.status.success(),
        "{} failed: {}",
        script.display(),
        String::from_utf8_lossy(&output.stderr).trim()
    );
    let lines: Vec<Value> = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with('{'))
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    anyhow::ensure!(!lines.is_empty(), "{} printed no JSON", script.display());
    Ok(lines)
}

/// The last JSON line of the plain reference script.
fn run_torch_last(
    python: &str,
    script: &Path,
    preset: &Preset,
    extra: &[&str],
) -> anyhow::Result<Value> {
    let mut args = torch_args(preset);
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut lines = run_torch(python, script, &args)?;
    Ok(lines.pop().unwrap_or_default())
}

pub fn bench(args: &BenchArgs) -> anyhow::Result<()> {
    let preset = match &args.preset {
        Some(path) => crate::experiments::load_preset(path, &args.overrides)?,
        None => Preset::parse(
            REFERENCE_PRESET,
            &args.overrides,
            Path::new("presets/bench_mqar.toml"),
        )?,
    };
    let report = measure(&preset, args)?;
    out!("{}", render(&report, args.format)?);
    Ok(())
}

/// Every measurement `args` asks for, on `preset`.
fn measure(preset: &Preset, args: &BenchArgs) -> anyhow::Result<BenchReport> {
    // Refused before any measurement, which can take minutes.
    let against = match args.against.as_deref() {
        Some(kind) => Some((kind, against_preset(preset, kind)?)),
        None => None,
    };
    let measured = step_time(preset, args.steps)?;
    let ms = measured.ms;
    let tokens = (preset.train.batch_size * preset.task.seq_len()) as f64;
    let mut report = BenchReport {
        config: preset.name.clone(),
        device: preset.train.device.to_string(),
        precision: preset.train.precision.name().to_string(),
        threads: candle_core::utils::get_num_threads(),
        ms_per_step: ms,
        tokens_per_s: tokens / (ms / 1e3),
        graph_nodes: measured.graph_nodes,
        replicas: None,
        against: None,
        target: None,
        torch: None,
        step_ratio: None,
        time_to_99_ratio: None,
        torch_fast: Default::default(),
    };
    if let Some((kind, other)) = against {
        let rounds = alternating_step_times((preset, &other), args.steps, args.rounds)?;
        report.against = Some(AgainstTiming::of(kind, &rounds));
    }
    if let Some(n) = args.replicas {
        let group = group_step_time(&replica_presets(preset, n), args.steps)?;
        report.replicas = Some(ReplicaTiming {
            n,
            ms_per_group_step: group.ms,
            ms_per_model_step: group.ms / n as f64,
            speedup: n as f64 * ms / group.ms,
        });
    }
    if !args.steps_only {
        let reached = time_to_target(preset, args.format == Format::Text)?;
        report.target = Some(TargetTime {
            accuracy: preset.train.target_accuracy,
            epochs: preset.train.epochs,
            time_to_99_s: reached.map(|r| r.0),
            epochs_to_99: reached.map(|r| r.1),
        });
    }
    if let Some(script) = &args.torch {
        torch_reference(&mut report, preset, args, script)?;
    }
    if let Some(script) = &args.torch_fast {
        let fast_args = torch_fast_args(preset, &args.torch_modes);
        for mode in run_torch(&args.python, script, &fast_args)? {
            let (Some(name), Some(torch_ms)) =
                (mode["mode"].as_str(), mode["ms_per_step"].as_f64())
            else {
                continue;
            };
            let timing = FastMode {
                ms_per_step: torch_ms,
                ratio: ms / torch_ms,
            };
            report.torch_fast.insert(name.to_string(), timing);
        }
    }
    Ok(report)
}

/// The plain PyTorch reference `script` on `preset`, and attnlab's ratios to it.
fn torch_reference(
    report: &mut BenchReport,
    preset: &Preset,
    args: &BenchArgs,
    script: &Path,
) -> anyhow::Result<()> {
    let steps = run_torch_last(&args.python, script, preset, &["--steps-only"])?;
    report.step_ratio = steps["ms_per_step"]
        .as_f64()
        .map(|torch_ms| report.ms_per_step / torch_ms);
    let mut torch = TorchTiming {
        ms_per_step: steps["ms_per_step"].clone(),
        time_to_99_s: None,
    };
    if !args.steps_only {
        let full = run_torch_last(&args.python, script, preset, &[])?;
        let ours = report.target.as_ref().and_then(|t| t.time_to_99_s);
        report.time_to_99_ratio = ours
            .zip(full["time_to_99_s"].as_f64())
            .map(|(ours, theirs)| ours / theirs);
        torch.time_to_99_s = Some(full["time_to_99_s"].clone());
    }
    report.torch = Some(torch);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(overrides: &[String]) -> Preset {
        Preset::parse(REFERENCE_PRESET, overrides, Path::new("bench_mqar.toml")).unwrap()
    }

    /// The reference preset gives the reference script's own defaults, overrides follow.
    #[test]
    fn torch_gets_the_presets_configuration() {
        let args = torch_args(&reference(&[])).join(" ");
        let defaults = "--d 128 --heads 2 --layers 2 --batch 64 --lr 0.001 --epochs 40 --T 64 --kv 4 --vocab 256";
        assert!(args.ends_with(defaults), "{args}");
        let larger = [
            "model.d_model=512",
            "task.seq_len=1024",
            "task.vocab_size=2048",
        ];
        let larger = reference(&larger.map(String::from));
        let args = torch_args(&larger).join(" ");
        assert!(
            args.contains("--d 512 ") && args.contains("--T 1024 "),
            "{args}"
        );
    }

    /// A mixer goes to the PyTorch reference as its [attention] table.
    #[test]
    fn torch_gets_a_mixer_as_its_attention_table() {
        let plain = torch_args(&reference(&[])).join(" ");
        assert!(!plain.contains("--mixer"), "{plain}");
        let set = ["attention.kind=\"retention\"", "attention.chunk=32"].map(String::from);
        let args = torch_args(&reference(&set));
        let at = args.iter().position(|a| a == "--mixer").expect("--mixer");
        let table: Value = serde_json::from_str(&args[at + 1]).unwrap();
        assert_eq!(table["kind"], "retention");
        assert_eq!(table["chunk"], 32);
    }

    /// Both are warmed up, then each round times `steps` steps of each, the first of the
    /// previous round second; each time lands in its own slot whichever ran first.
    #[test]
    fn alternating_rounds_swap_the_order_and_keep_each_time_in_its_slot() {
        let mut order = Vec::new();
        let rounds = alternating_rounds(
            |which| {
                order.push(which);
                // The second takes longer, so its slot must hold the longer time.
                std::thread::sleep(std::time::Duration::from_millis(4 * which as u64));
                Ok(())
            },
            2,
            3,
        )
        .unwrap();
        let warm_up = [0; 5].into_iter().chain([1; 5]);
        let timed = [0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1];
        assert_eq!(order, warm_up.chain(timed).collect::<Vec<_>>());
        assert_eq!(rounds.len(), 3);
        for [first, second] in rounds {
            assert!(second >= 4.0 && first < second, "{first} ms, {second} ms");
        }
    }

    /// The fast reference takes the model and data only (it has no --threads, --lr or
    /// --epochs), then the modes.
    #[test]
    fn torch_fast_gets_the_model_and_the_modes() {
        let args = torch_fast_args(&reference(&[]), "tf32,bf16").join(" ");
        assert_eq!(
            args,
            "--d 128 --heads 2 --layers 2 --batch 64 --T 64 --kv 4 --vocab 256 --modes tf32,bf16"
        );
    }
}
