//! Linear attention with a decay per head, position and key channel, chunk by chunk:
//! o_i = s·Σ_{j≤i} (q_i ⊙ e^(b_i − b_j))·k_j v_j, b the cumulative log-decay (B, H, T, Dk): GLA.
//!
//! Within a chunk q and k are scaled about the position a before it, q̃_i = s q_i ⊙ e^(b_i − b_a)
//! and k̃_j = k_j ⊙ e^(b_a − b_j), so that the chunk's weights are one product q̃ k̃ᵀ; the
//! state carried over the earlier chunks is read as q̃_i·S and written as
//! S ← Diag(e^(b_L − b_a)) S + Σ_j (k_j ⊙ e^(b_L − b_j)) v_jᵀ. As tensor ops
//! ([`channel_decayed_attention_composed`], the reference and the path on a GPU) a GLA step at
//! d 128, T 64 was 112 ms against PyTorch's 90 for the same chunked form; the fused CPU op
//! ([`channel_decayed_attention`]) runs each head's chunks in one loop, as the scalar one does.

use candle_core::Tensor;

use super::composed::{Chunks, Fill};
use super::{Dims, Grads, Inputs, Kernel, axpy, dot, fused};
use crate::Result;
use crate::ops::causal_mask;
use crate::ops::causal_products::{lower_product, triangular_product};
use crate::ops::cpu_f32;
use crate::ops::gemm::{MatMut, MatRef, gemm_into};

/// q, k and b (B, H, T, Dk), v (B, H, T, Dv) → (B, H, T, Dv), each score times `scale`,
/// chunks of `chunk` queries: fused on the CPU in f32, [`channel_decayed_attention_composed`]
/// elsewhere.
pub fn channel_decayed_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    b: &Tensor,
    (scale, chunk): (f64, usize),
) -> Result<Tensor> {
    match cpu_f32(q) && q.rank() == 4 && v.rank() == 4 {
        true => fused::<Channel>(q, k, v, b, (scale, chunk)),
        false => channel_decayed_attention_composed(q, k, v, b, (scale, chunk)),
    }
}

/// [`channel_decayed_attention`] from tensor ops: the reference the fused op is tested
/// against, and the path on a GPU. Each chunk's own scores, reads and writes for every chunk
/// at once ([`Chunks`]); the state carried from chunk to chunk.
pub fn channel_decayed_attention_composed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    b: &Tensor,
    (scale, chunk): (f64, usize),
) -> Result<Tensor> {
    let chunks = Chunks::of(q, chunk)?;
    let side = |x: &Tensor| chunks.side_by_side(x, Fill::Zeros);
    let (qc, kc, vc) = (side(&(q * scale)?)?, side(k)?, side(v)?);
    let bc = chunks.side_by_side(b, Fill::Last)?;
    let end = chunks.last_rows(&bc)?;
    // b at the position before each chunk, where the state was written.
    let anchor = chunks.of_the_chunk_before(&end)?;
    let relative = bc.broadcast_sub(&anchor)?; // ≤ 0
    let qs = (&qc * relative.exp()?)?;
    let ks = (&kc * relative.neg()?.exp()?)?;
    let scores = qs.matmul(&ks.t()?)?;
    let scores = scores.broadcast_mul(&causal_mask(&scores)?.exp()?)?;
    let weighted = (&kc * end.broadcast_sub(&bc)?.exp()?)?;
    let own = chunks.per_chunk(scores.matmul(&vc)?)?;
    // Each key channel's decay over the chunk, (d_k, 1) per chunk.
    let carried = chunks.per_chunk(end.broadcast_sub(&anchor)?.exp()?.transpose(2, 3)?)?;
    let added = chunks.per_chunk(weighted.t()?.matmul(&vc)?)?;
    let read = chunks.per_chunk(qs)?;
    chunks.recur(&own, &read, &carried, &added)
}

/// The fused kernel.
struct Channel;

impl Kernel for Channel {
    const NAME: &'static str = "attnlab-channel-decayed-attention";
    const GRAD_NAME: &'static str = "attnlab-channel-decayed-attention-grad";

