//! `attnlab extrapolate`: validation perplexity against evaluation length for trained LM runs
//! (presets are trained first), with Definition 0.1's check beside Theorem 0.4's verdict.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use clap::Args;

use super::analyse::TableFormat;
use crate::extrapolation::{self, Extrapolation, Options, Protocol};
use crate::figures;
use crate::train::RunDir;

#[derive(Debug, Args)]
pub struct ExtrapolateArgs {
    /// Presets (files ending in .toml: trained first) or run folders of LM runs.
    #[arg(required = true)]
    targets: Vec<PathBuf>,
    /// Evaluation lengths in tokens, comma-separated (default L,2L,4L,…,64L).
    #[arg(long, value_delimiter = ',')]
    lengths: Vec<usize>,
    #[arg(long, value_enum, default_value_t = Protocol::NonOverlapping)]
    protocol: Protocol,
    /// Sliding protocol: tokens scored per window (default n/2).
    #[arg(long)]
    stride: Option<usize>,
    /// Queries per attention block (memory: chunk × n weights per head and layer).
    #[arg(long, default_value_t = 256)]
    chunk: usize,
    /// Validation tokens scored at most.
    #[arg(long, default_value_t = 65_536)]
    max_tokens: usize,
    /// Definition 0.1's δ.
    #[arg(long, default_value_t = 0.1)]
    delta: f64,
    /// Do not add PI, NTK, ReRoPE and Leaky ReRoPE curves for RoPE runs.
    #[arg(long)]
    no_variants: bool,
    #[arg(long, value_enum, default_value_t = TableFormat::Text)]
    format: TableFormat,
    /// Save the perplexity-vs-length figure (.svg, .png or .csv).
    #[arg(long)]
    figure: Option<PathBuf>,
    /// Perplexity on a log axis in the figure.
    #[arg(long)]
    log_ppl: bool,
    /// Also write the combined JSON here (each run folder always gets its own).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Override a key of every preset target, e.g. --set train.max_steps=100 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Folder under which preset targets are trained.
    #[arg(long, default_value = "runs")]
    runs: PathBuf,
    /// No progress on stderr.
    #[arg(long)]
    quiet: bool,
}

pub fn extrapolate(args: &ExtrapolateArgs) -> anyhow::Result<()> {
    let cancel = AtomicBool::new(false);
    let quiet = args.quiet;
    let mut last = -1i32;
    let mut progress = |label: &str, f: f32| {
        let percent = (100.0 * f) as i32;
        if !quiet && percent != last {
            last = percent;
            let _ = write!(std::io::stderr(), "\r{label} {percent:3}%");
            if percent == 100 {
                let _ = writeln!(std::io::stderr());
            }
        }
    };
    let options = Options {
        lengths: args.lengths.clone(),
        protocol: args.protocol,
        stride: args.stride,
        chunk: args.chunk,
        max_tokens: args.max_tokens,
        delta: args.delta,
        rotary_variants: !args.no_variants,
        ..Options::default()
    };
    // Before training any preset target: a bad option would only show after it.
    options.validate()?;
    let (presets, mut runs) = split_targets(args)?;
    if !presets.is_empty() {
        let trained = extrapolation::train_presets(
            &presets,
            &args.runs,
            &mut |f| progress("training", f),
            &cancel,
        )?;
        runs.splice(0..0, trained);
    }
    let sweep = extrapolation::extrapolate_runs(
        &runs,
        &options,
        &mut |f| progress("evaluating", f),
        &cancel,
    )?;
    if let Some(path) = &args.out {
        crate::io::write_json(path, &sweep)?;
    }
    if let Some(path) = &args.figure {
        figures::save(
            &figures::extrapolation::perplexity_vs_length(&sweep, args.log_ppl),
            path,
        )?;
    }
    match args.format {
        TableFormat::Json => outln!("{}", serde_json::to_string_pretty(&sweep)?),
        TableFormat::Csv => out!("{}", csv(&sweep)),
        TableFormat::Text => out!("{}", text(&sweep)),
    }
    Ok(())
}

/// Preset files (loaded with the overrides) and run folders, in the order given.
fn split_targets(args: &ExtrapolateArgs) -> anyhow::Result<(Vec<crate::Preset>, Vec<RunDir>)> {
    let mut presets = Vec::new();
    let mut runs = Vec::new();
    for target in &args.targets {
        if target.extension().is_some_and(|e| e == "toml") {
            presets.push(crate::Preset::load(target, &args.overrides)?);
        } else {
            runs.push(RunDir::open(target)?);
        }
    }
    Ok((presets, runs))
}

fn fmt(value: Option<f64>, digits: usize) -> String {
    value.map_or("n/a".into(), |v| format!("{v:.digits$}"))
}

/// One row per curve: perplexity per length, the largest δ beyond L and both verdicts; then
/// time and peak memory per length.
fn text(sweep: &Extrapolation) -> String {
    let mut s = format!(
        "protocol: {} ({}); trained at L = {}; delta = {}\n\n",
        sweep.protocol.name(),
        sweep.protocol_description,
        sweep.train_length,
        sweep.delta_threshold
    );
    let width = sweep
        .curves
        .iter()
        .map(|c| c.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    s += &format!("{:width$}", "ppl");
    for n in &sweep.lengths {
        s += &format!(" {n:>9}");
    }
    s += "  max delta  Def. 0.1   Thm 0.4\n";
    for c in &sweep.curves {
        s += &format!("{:width$}", c.name);
        for p in &c.points {
            s += &format!(" {:>9}", fmt(p.ppl, 3));
        }
        let beyond = c
            .points
            .iter()
            .zip(&c.delta)
            .filter(|(p, _)| p.length > sweep.train_length)
            .filter_map(|(_, d)| *d)
            .fold(None, |m: Option<f64>, d| Some(m.map_or(d, |m| m.max(d))));
        let verdict = match c.extrapolates {
            Some(true) => "yes",
            Some(false) => "no",
            None => "n/a",
        };
        s += &format!("  {:>9}  {verdict:>8}   {}\n", fmt(beyond, 3), c.theorem);
    }
    s += &format!("\n{:width$}", "s / peak MiB");
    for n in &sweep.lengths {
        s += &format!(" {n:>13}");
    }
    s += "\n";
    for c in &sweep.curves {
        s += &format!("{:width$}", c.name);
        for p in &c.points {
            let peak = p.peak_bytes.map(|b| b as f64 / (1 << 20) as f64);
            s += &format!(" {:>13}", format!("{:.1}/{}", p.secs, fmt(peak, 0)));
        }
        s += "\n";
    }
    s
}

/// Tidy CSV: one line per curve and length.
fn csv(sweep: &Extrapolation) -> String {
    let mut s = String::from(
        "protocol,train_length,name,encoding,inference,length,ppl,delta,tokens,secs,peak_bytes,attention_block_bytes,extrapolates,theorem\n",
    );
    for c in &sweep.curves {
        for (p, d) in c.points.iter().zip(&c.delta) {
            s += &format!(
                "{},{},{},{},\"{}\",{},{},{},{},{:.3},{},{},{},{}\n",
                sweep.protocol.name(),
                sweep.train_length,
                c.name,
                c.encoding,
                c.inference.as_deref().unwrap_or(""),
                p.length,
                p.ppl.map_or(String::new(), |v| v.to_string()),
                d.map_or(String::new(), |v| v.to_string()),
                p.tokens,
                p.secs,
                p.peak_bytes.map_or(String::new(), |v| v.to_string()),
                p.attention_block_bytes,
                c.extrapolates.map_or(String::new(), |v| v.to_string()),
                c.theorem
            );
        }
    }
    s
}
