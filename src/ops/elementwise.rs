//! Element-wise fused ops: GELU (with a branch-free erf), SiLU, a SiLU gate and a
//! trailing-shape broadcast add.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::fused::{ChunkGrad, column_sums, slice, zeros};
use super::softmax::exp;

/// erf(x) in f32 as a rational function of x (Eigen's `generic_fast_erf_float`), within
/// 1e-6 of libm's `erff` (tested). Branch-free, so the GELU loops vectorise, where a call to
/// `libm::erff` per element took a tenth of a training step.
#[inline(always)]
pub(super) fn erf(x: f32) -> f32 {
    // Past ±4, erf is ±1 to f32 precision.
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let p = [
        -1.609_603_3e-2,
        -2.954_6e-3,
        -7.349_906_3e-4,
        -5.692_506_4e-5,
        -2.101_024e-6,
        2.770_681_4e-8,
        -2.726_142_3e-10,
    ]
    .iter()
    .rev()
    .fold(0.0, |acc, c| acc * x2 + c);
    let q = [
        -1.426_473_9e-2,
        -7.373_329e-3,
        -1.682_827e-3,
        -2.133_740_6e-4,
        -1.456_607_2e-5,
    ]
    .iter()
    .rev()
    .fold(0.0, |acc, c| acc * x2 + c);
    x * p / q
}

/// x + y for a y shaped like x's trailing dimensions (a position table added to every
/// sequence of a batch). candle's broadcast add sums y's gradient over the batch with a
/// strided reduction (about 2% of a benchmark step); here it is [`column_sums`].
pub struct AddBroadcast;

impl CustomOp2 for AddBroadcast {
    fn name(&self) -> &'static str {
        "attnlab-add-broadcast"
    }

    cpu_fwd!(self, |s1, l1, s2, l2| {
        let (x, y) = (slice(s1, l1)?, slice(s2, l2)?);
        check_trailing(l1, l2)?;
        let mut out = zeros(x.len());
        out.par_chunks_mut(y.len())
            .zip(x.par_chunks(y.len()))
            .for_each(|(o, x)| {
                for ((o, x), y) in o.iter_mut().zip(x).zip(y) {
                    *o = x + y;
                }
            });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    });

    cuda_fwd!(self, |s1, l1, s2, l2| {
        check_trailing(l1, l2)?;
        super::cuda::add_broadcast((s1, l1), (s2, l2))
    });

    fn bwd(
        &self,
        _x: &Tensor,
        y: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let n = y.elem_count();
        let dy = column_sums(&grad.reshape((grad.elem_count() / n, n))?)?;
        Ok((Some(grad.clone()), Some(dy.reshape(y.shape())?)))
    }
}

/// Whether y's shape (l2) is the end of x's (l1), as [`AddBroadcast`] needs.
fn check_trailing(l1: &Layout, l2: &Layout) -> candle_core::Result<()> {
    let (xd, yd) = (l1.dims(), l2.dims());
    if l2.shape().elem_count() == 0 || yd.len() > xd.len() || xd[xd.len() - yd.len()..] != *yd {
        candle_core::bail!("add_broadcast: {yd:?} is not the end of {xd:?}");
    }
    Ok(())
}

/// `f` of every element, in parallel blocks of 4,096 compiled for the CPU's widest vectors
/// ([`super::vectorised`]; `f` should be inlined, as a closure is): the forward pass of an
/// element-wise op.
fn map(x: &[f32], f: impl Fn(f32) -> f32 + Sync) -> Vec<f32> {
    let mut out = zeros(x.len());
    out.par_chunks_mut(4096)
        .zip(x.par_chunks(4096))
        .for_each(|(o, x)| {
            super::vectorised(
                #[inline(always)]
                || o.iter_mut().zip(x).for_each(|(o, &x)| *o = f(x)),
            )
        });
    out
}

/// GELU with the exact erf form, as PyTorch's `nn.GELU()`: x·Φ(x).
pub struct GeluErf;

const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;

impl CustomOp1 for GeluErf {
    fn name(&self) -> &'static str {
        "attnlab-gelu-erf"
    }

    cpu_fwd!(self, |storage, layout| {
        let out = map(slice(storage, layout)?, |x| {
            0.5 * x * (1.0 + erf(x * FRAC_1_SQRT_2))
        });
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    });

    cuda_fwd!(self, |storage, layout| {
        super::cuda::gelu_erf(storage, layout)
    });

    fn bwd(
        &self,
        arg: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        GELU_ERF_GRAD.apply(grad_res, arg)
    }
}

/// GELU's gradient, d/dx x·Φ(x) = Φ(x) + x·φ(x), from the input x saved.
const GELU_ERF_GRAD: ChunkGrad = ChunkGrad {
    name: "attnlab-gelu-erf-grad",
    kernel: "attnlab_gelu_erf_grad",
    chunk: Some(4096),
    f: |o, dy, x| {
        let inv_sqrt_2pi = 0.5 * std::f32::consts::FRAC_2_SQRT_PI * FRAC_1_SQRT_2;
        super::vectorised(
            #[inline(always)]
            || {
                for ((o, dy), x) in o.iter_mut().zip(dy).zip(x) {
                    let cdf = 0.5 * (1.0 + erf(x * FRAC_1_SQRT_2));
                    let pdf = inv_sqrt_2pi * exp(-0.5 * x * x);
                    *o = dy * (cdf + x * pdf);
                }
            },
        )
    },
};

