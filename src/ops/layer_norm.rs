//! Row normalisation (LayerNorm's standardisation, RMSNorm's scaling, the L2 normalisation of
//! DeltaNet's q and k) and its affine form (one model's γ and β, or a row of them per
//! replica), one pass forward and one backward.

use candle_core::{CpuStorage, CustomOp1, CustomOp3, Shape, Tensor};
use rayon::prelude::*;

use super::fused::{last_dim, slice, zeros};
use super::softmax::{dot_lanes, sum_lanes};

/// How a row x of n values is normalised: ŷ = (x − shift) / √(m + eps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowNorm {
    /// shift the mean, m the variance: LayerNorm's standardisation.
    Standard,
    /// No shift, m = mean(x²): RMSNorm's.
    Rms,
    /// No shift, m = Σx²: x/‖x‖, flash-linear-attention's `l2norm` of DeltaNet's q and k.
    L2,
}

impl RowNorm {
    /// A row's shift and 1/√(m + eps), summed in partial sums that vectorise.
    #[inline(always)]
    fn statistics(self, row: &[f32], eps: f32) -> (f32, f32) {
        let n = row.len() as f32;
        let shift = match self {
            Self::Standard => sum_lanes(row, |x| x) / n,
            Self::Rms | Self::L2 => 0.0,
        };
        let squares = sum_lanes(row, |x| (x - shift) * (x - shift));
        let m = match self {
            Self::Standard | Self::Rms => squares / n,
            Self::L2 => squares,
        };
        (shift, 1.0 / (m + eps).sqrt())
    }

    /// dx from dŷ and ŷ (`dx` holds ŷ on entry), `inv` the row's 1/√(m + eps):
    /// dx = inv (dŷ − mean(dŷ) − ŷ (dŷ·ŷ)/n) standardised, without the mean for RMS, and
    /// with (dŷ·ŷ) undivided for L2 (whose m is a sum, not a mean).
    #[inline(always)]
    fn input_grad(self, dx: &mut [f32], d_y_hat: &[f32], inv: f32) {
        let n = dx.len() as f32;
        let mean = match self {
            Self::Standard => sum_lanes(d_y_hat, |g| g) / n,
            Self::Rms | Self::L2 => 0.0,
        };
        let along = match self {
            Self::Standard | Self::Rms => dot_lanes(d_y_hat, dx) / n,
            Self::L2 => dot_lanes(d_y_hat, dx),
        };
        for (dx, g) in dx.iter_mut().zip(d_y_hat) {
            *dx = inv * (g - mean - *dx * along);
        }
    }

    /// Whether the CUDA kernels run it (LayerNorm's only); elsewhere a GPU composes it.
    pub fn on_cuda(self) -> bool {
        self == Self::Standard
    }
}

/// A row's ŷ into `out`.
#[inline(always)]
fn normalise_row(out: &mut [f32], x: &[f32], norm: RowNorm, eps: f32) -> f32 {
    let (shift, inv) = norm.statistics(x, eps);
    for (o, x) in out.iter_mut().zip(x) {
        *o = (x - shift) * inv;
    }
    inv
}

/// Refuses a norm the CUDA kernels lack (callers compose those on a GPU).
#[cfg(feature = "cuda")]
fn cuda_norm(norm: RowNorm) -> candle_core::Result<()> {
    match norm.on_cuda() {
        true => Ok(()),
        false => candle_core::bail!("no CUDA kernel for the {norm:?} row norm"),
    }
}

/// ŷ of each row of the last dimension ([`RowNorm`]).
pub struct Normalise {
    pub norm: RowNorm,
    pub eps: f32,
}

impl CustomOp1 for Normalise {
    fn name(&self) -> &'static str {
        "attnlab-normalise"
    }

    cpu_fwd!(self, |storage, layout| {
        let x = slice(storage, layout)?;
        let d = last_dim(layout);
        let mut out = zeros(x.len());
        out.par_chunks_mut(d * ROWS_PER_TASK)
            .zip(x.par_chunks(d * ROWS_PER_TASK))
            .for_each(|(out, x)| {
                super::vectorised(
                    #[inline(always)]
                    || {
                        for (out, x) in out.chunks_mut(d).zip(x.chunks(d)) {
                            normalise_row(out, x, self.norm, self.eps);
                        }
                    },
                )
            });
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    });

    cuda_fwd!(self, |storage, layout| {
        cuda_norm(self.norm)?;
        super::cuda::standardise(storage, layout, self.eps)
    });

    fn bwd(
        &self,
        arg: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        let grad = grad_res.contiguous()?.apply_op3_no_bwd(
            &arg.contiguous()?,
            &res.contiguous()?,
            &NormaliseGrad {
                norm: self.norm,
                eps: self.eps,
            },
        )?;
        Ok(Some(grad))
    }
}

