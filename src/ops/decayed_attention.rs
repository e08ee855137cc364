//! Linear attention with a scalar decay per head and position, chunk by chunk:
//! o_i = Σ_{j≤i} e^(G_i − G_j) (q_i·k_j) v_j, G the cumulative log-decay of each head. RetNet's
//! retention (G_i = i ln γ_h) and Mamba-2's SSD (G = cumsum(dt·A), keys dt·B) are this product;
//! the mechanisms add only what is theirs around it.
//!
//! Chunks of C queries take the explicit form within the chunk plus e^(G_i − G_a)·q_i·S from
//! the state S carried over the earlier chunks (a the position before the chunk), then
//! S ← e^(G_L − G_a) S + Σ_j e^(G_L − G_j) k_j v_jᵀ (L the chunk's last position). Built from
//! tensor ops ([`decayed_attention_composed`], the reference, and the path on a GPU) a chunk is
//! ~25 autograd nodes, each a pass over memory; the profile of a retention step at d 128, T 64
//! had those passes and their allocations at a third of the step (89 ms against softmax's
//! 52). The fused CPU op ([`decayed_attention`]) runs each head's chunks in one loop over
//! cache-resident C×C buffers, with the causal products softmax's fused op uses, and its
//! analytic backward pass recomputes the states instead of keeping them.

use std::cell::RefCell;

use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::causal_products::{lower_product, triangular_product};
use super::fused::{slice, zeros};
use super::gemm::{MatMut, MatRef, gemm_into};
use super::{causal_mask, cpu_f32};
use crate::Result;

/// q, k (B, H, T, Dk), v (B, H, T, Dv) and G (B or 1, H, T, 1) → (B, H, T, Dv), each score
/// q_i·k_j times `scale`, chunks of `chunk` queries: fused on the CPU in f32,
/// [`decayed_attention_composed`] elsewhere.
pub fn decayed_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    (scale, chunk): (f64, usize),
) -> Result<Tensor> {
    if !(cpu_f32(q) && q.rank() == 4 && v.rank() == 4) {
        return decayed_attention_composed(q, k, v, g, (scale, chunk));
    }
    let (b, h, t, _) = q.dims4()?;
    // G travels as q's last column, so that one op of three inputs gives its gradient too.
    let g = g.broadcast_as((b, h, t, 1))?.contiguous()?;
    let qg = Tensor::cat(&[&q.contiguous()?, &g], 3)?.contiguous()?;
    let op = DecayedAttention {
        scale: scale as f32,
        chunk: chunk.max(1),
    };
    // The op writes (B, T, H, Dv), the heads side by side as the layer takes them, so this
    // view's transpose back is free.
    Ok(qg
        .apply_op3(&k.contiguous()?, &v.contiguous()?, op)?
        .transpose(1, 2)?)
}

/// [`decayed_attention`] from tensor ops: the reference the fused op is tested against.
pub fn decayed_attention_composed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    (scale, chunk): (f64, usize),
) -> Result<Tensor> {
    let q = &(q * scale)?;
    let (b, h, t, dk) = q.dims4()?;
    let chunk = chunk.max(1);
    let mut state = Tensor::zeros((b, h, dk, v.dim(3)?), v.dtype(), v.device())?;
    let mut outputs = Vec::new();
    for start in (0..t).step_by(chunk) {
        let len = chunk.min(t - start);
        let rows = |x: &Tensor| x.narrow(2, start, len)?.contiguous();
        let (qc, kc, vc) = (rows(q)?, rows(k)?, rows(v)?);
        // G from the position before the chunk: the decay since the state was written.
        let gc = match start {
            0 => rows(g)?,
            s => rows(g)?.broadcast_sub(&g.narrow(2, s - 1, 1)?)?,
        };
        let within = qc
            .matmul(&kc.t()?)?
            .broadcast_mul(&decay_matrix(&gc, &gc)?)?;
        let mut output = within.matmul(&vc)?;
        if start > 0 {
            output = (output + qc.broadcast_mul(&gc.exp()?)?.matmul(&state)?)?;
        }
        outputs.push(output);
        if start + len < t {
            let last = gc.narrow(2, len - 1, 1)?;
            let written = kc.broadcast_mul(&last.broadcast_sub(&gc)?.exp()?)?;
            state = (state.broadcast_mul(&last.exp()?)? + written.t()?.matmul(&vc)?)?;
        }
    }
    Ok(Tensor::cat(&outputs, 2)?)
}

