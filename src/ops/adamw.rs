//! AdamW's update in place, and the squared norms of the gradients.
//!
//! With tensor ops an update takes twelve element-wise passes and as many new buffers per
//! parameter (twelve kernel launches each on a GPU). In place it is one pass over the moments
//! [m; v], kept side by side in one (2·n) buffer, and one over the parameter, allocating
//! nothing; on a CUDA GPU one launch updates every parameter of a step (a launch per parameter
//! was 60 of the reference step's 348 kernels), and one more sums every gradient's squares.
//! [`adamw_step_composed`] is the tensor-op reference the tests compare with.

use candle_core::{CpuStorage, CustomOp1, InplaceOp2, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::fused::slice;
use crate::Result;

/// One AdamW step's constants (PyTorch's rule): g' = grad_scale · g;
/// m ← β₁m + (1 − β₁)g'; v ← β₂v + (1 − β₂)g'²; p ← p·decay − step_size · m / (√v · v_correction + eps).
#[derive(Clone, Copy, Debug)]
pub struct AdamStep {
    pub beta1: f32,
    pub beta2: f32,
    pub grad_scale: f32,
    /// 1 − lr · weight_decay
    pub decay: f32,
    /// lr / (1 − β₁ᵗ)
    pub step_size: f32,
    /// 1 / √(1 − β₂ᵗ)
    pub v_correction: f32,
    pub eps: f32,
}

/// One parameter's part of an AdamW step: `param` (n entries) and `moments` ([m; v], 2n f32
/// entries) are updated in place from `grad` by `step`.
pub struct ParamUpdate<'a> {
    pub param: Tensor,
    pub moments: &'a Tensor,
    pub grad: Tensor,
    pub step: AdamStep,
}

/// Updates `param` (n entries) and `moments` ([m; v], 2n f32 entries) in place from the
/// gradient `grad`, with the fused kernels (f32 on the CPU or a CUDA GPU; see
/// [`super::fusable`]). The parameter and moments must be contiguous.
pub fn adamw_in_place(
    param: &Tensor,
    moments: &Tensor,
    grad: &Tensor,
    step: &AdamStep,
) -> Result<()> {
    adamw_all_in_place(&[ParamUpdate {
        param: param.clone(),
        moments,
        grad: grad.clone(),
        step: *step,
    }])
}

/// [`adamw_in_place`] of several parameters: one kernel launch for all of them on a CUDA GPU,
/// side by side on the CPU.
pub fn adamw_all_in_place(updates: &[ParamUpdate]) -> Result<()> {
    #[cfg(feature = "cuda")]
    if updates.iter().all(|u| u.param.device().is_cuda()) {
        let grads = updates
            .iter()
            .map(|u| u.grad.contiguous())
            .collect::<candle_core::Result<Vec<_>>>()?;
        let parts: Vec<_> = updates
            .iter()
            .zip(&grads)
            .map(|(u, g)| (&u.param, u.moments, g, u.step))
            .collect();
        return Ok(super::cuda::adam_all(&parts)?);
    }
    updates.par_iter().try_for_each(|u| {
        let grad = u.grad.contiguous()?;
        u.moments.inplace_op2(&grad, &Moments(u.step))?;
        u.param.inplace_op2(u.moments, &Param(u.step))?;
        Ok(())
    })
}

/// The same step from tensor ops, on any device and dtype: returns (new param, new moments).
pub fn adamw_step_composed(
    param: &Tensor,
    moments: &Tensor,
    grad: &Tensor,
    step: &AdamStep,
) -> Result<(Tensor, Tensor)> {
    let n = param.elem_count();
    let g = (grad.flatten_all()? * f64::from(step.grad_scale))?;
    let (m, v) = (moments.narrow(0, 0, n)?, moments.narrow(0, n, n)?);
    let (b1, b2) = (f64::from(step.beta1), f64::from(step.beta2));
    let m = ((m * b1)? + (&g * (1.0 - b1))?)?;
    let v = ((v * b2)? + (g.sqr()? * (1.0 - b2))?)?;
    let denom = ((v.sqrt()? * f64::from(step.v_correction))? + f64::from(step.eps))?;
    let update = ((&m / denom)? * f64::from(step.step_size))?;
    let p = ((param.flatten_all()? * f64::from(step.decay))? - update)?;
    Ok((p.reshape(param.shape())?, Tensor::cat(&[m, v], 0)?))
}

