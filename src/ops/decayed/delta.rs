//! The delta rule with a scalar decay per head and position (DeltaNet, Gated DeltaNet):
//! S_t = e^(g_t) (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ, o_t = s·S_tᵀ q_t.
//!
//! The composed form ([`delta_rule_composed`]: the reference, and the path on a GPU) is
//! flash-linear-attention's chunked one, with the keys' inverse of each chunk. The fused CPU
//! kernel runs the recurrence itself, token by token, in the form
//! P = e^(g) S, r = v − Pᵀk, S ← P + β k rᵀ: per token and head 6·Dk·Dv flops (7 with the
//! decay) against the chunk's ~4·C·(Dk + Dv) + C²/3 for its C×C products and inverse plus its
//! own ~6·Dk·Dv for the state (C = 64, Dk = Dv = 32: 6–7 k against 23 k), every pass over a
//! state that stays in L1, and no C×C products, masks or inverse to keep for the backward pass.
//! The backward pass walks the tokens back, the states of each span of `chunk` tokens
//! recomputed from the state before it (kept from a first pass), so it stores T/C states, not T.
//!
//! Measured (`attnlab bench --steps-only --set attention.kind=deltanet`, 2 cores): a DeltaNet
//! training step at d 128, T 64 takes 109–115 ms against 117–126 with the composed chunks,
//! at T 1024 1.93–2.33 s against 4.45 (docs/recall.md). The row dots of the backward pass are the
//! kernel's cost: each is a horizontal sum, hence [`dot_difference`] and dg by column.

use candle_core::Tensor;

use super::{Dims, Grads, Inputs, Kernel, axpy, decay_matrix, dot, fused};
use crate::Result;
use crate::ops::{cpu_f32, unit_lower_inverse, vectorised};

/// q, k (B, H, T, Dk), v (B, H, T, Dv), the log-decay of each step g and the write strength
/// β (each (B, H, T, 1)) → (B, H, T, Dv), each read q·S times `scale`; `chunk` tokens a span
/// (the composed form's chunk, the fused kernel's span between kept states). Fused on the CPU
/// in f32, [`delta_rule_composed`] elsewhere.
pub fn delta_rule(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    (g, beta): (&Tensor, &Tensor),
    (scale, chunk): (f64, usize),
) -> Result<Tensor> {
    match cpu_f32(q) && q.rank() == 4 && v.rank() == 4 {
        true => fused::<Delta>(q, k, v, &Tensor::cat(&[g, beta], 3)?, (scale, chunk)),
        false => delta_rule_composed(q, k, v, (g, beta), (scale, chunk)),
    }
}

/// [`delta_rule`] from tensor ops, chunk by chunk: with γ the cumulative g from the chunk's
/// start, X = [`delta_inverse`] of its keys, W = X (K ⊙ e^γ), U = X V, R = U − W S,
/// O = (Q ⊙ e^γ) S + (Q Kᵀ ⊙ Γ ⊙ M) R and S ← e^(γ_C) S + (K ⊙ e^(γ_C − γ))ᵀ R.
pub fn delta_rule_composed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    (g, beta): (&Tensor, &Tensor),
    (scale, chunk): (f64, usize),
) -> Result<Tensor> {
    let q = (q * scale)?;
    let (b, h, t, dk) = q.dims4()?;
    let gamma = g.cumsum(2)?;
    let chunk = chunk.max(1);
    let mut state = Tensor::zeros((b, h, dk, v.dim(3)?), v.dtype(), v.device())?;
    let mut outputs = Vec::new();
    for start in (0..t).step_by(chunk) {
        let len = chunk.min(t - start);
        let rows = |x: &Tensor| x.narrow(2, start, len)?.contiguous();
        let (qc, kc, vc, bc) = (rows(&q)?, rows(k)?, rows(v)?, rows(beta)?);
        // γ from the chunk's start: the decay since the state was last written.
        let g = match start {
            0 => rows(&gamma)?,
            s => rows(&gamma)?.broadcast_sub(&gamma.narrow(2, s - 1, 1)?)?,
        };
        let decay = decay_matrix(&g, &g)?;
        let x = delta_inverse(&kc, &bc, &decay)?;
        // S is zero before the first chunk, and the last chunk's state is never read.
        let (first, last) = (start == 0, start + len == t);
        let mut r = x.matmul(&vc)?;
        if !first {
            let w = x.matmul(&kc.broadcast_mul(&g.exp()?)?)?;
            r = (r - w.matmul(&state)?)?;
        }
        let scores = qc.matmul(&kc.t()?)?.mul(&decay)?;
        let mut output = scores.matmul(&r)?;
        if !first {
            output = (output + qc.broadcast_mul(&g.exp()?)?.matmul(&state)?)?;
        }
        outputs.push(output);
        if !last {
            let end = g.narrow(2, len - 1, 1)?;
            let written = kc.broadcast_mul(&end.broadcast_sub(&g)?.exp()?)?;
            state = (state.broadcast_mul(&end.exp()?)? + written.t()?.matmul(&r)?)?;
        }
    }
    Ok(Tensor::cat(&outputs, 2)?)
}