/// [`Normalise`]'s gradient ([`RowNorm::input_grad`]), inputs (dy, x, ŷ).
struct NormaliseGrad {
    norm: RowNorm,
    eps: f32,
}

impl CustomOp3 for NormaliseGrad {
    fn name(&self) -> &'static str {
        "attnlab-normalise-grad"
    }

    cpu_fwd!(self, |s1, l1, s2, l2, s3, l3| {
        let (dy, x, y) = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
        let d = last_dim(l1);
        let mut out = zeros(dy.len());
        let task = d * ROWS_PER_TASK;
        out.par_chunks_mut(task)
            .zip(
                dy.par_chunks(task)
                    .zip(x.par_chunks(task).zip(y.par_chunks(task))),
            )
            .for_each(|(out, (dy, (x, y)))| {
                super::vectorised(
                    #[inline(always)]
                    || {
                        let rows = out.chunks_mut(d).zip(dy.chunks(d));
                        for ((dx, dy), (x, y)) in rows.zip(x.chunks(d).zip(y.chunks(d))) {
                            let (_, inv) = self.norm.statistics(x, self.eps);
                            dx.copy_from_slice(y);
                            self.norm.input_grad(dx, dy, inv);
                        }
                    },
                )
            });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    });

    cuda_fwd!(self, |s1, l1, s2, l2, s3, l3| {
        cuda_norm(self.norm)?;
        super::cuda::standardise_grad([(s1, l1), (s2, l2), (s3, l3)], self.eps)
    });
}

/// γ ⊙ ŷ + β over the last dimension ([`RowNorm`]: LayerNorm, or RMSNorm with β = 0), inputs
/// (x, γ, β). γ and β are (d), or (R, d) for R replicas of a model: x's rows are R blocks,
/// block r normalised with row r. One pass each way on the CPU, where standardising and then
/// applying γᵣ and βᵣ as ops of their own took three passes forward and nine backward: a fifth
/// of a replica group's step at d 32.
pub struct AffineNorm {
    pub norm: RowNorm,
    pub eps: f32,
}

/// Rows a task of [`AffineNorm`] or [`Normalise`] handles at once: one vector-dispatch per
/// task, not per row.
const ROWS_PER_TASK: usize = 64;

/// x's rows per replica for γ of `params` elements (one replica: every row), checked.
fn rows_per_replica(x: usize, d: usize, params: usize) -> candle_core::Result<usize> {
    let (rows, replicas) = (x / d, params / d);
    if replicas == 0 || !params.is_multiple_of(d) || !rows.is_multiple_of(replicas) {
        candle_core::bail!("layer norm: γ of {params} does not fit {rows} rows of {d}");
    }
    Ok(rows / replicas)
}

impl CustomOp3 for AffineNorm {
    fn name(&self) -> &'static str {
        "attnlab-layer-norm"
    }

    cpu_fwd!(self, |s1, l1, s2, l2, s3, l3| {
        let (x, gamma, beta) = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
        let d = last_dim(l1);
        let per_replica = rows_per_replica(x.len(), d, gamma.len())?;
        let mut out = zeros(x.len());
        out.par_chunks_mut(d * ROWS_PER_TASK)
            .zip(x.par_chunks(d * ROWS_PER_TASK))
            .enumerate()
            .for_each(|(task, (out, x))| {
                super::vectorised(
                    #[inline(always)]
                    || {
                        let rows = out.chunks_mut(d).zip(x.chunks(d));
                        for (i, (out, x)) in rows.enumerate() {
                            let r = (task * ROWS_PER_TASK + i) / per_replica;
                            let params = (&gamma[r * d..][..d], &beta[r * d..][..d]);
                            layer_norm_row(out, x, params, (self.norm, self.eps));
                        }
                    },
                )
            });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    });

    cuda_fwd!(self, |s1, l1, s2, l2, s3, l3| {
        cuda_norm(self.norm)?;
        rows_per_replica(
            l1.shape().elem_count(),
            last_dim(l1),
            l2.shape().elem_count(),
        )?;
        super::cuda::layer_norm([(s1, l1), (s2, l2), (s3, l3)], self.eps)
    });

    fn bwd(
        &self,
        x: &Tensor,
        gamma: &Tensor,
        beta: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let x = x.contiguous()?;
        let grad = grad.contiguous()?;
        let op = AffineNormGrad {
            norm: self.norm,
            eps: self.eps,
        };
        let grads = grad.apply_op3_no_bwd(&x, &gamma.contiguous()?, &op)?;
        let (n, p) = (x.elem_count(), gamma.elem_count());
        let dx = grads.narrow(0, 0, n)?.reshape(x.shape())?;
        let d_gamma = grads.narrow(0, n, p)?.reshape(gamma.shape())?;
        let d_beta = grads.narrow(0, n + p, p)?.reshape(beta.shape())?;
        Ok((Some(dx), Some(d_gamma), Some(d_beta)))
    }
}

