//! A scalar decay per head and position: o_i = s·Σ_{j≤i} e^(G_i − G_j) (q_i·k_j) v_j, G the
//! cumulative log-decay of each head. RetNet's retention (G_i = i ln γ_h) and Mamba-2's SSD
//! (G = cumsum(dt·A), keys dt·B) are this product; the mechanisms add only what is theirs
//! around it.
//!
//! Chunks of C queries take the explicit form within the chunk, e^(G_i − G_j) pair by pair (so
//! that no factor overflows however steep the decay), plus s·e^(G_i − G_a) q_i·S from the state
//! S carried over the earlier chunks (a the position before the chunk), then
//! S ← e^(G_L − G_a) S + Σ_j e^(G_L − G_j) k_j v_jᵀ (L the chunk's last position).

use candle_core::Tensor;

use super::composed::{Chunks, Fill};
use super::{Dims, Grads, Inputs, Kernel, axpy, dot, fused, scaled_rows};
use crate::Result;
use crate::ops::causal_mask;
use crate::ops::causal_products::{lower_product, triangular_product};
use crate::ops::cpu_f32;
use crate::ops::gemm::{MatMut, MatRef, gemm_into};

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
    match cpu_f32(q) && q.rank() == 4 && v.rank() == 4 {
        true => fused::<Scalar>(q, k, v, g, (scale, chunk)),
        false => decayed_attention_composed(q, k, v, g, (scale, chunk)),
    }
}