/// min(x, 0): a decay difference where it is meaningful (j ≤ i), 0 past the diagonal, where it
/// is masked anyway and e^x could overflow.
fn non_positive(x: &Tensor) -> Result<Tensor> {
    Ok((x - x.relu()?)?)
}

/// e^(γ_i − γ_j) for rows γq (B, H, n, 1) and columns γk (B, H, m, 1), 0 above the diagonal
/// (queries are the last n of the m positions).
pub fn decay_matrix(gq: &Tensor, gk: &Tensor) -> Result<Tensor> {
    let diff = non_positive(&gq.broadcast_sub(&gk.transpose(2, 3)?)?)?.exp()?;
    Ok(diff.broadcast_mul(&causal_mask(&diff)?.exp()?)?)
}

struct DecayedAttention {
    scale: f32,
    chunk: usize,
}

/// The sizes of one call: q (b, h, t, dk) with G beside it, v (b, h, t, dv).
#[derive(Clone, Copy)]
struct Dims {
    h: usize,
    t: usize,
    dk: usize,
    dv: usize,
    /// What multiplies each score q_i·k_j: it rides with q everywhere.
    scale: f32,
    chunk: usize,
}

impl Dims {
    fn of(qg: &Layout, v: &Layout, (scale, chunk): (f32, usize)) -> candle_core::Result<Self> {
        let ([_, h, t, dk1], [_, _, _, dv]) = (qg.dims(), v.dims()) else {
            candle_core::bail!("decayed attention takes q and v of rank 4");
        };
        Ok(Self {
            h: *h,
            t: *t,
            dk: dk1 - 1,
            dv: *dv,
            scale,
            chunk,
        })
    }

    /// (start, length) of each chunk.
    fn chunks(self) -> impl DoubleEndedIterator<Item = (usize, usize)> + ExactSizeIterator {
        let n = self.t.div_ceil(self.chunk);
        (0..n).map(move |c| {
            let start = c * self.chunk;
            (start, self.chunk.min(self.t - start))
        })
    }

    fn state_len(self) -> usize {
        self.dk * self.dv
    }
}

/// One thread's buffers, reused from call to call.
#[derive(Default)]
struct Workspace {
    /// A chunk's weights, C×C.
    w: Vec<f32>,
    /// Their gradient, C×C.
    dw: Vec<f32>,
    /// [`lower_product`]'s scratch.
    transposed: Vec<f32>,
    /// Decayed queries or keys of a chunk, C×Dk.
    scaled: Vec<f32>,
    /// A chunk's product with a state or its gradient, C×Dk.
    tmp: Vec<f32>,
    /// The state before each chunk (forward: the running state only).
    states: Vec<f32>,
    /// The gradient of the state after the chunk at hand.
    ds: Vec<f32>,
}

thread_local! {
    static WORKSPACE: RefCell<Workspace> = RefCell::default();
}

impl Workspace {
    /// `f` with this thread's workspace, its chunk buffers sized for `d`. Every buffer is
    /// written before it is read.
    fn with<R>(d: Dims, f: impl FnOnce(&mut Self) -> R) -> R {
        WORKSPACE.with_borrow_mut(|ws| {
            let c = d.chunk.min(d.t);
            ws.w.resize(c * c, 0.0);
            ws.dw.resize(c * c, 0.0);
            ws.scaled.resize(c * d.dk, 0.0);
            ws.tmp.resize(c * d.dk, 0.0);
            f(ws)
        })
    }
}

/// One head's inputs: q with G as its last column (T, Dk + 1), k (T, Dk), v (T, Dv).
struct Head<'a> {
    d: Dims,
    qg: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
}

