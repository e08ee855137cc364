//! Causal attention's output for training on the CPU without its (B, H, T, T) weights in
//! memory. Per head, the scores, the weights and their gradients live in T×T buffers that stay
//! in cache; the explicit path wrote, zero-filled and read back four tensors of that size forward
//! and as many backward, and at the sweeps' sizes (d 32–64, T 64–128) those passes over memory,
//! not the products, were most of a step. The backward pass recomputes the weights from q and k,
//! in one pass per row from two numbers per row the forward pass keeps ([`RowStats`]), and
//! reuses the forward pass's dropout mask (a byte per weight) instead of hashing it twice more:
//! the row function and the mask's hash had been over a quarter of a softmax step.
//!
//! It serves softmax, with the attention dropout of zoology's layout (the mask is a function of
//! each weight's index, [`super::dropout`], so it drops the weights the explicit path drops),
//! and the kernel mechanisms ([`RowKernel`]); encodings with a bias take the explicit path.
//! A sliding window makes each row a band of w keys ending at the diagonal: the products and
//! row passes cover the band only ([`band_product`]), so a step costs T·w, not T²/2.
//! [`cpu_attention_composed`] is that path, and the reference the tests compare with.

use std::cell::RefCell;
use std::sync::OnceLock;

use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::causal_products::{BAND_REACH, band_product, band_start, lower_band_product};
use super::dropout::Dropout;
use super::fused::{slice, zeros};
use super::gemm::{MatMut, MatRef};
use super::softmax::{softmax_from_stats, softmax_grad_in_place, softmax_in_place};
use super::{
    RowKernel, cpu_f32, dot_scores, kernel_rows, matmul_merge_heads, softmax_rows,
    softmax_rows_biased,
};
use crate::Result;

/// How a row of scores becomes a row of weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowFunction {
    Softmax,
    /// κ(s) / Σ κ (linear attention, Based, ReBased).
    Kernel(RowKernel),
}

/// What turns a row's scores into its weights in one pass: softmax's maximum and 1/Σ, a
/// kernel's 1/Z (its `shift` unused).
#[derive(Clone, Copy, Debug, Default)]
struct RowStats {
    shift: f32,
    inv: f32,
}

impl RowFunction {
    /// A row of scores replaced by its weights, returning its [`RowStats`].
    fn weights_in_place(self, row: &mut [f32]) -> RowStats {
        match self {
            Self::Softmax => {
                let (shift, inv) = softmax_in_place(row);
                RowStats { shift, inv }
            }
            Self::Kernel(kernel) => RowStats {
                shift: 0.0,
                inv: kernel.normalise(row),
            },
        }
    }

    /// `w` = the weights of a row of scores, from the [`RowStats`] [`Self::weights_in_place`]
    /// returned for them: the same numbers, in one pass.
    fn weights_from(self, scores: &[f32], w: &mut [f32], stats: RowStats) {
        match self {
            Self::Softmax => softmax_from_stats(scores, w, (stats.shift, stats.inv)),
            Self::Kernel(kernel) => kernel.weights_from(scores, w, stats.inv),
        }
    }

    /// A row of weights replaced by the scores' gradient.
    fn grad_in_place(self, w: &mut [f32], dw: &[f32], scores: &[f32], stats: RowStats) {
        match self {
            Self::Softmax => softmax_grad_in_place(w, dw),
            Self::Kernel(kernel) => kernel.grad_in_place(w, dw, scores, stats.inv),
        }
    }
}

/// Dropout on the weights while training: probability and one seed per replica.
#[derive(Clone, Copy, Debug)]
pub struct WeightDropout<'a> {
    pub p: f64,
    pub seeds: &'a [u64],
}

/// Whether [`cpu_attention`] runs q (B, H, T, D) and v (B, H, T, Dv).
pub fn cpu_attention_available(q: &Tensor, v: &Tensor) -> bool {
    cpu_f32(q) && q.rank() == 4 && v.rank() == 4
}

