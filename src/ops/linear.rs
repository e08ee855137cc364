//! y = x Wᵀ + b as one autograd node (f32, on the CPU or a CUDA GPU), optionally split into
//! attention heads.
//!
//! Built from candle ops, a linear layer is four nodes (transpose, reshape, matmul, bias add);
//! candle's backward zero-fills and adds a full gradient for each, copies the bias gradient out
//! to sum it, and accumulates W's gradient through a transposed (strided) view. Fused, the
//! forward writes the bias and the product into one buffer, and the backward is two matrix
//! products and one parallel column sum, each W-shaped result already in W's layout.
//! Split into heads, the output is (B, H, T, D) itself rather than a reshaped and transposed
//! view, which would be two more nodes per projection (the second summed through strides).

use candle_core::{CpuStorage, CustomOp1, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::fused::{column_sums, last_dim, slice};
use super::gemm::{MatRef, gemm};
use super::matmul::product;

/// (x, W, b) → x Wᵀ + b for x (…, in), W (out, in), b (out). With `heads`, x is (B, T, in)
/// and the result (B, heads, T, out / heads), contiguous.
pub struct LinearOp {
    pub heads: Option<usize>,
}

/// x's shape with the last dimension replaced by `out`.
fn with_last(shape: &Shape, out: usize) -> Shape {
    let mut dims = shape.dims().to_vec();
    if let Some(last) = dims.last_mut() {
        *last = out;
    }
    Shape::from(dims)
}

/// A contiguous (a, b, c, d) array with its middle axes swapped: (a, c, b, d), on all threads.
/// (B, T, H, D) → (B, H, T, D) splits heads; the same call on (B, H, T, D) merges them.
fn swap_middle_axes(data: &[f32], (a, b, c, d): (usize, usize, usize, usize)) -> Vec<f32> {
    let mut out = super::fused::zeros(a * b * c * d);
    if d == 0 {
        return out;
    }
    // Each output row (i, k, j) of d values is input row (i, j, k).
    out.par_chunks_mut(b * d)
        .enumerate()
        .for_each(|(ik, rows)| {
            let (i, k) = (ik / c, ik % c);
            for (j, row) in rows.chunks_mut(d).enumerate() {
                let src = ((i * b + j) * c + k) * d;
                row.copy_from_slice(&data[src..src + d]);
            }
        });
    out
}

/// [`swap_middle_axes`] of a rank-4 tensor; its gradient swaps back.
struct SwapMiddleAxes;

/// Heads' outputs (B, H, T, D) → (B, T, H·D) as one node with a contiguous result: where a
/// transposed view would be copied by candle's strided copy, forward and backward.
pub(super) fn merge_heads(y: &Tensor) -> candle_core::Result<Tensor> {
    let (b, h, t, d) = y.dims4()?;
    y.contiguous()?
        .apply_op1(SwapMiddleAxes)?
        .reshape((b, t, h * d))
}

impl CustomOp1 for SwapMiddleAxes {
    fn name(&self) -> &'static str {
        "attnlab-swap-middle-axes"
    }

    cpu_fwd!(self, |storage, layout| {
        let (a, b, c, d) = layout.shape().dims4()?;
        let out = swap_middle_axes(slice(storage, layout)?, (a, b, c, d));
        Ok((CpuStorage::F32(out), Shape::from((a, c, b, d))))
    });

    cuda_fwd!(self, |storage, layout| {
        let (a, b, c, d) = layout.shape().dims4()?;
        let out = super::cuda::swap_middle_axes((storage, layout), None, (a, b, c, d))?;
        Ok((out, Shape::from((a, c, b, d))))
    });

    fn bwd(
        &self,
        _arg: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(grad.contiguous()?.apply_op1_no_bwd(self)?))
    }
}

impl LinearOp {
    /// (rows, out, in) of x Wᵀ + b, and the output's shape, or why the operands do not fit.
    fn sizes(&self, x: &Layout, w: &Layout, b: &Layout) -> candle_core::Result<(usize, Shape)> {
        let (out_dim, in_dim) = w.shape().dims2()?;
        if last_dim(x) != in_dim || b.shape().elem_count() != out_dim {
            candle_core::bail!(
                "linear: x {:?}, W {:?}, b {:?} do not fit",
                x.dims(),
                w.dims(),
                b.dims()
            );
        }
        let rows = x.shape().elem_count() / in_dim.max(1);
        let shape = match self.heads {
            None => with_last(x.shape(), out_dim),
            Some(heads) => {
                let (batch, t, _) = x.shape().dims3()?;
                if heads == 0 || out_dim % heads != 0 {
                    candle_core::bail!("linear: {out_dim} outputs do not split into {heads} heads");
                }
                Shape::from((batch, heads, t, out_dim / heads))
            }
        };
        Ok((rows, shape))
    }
}

