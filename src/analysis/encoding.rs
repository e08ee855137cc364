//! The paper's analyses applied to one encoding: untrained (its formula with the initial
//! parameters) or trained (a run's checkpoint, so learned encodings show what they learned).
//! The CLI's `bias`, `trf` and `erf` commands and the GUI's encoding views call these.

use std::sync::Arc;

use candle_core::Device;
use serde::Serialize;

use super::{Convergence, Heads, ReceptiveField, Rows, Verdict};
use crate::encodings::{DistanceBias, Encoding, EncodingShape, EncodingSpec, RotaryProfile};
use crate::params::Params;
use crate::train::{LoadedRun, Opening, RunDir};
use crate::{Error, Result};

/// Positions an untrained absolute table (learned, DIET-ABS) is built for, which bounds the
/// exp(bias) heatmap of DIET-ABS.
pub const UNTRAINED_MAX_LEN: usize = 1024;

/// An encoding under study.
pub struct StudiedEncoding {
    /// What figures and tables call it: the name, plus "(trained, layer L)" for a run's
    /// learned encoding ("(run, layer L)" for a fixed one).
    pub label: String,
    pub spec: EncodingSpec,
    pub n_heads: usize,
    encoding: Arc<dyn Encoding>,
}

/// Whether Σ exp(bias) converges, over all heads (Theorem 0.4's sufficient condition).
#[derive(Clone, Debug, Serialize)]
pub struct VerdictReport {
    /// `converges`, `diverges`, `undetermined`, or `not-applicable` (no relative bias).
    pub verdict: String,
    pub evidence: String,
    /// Per head; empty when not applicable.
    pub heads: Vec<Convergence>,
}

impl StudiedEncoding {
    /// `spec` with its initial parameters, for heads of width `qk_dim`.
    pub fn untrained(spec: &EncodingSpec, n_heads: usize, qk_dim: usize) -> Result<Self> {
        let shape = EncodingShape {
            d_model: n_heads * qk_dim,
            n_heads,
            qk_dim,
            max_len: UNTRAINED_MAX_LEN,
            embedding_std: 1.0,
        };
        spec.validate(&shape)?;
        let params = Params::new(0, &Device::Cpu);
        Ok(Self {
            label: spec.name().to_string(),
            spec: spec.clone(),
            n_heads,
            encoding: spec.build(&shape, &params)?,
        })
    }

    /// The encoding of attention layer `layer` (the first attention layer when `None`) of a
    /// run, with the parameters of its last checkpoint. Always on the CPU, whatever the run's
    /// device: the study evaluates bias rows of one head at a time (vectors, and a ≤ 256²
    /// heatmap), which a GPU would only slow down with transfers; the run's device matters for
    /// analyses that run the model (IoU, spectra, extrapolation: `DeviceName::open_or_fallback`).
    pub fn from_run(run: &RunDir, layer: Option<usize>) -> Result<Self> {
        let learnable = run.read_preset()?.encoding.is_learnable();
        let opening = Opening::default().on(&Device::Cpu).checkpoint(learnable);
        let LoadedRun { preset, model, .. } = LoadedRun::open(run, &opening)?;
        let layers = model.layer_encodings();
        let (index, encoding) = match layer {
            Some(l) => layers
                .get(l)
                .and_then(|e| e.clone())
                .map(|e| (l, e))
                .ok_or_else(|| Error::RunDir {
                    message: format!("layer {l} is not an attention layer of this run"),
                    path: run.path().to_path_buf(),
                })?,
            None => layers
                .iter()
                .enumerate()
                .find_map(|(l, e)| e.clone().map(|e| (l, e)))
                .ok_or_else(|| Error::RunDir {
                    message: "the run's model has no attention layer".into(),
                    path: run.path().to_path_buf(),
                })?,
        };
        let origin = if preset.encoding.is_learnable() {
            "trained"
        } else {
            "run"
        };
        Ok(Self {
            label: format!("{} ({origin}, layer {index})", preset.encoding.name()),
            spec: preset.encoding.clone(),
            n_heads: preset.model.n_heads,
            encoding,
        })
    }