/// One row of [`AffineNorm`]: `out` = γ ⊙ ŷ + β.
#[inline(always)]
fn layer_norm_row(
    out: &mut [f32],
    x: &[f32],
    (gamma, beta): (&[f32], &[f32]),
    (norm, eps): (RowNorm, f32),
) {
    let (shift, inv) = norm.statistics(x, eps);
    for (((o, x), g), b) in out.iter_mut().zip(x).zip(gamma).zip(beta) {
        *o = (x - shift) * inv * g + b;
    }
}

/// [`AffineNorm`]'s gradients on the CPU in one pass, inputs (dy, x, γ) → [dx | dγ | dβ] flat:
/// dx from dŷ = dy ⊙ γ ([`RowNorm::input_grad`]); dγ = Σ dy ⊙ ŷ and dβ = Σ dy over each
/// replica's rows.
struct AffineNormGrad {
    norm: RowNorm,
    eps: f32,
}

impl AffineNormGrad {
    /// Gradients of one task's rows (all of one replica, with γ its row): dx written, the
    /// task's share of dγ and dβ returned side by side.
    #[inline(always)]
    fn rows(&self, dx: &mut [f32], dy: &[f32], x: &[f32], gamma: &[f32]) -> Vec<f32> {
        let d = gamma.len();
        let mut sums = vec![0f32; 2 * d];
        let (d_gamma, d_beta) = sums.split_at_mut(d);
        let mut d_y_hat = vec![0f32; d];
        let rows = dx.chunks_mut(d).zip(dy.chunks(d)).zip(x.chunks(d));
        for ((dx, dy), x) in rows {
            // dx holds ŷ until the last step.
            let inv = normalise_row(dx, x, self.norm, self.eps);
            for (((dg, db), y), dy) in d_gamma.iter_mut().zip(&mut *d_beta).zip(&*dx).zip(dy) {
                *dg += dy * y;
                *db += dy;
            }
            for ((g, dy), gamma) in d_y_hat.iter_mut().zip(dy).zip(gamma) {
                *g = dy * gamma;
            }
            self.norm.input_grad(dx, &d_y_hat, inv);
        }
        sums
    }
}

impl CustomOp3 for AffineNormGrad {
    fn name(&self) -> &'static str {
        "attnlab-layer-norm-grad"
    }

    cpu_fwd!(self, |s1, l1, s2, l2, s3, l3| {
        let (dy, x, gamma) = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
        let d = last_dim(l1);
        let per_replica = rows_per_replica(x.len(), d, gamma.len())? * d;
        let mut grads = zeros(dy.len() + 2 * gamma.len());
        let (dx, params) = grads.split_at_mut(dy.len());
        let (d_gamma, d_beta) = params.split_at_mut(gamma.len());
        let task = d * ROWS_PER_TASK;
        let replicas = dx.chunks_mut(per_replica).zip(dy.chunks(per_replica));
        for (r, (dx, dy)) in replicas.enumerate() {
            let (x, gamma) = (&x[r * per_replica..][..per_replica], &gamma[r * d..][..d]);
            let sums = dx
                .par_chunks_mut(task)
                .zip(dy.par_chunks(task).zip(x.par_chunks(task)))
                .map(|(dx, (dy, x))| {
                    super::vectorised(
                        #[inline(always)]
                        || self.rows(dx, dy, x, gamma),
                    )
                })
                .collect();
            let sums = super::fused::sum_in_order(sums, 2 * d);
            d_gamma[r * d..][..d].copy_from_slice(&sums[..d]);
            d_beta[r * d..][..d].copy_from_slice(&sums[d..]);
        }
        Ok((
            CpuStorage::F32(grads),
            Shape::from(dy.len() + 2 * gamma.len()),
        ))
    });

    cuda_fwd!(self, |s1, l1, s2, l2, s3, l3| {
        cuda_norm(self.norm)?;
        rows_per_replica(
            l2.shape().elem_count(),
            last_dim(l2),
            l3.shape().elem_count(),
        )?;
        super::cuda::layer_norm_grad([(s1, l1), (s2, l2), (s3, l3)], self.eps)
    });
}
