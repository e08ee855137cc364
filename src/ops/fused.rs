//! Fused kernels, each with its analytic backward pass: row standardisation and LayerNorm,
//! row softmax with an optional causal mask, GELU (with a branch-free erf), and the column sums
//! that bias gradients need. Built from plain tensor ops a LayerNorm or softmax takes ~8 full
//! passes forward and ~20 backward (8 and 20 kernel launches on a GPU); fused they take one
//! pass each way. Each op runs on contiguous f32 tensors, on the CPU (the Rust below) or on a
//! CUDA GPU (`cuda.rs`, the kernel of the same name in `kernels.cu`); [`super`] falls back to
//! the composed ops elsewhere (other dtypes, Metal), and the tests check both agree, values
//! and gradients, on every device they run on.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

/// The contiguous f32 data of a CPU storage (callers make inputs contiguous first).
pub(super) fn slice<'a>(
    storage: &'a CpuStorage,
    layout: &Layout,
) -> candle_core::Result<&'a [f32]> {
    let CpuStorage::F32(data) = storage else {
        candle_core::bail!("fused ops take f32 tensors");
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("fused ops take contiguous tensors");
    };
    Ok(&data[start..end])
}

/// The contiguous u32 indices of a CPU storage (token ids, class targets), each checked to be
/// below `bound`; `out_of_range(i)` says what an index past it is.
pub(super) fn indices<'a>(
    storage: &'a CpuStorage,
    layout: &Layout,
    bound: usize,
    out_of_range: impl Fn(u32) -> String,
) -> candle_core::Result<&'a [u32]> {
    let CpuStorage::U32(data) = storage else {
        candle_core::bail!("indices must be u32");
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("indices must be contiguous");
    };
    let indices = &data[start..end];
    if let Some(&bad) = indices.iter().find(|&&i| i as usize >= bound) {
        candle_core::bail!("{}", out_of_range(bad));
    }
    Ok(indices)
}

/// `n` zeros, written by all threads: `vec![0.0; n]` zero-fills on the calling thread alone,
/// a serial pass per op output that the profile showed (a few % of a training step).
pub(super) fn zeros(n: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n);
    out.par_extend(rayon::iter::repeat_n(0f32, n));
    out
}

/// Runs `f(out, a, b)` over matching chunks of `chunk` elements of `a` and `b`, in parallel.
fn zip_chunks(
    a: &[f32],
    b: &[f32],
    chunk: usize,
    f: impl Fn(&mut [f32], &[f32], &[f32]) + Sync,
) -> Vec<f32> {
    let mut out = zeros(a.len());
    out.par_chunks_mut(chunk)
        .zip(a.par_chunks(chunk).zip(b.par_chunks(chunk)))
        .for_each(|(o, (a, b))| f(o, a, b));
    out
}

pub(super) fn last_dim(layout: &Layout) -> usize {
    layout.dims().last().copied().unwrap_or(1).max(1)
}

/// (x − mean) / √(var + eps) per row of the last dimension.
pub struct Standardise {
    pub eps: f32,
}

/// A row's mean and 1/√(var + eps), summed in partial sums that vectorise.
#[inline(always)]
fn mean_and_inv_std(row: &[f32], eps: f32) -> (f32, f32) {
    let n = row.len() as f32;
    let mean = sum_lanes(row, |x| x) / n;
    let var = sum_lanes(row, |x| (x - mean) * (x - mean)) / n;
    (mean, 1.0 / (var + eps).sqrt())
}

impl CustomOp1 for Standardise {
    fn name(&self) -> &'static str {
        "attnlab-standardise"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = slice(storage, layout)?;
        let d = last_dim(layout);
        let mut out = zeros(x.len());
        out.par_chunks_mut(d)
            .zip(x.par_chunks(d))
            .for_each(|(o, row)| {
                let (mean, inv) = mean_and_inv_std(row, self.eps);
                for (o, x) in o.iter_mut().zip(row) {
                    *o = (x - mean) * inv;
                }
            });
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }

    cuda_fwd!(self, |storage, layout| {
        super::cuda::standardise(storage, layout, self.eps)
    });

    fn bwd(
        &self,
        arg: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        let grad = grad_res.contiguous()?.apply_op3_no_bwd(
            &arg.contiguous()?,
            &res.contiguous()?,
            &StandardiseGrad { eps: self.eps },
        )?;
        Ok(Some(grad))
    }
}