impl<'a> Head<'a> {
    fn of(d: Dims, head: usize, (qg, k, v): (&'a [f32], &'a [f32], &'a [f32])) -> Self {
        let t = d.t;
        Self {
            d,
            qg: &qg[head * t * (d.dk + 1)..][..t * (d.dk + 1)],
            k: &k[head * t * d.dk..][..t * d.dk],
            v: &v[head * t * d.dv..][..t * d.dv],
        }
    }

    /// G at position `i`.
    fn g(&self, i: usize) -> f32 {
        self.qg[i * (self.d.dk + 1) + self.d.dk]
    }

    /// G before the chunk starting at `start`, where its carried state was written.
    fn anchor(&self, start: usize) -> f32 {
        match start {
            0 => 0.0,
            s => self.g(s - 1),
        }
    }

    fn q(&self, (start, len): (usize, usize)) -> MatRef<'a> {
        MatRef {
            data: &self.qg[start * (self.d.dk + 1)..],
            rows: len,
            cols: self.d.dk,
            row_stride: self.d.dk + 1,
            col_stride: 1,
        }
    }

    fn k(&self, (start, len): (usize, usize)) -> MatRef<'a> {
        rows_of(self.k, self.d.dk, (start, len))
    }

    fn v(&self, (start, len): (usize, usize)) -> MatRef<'a> {
        rows_of(self.v, self.d.dv, (start, len))
    }

    /// The chunk's weights in `w` (len × len): (q_i·k_j) e^(G_i − G_j) for j ≤ i, 0 above.
    fn weights(&self, (start, len): (usize, usize), w: &mut [f32], transposed: &mut Vec<f32>) {
        let w = &mut w[..len * len];
        let chunk = (start, len);
        lower_product(w, self.q(chunk), self.k(chunk), self.d.scale, transposed);
        for (i, row) in w.chunks_mut(len).enumerate() {
            let gi = self.g(start + i);
            for (j, x) in row[..=i].iter_mut().enumerate() {
                *x *= (gi - self.g(start + j)).min(0.0).exp();
            }
            row[i + 1..].fill(0.0);
        }
    }

    /// The state after `chunk` from the state before it:
    /// S ← e^(G_L − G_a) S + Σ_j e^(G_L − G_j) k_j v_jᵀ.
    fn advance(&self, chunk: (usize, usize), state: &mut [f32], scaled: &mut [f32]) {
        let (start, len) = chunk;
        let last = self.g(start + len - 1);
        let decay = (last - self.anchor(start)).exp();
        state.iter_mut().for_each(|x| *x *= decay);
        let kt = scaled_rows(self.k(chunk), |j| (last - self.g(start + j)).exp(), scaled);
        let state = MatMut::row_major(state, self.d.dk, self.d.dv);
        gemm_into(state, kt.t(), self.v(chunk), true);
    }

    /// The head's output (T, Dv) into `out`, its rows H·Dv apart ([`merged_rows`]).
    fn forward(&self, out: &mut [f32], ws: &mut Workspace) {
        let d = self.d;
        ws.states.clear();
        ws.states.resize(d.state_len(), 0.0);
        for chunk @ (start, len) in d.chunks() {
            self.weights(chunk, &mut ws.w, &mut ws.transposed);
            let w = &ws.w[..len * len];
            let rows = merged_rows_mut(out, d, chunk);
            triangular_product(rows, w, self.v(chunk), false, 1.0);
            if start > 0 {
                let anchor = self.anchor(start);
                let decay = |i| d.scale * (self.g(start + i) - anchor).exp();
                let qt = scaled_rows(self.q(chunk), decay, &mut ws.scaled);
                let state = MatRef::row_major(&ws.states, d.dk, d.dv);
                gemm_into(merged_rows_mut(out, d, chunk), qt, state, true);
            }
            if start + len < d.t {
                self.advance(chunk, &mut ws.states, &mut ws.scaled);
            }
        }
    }

    /// The states before each chunk, one after the other in `ws.states`.
    fn states(&self, ws: &mut Workspace) {
        let (d, n) = (self.d, self.d.state_len());
        let chunks: Vec<_> = d.chunks().collect();
        ws.states.clear();
        ws.states.resize(chunks.len() * n, 0.0);
        for (c, &chunk) in chunks.iter().enumerate().take(chunks.len() - 1) {
            let (before, after) = ws.states.split_at_mut((c + 1) * n);
            after[..n].copy_from_slice(&before[c * n..]);
            self.advance(chunk, &mut after[..n], &mut ws.scaled);
        }
    }

    /// The head's gradients into `grads` (zeros on entry): dq with dG as its last column,
    /// dk, dv, from the output's gradient `dout` (T, Dv, rows H·Dv apart).
    fn backward(&self, dout: &[f32], grads: &mut Grads, ws: &mut Workspace) {
        let d = self.d;
        self.states(ws);
        let states = std::mem::take(&mut ws.states);
        ws.ds.clear();
        ws.ds.resize(d.state_len(), 0.0);
        for (c, chunk) in d.chunks().enumerate().rev() {
            let dout = merged_rows(dout, d, chunk);
            self.within_grads(chunk, dout, grads, ws);
            let state = &states[c * d.state_len()..][..d.state_len()];
            if chunk.0 + chunk.1 < d.t {
                self.state_grads(chunk, state, grads, ws);
            }
            if chunk.0 > 0 {
                self.carried_grads(chunk, state, dout, grads, ws);
            }
        }
        ws.states = states;
    }

    /// The gradients of the chunk's explicit form: dv = Wᵀ dO; dW = dO vᵀ; dP = dW ⊙ decay,
    /// dq = dP k, dk = dPᵀ q; dG_i += Σ_j dW_ij W_ij, dG_j −= the same.
    fn within_grads(&self, chunk: (usize, usize), dout: MatRef, g: &mut Grads, ws: &mut Workspace) {
        let start = chunk.0;
        let len = chunk.1;
        self.weights(chunk, &mut ws.w, &mut ws.transposed);
        let (w, dw) = (&ws.w[..len * len], &mut ws.dw[..len * len]);
        triangular_product(g.dv(chunk), w, dout, true, 1.0);
        lower_product(dw, dout, self.v(chunk), 1.0, &mut ws.transposed);
        for (i, (dw, w)) in dw.chunks_mut(len).zip(w.chunks(len)).enumerate() {
            let gi = self.g(start + i);
            for (j, (dw, w)) in dw[..=i].iter_mut().zip(&w[..=i]).enumerate() {
                let x = gi - self.g(start + j);
                if j < i && x <= 0.0 {
                    let m = *dw * w;
                    g.add_dg(start + i, m);
                    g.add_dg(start + j, -m);
                }
                *dw *= x.min(0.0).exp();
            }
            dw[i + 1..].fill(0.0);
        }
        let dw = &ws.dw[..len * len];
        let scale = self.d.scale;
        triangular_product(g.dq(chunk), dw, self.k(chunk), false, scale);
        triangular_product(g.dk(chunk), dw, self.q(chunk), true, scale);
    }

    /// The gradients through the state the chunk writes, given its gradient `ws.ds`; then
    /// `ws.ds` becomes the gradient of the state before the chunk, through its decay.
    fn state_grads(&self, chunk: (usize, usize), state: &[f32], g: &mut Grads, ws: &mut Workspace) {
        let (d, (start, len)) = (self.d, chunk);
        let last = self.g(start + len - 1);
        let decay_to_last = |j| (last - self.g(start + j)).exp();
        let kt = scaled_rows(self.k(chunk), decay_to_last, &mut ws.scaled);
        let ds = MatRef::row_major(&ws.ds, d.dk, d.dv);
        // v dSᵀ (len, Dk): each key's gradient before its decay.
        let tmp = &mut ws.tmp[..len * d.dk];
        gemm_into(
            MatMut::row_major(tmp, len, d.dk),
            self.v(chunk),
            ds.t(),
            false,
        );
        for (j, row) in tmp.chunks(d.dk).enumerate() {
            let m = dot(&kt.data[j * d.dk..][..d.dk], row);
            g.add_dg(start + len - 1, m);
            g.add_dg(start + j, -m);
            axpy(decay_to_last(j), row, g.dk_row(start + j));
        }
        gemm_into(g.dv(chunk), kt, ds, true);
        let decay = (last - self.anchor(start)).exp();
        if start > 0 {
            let m = decay * dot(&ws.ds, state);
            g.add_dg(start + len - 1, m);
            g.add_dg(start - 1, -m);
        }
        ws.ds.iter_mut().for_each(|x| *x *= decay);
    }

    /// The gradients of the carried term e^(G_i − G_a) scale·q_i·S, which adds to `ws.ds`.
    fn carried_grads(
        &self,
        chunk: (usize, usize),
        state: &[f32],
        dout: MatRef,
        g: &mut Grads,
        ws: &mut Workspace,
    ) {
        let (d, (start, len)) = (self.d, chunk);
        let anchor = self.anchor(start);
        let decay = |i| d.scale * (self.g(start + i) - anchor).exp();
        // dO Sᵀ (len, Dk): each query's gradient before its decay and scale.
        let tmp = &mut ws.tmp[..len * d.dk];
        let s = MatRef::row_major(state, d.dk, d.dv);
        gemm_into(MatMut::row_major(tmp, len, d.dk), dout, s.t(), false);
        let q = self.q(chunk);
        for (i, row) in tmp.chunks(d.dk).enumerate() {
            let qi = &q.data[i * q.row_stride..][..d.dk];
            let m = decay(i) * dot(qi, row);
            g.add_dg(start + i, m);
            g.add_dg(start - 1, -m);
            axpy(decay(i), row, g.dq_row(start + i));
        }
        let qt = scaled_rows(q, decay, &mut ws.scaled);
        gemm_into(
            MatMut::row_major(&mut ws.ds, d.dk, d.dv),
            qt.t(),
            dout,
            true,
        );
    }
}