/// (I + tril(diag(β)(K Kᵀ ⊙ Γ), −1))⁻¹ diag(β) ([`unit_lower_inverse`]): (B, H, n, n) for
/// keys k (B, H, n, d_k), β (B, H, n, 1) and Γ (B, H, n, n) ([`decay_matrix`]). The delta
/// rule's weights of the values within a span: each write corrected for what the earlier
/// writes of the span stored under its key.
pub fn delta_inverse(k: &Tensor, beta: &Tensor, decay: &Tensor) -> Result<Tensor> {
    let overlaps = k.matmul(&k.t()?)?.mul(decay)?;
    let lower = overlaps.broadcast_mul(beta)?; // row i scaled by β_i; its strict lower part is L
    Ok(unit_lower_inverse(&lower)?.broadcast_mul(&beta.transpose(2, 3)?)?)
}

/// The fused kernel: q packed with [g, β] beside it.
struct Delta;

impl Kernel for Delta {
    const NAME: &'static str = "attnlab-delta-rule";
    const GRAD_NAME: &'static str = "attnlab-delta-rule-grad";

    fn q_width(packed: usize) -> usize {
        packed - 2
    }

    fn forward(d: Dims, head: usize, inputs: Inputs, out: &mut [f32]) {
        let head = Head::of(d, head, inputs);
        Workspace::with(d, |ws| {
            vectorised(
                #[inline(always)]
                || head.forward(out, ws),
            )
        });
    }

    fn backward(d: Dims, head: usize, inputs: Inputs, dout: &[f32], grads: &mut Grads) {
        let head = Head::of(d, head, inputs);
        Workspace::with(d, |ws| {
            vectorised(
                #[inline(always)]
                || head.backward(dout, grads, ws),
            )
        });
    }
}

/// One thread's buffers, reused from call to call.
#[derive(Default)]
struct Workspace {
    /// The states before each span; in the forward pass, the running state only.
    states: Vec<f32>,
    /// A span's states, the one before it first: (len + 1) × Dk·Dv.
    span: Vec<f32>,
    /// r_t = v_t − P_tᵀ k_t of each token of a span, len × Dv.
    residuals: Vec<f32>,
    /// The gradient of the state after the token at hand, Dk × Dv.
    ds: Vec<f32>,
    /// u = β r of the token at hand (Dv); in the forward pass, its r.
    u: Vec<f32>,
    /// du, then dr = β du (Dv).
    du: Vec<f32>,
    /// The decay's gradient summed by column (Dv), before its one horizontal sum.
    dg: Vec<f32>,
}

thread_workspace!(Workspace);

impl Workspace {
    /// Every buffer long enough for `d`.
    fn size(&mut self, d: Dims) {
        let c = d.chunk.min(d.t);
        self.span.resize((c + 1) * d.state_len(), 0.0);
        self.residuals.resize(c * d.dv, 0.0);
        self.ds.resize(d.state_len(), 0.0);
        self.u.resize(d.dv, 0.0);
        self.du.resize(d.dv, 0.0);
        self.dg.resize(d.dv, 0.0);
    }
}

/// One head's inputs: q with [g, β] as its last columns (T, Dk + 2), k (T, Dk), v (T, Dv).
type Head<'a> = super::Head<'a, Delta>;