/// dx = (dy − mean(dy) − y·mean(dy·y)) / σ, inputs (dy, x, y).
struct StandardiseGrad {
    eps: f32,
}

impl CustomOp3 for StandardiseGrad {
    fn name(&self) -> &'static str {
        "attnlab-standardise-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (dy, x, y) = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
        let d = last_dim(l1);
        let mut out = zeros(dy.len());
        out.par_chunks_mut(d)
            .zip(dy.par_chunks(d).zip(x.par_chunks(d).zip(y.par_chunks(d))))
            .for_each(|(o, (dy, (x, y)))| {
                let (_, inv) = mean_and_inv_std(x, self.eps);
                let n = d as f32;
                let mean_dy = dy.iter().sum::<f32>() / n;
                let mean_dyy = dy.iter().zip(y).map(|(a, b)| a * b).sum::<f32>() / n;
                for ((o, dy), y) in o.iter_mut().zip(dy).zip(y) {
                    *o = inv * (dy - mean_dy - y * mean_dyy);
                }
            });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    cuda_fwd!(self, |s1, l1, s2, l2, s3, l3| {
        super::cuda::standardise_grad([(s1, l1), (s2, l2), (s3, l3)], self.eps)
    });
}

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

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
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
    }

    cuda_fwd!(self, |storage, layout| {
        super::cuda::row_softmax(storage, layout, self.causal)
    });

    fn bwd(
        &self,
        _arg: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        ChunkGrad::ROW_SOFTMAX.apply(grad_res, res)
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

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
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
    }

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
        let ds = ChunkGrad::ROW_SOFTMAX
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

/// A gradient computed chunk by chunk from the upstream gradient and one saved tensor
/// (the input or the output of the forward op), in parallel over chunks.
struct ChunkGrad {
    name: &'static str,
    /// The CUDA kernel computing the same (`kernels.cu`).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    kernel: &'static str,
    /// Elements per chunk; `None` for one row of the last dimension.
    chunk: Option<usize>,
    /// `f(out, upstream, saved)` for one chunk.
    f: fn(&mut [f32], &[f32], &[f32]),
}

impl ChunkGrad {
    /// ds = w ⊙ (dw − Σ dw·w) per row, saved = w. Masked entries have w = 0 and get 0.
    const ROW_SOFTMAX: Self = Self {
        name: "attnlab-row-softmax-grad",
        kernel: "attnlab_row_softmax_grad",
        chunk: None,
        f: |o, dw, w| {
            o.copy_from_slice(w);
            softmax_grad_in_place(o, dw);
        },
    };

    /// d/dx x·Φ(x) = Φ(x) + x·φ(x), saved = x.
    const GELU_ERF: Self = Self {
        name: "attnlab-gelu-erf-grad",
        kernel: "attnlab_gelu_erf_grad",
        chunk: Some(4096),
        f: |o, dy, x| {
            let inv_sqrt_2pi = 0.5 * std::f32::consts::FRAC_2_SQRT_PI * FRAC_1_SQRT_2;
            for ((o, dy), x) in o.iter_mut().zip(dy).zip(x) {
                let cdf = 0.5 * (1.0 + erf(x * FRAC_1_SQRT_2));
                let pdf = inv_sqrt_2pi * (-0.5 * x * x).exp();
                *o = dy * (cdf + x * pdf);
            }
        },
    };

    fn apply(&self, upstream: &Tensor, saved: &Tensor) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(
            upstream
                .contiguous()?
                .apply_op2_no_bwd(&saved.contiguous()?, self)?,
        ))
    }
}

impl CustomOp2 for ChunkGrad {
    fn name(&self) -> &'static str {
        self.name
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let chunk = self.chunk.unwrap_or_else(|| last_dim(l1));
        let out = zip_chunks(slice(s1, l1)?, slice(s2, l2)?, chunk, self.f);
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    cuda_fwd!(self, |s1, l1, s2, l2| {
        let per_row = self.chunk.is_none();
        super::cuda::pair_grad(self.kernel, per_row, (s1, l1), (s2, l2))
    });
}