/// Rows `start..start + len` of one head's outputs, or their gradient, with the heads side by
/// side: `data` starts at the head's first column, its rows H·Dv apart.
fn merged_rows(data: &[f32], d: Dims, (start, len): (usize, usize)) -> MatRef<'_> {
    MatRef {
        data: &data[start * d.h * d.dv..],
        rows: len,
        cols: d.dv,
        row_stride: d.h * d.dv,
        col_stride: 1,
    }
}

/// [`merged_rows`], to write.
fn merged_rows_mut(data: &mut [f32], d: Dims, (start, len): (usize, usize)) -> MatMut<'_> {
    MatMut {
        data: &mut data[start * d.h * d.dv..],
        rows: len,
        cols: d.dv,
        row_stride: d.h * d.dv,
    }
}

/// Rows `start..start + len` of a row-major matrix of `cols` columns.
fn rows_of(data: &[f32], cols: usize, (start, len): (usize, usize)) -> MatRef<'_> {
    MatRef::row_major(&data[start * cols..][..len * cols], len, cols)
}

/// `dst` = the rows of `x`, row i times `factor(i)`, as a row-major matrix.
fn scaled_rows<'a>(x: MatRef, factor: impl Fn(usize) -> f32, dst: &'a mut [f32]) -> MatRef<'a> {
    let dst = &mut dst[..x.rows * x.cols];
    for (i, row) in dst.chunks_mut(x.cols).enumerate() {
        let (f, src) = (factor(i), &x.data[i * x.row_stride..]);
        for (c, y) in row.iter_mut().enumerate() {
            *y = f * src[c * x.col_stride];
        }
    }
    MatRef::row_major(dst, x.rows, x.cols)
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