/// `row`(q kᵀ · scale, causal, within the last `window` keys when given), dropped out, · v
/// with the heads side by side: q, k (B, H, T, D), v (B, H, T, Dv) → (B, T, H·Dv). Only where
/// [`cpu_attention_available`].
pub fn cpu_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    (row, window): (RowFunction, Option<usize>),
    scale: f64,
    dropout: Option<WeightDropout>,
) -> Result<Tensor> {
    let (b, h, t, _) = q.dims4()?;
    let op = CpuAttention {
        row,
        width: window.unwrap_or(t).clamp(1, t.max(1)),
        scale: scale as f32,
        dropout: dropout
            .filter(|d| d.p > 0.0)
            .map(|d| Dropout::new(d.p, d.seeds, b * h * t * t)),
        saved: OnceLock::new(),
    };
    Ok(q.contiguous()?
        .apply_op3(&k.contiguous()?, &v.contiguous()?, op)?)
}

/// [`cpu_attention`] from the explicit weights: the training path it replaces. A window is
/// softmax's, a −∞ bias beyond it.
pub fn cpu_attention_composed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    (row, window): (RowFunction, Option<usize>),
    scale: f64,
    dropout: Option<WeightDropout>,
) -> Result<Tensor> {
    let scores = dot_scores(q, k, scale)?;
    let weights = match (row, window) {
        (RowFunction::Softmax, None) => softmax_rows(&scores, true)?,
        (RowFunction::Softmax, Some(w)) => {
            softmax_rows_biased(&scores, &window_bias(q.dim(2)?, w, q.device())?, true)?
        }
        (RowFunction::Kernel(kernel), None) => kernel_rows(&scores, kernel)?,
        (RowFunction::Kernel(_), Some(_)) => {
            return Err(crate::Error::Unsupported {
                what: "a sliding window on a kernel's rows".into(),
                reason: "the window is softmax attention's".into(),
            });
        }
    };
    let weights = match dropout {
        Some(d) => super::dropout(&weights, d.p, d.seeds)?,
        None => weights,
    };
    matmul_merge_heads(&weights, v)
}

/// (1, T, T): 0 where query i sees key j within the last `width` keys (j > i − width), −∞
/// before; the causal half is softmax's.
fn window_bias(t: usize, width: usize, device: &candle_core::Device) -> Result<Tensor> {
    let bias: Vec<f32> = (0..t * t)
        .map(|ij| match ij / t >= ij % t + width {
            true => f32::NEG_INFINITY,
            false => 0.0,
        })
        .collect();
    Ok(Tensor::from_vec(bias, (1, t, t), device)?)
}

struct CpuAttention {
    row: RowFunction,
    /// Keys each query sees, itself included: the sequence's length without a window.
    width: usize,
    scale: f32,
    dropout: Option<Dropout>,
    /// What the forward pass keeps for the backward pass.
    saved: OnceLock<Saved>,
}

/// The forward pass's [`RowStats`] of every row of every head (B·H·T) and, with dropout, its
/// mask (B·H·T·T bytes, 1 = kept; the causal half beyond each row's diagonal unused).
struct Saved {
    rows: Vec<RowStats>,
    kept: Vec<u8>,
}

/// The sizes of one call: q, k (b, h, t, dk), v (b, h, t, dv), and the keys each query sees.
#[derive(Clone, Copy)]
struct Dims {
    h: usize,
    t: usize,
    dk: usize,
    dv: usize,
    width: usize,
}

impl Dims {
    fn of(q: &Layout, v: &Layout, width: usize) -> candle_core::Result<Self> {
        let ([_, h, t, dk], [_, _, _, dv]) = (q.dims(), v.dims()) else {
            candle_core::bail!("attention takes q and v of rank 4");
        };
        Ok(Self {
            h: *h,
            t: *t,
            dk: *dk,
            dv: *dv,
            width,
        })
    }

    /// Row `i`'s keys: the band of `width` ending at its diagonal.
    fn band(&self, i: usize) -> std::ops::RangeInclusive<usize> {
        band_start(i, self.width)..=i
    }
}