/// Σ x² of each tensor, read to the host in one copy: the gradient norms without a copy per
/// parameter. On a CUDA GPU one launch sums them all, each block a fixed chunk of one tensor,
/// and the host adds the chunks in order, so the sums do not depend on scheduling.
pub fn sum_squares_all(xs: &[Tensor]) -> Result<Vec<f64>> {
    #[cfg(feature = "cuda")]
    if !xs.is_empty() && xs.iter().all(|x| super::fusable(x) && x.device().is_cuda()) {
        let xs = xs
            .iter()
            .map(|x| x.contiguous())
            .collect::<candle_core::Result<Vec<_>>>()?;
        return Ok(super::cuda::sum_squares_all(&xs)?);
    }
    if xs.is_empty() {
        return Ok(Vec::new());
    }
    let sums = xs.iter().map(sum_squares).collect::<Result<Vec<_>>>()?;
    let sums = Tensor::stack(&sums, 0)?.to_dtype(candle_core::DType::F64)?;
    Ok(sums.to_vec1::<f64>()?)
}

/// Σ x² of a tensor as a scalar tensor on its device.
fn sum_squares(x: &Tensor) -> Result<Tensor> {
    if super::fusable(x) && x.device().is_cpu() {
        return Ok(x.contiguous()?.apply_op1_no_bwd(&SumSquares)?);
    }
    Ok(x.sqr()?.sum_all()?)
}

/// The mutable contiguous f32 data of an in-place op's destination.
fn slice_mut<'a>(
    storage: &'a mut CpuStorage,
    layout: &Layout,
) -> candle_core::Result<&'a mut [f32]> {
    let CpuStorage::F32(data) = storage else {
        candle_core::bail!("AdamW's fused update takes f32 tensors");
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("AdamW's fused update takes contiguous tensors");
    };
    Ok(&mut data[start..end])
}

/// Elements per parallel task (a task per parameter entry would cost more than the update).
const CHUNK: usize = 4096;

/// Updates [m; v] in place from g.
struct Moments(AdamStep);

impl InplaceOp2 for Moments {
    fn name(&self) -> &'static str {
        "attnlab-adamw-moments"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dst_l: &Layout,
        g: &CpuStorage,
        gl: &Layout,
    ) -> candle_core::Result<()> {
        let g = slice(g, gl)?;
        let mv = slice_mut(dst, dst_l)?;
        if mv.len() != 2 * g.len() {
            candle_core::bail!(
                "AdamW moments hold {} entries for {} gradients",
                mv.len(),
                g.len()
            );
        }
        let AdamStep {
            beta1,
            beta2,
            grad_scale,
            ..
        } = self.0;
        let (m, v) = mv.split_at_mut(g.len());
        m.par_chunks_mut(CHUNK)
            .zip(v.par_chunks_mut(CHUNK))
            .zip(g.par_chunks(CHUNK))
            .for_each(|((m, v), g)| {
                for ((m, v), g) in m.iter_mut().zip(v).zip(g) {
                    let g = g * grad_scale;
                    *m = beta1 * *m + (1.0 - beta1) * g;
                    *v = beta2 * *v + (1.0 - beta2) * g * g;
                }
            });
        Ok(())
    }
}

/// Updates the parameter in place from [m; v].
struct Param(AdamStep);