/// Column sums of a row-major (rows, d) slice, computed in parallel blocks of rows.
pub(super) fn column_sums_of(data: &[f32], d: usize) -> Vec<f32> {
    const BLOCK_ROWS: usize = 256;
    data.par_chunks(BLOCK_ROWS * d)
        .map(|block| {
            let mut sums = vec![0f32; d];
            for row in block.chunks(d) {
                sums.iter_mut().zip(row).for_each(|(s, x)| *s += x);
            }
            sums
        })
        .reduce(
            || vec![0f32; d],
            |mut a, b| {
                a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
                a
            },
        )
}

/// erf(x) in f32 as a rational function of x (Eigen's `generic_fast_erf_float`), within
/// 1e-6 of libm's `erff` (tested). Branch-free, so the GELU loops vectorise, where a call to
/// `libm::erff` per element took a tenth of a training step.
#[inline]
pub(super) fn erf(x: f32) -> f32 {
    // Past ±4, erf is ±1 to f32 precision.
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let p = [
        -1.609_603_3e-2,
        -2.954_6e-3,
        -7.349_906_3e-4,
        -5.692_506_4e-5,
        -2.101_024e-6,
        2.770_681_4e-8,
        -2.726_142_3e-10,
    ]
    .iter()
    .rev()
    .fold(0.0, |acc, c| acc * x2 + c);
    let q = [
        -1.426_473_9e-2,
        -7.373_329e-3,
        -1.682_827e-3,
        -2.133_740_6e-4,
        -1.456_607_2e-5,
    ]
    .iter()
    .rev()
    .fold(0.0, |acc, c| acc * x2 + c);
    x * p / q
}

/// Column sums (d) of a tensor viewed as (rows, d), d its last dimension: the gradient of a
/// bias broadcast over rows, in one parallel pass over the data (no copy out first).
pub(super) fn column_sums(x: &Tensor) -> candle_core::Result<Tensor> {
    x.contiguous()?.apply_op1_no_bwd(&ColumnSums)
}

struct ColumnSums;

impl CustomOp1 for ColumnSums {
    fn name(&self) -> &'static str {
        "attnlab-column-sums"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let d = last_dim(layout);
        let sums = column_sums_of(slice(storage, layout)?, d);
        Ok((CpuStorage::F32(sums), Shape::from(d)))
    }

    cuda_fwd!(self, |storage, layout| {
        super::cuda::column_sums(storage, layout)
    });
}

/// x + y for a y shaped like x's trailing dimensions (a position table added to every
/// sequence of a batch). candle's broadcast add sums y's gradient over the batch with a
/// strided reduction (about 2% of a benchmark step); here it is [`column_sums`].
pub struct AddBroadcast;

impl CustomOp2 for AddBroadcast {
    fn name(&self) -> &'static str {
        "attnlab-add-broadcast"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, y) = (slice(s1, l1)?, slice(s2, l2)?);
        check_trailing(l1, l2)?;
        let mut out = zeros(x.len());
        out.par_chunks_mut(y.len())
            .zip(x.par_chunks(y.len()))
            .for_each(|(o, x)| {
                for ((o, x), y) in o.iter_mut().zip(x).zip(y) {
                    *o = x + y;
                }
            });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    cuda_fwd!(self, |s1, l1, s2, l2| {
        check_trailing(l1, l2)?;
        super::cuda::add_broadcast((s1, l1), (s2, l2))
    });

    fn bwd(
        &self,
        _x: &Tensor,
        y: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let n = y.elem_count();
        let dy = column_sums(&grad.reshape((grad.elem_count() / n, n))?)?;
        Ok((Some(grad.clone()), Some(dy.reshape(y.shape())?)))
    }
}

/// Whether y's shape (l2) is the end of x's (l1), as [`AddBroadcast`] needs.
fn check_trailing(l1: &Layout, l2: &Layout) -> candle_core::Result<()> {
    let (xd, yd) = (l1.dims(), l2.dims());
    if l2.shape().elem_count() == 0 || yd.len() > xd.len() || xd[xd.len() - yd.len()..] != *yd {
        candle_core::bail!("add_broadcast: {yd:?} is not the end of {xd:?}");
    }
    Ok(())
}

/// GELU with the exact erf form, as PyTorch's `nn.GELU()`: x·Φ(x).
pub struct GeluErf;

const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;

