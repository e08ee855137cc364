//! `attnlab encodings | bias | trf | erf`: the encoding analyses of "Exploring Transformer
//! Extrapolation" from the terminal, as tables (text, CSV, JSON) and figures (SVG, PNG).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use serde_json::{Value, json};

use crate::analysis::{ErfProtocol, Heads, Rows, StudiedEncoding, UNTRAINED_MAX_LEN, run_erf};
use crate::encodings::{EncodingSpec, Family};
use crate::figures::{self, Figure, encodings as fig};
use crate::train::RunDir;

/// The most heads `--heads` builds encodings for: model.n_heads's bound.
const MAX_HEADS: u64 = 256;
/// The widest `--head-dim`: model.d_model's bound.
const MAX_HEAD_DIM: u64 = 8192;
/// The longest `--length`: the longest rows a task trains on.
const MAX_LENGTH: u64 = 65_536;
/// The most ε values a receptive-field curve is sampled at.
const MAX_POINTS: u64 = 10_000;

/// Output format of the analysis commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TableFormat {
    Text,
    Csv,
    Json,
}

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

fn heads_label(heads: Heads) -> String {
    match heads {
        Heads::Mean => "mean over heads".into(),
        Heads::One(h) => format!("head {h}"),
    }
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

/// `attnlab encodings`.
pub fn list(format: TableFormat) -> anyhow::Result<()> {
    let specs = EncodingSpec::all_defaults();
    if format == TableFormat::Json {
        let rows: Vec<Value> = specs.iter().map(describe).collect();
        outln!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    if format == TableFormat::Csv {
        outln!("name,family,learnable,formula,settings");
    }
    for spec in &specs {
        let settings: Vec<String> = spec
            .hyperparameters()
            .iter()
            .map(|h| {
                let value = spec.value(h.key).map_or("auto".into(), |v| v.to_string());
                format!("{}={value} [{}..{}]", h.key, h.min, h.max)
            })
            .collect();
        let learnable = if spec.is_learnable() {
            "learned"
        } else {
            "fixed"
        };
        let family = family_name(spec.family());
        match format {
            TableFormat::Csv => outln!(
                "{},{family},{},\"{}\",\"{}\"",
                spec.name(),
                spec.is_learnable(),
                spec.formula(),
                settings.join("; ")
            ),
            _ => outln!(
                "{:<13} {family:<8} {learnable:<8} {}\n{:<31}{}\n{:<31}{}",
                spec.name(),
                spec.formula(),
                "",
                spec.summary(),
                "",
                if settings.is_empty() {
                    "(no settings)".into()
                } else {
                    settings.join("  ")
                }
            ),
        }
    }
    Ok(())
}

fn family_name(family: Family) -> &'static str {
    match family {
        Family::None => "none",
        Family::Absolute => "absolute",
        Family::Bias => "bias",
        Family::Rotary => "rotary",
    }
}

fn describe(spec: &EncodingSpec) -> Value {
    let settings: Vec<Value> = spec
        .hyperparameters()
        .iter()
        .map(|h| {
            json!({"key": h.key, "value": spec.value(h.key), "min": h.min, "max": h.max,
                   "integer": h.integer, "help": h.help})
        })
        .collect();
    json!({"name": spec.name(), "family": family_name(spec.family()),
           "learnable": spec.is_learnable(), "formula": spec.formula(),
           "summary": spec.summary(), "settings": settings})
}

/// `attnlab bias` options.
#[derive(Debug, Args)]
pub struct BiasArgs {
    #[command(flatten)]
    choice: EncodingChoice,
    /// Distances 0..LENGTH (and the heatmap's size), at most 65536.
    #[arg(long, default_value_t = 64, value_parser = super::bounded(2, MAX_LENGTH))]
    length: usize,
    #[arg(long, value_enum, default_value_t = TableFormat::Text)]
    format: TableFormat,
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
    let mut text_lines = Vec::new();
    let mut report = BTreeMap::new();
    let mut curves = Vec::new();
    let mut csv = vec!["encoding,head,distance,bias,exp_bias".to_string()];
    for s in &studied {
        let rows = s.bias_rows(args.length)?;
        let verdict = s.verdict()?;
        text_lines.push(format!(
            "{:<24} {:<14} {}",
            s.label, verdict.verdict, verdict.evidence
        ));
        if let Some(rows) = &rows {
            for (h, row) in rows.iter().enumerate() {
                csv.extend(
                    row.iter()
                        .enumerate()
                        .map(|(t, p)| format!("{},{h},{t},{p},{}", s.label, p.exp())),
                );
            }
            curves.push(selected_exp_curve(&s.label, rows, heads));
        }
        report.insert(
            s.label.clone(),
            json!({"formula": s.spec.formula(), "learnable": s.spec.is_learnable(),
                   "bias": rows, "verdict": verdict.verdict, "evidence": verdict.evidence,
                   "partial_sums": verdict.heads.first().map(|c| c.partial_sums.clone())}),
        );
        if let Some(path) = &args.heatmap {
            write_heatmap(s, path, args.length, heads, studied.len() > 1)?;
        }
    }
    if let Some(path) = &args.figure {
        let curves = curves
            .iter()
            .map(|(name, points)| fig::Curve {
                name,
                points: points.clone(),
                dashed: false,
            })
            .collect();
        figures::save(
            &fig::exp_bias(args.length, curves, &heads_label(heads)),
            path,
        )?;
    }
    match args.format {
        TableFormat::Json => outln!(
            "{}",
            serde_json::to_string_pretty(
                &json!({"length": args.length, "head": heads_label(heads), "encodings": report})
            )?
        ),
        TableFormat::Csv => outln!("{}", csv.join("\n")),
        TableFormat::Text => outln!("{}", text_lines.join("\n")),
    }
    Ok(())
}

/// exp(bias) at distances 1.. for the selected head or the mean over heads.
fn selected_exp_curve(label: &str, rows: &[Vec<f64>], heads: Heads) -> (String, Vec<(f64, f64)>) {
    let pick: Vec<&Vec<f64>> = match heads {
        Heads::One(h) => rows.get(h).into_iter().collect(),
        Heads::Mean => rows.iter().collect(),
    };
    let n = rows.first().map_or(0, Vec::len);
    let points = (1..n)
        .map(|t| {
            let mean = pick.iter().map(|r| r[t].exp()).sum::<f64>() / pick.len().max(1) as f64;
            (t as f64, mean)
        })
        .collect();
    (label.to_string(), points)
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

/// `out.png` → `out-<label>.png`, with the label made file-name safe.
pub(super) fn with_suffix(path: &Path, label: &str) -> PathBuf {
    let safe: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("figure");
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("svg");
    path.with_file_name(format!("{stem}-{safe}.{ext}"))
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
    #[arg(long, value_enum, default_value_t = TableFormat::Json)]
    format: TableFormat,
    /// Write the TRF curves (.svg, .png or .csv); rotary decay curves go to NAME-decay.EXT.
    #[arg(long)]
    figure: Option<PathBuf>,
}

/// `attnlab trf`.
pub fn trf(args: &TrfArgs) -> anyhow::Result<()> {
    if let Some(bad) = args.eps.iter().find(|e| !(**e > 0.0 && **e < 1.0)) {
        anyhow::bail!("--eps {bad}: every ε must lie strictly between 0 and 1");
    }
    let studied = args.choice.studied()?;
    let heads = args.choice.head;
    let (mut trfs, mut verdicts, mut evidence, mut n_the, mut decays) = (
        BTreeMap::new(),
        BTreeMap::new(),
        BTreeMap::new(),
        BTreeMap::new(),
        BTreeMap::new(),
    );
    let mut eps_axis = Vec::new();
    let distances = decay_distances(args.length);
    for s in &studied {
        let verdict = s.verdict()?;
        verdicts.insert(s.label.clone(), verdict.verdict.clone());
        evidence.insert(s.label.clone(), verdict.evidence.clone());
        if let Some(rf) = s.trf(args.length, args.points, heads, Rows::Last)? {
            eps_axis = rf.eps.clone();
            trfs.insert(s.label.clone(), rf);
            let per_head = s.n_the(&args.eps, heads)?.unwrap_or_default();
            let absolute: BTreeMap<String, Value> = args
                .eps
                .iter()
                .enumerate()
                .map(|(i, e)| {
                    (
                        e.to_string(),
                        json!(per_head.iter().map(|h| h[i]).collect::<Vec<_>>()),
                    )
                })
                .collect();
            n_the.insert(s.label.clone(), absolute);
        }
        if let Some(decay) = s.rotary_decay(&distances) {
            decays.insert(s.label.clone(), decay);
        }
    }
    let protocol = format!(
        "{}, {} heads of width {}",
        heads_label(heads),
        args.choice.heads,
        args.choice.head_dim
    );
    let trf_figure = fig::receptive_field(
        "Theoretical receptive field (TRF)",
        args.length,
        trfs.iter()
            .map(|(name, rf)| fig::Curve {
                name,
                points: fig::rf_points(rf),
                dashed: false,
            })
            .collect(),
        &protocol,
    );
    let decay_figure = fig::rotary_decay(
        args.length,
        decays
            .iter()
            .map(|(name, d)| fig::Curve {
                name,
                points: distances.iter().copied().zip(d.iter().copied()).collect(),
                dashed: false,
            })
            .collect(),
    );
    if let Some(path) = &args.figure {
        if !trfs.is_empty() {
            figures::save(&trf_figure, path)?;
        }
        if !decays.is_empty() {
            figures::save(&decay_figure, &with_suffix(path, "decay"))?;
        }
    }
    match args.format {
        TableFormat::Json => {
            let trf_values: BTreeMap<&String, &Vec<f64>> =
                trfs.iter().map(|(k, v)| (k, &v.index)).collect();
            let decay_values: BTreeMap<&String, Value> = decays
                .iter()
                .map(|(k, v)| (k, json!({"distance": distances, "bound": v})))
                .collect();
            outln!(
                "{}",
                serde_json::to_string_pretty(&json!({
                    "length": args.length, "points": args.points, "head": heads_label(heads),
                    "eps": eps_axis, "trf": trf_values, "verdict": verdicts, "evidence": evidence,
                    "n_the": n_the, "decay": decay_values,
                }))?
            );
        }
        // Decay curves have other axes; they are the CSV only when no TRF was computed.
        TableFormat::Csv if trfs.is_empty() => out!("{}", figures::render_csv(&decay_figure)),
        TableFormat::Csv => out!("{}", figures::render_csv(&trf_figure)),
        TableFormat::Text => {
            for (label, verdict) in &verdicts {
                let trf_at = trfs.get(label).map_or("-".into(), |rf| {
                    rf.index
                        .iter()
                        .step_by((rf.index.len() / 5).max(1))
                        .map(|v| format!("{v:.3}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                });
                outln!("{label:<24} {verdict:<14} TRF/m: {trf_at}");
            }
        }
    }
    Ok(())
}

/// Distances 1..=length, log-spaced when long, for decay curves.
fn decay_distances(length: usize) -> Vec<f64> {
    let n = length.min(400);
    let mut d: Vec<f64> = (0..n)
        .map(|i| {
            (length as f64)
                .powf(i as f64 / (n.max(2) - 1) as f64)
                .round()
        })
        .collect();
    d.dedup();
    d
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
    #[arg(long, value_enum, default_value_t = TableFormat::Json)]
    format: TableFormat,
    /// Write the ERF with the run's TRF overlaid (.svg, .png or .csv).
    #[arg(long)]
    figure: Option<PathBuf>,
}

/// `attnlab erf`.
pub fn erf(args: &ErfArgs) -> anyhow::Result<()> {
    let run = RunDir::open(&args.run)?;
    let rows = args.rows;
    let layer = args.layer.0;
    let protocol = ErfProtocol {
        layer,
        heads: args.head,
        rows,
    };
    let measured = run_erf(&run, protocol, args.points)?;
    let encoding = StudiedEncoding::from_run(&run, layer)?;
    let trf = encoding.trf(measured.length, args.points, args.head, rows)?;
    let verdict = encoding.verdict()?;
    let layer_text = layer.map_or("mean over layers".into(), |l| format!("layer {l}"));
    let protocol_text = format!(
        "{layer_text}, {}, {:?} rows, {} examples at step {}",
        heads_label(args.head),
        args.rows,
        measured.examples,
        measured.step
    )
    .to_lowercase();
    let mut curves = vec![fig::Curve {
        name: "ERF (trained attention)",
        points: fig::rf_points(&measured.erf),
        dashed: false,
    }];
    let trf_name = format!("TRF ({})", encoding.label);
    if let Some(rf) = &trf {
        curves.push(fig::Curve {
            name: &trf_name,
            points: fig::rf_points(rf),
            dashed: true,
        });
    }
    let figure: Figure = fig::receptive_field(
        "Empirical vs theoretical receptive field",
        measured.length,
        curves,
        &protocol_text,
    );
    if let Some(path) = &args.figure {
        figures::save(&figure, path)?;
    }
    match args.format {
        TableFormat::Json => outln!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "run": args.run, "protocol": measured.protocol, "length": measured.length,
                "step": measured.step, "examples": measured.examples, "layers": measured.layers,
                "eps": measured.erf.eps, "erf": measured.erf.index,
                "trf": trf.as_ref().map(|rf| &rf.index), "encoding": encoding.label,
                "verdict": verdict.verdict, "mass": measured.mass,
            }))?
        ),
        TableFormat::Csv => out!("{}", figures::render_csv(&figure)),
        TableFormat::Text => {
            outln!("{protocol_text}");
            for (i, (e, v)) in measured.erf.eps.iter().zip(&measured.erf.index).enumerate() {
                let t = trf
                    .as_ref()
                    .map_or(String::new(), |rf| format!("  trf {:.4}", rf.index[i]));
                outln!("eps {e:.3}  erf {v:.4}{t}");
            }
        }
    }
    Ok(())
}
