//! The depthwise causal convolution of zoology's `BaseConv` (see `model/conv.rs`) as one op.
//!
//! As tensor ops it is k shifted products and sums, and candle reduces each tap's gradient
//! over batch and time with a strided loop: the convolution's backward was a fifth of a
//! zoology-layout MQAR step on the CPU. Here the forward is one pass, the input's gradient one
//! more, and the kernel's and bias's gradients one pass of fixed-order partial sums, on the CPU
//! and (`kernels.cu`) on a CUDA GPU.
//! Replicas (kernel (R, k, D), bias (R, D), rows (R·B, T, D)) apply replica r's kernel to its
//! block of rows; a lone model is the case R = 1.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Shape, Tensor};
use rayon::prelude::*;

use super::fused::{slice, zeros};
use super::softmax::exp;
use crate::Result;

/// conv(u) + bias: y[t] = bias + Σⱼ kernel[j] ⊙ u[t − (k − 1) + j] (zero before the start), for
/// u (N, T, D) and kernel (k, D), bias (D), or with replicas kernel (R, k, D), bias (R, D).
pub fn causal_conv(u: &Tensor, kernel: &Tensor, bias: &Tensor) -> Result<Tensor> {
    let shape = Geometry::of(u, kernel)?;
    if super::fusable(u) && super::fusable(kernel) {
        return Ok(u.contiguous()?.apply_op3(
            &kernel.contiguous()?,
            &bias.contiguous()?,
            Conv(shape),
        )?);
    }
    causal_conv_composed(u, kernel, bias)
}

/// [`causal_conv`] from tensor ops, on any device: the reference.
pub fn causal_conv_composed(u: &Tensor, kernel: &Tensor, bias: &Tensor) -> Result<Tensor> {
    let Geometry {
        replicas, k, t, d, ..
    } = Geometry::of(u, kernel)?;
    let rows = u.dim(0)?;
    let (kernel, bias) = (
        kernel.reshape((replicas, k, d))?,
        bias.reshape((replicas, d))?,
    );
    let zeros = Tensor::zeros((rows, k - 1, d), u.dtype(), u.device())?;
    let padded = Tensor::cat(&[&zeros, u], 1)?;
    let mut conv =
        super::replicas::per_replica_composed(&u.zeros_like()?, &bias, super::Combine::Add)?;
    for j in 0..k {
        let tap = kernel.narrow(1, j, 1)?.squeeze(1)?; // (R, D)
        let shifted = padded.narrow(1, j, t)?;
        conv =
            (conv + super::replicas::per_replica_composed(&shifted, &tap, super::Combine::Mul)?)?;
    }
    Ok(conv)
}

/// silu(conv(u)) without a bias, its channels split into `heads` heads: u (N, T, H·W) →
/// (N, H, T, W), the layout a mechanism takes its q, k and v in (flash-linear-attention's
/// `ShortConvolution` with its activation, before DeltaNet's and Mamba-2's rules). Fused on the
/// CPU in f32: one pass forward, where the convolution, the SiLU and the copy into heads were
/// three passes and three allocations each way (18 ms of a 93 ms DeltaNet step at d 128, T 64);
/// the backward pass recomputes the convolution for SiLU's slope.
pub fn causal_conv_silu_heads(u: &Tensor, kernel: &Tensor, heads: usize) -> Result<Tensor> {
    let shape = Geometry::of(u, kernel)?;
    if super::cpu_f32(u) && super::cpu_f32(kernel) && shape.d.is_multiple_of(heads) {
        let op = ConvSiluHeads { shape, heads };
        return Ok(u.contiguous()?.apply_op2(&kernel.contiguous()?, op)?);
    }
    let bias = no_bias(kernel)?;
    into_heads(&super::silu(&causal_conv(u, kernel, &bias)?)?, heads)
}

/// [`causal_conv_silu_heads`] from tensor ops: the reference.
pub fn causal_conv_silu_heads_composed(
    u: &Tensor,
    kernel: &Tensor,
    heads: usize,
) -> Result<Tensor> {
    let conv = causal_conv_composed(u, kernel, &no_bias(kernel)?)?;
    into_heads(&conv.silu()?, heads)
}

