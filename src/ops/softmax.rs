//! Row softmax with an optional causal mask and an additive bias, one pass each way, and the
//! row arithmetic other ops share with it (a vectorised exp, lane-wise maxima and sums).

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Tensor};
use rayon::prelude::*;

use super::fused::{ChunkGrad, column_sums, last_dim, slice, zeros};

/// Softmax of each row of the last dimension. With `causal`, query row i of a (…, Tq, Tk)
/// block only sees keys j ≤ i + (Tk − Tq); the others get weight 0.
pub struct RowSoftmax {
    pub causal: bool,
}

impl RowSoftmax {
    /// Number of visible keys in row `row` of a tensor whose last two dims are (tq, tk).
    fn visible(&self, row: usize, tq: usize, tk: usize) -> usize {
        if self.causal {
            causal_visible(row, tq, tk)
        } else {
            tk
        }
    }
}

/// A row of scores replaced by its softmax, in vector instructions ([`exp`], [`fold_lanes`]):
/// scalar, the maximum and `expf` were a fifth of a softmax training step. Returns the row's
/// maximum and 1/Σ, with which [`softmax_from_stats`] rebuilds the same weights in one pass.
pub(super) fn softmax_in_place(row: &mut [f32]) -> (f32, f32) {
    super::vectorised(
        #[inline(always)]
        || softmax_loops(row),
    )
}

/// [`softmax_in_place`]'s loops, inlined into each of [`super::vectorised`]'s instruction sets.
/// The exponentials are summed in lanes as they are written ([`exp_and_sum_lanes`]): a running
/// float sum is one dependency chain that would keep the loop scalar.
#[inline(always)]
fn softmax_loops(row: &mut [f32]) -> (f32, f32) {
    let max = row_max(row);
    let inv = 1.0 / exp_and_sum_lanes(row, max);
    row.iter_mut().for_each(|x| *x *= inv);
    (max, inv)
}

/// `row[i] = exp(row[i] − max)`, returning their sum in the order [`fold_lanes`] adds (16
/// partial sums, then the rest): one pass instead of two.
#[inline(always)]
fn exp_and_sum_lanes(row: &mut [f32], max: f32) -> f32 {
    const LANES: usize = 16;
    let mut lanes = [0f32; LANES];
    let mut chunks = row.chunks_exact_mut(LANES);
    for chunk in &mut chunks {
        for (s, x) in lanes.iter_mut().zip(chunk) {
            *x = exp(*x - max);
            *s += *x;
        }
    }
    let rest = chunks.into_remainder();
    rest.iter_mut().for_each(|x| *x = exp(*x - max));
    lanes.iter().chain(rest.iter()).fold(0.0, |a, b| a + b)
}

/// `w = exp(s − max) · inv` from a row's scores and what [`softmax_in_place`] returned for
/// them: the same weights, bit for bit, in one pass.
pub(super) fn softmax_from_stats(scores: &[f32], w: &mut [f32], (max, inv): (f32, f32)) {
    exp_shifted_scaled(scores, w, max, inv);
}

/// The largest value of a row, in 16 lanes ([`fold_lanes`]); −∞ for an empty row.
#[inline(always)]
fn row_max(row: &[f32]) -> f32 {
    fold_lanes(row, f32::NEG_INFINITY, |m, x| if x > m { x } else { m })
}

/// `row` folded with `f`, kept in 16 partial results (lanes) so that the loop vectorises, then
/// folded together: a max, or a sum in a different order than one left to right.
#[inline(always)]
pub(super) fn fold_lanes(row: &[f32], init: f32, f: impl Fn(f32, f32) -> f32) -> f32 {
    const LANES: usize = 16;
    let mut lanes = [init; LANES];
    let chunks = row.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (m, x) in lanes.iter_mut().zip(chunk) {
            *m = f(*m, *x);
        }
    }
    lanes.iter().chain(rest).fold(init, |a, b| f(a, *b))
}

