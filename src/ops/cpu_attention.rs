//! Causal attention's output for training on the CPU without its (B, H, T, T) weights in
//! memory. Per head, the scores, the weights and their gradients live in T×T buffers that stay
//! in cache; the explicit path wrote, zero-filled and read back four tensors of that size forward
//! and as many backward, and at the sweeps' sizes (d 32–64, T 64–128) those passes over memory,
//! not the products, were most of a step. The backward pass recomputes the weights from q and k.
//!
//! It serves softmax, with the attention dropout of zoology's layout (the mask is a function of
//! each weight's index, [`super::dropout`], so it drops the weights the explicit path drops),
//! and the kernel mechanisms ([`RowKernel`]); encodings with a bias take the explicit path.
//! [`cpu_attention_composed`] is that path, and the reference the tests compare with.

use std::cell::RefCell;

use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::dropout::Dropout;
use super::fused::{slice, softmax_grad_in_place, softmax_in_place, zeros};
use super::gemm::{MatMut, MatRef, gemm_scaled};
use super::{RowKernel, cpu_f32, dot_scores, kernel_rows, matmul_merge_heads, softmax_rows};
use crate::Result;

/// How a row of scores becomes a row of weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowFunction {
    Softmax,
    /// κ(s) / Σ κ (linear attention, Based, ReBased).
    Kernel(RowKernel),
}

impl RowFunction {
    /// A row of scores replaced by its weights; returns what [`Self::grad_in_place`] needs
    /// besides (the kernels' 1/Z).
    fn weights_in_place(self, row: &mut [f32]) -> f32 {
        match self {
            Self::Softmax => {
                softmax_in_place(row);
                1.0
            }
            Self::Kernel(kernel) => kernel.normalise(row),
        }
    }

    /// A row of weights replaced by the scores' gradient.
    fn grad_in_place(self, w: &mut [f32], dw: &[f32], scores: &[f32], inv: f32) {
        match self {
            Self::Softmax => softmax_grad_in_place(w, dw),
            Self::Kernel(kernel) => kernel.grad_in_place(w, dw, scores, inv),
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

/// `row`(q kᵀ · scale, causal), dropped out, · v with the heads side by side: q, k (B, H, T, D),
/// v (B, H, T, Dv) → (B, T, H·Dv). Only where [`cpu_attention_available`].
pub fn cpu_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    row: RowFunction,
    scale: f64,
    dropout: Option<WeightDropout>,
) -> Result<Tensor> {
    let (b, h, t, _) = q.dims4()?;
    let op = CpuAttention {
        row,
        scale: scale as f32,
        dropout: dropout
            .filter(|d| d.p > 0.0)
            .map(|d| Dropout::new(d.p, d.seeds, b * h * t * t)),
    };
    Ok(q.contiguous()?
        .apply_op3(&k.contiguous()?, &v.contiguous()?, op)?)
}

/// [`cpu_attention`] from the explicit weights: the training path it replaces.
pub fn cpu_attention_composed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    row: RowFunction,
    scale: f64,
    dropout: Option<WeightDropout>,
) -> Result<Tensor> {
    let scores = dot_scores(q, k, scale)?;
    let weights = match row {
        RowFunction::Softmax => softmax_rows(&scores, true)?,
        RowFunction::Kernel(kernel) => kernel_rows(&scores, kernel)?,
    };
    let weights = match dropout {
        Some(d) => super::dropout(&weights, d.p, d.seeds)?,
        None => weights,
    };
    matmul_merge_heads(&weights, v)
}

struct CpuAttention {
    row: RowFunction,
    scale: f32,
    dropout: Option<Dropout>,
}

/// The sizes of one call: q, k (b, h, t, dk), v (b, h, t, dv).
#[derive(Clone, Copy)]
struct Dims {
    h: usize,
    t: usize,
    dk: usize,
    dv: usize,
}

impl Dims {
    fn of(q: &Layout, v: &Layout) -> candle_core::Result<Self> {
        let ([_, h, t, dk], [_, _, _, dv]) = (q.dims(), v.dims()) else {
            candle_core::bail!("attention takes q and v of rank 4");
        };
        Ok(Self {
            h: *h,
            t: *t,
            dk: *dk,
            dv: *dv,
        })
    }
}

/// The T×T buffers of one head, one set per thread, reused from call to call (allocating them
/// per batch item took a quarter of a step).
#[derive(Default)]
struct Workspace {
    scores: Vec<f32>,
    weights: Vec<f32>,
    grad: Vec<f32>,
    /// 1/Z per row (kernels).
    inv: Vec<f32>,
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
            ws.inv.resize(t, 0.0);
            f(ws)
        })
    }
}

impl CpuAttention {
    /// Head `head` (of all B·H) of q and k → its weights in `ws.weights`, before dropout (the
    /// scores stay in `ws.scores`, 1/Z in `ws.inv`).
    fn weights(&self, d: Dims, head: usize, q: &[f32], k: &[f32], ws: &mut Workspace) {
        let t = d.t;
        let q = MatRef::row_major(&q[head * t * d.dk..][..t * d.dk], t, d.dk);
        let k = MatRef::row_major(&k[head * t * d.dk..][..t * d.dk], t, d.dk);
        gemm_scaled(
            MatMut::row_major(&mut ws.scores, t, t),
            q,
            k.t(),
            self.scale,
            false,
        );
        ws.weights.copy_from_slice(&ws.scores);
        for (i, (row, inv)) in ws.weights.chunks_mut(t).zip(&mut ws.inv).enumerate() {
            *inv = self.row.weights_in_place(&mut row[..=i]);
            row[i + 1..].fill(0.0);
        }
    }

