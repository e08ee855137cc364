//! `attnlab encodings | bias | trf | erf`: the encoding analyses of "Exploring Transformer
//! Extrapolation" from the terminal, as tables (text, CSV, JSON) and figures (SVG, PNG).

use std::path::{Path, PathBuf};

use clap::Args;

use crate::analysis::figures::encodings as fig;
use crate::analysis::{ErfProtocol, Heads, Rows, StudiedEncoding, UNTRAINED_MAX_LEN};
use crate::encodings::EncodingSpec;
use crate::figures;
use crate::report::encodings::{BiasReport, ErfReport, TrfReport, TrfSettings, heads_label};
use crate::report::{Format, render, save_figures, with_suffix};
use crate::settings::Section;
use crate::train::RunDir;

/// The most heads `--heads` builds encodings for: model.n_heads's bound.
const MAX_HEADS: u64 = 256;
/// The widest `--head-dim`: model.d_model's bound.
const MAX_HEAD_DIM: u64 = 8192;
/// The longest `--length`: the longest rows a task trains on.
const MAX_LENGTH: u64 = 65_536;
/// The most ε values a receptive-field curve is sampled at.
const MAX_POINTS: u64 = 10_000;

/// Which encodings, with which settings, for how many heads.
#[derive(Debug, Args)]
pub struct EncodingChoice {
    /// Comma-separated encoding names, or `all` (see `attnlab encodings`).
    #[arg(long, value_delimiter = ',', default_value = "all")]
    encodings: Vec<String>,
    /// Change a setting, NAME.KEY=VALUE, e.g. --set sandwich.k=0.5 (repeatable).
    #[arg(long = "set", value_name = "NAME.KEY=VALUE")]
    settings: Vec<String>,
    /// Heads of the model the encodings are built for (ALiBi's slopes depend on it); at most
    /// model.n_heads's 256.
    #[arg(long, default_value_t = 8, value_parser = super::bounded(1, MAX_HEADS))]
    heads: usize,
    /// Per-head query/key width (rotary frequencies depend on it); at most model.d_model's 8192.
    #[arg(long, default_value_t = 64, value_parser = super::bounded(1, MAX_HEAD_DIM))]
    head_dim: usize,
    /// A run folder: add its encoding with the trained parameters.
    #[arg(long)]
    run: Option<PathBuf>,
    /// One head (0-based) or `mean`: the mean of the heads' attention rows.
    #[arg(long, default_value = "mean", value_parser = parse_heads)]
    head: Heads,
}

fn parse_heads(text: &str) -> Result<Heads, String> {
    if text == "mean" {
        return Ok(Heads::Mean);
    }
    text.parse()
        .map(Heads::One)
        .map_err(|_| format!("'{text}' is neither a head number nor 'mean'"))
}

fn parse_rows(text: &str) -> Result<Rows, String> {
    match text {
        "all" => Ok(Rows::All),
        "last" => Ok(Rows::Last),
        _ => Err(format!("'{text}' is neither 'all' nor 'last'")),
    }
}

/// `--layer`: one attention layer, or `None` for the mean over layers.
#[derive(Clone, Copy, Debug)]
pub struct LayerArg(Option<usize>);

fn parse_layer(text: &str) -> Result<LayerArg, String> {
    if text == "mean" {
        return Ok(LayerArg(None));
    }
    text.parse()
        .map(|l| LayerArg(Some(l)))
        .map_err(|_| format!("'{text}' is neither a layer number nor 'mean'"))
}

impl EncodingChoice {
    /// The chosen encodings with their settings applied, plus the run's if asked.
    fn studied(&self) -> anyhow::Result<Vec<StudiedEncoding>> {
        anyhow::ensure!(self.heads >= 1, "--heads must be at least 1");
        anyhow::ensure!(self.head_dim >= 2, "--head-dim must be at least 2");
        if let Heads::One(h) = self.head {
            anyhow::ensure!(
                h < self.heads,
                "--head {h} does not exist: heads are 0..{}",
                self.heads
            );
        }
        let mut specs: Vec<EncodingSpec> = if self.encodings.iter().any(|n| n == "all") {
            EncodingSpec::all_defaults()
        } else {
            self.encodings
                .iter()
                .map(|name| EncodingSpec::from_name(name.trim()))
                .collect::<crate::Result<_>>()?
        };
        for setting in &self.settings {
            apply_setting(&mut specs, setting)?;
        }
        let mut studied = specs
            .iter()
            .map(|spec| StudiedEncoding::untrained(spec, self.heads, self.head_dim))
            .collect::<crate::Result<Vec<_>>>()?;
        if let Some(run) = &self.run {
            studied.push(StudiedEncoding::from_run(&RunDir::open(run)?, None)?);
        }
        Ok(studied)
    }
}

/// Applies `name.key=value` to the chosen encoding called `name`; the value is read as TOML
/// (`sandwich.k=0.5`, `sandwich.per_head=true`, `diet-rel.sharing=layerwise`).
fn apply_setting(specs: &mut [EncodingSpec], setting: &str) -> anyhow::Result<()> {
    let parsed = setting
        .split_once('=')
        .and_then(|(path, value)| Some((path.split_once('.')?, value)));
    let Some(((name, key), value)) = parsed else {
        anyhow::bail!("--set {setting}: expected NAME.KEY=VALUE, e.g. sandwich.k=0.5");
    };
    let spec = specs.iter_mut().find(|s| s.name() == name).ok_or_else(|| {
        anyhow::anyhow!("--set {setting}: encoding '{name}' is not among --encodings")
    })?;
    *spec = spec.with_setting(key.trim(), value)?;
    Ok(())
}