/// [`decayed_attention`] from tensor ops: the reference the fused op is tested against, and
/// the path on a GPU. Each chunk's own scores, reads and writes for every chunk at once
/// ([`Chunks`]); the state carried from chunk to chunk.
pub fn decayed_attention_composed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    (scale, chunk): (f64, usize),
) -> Result<Tensor> {
    let chunks = Chunks::of(q, chunk)?;
    let side = |x: &Tensor| chunks.side_by_side(x, Fill::Zeros);
    let (qc, kc, vc) = (side(&(q * scale)?)?, side(k)?, side(v)?);
    // G from the position before each chunk: the decay since the state was written.
    let g = chunks.side_by_side(g, Fill::Last)?;
    let gc = g.broadcast_sub(&chunks.of_the_chunk_before(&chunks.last_rows(&g)?)?)?;
    let within = qc
        .matmul(&kc.t()?)?
        .broadcast_mul(&decay_matrix(&gc, &gc)?)?;
    let last = chunks.last_rows(&gc)?;
    let written = kc.broadcast_mul(&last.broadcast_sub(&gc)?.exp()?)?;
    let own = chunks.per_chunk(within.matmul(&vc)?)?;
    let read = chunks.per_chunk(qc.broadcast_mul(&gc.exp()?)?)?;
    let added = chunks.per_chunk(written.t()?.matmul(&vc)?)?;
    let carried = chunks.per_chunk(last.exp()?)?;
    chunks.recur(&own, &read, &carried, &added)
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

/// The fused kernel.
struct Scalar;

impl Kernel for Scalar {
    const NAME: &'static str = "attnlab-decayed-attention";
    const GRAD_NAME: &'static str = "attnlab-decayed-attention-grad";

    fn q_width(packed: usize) -> usize {
        packed - 1
    }

    fn forward(d: Dims, head: usize, inputs: Inputs, out: &mut [f32]) {
        Workspace::with(d, |ws| Head::of(d, head, inputs).forward(out, ws));
    }

    fn backward(d: Dims, head: usize, inputs: Inputs, dout: &[f32], grads: &mut Grads) {
        Workspace::with(d, |ws| Head::of(d, head, inputs).backward(dout, grads, ws));
    }
}

/// One thread's buffers, reused from call to call.
#[derive(Default)]
struct Workspace {
    /// A chunk's weights, C×C.
    w: Vec<f32>,
    /// Their gradient, C×C.
    dw: Vec<f32>,
    /// The decays e^(G_i − G_j) of the chunk's weights, C×C.
    decay: Vec<f32>,
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

thread_workspace!(Workspace);

impl Workspace {
    /// Every buffer long enough for `d`.
    fn size(&mut self, d: Dims) {
        let c = d.chunk.min(d.t);
        self.w.resize(c * c, 0.0);
        self.dw.resize(c * c, 0.0);
        self.decay.resize(c * c, 0.0);
        self.scaled.resize(c * d.dk, 0.0);
        self.tmp.resize(c * d.dk, 0.0);
    }
}

/// One head's inputs: q with G as its last column (T, Dk + 1), k (T, Dk), v (T, Dv).
type Head<'a> = super::Head<'a, Scalar>;

impl Head<'_> {
    /// G at position `i`.
    fn g(&self, i: usize) -> f32 {
        self.columns(i)[0]
    }

    /// G before the chunk starting at `start`, where its carried state was written.
    fn anchor(&self, start: usize) -> f32 {
        match start {
            0 => 0.0,
            s => self.g(s - 1),
        }
    }

    /// The chunk's weights in `ws.w` (len × len): s (q_i·k_j) e^(G_i − G_j) for j ≤ i, 0 above;
    /// the decays e^(G_i − G_j) in `ws.decay`, for the backward pass.
    fn weights(&self, (start, len): (usize, usize), ws: &mut Workspace) {
        let (w, decay) = (&mut ws.w[..len * len], &mut ws.decay[..len * len]);
        let chunk = (start, len);
        lower_product(
            w,
            self.q(chunk),
            self.k(chunk),
            self.d.scale,
            &mut ws.transposed,
        );
        for (i, (row, decay)) in w.chunks_mut(len).zip(decay.chunks_mut(len)).enumerate() {
            let gi = self.g(start + i);
            for (j, (x, e)) in row[..=i].iter_mut().zip(&mut decay[..=i]).enumerate() {
                *e = (gi - self.g(start + j)).min(0.0).exp();
                *x *= *e;
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
            self.weights(chunk, ws);
            let w = &ws.w[..len * len];
            let rows = d.merged_rows_mut(out, chunk);
            triangular_product(rows, w, self.v(chunk), false, 1.0);
            if start > 0 {
                let anchor = self.anchor(start);
                let decay = |i| d.scale * (self.g(start + i) - anchor).exp();
                let qt = scaled_rows(self.q(chunk), decay, &mut ws.scaled);
                let state = MatRef::row_major(&ws.states, d.dk, d.dv);
                gemm_into(d.merged_rows_mut(out, chunk), qt, state, true);
            }
            if start + len < d.t {
                self.advance(chunk, &mut ws.states, &mut ws.scaled);
            }
        }
    }

    /// The states before each chunk, one after the other in `ws.states`.
    fn states(&self, ws: &mut Workspace) {
        let Workspace { states, scaled, .. } = ws;
        self.d.states((states, self.d.state_len()), |chunk, state| {
            self.advance(chunk, state, scaled)
        });
    }

    /// The head's gradients into `grads` (zeros on entry): dq with dG as its last column,
    /// dk, dv, from the output's gradient `dout` (T, Dv, rows H·Dv apart).
    fn backward(&self, dout: &[f32], grads: &mut Grads, ws: &mut Workspace) {
        let d = self.d;
        self.states(ws);
        let states = std::mem::take(&mut ws.states);
        ws.ds.clear();
        ws.ds.resize(d.state_len(), 0.0);
        for (chunk, state, dout) in d.backwards(&states, dout) {
            self.within_grads(chunk, dout, grads, ws);
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
        self.weights(chunk, ws);
        let (w, dw) = (&ws.w[..len * len], &mut ws.dw[..len * len]);
        let decay = &ws.decay[..len * len];
        triangular_product(g.dv(chunk), w, dout, true, 1.0);
        lower_product(dw, dout, self.v(chunk), 1.0, &mut ws.transposed);
        let rows = dw.chunks_mut(len).zip(w.chunks(len)).zip(decay.chunks(len));
        for (i, ((dw, w), decay)) in rows.enumerate() {
            let gi = self.g(start + i);
            for (j, ((dw, w), e)) in dw[..=i].iter_mut().zip(&w[..=i]).zip(decay).enumerate() {
                if j < i && gi <= self.g(start + j) {
                    let m = *dw * w;
                    g.dg_row(start + i)[0] += m;
                    g.dg_row(start + j)[0] += -m;
                }
                *dw *= e;
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
            g.dg_row(start + len - 1)[0] += m;
            g.dg_row(start + j)[0] += -m;
            axpy(decay_to_last(j), row, g.dk_row(start + j));
        }
        gemm_into(g.dv(chunk), kt, ds, true);
        let decay = (last - self.anchor(start)).exp();
        if start > 0 {
            let m = decay * dot(&ws.ds, state);
            g.dg_row(start + len - 1)[0] += m;
            g.dg_row(start - 1)[0] += -m;
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
            g.dg_row(start + i)[0] += m;
            g.dg_row(start - 1)[0] += -m;
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

#[cfg(test)]
mod tests {
    use super::super::testing::assert_fused_equals_composed;
    use super::*;

    /// The fused op against the composed one, value and the gradients of q, k, v and G: at
    /// lengths inside one chunk, across several, ending in a partial chunk, chunks of one
    /// position, and G shared by the batch (retention's) or per item (Mamba-2's).
    #[test]
    fn the_fused_op_equals_the_composed_one_in_value_and_gradient() {
        let forms = (
            decayed_attention as super::super::testing::Form,
            decayed_attention_composed as _,
        );
        let per_item = [
            (2, 2, 7, 16, 4, 5),
            (1, 2, 37, 16, 8, 24),
            (3, 2, 64, 64, 16, 16),
        ];
        assert_fused_equals_composed(forms, &per_item, |b, h, t, _| [b, h, t, 1]);
        let shared = [(2, 3, 20, 8, 4, 3), (2, 1, 9, 1, 3, 2)];
        assert_fused_equals_composed(forms, &shared, |_, h, t, _| [1, h, t, 1]);
    }
}