/// y += a·x.
fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    y.iter_mut().zip(x).for_each(|(y, x)| *y += a * x);
}

/// One head's gradients: dq with dG as its last column (T, Dk + 1), dk (T, Dk), dv (T, Dv).
struct Grads<'a> {
    d: Dims,
    dqg: &'a mut [f32],
    dk: &'a mut [f32],
    dv: &'a mut [f32],
}

impl Grads<'_> {
    fn add_dg(&mut self, i: usize, x: f32) {
        self.dqg[i * (self.d.dk + 1) + self.d.dk] += x;
    }

    fn dq(&mut self, (start, len): (usize, usize)) -> MatMut<'_> {
        MatMut {
            data: &mut self.dqg[start * (self.d.dk + 1)..],
            rows: len,
            cols: self.d.dk,
            row_stride: self.d.dk + 1,
        }
    }

    fn dk(&mut self, (start, len): (usize, usize)) -> MatMut<'_> {
        let dk = self.d.dk;
        MatMut::row_major(&mut self.dk[start * dk..][..len * dk], len, dk)
    }

    fn dv(&mut self, (start, len): (usize, usize)) -> MatMut<'_> {
        let dv = self.d.dv;
        MatMut::row_major(&mut self.dv[start * dv..][..len * dv], len, dv)
    }

    fn dq_row(&mut self, i: usize) -> &mut [f32] {
        &mut self.dqg[i * (self.d.dk + 1)..][..self.d.dk]
    }

    fn dk_row(&mut self, i: usize) -> &mut [f32] {
        &mut self.dk[i * self.d.dk..][..self.d.dk]
    }
}

