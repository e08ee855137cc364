//! Spectra of attention matrices: "self-attention is low rank" (Linformer, §3 and Figure 1).
//!
//! For every layer and head of a run, the singular values σ₁ ≥ σ₂ ≥ … of each attention matrix
//! P (Tq × Tk; n × k for Linformer), and the normalised cumulative curve
//! `c(i) = Σ_{j ≤ i} σ_j / Σ_j σ_j` (or with σ² when `squared`, the energy the best rank-i
//! approximation keeps; the paper does not say which it plots), each averaged over examples.
//! The heatmap cell of a layer and head is the mean c at one index (the paper uses 128 of 512,
//! so attnlab defaults to a quarter of the columns). Rows of MQAR runs all have the same
//! length, so there is no padding to handle.
//!
//! Singular values are the square roots of the eigenvalues of the Gram matrix of the smaller
//! side (PᵀP or PPᵀ), found in f64 by Householder tridiagonalisation and the implicit QL
//! algorithm (eigenvalues only). Squaring loses relative precision below about 1e-8 · σ₁, far
//! below what the cumulative curve can show.

use std::sync::atomic::AtomicBool;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::trained::TrainedRun;
use crate::attention::MechanismSpec;
use crate::{Error, Result};

/// The most QL iterations per eigenvalue before giving up (convergence is cubic; 2–3 is typical).
const MAX_QL_ITERATIONS: usize = 64;

/// The singular values of the row-major `rows × cols` matrix `a`, largest first.
pub fn singular_values(a: &[f64], rows: usize, cols: usize) -> Result<Vec<f64>> {
    if a.len() != rows * cols {
        return Err(Error::argument(
            "matrix",
            format!("of {} values", a.len()),
            format!("does not form the {rows}×{cols} matrix whose singular values are asked"),
        ));
    }
    let n = rows.min(cols);
    // Gram matrix of the smaller side: G = AᵀA (cols ≤ rows) or AAᵀ.
    let at = |r: usize, c: usize| a[r * cols + c];
    let mut gram = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..=i {
            let dot: f64 = if cols <= rows {
                (0..rows).map(|r| at(r, i) * at(r, j)).sum()
            } else {
                (0..cols).map(|c| at(i, c) * at(j, c)).sum()
            };
            gram[i * n + j] = dot;
            gram[j * n + i] = dot;
        }
    }
    let mut values: Vec<f64> = symmetric_eigenvalues(gram, n)?
        .into_iter()
        .map(|l| l.max(0.0).sqrt())
        .collect();
    values.sort_by(|x, y| y.total_cmp(x));
    Ok(values)
}

/// Eigenvalues of the symmetric `n × n` matrix `a` (row-major; its lower triangle is read).
pub fn symmetric_eigenvalues(mut a: Vec<f64>, n: usize) -> Result<Vec<f64>> {
    let (mut d, mut e) = tridiagonalise(&mut a, n);
    tridiagonal_ql(&mut d, &mut e)?;
    Ok(d)
}

/// Householder reduction to tridiagonal form (Numerical Recipes' `tred2` without the
/// eigenvectors): the diagonal, and the sub-diagonal in `e[1..]` (`e[0] = 0`).
fn tridiagonalise(a: &mut [f64], n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut e = vec![0.0; n];
    for i in (1..n).rev() {
        let l = i - 1;
        let row = i * n;
        let scale: f64 = (0..=l).map(|k| a[row + k].abs()).sum();
        if l == 0 || scale == 0.0 {
            e[i] = a[row + l];
            continue;
        }
        let mut h = 0.0;
        for k in 0..=l {
            a[row + k] /= scale;
            h += a[row + k] * a[row + k];
        }
        let f = a[row + l];
        let g = if f >= 0.0 { -h.sqrt() } else { h.sqrt() };
        e[i] = scale * g;
        h -= f * g;
        a[row + l] = f - g;
        let mut f = 0.0;
        for j in 0..=l {
            let g: f64 = (0..=j).map(|k| a[j * n + k] * a[row + k]).sum::<f64>()
                + (j + 1..=l).map(|k| a[k * n + j] * a[row + k]).sum::<f64>();
            e[j] = g / h;
            f += e[j] * a[row + j];
        }
        let hh = f / (h + h);
        for j in 0..=l {
            let f = a[row + j];
            let g = e[j] - hh * f;
            e[j] = g;
            for k in 0..=j {
                a[j * n + k] -= f * e[k] + g * a[row + k];
            }
        }
    }
    let d = (0..n).map(|i| a[i * n + i]).collect();
    (d, e)
}