/// eˣ within 2 ulp for x ≤ 88 (0 below −87.3, where f32 underflows), as Cephes' `expf`:
/// x = n·ln 2 + r with n rounded by adding 1.5·2²³ (whose low bits then hold n, so 2ⁿ is a shift
/// away), eʳ by its degree-6 minimax polynomial. libm's `expf` is a call the compiler cannot vectorise;
/// this is a few vector instructions per lane, with no float-to-int conversion.
#[inline(always)]
pub(super) fn exp(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5·2²³
    let clamped = x.min(88.0);
    let t = clamped * std::f32::consts::LOG2_E + ROUND;
    let n = t - ROUND;
    let r = clamped - n * LN2_HI - n * LN2_LO;
    let p = [
        1.987_569_1e-4,
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ]
    .iter()
    .fold(0.0, |p, c| p * r + c);
    let y = p * r * r + r + 1.0;
    let two_to_n = f32::from_bits(t.to_bits().wrapping_sub(ROUND.to_bits() - 127) << 23);
    if x < -87.3 { 0.0 } else { y * two_to_n }
}

/// (max, Σ exp(x − max)) of a row, in vector instructions: its log-sum-exp is max + ln(sum).
/// The loss's rows (V wide) took 6 % of a step with a scalar `expf`.
pub(super) fn max_and_exp_sum(row: &[f32]) -> (f32, f32) {
    super::vectorised(
        #[inline(always)]
        || {
            let max = row_max(row);
            (max, sum_lanes(row, |x| exp(x - max)))
        },
    )
}

/// `out = exp(x − max) · factor` over a row, in vector instructions.
pub(super) fn exp_shifted_scaled(x: &[f32], out: &mut [f32], max: f32, factor: f32) {
    super::vectorised(
        #[inline(always)]
        || {
            for (o, x) in out.iter_mut().zip(x) {
                *o = exp(*x - max) * factor;
            }
        },
    );
}

/// A row of softmax weights w replaced by the scores' gradient w ⊙ (dw − Σ dw·w).
pub(super) fn softmax_grad_in_place(w: &mut [f32], dw: &[f32]) {
    super::vectorised(
        #[inline(always)]
        || {
            let dot = dot_lanes(dw, w);
            for (w, dw) in w.iter_mut().zip(dw) {
                *w *= dw - dot;
            }
        },
    );
}

/// Number of keys that row `row` of a causal (…, tq, tk) tensor sees: its queries are the last
/// tq positions of tk.
pub(super) fn causal_visible(row: usize, tq: usize, tk: usize) -> usize {
    (row % tq + 1 + tk.saturating_sub(tq)).min(tk)
}

impl CustomOp1 for RowSoftmax {
    fn name(&self) -> &'static str {
        "attnlab-row-softmax"
    }

    cpu_fwd!(self, |storage, layout| {
        let x = slice(storage, layout)?;
        let dims = layout.dims();
        let tk = last_dim(layout);
        let tq = if dims.len() >= 2 {
            dims[dims.len() - 2]
        } else {
            1
        };
        let mut out = zeros(x.len());
        out.par_chunks_mut(tk)
            .zip(x.par_chunks(tk))
            .enumerate()
            .for_each(|(r, (o, row))| {
                let n = self.visible(r, tq, tk);
                o[..n].copy_from_slice(&row[..n]);
                softmax_in_place(&mut o[..n]);
            });
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    });

    cuda_fwd!(self, |storage, layout| {
        super::cuda::row_softmax(storage, layout, self.causal)
    });

    fn bwd(
        &self,
        _arg: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        ROW_SOFTMAX_GRAD.apply(grad_res, res)
    }
}

/// softmax(x + bias) per row, the causal mask as [`RowSoftmax`]; the bias is a table of whole
/// rows ((H, Tq, Tk) or (1, Tq, Tk)) repeated over x's leading dimensions. One pass where the
/// bias add was another (B, H, Tq, Tk) tensor forward and a gradient backward.
pub struct BiasedRowSoftmax {
    pub causal: bool,
}

