//! Reports of the encoding analyses of "Exploring Transformer Extrapolation": exp(bias) by
//! distance with Theorem 0.4's verdict ([`BiasReport`]), the TRF with the absolute n_the and the
//! rotary decay bound ([`TrfReport`]), and a run's ERF against its TRF ([`ErfReport`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;

use super::Report;
use crate::Result;
use crate::analysis::figures::encodings as fig;
use crate::analysis::{ErfProtocol, Heads, ReceptiveField, Rows, StudiedEncoding, run_erf};
use crate::figures::Figure;
use crate::train::RunDir;

/// How the heads of an encoding are combined, in words (captions, JSON).
pub fn heads_label(heads: Heads) -> String {
    match heads {
        Heads::Mean => "mean over heads".into(),
        Heads::One(h) => format!("head {h}"),
    }
}

/// One encoding's bias and verdict.
#[derive(Clone, Debug, Serialize)]
pub struct BiasEntry {
    pub formula: &'static str,
    pub learnable: bool,
    /// Per head, the bias at distances 0..length (`None` without a relative bias).
    pub bias: Option<Vec<Vec<f64>>>,
    pub verdict: String,
    pub evidence: String,
    /// The first head's partial sums of exp(bias) (up to t, sum), as the verdict saw them.
    pub partial_sums: Option<Vec<(f64, f64)>>,
}

/// `attnlab bias`: exp(bias) by distance and Theorem 0.4's verdict per encoding.
#[derive(Clone, Debug, Serialize)]
pub struct BiasReport {
    pub length: usize,
    pub head: String,
    pub encodings: BTreeMap<String, BiasEntry>,
    /// The encodings in the order they were asked for (the text table's rows).
    #[serde(skip)]
    order: Vec<String>,
    #[serde(skip)]
    heads: Heads,
}

impl BiasReport {
    /// The bias of each of `studied` at distances 0..`length`, for `heads`.
    pub fn new(studied: &[StudiedEncoding], length: usize, heads: Heads) -> Result<Self> {
        let mut encodings = BTreeMap::new();
        for s in studied {
            let verdict = s.verdict()?;
            encodings.insert(
                s.label.clone(),
                BiasEntry {
                    formula: s.spec.formula(),
                    learnable: s.spec.is_learnable(),
                    bias: s.bias_rows(length)?,
                    partial_sums: verdict.heads.first().map(|c| c.partial_sums.clone()),
                    verdict: verdict.verdict,
                    evidence: verdict.evidence,
                },
            );
        }
        Ok(Self {
            length,
            head: heads_label(heads),
            encodings,
            order: studied.iter().map(|s| s.label.clone()).collect(),
            heads,
        })
    }

    /// Each encoding's label and entry, in the order they were asked for.
    pub fn entries(&self) -> impl Iterator<Item = (&String, &BiasEntry)> {
        self.order
            .iter()
            .filter_map(|label| self.encodings.get_key_value(label))
    }
}

/// exp(bias) at distances 1.. for the selected head or the mean over heads.
fn exp_curve(rows: &[Vec<f64>], heads: Heads) -> Vec<(f64, f64)> {
    let pick: Vec<&Vec<f64>> = match heads {
        Heads::One(h) => rows.get(h).into_iter().collect(),
        Heads::Mean => rows.iter().collect(),
    };
    let n = rows.first().map_or(0, Vec::len);
    (1..n)
        .map(|t| {
            let mean = pick.iter().map(|r| r[t].exp()).sum::<f64>() / pick.len().max(1) as f64;
            (t as f64, mean)
        })
        .collect()
}

impl Report for BiasReport {
    fn text(&self) -> Vec<String> {
        self.entries()
            .map(|(label, e)| format!("{label:<24} {:<14} {}", e.verdict, e.evidence))
            .collect()
    }

    fn figures(&self) -> Vec<(String, Figure)> {
        let curves: Vec<(&String, Vec<(f64, f64)>)> = self
            .entries()
            .filter_map(|(label, e)| Some((label, exp_curve(e.bias.as_ref()?, self.heads))))
            .collect();
        let curves = curves
            .iter()
            .map(|(name, points)| fig::Curve {
                name,
                points: points.clone(),
                dashed: false,
            })
            .collect();
        vec![(
            String::new(),
            fig::exp_bias(self.length, curves, &self.head),
        )]
    }

    fn csv(&self) -> String {
        let mut csv = String::from("encoding,head,distance,bias,exp_bias\n");
        for (label, e) in self.entries() {
            for (h, row) in e.bias.iter().flatten().enumerate() {
                for (t, p) in row.iter().enumerate() {
                    csv.push_str(&format!("{label},{h},{t},{p},{}\n", p.exp()));
                }
            }
        }
        csv
    }
}

/// The rotary decay bound of one encoding.
#[derive(Clone, Debug, Serialize)]
pub struct DecayCurve {
    pub distance: Vec<f64>,
    pub bound: Vec<f64>,
}