/// `attnlab bias` options.
#[derive(Debug, Args)]
pub struct BiasArgs {
    #[command(flatten)]
    choice: EncodingChoice,
    /// Distances 0..LENGTH (and the heatmap's size), at most 65536.
    #[arg(long, default_value_t = 64, value_parser = super::bounded(2, MAX_LENGTH))]
    length: usize,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Write the exp(bias)-by-distance curves (.svg, .png or .csv).
    #[arg(long)]
    figure: Option<PathBuf>,
    /// Write the exp(bias) heatmap; with several encodings, one file each (name appended).
    #[arg(long)]
    heatmap: Option<PathBuf>,
}

/// `attnlab bias`.
pub fn bias(args: &BiasArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.heatmap.is_none() || args.length <= UNTRAINED_MAX_LEN,
        "--length {} is too long for --heatmap, which holds n x n values: at most {UNTRAINED_MAX_LEN}",
        args.length
    );
    let studied = args.choice.studied()?;
    let heads = args.choice.head;
    let report = BiasReport::new(&studied, args.length, heads)?;
    if let Some(path) = &args.heatmap {
        for s in &studied {
            write_heatmap(s, path, args.length, heads, studied.len() > 1)?;
        }
    }
    if let Some(path) = &args.figure {
        save_figures(&report, path)?;
    }
    out!("{}", render(&report, args.format)?);
    Ok(())
}

fn write_heatmap(
    s: &StudiedEncoding,
    path: &Path,
    n: usize,
    heads: Heads,
    suffix: bool,
) -> anyhow::Result<()> {
    let Some(values) = s.exp_bias_matrix(n, heads)? else {
        eprintln!("{}: no logit bias, so no exp(bias) heatmap", s.label);
        return Ok(());
    };
    let path = if suffix {
        with_suffix(path, &s.label)
    } else {
        path.to_path_buf()
    };
    figures::save(
        &fig::exp_bias_heatmap(&s.label, n, values, &heads_label(heads)),
        &path,
    )?;
    Ok(())
}

/// `attnlab trf` options.
#[derive(Debug, Args)]
pub struct TrfArgs {
    #[command(flatten)]
    choice: EncodingChoice,
    /// The length m of draw(): the content-free attention row covers distances 0..m (at most
    /// 65536).
    #[arg(long, default_value_t = 512, value_parser = super::bounded(1, MAX_LENGTH))]
    length: usize,
    /// Number of ε values, from 1 down to 0 (at most 10000).
    #[arg(long, default_value_t = 50, value_parser = super::bounded(2, MAX_POINTS))]
    points: usize,
    /// ε values at which to report the absolute TRF n_the(ε) of Eq. 22 (infinite sum).
    #[arg(long, value_delimiter = ',', default_value = "0.5,0.1,0.01")]
    eps: Vec<f64>,
    #[arg(long, value_enum, default_value_t = Format::Json)]
    format: Format,
    /// Write the TRF curves (.svg, .png or .csv); rotary decay curves go to NAME-decay.EXT.
    #[arg(long)]
    figure: Option<PathBuf>,
}

/// `attnlab trf`.
pub fn trf(args: &TrfArgs) -> anyhow::Result<()> {
    if let Some(bad) = args.eps.iter().find(|e| !(**e > 0.0 && **e < 1.0)) {
        anyhow::bail!("--eps {bad}: every ε must lie strictly between 0 and 1");
    }
    let settings = TrfSettings {
        length: args.length,
        points: args.points,
        eps: args.eps.clone(),
        heads: args.choice.head,
        shape: format!(
            "{} heads of width {}",
            args.choice.heads, args.choice.head_dim
        ),
    };
    let report = TrfReport::new(&args.choice.studied()?, &settings)?;
    if let Some(path) = &args.figure {
        save_figures(&report, path)?;
    }
    out!("{}", render(&report, args.format)?);
    Ok(())
}

/// `attnlab erf` options.
#[derive(Debug, Args)]
pub struct ErfArgs {
    /// A run folder (runs/<time>-<name>).
    run: PathBuf,
    /// One attention layer, or `mean` over all attention layers.
    #[arg(long, default_value = "mean", value_parser = parse_layer)]
    layer: LayerArg,
    /// One head (0-based) or `mean`.
    #[arg(long, default_value = "mean", value_parser = parse_heads)]
    head: Heads,
    /// Query rows: `all` (the TRF overlaid is then averaged over rows the same way), or
    /// `last`, the row that sees the whole context (the paper's TRF).
    #[arg(long, default_value = "all", value_parser = parse_rows)]
    rows: Rows,
    /// Number of ε values, from 1 down to 0 (at most 10000).
    #[arg(long, default_value_t = 50, value_parser = super::bounded(2, MAX_POINTS))]
    points: usize,
    #[arg(long, value_enum, default_value_t = Format::Json)]
    format: Format,
    /// Write the ERF with the run's TRF overlaid (.svg, .png or .csv).
    #[arg(long)]
    figure: Option<PathBuf>,
}

/// `attnlab erf`.
pub fn erf(args: &ErfArgs) -> anyhow::Result<()> {
    let protocol = ErfProtocol {
        layer: args.layer.0,
        heads: args.head,
        rows: args.rows,
    };
    let report = ErfReport::new(&RunDir::open(&args.run)?, protocol, args.points)?;
    if let Some(path) = &args.figure {
        save_figures(&report, path)?;
    }
    out!("{}", render(&report, args.format)?);
    Ok(())
}
