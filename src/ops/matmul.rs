//! Batched matrix products (…, m, k) × (…, k, n) on the CPU, parallel over the batch.
//!
//! Attention multiplies B·H small matrices (64 × 64 × 64 in the benchmark). candle's CPU
//! matmul runs them one after another, each split across all threads, so every product pays
//! a thread hand-off for microseconds of work. Here each thread takes whole products, and
//! transposed operands are read in place (candle's backward transposes them first).

use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::gemm::{MatRef, gemm, gemm_serial};

/// A stack of equally strided matrices inside one buffer.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Stack {
    count: usize,
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
    /// Distance between consecutive matrices.
    step: usize,
}

impl Stack {
    /// The stack a layout describes, if its batch dimensions flatten to one uniform stride
    /// (true of contiguous tensors and of their last-two-dims transposes).
    fn of(layout: &Layout) -> Option<Self> {
        let (dims, strides) = (layout.dims(), layout.stride());
        let rank = dims.len();
        if rank < 2 {
            return None;
        }
        let (rows, cols) = (dims[rank - 2], dims[rank - 1]);
        let (row_stride, col_stride) = (strides[rank - 2], strides[rank - 1]);
        // Batch dimensions, innermost first, skipping those of size 1 (their stride is moot).
        let mut step = None;
        let mut expected = None;
        for (&dim, &stride) in dims[..rank - 2].iter().zip(&strides[..rank - 2]).rev() {
            if dim == 1 {
                continue;
            }
            match expected {
                None => step = Some(stride),
                Some(e) if e != stride => return None,
                Some(_) => {}
            }
            expected = Some(stride * dim);
        }
        Some(Self {
            count: dims[..rank - 2].iter().product(),
            rows,
            cols,
            row_stride,
            col_stride,
            step: step.unwrap_or(rows * cols),
        })
    }

    fn matrix<'a>(&self, data: &'a [f32], index: usize) -> MatRef<'a> {
        MatRef {
            data: &data[index * self.step..],
            rows: self.rows,
            cols: self.cols,
            row_stride: self.row_stride,
            col_stride: self.col_stride,
        }
    }
}

/// a (…, m, k) · b (…, k, n) with equal batch dimensions; see the module docs.
pub struct BatchedMatmul;

/// Whether `a · b` can run as a [`BatchedMatmul`] without copying either operand.
pub fn fits(a: &Tensor, b: &Tensor) -> bool {
    let (ra, rb) = (a.rank(), b.rank());
    ra >= 3
        && ra == rb
        && a.dims()[..ra - 2] == b.dims()[..rb - 2]
        && a.dims()[ra - 1] == b.dims()[rb - 2]
        && Stack::of(a.layout()).is_some()
        && Stack::of(b.layout()).is_some()
}

impl CustomOp2 for BatchedMatmul {
    fn name(&self) -> &'static str {
        "attnlab-batched-matmul"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (CpuStorage::F32(a), CpuStorage::F32(b)) = (s1, s2) else {
            candle_core::bail!("batched matmul takes f32 tensors");
        };
        let (Some(sa), Some(sb)) = (Stack::of(l1), Stack::of(l2)) else {
            candle_core::bail!("batched matmul: unsupported strides {l1:?} {l2:?}");
        };
        if sa.count != sb.count || sa.cols != sb.rows {
            candle_core::bail!("batched matmul: shapes {:?} {:?}", l1.dims(), l2.dims());
        }
        let (a, b) = (&a[l1.start_offset()..], &b[l2.start_offset()..]);
        let size = sa.rows * sb.cols;
        let mut out = vec![0f32; sa.count * size];
        if size > 0 {
            if sa.count >= rayon::current_num_threads() {
                out.par_chunks_mut(size)
                    .enumerate()
                    .for_each(|(i, dst)| gemm_serial(dst, sa.matrix(a, i), sb.matrix(b, i)));
            } else {
                for (i, dst) in out.chunks_mut(size).enumerate() {
                    gemm(dst, sa.matrix(a, i), sb.matrix(b, i), false);
                }
            }
        }
        let mut dims = l1.dims().to_vec();
        let rank = dims.len();
        dims[rank - 1] = sb.cols;
        Ok((CpuStorage::F32(out), Shape::from(dims)))
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        // dA = dC · Bᵀ, dB = Aᵀ · dC; the transposes are views.
        let da = grad.apply_op2_no_bwd(&b.detach().t()?, &Self)?;
        let db = a.detach().t()?.apply_op2_no_bwd(&grad, &Self)?;
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
        assert_eq!((s.count, s.rows, s.cols, s.step), (6, 4, 5, 20));
        let t = Stack::of(x.t().unwrap().layout()).unwrap();
        assert_eq!(
            (t.rows, t.cols, t.row_stride, t.col_stride, t.step),
            (5, 4, 1, 5, 20)
        );
        // Heads split from (B, T, H, D) without a copy: the batch dims do not flatten.
        assert!(Stack::of(x.transpose(1, 2).unwrap().layout()).is_none());
    }
}