impl InplaceOp2 for Param {
    fn name(&self) -> &'static str {
        "attnlab-adamw-param"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dst_l: &Layout,
        mv: &CpuStorage,
        mvl: &Layout,
    ) -> candle_core::Result<()> {
        let mv = slice(mv, mvl)?;
        let p = slice_mut(dst, dst_l)?;
        if mv.len() != 2 * p.len() {
            candle_core::bail!(
                "AdamW moments hold {} entries for {} parameters",
                mv.len(),
                p.len()
            );
        }
        let s = self.0;
        let (m, v) = mv.split_at(p.len());
        p.par_chunks_mut(CHUNK)
            .zip(m.par_chunks(CHUNK).zip(v.par_chunks(CHUNK)))
            .for_each(|(p, (m, v))| {
                for ((p, m), v) in p.iter_mut().zip(m).zip(v) {
                    *p = *p * s.decay - s.step_size * m / (v.sqrt() * s.v_correction + s.eps);
                }
            });
        Ok(())
    }
}

struct SumSquares;

impl CustomOp1 for SumSquares {
    fn name(&self) -> &'static str {
        "attnlab-sum-squares"
    }

    cpu_fwd!(self, |storage, layout| {
        let x = slice(storage, layout)?;
        let sum: f32 = x
            .par_chunks(CHUNK)
            .map(|c| c.iter().map(|v| v * v).sum::<f32>())
            .collect::<Vec<_>>()
            .iter()
            .sum();
        Ok((CpuStorage::F32(vec![sum]), Shape::from(())))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    fn random(n: usize, seed: u64) -> Tensor {
        let data = crate::rng::normal_vec(&mut crate::rng::stream(seed, "adamw"), n, 1.0);
        Tensor::from_vec(data, n, &Device::Cpu).unwrap()
    }

    #[test]
    fn the_in_place_step_matches_the_tensor_ops_over_three_steps() {
        let step = |t: i32| AdamStep {
            beta1: 0.9,
            beta2: 0.999,
            grad_scale: 0.5,
            decay: 1.0 - 1e-2 * 0.1,
            step_size: 1e-2 / (1.0 - 0.9f32.powi(t)),
            v_correction: 1.0 / (1.0 - 0.999f32.powi(t)).sqrt(),
            eps: 1e-8,
        };
        // The in-place tensors are copies, so the reference keeps its own.
        let (param, moments) = (
            random(5000, 1).copy().unwrap(),
            Tensor::zeros(10_000, DType::F32, &Device::Cpu).unwrap(),
        );
        let (mut p_ref, mut mv_ref) = (param.copy().unwrap(), moments.copy().unwrap());
        for t in 1..=3 {
            let g = random(5000, 10 + t as u64);
            adamw_in_place(&param, &moments, &g, &step(t)).unwrap();
            (p_ref, mv_ref) = adamw_step_composed(&p_ref, &mv_ref, &g, &step(t)).unwrap();
        }
        for (a, b) in [(&param, &p_ref), (&moments, &mv_ref)] {
            let diff = (a - b).unwrap().abs().unwrap().max_all().unwrap();
            assert!(diff.to_scalar::<f32>().unwrap() < 1e-6);
        }
    }

    #[test]
    fn moments_of_the_wrong_size_are_an_error() {
        let (param, moments) = (
            random(4, 1),
            Tensor::zeros(6, DType::F32, &Device::Cpu).unwrap(),
        );
        let step = AdamStep {
            beta1: 0.9,
            beta2: 0.999,
            grad_scale: 1.0,
            decay: 1.0,
            step_size: 1.0,
            v_correction: 1.0,
            eps: 1e-8,
        };
        assert!(adamw_in_place(&param, &moments, &random(4, 2), &step).is_err());
    }

    #[test]
    fn sum_squares_matches_the_tensor_ops() {
        let x = random(10_000, 3);
        let fused = sum_squares(&x).unwrap().to_scalar::<f32>().unwrap();
        let composed = x
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(
            (fused - composed).abs() < 1e-3 * composed,
            "{fused} vs {composed}"
        );
    }
}
