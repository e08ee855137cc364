//! Batched matrix products (…, m, k) × (…, k, n) on the CPU, parallel over the batch.
//!
//! Attention multiplies B·H small matrices (64 × 64 × 64 in the benchmark). candle's CPU
//! matmul runs them one after another, each split across all threads, so every product pays
//! a thread hand-off for microseconds of work. Here each thread takes whole products, and
//! transposed operands are read in place (candle's backward transposes them first).

use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::gemm::{MatMut, MatRef, gemm_scaled};

/// A stack of equally strided matrices inside one buffer, their batch dimensions flattened
/// into at most two levels: `inner` matrices `inner_step` apart, in groups `outer_step` apart.
/// Two levels cover heads split from (B, T, H, D) as a (B, H, T, D) view, with no copy.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Stack {
    count: usize,
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
    inner: usize,
    inner_step: usize,
    outer_step: usize,
}

impl Stack {
    /// The stack a layout describes, if its batch dimensions flatten to two levels or fewer.
    fn of(layout: &Layout) -> Option<Self> {
        let (dims, strides) = (layout.dims(), layout.stride());
        let rank = dims.len();
        if rank < 2 {
            return None;
        }
        // (count, step) of each level, innermost first; size-1 dimensions have no say.
        let mut levels: Vec<(usize, usize)> = Vec::with_capacity(2);
        for (&dim, &stride) in dims[..rank - 2].iter().zip(&strides[..rank - 2]).rev() {
            match levels.last_mut() {
                _ if dim == 1 => {}
                Some((count, step)) if stride == *count * *step => *count *= dim,
                _ => levels.push((dim, stride)),
            }
        }
        let (inner, inner_step) = levels.first().copied().unwrap_or((1, 0));
        let (outer, outer_step) = match levels.as_slice() {
            [] | [_] => (1, 0),
            [_, outer] => *outer,
            _ => return None,
        };
        Some(Self {
            count: inner * outer,
            rows: dims[rank - 2],
            cols: dims[rank - 1],
            row_stride: strides[rank - 2],
            col_stride: strides[rank - 1],
            inner,
            inner_step,
            outer_step,
        })
    }

    /// The same matrices, transposed (a view: rows and columns swap strides).
    fn t(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }

    /// Whether candle's own matmul accepts this layout (one batch level).
    fn is_flat(&self) -> bool {
        self.count == self.inner
    }

    fn matrix<'a>(&self, data: &'a [f32], index: usize) -> MatRef<'a> {
        let offset =
            (index / self.inner) * self.outer_step + (index % self.inner) * self.inner_step;
        MatRef {
            data: &data[offset..],
            rows: self.rows,
            cols: self.cols,
            row_stride: self.row_stride,
            col_stride: self.col_stride,
        }
    }
}

/// `x` itself if candle's matmul can read it, else a contiguous copy: for the operands
/// [`BatchedMatmul`] does not take (other devices and dtypes).
pub fn flat_for_candle(x: &Tensor) -> candle_core::Result<Tensor> {
    match Stack::of(x.layout()) {
        Some(stack) if stack.is_flat() => Ok(x.clone()),
        _ => x.contiguous(),
    }
}

/// scale · a (…, m, k) · b (…, k, n) with equal batch dimensions; see the module docs.
#[derive(Clone, Copy)]
pub struct BatchedMatmul {
    pub scale: f32,
    /// For a (B, H, m, k) · (B, H, k, n): write (B, m, H·n), the heads side by side as the
    /// output projection reads them, instead of (B, H, m, n) then a transposing copy.
    pub merge_heads: bool,
    /// b is given as bᵀ (…, n, k): attention scores q·kᵀ take k as it is, where a transposed
    /// view would be one more autograd node, whose gradient candle sums through strides.
    pub b_transposed: bool,
}

/// The plain product: scale 1, heads not merged, b as given.
impl Default for BatchedMatmul {
    fn default() -> Self {
        Self {
            scale: 1.0,
            merge_heads: false,
            b_transposed: false,
        }
    }
}

/// Whether `a · b` can run as a [`BatchedMatmul`] without copying either operand (`b` as
/// given, so pass bᵀ for `b_transposed`).
pub fn fits(a: &Tensor, b: &Tensor, b_transposed: bool) -> bool {
    let (ra, rb) = (a.rank(), b.rank());
    if ra < 3 || ra != rb {
        return false;
    }
    let inner = if b_transposed { rb - 1 } else { rb - 2 };
    a.dims()[..ra - 2] == b.dims()[..rb - 2]
        && a.dims()[ra - 1] == b.dims()[inner]
        && Stack::of(a.layout()).is_some()
        && Stack::of(b.layout()).is_some()
}

/// a (m, k) · b (k, n) outside autograd, either operand possibly a transposed view: for
/// backward passes. candle's matmul zero-fills its output on one thread before the product
/// overwrites it; here the zeroing is shared by all threads.
pub fn product(a: &Tensor, b: &Tensor) -> candle_core::Result<Tensor> {
    a.unsqueeze(0)?
        .apply_op2_no_bwd(&b.unsqueeze(0)?, &BatchedMatmul::default())?
        .squeeze(0)
}