    fn q_width(packed: usize) -> usize {
        packed / 2
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
    w: Vec<f32>,
    dw: Vec<f32>,
    transposed: Vec<f32>,
    /// e^(b_i − b_a), q̃, k̃, e^(b_L − b_j) and the decayed keys of the state update, C×Dk
    /// each.
    eq: Vec<f32>,
    qs: Vec<f32>,
    ks: Vec<f32>,
    kf: Vec<f32>,
    kd: Vec<f32>,
    /// Their gradients, C×Dk each.
    dqs: Vec<f32>,
    dks: Vec<f32>,
    dkd: Vec<f32>,
    states: Vec<f32>,
    ds: Vec<f32>,
}

thread_workspace!(Workspace);

impl Workspace {
    /// Every buffer long enough for `d`.
    fn size(&mut self, d: Dims) {
        let c = d.chunk.min(d.t);
        self.w.resize(c * c, 0.0);
        self.dw.resize(c * c, 0.0);
        for buffer in [
            &mut self.eq,
            &mut self.qs,
            &mut self.kf,
            &mut self.ks,
            &mut self.kd,
            &mut self.dqs,
            &mut self.dks,
            &mut self.dkd,
        ] {
            buffer.resize(c * d.dk, 0.0);
        }
    }
}

/// One head's inputs: q with b beside it (T, 2·Dk), k (T, Dk), v (T, Dv).
type Head<'a> = super::Head<'a, Channel>;

impl<'a> Head<'a> {
    /// b at position `i` (Dk).
    fn b_row(&self, i: usize) -> &'a [f32] {
        self.columns(i)
    }