impl CustomOp1 for GeluErf {
    fn name(&self) -> &'static str {
        "attnlab-gelu-erf"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = slice(storage, layout)?;
        let mut out = zeros(x.len());
        out.par_chunks_mut(4096)
            .zip(x.par_chunks(4096))
            .for_each(|(o, x)| {
                for (o, x) in o.iter_mut().zip(x) {
                    *o = 0.5 * x * (1.0 + erf(x * FRAC_1_SQRT_2));
                }
            });
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }

    cuda_fwd!(self, |storage, layout| {
        super::cuda::gelu_erf(storage, layout)
    });

    fn bwd(
        &self,
        arg: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        ChunkGrad::GELU_ERF.apply(grad_res, arg)
    }
}

/// LayerNorm over the last dimension, y = γ ⊙ (x − mean)/σ + β, inputs (x, γ, β). γ and β are
/// (d), or on the CPU (R, d) for R replicas of a model: x's rows are R blocks, block r normalised
/// with row r. One pass each way on the CPU, where standardising and then applying γᵣ and βᵣ as
/// ops of their own took three passes forward and nine backward: a fifth of a replica group's
/// step at d 32.
pub struct LayerNorm {
    pub eps: f32,
}

/// Rows a task of [`LayerNorm`] handles at once: one vector-dispatch per task, not per row.
const ROWS_PER_TASK: usize = 64;

/// x's rows per replica for γ of `params` elements (one replica: every row), checked.
fn rows_per_replica(x: usize, d: usize, params: usize) -> candle_core::Result<usize> {
    let (rows, replicas) = (x / d, params / d);
    if replicas == 0 || !params.is_multiple_of(d) || !rows.is_multiple_of(replicas) {
        candle_core::bail!("layer norm: γ of {params} does not fit {rows} rows of {d}");
    }
    Ok(rows / replicas)
}