/// Zeros shaped as a bias of `kernel`: (D), or (R, D) for replicas.
fn no_bias(kernel: &Tensor) -> Result<Tensor> {
    let taps = kernel.rank() - 2;
    Ok(kernel.narrow(taps, 0, 1)?.squeeze(taps)?.zeros_like()?)
}

/// y (N, T, H·W) as (N, H, T, W), contiguous.
fn into_heads(y: &Tensor, heads: usize) -> Result<Tensor> {
    let (n, t, d) = y.dims3()?;
    let heads = y.reshape((n, t, heads, d / heads))?;
    Ok(heads.transpose(1, 2)?.contiguous()?)
}

/// The sizes of a convolution: R replicas of B sequences of T steps of D channels, kernel k.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    replicas: usize,
    per_replica: usize,
    k: usize,
    t: usize,
    d: usize,
}

impl Geometry {
    fn of(u: &Tensor, kernel: &Tensor) -> Result<Self> {
        let (rows, t, d) = u.dims3()?;
        let (replicas, k) = match kernel.dims() {
            &[k, _] => (1, k),
            &[r, k, _] => (r, k),
            dims => {
                return Err(crate::Error::Internal(format!(
                    "a convolution kernel is (k, D) or (R, k, D), not {dims:?}"
                )));
            }
        };
        if k == 0 || replicas == 0 || rows % replicas != 0 {
            return Err(crate::Error::Internal(format!(
                "convolution of {rows} rows with {replicas} replicas of kernel size {k}"
            )));
        }
        Ok(Self {
            replicas,
            per_replica: rows / replicas,
            k,
            t,
            d,
        })
    }

    /// The replica of sequence `s`.
    fn replica(&self, s: usize) -> usize {
        s / self.per_replica
    }

    /// (replicas, sequences per replica, k, T, D), as the CUDA kernels take them.
    #[cfg(feature = "cuda")]
    fn sizes(&self) -> super::cuda::ConvShape {
        (self.replicas, self.per_replica, self.k, self.t, self.d)
    }
}

/// The forward pass: (u, kernel, bias) → y.
struct Conv(Geometry);

impl CustomOp3 for Conv {
    fn name(&self) -> &'static str {
        "attnlab-causal-conv"
    }

    cpu_fwd!(self, |s1, l1, s2, l2, s3, l3| {
        let Geometry { k, t, d, .. } = self.0;
        let (u, kernel, bias) = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
        let mut out = zeros(u.len());
        out.par_chunks_mut(t * d)
            .zip(u.par_chunks(t * d))
            .enumerate()
            .for_each(|(s, (y, u))| {
                let r = self.0.replica(s);
                let (kernel, bias) = (&kernel[r * k * d..][..k * d], &bias[r * d..][..d]);
                super::vectorised(
                    #[inline(always)]
                    || {
                        for (step, y) in y.chunks_mut(d).enumerate() {
                            y.copy_from_slice(bias);
                            add_taps(y, u, kernel, step);
                        }
                    },
                )
            });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    });

    cuda_fwd!(self, |s1, l1, s2, l2, s3, l3| {
        let y = super::cuda::causal_conv((s1, l1), (s2, l2), Some((s3, l3)), self.0.sizes())?;
        Ok((y, l1.shape().clone()))
    });

    fn bwd(
        &self,
        u: &Tensor,
        kernel: &Tensor,
        bias: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let du = grad.apply_op2_no_bwd(kernel, &InputGrad(self.0))?;
        let dkb = u
            .contiguous()?
            .apply_op2_no_bwd(&grad, &KernelGrad(self.0))?; // (R, k + 1, D)
        let k = self.0.k;
        let dk = dkb.narrow(1, 0, k)?.reshape(kernel.shape())?;
        let db = dkb.narrow(1, k, 1)?.reshape(bias.shape())?;
        Ok((Some(du), Some(dk), Some(db)))
    }
}

/// y += Σⱼ kernel[j] ⊙ u[step − (k − 1) + j] for one step of one sequence u (T, D), kernel
/// (k, D): the taps that fall before the start read zeros.
#[inline(always)]
fn add_taps(y: &mut [f32], u: &[f32], kernel: &[f32], step: usize) {
    let d = y.len();
    let k = kernel.len() / d;
    for j in (k - 1).saturating_sub(step)..k {
        multiply_add(y, &u[(step + j + 1 - k) * d..][..d], &kernel[j * d..][..d]);
    }
}