impl CustomOp2 for BiasedRowSoftmax {
    fn name(&self) -> &'static str {
        "attnlab-biased-row-softmax"
    }

    cpu_fwd!(self, |s1, l1, s2, l2| {
        let (x, bias) = (slice(s1, l1)?, slice(s2, l2)?);
        let dims = l1.dims();
        let tk = last_dim(l1);
        let tq = dims[dims.len() - 2];
        let mask = RowSoftmax {
            causal: self.causal,
        };
        let mut out = zeros(x.len());
        out.par_chunks_mut(tk)
            .zip(x.par_chunks(tk))
            .enumerate()
            .for_each(|(r, (o, row))| {
                let n = mask.visible(r, tq, tk);
                let b = &bias[(r * tk) % bias.len()..][..tk];
                for ((o, x), b) in o[..n].iter_mut().zip(&row[..n]).zip(b) {
                    *o = x + b;
                }
                softmax_in_place(&mut o[..n]);
            });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    });

    cuda_fwd!(self, |s1, l1, s2, l2| {
        super::cuda::row_softmax_bias((s1, l1), (s2, l2), self.causal)
    });

    /// ds as for [`RowSoftmax`]; the bias's gradient sums ds over the repeats, and is only
    /// computed for a bias that trains (ALiBi's or a Type series' is a constant).
    fn bwd(
        &self,
        _x: &Tensor,
        bias: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let ds = ROW_SOFTMAX_GRAD
            .apply(grad_res, res)?
            .ok_or_else(|| candle_core::Error::Msg("row softmax gradient".into()))?;
        let dbias = if bias.track_op() {
            let n = bias.elem_count();
            let sums = column_sums(&ds.reshape((ds.elem_count() / n, n))?)?;
            Some(sums.reshape(bias.shape())?)
        } else {
            None
        };
        Ok((Some(ds), dbias))
    }
}

/// Σ f(xᵢ) in 16 partial sums, so that the loop vectorises (as [`fold_lanes`]).
#[inline(always)]
pub(super) fn sum_lanes(row: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    const LANES: usize = 16;
    let mut lanes = [0f32; LANES];
    let chunks = row.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (s, x) in lanes.iter_mut().zip(chunk) {
            *s += f(*x);
        }
    }
    lanes.iter().sum::<f32>() + rest.iter().map(|x| f(*x)).sum::<f32>()
}

/// Σ aᵢ·bᵢ in 16 partial sums.
#[inline(always)]
pub(super) fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut lanes = [0f32; LANES];
    let (a_chunks, b_chunks) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let rest: f32 = (a_chunks.remainder().iter().zip(b_chunks.remainder()))
        .map(|(a, b)| a * b)
        .sum();
    for (a, b) in a_chunks.zip(b_chunks) {
        for ((s, a), b) in lanes.iter_mut().zip(a).zip(b) {
            *s += a * b;
        }
    }
    lanes.iter().sum::<f32>() + rest
}

/// The row softmax's gradient, ds = w ⊙ (dw − Σ dw·w) per row from the weights w saved;
/// masked entries have w = 0 and get 0.
const ROW_SOFTMAX_GRAD: ChunkGrad = ChunkGrad {
    name: "attnlab-row-softmax-grad",
    kernel: "attnlab_row_softmax_grad",
    chunk: None,
    f: |o, dw, w| {
        o.copy_from_slice(w);
        softmax_grad_in_place(o, dw);
    },
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_weights_rebuilt_from_their_statistics_are_the_same_bits() {
        // Lengths below, at and past the 16 lanes of the sums.
        for n in [1, 16, 37] {
            let scores = crate::rng::normal_vec(&mut crate::rng::stream(5, "softmax row"), n, 4.0);
            let mut weights = scores.clone();
            let stats = softmax_in_place(&mut weights);
            let mut rebuilt = vec![f32::NAN; n];
            softmax_from_stats(&scores, &mut rebuilt, stats);
            assert_eq!(rebuilt, weights, "{n} scores");
            let total: f32 = weights.iter().sum();
            assert!((total - 1.0).abs() < 1e-6, "{n} weights sum to {total}");
        }
    }

    #[test]
    fn the_vectorised_exp_is_within_two_ulp_of_libms() {
        let mut worst = 0f32;
        for i in 0..=200_000 {
            let x = -87.0 + 175.0 * i as f32 / 200_000.0;
            let (got, want) = (exp(x), x.exp());
            worst = worst.max((got - want).abs() / want);
        }
        assert!(worst <= 2.0 * f32::EPSILON, "relative error {worst}");
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(0.0), 1.0);
    }

    #[test]
    fn the_lane_wise_maximum_is_the_maximum() {
        let row: Vec<f32> = (0..37).map(|i| ((i * 17) % 23) as f32 - 11.0).collect();
        for n in [0, 1, 15, 16, 17, 37] {
            let want = row[..n].iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let max = fold_lanes(&row[..n], f32::NEG_INFINITY, f32::max);
            assert_eq!(max, want, "{n} elements");
        }
    }
}