/// Σ f(xᵢ) in 16 partial sums, so that the loop vectorises (as [`fold_lanes`]).
#[inline(always)]
fn sum_lanes(row: &[f32], f: impl Fn(f32) -> f32) -> f32 {
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
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
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

impl CustomOp3 for LayerNorm {
    fn name(&self) -> &'static str {
        "attnlab-layer-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, gamma, beta) = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
        let d = last_dim(l1);
        let per_replica = rows_per_replica(x.len(), d, gamma.len())?;
        let mut out = zeros(x.len());
        out.par_chunks_mut(d * ROWS_PER_TASK)
            .zip(x.par_chunks(d * ROWS_PER_TASK))
            .enumerate()
            .for_each(|(task, (out, x))| {
                super::vectorised(
                    #[inline(always)]
                    || {
                        let rows = out.chunks_mut(d).zip(x.chunks(d));
                        for (i, (out, x)) in rows.enumerate() {
                            let r = (task * ROWS_PER_TASK + i) / per_replica;
                            let params = (&gamma[r * d..][..d], &beta[r * d..][..d]);
                            layer_norm_row(out, x, params, self.eps);
                        }
                    },
                )
            });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    cuda_fwd!(self, |s1, l1, s2, l2, s3, l3| {
        rows_per_replica(
            l1.shape().elem_count(),
            last_dim(l1),
            l2.shape().elem_count(),
        )?;
        super::cuda::layer_norm([(s1, l1), (s2, l2), (s3, l3)], self.eps)
    });

    fn bwd(
        &self,
        x: &Tensor,
        gamma: &Tensor,
        beta: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let x = x.contiguous()?;
        let grad = grad.contiguous()?;
        let op = LayerNormGrad { eps: self.eps };
        let grads = grad.apply_op3_no_bwd(&x, &gamma.contiguous()?, &op)?;
        let (n, p) = (x.elem_count(), gamma.elem_count());
        let dx = grads.narrow(0, 0, n)?.reshape(x.shape())?;
        let d_gamma = grads.narrow(0, n, p)?.reshape(gamma.shape())?;
        let d_beta = grads.narrow(0, n + p, p)?.reshape(beta.shape())?;
        Ok((Some(dx), Some(d_gamma), Some(d_beta)))
    }
}

/// One row of [`LayerNorm`]: `out` = γ ⊙ (x − mean)/σ + β.
#[inline(always)]
fn layer_norm_row(out: &mut [f32], x: &[f32], (gamma, beta): (&[f32], &[f32]), eps: f32) {
    let (mean, inv) = mean_and_inv_std(x, eps);
    for (((o, x), g), b) in out.iter_mut().zip(x).zip(gamma).zip(beta) {
        *o = (x - mean) * inv * g + b;
    }
}

/// [`LayerNorm`]'s gradients on the CPU in one pass, inputs (dy, x, γ) → [dx | dγ | dβ] flat:
/// dx = (dŷ − mean(dŷ) − ŷ·mean(dŷ·ŷ)) / σ with dŷ = dy ⊙ γ; dγ = Σ dy ⊙ ŷ and dβ = Σ dy over
/// each replica's rows.
struct LayerNormGrad {
    eps: f32,
}

impl LayerNormGrad {
    /// Gradients of one task's rows (all of one replica, with γ its row): dx written, the
    /// task's share of dγ and dβ returned side by side.
    #[inline(always)]
    fn rows(&self, dx: &mut [f32], dy: &[f32], x: &[f32], gamma: &[f32]) -> Vec<f32> {
        let d = gamma.len();
        let mut sums = vec![0f32; 2 * d];
        let (d_gamma, d_beta) = sums.split_at_mut(d);
        let mut d_y_hat = vec![0f32; d];
        let rows = dx.chunks_mut(d).zip(dy.chunks(d)).zip(x.chunks(d));
        for ((dx, dy), x) in rows {
            let (mean, inv) = mean_and_inv_std(x, self.eps);
            // dx holds ŷ until the last loop.
            for (y, x) in dx.iter_mut().zip(x) {
                *y = (x - mean) * inv;
            }
            for (((dg, db), y), dy) in d_gamma.iter_mut().zip(&mut *d_beta).zip(&*dx).zip(dy) {
                *dg += dy * y;
                *db += dy;
            }
            for ((g, dy), gamma) in d_y_hat.iter_mut().zip(dy).zip(gamma) {
                *g = dy * gamma;
            }
            let n = d as f32;
            let mean_g = sum_lanes(&d_y_hat, |g| g) / n;
            let mean_gy = dot_lanes(&d_y_hat, dx) / n;
            for (dx, g) in dx.iter_mut().zip(&d_y_hat) {
                *dx = inv * (g - mean_g - *dx * mean_gy);
            }
        }
        sums
    }
}

impl CustomOp3 for LayerNormGrad {
    fn name(&self) -> &'static str {
        "attnlab-layer-norm-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (dy, x, gamma) = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
        let d = last_dim(l1);
        let per_replica = rows_per_replica(x.len(), d, gamma.len())? * d;
        let mut grads = zeros(dy.len() + 2 * gamma.len());
        let (dx, params) = grads.split_at_mut(dy.len());
        let (d_gamma, d_beta) = params.split_at_mut(gamma.len());
        let task = d * ROWS_PER_TASK;
        let replicas = dx.chunks_mut(per_replica).zip(dy.chunks(per_replica));
        for (r, (dx, dy)) in replicas.enumerate() {
            let (x, gamma) = (&x[r * per_replica..][..per_replica], &gamma[r * d..][..d]);
            let sums = dx
                .par_chunks_mut(task)
                .zip(dy.par_chunks(task).zip(x.par_chunks(task)))
                .map(|(dx, (dy, x))| {
                    super::vectorised(
                        #[inline(always)]
                        || self.rows(dx, dy, x, gamma),
                    )
                })
                .reduce(
                    || vec![0f32; 2 * d],
                    |mut a, b| {
                        a.iter_mut().zip(&b).for_each(|(a, b)| *a += b);
                        a
                    },
                );
            d_gamma[r * d..][..d].copy_from_slice(&sums[..d]);
            d_beta[r * d..][..d].copy_from_slice(&sums[d..]);
        }
        Ok((
            CpuStorage::F32(grads),
            Shape::from(dy.len() + 2 * gamma.len()),
        ))
    }

    cuda_fwd!(self, |s1, l1, s2, l2, s3, l3| {
        rows_per_replica(
            l2.shape().elem_count(),
            last_dim(l2),
            l3.shape().elem_count(),
        )?;
        super::cuda::layer_norm_grad([(s1, l1), (s2, l2), (s3, l3)], self.eps)
    });
}

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