impl Head<'_> {
    /// e^(g_t), the decay of step t.
    #[inline(always)]
    fn decay(&self, t: usize) -> f32 {
        self.columns(t)[0].exp()
    }

    /// β_t.
    #[inline(always)]
    fn beta(&self, t: usize) -> f32 {
        self.columns(t)[1]
    }

    /// S_{t−1} in `state` → S_t; r_t = v_t − P_tᵀ k_t into `r` (P_t = e^(g_t) S_{t−1}). Two
    /// passes over the state: Pᵀk as e^(g) (S_{t−1}ᵀ k), and the decay folded into the write
    /// (a pass of its own was a third of Gated DeltaNet's step).
    #[inline(always)]
    fn step(&self, t: usize, state: &mut [f32], r: &mut [f32]) {
        let (k, dv) = (self.k_row(t), self.d.dv);
        let decay = self.decay(t);
        r.fill(0.0);
        for (&ki, row) in k.iter().zip(state.chunks_exact(dv)) {
            axpy(ki, row, r);
        }
        for (r, v) in r.iter_mut().zip(self.v_row(t)) {
            *r = v - decay * *r;
        }
        let beta = self.beta(t);
        for (&ki, row) in k.iter().zip(state.chunks_exact_mut(dv)) {
            let write = beta * ki;
            for (s, r) in row.iter_mut().zip(&*r) {
                *s = decay * *s + write * r;
            }
        }
    }

    /// The state after the span `(start, len)` from the state before it.
    #[inline(always)]
    fn advance(&self, (start, len): (usize, usize), state: &mut [f32], r: &mut [f32]) {
        for t in start..start + len {
            self.step(t, state, r);
        }
    }

    /// The head's output (T, Dv) into `out`, its rows H·Dv apart.
    #[inline(always)]
    fn forward(&self, out: &mut [f32], ws: &mut Workspace) {
        let d = self.d;
        ws.states.clear();
        ws.states.resize(d.state_len(), 0.0);
        for t in 0..d.t {
            self.step(t, &mut ws.states, &mut ws.u);
            let o = &mut out[t * d.h * d.dv..][..d.dv];
            for (&qi, row) in self.q_row(t).iter().zip(ws.states.chunks_exact(d.dv)) {
                axpy(d.scale * qi, row, o);
            }
        }
    }

    /// The head's gradients into `grads` (zeros on entry): dq with [dg, dβ] as its last
    /// columns, dk, dv, from the output's gradient `dout` (T, Dv, rows H·Dv apart).
    #[inline(always)]
    fn backward(&self, dout: &[f32], grads: &mut Grads, ws: &mut Workspace) {
        let d = self.d;
        let n = d.state_len();
        let Workspace {
            states, residuals, ..
        } = ws;
        let r = &mut residuals[..d.dv];
        d.states(states, |span, state| self.advance(span, state, r));
        ws.ds.fill(0.0);
        for ((start, len), before, dout) in d.backwards(&ws.states, dout) {
            // The span's states again, and each token's r.
            ws.span[..n].copy_from_slice(before);
            for i in 0..len {
                let (done, next) = ws.span.split_at_mut((i + 1) * n);
                next[..n].copy_from_slice(&done[i * n..]);
                let r = &mut ws.residuals[i * d.dv..][..d.dv];
                self.step(start + i, &mut next[..n], r);
            }
            for i in (0..len).rev() {
                let states = (&ws.span[i * n..][..n], &ws.span[(i + 1) * n..][..n]);
                let r = &ws.residuals[i * d.dv..][..d.dv];
                let dout = &dout.data[i * dout.row_stride..][..d.dv];
                let scratch = (&mut ws.u[..], &mut ws.du[..], &mut ws.dg[..]);
                self.token_backward(start + i, states, (r, dout), &mut ws.ds, scratch, grads);
            }
        }
    }

    /// Token t's gradients, and the state's gradient `ds` carried from S_t back to S_{t−1}.
    /// With u = β r: S_t = P + k uᵀ gives dk = dS u, du = dSᵀ k, so dβ = du·r and
    /// dr = β du = dv; r = v − Pᵀk gives dk −= P dr, dP = dS − k drᵀ; P = e^(g) S_{t−1} gives
    /// dg = Σ dP ⊙ P and dS_{t−1} = e^(g) dP.
    #[inline(always)]
    fn token_backward(
        &self,
        t: usize,
        (before, after): (&[f32], &[f32]),
        (r, dout): (&[f32], &[f32]),
        ds: &mut [f32],
        (u, du, dg): (&mut [f32], &mut [f32], &mut [f32]),
        grads: &mut Grads,
    ) {
        let (d, k, q) = (self.d, self.k_row(t), self.q_row(t));
        let (beta, decay) = (self.beta(t), self.decay(t));
        u.iter_mut().zip(r).for_each(|(u, r)| *u = beta * r);
        du.fill(0.0);
        // o_t = s S_tᵀ q_t: dq = s S_t do, dS += s q doᵀ.
        let dq = grads.dq_row(t);
        for i in 0..d.dk {
            let (row, ds_row) = (&after[i * d.dv..][..d.dv], &mut ds[i * d.dv..][..d.dv]);
            dq[i] = d.scale * dot(row, dout);
            axpy(d.scale * q[i], dout, ds_row);
            axpy(k[i], ds_row, du);
        }
        let dbeta = dot(du, r);
        du.iter_mut().for_each(|x| *x *= beta); // dr
        grads.dv_row(t).copy_from_slice(du);
        // Σ dP ⊙ S_{t−1} by column, summed once at the end (a sum per row does not vectorise).
        dg.fill(0.0);
        let dk = grads.dk_row(t);
        for i in 0..d.dk {
            let (row, ds_row) = (&before[i * d.dv..][..d.dv], &mut ds[i * d.dv..][..d.dv]);
            dk[i] = dot_difference((ds_row, u), (row, du), decay);
            // dP = dS − k drᵀ, dg += dP ⊙ S_{t−1} and dS_{t−1} = e^(g) dP, in one pass.
            for (((ds, &dr), &s), dg) in ds_row.iter_mut().zip(&*du).zip(row).zip(dg.iter_mut()) {
                let dp = *ds - k[i] * dr;
                *dg += dp * s;
                *ds = dp * decay;
            }
        }
        let dg: f32 = dg.iter().sum();
        let dgb = grads.dg_row(t);
        dgb[0] = decay * dg;
        dgb[1] = dbeta;
    }
}