    /// p_h(t) of every head, or `None` when the encoding is not a relative bias.
    pub fn biases(&self) -> Result<Option<Vec<Arc<dyn DistanceBias>>>> {
        self.encoding.distance_biases()
    }

    /// The heads `heads` selects, or an error naming the valid range.
    fn selected(&self, heads: Heads) -> Result<Option<Vec<Arc<dyn DistanceBias>>>> {
        let Some(all) = self.biases()? else {
            return Ok(None);
        };
        match heads {
            Heads::Mean => Ok(Some(all)),
            Heads::One(h) if h < all.len() => Ok(Some(vec![all[h].clone()])),
            Heads::One(h) => Err(self.missing_head(h, all.len())),
        }
    }

    /// The error for head `h` of this encoding's `count` heads.
    fn missing_head(&self, h: usize, count: usize) -> Error {
        Error::argument(
            "head",
            h,
            format!("does not exist: {} has heads 0..{count}", self.label),
        )
    }

    /// p_h(t) for t < n, one row per head.
    pub fn bias_rows(&self, n: usize) -> Result<Option<Vec<Vec<f64>>>> {
        Ok(self.biases()?.map(|heads| {
            heads
                .iter()
                .map(|head| {
                    let mut row = vec![0.0; n];
                    head.fill(&mut row);
                    row
                })
                .collect()
        }))
    }

    /// The paper's TRF at length `m` (draw() over the content-free attention row), or `None`
    /// when the encoding has no relative bias. `Rows::Last` is the paper's: the query that sees
    /// all m keys; `Rows::All` averages every query row, to overlay an ERF measured that way.
    pub fn trf(
        &self,
        m: usize,
        points: usize,
        heads: Heads,
        rows: Rows,
    ) -> Result<Option<ReceptiveField>> {
        let Some(selected) = self.selected(heads)? else {
            return Ok(None);
        };
        // Heads with one bias (the paper's series, untrained Kerple) have the same row:
        // compute it once.
        let distinct = distinct_heads(&selected);
        let heads = if distinct.len() == 1 {
            &distinct
        } else {
            &selected
        };
        let refs: Vec<&dyn DistanceBias> = heads.iter().map(|h| h.as_ref()).collect();
        Ok(Some(match rows {
            Rows::Last => super::trf(&refs, m, points),
            Rows::All => {
                let mut mean = vec![0.0; m];
                for head in &refs {
                    let mass = super::content_free_mass_all_rows(*head, m);
                    mean.iter_mut()
                        .zip(&mass)
                        .for_each(|(a, b)| *a += b / refs.len() as f64);
                }
                super::draw(&mean, points)
            }
        }))
    }

    /// n_the(ε) of Eq. 22 for each ε in `eps`, per selected head (`None` where the series
    /// diverges); each distinct head is analysed once for all ε.
    pub fn n_the(&self, eps: &[f64], heads: Heads) -> Result<Option<Vec<Vec<Option<f64>>>>> {
        let Some(selected) = self.selected(heads)? else {
            return Ok(None);
        };
        let distinct = distinct_heads(&selected);
        let curves: Vec<Vec<Option<f64>>> = distinct
            .iter()
            .map(|h| super::n_the_curve(h.as_ref(), eps))
            .collect();
        Ok(Some(
            selected
                .iter()
                .map(|h| curves[position_of(&distinct, h)].clone())
                .collect(),
        ))
    }

