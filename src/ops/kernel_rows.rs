//! Kernel attention's weights in one pass: w_ij = κ(s_ij) / (Σ_n κ(s_in) + ε) over the keys a
//! causal query sees, 0 beyond them. Composed from tensor ops, κ (up to four elementwise ops),
//! the causal gate, the row sum and the division made five to eight (…, T, T) tensors forward
//! and as many again backward: half of a Based or ReBased training step on the CPU (perf, d 32,
//! T 64, six replicas). Here the forward pass writes the weights only, and the backward pass
//! rebuilds κ and the row sums from the scores instead of keeping them.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, D, Layout, Tensor};
use rayon::prelude::*;

use super::fused::{last_dim, slice, zeros};
use super::softmax::causal_visible;
use super::{causal_mask, cpu_f32};
use crate::Result;

/// ε of the normaliser, as the reference kernels' o / (z + 1e-12): it only matters for a row
/// whose kernel values are all 0 (ReBased can reach 0).
const EPSILON: f32 = 1e-12;

/// The kernel κ applied to a (scaled) score s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowKernel {
    /// κ(s) = s: linear attention, whose scores are already φ(q)·φ(k).
    Identity,
    /// κ(s) = 1 + s + s²/2: Based's second-order Taylor polynomial of exp.
    Taylor,
    /// κ(s) = s²: ReBased.
    Square,
}

impl RowKernel {
    fn value(self, s: f32) -> f32 {
        match self {
            Self::Identity => s,
            Self::Taylor => 1.0 + s + 0.5 * s * s,
            Self::Square => s * s,
        }
    }

    /// dκ/ds.
    fn slope(self, s: f32) -> f32 {
        match self {
            Self::Identity => 1.0,
            Self::Taylor => 1.0 + s,
            Self::Square => 2.0 * s,
        }
    }

    /// κ of every score, from tensor ops.
    pub fn apply(self, scores: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Self::Identity => scores.clone(),
            Self::Taylor => ((scores.sqr()? * 0.5)? + (scores + 1.0)?)?,
            Self::Square => scores.sqr()?,
        })
    }

    /// A row of scores replaced by its weights κ(s) / (Σ κ + ε); returns 1 / (Σ κ + ε).
    pub(super) fn normalise(self, row: &mut [f32]) -> f32 {
        let mut sum = 0f32;
        for x in row.iter_mut() {
            *x = self.value(*x);
            sum += *x;
        }
        let inv = 1.0 / (sum + EPSILON);
        row.iter_mut().for_each(|x| *x *= inv);
        inv
    }

    /// `w = κ(s) · inv` from a row's scores and the 1/Z [`Self::normalise`] returned for them:
    /// the same weights in one pass.
    pub(super) fn weights_from(self, scores: &[f32], w: &mut [f32], inv: f32) {
        for (w, s) in w.iter_mut().zip(scores) {
            *w = self.value(*s) * inv;
        }
    }

    /// A row of weights w replaced by the scores' gradient κ'(s) ⊙ (dw − Σ dw·w) / Z, from
    /// the weights' gradient dw, the scores s and `inv` = 1/Z that [`Self::normalise`] returned.
    pub(super) fn grad_in_place(self, w: &mut [f32], dw: &[f32], scores: &[f32], inv: f32) {
        let dot: f32 = dw.iter().zip(w.iter()).map(|(a, b)| a * b).sum();
        for ((w, dw), s) in w.iter_mut().zip(dw).zip(scores) {
            *w = self.slope(*s) * (dw - dot) * inv;
        }
    }
}

/// Row-normalised κ(scores) under the causal mask, scores (…, Tq, Tk) with query i at key
/// position i + Tk − Tq (a block of the last queries, or the whole sequence).
pub fn kernel_rows(scores: &Tensor, kernel: RowKernel) -> Result<Tensor> {
    if cpu_f32(scores) {
        return Ok(scores.contiguous()?.apply_op1(KernelRows { kernel })?);
    }
    kernel_rows_composed(scores, kernel)
}

/// [`kernel_rows`] from tensor ops (any device; the reference).
pub fn kernel_rows_composed(scores: &Tensor, kernel: RowKernel) -> Result<Tensor> {
    let kappa = kernel.apply(scores)?;
    normalise_rows(&kappa.broadcast_mul(&causal_mask(&kappa)?.exp()?)?)
}

/// Gated kernel values divided by their row sums (+ ε), as tensor ops: the last step of the
/// explicit kernel paths, with or without a bias in the gate.
pub fn normalise_rows(gated: &Tensor) -> Result<Tensor> {
    let norm = (gated.sum_keepdim(D::Minus1)? + f64::from(EPSILON))?;
    Ok(gated.broadcast_div(&norm)?)
}

/// (Tq, Tk): the last two dimensions.
fn queries_and_keys(layout: &Layout) -> (usize, usize) {
    let dims = layout.dims();
    (dims[dims.len().saturating_sub(2)], last_dim(layout))
}

