//! The delta rule with a scalar decay per head and position (DeltaNet, Gated DeltaNet):
//! S_t = e^(g_t) (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ, o_t = s·S_tᵀ q_t.
//!
//! The composed form ([`delta_rule_composed`]: the reference, and the path on a GPU) is
//! flash-linear-attention's chunked one, with the keys' inverse of each chunk. The fused CPU
//! op's forward pass runs the recurrence itself, token by token, in the form
//! P = e^(g) S, r = v − Pᵀk, S ← P + β k rᵀ: per token and head 6·Dk·Dv flops (7 with the
//! decay) against the chunk's ~4·C·(Dk + Dv) + C²/3 for its C×C products and inverse plus its
//! own ~6·Dk·Dv for the state (C = 64, Dk = Dv = 32: 6–7 k against 23 k), every pass over a
//! state that stays in L1. Its backward pass is the chunked form's, differentiated by hand
//! ([`wy`]): matrix products of whole chunks, which gemm runs near its peak, where the
//! recurrence's backward pass had been bound by its per-row sums.
//!
//! Each column of the values is a recurrence of its own (r, o and the state's columns), so the
//! forward kernel runs blocks of columns ([`Cols`], [`W`] vectors) one after the other, with the
//! block's sums in vector registers and one pass over the state per token: S_t written, and
//! S_tᵀ q_t and S_tᵀ k_{t+1} (the next token's r) read as it is written.
//!
//! Measured (`attnlab bench --steps-only --set attention.kind=deltanet`, 2 cores, d 128, T 64):
//! a DeltaNet training step took 109–115 ms with the first form of this kernel (three passes
//! per token, its row sums in memory) against 117–126 ms with the composed chunks, and
//! 62.8–67.9 ms with this one, softmax's 44.9–51.0 (docs/recall.md).

mod wy;

use candle_core::Tensor;

use pulp::{Simd, WithSimd};

use super::composed::{Chunks, Fill};
use super::{Dims, Grads, Inputs, Kernel, decay_matrix, fused};
use crate::Result;
use crate::ops::{cpu_f32, unit_lower_inverse};

/// q, k (B, H, T, Dk), v (B, H, T, Dv), the log-decay of each step g and the write strength
/// β (each (B, H, T, 1)) → (B, H, T, Dv), each read q·S times `scale`; `chunk` tokens a chunk
/// (of the composed form, and of the fused op's backward pass). Fused on the CPU
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
/// O = (Q ⊙ e^γ) S + (Q Kᵀ ⊙ Γ ⊙ M) R and S ← e^(γ_C) S + (K ⊙ e^(γ_C − γ))ᵀ R; all but
/// the terms in S for every chunk at once ([`Chunks`]).
pub fn delta_rule_composed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    (g, beta): (&Tensor, &Tensor),
    (scale, chunk): (f64, usize),
) -> Result<Tensor> {
    let (b, h, _, dk) = q.dims4()?;
    let chunks = Chunks::of(q, chunk)?;
    // Past T, β and k are zero: those positions write nothing, and nothing before them reads
    // them.
    let side = |x: &Tensor| chunks.side_by_side(x, Fill::Zeros);
    let (qc, kc, vc) = (side(&(q * scale)?)?, side(k)?, side(v)?);
    let gamma = side(g)?.cumsum(2)?; // from each chunk's start
    let decay = decay_matrix(&gamma, &gamma)?;
    let x = delta_inverse(&kc, &side(beta)?, &decay)?;
    let growth = gamma.exp()?;
    let end = chunks.last_rows(&gamma)?;
    let u = chunks.per_chunk(x.matmul(&vc)?)?;
    let w = chunks.per_chunk(x.matmul(&kc.broadcast_mul(&growth)?)?)?;
    let scores = chunks.per_chunk(qc.matmul(&kc.t()?)?.mul(&decay)?)?;
    let read = chunks.per_chunk(qc.broadcast_mul(&growth)?)?;
    let written = chunks.per_chunk(kc.broadcast_mul(&end.broadcast_sub(&gamma)?.exp()?)?.t()?)?;
    let carried = chunks.per_chunk(end.exp()?)?;
    let at = Chunks::at;
    let mut state = Tensor::zeros((b, h, dk, v.dim(3)?), v.dtype(), v.device())?;
    let mut outputs = Vec::with_capacity(chunks.count());
    for c in 0..chunks.count() {
        // S is zero before the first chunk, and the last chunk's state is never read.
        let (first, last) = (c == 0, c + 1 == chunks.count());
        let mut r = at(&u, c)?;
        if !first {
            r = (r - at(&w, c)?.matmul(&state)?)?;
        }
        let mut output = at(&scores, c)?.matmul(&r)?;
        if !first {
            output = (output + at(&read, c)?.matmul(&state)?)?;
        }
        outputs.push(output);
        if !last {
            state = (state.broadcast_mul(&at(&carried, c)?)? + at(&written, c)?.matmul(&r)?)?;
        }
    }
    chunks.joined(&outputs)
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
            pulp::Arch::new().dispatch(Forward {
                head: &head,
                out,
                ws,
            })
        });
    }

    fn backward(d: Dims, head: usize, inputs: Inputs, dout: &[f32], grads: &mut Grads) {
        wy::backward(d, head, inputs, dout, grads);
    }
}