impl BatchedMatmul {
    /// Output shape for a of `a_dims` and b with `n` columns.
    fn output_shape(&self, a_dims: &[usize], n: usize) -> Shape {
        let rank = a_dims.len();
        if self.merge_heads {
            let (b, h, m) = (a_dims[0], a_dims[1], a_dims[2]);
            Shape::from((b, m, h * n))
        } else {
            let mut dims = a_dims.to_vec();
            dims[rank - 1] = n;
            Shape::from(dims)
        }
    }
}

impl CustomOp2 for BatchedMatmul {
    fn name(&self) -> &'static str {
        "attnlab-batched-matmul"
    }

    cpu_fwd!(self, |s1, l1, s2, l2| {
        let (CpuStorage::F32(a), CpuStorage::F32(b)) = (s1, s2) else {
            candle_core::bail!("batched matmul takes f32 tensors");
        };
        let (Some(sa), Some(sb)) = (Stack::of(l1), Stack::of(l2)) else {
            candle_core::bail!("batched matmul: unsupported strides {l1:?} {l2:?}");
        };
        let sb = if self.b_transposed { sb.t() } else { sb };
        if sa.count != sb.count || sa.cols != sb.rows || (self.merge_heads && l1.dims().len() != 4)
        {
            candle_core::bail!("batched matmul: shapes {:?} {:?}", l1.dims(), l2.dims());
        }
        let (a, b) = (&a[l1.start_offset()..], &b[l2.start_offset()..]);
        let (m, n) = (sa.rows, sb.cols);
        // Products per output block and where each one's rows go inside it.
        let heads = if self.merge_heads { l1.dims()[1] } else { 1 };
        let block = heads * m * n;
        let mut out = super::fused::zeros(sa.count * m * n);
        if block > 0 {
            let parallel_blocks = sa.count / heads >= rayon::current_num_threads();
            let fill = |(index, dst): (usize, &mut [f32])| {
                for head in 0..heads {
                    let i = index * heads + head;
                    let dst = MatMut {
                        data: &mut dst[head * n..],
                        rows: m,
                        cols: n,
                        row_stride: heads * n,
                    };
                    let (ai, bi) = (sa.matrix(a, i), sb.matrix(b, i));
                    gemm_scaled(dst, ai, bi, self.scale, !parallel_blocks);
                }
            };
            if parallel_blocks {
                out.par_chunks_mut(block).enumerate().for_each(fill);
            } else {
                out.chunks_mut(block).enumerate().for_each(fill);
            }
        }
        Ok((CpuStorage::F32(out), self.output_shape(l1.dims(), n)))
    });

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        // The gradient as (…, m, n) products: a view when the heads were merged.
        let grad = if self.merge_heads {
            let (batch, heads, m, _) = a.dims4()?;
            let n = b.dim(3)?;
            grad.reshape((batch, m, heads, n))?.transpose(1, 2)?
        } else {
            grad
        };
        // dA = s·dC·Bᵀ, dB = s·Aᵀ·dC (dBᵀ = s·dCᵀ·A when b is given as bᵀ); transposes are views.
        let op = Self {
            scale: self.scale,
            ..Self::default()
        };
        let (a, b) = (a.detach(), b.detach());
        let da = match self.b_transposed {
            true => grad.apply_op2_no_bwd(&b, &op)?,
            false => grad.apply_op2_no_bwd(&b.t()?, &op)?,
        };
        let db = match self.b_transposed {
            true => grad.t()?.apply_op2_no_bwd(&a, &op)?,
            false => a.t()?.apply_op2_no_bwd(&grad, &op)?,
        };
        Ok((Some(da), Some(db)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn transposed_and_contiguous_stacks_are_read_in_place() {
        let x = Tensor::zeros((2, 3, 4, 5), candle_core::DType::F32, &Device::Cpu).unwrap();
        let s = Stack::of(x.layout()).unwrap();
        assert_eq!(
            (s.count, s.rows, s.cols, s.inner, s.inner_step),
            (6, 4, 5, 6, 20)
        );
        assert!(s.is_flat());
        let t = Stack::of(x.t().unwrap().layout()).unwrap();
        assert_eq!((t.rows, t.cols, t.row_stride, t.col_stride), (5, 4, 1, 5));
        // Heads split from (B, T, H, D) = (2, 4, 3, 5) as a (B, H, T, D) view: two levels.
        let heads = x.transpose(1, 2).unwrap();
        let h = Stack::of(heads.layout()).unwrap();
        assert_eq!(
            (h.inner, h.inner_step, h.count / h.inner, h.outer_step),
            (4, 5, 2, 60)
        );
        assert_eq!((h.rows, h.row_stride, h.cols, h.col_stride), (3, 20, 5, 1));
        assert!(!h.is_flat());
        // Matrix (b = 1, h = 2) starts at 1·60 + 2·5.
        let data = vec![0f32; 120];
        assert_eq!(h.matrix(&data, 4 + 2).data.len(), 120 - 70);
    }
}