/// `attnlab trf`: the TRF of each encoding with a relative bias, the absolute n_the(ε) of
/// Eq. 22, the rotary encodings' decay bound, and Theorem 0.4's verdicts.
#[derive(Clone, Debug, Serialize)]
pub struct TrfReport {
    pub length: usize,
    pub points: usize,
    pub head: String,
    pub eps: Vec<f64>,
    pub trf: BTreeMap<String, Vec<f64>>,
    pub verdict: BTreeMap<String, String>,
    pub evidence: BTreeMap<String, String>,
    /// Per encoding, per ε asked for: n_the per head (`None` where the series diverges).
    pub n_the: BTreeMap<String, BTreeMap<String, Vec<Option<f64>>>>,
    pub decay: BTreeMap<String, DecayCurve>,
    /// The caption of the TRF figure: heads and model shape.
    #[serde(skip)]
    protocol: String,
}

/// The TRF's settings.
#[derive(Clone, Debug)]
pub struct TrfSettings {
    /// The length m of draw().
    pub length: usize,
    /// Values of ε, from 1 down to 0.
    pub points: usize,
    /// ε values at which to report the absolute TRF.
    pub eps: Vec<f64>,
    pub heads: Heads,
    /// The model shape the encodings were built for, in words (the figure's caption).
    pub shape: String,
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

impl TrfReport {
    pub fn new(studied: &[StudiedEncoding], settings: &TrfSettings) -> Result<Self> {
        let TrfSettings {
            length,
            points,
            heads,
            ..
        } = *settings;
        let mut report = Self {
            length,
            points,
            head: heads_label(heads),
            eps: Vec::new(),
            trf: BTreeMap::new(),
            verdict: BTreeMap::new(),
            evidence: BTreeMap::new(),
            n_the: BTreeMap::new(),
            decay: BTreeMap::new(),
            protocol: format!("{}, {}", heads_label(heads), settings.shape),
        };
        let distances = decay_distances(length);
        for s in studied {
            let verdict = s.verdict()?;
            report.verdict.insert(s.label.clone(), verdict.verdict);
            report.evidence.insert(s.label.clone(), verdict.evidence);
            if let Some(rf) = s.trf(length, points, heads, Rows::Last)? {
                report.eps.clone_from(&rf.eps);
                report.trf.insert(s.label.clone(), rf.index);
                let per_head = s.n_the(&settings.eps, heads)?.unwrap_or_default();
                let absolute = settings
                    .eps
                    .iter()
                    .enumerate()
                    .map(|(i, e)| (e.to_string(), per_head.iter().map(|h| h[i]).collect()))
                    .collect();
                report.n_the.insert(s.label.clone(), absolute);
            }
            if let Some(bound) = s.rotary_decay(&distances) {
                let distance = distances.clone();
                report
                    .decay
                    .insert(s.label.clone(), DecayCurve { distance, bound });
            }
        }
        Ok(report)
    }
}

impl Report for TrfReport {
    fn text(&self) -> Vec<String> {
        self.verdict
            .iter()
            .map(|(label, verdict)| {
                let trf_at = self.trf.get(label).map_or("-".into(), |index| {
                    index
                        .iter()
                        .step_by((index.len() / 5).max(1))
                        .map(|v| format!("{v:.3}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                });
                format!("{label:<24} {verdict:<14} TRF/m: {trf_at}")
            })
            .collect()
    }

    /// The TRF curves, and the decay curves (other axes) as `NAME-decay`; with neither, an
    /// empty TRF figure.
    fn figures(&self) -> Vec<(String, Figure)> {
        let mut figures = Vec::new();
        if !self.trf.is_empty() || self.decay.is_empty() {
            let curves = self
                .trf
                .iter()
                .map(|(name, index)| fig::Curve {
                    name,
                    points: self
                        .eps
                        .iter()
                        .copied()
                        .zip(index.iter().copied())
                        .collect(),
                    dashed: false,
                })
                .collect();
            let title = "Theoretical receptive field (TRF)";
            let figure = fig::receptive_field(title, self.length, curves, &self.protocol);
            figures.push((String::new(), figure));
        }
        if !self.decay.is_empty() {
            let curves = self
                .decay
                .iter()
                .map(|(name, d)| fig::Curve {
                    name,
                    points: d
                        .distance
                        .iter()
                        .copied()
                        .zip(d.bound.iter().copied())
                        .collect(),
                    dashed: false,
                })
                .collect();
            figures.push(("decay".into(), fig::rotary_decay(self.length, curves)));
        }
        figures
    }
}

/// `attnlab erf`: the ERF of a run's saved attention beside the TRF of its encoding.
#[derive(Clone, Debug, Serialize)]
pub struct ErfReport {
    pub run: PathBuf,
    pub protocol: ErfProtocol,
    pub length: usize,
    pub step: usize,
    pub examples: usize,
    pub layers: Vec<usize>,
    pub eps: Vec<f64>,
    pub erf: Vec<f64>,
    pub trf: Option<Vec<f64>>,
    pub encoding: String,
    pub verdict: String,
    pub mass: Vec<f64>,
    /// The protocol in words (the text table's first line and the figure's caption).
    #[serde(skip)]
    description: String,
}

impl ErfReport {
    /// The ERF of `run` under `protocol` with `points` values of ε, and its encoding's TRF
    /// (rows averaged the same way).
    pub fn new(run: &RunDir, protocol: ErfProtocol, points: usize) -> Result<Self> {
        let measured = run_erf(run, protocol, points)?;
        let encoding = StudiedEncoding::from_run(run, protocol.layer)?;
        let trf: Option<ReceptiveField> =
            encoding.trf(measured.length, points, protocol.heads, protocol.rows)?;
        let layer = protocol
            .layer
            .map_or("mean over layers".into(), |l| format!("layer {l}"));
        let mut description = format!(
            "{layer}, {}, {:?} rows, {} examples at step {}",
            heads_label(protocol.heads),
            protocol.rows,
            measured.examples,
            measured.step,
        )
        .to_lowercase();
        if measured.magnitudes {
            description.push_str(", |A| of the signed matrix, L1-row-normalised");
        }
        Ok(Self {
            run: run.path().to_path_buf(),
            protocol,
            length: measured.length,
            step: measured.step,
            examples: measured.examples,
            layers: measured.layers,
            eps: measured.erf.eps,
            erf: measured.erf.index,
            trf: trf.map(|rf| rf.index),
            verdict: encoding.verdict()?.verdict,
            encoding: encoding.label,
            mass: measured.mass,
            description,
        })
    }
}

impl Report for ErfReport {
    fn text(&self) -> Vec<String> {
        let rows = self
            .eps
            .iter()
            .zip(&self.erf)
            .enumerate()
            .map(|(i, (e, v))| {
                let t = self
                    .trf
                    .as_ref()
                    .map_or(String::new(), |trf| format!("  trf {:.4}", trf[i]));
                format!("eps {e:.3}  erf {v:.4}{t}")
            });
        std::iter::once(self.description.clone())
            .chain(rows)
            .collect()
    }

    fn figures(&self) -> Vec<(String, Figure)> {
        let points = |index: &[f64]| {
            self.eps
                .iter()
                .copied()
                .zip(index.iter().copied())
                .collect()
        };
        let mut curves = vec![fig::Curve {
            name: "ERF (trained attention)",
            points: points(&self.erf),
            dashed: false,
        }];
        let trf_name = format!("TRF ({})", self.encoding);
        if let Some(trf) = &self.trf {
            curves.push(fig::Curve {
                name: &trf_name,
                points: points(trf),
                dashed: true,
            });
        }
        let title = "Empirical vs theoretical receptive field";
        let figure = fig::receptive_field(title, self.length, curves, &self.description);
        vec![(String::new(), figure)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encodings::EncodingSpec;
    use crate::report::{Format, render};

    fn studied(name: &str) -> StudiedEncoding {
        StudiedEncoding::untrained(&EncodingSpec::from_name(name).unwrap(), 4, 8).unwrap()
    }

    #[test]
    fn the_bias_report_keeps_the_order_asked_for_and_its_csv_has_every_distance() {
        let report =
            BiasReport::new(&[studied("type1"), studied("alibi")], 8, Heads::Mean).unwrap();
        let text = report.text();
        assert!(
            text[0].starts_with("type1") && text[1].starts_with("alibi"),
            "{text:?}"
        );
        assert!(text[0].contains("converges"), "{text:?}");
        // 4 heads × 8 distances per encoding, and the header.
        assert_eq!(report.csv().lines().count(), 1 + 2 * 4 * 8);
        let json = render(&report, Format::Json).unwrap();
        assert!(json.contains("\"partial_sums\""), "{json}");
    }

    #[test]
    fn the_trf_report_puts_rotary_decay_in_a_second_figure() {
        let settings = TrfSettings {
            length: 64,
            points: 5,
            eps: vec![0.5],
            heads: Heads::Mean,
            shape: "4 heads of width 8".into(),
        };
        let report = TrfReport::new(&[studied("alibi"), studied("rope")], &settings).unwrap();
        let suffixes: Vec<String> = report.figures().into_iter().map(|(s, _)| s).collect();
        assert_eq!(suffixes, ["", "decay"]);
        assert_eq!(report.trf["alibi"].len(), 5);
        assert!(report.decay.contains_key("rope") && !report.trf.contains_key("rope"));
        let only_rotary = TrfReport::new(&[studied("rope")], &settings).unwrap();
        assert_eq!(only_rotary.figures()[0].0, "decay");
        assert!(only_rotary.csv().contains("rope"));
    }
}