/// Vectors of a block of the state's columns, held in registers through a pass over its rows.
const W: usize = 4;

/// One thread's buffers, reused from call to call.
#[derive(Default)]
struct Workspace {
    /// A block's running state: Dk rows of [`BLOCK`] ([`block_state`]).
    state: Vec<f32>,
}

thread_workspace!(Workspace);

impl Workspace {
    /// Every buffer long enough for `d`.
    fn size(&mut self, d: Dims) {
        self.state.resize(block_state(d), 0.0);
    }
}

/// A block of the values' columns, `c0..c0 + n`, n at most [`W`] vectors. The delta rule is
/// independent per column of the values (r, o and the state's columns), so each block runs the
/// whole recurrence with its sums in vector registers (summed in memory, row by row, they had
/// made the kernel load- and store-bound).
#[derive(Clone, Copy)]
struct Cols {
    c0: usize,
    n: usize,
}

impl Cols {
    /// The blocks of `dv` columns with vectors of `lanes`.
    fn of(dv: usize, lanes: usize) -> impl Iterator<Item = Self> {
        (0..dv).step_by(W * lanes).map(move |c0| Self {
            c0,
            n: (W * lanes).min(dv - c0),
        })
    }

    /// The block of a row of Dv numbers, vector by vector (empty past the block's end).
    #[inline(always)]
    fn load<S: Simd>(self, simd: S, row: &[f32]) -> [S::f32s; W] {
        let lanes = S::F32_LANES;
        std::array::from_fn(|j| {
            let (start, end) = self.vector(j, lanes);
            simd.partial_load_f32s(&row[start..end])
        })
    }

    #[inline(always)]
    fn store<S: Simd>(self, simd: S, row: &mut [f32], x: [S::f32s; W]) {
        let lanes = S::F32_LANES;
        for (j, x) in x.into_iter().enumerate() {
            let (start, end) = self.vector(j, lanes);
            simd.partial_store_f32s(&mut row[start..end], x);
        }
    }

    /// The columns of vector `j` of the block.
    #[inline(always)]
    fn vector(self, j: usize, lanes: usize) -> (usize, usize) {
        let start = self.c0 + (j * lanes).min(self.n);
        (start, self.c0 + ((j + 1) * lanes).min(self.n))
    }
}

/// A block's row of the state, in the block's own layout: [`W`] whole vectors, zero past the
/// block's columns, so that the passes over the state load and store whole vectors (pulp's
/// partial loads are calls, and their branches kept the block's sums out of registers).
#[inline(always)]
fn load<S: Simd>(row: &[f32]) -> [S::f32s; W] {
    let row = S::as_simd_f32s(&row[..W * S::F32_LANES]).0;
    std::array::from_fn(|j| row[j])
}

#[inline(always)]
fn store<S: Simd>(row: &mut [f32], x: [S::f32s; W]) {
    let row = S::as_mut_simd_f32s(&mut row[..W * S::F32_LANES]).0;
    row[..W].copy_from_slice(&x);
}