/// [`causal_conv_silu_heads`]'s fused op: (u, kernel) → (N, H, T, W).
struct ConvSiluHeads {
    shape: Geometry,
    heads: usize,
}

impl ConvSiluHeads {
    /// Each step's pre-activation a = conv(u)[step] of sequence `s` (T, D), with the step and
    /// the D channels of `a`, for `f` to use.
    #[inline(always)]
    fn each_step(&self, s: usize, u: &[f32], kernel: &[f32], mut f: impl FnMut(usize, &[f32])) {
        let Geometry { k, d, t, .. } = self.shape;
        let kernel = &kernel[self.shape.replica(s) * k * d..][..k * d];
        let mut a = vec![0f32; d];
        for step in 0..t {
            a.fill(0.0);
            add_taps(&mut a, u, kernel, step);
            f(step, &a);
        }
    }

    /// Each head of one step's channels `a` (H·W): its index and its W channels.
    #[inline(always)]
    fn heads_of<'a>(&self, a: &'a [f32]) -> impl Iterator<Item = (usize, &'a [f32])> {
        a.chunks_exact(self.shape.d / self.heads).enumerate()
    }
}

impl CustomOp2 for ConvSiluHeads {
    fn name(&self) -> &'static str {
        "attnlab-conv-silu-heads"
    }

    cpu_fwd!(self, |s1, l1, s2, l2| {
        let Geometry { t, d, .. } = self.shape;
        let (u, kernel) = (slice(s1, l1)?, slice(s2, l2)?);
        let w = d / self.heads;
        let mut out = zeros(u.len());
        out.par_chunks_mut(t * d)
            .zip(u.par_chunks(t * d))
            .enumerate()
            .for_each(|(s, (y, u))| {
                super::vectorised(
                    #[inline(always)]
                    || {
                        self.each_step(
                            s,
                            u,
                            kernel,
                            // Inlined into the vector instructions' context, as its caller.
                            #[inline(always)]
                            |step, a| {
                                for (head, a) in self.heads_of(a) {
                                    let y = &mut y[(head * t + step) * w..][..w];
                                    y.iter_mut()
                                        .zip(a)
                                        .for_each(|(y, a)| *y = a / (1.0 + exp(-a)));
                                }
                            },
                        )
                    },
                )
            });
        let (n, _, _) = l1.shape().dims3()?;
        Ok((CpuStorage::F32(out), Shape::from((n, self.heads, t, w))))
    });

    fn bwd(
        &self,
        u: &Tensor,
        kernel: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let (u, kernel) = (u.contiguous()?, kernel.contiguous()?);
        let da = grad.contiguous()?.apply_op3_no_bwd(
            &u,
            &kernel,
            &ConvSiluHeadsGrad {
                shape: self.shape,
                heads: self.heads,
            },
        )?;
        let du = da.apply_op2_no_bwd(&kernel, &InputGrad(self.shape))?;
        let dkb = u.apply_op2_no_bwd(&da, &KernelGrad(self.shape))?; // (R, k + 1, D)
        let dk = dkb.narrow(1, 0, self.shape.k)?.reshape(kernel.shape())?;
        Ok((Some(du), Some(dk)))
    }
}

/// ∂L/∂a (N, T, D) for the pre-activation a = conv(u), from the output's gradient g
/// (N, H, T, W): g moved back beside its channels, times silu′(a) = σ(a)(1 + a(1 − σ(a))).
struct ConvSiluHeadsGrad {
    shape: Geometry,
    heads: usize,
}

