//! Linear attention with a decay, chunk by chunk: the recurrent mixers' chunked forms, fused on
//! the CPU. [`scalar`] decays each head by one number per position (retention, Mamba-2),
//! [`channel`] by one per key channel (GLA), [`delta`] is the delta rule with a scalar decay
//! (DeltaNet, Gated DeltaNet). What they share is here: the op around a head's kernel (q with
//! its per-position columns beside it, k, v in; the heads side by side out; the backward pass
//! one op giving [dq with their gradients | dk | dv]), the layout of the heads' rows, the
//! chunks and the test against the composed forms.
//!
//! Built from tensor ops (the `*_composed` functions: the references, and the path on a GPU,
//! every chunk's own work batched across chunks by `composed::Chunks`) a chunk was ~25
//! autograd nodes, each a pass over memory; the profile of a retention step at
//! d 128, T 64 had those passes and their allocations at a third of the step (89 ms against
//! softmax's 52). The fused ops run each head's chunks in one loop over cache-resident C×C
//! buffers, with the causal products softmax's fused op uses, and their analytic backward
//! passes recompute the states instead of keeping them.

/// This thread's `$ws`, reused from call to call: `$ws::with(d, f)` sizes it for `d` (its
/// `size`, which makes every buffer long enough; each is written before it is read) and runs
/// `f` with it.
macro_rules! thread_workspace {
    ($ws:ident) => {
        thread_local! {
            static WORKSPACE: std::cell::RefCell<$ws> = Default::default();
        }

        impl $ws {
            fn with<R>(d: Dims, f: impl FnOnce(&mut Self) -> R) -> R {
                WORKSPACE.with_borrow_mut(|ws| {
                    ws.size(d);
                    f(ws)
                })
            }
        }
    };
}

mod channel;
mod composed;
mod delta;
mod gate;
mod scalar;

use std::marker::PhantomData;

use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

pub use channel::{channel_decayed_attention, channel_decayed_attention_composed};
pub use delta::{delta_inverse, delta_rule, delta_rule_composed};
pub use gate::{cumulative_log_sigmoid, cumulative_log_sigmoid_composed};
pub use scalar::{decay_matrix, decayed_attention, decayed_attention_composed};

use super::fused::{slice, zeros};
use super::gemm::{MatMut, MatRef};
/// Σ aᵢ·bᵢ in partial sums that vectorise (a plain running sum does not).
use super::softmax::dot_lanes as dot;
use crate::Result;

/// What one kind of decay computes for one head.
trait Kernel: 'static {
    const NAME: &'static str;
    const GRAD_NAME: &'static str;
    /// q's width without the decay columns beside it, from the packed width.
    fn q_width(packed: usize) -> usize;
    /// Head `head`'s outputs into `out`, its rows H·Dv apart ([`merged_rows_mut`]).
    fn forward(d: Dims, head: usize, inputs: Inputs, out: &mut [f32]);
    /// Head `head`'s gradients into `grads` (zeros on entry), from the output's gradient
    /// `dout` (rows H·Dv apart).
    fn backward(d: Dims, head: usize, inputs: Inputs, dout: &[f32], grads: &mut Grads);
}

/// The op's inputs: q with the decay beside it, k, v, each (B, H, T, ·) contiguous.
type Inputs<'a> = (&'a [f32], &'a [f32], &'a [f32]);

/// q (B, H, T, Dk), k, v (B, H, T, Dv) and the decay g (B or 1, H, T, columns) → the kernel's
/// output (B, H, T, Dv), as a view of the (B, T, H, Dv) the op writes (the heads side by side,
/// as the layer takes them, so that the transpose back is free).
fn fused<K: Kernel>(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    (scale, chunk): (f64, usize),
) -> Result<Tensor> {
    let (b, h, t, _) = q.dims4()?;
    // The decay travels beside q, so that one op of three inputs gives its gradient too.
    let g = g.broadcast_as((b, h, t, g.dim(3)?))?.contiguous()?;
    let qg = Tensor::cat(&[&q.contiguous()?, &g], 3)?.contiguous()?;
    let op = Fused::<K> {
        scale: scale as f32,
        chunk: chunk.max(1),
        kernel: PhantomData,
    };
    Ok(qg
        .apply_op3(&k.contiguous()?, &v.contiguous()?, op)?
        .transpose(1, 2)?)
}