/// The floats of a block's row of the state: [`W`] vectors of the widest instruction set.
const BLOCK: usize = W * 16;

/// The floats of a block's state: Dk rows of [`BLOCK`].
fn block_state(d: Dims) -> usize {
    d.dk * BLOCK
}

/// `f` on each vector of a block.
#[inline(always)]
fn each<S: Simd>(f: impl FnMut(usize) -> S::f32s) -> [S::f32s; W] {
    std::array::from_fn(f)
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

    /// r_t = v_t − e^(g_t) (Sᵀ k_t) over the block, from Sᵀ k_t.
    #[inline(always)]
    fn residual<S: Simd>(&self, simd: S, cols: Cols, t: usize, sk: [S::f32s; W]) -> [S::f32s; W] {
        let (v, decay) = (
            cols.load(simd, self.v_row(t)),
            simd.splat_f32s(self.decay(t)),
        );
        each::<S>(|j| simd.negate_mul_add_e_f32s(decay, sk[j], v[j]))
    }

    /// Token t over the block, in one pass over the state: S_t = e^(g_t) S_{t−1} + β_t k_t r_tᵀ
    /// from the state at `from` in `states` into the one at `to` (the same: in place). Returns
    /// S_tᵀ q_t (with `READS`) and S_tᵀ k_{t+1} (k_t at the last token), read as S_t is written.
    #[inline(always)]
    fn token<S: Simd, const READS: bool>(
        &self,
        simd: S,
        t: usize,
        (states, (from, to)): (&mut [f32], (usize, usize)),
        r: [S::f32s; W],
    ) -> ([S::f32s; W], [S::f32s; W]) {
        let d = self.d;
        let (q, k, next) = (
            self.q_row(t),
            self.k_row(t),
            self.k_row((t + 1).min(d.t - 1)),
        );
        let (decay, beta) = (simd.splat_f32s(self.decay(t)), self.beta(t));
        let (mut o, mut sk) = ([simd.splat_f32s(0.0); W], [simd.splat_f32s(0.0); W]);
        for i in 0..d.dk {
            let old = load::<S>(&states[from + i * BLOCK..]);
            let write = simd.splat_f32s(beta * k[i]);
            let new = each::<S>(|j| simd.mul_add_e_f32s(write, r[j], simd.mul_f32s(decay, old[j])));
            store::<S>(&mut states[to + i * BLOCK..], new);
            if READS {
                let qi = simd.splat_f32s(q[i]);
                o = each::<S>(|j| simd.mul_add_e_f32s(qi, new[j], o[j]));
            }
            let ki = simd.splat_f32s(next[i]);
            sk = each::<S>(|j| simd.mul_add_e_f32s(ki, new[j], sk[j]));
        }
        (o, sk)
    }
}

/// The head's output (T, Dv) into `out`, its rows H·Dv apart.
struct Forward<'h, 'a> {
    head: &'h Head<'a>,
    out: &'h mut [f32],
    ws: &'h mut Workspace,
}

impl WithSimd for Forward<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let (head, d, out) = (self.head, self.head.d, self.out);
        let state = &mut self.ws.state[..];
        let scale = simd.splat_f32s(d.scale);
        for cols in Cols::of(d.dv, S::F32_LANES) {
            state.fill(0.0);
            let mut r = cols.load(simd, head.v_row(0));
            for t in 0..d.t {
                let (o, sk) = head.token::<S, true>(simd, t, (state, (0, 0)), r);
                let o = each::<S>(|j| simd.mul_f32s(scale, o[j]));
                cols.store(simd, &mut out[t * d.h * d.dv..][..d.dv], o);
                if t + 1 < d.t {
                    r = head.residual(simd, cols, t + 1, sk);
                }
            }
        }
    }
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
            // Values wider than a block of vectors, ending in a partial vector.
            (1, 2, 21, 8, 9, 70),
        ];
        testing::assert_fused_equals_composed(forms, &cases, |b, h, t, _| [b, h, t, 2]);
    }
}