/// Eigenvalues of the symmetric tridiagonal matrix (`d`, sub-diagonal `e[1..]`) by the implicit
/// QL algorithm with Wilkinson shifts (Numerical Recipes' `tqli` without eigenvectors); they
/// replace `d`.
fn tridiagonal_ql(d: &mut [f64], e: &mut [f64]) -> Result<()> {
    let n = d.len();
    if n == 0 {
        return Ok(());
    }
    e.copy_within(1.., 0);
    e[n - 1] = 0.0;
    for l in 0..n {
        let mut iterations = 0;
        loop {
            let mut m = l;
            while m + 1 < n {
                let dd = d[m].abs() + d[m + 1].abs();
                if e[m].abs() <= f64::EPSILON * dd {
                    break;
                }
                m += 1;
            }
            if m == l {
                break;
            }
            iterations += 1;
            if iterations > MAX_QL_ITERATIONS {
                return Err(Error::argument(
                    "matrix",
                    format!("of order {n}"),
                    format!(
                        "has eigenvalues that did not converge in {MAX_QL_ITERATIONS} QL \
                         iterations (does it hold NaN or infinite values?)"
                    ),
                ));
            }
            let mut g = (d[l + 1] - d[l]) / (2.0 * e[l]);
            let mut r = g.hypot(1.0);
            g = d[m] - d[l] + e[l] / (g + if g >= 0.0 { r } else { -r });
            let (mut s, mut c, mut p) = (1.0, 1.0, 0.0);
            let mut deflated = false;
            for i in (l..m).rev() {
                let f = s * e[i];
                let b = c * e[i];
                r = f.hypot(g);
                e[i + 1] = r;
                if r == 0.0 {
                    d[i + 1] -= p;
                    e[m] = 0.0;
                    deflated = true;
                    break;
                }
                s = f / r;
                c = g / r;
                g = d[i + 1] - p;
                r = (d[i] - g) * s + 2.0 * c * b;
                p = s * r;
                d[i + 1] = g + p;
                g = c * r - b;
            }
            if deflated {
                continue;
            }
            d[l] -= p;
            e[l] = g;
            e[m] = 0.0;
        }
    }
    Ok(())
}

/// The normalised cumulative curve of `sigma` (largest first): c(i) for i = 1..=len.
pub fn cumulative(sigma: &[f64], squared: bool) -> Vec<f64> {
    let weight = |s: f64| if squared { s * s } else { s };
    let total: f64 = sigma.iter().map(|&s| weight(s)).sum();
    let mut running = 0.0;
    sigma
        .iter()
        .map(|&s| {
            running += weight(s);
            if total > 0.0 { running / total } else { 0.0 }
        })
        .collect()
}

/// Everything that decides a spectrum.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SpectrumProtocol {
    /// Test rows averaged over.
    pub examples: usize,
    /// Normalise σ² (energy) instead of σ.
    pub squared: bool,
    /// 1-based index of the heatmap's cumulative value; `None` for a quarter of the columns.
    pub at: Option<usize>,
}

impl Default for SpectrumProtocol {
    fn default() -> Self {
        Self {
            examples: 1000,
            squared: false,
            at: None,
        }
    }
}

impl SpectrumProtocol {
    /// One line for captions.
    pub fn describe(&self, at: usize) -> String {
        let what = if self.squared { "σ²" } else { "σ" };
        format!(
            "normalised cumulative {what} of each attention matrix, mean over {} test rows; \
             heatmap at index {at}",
            self.examples
        )
    }
}

/// The spectra of one run's attention.
#[derive(Clone, Debug, Serialize)]
pub struct RunSpectrum {
    pub protocol: SpectrumProtocol,
    pub mechanism: String,
    /// Linformer's projected length k (the rank bound of its n × k matrices).
    pub proj_dim: Option<usize>,
    pub examples: usize,
    /// Model layer of each entry.
    pub layers: Vec<usize>,
    /// (Tq, Tk) of the matrices.
    pub shape: (usize, usize),
    /// The heatmap's index (1-based).
    pub at: usize,
    /// Mean singular values, `[layer][head][i]`.
    pub singular_values: Vec<Vec<Vec<f64>>>,
    /// Mean normalised cumulative curve, `[layer][head][i]` (entry i is c(i + 1)).
    pub cumulative: Vec<Vec<Vec<f64>>>,
    /// Mean c(at), `[layer][head]`: the heatmap.
    pub at_value: Vec<Vec<f64>>,
}