    /// b before the chunk starting at `start` (zeros before the first): the anchor.
    fn anchor(&self, start: usize) -> Option<&'a [f32]> {
        (start > 0).then(|| self.b_row(start - 1))
    }

    /// The chunk's anchored decays e^(b_i − b_a) into `ws.eq`, q̃ = s q ⊙ eq and k̃ = k / eq
    /// into `ws.qs`, `ws.ks` (one exponential per element, kept for the backward pass), and its
    /// weights q̃ k̃ᵀ, 0 above the diagonal, into `ws.w`.
    fn weights(&self, (start, len): (usize, usize), ws: &mut Workspace) {
        let (d, dk) = (self.d, self.d.dk);
        let anchor = self.anchor(start);
        let rows = ws.eq[..len * dk]
            .chunks_mut(dk)
            .zip(ws.qs.chunks_mut(dk))
            .zip(ws.ks.chunks_mut(dk));
        for (i, ((eq, qs), ks)) in rows.enumerate() {
            let (b, q, k) = (
                self.b_row(start + i),
                self.q_row(start + i),
                self.k_row(start + i),
            );
            for c in 0..dk {
                eq[c] = (b[c] - anchor.map_or(0.0, |a| a[c])).exp();
                qs[c] = d.scale * q[c] * eq[c];
                ks[c] = k[c] / eq[c];
            }
        }
        let (qs, ks) = (
            MatRef::row_major(&ws.qs[..len * dk], len, dk),
            MatRef::row_major(&ws.ks[..len * dk], len, dk),
        );
        let w = &mut ws.w[..len * len];
        lower_product(w, qs, ks, 1.0, &mut ws.transposed);
        for (i, row) in w.chunks_mut(len).enumerate() {
            row[i + 1..].fill(0.0);
        }
    }

    /// The decays e^(b_L − b_j) to the chunk's last position into `kf`, and the keys the chunk
    /// writes into the state, k_j ⊙ kf_j, into `kd`.
    fn written_keys(&self, (start, len): (usize, usize), (kf, kd): (&mut [f32], &mut [f32])) {
        let last = self.b_row(start + len - 1);
        let dk = self.d.dk;
        let rows = kf[..len * dk].chunks_mut(dk).zip(kd.chunks_mut(dk));
        for (j, (kf, kd)) in rows.enumerate() {
            let (k, b) = (self.k_row(start + j), self.b_row(start + j));
            for c in 0..dk {
                kf[c] = (last[c] - b[c]).exp();
                kd[c] = k[c] * kf[c];
            }
        }
    }

    /// e^(b_L − b_a) per channel: how the chunk decays the state carried into it.
    fn state_decay(&self, (start, len): (usize, usize), c: usize) -> f32 {
        let last = self.b_row(start + len - 1)[c];
        (last - self.anchor(start).map_or(0.0, |a| a[c])).exp()
    }

    /// S ← Diag(e^(b_L − b_a)) S + Σ_j (k_j ⊙ e^(b_L − b_j)) v_jᵀ.
    fn advance(
        &self,
        chunk: (usize, usize),
        state: &mut [f32],
        (kf, kd): (&mut [f32], &mut [f32]),
    ) {
        let d = self.d;
        for (c, row) in state.chunks_mut(d.dv).enumerate() {
            let decay = self.state_decay(chunk, c);
            row.iter_mut().for_each(|x| *x *= decay);
        }
        self.written_keys(chunk, (&mut *kf, &mut *kd));
        let kd = MatRef::row_major(&kd[..chunk.1 * d.dk], chunk.1, d.dk);
        gemm_into(
            MatMut::row_major(state, d.dk, d.dv),
            kd.t(),
            self.v(chunk),
            true,
        );
    }

    /// The head's output into `out`, its rows H·Dv apart.
    fn forward(&self, out: &mut [f32], ws: &mut Workspace) {
        let d = self.d;
        ws.states.clear();
        ws.states.resize(d.state_len(), 0.0);
        for chunk @ (start, len) in d.chunks() {
            self.weights(chunk, ws);
            let rows = d.merged_rows_mut(out, chunk);
            triangular_product(rows, &ws.w[..len * len], self.v(chunk), false, 1.0);
            if start > 0 {
                let qs = MatRef::row_major(&ws.qs[..len * d.dk], len, d.dk);
                let state = MatRef::row_major(&ws.states, d.dk, d.dv);
                gemm_into(d.merged_rows_mut(out, chunk), qs, state, true);
            }
            if start + len < d.t {
                self.advance(chunk, &mut ws.states, (&mut ws.kf, &mut ws.kd));
            }
        }
    }

    /// The states before each chunk, one after the other in `ws.states`.
    fn states(&self, ws: &mut Workspace) {
        let Workspace { states, kf, kd, .. } = ws;
        self.d.states((states, self.d.state_len()), |chunk, state| {
            self.advance(chunk, state, (kf, kd))
        });
    }

    /// The head's gradients into `g` (zeros on entry) from the output's gradient `dout`
    /// (rows H·Dv apart).
    fn backward(&self, dout: &[f32], g: &mut Grads, ws: &mut Workspace) {
        let d = self.d;
        self.states(ws);
        let states = std::mem::take(&mut ws.states);
        ws.ds.clear();
        ws.ds.resize(d.state_len(), 0.0);
        for (chunk, state, dout) in d.backwards(&states, dout) {
            self.chunk_grads(chunk, dout, state, g, ws);
        }
        ws.states = states;
    }

    /// One chunk's gradients, given `ws.ds`, the gradient of the state after it; `ws.ds`
    /// becomes the gradient of the state before it.
    fn chunk_grads(
        &self,
        chunk: (usize, usize),
        dout: MatRef,
        state: &[f32],
        g: &mut Grads,
        ws: &mut Workspace,
    ) {
        let (d, (start, len)) = (self.d, chunk);
        let (dk, last_chunk) = (d.dk, start + len == d.t);
        self.weights(chunk, ws);
        let w = &ws.w[..len * len];
        // Within the chunk: dv = Wᵀ dO; dW = dO vᵀ; dq̃ = dW k̃, dk̃ = dWᵀ q̃.
        triangular_product(g.dv(chunk), w, dout, true, 1.0);
        let dw = &mut ws.dw[..len * len];
        lower_product(dw, dout, self.v(chunk), 1.0, &mut ws.transposed);
        for (i, row) in dw.chunks_mut(len).enumerate() {
            row[i + 1..].fill(0.0);
        }
        let (qs, ks) = (
            MatRef::row_major(&ws.qs[..len * dk], len, dk),
            MatRef::row_major(&ws.ks[..len * dk], len, dk),
        );
        let dqs = MatMut::row_major(&mut ws.dqs[..len * dk], len, dk);
        triangular_product(dqs, &ws.dw[..len * len], ks, false, 1.0);
        let dks = MatMut::row_major(&mut ws.dks[..len * dk], len, dk);
        triangular_product(dks, &ws.dw[..len * len], qs, true, 1.0);
        let s = MatRef::row_major(state, dk, d.dv);
        let mut ds_before = vec![0f32; 0];
        if start > 0 {
            // The read of the state: dq̃ += dO Sᵀ; the state's gradient gains q̃ᵀ dO.
            let dqs = MatMut::row_major(&mut ws.dqs[..len * dk], len, dk);
            gemm_into(dqs, dout, s.t(), true);
            ds_before = vec![0f32; d.state_len()];
            gemm_into(
                MatMut::row_major(&mut ds_before, dk, d.dv),
                qs.t(),
                dout,
                false,
            );
        }
        if !last_chunk {
            self.state_grads(chunk, state, g, ws);
        }
        self.scaled_grads(chunk, g, ws);
        // The state before the chunk: its decay's gradient, then the read's.
        for (c, row) in ws.ds.chunks_mut(d.dv).enumerate() {
            let decay = self.state_decay(chunk, c);
            row.iter_mut().for_each(|x| *x *= decay);
        }
        for (x, y) in ws.ds.iter_mut().zip(&ds_before) {
            *x += y;
        }
    }

    /// The gradients through the state the chunk writes, S' = Diag(e^(b_L − b_a)) S + kdᵀ v,
    /// given its gradient `ws.ds`.
    fn state_grads(&self, chunk: (usize, usize), state: &[f32], g: &mut Grads, ws: &mut Workspace) {
        let (d, (start, len)) = (self.d, chunk);
        let (dk, end) = (d.dk, start + len - 1);
        self.written_keys(chunk, (&mut ws.kf, &mut ws.kd));
        let kd = MatRef::row_major(&ws.kd[..len * dk], len, dk);
        let ds = MatRef::row_major(&ws.ds, dk, d.dv);
        gemm_into(g.dv(chunk), kd, ds, true);
        // d kd = v dSᵀ: to k through e^(b_L − b_j), and to b_L (+) and b_j (−).
        let dkd = &mut ws.dkd[..len * dk];
        gemm_into(
            MatMut::row_major(dkd, len, dk),
            self.v(chunk),
            ds.t(),
            false,
        );
        let rows = dkd.chunks(dk).zip(ws.kd.chunks(dk)).zip(ws.kf.chunks(dk));
        for (j, ((dkd, kd), kf)) in rows.enumerate() {
            axpy_each(kf, dkd, g.dk_row(start + j));
            for c in 0..dk {
                let m = dkd[c] * kd[c];
                g.dg_row(end)[c] += m;
                g.dg_row(start + j)[c] -= m;
            }
        }
        // The carried state's decay, e^(b_L − b_a) per channel.
        if start > 0 {
            for (c, (s, ds)) in state.chunks(d.dv).zip(ws.ds.chunks(d.dv)).enumerate() {
                let m = self.state_decay(chunk, c) * dot(s, ds);
                g.dg_row(end)[c] += m;
                g.dg_row(start - 1)[c] -= m;
            }
        }
    }

    /// dq, dk and db from dq̃ and dk̃: q̃_i = s q_i ⊙ eq_i, k̃_j = k_j / eq_j, eq = e^(b − b_a).
    fn scaled_grads(&self, (start, len): (usize, usize), g: &mut Grads, ws: &mut Workspace) {
        let (d, dk) = (self.d, self.d.dk);
        let mut to_anchor = vec![0f32; dk];
        for i in 0..len {
            let (qs, ks) = (&ws.qs[i * dk..][..dk], &ws.ks[i * dk..][..dk]);
            let (dqs, dks) = (&ws.dqs[i * dk..][..dk], &ws.dks[i * dk..][..dk]);
            let eq = &ws.eq[i * dk..][..dk];
            for c in 0..dk {
                g.dq_row(start + i)[c] += d.scale * eq[c] * dqs[c];
                g.dk_row(start + i)[c] += dks[c] / eq[c];
                let m = dqs[c] * qs[c] - dks[c] * ks[c];
                g.dg_row(start + i)[c] += m;
                to_anchor[c] -= m;
            }
        }
        if start > 0 {
            axpy(1.0, &to_anchor, g.dg_row(start - 1));
        }
    }
}

/// y += a ⊙ x, element by element.
fn axpy_each(a: &[f32], x: &[f32], y: &mut [f32]) {
    for ((y, a), x) in y.iter_mut().zip(a).zip(x) {
        *y += a * x;
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{Form, assert_fused_equals_composed};
    use super::*;

    /// The fused op against the composed one, value and the gradients of q, k, v and b: inside
    /// one chunk, across several, ending in a partial chunk, and chunks of one position.
    #[test]
    fn the_fused_op_equals_the_composed_one_in_value_and_gradient() {
        let forms = (
            channel_decayed_attention as Form,
            channel_decayed_attention_composed as _,
        );
        let cases = [
            (2, 2, 7, 16, 4, 5),
            (2, 3, 20, 8, 4, 3),
            (1, 2, 37, 16, 8, 24),
            (2, 1, 9, 1, 3, 2),
        ];
        assert_fused_equals_composed(forms, &cases, |b, h, t, dk| [b, h, t, dk]);
    }
}