impl CustomOp3 for LinearOp {
    fn name(&self) -> &'static str {
        "attnlab-linear"
    }

    cpu_fwd!(self, |s1, l1, s2, l2, s3, l3| {
        let (rows, shape) = self.sizes(l1, l2, l3)?;
        let (x, w, b) = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
        let (out_dim, in_dim) = l2.shape().dims2()?;
        let mut y = b.repeat(rows); // the bias in every row, then += x Wᵀ
        gemm(
            &mut y,
            MatRef::row_major(x, rows, in_dim),
            MatRef::row_major(w, out_dim, in_dim).t(),
            true,
        );
        let y = match shape.dims() {
            &[batch, heads, t, width] if self.heads.is_some() => {
                swap_middle_axes(&y, (batch, t, heads, width))
            }
            _ => y,
        };
        Ok((CpuStorage::F32(y), shape))
    });

    // The product by cuBLAS, then the bias added (and the heads split) in one pass.
    cuda_fwd!(self, |s1, l1, s2, l2, s3, l3| {
        let (rows, shape) = self.sizes(l1, l2, l3)?;
        let y = super::cuda::linear((s1, l1), (s2, l2), (s3, l3), rows, &shape, self.heads)?;
        Ok((y, shape))
    });

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (out_dim, in_dim) = w.dims2()?;
        let rows = x.elem_count() / in_dim;
        let dy = match self.heads {
            None => grad.contiguous()?,
            Some(_) => grad.contiguous()?.apply_op1_no_bwd(&SwapMiddleAxes)?,
        };
        let dy = dy.reshape((rows, out_dim))?;
        let x2 = x.detach().contiguous()?.reshape((rows, in_dim))?;
        // attnlab's products on the CPU, candle's (cuBLAS) on a GPU.
        let product = |a: &Tensor, b: &Tensor| match a.device() {
            candle_core::Device::Cpu => product(a, b),
            _ => a.matmul(b),
        };
        let dx = product(&dy, &w.detach())?.reshape(x.shape())?;
        let dw = product(&dy.t()?, &x2)?; // (out, in), W's own layout
        let db = column_sums(&dy)?;
        Ok((Some(dx), Some(dw), Some(db)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Merged heads equal candle's transposed view, and so does their gradient.
    #[test]
    fn merged_heads_match_a_transpose_in_value_and_gradient() {
        let data = crate::rng::normal_vec(&mut crate::rng::stream(4, "heads"), 2 * 3 * 5 * 4, 1.0);
        let y = candle_core::Var::from_vec(data, (2, 3, 5, 4), &candle_core::Device::Cpu).unwrap();
        let upstream = Tensor::arange(0f32, 120.0, &candle_core::Device::Cpu)
            .unwrap()
            .reshape((2, 5, 12))
            .unwrap();
        let run = |f: &dyn Fn(&Tensor) -> candle_core::Result<Tensor>| {
            let merged = f(y.as_tensor()).unwrap();
            crate::ops::testing::value_and_grads(&merged, &upstream, &[&y])
        };
        let transposed = |y: &Tensor| y.transpose(1, 2)?.reshape((2, 5, 12));
        assert_eq!(run(&merge_heads), run(&transposed));
    }

    #[test]
    fn swapping_the_middle_axes_twice_is_the_identity() {
        // (1, 2, 3, 2): element (0, j, k, l) = 6j + 2k + l.
        let data: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let swapped = swap_middle_axes(&data, (1, 2, 3, 2));
        // (0, k, j, l) of the result is (0, j, k, l) of the input: k = 1, j = 1 → 6 + 2 = 8.
        assert_eq!(&swapped[(2 + 1) * 2..(2 + 1) * 2 + 2], &[8.0, 9.0]);
        assert_eq!(swap_middle_axes(&swapped, (1, 3, 2, 2)), data);
    }
}