#[cfg(test)]
impl RunSpectrum {
    /// One head of one layer's 2 × 2 matrices: the spectrum the figures' and reports' tests
    /// draw and print.
    pub fn fixture(mechanism: &str, proj_dim: Option<usize>) -> Self {
        Self {
            protocol: SpectrumProtocol::default(),
            mechanism: mechanism.into(),
            proj_dim,
            examples: 1,
            layers: vec![0],
            shape: (2, 2),
            at: 1,
            singular_values: vec![vec![vec![1.0, 0.5]]],
            cumulative: vec![vec![vec![0.7, 1.0]]],
            at_value: vec![vec![0.7]],
        }
    }
}

impl RunSpectrum {
    /// The cumulative curve of layer entry `l`, averaged over heads.
    pub fn layer_curve(&self, l: usize) -> Vec<f64> {
        let heads = &self.cumulative[l];
        let len = heads.first().map_or(0, Vec::len);
        (0..len)
            .map(|i| heads.iter().map(|c| c[i]).sum::<f64>() / heads.len() as f64)
            .collect()
    }
}

/// Running sums of the singular values and cumulative curves of one layer, per head.
struct Sums {
    sigma: Vec<Vec<f64>>,
    cumulative: Vec<Vec<f64>>,
}

/// The spectra of every attention layer and head of `run` over its first `protocol.examples`
/// test rows, with the SVDs spread over the CPU cores. `Ok(None)` when `cancel` was set.
pub fn run_spectrum(
    run: &TrainedRun,
    protocol: &SpectrumProtocol,
    progress: &mut dyn FnMut(f32),
    cancel: &AtomicBool,
) -> Result<Option<RunSpectrum>> {
    if protocol.examples == 0 {
        return Err(Error::argument(
            "examples (--examples)",
            0,
            "are too few: a spectrum needs at least 1 example",
        ));
    }
    let layers = run.attention_layers();
    let heads = run.preset.model.n_heads;
    let examples = run.test_examples(protocol.examples)?;
    let mut sums: Vec<Option<Sums>> = (0..layers.len()).map(|_| None).collect();
    let mut shape = (0, 0);
    let finished = run.for_each_batch(&examples, progress, cancel, &mut |batch, attention| {
        for (l, &layer) in layers.iter().enumerate() {
            let Some(weights) = &attention[layer] else {
                continue;
            };
            let [_, _, tq, tk] = weights.shape;
            shape = (tq, tk);
            let spectra: Vec<(usize, Vec<f64>)> = (0..batch.len() * heads)
                .into_par_iter()
                .map(|i| {
                    let m: Vec<f64> = weights
                        .matrix(i / heads, i % heads)
                        .iter()
                        .map(|&w| f64::from(w))
                        .collect();
                    Ok((i % heads, singular_values(&m, tq, tk)?))
                })
                .collect::<Result<_>>()?;
            let n = tq.min(tk);
            let sums = sums[l].get_or_insert_with(|| Sums {
                sigma: vec![vec![0.0; n]; heads],
                cumulative: vec![vec![0.0; n]; heads],
            });
            for (h, sigma) in spectra {
                add(
                    &mut sums.cumulative[h],
                    &cumulative(&sigma, protocol.squared),
                );
                add(&mut sums.sigma[h], &sigma);
            }
        }
        Ok(())
    })?;
    if !finished {
        return Ok(None);
    }
    let count = examples.len() as f64;
    let mean = |v: &[Vec<f64>]| -> Vec<Vec<f64>> {
        v.iter()
            .map(|h| h.iter().map(|s| s / count).collect())
            .collect()
    };
    let sums: Vec<Sums> = sums.into_iter().flatten().collect();
    let n = shape.0.min(shape.1);
    let at = protocol.at.unwrap_or((shape.1 / 4).max(1));
    if at == 0 || at > n {
        return Err(Error::argument(
            "spectrum index",
            at,
            format!("is out of range: the matrices have {n} singular values"),
        ));
    }
    let cumulative: Vec<Vec<Vec<f64>>> = sums.iter().map(|s| mean(&s.cumulative)).collect();
    Ok(Some(RunSpectrum {
        // The rows there were: a run on mad-lab's published data may hold fewer than asked.
        protocol: SpectrumProtocol {
            examples: examples.len(),
            ..*protocol
        },
        mechanism: run.preset.attention.name().into(),
        proj_dim: match &run.preset.attention {
            MechanismSpec::Linformer(c) => Some(c.proj_dim),
            _ => None,
        },
        examples: examples.len(),
        layers,
        shape,
        at,
        singular_values: sums.iter().map(|s| mean(&s.sigma)).collect(),
        at_value: cumulative
            .iter()
            .map(|l| l.iter().map(|c| c[at - 1]).collect())
            .collect(),
        cumulative,
    }))
}