/// The sizes of one call: q (b, h, t, dk) with `packed − dk` decay columns beside it, v
/// (b, h, t, dv); what multiplies each score; queries per chunk.
#[derive(Clone, Copy)]
struct Dims {
    h: usize,
    t: usize,
    dk: usize,
    packed: usize,
    dv: usize,
    /// What multiplies each score q_i·k_j: it rides with q everywhere.
    scale: f32,
    chunk: usize,
}

impl Dims {
    fn of<K: Kernel>(
        qg: &Layout,
        v: &Layout,
        (scale, chunk): (f32, usize),
    ) -> candle_core::Result<Self> {
        let ([_, h, t, packed], [_, _, _, dv]) = (qg.dims(), v.dims()) else {
            candle_core::bail!("decayed attention takes q and v of rank 4");
        };
        let dk = K::q_width(*packed);
        Ok(Self {
            h: *h,
            t: *t,
            dk,
            packed: *packed,
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

    /// One state, Dk × Dv.
    fn state_len(self) -> usize {
        self.dk * self.dv
    }

    /// Head `head`'s rows of the inputs: q with its decay (T, packed), k (T, Dk), v (T, Dv).
    fn head<'a>(self, head: usize, (qg, k, v): Inputs<'a>) -> Inputs<'a> {
        let t = self.t;
        (
            &qg[head * t * self.packed..][..t * self.packed],
            &k[head * t * self.dk..][..t * self.dk],
            &v[head * t * self.dv..][..t * self.dv],
        )
    }

    /// q's rows of a chunk, without the decay columns.
    fn q_rows<'a>(self, qg: &'a [f32], (start, len): (usize, usize)) -> MatRef<'a> {
        MatRef {
            data: &qg[start * self.packed..],
            rows: len,
            cols: self.dk,
            row_stride: self.packed,
            col_stride: 1,
        }
    }

    /// Rows `start..start + len` of one head's outputs, or their gradient, with the heads side
    /// by side: `data` starts at the head's first column, its rows H·Dv apart.
    fn merged_rows(self, data: &[f32], (start, len): (usize, usize)) -> MatRef<'_> {
        MatRef {
            data: &data[start * self.h * self.dv..],
            rows: len,
            cols: self.dv,
            row_stride: self.h * self.dv,
            col_stride: 1,
        }
    }

    /// [`Self::merged_rows`], to write.
    fn merged_rows_mut(self, data: &mut [f32], (start, len): (usize, usize)) -> MatMut<'_> {
        MatMut {
            data: &mut data[start * self.h * self.dv..],
            rows: len,
            cols: self.dv,
            row_stride: self.h * self.dv,
        }
    }

    /// The states before each chunk, `n` floats each, one after the other in `states`, from
    /// `advance(chunk, state)` that turns the state before a chunk into the state after it.
    /// Inlined, so that `advance` is compiled for the vector width of its caller
    /// ([`crate::ops::vectorised`]).
    #[inline(always)]
    fn states(
        self,
        (states, n): (&mut Vec<f32>, usize),
        mut advance: impl FnMut((usize, usize), &mut [f32]),
    ) {
        let chunks: Vec<_> = self.chunks().collect();
        states.clear();
        states.resize(chunks.len() * n, 0.0);
        for (c, &chunk) in chunks
            .iter()
            .enumerate()
            .take(chunks.len().saturating_sub(1))
        {
            let (before, after) = states.split_at_mut((c + 1) * n);
            after[..n].copy_from_slice(&before[c * n..]);
            advance(chunk, &mut after[..n]);
        }
    }
}

impl Dims {
    /// The chunks from the last to the first, each with the state before it (of `states`, as
    /// [`Self::states`] wrote them) and its rows of the output's gradient `dout`.
    fn backwards<'a>(
        self,
        states: &'a [f32],
        dout: &'a [f32],
    ) -> impl Iterator<Item = ((usize, usize), &'a [f32], MatRef<'a>)> {
        let n = self.state_len();
        self.chunks()
            .enumerate()
            .rev()
            .map(move |(c, chunk)| (chunk, &states[c * n..][..n], self.merged_rows(dout, chunk)))
    }
}

/// One head's rows of the op's inputs: q with its per-position columns beside it
/// (T, packed), k (T, Dk), v (T, Dv); each kernel `K` adds what it computes from them.
struct Head<'a, K> {
    d: Dims,
    qc: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    kernel: PhantomData<fn() -> K>,
}