/// a·x − c (b·y), in one set of partial sums: one horizontal sum instead of two.
#[inline(always)]
fn dot_difference((a, x): (&[f32], &[f32]), (b, y): (&[f32], &[f32]), c: f32) -> f32 {
    const LANES: usize = 16;
    let mut lanes = [0f32; LANES];
    let ((a, ar), (x, xr)) = (a.as_chunks::<LANES>(), x.as_chunks::<LANES>());
    let ((b, br), (y, yr)) = (b.as_chunks::<LANES>(), y.as_chunks::<LANES>());
    for ((a, x), (b, y)) in a.iter().zip(x).zip(b.iter().zip(y)) {
        for (l, (((a, x), b), y)) in lanes.iter_mut().zip(a.iter().zip(x).zip(b).zip(y)) {
            *l += a * x - c * b * y;
        }
    }
    let rest = ar.iter().zip(xr).zip(br.iter().zip(yr));
    let rest: f32 = rest.map(|((a, x), (b, y))| a * x - c * b * y).sum();
    lanes.iter().sum::<f32>() + rest
}

#[cfg(test)]
mod tests {
    use candle_core::Tensor;

    use super::*;
    use crate::ops::decayed::testing::{self, Form};

    /// The kernel's inputs from the harness's decay (two cumulative columns in (−T/2, 0)):
    /// steps g in (−T/20, 0) and β = sigmoid(2 + ·) from ~0.9 down, both varying by position.
    fn split(packed: &Tensor) -> (Tensor, Tensor) {
        let g = (packed.narrow(3, 0, 1).unwrap() * 0.1).unwrap();
        let beta = candle_nn::ops::sigmoid(&(packed.narrow(3, 1, 1).unwrap() + 2.0).unwrap());
        (g, beta.unwrap())
    }

    fn fused_form(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        packed: &Tensor,
        dims: (f64, usize),
    ) -> Result<Tensor> {
        let (g, beta) = split(packed);
        fused::<Delta>(q, k, v, &Tensor::cat(&[&g, &beta], 3)?, dims)
    }

    fn composed_form(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        packed: &Tensor,
        dims: (f64, usize),
    ) -> Result<Tensor> {
        let (g, beta) = split(packed);
        delta_rule_composed(q, k, v, (&g, &beta), dims)
    }

    /// In value and in the gradients of q, k, v, g and β, across spans and partial spans.
    #[test]
    fn the_fused_delta_rule_equals_the_composed_chunks() {
        let forms: (Form, Form) = (fused_form, composed_form);
        let cases = [
            (2, 3, 1, 4, 4, 3),
            (2, 2, 9, 4, 4, 3),
            (1, 2, 16, 4, 5, 6),
            (2, 1, 13, 16, 3, 2),
            (1, 1, 7, 1, 2, 2),
        ];
        testing::assert_fused_equals_composed(forms, &cases, |b, h, t, _| [b, h, t, 2]);
    }
}
