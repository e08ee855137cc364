//! The delta rule's backward pass chunk by chunk, in matrix products: flash-linear-attention's
//! chunked (WY) form, differentiated by hand. Within a chunk of C tokens, with γ the cumulative
//! log-decay from its start, Γ_ij = e^(γ_i − γ_j) (j ≤ i), L = tril(diag(β)(K Kᵀ ⊙ Γ), −1) and S
//! the state before the chunk:
//!
//! Y = V − (K ⊙ e^γ) S, R = (I + L)⁻¹ diag(β) Y, O = s (Q ⊙ e^γ) S + P R with
//! P = s (Q Kᵀ) ⊙ Γ (j ≤ i), and S ← e^(γ_C) S + (K ⊙ e^(γ_C − γ))ᵀ R.
//!
//! Walked back, each chunk is ten products of C×C and C×D blocks and one C×C inverse (seven
//! products more where a state comes in from an earlier chunk or goes out to a later one),
//! where the recurrence's backward pass had taken each token's gradients from a pass over its
//! state, row by row, with two sums across vector lanes per state row. The forward pass stays
//! the recurrence (`super`): it is the cheaper one, and needs no inverse.
//!
//! Measured (`cargo bench --bench train_step -- delta_rule`: the op's forward and backward at
//! B 64, H 2, T 64, Dk = Dv = 64, on a 2-core AVX2 machine, 2026-11-29): 24.8 ms a layer with
//! the recurrence's backward pass, 23.6 with this one on the causal products softmax's fused
//! op uses (`ops::causal_products`, which skip the zero half of each triangular matrix), and
//! 19.2 with gemm's full products: at D = 64 gemm's kernel outruns them by more than the half
//! it computes in vain.

use super::Head;
use crate::ops::decayed::{Dims, Grads, Inputs, axpy, dot, scaled_rows};
use crate::ops::gemm::{MatMut, MatRef, gemm_into, gemm_scaled};
use crate::ops::unit_triangular::invert;

/// Head `head`'s gradients into `grads` (zeros on entry), from the output's gradient `dout`
/// (rows H·Dv apart).
pub(super) fn backward(d: Dims, head: usize, inputs: Inputs, dout: &[f32], grads: &mut Grads) {
    let head = Head::of(d, head, inputs);
    Workspace::with(d, |ws| head.chunked_backward(dout, grads, ws));
}

/// One thread's buffers, reused from call to call (C×C matrices with rows of the chunk's
/// length).
#[derive(Default)]
struct Workspace {
    /// γ, the cumulative log-decay from the chunk's start; its gradient; β's gradient: C each.
    gamma: Vec<f32>,
    dgamma: Vec<f32>,
    dbeta: Vec<f32>,
    /// Γ on and below the diagonal, 0 above.
    decay: Vec<f32>,
    /// (k_i·k_j) Γ_ij below the diagonal, 0 on and above.
    overlap: Vec<f32>,
    /// L, then the symmetric E + Eᵀ (E = dL ⊙ diag(β) Γ) that L's gradient gives the keys.
    lower: Vec<f32>,
    /// (I + L)⁻¹, 0 above the diagonal.
    inverse: Vec<f32>,
    /// P, then its gradient ⊙ Γ.
    scores: Vec<f32>,
    /// The gradient of P, then of L.
    dscores: Vec<f32>,
    /// Y, diag(β) Y, R and their gradients dR and dZ = (I + L)⁻ᵀ dR: C×Dv each.
    y: Vec<f32>,
    z: Vec<f32>,
    r: Vec<f32>,
    dr: Vec<f32>,
    dz: Vec<f32>,
    /// Scaled rows of q or k, and a chunk's product with a state or its gradient: C×Dk.
    scaled: Vec<f32>,
    tmp: Vec<f32>,
    /// The state before each chunk, Dk×Dv each.
    states: Vec<f32>,
    /// The gradient of the state after the chunk at hand.
    ds: Vec<f32>,
}

thread_workspace!(Workspace);