fn add(sum: &mut [f64], values: &[f64]) {
    sum.iter_mut().zip(values).for_each(|(s, v)| *s += v);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NaN never converges: the error names the matrix, not a bug in the solver.
    #[test]
    fn a_matrix_with_nan_is_an_argument_error() {
        let err = singular_values(&[1.0, f64::NAN, 0.5, 2.0], 2, 2).unwrap_err();
        assert!(
            matches!(&err, Error::Argument { name, .. } if name == "matrix"),
            "{err}"
        );
        let err = singular_values(&[1.0; 5], 2, 2).unwrap_err();
        assert!(err.to_string().contains("of 5 values"), "{err}");
    }

    /// Column j of the orthonormal DCT-II basis of size n.
    fn dct(n: usize, j: usize) -> Vec<f64> {
        let scale = if j == 0 {
            (1.0 / n as f64).sqrt()
        } else {
            (2.0 / n as f64).sqrt()
        };
        (0..n)
            .map(|i| scale * (std::f64::consts::PI * (i as f64 + 0.5) * j as f64 / n as f64).cos())
            .collect()
    }

    /// U diag(σ) Vᵀ with orthonormal DCT columns for U (rows × r) and V (cols × r).
    fn low_rank(rows: usize, cols: usize, sigma: &[f64]) -> Vec<f64> {
        let mut a = vec![0.0; rows * cols];
        for (j, &s) in sigma.iter().enumerate() {
            let (u, v) = (dct(rows, j), dct(cols, j + 1));
            for r in 0..rows {
                for c in 0..cols {
                    a[r * cols + c] += s * u[r] * v[c];
                }
            }
        }
        a
    }

    #[test]
    fn singular_values_of_a_known_low_rank_matrix_are_recovered() {
        for (rows, cols) in [(16, 16), (24, 10), (10, 24)] {
            let sigma = [5.0, 2.0, 0.5];
            let got = singular_values(&low_rank(rows, cols, &sigma), rows, cols).unwrap();
            assert_eq!(got.len(), rows.min(cols));
            for (g, want) in got.iter().zip(&sigma) {
                assert!((g - want).abs() < 1e-10, "{rows}x{cols}: {got:?}");
            }
            assert!(got[3..].iter().all(|&s| s < 1e-6), "{got:?}");
        }
    }

    #[test]
    fn singular_values_keep_the_frobenius_norm_and_match_a_diagonal() {
        // A pseudo-random full matrix: Σσ² = ‖A‖²_F.
        let (rows, cols) = (20, 13);
        let a: Vec<f64> = (0..rows * cols)
            .map(|i| ((i * 7919) % 101) as f64 / 101.0 - 0.3)
            .collect();
        let sigma = singular_values(&a, rows, cols).unwrap();
        let frobenius: f64 = a.iter().map(|x| x * x).sum();
        let energy: f64 = sigma.iter().map(|s| s * s).sum();
        assert!((frobenius - energy).abs() < 1e-9 * frobenius);
        assert!(sigma.windows(2).all(|w| w[0] >= w[1]));
        // A permuted diagonal with signs: σ are the sorted absolute values.
        let mut d = vec![0.0; 16];
        for (i, v) in [(0, -1.0), (5, 3.0), (10, 0.25), (15, 2.0)] {
            d[i] = v;
        }
        let sigma = singular_values(&d, 4, 4).unwrap();
        assert!(
            sigma
                .iter()
                .zip([3.0, 2.0, 1.0, 0.25])
                .all(|(s, w)| (s - w).abs() < 1e-12),
            "{sigma:?}"
        );
        assert!(singular_values(&d, 3, 4).is_err());
    }

    #[test]
    fn cumulative_curves_are_normalised() {
        assert_eq!(cumulative(&[3.0, 1.0], false), vec![0.75, 1.0]);
        assert_eq!(cumulative(&[3.0, 1.0], true), vec![0.9, 1.0]);
        assert_eq!(cumulative(&[0.0, 0.0], false), vec![0.0, 0.0]);
    }
}