/// Zeroes the columns of row `i` (of a T×T matrix) just past its band on either side, those
/// [`band_product`] reads with it: they may hold scores of other keys.
fn clear_around_band(row: &mut [f32], d: Dims, i: usize) {
    let start = band_start(i, d.width);
    row[start.saturating_sub(BAND_REACH)..start].fill(0.0);
    row[i + 1..(i + 1 + BAND_REACH).min(d.t)].fill(0.0);
}

/// The T×T buffers of one head, one set per thread, reused from call to call (allocating them
/// per batch item took a quarter of a step).
#[derive(Default)]
struct Workspace {
    scores: Vec<f32>,
    weights: Vec<f32>,
    grad: Vec<f32>,
    /// kᵀ or vᵀ for [`lower_product`].
    transposed: Vec<f32>,
}

thread_local! {
    static WORKSPACE: RefCell<Workspace> = RefCell::default();
}

impl Workspace {
    /// `f` with this thread's workspace, sized for length `t`. Every buffer is written before it
    /// is read, so what a previous call left in it does not matter.
    fn with<R>(t: usize, f: impl FnOnce(&mut Self) -> R) -> R {
        WORKSPACE.with_borrow_mut(|ws| {
            for buffer in [&mut ws.scores, &mut ws.weights, &mut ws.grad] {
                buffer.resize(t * t, 0.0);
            }
            f(ws)
        })
    }
}

/// `data` cut into `n` equal parts, `n` empty ones when `data` is empty (no dropout, no mask).
fn parts<T>(data: &mut [T], n: usize) -> Vec<&mut [T]> {
    match data.len() {
        0 => (0..n).map(|_| <&mut [T]>::default()).collect(),
        len => data.chunks_mut(len / n).collect(),
    }
}

impl CpuAttention {
    /// The band of `dst` (T×T) = scale · q kᵀ of head `head` (of all B·H).
    fn scores(
        &self,
        d: Dims,
        head: usize,
        (q, k): (&[f32], &[f32]),
        dst: &mut [f32],
        bt: &mut Vec<f32>,
    ) {
        let t = d.t;
        let q = MatRef::row_major(&q[head * t * d.dk..][..t * d.dk], t, d.dk);
        let k = MatRef::row_major(&k[head * t * d.dk..][..t * d.dk], t, d.dk);
        lower_band_product(dst, (q, k), self.scale, bt, d.width);
    }

    /// Head `head`'s weights in `ws.weights`, dropped out with its mask written to `kept`
    /// (T×T, when dropout), and its rows' statistics in `stats` (T).
    fn forward_weights(
        &self,
        d: Dims,
        head: usize,
        (q, k): (&[f32], &[f32]),
        ws: &mut Workspace,
        (stats, kept): (&mut [RowStats], &mut [u8]),
    ) {
        let t = d.t;
        self.scores(d, head, (q, k), &mut ws.weights, &mut ws.transposed);
        for (i, (row, stats)) in ws.weights.chunks_mut(t).zip(stats).enumerate() {
            let band = d.band(i);
            *stats = self.row.weights_in_place(&mut row[band.clone()]);
            clear_around_band(row, d, i);
            if let Some(dropout) = &self.dropout {
                let start = (head * t + i) * t + band.start();
                let kept = &mut kept[i * t..][band.clone()];
                dropout.scale_row(start, &mut row[band], kept);
            }
        }
    }

    /// Head `head`'s scores in `ws.scores` and its weights, before dropout, in `ws.weights`,
    /// rebuilt from the rows' statistics `stats` that [`Self::forward_weights`] wrote.
    fn rebuilt_weights(
        &self,
        d: Dims,
        head: usize,
        (q, k): (&[f32], &[f32]),
        stats: &[RowStats],
        ws: &mut Workspace,
    ) {
        let t = d.t;
        self.scores(d, head, (q, k), &mut ws.scores, &mut ws.transposed);
        let rows = ws.weights.chunks_mut(t).zip(ws.scores.chunks(t));
        for (i, ((w, s), stats)) in rows.zip(stats).enumerate() {
            let band = d.band(i);
            self.row
                .weights_from(&s[band.clone()], &mut w[band], *stats);
            clear_around_band(w, d, i);
        }
    }

