//! What the fused ops share: typed views of CPU storages, parallel zero fills, a gradient
//! computed chunk by chunk ([`ChunkGrad`], the backward of the softmax and GELU ops), and
//! column sums (a bias's gradient). The ops themselves are in `softmax.rs`, `layer_norm.rs`
//! and `elementwise.rs`, each with its analytic backward pass: built from plain tensor ops a
//! LayerNorm or softmax takes ~8 full passes forward and ~20 backward (8 and 20 kernel launches
//! on a GPU); fused they take one pass each way. Each op runs on contiguous f32 tensors, on the
//! CPU (the Rust) or on a CUDA GPU (`cuda.rs`, the kernel of the same name in `kernels.cu`);
//! [`super`] falls back to the composed ops elsewhere (other dtypes, Metal), and the tests check
//! both agree, values and gradients, on every device they run on.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor};
use rayon::prelude::*;

/// The contiguous f32 data of a CPU storage (callers make inputs contiguous first).
pub(super) fn slice<'a>(
    storage: &'a CpuStorage,
    layout: &Layout,
) -> candle_core::Result<&'a [f32]> {
    let CpuStorage::F32(data) = storage else {
        candle_core::bail!("fused ops take f32 tensors");
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("fused ops take contiguous tensors");
    };
    Ok(&data[start..end])
}

/// The contiguous u32 indices of a CPU storage (token ids, class targets), each checked to be
/// below `bound`; `out_of_range(i)` says what an index past it is.
pub(super) fn indices<'a>(
    storage: &'a CpuStorage,
    layout: &Layout,
    bound: usize,
    out_of_range: impl Fn(u32) -> String,
) -> candle_core::Result<&'a [u32]> {
    let CpuStorage::U32(data) = storage else {
        candle_core::bail!("indices must be u32");
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("indices must be contiguous");
    };
    let indices = &data[start..end];
    if let Some(&bad) = indices.iter().find(|&&i| i as usize >= bound) {
        candle_core::bail!("{}", out_of_range(bad));
    }
    Ok(indices)
}

/// `n` zeros, written by all threads: `vec![0.0; n]` zero-fills on the calling thread alone,
/// a serial pass per op output that the profile showed (a few % of a training step).
pub(super) fn zeros(n: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n);
    out.par_extend(rayon::iter::repeat_n(0f32, n));
    out
}

/// Runs `f(out, a, b)` over matching chunks of `chunk` elements of `a` and `b`, in parallel.
fn zip_chunks(
    a: &[f32],
    b: &[f32],
    chunk: usize,
    f: impl Fn(&mut [f32], &[f32], &[f32]) + Sync,
) -> Vec<f32> {
    let mut out = zeros(a.len());
    out.par_chunks_mut(chunk)
        .zip(a.par_chunks(chunk).zip(b.par_chunks(chunk)))
        .for_each(|(o, (a, b))| f(o, a, b));
    out
}

pub(super) fn last_dim(layout: &Layout) -> usize {
    layout.dims().last().copied().unwrap_or(1).max(1)
}

/// A gradient computed chunk by chunk from the upstream gradient and one saved tensor
/// (the input or the output of the forward op), in parallel over chunks.
pub(super) struct ChunkGrad {
    pub(super) name: &'static str,
    /// The CUDA kernel computing the same (`kernels.cu`).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(super) kernel: &'static str,
    /// Elements per chunk; `None` for one row of the last dimension.
    pub(super) chunk: Option<usize>,
    /// `f(out, upstream, saved)` for one chunk.
    pub(super) f: fn(&mut [f32], &[f32], &[f32]),
}

impl ChunkGrad {
    /// The gradient from `upstream` and the forward op's `saved` tensor.
    pub(super) fn apply(
        &self,
        upstream: &Tensor,
        saved: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(
            upstream
                .contiguous()?
                .apply_op2_no_bwd(&saved.contiguous()?, self)?,
        ))
    }
}

impl CustomOp2 for ChunkGrad {
    fn name(&self) -> &'static str {
        self.name
    }

    cpu_fwd!(self, |s1, l1, s2, l2| {
        let chunk = self.chunk.unwrap_or_else(|| last_dim(l1));
        let out = zip_chunks(slice(s1, l1)?, slice(s2, l2)?, chunk, self.f);
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    });

    cuda_fwd!(self, |s1, l1, s2, l2| {
        let per_row = self.chunk.is_none();
        super::cuda::pair_grad(self.kernel, per_row, (s1, l1), (s2, l2))
    });
}

/// Column sums of a row-major (rows, d) slice, computed in parallel blocks of rows.
pub(super) fn column_sums_of(data: &[f32], d: usize) -> Vec<f32> {
    const BLOCK_ROWS: usize = 256;
    let partials = data
        .par_chunks(BLOCK_ROWS * d)
        .map(|block| {
            let mut sums = vec![0f32; d];
            for row in block.chunks(d) {
                sums.iter_mut().zip(row).for_each(|(s, x)| *s += x);
            }
            sums
        })
        .collect();
    sum_in_order(partials, d)
}

/// The element-wise sum of `partials` (each `len` long), added in their order.
///
/// Partial sums computed in parallel are summed here, after `collect` has put them in the
/// order of their blocks, and not with rayon's `reduce`: its tree of additions follows how
/// the work was stolen, which changes from run to run, and float addition is not associative,
/// so two runs with the same seed and threads differed from about step 10 (issue 32).
pub(super) fn sum_in_order(partials: Vec<Vec<f32>>, len: usize) -> Vec<f32> {
    let mut sums = vec![0f32; len];
    for partial in &partials {
        sums.iter_mut().zip(partial).for_each(|(s, p)| *s += p);
    }
    sums
}

/// Column sums (d) of a tensor viewed as (rows, d), d its last dimension: the gradient of a
/// bias broadcast over rows, in one parallel pass over the data (no copy out first).
pub(super) fn column_sums(x: &Tensor) -> candle_core::Result<Tensor> {
    x.contiguous()?.apply_op1_no_bwd(&ColumnSums)
}

struct ColumnSums;

impl CustomOp1 for ColumnSums {
    fn name(&self) -> &'static str {
        "attnlab-column-sums"
    }

    cpu_fwd!(self, |storage, layout| {
        let d = last_dim(layout);
        let sums = column_sums_of(slice(storage, layout)?, d);
        Ok((CpuStorage::F32(sums), Shape::from(d)))
    });

    cuda_fwd!(self, |storage, layout| {
        super::cuda::column_sums(storage, layout)
    });
}
