//! y = x Wᵀ + b as one autograd node on the CPU.
//!
//! Built from candle ops, a linear layer is four nodes (transpose, reshape, matmul, bias add);
//! candle's backward zero-fills and adds a full gradient for each, copies the bias gradient out
//! to sum it, and accumulates W's gradient through a transposed (strided) view. Fused, the
//! forward writes the bias and the product into one buffer, and the backward is two matrix
//! products and one parallel column sum, each W-shaped result already in W's layout.

use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor};

use super::fused::{column_sums, last_dim, slice};
use super::gemm::{MatRef, gemm};

/// (x, W, b) → x Wᵀ + b for x (…, in), W (out, in), b (out).
pub struct LinearOp;

/// x's shape with the last dimension replaced by `out`.
fn with_last(shape: &Shape, out: usize) -> Shape {
    let mut dims = shape.dims().to_vec();
    if let Some(last) = dims.last_mut() {
        *last = out;
    }
    Shape::from(dims)
}

impl CustomOp3 for LinearOp {
    fn name(&self) -> &'static str {
        "attnlab-linear"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, w, b) = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
        let (out_dim, in_dim) = l2.shape().dims2()?;
        if last_dim(l1) != in_dim || b.len() != out_dim {
            candle_core::bail!(
                "linear: x {:?}, W {:?}, b {:?} do not fit",
                l1.dims(),
                l2.dims(),
                l3.dims()
            );
        }
        let rows = x.len() / in_dim;
        let mut y = b.repeat(rows); // the bias in every row, then += x Wᵀ
        gemm(
            &mut y,
            MatRef::row_major(x, rows, in_dim),
            MatRef::row_major(w, out_dim, in_dim).t(),
            true,
        );
        Ok((CpuStorage::F32(y), with_last(l1.shape(), out_dim)))
    }

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
        let dy = grad.contiguous()?.reshape((rows, out_dim))?;
        let x2 = x.detach().contiguous()?.reshape((rows, in_dim))?;
        let dx = dy.matmul(&w.detach())?.reshape(x.shape())?;
        let dw = dy.t()?.matmul(&x2)?; // (out, in), W's own layout
        let db = column_sums(&dy)?;
        Ok((Some(dx), Some(dw), Some(db)))
    }
}
