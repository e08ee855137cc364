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
//! Each column of the values is a recurrence of its own (r, o and the state's columns), so the
//! kernel runs blocks of columns ([`Cols`], [`W`] vectors) one after the other, with the
//! block's sums in vector registers and one pass over the state per token: S_t written, and
//! S_tᵀ q_t and S_tᵀ k_{t+1} (the next token's r) read as it is written; backward, one pass over
//! dS and S_{t−1} per token, token t's gradients and token t − 1's read in the same pass. Only
//! the gradients of q, k, g and β sum over the columns, block by block.
//!
//! Measured (`attnlab bench --steps-only --set attention.kind=deltanet`, 2 cores, d 128, T 64):
//! a DeltaNet training step took 109–115 ms with the first form of this kernel (three passes
//! per token, its row sums in memory) against 117–126 ms with the composed chunks, and
//! 62.8–67.9 ms with this one, softmax's 44.9–51.0 (docs/recall.md).

use candle_core::Tensor;

use pulp::{Simd, WithSimd};

use super::composed::{Chunks, Fill};
use super::{Dims, Grads, Inputs, Kernel, decay_matrix, fused};
use crate::Result;
use crate::ops::{cpu_f32, unit_lower_inverse};

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
        let head = Head::of(d, head, inputs);
        Workspace::with(d, |ws| {
            pulp::Arch::new().dispatch(Backward {
                head: &head,
                dout,
                grads,
                ws,
            })
        });
    }
}

/// Vectors of a block of the state's columns, held in registers through a pass over its rows.
const W: usize = 4;

/// One thread's buffers, reused from call to call.
#[derive(Default)]
struct Workspace {
    /// A block's state before each span; in the forward pass, the running state. Each state
    /// is Dk rows of [`BLOCK`] ([`block_state`]).
    states: Vec<f32>,
    /// A span's states, the one before it first: (len + 1) states.
    span: Vec<f32>,
    /// r_t = v_t − P_tᵀ k_t of each token of a span, len rows of [`BLOCK`].
    residuals: Vec<f32>,
    /// The gradient of the state after the token at hand.
    ds: Vec<f32>,
}

thread_workspace!(Workspace);

impl Workspace {
    /// Every buffer long enough for `d`.
    fn size(&mut self, d: Dims) {
        let c = d.chunk.min(d.t);
        let n = block_state(d);
        self.states.resize(d.chunks().len() * n, 0.0);
        self.span.resize((c + 1) * n, 0.0);
        self.residuals.resize(c * BLOCK, 0.0);
        self.ds.resize(n, 0.0);
    }
}

/// A block of the values' columns, `c0..c0 + n`, n at most [`W`] vectors. The delta rule is
/// independent per column of the values (r, o and the state's columns), so each block runs the
/// whole recurrence, forward and back, with its sums in vector registers (summed in memory, row
/// by row, they had made the kernel load- and store-bound); only the gradients of q, k, g and β
/// sum over columns, block by block.
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