impl Workspace {
    /// Every buffer long enough for `d`.
    fn size(&mut self, d: Dims) {
        let c = d.chunk.min(d.t);
        for x in [&mut self.gamma, &mut self.dgamma, &mut self.dbeta] {
            x.resize(c, 0.0);
        }
        for x in [
            &mut self.decay,
            &mut self.overlap,
            &mut self.lower,
            &mut self.inverse,
            &mut self.scores,
            &mut self.dscores,
        ] {
            x.resize(c * c, 0.0);
        }
        for x in [
            &mut self.y,
            &mut self.z,
            &mut self.r,
            &mut self.dr,
            &mut self.dz,
        ] {
            x.resize(c * d.dv, 0.0);
        }
        self.scaled.resize(c * d.dk, 0.0);
        self.tmp.resize(c * d.dk, 0.0);
    }
}

/// `dst` = scale · a · b, on the calling thread (the op runs its heads side by side).
fn product(dst: MatMut, a: MatRef, b: MatRef, scale: f32) {
    gemm_scaled(dst, a, b, scale, false);
}

/// Which input's rows a gradient is of.
#[derive(Clone, Copy)]
enum Rows {
    Q,
    K,
}

/// A row-major (rows, cols) matrix in the first rows·cols floats of `data`.
fn mat(data: &[f32], rows: usize, cols: usize) -> MatRef<'_> {
    MatRef::row_major(&data[..rows * cols], rows, cols)
}

/// [`mat`], to write.
fn mat_mut(data: &mut [f32], rows: usize, cols: usize) -> MatMut<'_> {
    MatMut::row_major(&mut data[..rows * cols], rows, cols)
}