impl CustomOp3 for DecayedAttention {
    fn name(&self) -> &'static str {
        "attnlab-decayed-attention"
    }

    cpu_fwd!(self, |s1, l1, s2, l2, s3, l3| {
        let inputs = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
        let d = Dims::of(l1, l3, (self.scale, self.chunk))?;
        let mut out = zeros(inputs.2.len());
        // A batch item at a time: its heads' rows interleave.
        out.par_chunks_mut(d.t * d.h * d.dv)
            .enumerate()
            .for_each(|(b, out)| {
                Workspace::with(d, |ws| {
                    for h in 0..d.h {
                        Head::of(d, b * d.h + h, inputs).forward(&mut out[h * d.dv..], ws);
                    }
                });
            });
        let batch = l3.dims()[0];
        Ok((CpuStorage::F32(out), Shape::from((batch, d.t, d.h, d.dv))))
    });

    fn bwd(
        &self,
        qg: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _out: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let op = DecayedAttentionGrad {
            scale: self.scale,
            chunk: self.chunk,
            dout: grad.contiguous()?,
        };
        let grads = qg.apply_op3_no_bwd(k, v, &op)?;
        let (n_q, n_k, n_v) = (qg.elem_count(), k.elem_count(), v.elem_count());
        let dqg = grads.narrow(0, 0, n_q)?.reshape(qg.shape())?;
        let dk = grads.narrow(0, n_q, n_k)?.reshape(k.shape())?;
        let dv = grads.narrow(0, n_q + n_k, n_v)?.reshape(v.shape())?;
        Ok((Some(dqg), Some(dk), Some(dv)))
    }
}

/// (q with G, k, v) → [dq with dG | dk | dv] flat, given the output's gradient.
struct DecayedAttentionGrad {
    scale: f32,
    chunk: usize,
    dout: Tensor,
}