    /// The convergence verdict over all heads, with each head's evidence.
    pub fn verdict(&self) -> Result<VerdictReport> {
        let Some(heads) = self.biases()? else {
            return Ok(VerdictReport {
                verdict: "not-applicable".into(),
                evidence: self.not_applicable_reason().into(),
                heads: Vec::new(),
            });
        };
        let distinct = distinct_heads(&heads);
        let reports: Vec<Convergence> = distinct.iter().map(|h| head_verdict(h.as_ref())).collect();
        let verdict = Verdict::combine(reports.iter().map(|r| r.verdict));
        let evidence = reports
            .iter()
            .find(|r| r.verdict == verdict)
            .map(|r| r.evidence.clone())
            .unwrap_or_default();
        let per_head = heads
            .iter()
            .map(|h| reports[position_of(&distinct, h)].clone())
            .collect();
        Ok(VerdictReport {
            verdict: verdict.to_string(),
            evidence,
            heads: per_head,
        })
    }

    fn not_applicable_reason(&self) -> &'static str {
        match self.spec.family() {
            crate::encodings::Family::Absolute => {
                "absolute encoding: no relative bias, Theorem 0.4 does not apply"
            }
            crate::encodings::Family::Rotary => {
                "rotary encoding: no additive bias; see its long-range decay curve instead"
            }
            _ => "DIET-ABS depends on absolute positions i and j, not on the distance i - j",
        }
    }

    /// exp(bias) as an n×n matrix (row-major, NaN above the diagonal) for one head or the
    /// mean over heads: the paper's Figure 7. `None` when the encoding adds no logit term.
    pub fn exp_bias_matrix(&self, n: usize, heads: Heads) -> Result<Option<Vec<f64>>> {
        let Some(bias) = self.encoding.logit_bias(n)? else {
            return Ok(self
                .selected(heads)?
                .map(|selected| toeplitz_exp(&selected, n)));
        };
        let bias = bias.to_dtype(candle_core::DType::F64)?.exp()?;
        let per_head = bias.to_vec3::<f64>()?;
        let rows: Vec<&Vec<Vec<f64>>> = match heads {
            Heads::Mean => per_head.iter().collect(),
            Heads::One(_) if per_head.len() == 1 => vec![&per_head[0]],
            Heads::One(h) => vec![
                per_head
                    .get(h)
                    .ok_or_else(|| self.missing_head(h, per_head.len()))?,
            ],
        };
        Ok(Some(lower_triangle_mean(&rows, n)))
    }

    /// RoPE's content-free long-range decay at each distance (RoFormer §3.4.3), with the
    /// variant's relative positions; `None` for non-rotary encodings.
    pub fn rotary_decay(&self, distances: &[f64]) -> Option<Vec<f64>> {
        let RotaryProfile {
            thetas, positions, ..
        } = self.encoding.rotary_profile()?;
        let effective: Vec<f64> = distances.iter().map(|&t| positions.effective(t)).collect();
        Some(super::rotary_decay(&thetas, &effective))
    }
}

/// One head's verdict: the closed form where the family settles it (with the numbers beside
/// it), the numerical test otherwise.
fn head_verdict(head: &dyn DistanceBias) -> Convergence {
    let numeric = super::convergence(head);
    let Some((verdict, reason)) = head.known() else {
        return numeric;
    };
    let agreement = if numeric.verdict == verdict {
        "the numbers agree"
    } else {
        "the numbers up to t = 2.2e12 cannot show it"
    };
    Convergence {
        verdict,
        evidence: format!("{reason}: {verdict} ({agreement}: {})", numeric.evidence),
        ..numeric
    }
}

/// Heads with distinct parameters, so identical heads are analysed once.
fn distinct_heads(heads: &[Arc<dyn DistanceBias>]) -> Vec<Arc<dyn DistanceBias>> {
    let mut seen: Vec<(Vec<u64>, Arc<dyn DistanceBias>)> = Vec::new();
    for head in heads {
        let key = probe_key(head);
        if !seen.iter().any(|(k, _)| *k == key) {
            seen.push((key, head.clone()));
        }
    }
    seen.into_iter().map(|(_, h)| h).collect()
}

/// Where `head` (or a head with the same values) sits in `distinct`.
fn position_of(distinct: &[Arc<dyn DistanceBias>], head: &Arc<dyn DistanceBias>) -> usize {
    let key = probe_key(head);
    distinct
        .iter()
        .position(|d| probe_key(d) == key)
        .unwrap_or(0)
}