/// SiLU, x·σ(x), the recurrent mixers' gates and convolutions: candle's backward pass builds σ′
/// from ops of its own, each a pass over the gate; this one takes one. (Measured: dropping the
/// gate's SiLU altogether took 2.6 ms off a 75 ms retention step; the fused op's own gain is
/// within the step's noise.)
pub struct Silu;

impl CustomOp1 for Silu {
    fn name(&self) -> &'static str {
        "attnlab-silu"
    }

    cpu_fwd!(self, |storage, layout| {
        let out = map(slice(storage, layout)?, |x| x / (1.0 + exp(-x)));
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    });

    fn bwd(
        &self,
        arg: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        SILU_GRAD.apply(grad_res, arg)
    }
}

/// SiLU's gradient, d/dx x·σ(x) = σ(x)(1 + x(1 − σ(x))), from the input x saved. CPU only,
/// as [`Silu`]: its CUDA kernel is not written.
const SILU_GRAD: ChunkGrad = ChunkGrad {
    name: "attnlab-silu-grad",
    kernel: "attnlab_silu_grad",
    chunk: Some(4096),
    f: |o, dy, x| {
        super::vectorised(
            #[inline(always)]
            || {
                for ((o, dy), x) in o.iter_mut().zip(dy).zip(x) {
                    let sigmoid = 1.0 / (1.0 + exp(-x));
                    *o = dy * sigmoid * (1.0 + x * (1.0 - sigmoid));
                }
            },
        )
    },
};

/// x ⊙ silu(z), the recurrent mixers' output gates (FLA's gated head norm, Mamba-2's
/// y ⊙ silu(z)): one pass forward and one back for both gradients, where the product and the
/// SiLU were two ops each way, each a pass over the layer's output and an allocation. The
/// gate cost Gated DeltaNet 9.5 ms of a 73.5 ms step before, 5.7–6.8 ms of 76.6 after, in a
/// series ~10 % slower throughout (docs/recall.md). CPU only: [`super::silu_gate`] composes it
/// elsewhere.
pub struct SiluGate;

/// The chunk each task of [`SiluGate`] and its gradient takes.
const GATE_CHUNK: usize = 4096;

impl CustomOp2 for SiluGate {
    fn name(&self) -> &'static str {
        "attnlab-silu-gate"
    }

    cpu_fwd!(self, |s1, l1, s2, l2| {
        let (x, z) = (slice(s1, l1)?, slice(s2, l2)?);
        if l1.shape() != l2.shape() {
            candle_core::bail!("silu_gate: x {:?} and gate {:?}", l1.dims(), l2.dims());
        }
        let mut out = zeros(x.len());
        out.par_chunks_mut(GATE_CHUNK)
            .zip(x.par_chunks(GATE_CHUNK).zip(z.par_chunks(GATE_CHUNK)))
            .for_each(|(o, (x, z))| {
                super::vectorised(
                    #[inline(always)]
                    || {
                        for ((o, x), z) in o.iter_mut().zip(x).zip(z) {
                            *o = x * z / (1.0 + exp(-z));
                        }
                    },
                )
            });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    });

    fn bwd(
        &self,
        x: &Tensor,
        z: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let grads = grad.contiguous()?.apply_op3_no_bwd(x, z, &SiluGateGrad)?;
        let n = x.elem_count();
        let dx = grads.narrow(0, 0, n)?.reshape(x.shape())?;
        let dz = grads.narrow(0, n, n)?.reshape(z.shape())?;
        Ok((Some(dx), Some(dz)))
    }
}

/// (g, x, z) → [dx | dz] flat: dx = g ⊙ silu(z), dz = g ⊙ x ⊙ σ(z)(1 + z(1 − σ(z))).
struct SiluGateGrad;

impl CustomOp3 for SiluGateGrad {
    fn name(&self) -> &'static str {
        "attnlab-silu-gate-grad"
    }

    cpu_fwd!(self, |s1, l1, s2, l2, s3, l3| {
        let (g, x, z) = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
        let n = x.len();
        let mut out = zeros(2 * n);
        let (dx, dz) = out.split_at_mut(n);
        dx.par_chunks_mut(GATE_CHUNK)
            .zip(dz.par_chunks_mut(GATE_CHUNK))
            .zip(g.par_chunks(GATE_CHUNK))
            .zip(x.par_chunks(GATE_CHUNK).zip(z.par_chunks(GATE_CHUNK)))
            .for_each(|(((dx, dz), g), (x, z))| {
                super::vectorised(
                    #[inline(always)]
                    || {
                        let rows = dx.iter_mut().zip(dz.iter_mut()).zip(g);
                        for (((dx, dz), g), (x, z)) in rows.zip(x.iter().zip(z)) {
                            let sigmoid = 1.0 / (1.0 + exp(-z));
                            *dx = g * z * sigmoid;
                            *dz = g * x * sigmoid * (1.0 + z * (1.0 - sigmoid));
                        }
                    },
                )
            });
        Ok((CpuStorage::F32(out), Shape::from(2 * n)))
    });
}