/// The sum of a block's vectors, then of its lanes.
#[inline(always)]
fn total<S: Simd>(simd: S, x: [S::f32s; W]) -> f32 {
    let sum = x.into_iter().reduce(|a, b| simd.add_f32s(a, b));
    simd.reduce_sum_f32s(sum.unwrap_or(simd.splat_f32s(0.0)))
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

    /// Sᵀ k_t over the block, S the block's state at the start of `states`: one read of it.
    #[inline(always)]
    fn read<S: Simd>(&self, simd: S, t: usize, states: &[f32]) -> [S::f32s; W] {
        let k = self.k_row(t);
        let mut sum = [simd.splat_f32s(0.0); W];
        for (&ki, row) in k.iter().zip(states.chunks_exact(BLOCK)) {
            let (ki, row) = (simd.splat_f32s(ki), load::<S>(row));
            sum = each::<S>(|j| simd.mul_add_e_f32s(ki, row[j], sum[j]));
        }
        sum
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

    /// The block's states from the one at offset 0 of `states` (before token `start`) through
    /// the span `(start, len)`: in place without `residuals`, or with them each state after
    /// the one before ((len + 1) states) and each token's r_t in `residuals` (rows of
    /// [`BLOCK`]).
    #[inline(always)]
    fn advance<S: Simd>(
        &self,
        (simd, cols): (S, Cols),
        (start, len): (usize, usize),
        states: &mut [f32],
        mut residuals: Option<&mut [f32]>,
    ) {
        let n = block_state(self.d);
        let mut r = self.residual(simd, cols, start, self.read(simd, start, states));
        for i in 0..len {
            if let Some(residuals) = residuals.as_deref_mut() {
                store::<S>(&mut residuals[i * BLOCK..], r);
            }
            let at = match residuals.is_some() {
                true => (i * n, (i + 1) * n),
                false => (0, 0),
            };
            let (_, sk) = self.token::<S, false>(simd, start + i, (states, at), r);
            if start + i + 1 < self.d.t {
                r = self.residual(simd, cols, start + i + 1, sk);
            }
        }
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
        let state = &mut self.ws.states[..block_state(d)];
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

/// The head's gradients into `grads` (zeros on entry): dq with [dg, dβ] as its last columns,
/// dk, dv, from the output's gradient `dout` (T, Dv, rows H·Dv apart). The tokens are walked
/// back, each span's states recomputed from the state before it (kept from a first pass), so
/// it stores T/C states, not T.
struct Backward<'h, 'a, 'g> {
    head: &'h Head<'a>,
    dout: &'h [f32],
    grads: &'h mut Grads<'g>,
    ws: &'h mut Workspace,
}

impl WithSimd for Backward<'_, '_, '_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(mut self, simd: S) {
        let (head, d, n) = (self.head, self.head.d, block_state(self.head.d));
        for cols in Cols::of(d.dv, S::F32_LANES) {
            d.states((&mut self.ws.states, n), |span, state| {
                head.advance((simd, cols), span, state, None)
            });
            self.ws.ds.fill(0.0);
            let mut du = None;
            for (c, (start, len)) in d.chunks().enumerate().rev() {
                let Workspace {
                    states,
                    span,
                    residuals,
                    ..
                } = &mut *self.ws;
                span[..n].copy_from_slice(&states[c * n..][..n]);
                let span = &mut span[..(len + 1) * n];
                head.advance((simd, cols), (start, len), span, Some(residuals));
                // The last token's read: dS_T = s q_T doᵀ.
                let du_t = match du {
                    Some(du) => du,
                    None => self.last_read(simd, cols, len * n),
                };
                du = Some(self.span_backward((simd, cols), (start, len), du_t));
            }
        }
    }
}