    /// The bands of `rows` (T×T) times the forward pass's dropout mask `kept` (T×T), if any.
    fn reapply_dropout(&self, d: Dims, rows: &mut [f32], kept: &[u8]) {
        if let Some(dropout) = &self.dropout {
            for (i, (row, kept)) in rows.chunks_mut(d.t).zip(kept.chunks(d.t)).enumerate() {
                dropout.scale_kept(&mut row[d.band(i)], &kept[d.band(i)]);
            }
        }
    }
}

/// Head `h` of (B, T, H·Dv) rows of batch item `b`: a (T, Dv) view with rows H·Dv apart.
fn merged_head(data: &[f32], d: Dims, h: usize) -> MatRef<'_> {
    MatRef {
        data: &data[h * d.dv..],
        rows: d.t,
        cols: d.dv,
        row_stride: d.h * d.dv,
        col_stride: 1,
    }
}

impl CustomOp3 for CpuAttention {
    fn name(&self) -> &'static str {
        "attnlab-cpu-attention"
    }

    cpu_fwd!(self, |s1, l1, s2, l2, s3, l3| {
        let (q, k, v) = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
        let d = Dims::of(l1, l3, self.width)?;
        let batch = l1.dims()[0];
        let (tt, per_item) = (d.t * d.t, d.t * d.h * d.dv);
        let mut out = zeros(v.len());
        let mut rows = vec![RowStats::default(); batch * d.h * d.t];
        let mask_len = if self.dropout.is_some() {
            batch * d.h * tt
        } else {
            0
        };
        let mut kept = vec![0u8; mask_len];
        out.par_chunks_mut(per_item)
            .zip(rows.par_chunks_mut(d.h * d.t))
            .zip(parts(&mut kept, batch))
            .enumerate()
            .for_each(|(b, ((out, rows), kept))| {
                Workspace::with(d.t, |ws| {
                    for h in 0..d.h {
                        let head = b * d.h + h;
                        let stats = &mut rows[h * d.t..][..d.t];
                        let kept = kept.get_mut(h * tt..(h + 1) * tt).unwrap_or_default();
                        self.forward_weights(d, head, (q, k), ws, (stats, kept));
                        let v = MatRef::row_major(&v[head * d.t * d.dv..][..d.t * d.dv], d.t, d.dv);
                        let out = MatMut {
                            data: &mut out[h * d.dv..],
                            rows: d.t,
                            cols: d.dv,
                            row_stride: d.h * d.dv,
                        };
                        band_product(out, (&ws.weights, d.width), v, false, 1.0);
                    }
                });
            });
        // One forward pass per op; a second (none is made) would keep the first's, the same.
        let _ = self.saved.set(Saved { rows, kept });
        Ok((CpuStorage::F32(out), Shape::from((batch, d.t, d.h * d.dv))))
    });

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _out: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let Some(saved) = self.saved.get() else {
            candle_core::bail!("attention's backward pass ran before its forward pass");
        };
        let op = CpuAttentionGrad {
            forward: self,
            saved,
            dout: grad.contiguous()?,
        };
        let grads = q.apply_op3_no_bwd(k, v, &op)?;
        let (n_q, n_v) = (q.elem_count(), v.elem_count());
        let dq = grads.narrow(0, 0, n_q)?.reshape(q.shape())?;
        let dk = grads.narrow(0, n_q, n_q)?.reshape(k.shape())?;
        let dv = grads.narrow(0, 2 * n_q, n_v)?.reshape(v.shape())?;
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}

/// `dst`'s bands and the zeros around them = `src`'s (both T×T), the rest left as it is.
fn copy_bands(d: Dims, src: &[f32], dst: &mut [f32]) {
    for (i, (src, dst)) in src.chunks(d.t).zip(dst.chunks_mut(d.t)).enumerate() {
        let start = band_start(i, d.width);
        let around = start.saturating_sub(BAND_REACH)..(i + 1 + BAND_REACH).min(d.t);
        dst[around.clone()].copy_from_slice(&src[around]);
    }
}

/// (q, k, v) → [dq | dk | dv] flat, given the output's gradient.
struct CpuAttentionGrad<'a> {
    forward: &'a CpuAttention,
    saved: &'a Saved,
    dout: Tensor,
}