struct KernelRows {
    kernel: RowKernel,
}

impl CustomOp1 for KernelRows {
    fn name(&self) -> &'static str {
        "attnlab-kernel-rows"
    }

    cpu_fwd!(self, |storage, layout| {
        let scores = slice(storage, layout)?;
        let (tq, tk) = queries_and_keys(layout);
        let mut out = zeros(scores.len());
        out.par_chunks_mut(tk)
            .zip(scores.par_chunks(tk))
            .enumerate()
            .for_each(|(r, (o, s))| {
                let n = causal_visible(r, tq, tk);
                o[..n].copy_from_slice(&s[..n]);
                self.kernel.normalise(&mut o[..n]);
            });
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    });

    fn bwd(
        &self,
        scores: &Tensor,
        _weights: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        let op = KernelRowsGrad {
            kernel: self.kernel,
        };
        Ok(Some(
            grad.contiguous()?
                .apply_op2_no_bwd(&scores.contiguous()?, &op)?,
        ))
    }
}

/// ds from dw and the scores: with Z = Σ κ + ε and w = κ/Z,
/// ds_j = κ'(s_j) · (dw_j − Σ_n dw_n w_n) / Z on the visible keys, 0 beyond them.
struct KernelRowsGrad {
    kernel: RowKernel,
}

impl CustomOp2 for KernelRowsGrad {
    fn name(&self) -> &'static str {
        "attnlab-kernel-rows-grad"
    }

    cpu_fwd!(self, |s1, l1, s2, l2| {
        let (upstream, scores) = (slice(s1, l1)?, slice(s2, l2)?);
        let (tq, tk) = queries_and_keys(l2);
        let mut out = zeros(scores.len());
        out.par_chunks_mut(tk)
            .zip(upstream.par_chunks(tk).zip(scores.par_chunks(tk)))
            .enumerate()
            .for_each(|(r, (o, (dw, s)))| {
                let n = causal_visible(r, tq, tk);
                let (o, dw, s) = (&mut o[..n], &dw[..n], &s[..n]);
                o.copy_from_slice(s);
                let inv = self.kernel.normalise(o);
                self.kernel.grad_in_place(o, dw, s, inv);
            });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{max_abs, max_diff, random};
    use candle_core::Var;

    /// Random scores (2, 3, tq, tk) around 0, some negative, and a random upstream weight.
    fn scores_and_upstream(tq: usize, tk: usize) -> (Var, Tensor) {
        let shape = [2, 3, tq, tk];
        let scores = Var::from_tensor(&random(&shape, 7, "scores")).unwrap();
        (scores, random(&shape, 8, "upstream"))
    }

    #[test]
    fn fused_rows_equal_the_composed_ones_in_value_and_gradient() {
        for kernel in [RowKernel::Identity, RowKernel::Taylor, RowKernel::Square] {
            // A whole sequence and a block of its last queries.
            for (tq, tk) in [(9, 9), (4, 9)] {
                let (scores, upstream) = scores_and_upstream(tq, tk);
                let mut results = Vec::new();
                for fused in [true, false] {
                    let weights = if fused {
                        kernel_rows(scores.as_tensor(), kernel).unwrap()
                    } else {
                        kernel_rows_composed(scores.as_tensor(), kernel).unwrap()
                    };
                    let grads = (&weights * &upstream)
                        .unwrap()
                        .sum_all()
                        .unwrap()
                        .backward()
                        .unwrap();
                    let grad = grads.get(scores.as_tensor()).unwrap().clone();
                    results.push((weights, grad));
                }
                let ((w, g), (w_ref, g_ref)) = (&results[0], &results[1]);
                assert!(max_diff(w, w_ref) < 1e-5, "{kernel:?} {tq}×{tk} value");
                // Identity rows of normal scores can sum near 0, which magnifies rounding.
                let scale = max_abs(g_ref);
                assert!(
                    max_diff(g, g_ref) <= 1e-5 * scale.max(1.0),
                    "{kernel:?} {tq}×{tk} gradient"
                );
                assert!(scale > 0.0, "{kernel:?}: a gradient of zero tests nothing");
            }
        }
    }

    #[test]
    fn rows_sum_to_one_and_nothing_attends_ahead() {
        let (scores, _) = scores_and_upstream(5, 5);
        let w = kernel_rows(scores.as_tensor(), RowKernel::Square).unwrap();
        let rows = w.sum(D::Minus1).unwrap().flatten_all().unwrap();
        for sum in rows.to_vec1::<f32>().unwrap() {
            assert!((sum - 1.0).abs() < 1e-5, "row sum {sum}");
        }
        let first = w.get(0).unwrap().get(0).unwrap().to_vec2::<f32>().unwrap();
        for (i, row) in first.iter().enumerate() {
            assert!(row[i + 1..].iter().all(|w| *w == 0.0), "row {i}: {row:?}");
        }
        assert_eq!(RowKernel::Taylor.value(-1.0), 0.5, "Based's minimum");
    }
}