impl Backward<'_, '_, '_> {
    /// Row t of the output's gradient.
    #[inline(always)]
    fn dout(&self, t: usize) -> &[f32] {
        let d = self.head.d;
        &self.dout[t * d.h * d.dv..][..d.dv]
    }

    /// The last token's read o = s S_Tᵀ q_T, S_T at `at` in `ws.span`: dS = s q doᵀ (into
    /// `ws.ds`), dq = s S_T do; returns du = dSᵀ k_T over the block.
    #[inline(always)]
    fn last_read<S: Simd>(&mut self, simd: S, cols: Cols, at: usize) -> [S::f32s; W] {
        let (head, d) = (self.head, self.head.d);
        let t = d.t - 1;
        let dout = cols.load(simd, self.dout(t));
        let (q, k) = (head.q_row(t), head.k_row(t));
        let mut du = [simd.splat_f32s(0.0); W];
        for i in 0..d.dk {
            let s = load::<S>(&self.ws.span[at + i * BLOCK..]);
            let zero = [simd.splat_f32s(0.0); W];
            let (ds, dq) = read_grad(simd, (d.scale * q[i], k[i]), (s, dout), zero, &mut du);
            store::<S>(&mut self.ws.ds[i * BLOCK..], ds);
            self.grads.dq_row(t)[i] += d.scale * dq;
        }
        du
    }

    /// The span's tokens back, their states in `ws.span` and residuals in `ws.residuals`, from
    /// du = dSᵀ k of its last token; returns the du of the token before the span.
    #[inline(always)]
    fn span_backward<S: Simd>(
        &mut self,
        (simd, cols): (S, Cols),
        (start, len): (usize, usize),
        mut du: [S::f32s; W],
    ) -> [S::f32s; W] {
        let n = block_state(self.head.d);
        for i in (0..len).rev() {
            let r = load::<S>(&self.ws.residuals[i * BLOCK..]);
            let before = i * n;
            du = self.token_backward((simd, cols), start + i, (before, r), du);
        }
        du
    }

    /// Token t's gradients from du = dSᵀ k_t (dS, in `ws.ds`, the gradient of S_t with o_t's
    /// read in it), and dS carried back to S_{t−1} with o_{t−1}'s read added, in one pass over
    /// dS and S_{t−1} (at `before` in `ws.span`). With u = β r: S_t = P + k uᵀ gives dk = dS u
    /// and dβ = du·r, dr = β du = dv; r = v − Pᵀk gives dk −= P dr, dP = dS − k drᵀ;
    /// P = e^(g) S_{t−1} gives dg = Σ dP ⊙ P and dS_{t−1} = e^(g) dP; then o_{t−1} = s S_{t−1}ᵀ
    /// q_{t−1} gives dq_{t−1} = s S_{t−1} do_{t−1} and dS_{t−1} += s q_{t−1} do_{t−1}ᵀ. Returns
    /// du of token t − 1.
    #[inline(always)]
    fn token_backward<S: Simd>(
        &mut self,
        (simd, cols): (S, Cols),
        t: usize,
        (before, r): (usize, [S::f32s; W]),
        du: [S::f32s; W],
    ) -> [S::f32s; W] {
        let (head, d) = (self.head, self.head.d);
        let (beta, decay) = (head.beta(t), head.decay(t));
        let (betas, decays) = (simd.splat_f32s(beta), simd.splat_f32s(decay));
        let dr = each::<S>(|j| simd.mul_f32s(betas, du[j]));
        cols.store(simd, self.grads.dv_row(t), dr);
        let dbeta = total(simd, each::<S>(|j| simd.mul_f32s(du[j], r[j])));
        let u = each::<S>(|j| simd.mul_f32s(betas, r[j]));
        let decayed_dr = each::<S>(|j| simd.mul_f32s(decays, dr[j]));
        let k = head.k_row(t);
        // Token t − 1's read, none before the first token.
        let previous = t.checked_sub(1).map(|p| {
            let dout = cols.load(simd, self.dout(p));
            (head.q_row(p), head.k_row(p), dout)
        });
        let (mut dg, mut du_before) = ([simd.splat_f32s(0.0); W], [simd.splat_f32s(0.0); W]);
        // Token t's dk and token t − 1's dq, a number per row of the state, into their rows
        // taken once: indexing the gradients row by row (a slice and its bounds per number)
        // made the op's forward and backward at B 64, H 2, T 64, Dk = Dv = 64 take 20.3–23.6 ms
        // a layer on 2 cores, against 18.6–20.2 ms.
        let (dk_out, mut dq_out) = self.grads.dk_and_dq_rows(t);
        let states = &self.ws.span[before..][..d.dk * BLOCK];
        let rows = self.ws.ds[..d.dk * BLOCK].chunks_exact_mut(BLOCK);
        for (i, ((row, s), dk_out)) in rows.zip(states.chunks_exact(BLOCK)).zip(dk_out).enumerate()
        {
            let ds = load::<S>(row);
            let s = load::<S>(s);
            let dk = each::<S>(|j| {
                simd.negate_mul_add_e_f32s(s[j], decayed_dr[j], simd.mul_f32s(ds[j], u[j]))
            });
            *dk_out += total(simd, dk);
            let ki = simd.splat_f32s(k[i]);
            let dp = each::<S>(|j| simd.negate_mul_add_e_f32s(ki, dr[j], ds[j]));
            dg = each::<S>(|j| simd.mul_add_e_f32s(dp[j], s[j], dg[j]));
            let mut ds = each::<S>(|j| simd.mul_f32s(decays, dp[j]));
            if let (Some((q, k, dout)), Some(dq_out)) = (previous, dq_out.as_deref_mut()) {
                let read = (d.scale * q[i], k[i]);
                let dq;
                (ds, dq) = read_grad(simd, read, (s, dout), ds, &mut du_before);
                dq_out[i] += d.scale * dq;
            }
            store::<S>(row, ds);
        }
        let dgb = self.grads.dg_row(t);
        dgb[0] += decay * total(simd, dg);
        dgb[1] += dbeta;
        du_before
    }
}

/// Row i of a token's read o = s Sᵀ q back, from (s q_i, k_i), S's row i and the output's
/// gradient do: returns dS's row i with s q_i do added to `ds`, and S_i·do (dq_i over s);
/// adds k_i times the new row to `du` (dSᵀ k, for the token's write).
#[inline(always)]
fn read_grad<S: Simd>(
    simd: S,
    (read, ki): (f32, f32),
    (s, dout): ([S::f32s; W], [S::f32s; W]),
    ds: [S::f32s; W],
    du: &mut [S::f32s; W],
) -> ([S::f32s; W], f32) {
    let (read, ki) = (simd.splat_f32s(read), simd.splat_f32s(ki));
    let ds = each::<S>(|j| simd.mul_add_e_f32s(read, dout[j], ds[j]));
    *du = each::<S>(|j| simd.mul_add_e_f32s(ki, ds[j], du[j]));
    let dq = total(simd, each::<S>(|j| simd.mul_f32s(s[j], dout[j])));
    (ds, dq)
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