impl CpuAttentionGrad<'_> {
    /// The gradients of head `head` (batch item `b`, head `h`): dv = W_dᵀ·dO, then
    /// dS = row'(dO·vᵀ ⊙ mask), dq = scale · dS·k, dk = scale · dSᵀ·q.
    fn head(
        &self,
        d: Dims,
        (b, h): (usize, usize),
        (q, k, v): (&[f32], &[f32], &[f32]),
        dout: &[f32],
        (dq, dk, dv): (&mut [f32], &mut [f32], &mut [f32]),
        ws: &mut Workspace,
    ) {
        let (t, fwd) = (d.t, self.forward);
        let head = b * d.h + h;
        let dout = merged_head(&dout[b * t * d.h * d.dv..], d, h);
        let stats = &self.saved.rows[head * t..][..t];
        let kept = self.saved.kept.get(head * t * t..(head + 1) * t * t);
        let kept = kept.unwrap_or_default();
        fwd.rebuilt_weights(d, head, (q, k), stats, ws);
        // dv = W_dᵀ · dO, W_d the dropped weights (in the gradient buffer for now).
        let (per_k, per_v) = (t * d.dk, t * d.dv);
        let dropped = match fwd.dropout {
            Some(_) => {
                copy_bands(d, &ws.weights, &mut ws.grad);
                fwd.reapply_dropout(d, &mut ws.grad, kept);
                &ws.grad
            }
            None => &ws.weights,
        };
        let dv = MatMut::row_major(&mut dv[h * per_v..][..per_v], t, d.dv);
        band_product(dv, (dropped, d.width), dout, true, 1.0);
        // dW = dO · vᵀ ⊙ mask, then the row function's gradient in place of the weights.
        let v = MatRef::row_major(&v[head * per_v..][..per_v], t, d.dv);
        lower_band_product(&mut ws.grad, (dout, v), 1.0, &mut ws.transposed, d.width);
        fwd.reapply_dropout(d, &mut ws.grad, kept);
        let rows = ws.weights.chunks_mut(t).zip(ws.grad.chunks(t));
        for (i, (((w, dw), s), stats)) in rows.zip(ws.scores.chunks(t)).zip(stats).enumerate() {
            let band = d.band(i);
            fwd.row
                .grad_in_place(&mut w[band.clone()], &dw[band.clone()], &s[band], *stats);
        }
        let q = MatRef::row_major(&q[head * per_k..][..per_k], t, d.dk);
        let k = MatRef::row_major(&k[head * per_k..][..per_k], t, d.dk);
        let dq = MatMut::row_major(&mut dq[h * per_k..][..per_k], t, d.dk);
        band_product(dq, (&ws.weights, d.width), k, false, fwd.scale);
        let dk = MatMut::row_major(&mut dk[h * per_k..][..per_k], t, d.dk);
        band_product(dk, (&ws.weights, d.width), q, true, fwd.scale);
    }
}