    /// `rows` (T×T, head `head`) times the dropout mask, if any.
    fn apply_dropout(&self, d: Dims, head: usize, rows: &mut [f32]) {
        if let Some(dropout) = &self.dropout {
            for (i, row) in rows.chunks_mut(d.t).enumerate() {
                dropout.scale_row((head * d.t + i) * d.t, &mut row[..=i]);
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

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (q, k, v) = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
        let d = Dims::of(l1, l3)?;
        let per_item = d.t * d.h * d.dv;
        let mut out = zeros(v.len());
        out.par_chunks_mut(per_item)
            .enumerate()
            .for_each(|(b, out)| {
                Workspace::with(d.t, |ws| {
                    for h in 0..d.h {
                        let head = b * d.h + h;
                        self.weights(d, head, q, k, ws);
                        self.apply_dropout(d, head, &mut ws.weights);
                        let v = MatRef::row_major(&v[head * d.t * d.dv..][..d.t * d.dv], d.t, d.dv);
                        let out = MatMut {
                            data: &mut out[h * d.dv..],
                            rows: d.t,
                            cols: d.dv,
                            row_stride: d.h * d.dv,
                        };
                        gemm_scaled(out, MatRef::row_major(&ws.weights, d.t, d.t), v, 1.0, false);
                    }
                });
            });
        let batch = l1.dims()[0];
        Ok((CpuStorage::F32(out), Shape::from((batch, d.t, d.h * d.dv))))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _out: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let op = CpuAttentionGrad {
            forward: self,
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

/// (q, k, v) → [dq | dk | dv] flat, given the output's gradient.
struct CpuAttentionGrad<'a> {
    forward: &'a CpuAttention,
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
        fwd.weights(d, head, q, k, ws);
        // dv = W_dᵀ · dO, W_d the dropped weights (in the gradient buffer for now).
        ws.grad.copy_from_slice(&ws.weights);
        fwd.apply_dropout(d, head, &mut ws.grad);
        let (per_k, per_v) = (t * d.dk, t * d.dv);
        let dv = MatMut::row_major(&mut dv[h * per_v..][..per_v], t, d.dv);
        gemm_scaled(dv, MatRef::row_major(&ws.grad, t, t).t(), dout, 1.0, false);
        // dW = dO · vᵀ ⊙ mask, then the row function's gradient in place of the weights.
        let v = MatRef::row_major(&v[head * per_v..][..per_v], t, d.dv);
        gemm_scaled(
            MatMut::row_major(&mut ws.grad, t, t),
            dout,
            v.t(),
            1.0,
            false,
        );
        fwd.apply_dropout(d, head, &mut ws.grad);
        let rows = ws.weights.chunks_mut(t).zip(ws.grad.chunks(t));
        for (i, ((w, dw), s)) in rows.zip(ws.scores.chunks(t)).enumerate() {
            fwd.row
                .grad_in_place(&mut w[..=i], &dw[..=i], &s[..=i], ws.inv[i]);
        }
        let ds = MatRef::row_major(&ws.weights, t, t);
        let q = MatRef::row_major(&q[head * per_k..][..per_k], t, d.dk);
        let k = MatRef::row_major(&k[head * per_k..][..per_k], t, d.dk);
        let dq = MatMut::row_major(&mut dq[h * per_k..][..per_k], t, d.dk);
        gemm_scaled(dq, ds, k, fwd.scale, false);
        let dk = MatMut::row_major(&mut dk[h * per_k..][..per_k], t, d.dk);
        gemm_scaled(dk, ds.t(), q, fwd.scale, false);
    }
}

impl CustomOp3 for CpuAttentionGrad<'_> {
    fn name(&self) -> &'static str {
        "attnlab-cpu-attention-grad"
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
        let inputs = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
        let (dout, dout_layout) = self.dout.storage_and_layout();
        let candle_core::Storage::Cpu(dout) = &*dout else {
            candle_core::bail!("attention's gradient must be on the CPU");
        };
        let dout = slice(dout, dout_layout)?;
        let d = Dims::of(l1, l3)?;
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{max_abs, max_diff, random};
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
        // Two replicas' batch of 2 each, 3 heads, 7 positions, q/k 4 wide, v 5 wide.
        let (b, h, t, dk, dv) = (4, 3, 7, 4, 5);
        let inputs = [
            random(&[b, h, t, dk], 1, "q"),
            random(&[b, h, t, dk], 2, "k"),
            random(&[b, h, t, dv], 3, "v"),
        ]
        .map(|x| Var::from_tensor(&x).unwrap());
        let seeds = [11, 12];
        let dropouts = [
            None,
            Some(WeightDropout {
                p: 0.3,
                seeds: &seeds,
            }),
        ];
        let rows = [
            RowFunction::Softmax,
            RowFunction::Kernel(RowKernel::Identity),
            RowFunction::Kernel(RowKernel::Taylor),
            RowFunction::Kernel(RowKernel::Square),
        ];
        for row in rows {
            for dropout in dropouts {
                let run = |fused: bool| {
                    value_and_grads(
                        |q, k, v| match fused {
                            true => cpu_attention(q, k, v, row, 0.5, dropout),
                            false => cpu_attention_composed(q, k, v, row, 0.5, dropout),
                        },
                        &inputs,
                    )
                };
                let (fused, explicit) = (run(true), run(false));
                for (what, (a, b)) in ["output", "dq", "dk", "dv"]
                    .iter()
                    .zip(fused.iter().zip(&explicit))
                {
                    let scale = max_abs(b);
                    assert!(scale > 0.0, "{row:?} {what}: zero tests nothing");
                    let diff = max_diff(a, b);
                    assert!(
                        diff <= 1e-5 * scale.max(1.0),
                        "{row:?}, dropout {}: {what} differs by {diff}",
                        dropout.is_some()
                    );
                }
            }
        }
    }
}