impl<'a, K> Head<'a, K> {
    fn of(d: Dims, head: usize, inputs: Inputs<'a>) -> Self {
        let (qc, k, v) = d.head(head, inputs);
        Self {
            d,
            qc,
            k,
            v,
            kernel: PhantomData,
        }
    }

    #[inline(always)]
    fn q_row(&self, i: usize) -> &'a [f32] {
        &self.qc[i * self.d.packed..][..self.d.dk]
    }

    /// The per-position columns beside q at position `i`.
    #[inline(always)]
    fn columns(&self, i: usize) -> &'a [f32] {
        &self.qc[i * self.d.packed + self.d.dk..(i + 1) * self.d.packed]
    }

    #[inline(always)]
    fn k_row(&self, i: usize) -> &'a [f32] {
        &self.k[i * self.d.dk..][..self.d.dk]
    }

    #[inline(always)]
    fn v_row(&self, i: usize) -> &'a [f32] {
        &self.v[i * self.d.dv..][..self.d.dv]
    }

    /// q's rows of a chunk, without the columns beside it.
    fn q(&self, chunk: (usize, usize)) -> MatRef<'a> {
        self.d.q_rows(self.qc, chunk)
    }

    fn k(&self, chunk: (usize, usize)) -> MatRef<'a> {
        rows_of(self.k, self.d.dk, chunk)
    }

    fn v(&self, chunk: (usize, usize)) -> MatRef<'a> {
        rows_of(self.v, self.d.dv, chunk)
    }
}

/// Rows `start..start + len` of a row-major matrix of `cols` columns.
fn rows_of(data: &[f32], cols: usize, (start, len): (usize, usize)) -> MatRef<'_> {
    MatRef::row_major(&data[start * cols..][..len * cols], len, cols)
}

/// y += a·x.
#[inline(always)]
fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    y.iter_mut().zip(x).for_each(|(y, x)| *y += a * x);
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

/// One head's gradients: dq with the decay's gradient beside it (T, packed), dk (T, Dk),
/// dv (T, Dv).
struct Grads<'a> {
    d: Dims,
    dqg: &'a mut [f32],
    dk: &'a mut [f32],
    dv: &'a mut [f32],
}

impl Grads<'_> {
    /// dq's rows of a chunk, to write.
    fn dq(&mut self, (start, len): (usize, usize)) -> MatMut<'_> {
        MatMut {
            data: &mut self.dqg[start * self.d.packed..],
            rows: len,
            cols: self.d.dk,
            row_stride: self.d.packed,
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
        &mut self.dqg[i * self.d.packed..][..self.d.dk]
    }

    /// The decay's gradient at position `i`.
    fn dg_row(&mut self, i: usize) -> &mut [f32] {
        let d = self.d;
        &mut self.dqg[i * d.packed + d.dk..(i + 1) * d.packed]
    }

    fn dk_row(&mut self, i: usize) -> &mut [f32] {
        &mut self.dk[i * self.d.dk..][..self.d.dk]
    }

    fn dv_row(&mut self, i: usize) -> &mut [f32] {
        &mut self.dv[i * self.d.dv..][..self.d.dv]
    }
}

/// The forward op of kernel `K`.
struct Fused<K> {
    scale: f32,
    chunk: usize,
    kernel: PhantomData<fn() -> K>,
}