impl CustomOp3 for ConvSiluHeadsGrad {
    fn name(&self) -> &'static str {
        "attnlab-conv-silu-heads-grad"
    }

    cpu_fwd!(self, |s1, l1, s2, l2, s3, l3| {
        let Geometry { t, d, .. } = self.shape;
        let (g, u, kernel) = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
        let op = ConvSiluHeads {
            shape: self.shape,
            heads: self.heads,
        };
        let w = d / self.heads;
        let mut out = zeros(u.len());
        out.par_chunks_mut(t * d)
            .zip(u.par_chunks(t * d).zip(g.par_chunks(t * d)))
            .enumerate()
            .for_each(|(s, (da, (u, g)))| {
                super::vectorised(
                    #[inline(always)]
                    || {
                        op.each_step(
                            s,
                            u,
                            kernel,
                            #[inline(always)]
                            |step, a| {
                                let da = &mut da[step * d..][..d];
                                for ((head, a), da) in op.heads_of(a).zip(da.chunks_exact_mut(w)) {
                                    let g = &g[(head * t + step) * w..][..w];
                                    for ((da, a), g) in da.iter_mut().zip(a).zip(g) {
                                        let sigmoid = 1.0 / (1.0 + exp(-a));
                                        *da = g * sigmoid * (1.0 + a * (1.0 - sigmoid));
                                    }
                                }
                            },
                        )
                    },
                )
            });
        Ok((CpuStorage::F32(out), l2.shape().clone()))
    });
}

/// acc += a ⊙ b, channel by channel: the inner loop of the convolution and both its gradients
/// (inlined into their vector instructions' context: compiled alone, it was SSE).
#[inline(always)]
fn multiply_add(acc: &mut [f32], a: &[f32], b: &[f32]) {
    acc.iter_mut()
        .zip(a)
        .zip(b)
        .for_each(|((acc, a), b)| *acc += a * b);
}

/// ∂L/∂u from the output's gradient g: u[s] feeds y[s + (k − 1) − j] through tap j.
struct InputGrad(Geometry);

impl CustomOp2 for InputGrad {
    fn name(&self) -> &'static str {
        "attnlab-causal-conv-input-grad"
    }

    cpu_fwd!(self, |s1, l1, s2, l2| {
        let Geometry { k, t, d, .. } = self.0;
        let (g, kernel) = (slice(s1, l1)?, slice(s2, l2)?);
        let mut out = zeros(g.len());
        out.par_chunks_mut(t * d)
            .zip(g.par_chunks(t * d))
            .enumerate()
            .for_each(|(s, (du, g))| {
                let kernel = &kernel[self.0.replica(s) * k * d..][..k * d];
                super::vectorised(
                    #[inline(always)]
                    || {
                        for (step, du) in du.chunks_mut(d).enumerate() {
                            for j in 0..k {
                                let later = (step + k - 1).checked_sub(j).filter(|&o| o < t);
                                let Some(later) = later else {
                                    continue;
                                };
                                multiply_add(du, &g[later * d..][..d], &kernel[j * d..][..d]);
                            }
                        }
                    },
                )
            });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    });

    cuda_fwd!(self, |s1, l1, s2, l2| {
        let du = super::cuda::causal_conv((s1, l1), (s2, l2), None, self.0.sizes())?;
        Ok((du, l1.shape().clone()))
    });
}

/// ∂L/∂kernel and ∂L/∂bias, (R, k + 1, D): row j < k is Σ g[t] ⊙ u[t − (k − 1) + j] over the
/// replica's sequences and steps, row k is Σ g[t].
struct KernelGrad(Geometry);

/// Sequences per partial sum: fixed, so the sums (and a run) repeat whatever the threads do.
const SEQUENCES_PER_PARTIAL: usize = 8;

impl KernelGrad {
    /// The (k + 1, D) sums of one run of sequences.
    #[inline(always)]
    fn partial(&self, u: &[f32], g: &[f32]) -> Vec<f32> {
        let Geometry { k, t, d, .. } = self.0;
        let mut sums = vec![0f32; (k + 1) * d];
        for (u, g) in u.chunks(t * d).zip(g.chunks(t * d)) {
            for (step, g) in g.chunks(d).enumerate() {
                for j in (k - 1).saturating_sub(step)..k {
                    multiply_add(
                        &mut sums[j * d..][..d],
                        &u[(step + j + 1 - k) * d..][..d],
                        g,
                    );
                }
                let row = &mut sums[k * d..];
                row.iter_mut().zip(g).for_each(|(s, g)| *s += g);
            }
        }
        sums
    }
}