impl CustomOp3 for CpuAttentionGrad<'_> {
    fn name(&self) -> &'static str {
        "attnlab-cpu-attention-grad"
    }

    cpu_fwd!(self, |s1, l1, s2, l2, s3, l3| {
        let inputs = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
        let (dout, dout_layout) = self.dout.storage_and_layout();
        let candle_core::Storage::Cpu(dout) = &*dout else {
            candle_core::bail!("attention's gradient must be on the CPU");
        };
        let dout = slice(dout, dout_layout)?;
        let d = Dims::of(l1, l3, self.forward.width)?;
        let (n_q, n_v) = (inputs.0.len(), inputs.2.len());
        let mut grads = zeros(2 * n_q + n_v);
        let (dq, rest) = grads.split_at_mut(n_q);
        let (dk, dv) = rest.split_at_mut(n_q);
        let (per_k, per_v) = (d.h * d.t * d.dk, d.h * d.t * d.dv);
        dq.par_chunks_mut(per_k)
            .zip(dk.par_chunks_mut(per_k))
            .zip(dv.par_chunks_mut(per_v))
            .enumerate()
            .for_each(|(b, ((dq, dk), dv))| {
                Workspace::with(d.t, |ws| {
                    for h in 0..d.h {
                        self.head(d, (b, h), inputs, dout, (dq, dk, dv), ws);
                    }
                });
            });
        Ok((CpuStorage::F32(grads), Shape::from(2 * n_q + n_v)))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{assert_close_to, random};
    use candle_core::Var;

    /// Value and gradients of q, k, v through `f`, against a random upstream gradient.
    fn value_and_grads(
        f: impl Fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>,
        inputs: &[Var; 3],
    ) -> Vec<Tensor> {
        let [q, k, v] = inputs.each_ref().map(Var::as_tensor);
        let out = f(q, k, v).unwrap();
        let upstream = random(out.dims(), 9, "upstream");
        let grads = (&out * &upstream)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let mut all = vec![out];
        all.extend(
            inputs
                .iter()
                .map(|x| grads.get(x.as_tensor()).unwrap().clone()),
        );
        all
    }

    #[test]
    fn the_fused_output_and_gradients_equal_the_explicit_paths() {
        // Two replicas' batch of 2 each, 3 heads, 7 positions, q/k 4 wide, v 5 wide; and
        // lengths and widths past the causal products' blocks and vectors.
        for (b, h, t, dk, dv) in [(4, 3, 7, 4, 5), (2, 2, 37, 8, 24)] {
            let inputs = [
                random(&[b, h, t, dk], 1, "q"),
                random(&[b, h, t, dk], 2, "k"),
                random(&[b, h, t, dv], 3, "v"),
            ];
            let rows = [
                RowFunction::Softmax,
                RowFunction::Kernel(RowKernel::Identity),
                RowFunction::Kernel(RowKernel::Taylor),
                RowFunction::Kernel(RowKernel::Square),
            ];
            for row in rows {
                // Linear attention's scores are φ(q)·φ(k) with positive features: with scores
                // of both signs its normaliser can come near 0 and amplify any rounding.
                let inputs = inputs.clone().map(|x| match row {
                    RowFunction::Kernel(RowKernel::Identity) => x.abs().unwrap(),
                    _ => x,
                });
                let inputs = inputs.map(|x| Var::from_tensor(&x).unwrap());
                assert_fused_equals_explicit((row, None), &inputs);
            }
            // Sliding windows: a band narrower than a block of rows, one wider than a vector,
            // and one longer than the sequence (one key would leave q and k no gradient).
            let inputs = inputs.map(|x| Var::from_tensor(&x).unwrap());
            for window in [2, 5, 19, 40] {
                assert_fused_equals_explicit((RowFunction::Softmax, Some(window)), &inputs);
            }
        }
    }

    #[test]
    fn a_kernel_with_a_window_is_refused() {
        let x = random(&[1, 1, 3, 2], 1, "x");
        let row = RowFunction::Kernel(RowKernel::Identity);
        let err = cpu_attention_composed(&x, &x, &x, (row, Some(2)), 1.0, None).unwrap_err();
        assert!(err.to_string().contains("window"), "{err}");
    }

    /// [`cpu_attention`] against [`cpu_attention_composed`], with and without dropout.
    fn assert_fused_equals_explicit(row: (RowFunction, Option<usize>), inputs: &[Var; 3]) {
        let seeds = [11, 12];
        let dropouts = [
            None,
            Some(WeightDropout {
                p: 0.3,
                seeds: &seeds,
            }),
        ];
        for dropout in dropouts {
            let run = |fused: bool| {
                value_and_grads(
                    |q, k, v| match fused {
                        true => cpu_attention(q, k, v, row, 0.5, dropout),
                        false => cpu_attention_composed(q, k, v, row, 0.5, dropout),
                    },
                    inputs,
                )
            };
            let (fused, explicit) = (run(true), run(false));
            for (what, (a, b)) in ["output", "dq", "dk", "dv"]
                .iter()
                .zip(fused.iter().zip(&explicit))
            {
                let dropout = dropout.is_some();
                let context = format!("{row:?}, dropout {dropout}, dims {:?}: {what}", a.dims());
                assert_close_to(a, b, 1e-5, &context);
            }
        }
    }
}