/// The bias at every distance up to 512 and a few far ones, bit for bit: equal keys mean
/// equal parameters for every family attnlab has.
fn probe_key(head: &Arc<dyn DistanceBias>) -> Vec<u64> {
    (0..=PROBED_DISTANCES)
        .map(|t| t as f64)
        .chain([1e3, 1e4, 1e6, 1e9])
        .map(|t| head.at(t).to_bits())
        .collect()
}

/// Every distance up to here is compared: beyond it, every learned table attnlab has is
/// constant or within the probed points' buckets (T5's default buckets end at 128).
const PROBED_DISTANCES: usize = 512;

/// exp(p(i − j)) averaged over heads, NaN above the diagonal.
fn toeplitz_exp(heads: &[Arc<dyn DistanceBias>], n: usize) -> Vec<f64> {
    let mut mean = vec![0.0; n];
    let mut row = vec![0.0; n];
    for head in heads {
        head.fill(&mut row);
        mean.iter_mut().zip(&row).for_each(|(m, p)| *m += p.exp());
    }
    let count = heads.len().max(1) as f64;
    (0..n * n)
        .map(|ij| {
            let (i, j) = (ij / n, ij % n);
            if j > i { f64::NAN } else { mean[i - j] / count }
        })
        .collect()
}

/// The mean of (n, n) matrices over heads, lower triangle only.
fn lower_triangle_mean(heads: &[&Vec<Vec<f64>>], n: usize) -> Vec<f64> {
    let count = heads.len().max(1) as f64;
    (0..n * n)
        .map(|ij| {
            let (i, j) = (ij / n, ij % n);
            if j > i {
                f64::NAN
            } else {
                heads.iter().map(|m| m[i][j]).sum::<f64>() / count
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alibi_exp_bias_heatmap_is_toeplitz_and_nan_above_the_diagonal() {
        let alibi =
            StudiedEncoding::untrained(&EncodingSpec::Alibi(Default::default()), 8, 16).unwrap();
        let m = alibi.exp_bias_matrix(4, Heads::One(0)).unwrap().unwrap();
        assert!((m[3 * 4] - (-1.5f64).exp()).abs() < 1e-6); // slope 1/2, distance 3
        assert!((m[2 * 4 + 1] - (-0.5f64).exp()).abs() < 1e-6);
        assert!(m[1].is_nan());
    }

    #[test]
    fn nope_has_a_flat_heatmap_and_diverges() {
        let none =
            StudiedEncoding::untrained(&EncodingSpec::None(Default::default()), 2, 8).unwrap();
        let m = none.exp_bias_matrix(3, Heads::Mean).unwrap().unwrap();
        assert_eq!(m[2 * 3], 1.0);
        assert_eq!(none.verdict().unwrap().verdict, "diverges");
    }

    #[test]
    fn absolute_and_rotary_encodings_are_not_applicable() {
        for name in ["sinusoidal", "rope", "diet-abs"] {
            let spec = EncodingSpec::from_name(name).unwrap();
            let studied = StudiedEncoding::untrained(&spec, 2, 8).unwrap();
            let report = studied.verdict().unwrap();
            assert_eq!(report.verdict, "not-applicable", "{name}");
            assert!(
                studied
                    .trf(64, 10, Heads::Mean, Rows::Last)
                    .unwrap()
                    .is_none()
            );
        }
    }

    #[test]
    fn rerope_decay_is_flat_beyond_the_window() {
        let spec = EncodingSpec::from_name("rerope").unwrap();
        let studied = StudiedEncoding::untrained(&spec, 1, 16).unwrap();
        let decay = studied.rotary_decay(&[16.0, 40.0, 4000.0]).unwrap();
        assert!((decay[0] - decay[1]).abs() < 1e-12 && (decay[0] - decay[2]).abs() < 1e-12);
        assert!(studied.rotary_decay(&[0.0]).unwrap()[0] > decay[0]);
    }
}