impl CustomOp2 for KernelGrad {
    fn name(&self) -> &'static str {
        "attnlab-causal-conv-kernel-grad"
    }

    cpu_fwd!(self, |s1, l1, s2, l2| {
        let Geometry {
            replicas,
            per_replica,
            k,
            t,
            d,
        } = self.0;
        let (u, g) = (slice(s1, l1)?, slice(s2, l2)?);
        let block = per_replica * t * d;
        let run = SEQUENCES_PER_PARTIAL * t * d;
        let mut out = Vec::with_capacity(replicas * (k + 1) * d);
        for (u, g) in u.chunks(block).zip(g.chunks(block)) {
            let partials: Vec<Vec<f32>> = u
                .par_chunks(run)
                .zip(g.par_chunks(run))
                .map(|(u, g)| {
                    super::vectorised(
                        #[inline(always)]
                        || self.partial(u, g),
                    )
                })
                .collect();
            out.extend(super::fused::sum_in_order(partials, (k + 1) * d));
        }
        Ok((CpuStorage::F32(out), Shape::from((replicas, k + 1, d))))
    });

    cuda_fwd!(self, |s1, l1, s2, l2| {
        let Geometry { replicas, k, d, .. } = self.0;
        let sums = super::cuda::causal_conv_kernel_grad(
            (s1, l1),
            (s2, l2),
            self.0.sizes(),
            SEQUENCES_PER_PARTIAL,
        )?;
        Ok((sums, Shape::from((replicas, k + 1, d))))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{max_diff, value_and_grads};
    use candle_core::Var;

    fn random(shape: &[usize], seed: u64) -> Tensor {
        crate::ops::testing::random(shape, seed, "conv")
    }

    /// Value and both gradients of the fused convolution, SiLU and split into heads equal
    /// the tensor ops', alone and with two replicas.
    #[test]
    fn the_fused_convolution_into_heads_matches_the_tensor_ops() {
        for kernel_shape in [vec![4, 6], vec![2, 4, 6]] {
            let u = Var::from_tensor(&random(&[4, 5, 6], 5)).unwrap();
            let w = Var::from_tensor(&random(&kernel_shape, 6)).unwrap();
            let weights = random(&[4, 3, 5, 2], 7);
            let run = |f: fn(&Tensor, &Tensor, usize) -> Result<Tensor>| {
                let y = f(u.as_tensor(), w.as_tensor(), 3).unwrap();
                assert_eq!(y.dims(), &[4, 3, 5, 2]);
                value_and_grads(&y, &weights, &[&u, &w])
            };
            let fused = run(causal_conv_silu_heads);
            let composed = run(causal_conv_silu_heads_composed);
            for (a, b) in fused.iter().zip(&composed) {
                let diff = a.iter().zip(b).map(|(a, b)| (a - b).abs());
                assert!(diff.fold(0f32, f32::max) < 1e-5, "{kernel_shape:?}");
            }
        }
    }

    /// Value and the three gradients of the fused op equal the tensor ops', alone and with
    /// three replicas, for kernels shorter and longer than the sequence.
    #[test]
    fn the_fused_convolution_matches_the_tensor_ops() {
        for (kernel_shape, bias_shape) in [
            (vec![3, 5], vec![5]),
            (vec![3, 3, 5], vec![3, 5]),
            (vec![6, 5], vec![5]),
        ] {
            let u = Var::from_tensor(&random(&[6, 4, 5], 1)).unwrap();
            let w = Var::from_tensor(&random(&kernel_shape, 2)).unwrap();
            let b = Var::from_tensor(&random(&bias_shape, 3)).unwrap();
            let weights = random(&[6, 4, 5], 4);
            let run = |f: &dyn Fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>| {
                let y = f(u.as_tensor(), w.as_tensor(), b.as_tensor()).unwrap();
                let grads = (&y * &weights)
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .backward()
                    .unwrap();
                let g = |v: &Var| grads.get(v.as_tensor()).unwrap().clone();
                [y, g(&u), g(&w), g(&b)]
            };
            let fused = run(&causal_conv);
            let composed = run(&causal_conv_composed);
            for (a, b) in fused.iter().zip(&composed) {
                assert!(max_diff(a, b) < 1e-5, "{kernel_shape:?}");
            }
        }
    }
}
