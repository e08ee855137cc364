//! `attnlab train`: a progress bar over the worker's events.

use std::path::Path;
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};

use super::signals;
use crate::preset::MemoryEstimate;
use crate::train::{RunDir, Summary, TrainEvent, TrainHandle, spawn, spawn_resume};

pub fn train(path: &Path, overrides: &[String], out: &Path, quiet: bool) -> anyhow::Result<()> {
    let preset = crate::experiments::load_preset(path, overrides)?;
    let estimate = preset.check_fits_here()?;
    follow(spawn(preset, out.to_path_buf(), || {}), &estimate, quiet)
}

/// `attnlab train --resume RUN`: the stopped or crashed run goes on in its folder.
pub fn resume(run_dir: &Path, quiet: bool) -> anyhow::Result<()> {
    let estimate = RunDir::open(run_dir)?.read_preset()?.check_fits_here()?;
    follow(spawn_resume(run_dir.to_path_buf(), || {}), &estimate, quiet)
}

/// Shows a training's progress until it ends; Ctrl-C or SIGTERM stops it after its step.
fn follow(handle: TrainHandle, estimate: &MemoryEstimate, quiet: bool) -> anyhow::Result<()> {
    signals::install();
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(0)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} steps (eta {eta}) {msg}",
        )
        .context("progress bar template")?,
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let mut last_accuracy = None;
    let mut last_loss = f32::NAN;
    let mut tokens_per_s = 0f64;
    let mut stopping = false;
    loop {
        // Checked before every event, not only when none came for a while: steps faster than
        // the timeout would otherwise never let a Ctrl-C through.
        if signals::interrupted() && !stopping {
            stopping = true;
            inform(&bar, "stopping after this step (Ctrl-C again ends at once)");
            handle.stop();
        }
        let event = match handle.events.recv_timeout(Duration::from_millis(100)) {
            Ok(event) => event,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        match event {
            TrainEvent::Started {
                run_dir,
                total_steps,
                n_params,
                device_notice,
                precision_note,
                corpus,
                ..
            } => {
                if let Some(notice) = device_notice {
                    inform(&bar, &format!("warning: {notice}"));
                }
                if let Some(note) = precision_note {
                    inform(&bar, &format!("note: {note}"));
                }
                bar.set_length(total_steps as u64);
                inform(
                    &bar,
                    &format!("run folder {} ({n_params} parameters)", run_dir.display()),
                );
                if let Some(corpus) = corpus {
                    inform(&bar, &format!("text: {corpus}"));
                }
            }
            TrainEvent::Step(s) => {
                bar.set_position(s.step as u64);
                last_loss = s.loss;
                // Exponential average so the display does not flicker.
                tokens_per_s = if tokens_per_s == 0.0 {
                    s.tokens_per_s
                } else {
                    0.9 * tokens_per_s + 0.1 * s.tokens_per_s
                };
                bar.set_message(status_line(last_loss, last_accuracy, tokens_per_s));
            }
            TrainEvent::Eval(e) => {
                last_accuracy = Some(e.accuracy);
                bar.set_message(status_line(last_loss, last_accuracy, tokens_per_s));
                // Macro accuracy beside the micro one: a MAD run stops on it.
                let macro_accuracy = e
                    .macro_accuracy
                    .map_or(String::new(), |m| format!("  macro {:>6.2}%", 100.0 * m));
                let line = format!(
                    "step {:>6}  epoch {:>6.2}  test acc {:>6.2}%{macro_accuracy}  test loss {:.4}",
                    e.step,
                    e.epoch,
                    100.0 * e.accuracy,
                    e.loss
                );
                // On stdout where there is no bar to print above (`--quiet`, or piped).
                if bar.is_hidden() {
                    outln!("{line}");
                } else {
                    bar.println(line);
                }
            }
            TrainEvent::Finished(summary) => {
                bar.finish_and_clear();
                outln!("{}", summary_line(&summary));
            }
            TrainEvent::Failed { message, run_dir } => {
                bar.abandon();
                if let Some(dir) = run_dir {
                    eprintln!("what was saved is kept in {}", dir.display());
                }
                anyhow::bail!(message);
            }
        }
    }
    handle.join()?;
    if let Some(peak) = crate::memory::peak_bytes() {
        eprintln!(
            "peak memory {} (estimated {})",
            crate::preset::bytes(peak as f64),
            crate::preset::bytes(estimate.total())
        );
    }
    Ok(())
}

/// Prints a line on stderr above the progress bar. The bar's own `println` prints nothing
/// where the bar is hidden (`--quiet`, or stderr not a terminal), which lost the run folder
/// and the text a language model trained on.
fn inform(bar: &ProgressBar, line: &str) {
    bar.suspend(|| eprintln!("{line}"));
}

fn status_line(loss: f32, accuracy: Option<f64>, tokens_per_s: f64) -> String {
    let acc = accuracy.map_or("-".to_string(), |a| format!("{:.1}%", 100.0 * a));
    format!("loss {loss:.4}  acc {acc}  {:.0} tok/s", tokens_per_s)
}

/// The line printed when a run ends.
pub fn summary_line(s: &Summary) -> String {
    format!(
        "{} ({} / {}): {} after {} steps in {:.1} s; test accuracy ({}) {}; loss {}; {:.0} tokens/s",
        s.name,
        s.mechanism,
        s.encoding,
        s.status.describe(),
        s.steps,
        s.elapsed_secs,
        s.metric.name(),
        s.last_accuracy
            .map_or("-".into(), |a| format!("{:.2}%", 100.0 * a)),
        s.last_loss.map_or("-".into(), |l| format!("{l:.4}")),
        s.tokens_per_s.unwrap_or(0.0)
    )
}