impl Head<'_> {
    /// The head's gradients: the states before each chunk first, then the chunks back.
    fn chunked_backward(&self, dout: &[f32], grads: &mut Grads, ws: &mut Workspace) {
        let d = self.d;
        let mut states = std::mem::take(&mut ws.states);
        d.states((&mut states, d.state_len()), |chunk, state| {
            self.advance(chunk, state, ws)
        });
        ws.ds.clear();
        ws.ds.resize(d.state_len(), 0.0);
        for (chunk, state, dout) in d.backwards(&states, dout) {
            self.chunk_backward(chunk, state, dout, grads, ws);
        }
        ws.states = states;
    }

    /// The chunk's γ, Γ, overlaps, L, (I + L)⁻¹, Y, diag(β) Y and R into `ws`, from the state
    /// before it (zero before the first chunk).
    fn residuals(&self, chunk: (usize, usize), state: &[f32], ws: &mut Workspace) {
        let (d, (start, len)) = (self.d, chunk);
        let mut sum = 0.0;
        for (i, gamma) in ws.gamma[..len].iter_mut().enumerate() {
            sum += self.columns(start + i)[0];
            *gamma = sum;
        }
        let gamma = &ws.gamma[..len];
        let overlap = &mut ws.overlap[..len * len];
        let k = self.k(chunk);
        product(mat_mut(overlap, len, len), k, k.t(), 1.0);
        let rows = overlap
            .chunks_mut(len)
            .zip(ws.decay.chunks_mut(len))
            .zip(ws.lower.chunks_mut(len));
        for (i, ((overlap, decay), lower)) in rows.enumerate() {
            let beta = self.beta(start + i);
            for j in 0..i {
                decay[j] = (gamma[i] - gamma[j]).min(0.0).exp();
                overlap[j] *= decay[j];
                lower[j] = beta * overlap[j];
            }
            decay[i] = 1.0;
            decay[i + 1..].fill(0.0);
            overlap[i..].fill(0.0);
        }
        let (y, z) = (&mut ws.y[..len * d.dv], &mut ws.z[..len * d.dv]);
        for (i, y) in y.chunks_mut(d.dv).enumerate() {
            y.copy_from_slice(self.v_row(start + i));
        }
        if start > 0 {
            let keys = scaled_rows(self.k(chunk), |i| -gamma[i].exp(), &mut ws.scaled);
            gemm_into(mat_mut(y, len, d.dv), keys, mat(state, d.dk, d.dv), true);
        }
        for (i, (z, y)) in z.chunks_mut(d.dv).zip(y.chunks(d.dv)).enumerate() {
            let beta = self.beta(start + i);
            z.iter_mut().zip(y).for_each(|(z, y)| *z = beta * y);
        }
        let inverse = &mut ws.inverse[..len * len];
        inverse.fill(0.0);
        invert(&ws.lower[..len * len], inverse, len);
        let inverse = mat(inverse, len, len);
        product(
            mat_mut(&mut ws.r, len, d.dv),
            inverse,
            mat(z, len, d.dv),
            1.0,
        );
    }

    /// The state after `chunk` from the one before it, in place.
    fn advance(&self, chunk: (usize, usize), state: &mut [f32], ws: &mut Workspace) {
        let (d, len) = (self.d, chunk.1);
        self.residuals(chunk, state, ws);
        let end = ws.gamma[len - 1];
        state.iter_mut().for_each(|x| *x *= end.exp());
        let gamma = &ws.gamma;
        let keys = scaled_rows(self.k(chunk), |i| (end - gamma[i]).exp(), &mut ws.scaled);
        let r = mat(&ws.r, len, d.dv);
        gemm_into(mat_mut(state, d.dk, d.dv), keys.t(), r, true);
    }

    /// One chunk's gradients, from the output's gradient `dout` and `ws.ds`, the gradient of
    /// the state after it; `ws.ds` becomes the gradient of the state before it.
    fn chunk_backward(
        &self,
        chunk: (usize, usize),
        state: &[f32],
        dout: MatRef,
        g: &mut Grads,
        ws: &mut Workspace,
    ) {
        let (start, len) = chunk;
        let last = start + len == self.d.t;
        self.residuals(chunk, state, ws);
        self.scores(chunk, ws);
        ws.dgamma[..len].fill(0.0);
        ws.dbeta[..len].fill(0.0);
        self.residual_grads(chunk, (dout, last), g, ws);
        self.matrix_grads(chunk, dout, g, ws);
        if start > 0 {
            self.read_grads(chunk, state, dout, g, ws);
        }
        if !last {
            self.write_grads(chunk, state, g, ws);
        }
        if start > 0 {
            self.carry_state_grad(chunk, dout, ws);
        }
        let mut sum = 0.0;
        for i in (0..len).rev() {
            sum += ws.dgamma[i];
            let dg = g.dg_row(start + i);
            dg[0] += sum;
            dg[1] += ws.dbeta[i];
        }
    }

    /// P = s (Q Kᵀ) ⊙ Γ on and below the diagonal, 0 above, into `ws.scores`.
    fn scores(&self, chunk: (usize, usize), ws: &mut Workspace) {
        let len = chunk.1;
        let scores = &mut ws.scores[..len * len];
        let (q, k) = (self.q(chunk), self.k(chunk));
        product(mat_mut(scores, len, len), q, k.t(), self.d.scale);
        for (i, (row, decay)) in scores.chunks_mut(len).zip(ws.decay.chunks(len)).enumerate() {
            row[..=i].iter_mut().zip(decay).for_each(|(p, e)| *p *= e);
            row[i + 1..].fill(0.0);
        }
    }

    /// dR = Pᵀ dO (+ (K ⊙ e^(γ_C − γ)) dS where the state after the chunk is read), then
    /// dZ = (I + L)⁻ᵀ dR, dV = dY = diag(β) dZ and dβ = Σ dZ ⊙ Y by rows.
    fn residual_grads(
        &self,
        chunk: (usize, usize),
        (dout, last): (MatRef, bool),
        g: &mut Grads,
        ws: &mut Workspace,
    ) {
        let (d, (start, len)) = (self.d, chunk);
        let scores = mat(&ws.scores, len, len);
        product(mat_mut(&mut ws.dr, len, d.dv), scores.t(), dout, 1.0);
        if !last {
            let (gamma, end) = (&ws.gamma, ws.gamma[len - 1]);
            let keys = scaled_rows(self.k(chunk), |i| (end - gamma[i]).exp(), &mut ws.scaled);
            let dr = mat_mut(&mut ws.dr, len, d.dv);
            gemm_into(dr, keys, mat(&ws.ds, d.dk, d.dv), true);
        }
        let (inverse, dr) = (mat(&ws.inverse, len, len), mat(&ws.dr, len, d.dv));
        product(mat_mut(&mut ws.dz, len, d.dv), inverse.t(), dr, 1.0);
        let rows = ws.dz.chunks(d.dv).zip(ws.y.chunks(d.dv)).take(len);
        for (i, (dz, y)) in rows.enumerate() {
            let beta = self.beta(start + i);
            let dv = g.dv_row(start + i);
            dv.iter_mut().zip(dz).for_each(|(dv, dz)| *dv = beta * dz);
            ws.dbeta[i] += dot(dz, y);
        }
    }

    /// The gradients through P and L: dP = dO Rᵀ and dL = −dZ Rᵀ; F = dP ⊙ Γ gives
    /// dQ = s F K and dK = s Fᵀ Q, E = dL ⊙ diag(β) Γ gives dK += (E + Eᵀ) K; the decays take
    /// Σ dP ⊙ P + dL ⊙ L by rows, less the same by columns, and β takes Σ dL ⊙ (K Kᵀ ⊙ Γ).
    fn matrix_grads(&self, chunk: (usize, usize), dout: MatRef, g: &mut Grads, ws: &mut Workspace) {
        let (d, (start, len)) = (self.d, chunk);
        let (r, dz) = (mat(&ws.r, len, d.dv), mat(&ws.dz, len, d.dv));
        product(mat_mut(&mut ws.dscores, len, len), dout, r.t(), 1.0);
        product(mat_mut(&mut ws.lower, len, len), dz, r.t(), -1.0);
        let gamma = &ws.gamma[..len];
        let rows = (ws.scores.chunks_mut(len))
            .zip(ws.dscores.chunks(len))
            .zip(ws.lower.chunks_mut(len))
            .zip(ws.overlap.chunks(len).zip(ws.decay.chunks(len)));
        for (i, (((f, dp), dl), (overlap, decay))) in rows.take(len).enumerate() {
            let beta = self.beta(start + i);
            for j in 0..i {
                let (p, e) = (f[j], decay[j]);
                if gamma[i] <= gamma[j] {
                    let m = dp[j] * p + dl[j] * beta * overlap[j];
                    ws.dgamma[i] += m;
                    ws.dgamma[j] -= m;
                }
                ws.dbeta[i] += dl[j] * overlap[j];
                f[j] = dp[j] * e;
                dl[j] *= beta * e;
            }
            f[i] = dp[i];
            dl[i..].fill(0.0);
        }
        // E + Eᵀ: E is 0 on and above its diagonal.
        let sym = &mut ws.lower[..len * len];
        for i in 0..len {
            for j in 0..i {
                sym[j * len + i] = sym[i * len + j];
            }
        }
        let (f, scale) = (mat(&ws.scores, len, len), d.scale);
        product(g.dq(chunk), f, self.k(chunk), scale);
        product(g.dk(chunk), f.t(), self.q(chunk), scale);
        gemm_into(g.dk(chunk), mat(sym, len, len), self.k(chunk), true);
    }

    /// The gradients of the state's reads, s (Q ⊙ e^γ) S in O and −(K ⊙ e^γ) S in Y:
    /// dQ += s e^γ ⊙ dO Sᵀ, dK −= e^γ ⊙ dY Sᵀ, and the decays the same rows' sums with q, k.
    fn read_grads(
        &self,
        chunk: (usize, usize),
        state: &[f32],
        dout: MatRef,
        g: &mut Grads,
        ws: &mut Workspace,
    ) {
        let (d, (start, len)) = (self.d, chunk);
        let s = mat(state, d.dk, d.dv);
        gemm_into(mat_mut(&mut ws.tmp, len, d.dk), dout, s.t(), false);
        let (tmp, gamma) = (&ws.tmp[..len * d.dk], &ws.gamma);
        let read = |i: usize| d.scale * gamma[i].exp();
        self.factored_grads((start, tmp), (Rows::Q, read), g, |i, m| ws.dgamma[i] += m);
        let dz = mat(&ws.dz, len, d.dv);
        gemm_into(mat_mut(&mut ws.tmp, len, d.dk), dz, s.t(), false);
        let (tmp, gamma) = (&ws.tmp[..len * d.dk], &ws.gamma);
        let read = |i: usize| -self.beta(start + i) * gamma[i].exp();
        self.factored_grads((start, tmp), (Rows::K, read), g, |i, m| ws.dgamma[i] += m);
    }

    /// The gradients of the state the chunk writes, e^(γ_C) S + (K ⊙ e^(γ_C − γ))ᵀ R, given
    /// its gradient dS (`ws.ds`): dK += e^(γ_C − γ) ⊙ R dSᵀ, and the decays.
    fn write_grads(&self, chunk: (usize, usize), state: &[f32], g: &mut Grads, ws: &mut Workspace) {
        let (d, (start, len)) = (self.d, chunk);
        let end = ws.gamma[len - 1];
        let (r, ds) = (mat(&ws.r, len, d.dv), mat(&ws.ds, d.dk, d.dv));
        gemm_into(mat_mut(&mut ws.tmp, len, d.dk), r, ds.t(), false);
        let (tmp, gamma) = (&ws.tmp[..len * d.dk], &ws.gamma);
        let write = |i: usize| (end - gamma[i]).exp();
        self.factored_grads((start, tmp), (Rows::K, write), g, |i, m| {
            ws.dgamma[i] -= m;
            ws.dgamma[len - 1] += m;
        });
        ws.dgamma[len - 1] += end.exp() * dot(state, &ws.ds);
    }

    /// The gradients of a chunk's rows f(i)·x_i (x q or k) from their product's gradient
    /// `tmp` (a row of Dk each): f(i)·tmp_i into x's gradient, and f(i)·(x_i·tmp_i), what f's
    /// decay takes, to `decay(i, ·)`.
    fn factored_grads(
        &self,
        (start, tmp): (usize, &[f32]),
        (rows, f): (Rows, impl Fn(usize) -> f32),
        g: &mut Grads,
        mut decay: impl FnMut(usize, f32),
    ) {
        for (i, row) in tmp.chunks(self.d.dk).enumerate() {
            let (t, f) = (start + i, f(i));
            let (x, grad) = match rows {
                Rows::Q => (self.q_row(t), g.dq_row(t)),
                Rows::K => (self.k_row(t), g.dk_row(t)),
            };
            decay(i, f * dot(x, row));
            axpy(f, row, grad);
        }
    }

    /// `ws.ds` ← the gradient of the state before the chunk:
    /// e^(γ_C) dS + s (Q ⊙ e^γ)ᵀ dO − (K ⊙ β e^γ)ᵀ dZ.
    fn carry_state_grad(&self, chunk: (usize, usize), dout: MatRef, ws: &mut Workspace) {
        let (d, len) = (self.d, chunk.1);
        let (gamma, end) = (&ws.gamma, ws.gamma[len - 1]);
        ws.ds.iter_mut().for_each(|x| *x *= end.exp());
        let queries = scaled_rows(self.q(chunk), |i| d.scale * gamma[i].exp(), &mut ws.scaled);
        gemm_into(mat_mut(&mut ws.ds, d.dk, d.dv), queries.t(), dout, true);
        let start = chunk.0;
        let factor = |i: usize| -self.beta(start + i) * gamma[i].exp();
        let keys = scaled_rows(self.k(chunk), factor, &mut ws.scaled);
        let dz = mat(&ws.dz, len, d.dv);
        gemm_into(mat_mut(&mut ws.ds, d.dk, d.dv), keys.t(), dz, true);
    }
}