impl<K: Kernel> CustomOp3 for Fused<K> {
    fn name(&self) -> &'static str {
        K::NAME
    }

    cpu_fwd!(self, |s1, l1, s2, l2, s3, l3| {
        let inputs = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
        let d = Dims::of::<K>(l1, l3, (self.scale, self.chunk))?;
        let mut out = zeros(inputs.2.len());
        // A batch item at a time: its heads' rows interleave.
        out.par_chunks_mut(d.t * d.h * d.dv)
            .enumerate()
            .for_each(|(b, out)| {
                for h in 0..d.h {
                    K::forward(d, b * d.h + h, inputs, &mut out[h * d.dv..]);
                }
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
        let op = FusedGrad::<K> {
            scale: self.scale,
            chunk: self.chunk,
            dout: grad.contiguous()?,
            kernel: PhantomData,
        };
        let grads = qg.apply_op3_no_bwd(k, v, &op)?;
        let (n_q, n_k, n_v) = (qg.elem_count(), k.elem_count(), v.elem_count());
        let dqg = grads.narrow(0, 0, n_q)?.reshape(qg.shape())?;
        let dk = grads.narrow(0, n_q, n_k)?.reshape(k.shape())?;
        let dv = grads.narrow(0, n_q + n_k, n_v)?.reshape(v.shape())?;
        Ok((Some(dqg), Some(dk), Some(dv)))
    }
}

/// (q with its decay, k, v) → [dq with the decay's gradient | dk | dv] flat, given the
/// output's gradient.
struct FusedGrad<K> {
    scale: f32,
    chunk: usize,
    dout: Tensor,
    kernel: PhantomData<fn() -> K>,
}

impl<K: Kernel> CustomOp3 for FusedGrad<K> {
    fn name(&self) -> &'static str {
        K::GRAD_NAME
    }

    cpu_fwd!(self, |s1, l1, s2, l2, s3, l3| {
        let inputs = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
        let (dout, dout_layout) = self.dout.storage_and_layout();
        let candle_core::Storage::Cpu(dout) = &*dout else {
            candle_core::bail!("decayed attention's gradient must be on the CPU");
        };
        let dout = slice(dout, dout_layout)?;
        let d = Dims::of::<K>(l1, l3, (self.scale, self.chunk))?;
        let (n_q, n_k, n_v) = (inputs.0.len(), inputs.1.len(), inputs.2.len());
        let mut grads = zeros(n_q + n_k + n_v);
        let (dqg, rest) = grads.split_at_mut(n_q);
        let (dk, dv) = rest.split_at_mut(n_k);
        let (t, h) = (d.t, d.h);
        let per_head = (t * d.packed, t * d.dk, t * d.dv);
        dqg.par_chunks_mut(h * per_head.0)
            .zip(dk.par_chunks_mut(h * per_head.1))
            .zip(dv.par_chunks_mut(h * per_head.2))
            .enumerate()
            .for_each(|(b, ((dqg, dk), dv))| {
                let heads = dqg
                    .chunks_mut(per_head.0)
                    .zip(dk.chunks_mut(per_head.1))
                    .zip(dv.chunks_mut(per_head.2));
                for (i, ((dqg, dk), dv)) in heads.enumerate() {
                    let mut grads = Grads { d, dqg, dk, dv };
                    let dout = &dout[(b * t * h + i) * d.dv..];
                    K::backward(d, b * h + i, inputs, dout, &mut grads);
                }
            });
        Ok((CpuStorage::F32(grads), Shape::from(n_q + n_k + n_v)))
    });
}

#[cfg(test)]
mod testing {
    use candle_core::{Tensor, Var};

    use crate::Result;
    use crate::ops::testing::{assert_close_to, random};

    /// A decayed attention: q, k, v, the decay, (scale, chunk).
    pub type Form = fn(&Tensor, &Tensor, &Tensor, &Tensor, (f64, usize)) -> Result<Tensor>;

    /// Asserts that `fused` equals `composed` in value and in the gradients of q, k, v and the
    /// decay, for (b, h, t, chunk, dk, dv) `cases`, with the decay of `decay(b, h, t, dk)`: a
    /// running sum of steps in (−0.5, 0), so that it never grows.
    pub fn assert_fused_equals_composed(
        (fused, composed): (Form, Form),
        cases: &[(usize, usize, usize, usize, usize, usize)],
        decay_shape: impl Fn(usize, usize, usize, usize) -> [usize; 4],
    ) {
        for &(b, h, t, chunk, dk, dv) in cases {
            let steps = random(&decay_shape(b, h, t, dk), 4, "decay")
                .tanh()
                .unwrap();
            let decay = ((steps - 1.0).unwrap() * 0.25).unwrap().cumsum(2).unwrap();
            let vars = [
                Var::from_tensor(&random(&[b, h, t, dk], 1, "q")).unwrap(),
                Var::from_tensor(&random(&[b, h, t, dk], 2, "k")).unwrap(),
                Var::from_tensor(&random(&[b, h, t, dv], 3, "v")).unwrap(),
                Var::from_tensor(&decay).unwrap(),
            ];
            let [q, k, v, g] = vars.each_ref().map(Var::as_tensor);
            let upstream = random(&[b, h, t, dv], 5, "upstream");
            let run = |form: Form| {
                let out = form(q, k, v, g, (0.5, chunk)).unwrap();
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
            let (fused, composed) = (run(fused), run(composed));
            for (what, (a, b)) in ["output", "dq", "dk", "dv", "d decay"]
                .iter()
                .zip(fused.iter().zip(&composed))
            {
                assert_close_to(a, b, 2e-5, &format!("t {t}, chunk {chunk}: {what}"));
            }
        }
    }
}