impl CustomOp3 for DecayedAttentionGrad {
    fn name(&self) -> &'static str {
        "attnlab-decayed-attention-grad"
    }

    cpu_fwd!(self, |s1, l1, s2, l2, s3, l3| {
        let inputs = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
        let (dout, dout_layout) = self.dout.storage_and_layout();
        let candle_core::Storage::Cpu(dout) = &*dout else {
            candle_core::bail!("decayed attention's gradient must be on the CPU");
        };
        let dout = slice(dout, dout_layout)?;
        let d = Dims::of(l1, l3, (self.scale, self.chunk))?;
        let (n_q, n_k, n_v) = (inputs.0.len(), inputs.1.len(), inputs.2.len());
        let mut grads = zeros(n_q + n_k + n_v);
        let (dqg, rest) = grads.split_at_mut(n_q);
        let (dk, dv) = rest.split_at_mut(n_k);
        let (t, h) = (d.t, d.h);
        let per_head = (t * (d.dk + 1), t * d.dk, t * d.dv);
        dqg.par_chunks_mut(h * per_head.0)
            .zip(dk.par_chunks_mut(h * per_head.1))
            .zip(dv.par_chunks_mut(h * per_head.2))
            .enumerate()
            .for_each(|(b, ((dqg, dk), dv))| {
                let heads = dqg
                    .chunks_mut(per_head.0)
                    .zip(dk.chunks_mut(per_head.1))
                    .zip(dv.chunks_mut(per_head.2));
                Workspace::with(d, |ws| {
                    for (i, ((dqg, dk), dv)) in heads.enumerate() {
                        let mut grads = Grads { d, dqg, dk, dv };
                        let dout = &dout[(b * t * h + i) * d.dv..];
                        Head::of(d, b * h + i, inputs).backward(dout, &mut grads, ws);
                    }
                });
            });
        Ok((CpuStorage::F32(grads), Shape::from(n_q + n_k + n_v)))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{max_abs, max_diff, random};
    use candle_core::Var;

    /// A cumulative log-decay (b, h, t, 1): the running sum of steps in (−0.5, 0).
    fn cumulative_decay(b: usize, h: usize, t: usize) -> Tensor {
        let steps = random(&[b, h, t, 1], 4, "decay").tanh().unwrap();
        ((steps - 1.0).unwrap() * 0.25).unwrap().cumsum(2).unwrap()
    }

    /// The fused op against the composed one, value and the gradients of q, k, v and G: at
    /// lengths inside one chunk, across several, ending in a partial chunk, chunks of one
    /// position, and G shared by the batch (retention's) or per item (Mamba-2's).
    #[test]
    fn the_fused_op_equals_the_composed_one_in_value_and_gradient() {
        let cases = [
            (2, 2, 7, 16, 4, 5, false),
            (2, 3, 20, 8, 4, 3, true),
            (1, 2, 37, 16, 8, 24, false),
            (2, 1, 9, 1, 3, 2, true),
            (3, 2, 64, 64, 16, 16, false),
        ];
        for (b, h, t, chunk, dk, dv, shared) in cases {
            let g = match shared {
                true => cumulative_decay(1, h, t),
                false => cumulative_decay(b, h, t),
            };
            let vars = [
                Var::from_tensor(&random(&[b, h, t, dk], 1, "q")).unwrap(),
                Var::from_tensor(&random(&[b, h, t, dk], 2, "k")).unwrap(),
                Var::from_tensor(&random(&[b, h, t, dv], 3, "v")).unwrap(),
                Var::from_tensor(&g).unwrap(),
            ];
            let [q, k, v, g] = vars.each_ref().map(Var::as_tensor);
            let upstream = random(&[b, h, t, dv], 5, "upstream");
            let run = |fused: bool| {
                let out = match fused {
                    true => decayed_attention(q, k, v, g, (0.5, chunk)),
                    false => decayed_attention_composed(q, k, v, g, (0.5, chunk)),
                }
                .unwrap();
                let grads = (&out * &upstream)
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .backward()
                    .unwrap();
                let mut all = vec![out];
                all.extend(vars.iter().map(|x| grads.get(x).unwrap().clone()));
                all
            };
            let (fused, composed) = (run(true), run(false));
            for (what, (a, b)) in ["output", "dq", "dk", "dv", "dG"]
                .iter()
                .zip(fused.iter().zip(&composed))
            {
                let scale = max_abs(b);
                assert!(scale > 0.0, "{what}: zero tests nothing");
                let diff = max_diff(a, b);
                assert!(
                    diff <= 2e-5 * scale.max(1.0),
                    "t {t}, chunk {chunk}: {what} differs by {diff} (scale {scale})"
                );
            }
        }
    }
}
