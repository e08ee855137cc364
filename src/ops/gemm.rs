//! A safe, bounds-checked entry to the `gemm` crate (the matrix kernel candle's CPU backend
//! uses), for fused ops that need a product written straight into their own output buffer:
//! with candle's `matmul` the product is a new tensor, then copied or added again.

/// A strided matrix over a slice: element (i, j) is `data[i·row_stride + j·col_stride]`.
#[derive(Clone, Copy)]
pub struct MatRef<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
    pub col_stride: usize,
}

impl<'a> MatRef<'a> {
    /// A row-major (rows, cols) matrix.
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// The transpose, as a view (no copy).
    pub fn t(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }

    fn fits(&self) -> bool {
        fits(
            self.data.len(),
            self.rows,
            self.cols,
            self.row_stride,
            self.col_stride,
        )
    }
}

/// Whether every element of a strided (rows, cols) view lies inside `len`.
fn fits(len: usize, rows: usize, cols: usize, row_stride: usize, col_stride: usize) -> bool {
    if rows == 0 || cols == 0 {
        return true;
    }
    (rows - 1)
        .checked_mul(row_stride)
        .zip((cols - 1).checked_mul(col_stride))
        .and_then(|(a, b)| a.checked_add(b))
        .is_some_and(|last| last < len)
}

/// The output of a product: `rows × cols`, row-major with rows `row_stride` apart (more
/// than `cols` when products fill interleaved column blocks, e.g. heads side by side).
pub struct MatMut<'a> {
    pub data: &'a mut [f32],
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
}

impl<'a> MatMut<'a> {
    /// A row-major (rows, cols) output.
    pub fn row_major(data: &'a mut [f32], rows: usize, cols: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            row_stride: cols,
        }
    }
}

/// `dst = a · b` (or `dst += a · b` with `accumulate`), dst row-major (a.rows, b.cols).
/// Runs on rayon's pool, like candle's own matmul.
///
/// # Panics
/// If the shapes disagree or a view reaches past its slice: callers pass shapes they built.
pub fn gemm(dst: &mut [f32], a: MatRef, b: MatRef, accumulate: bool) {
    let dst = MatMut::row_major(dst, a.rows, b.cols);
    gemm_with(dst, a, b, accumulate, 1.0, parallelism(true));
}

/// `dst = scale · a · b`, on rayon's pool when `parallel`, else on the calling thread only
/// (for many small products run side by side).
pub fn gemm_scaled(dst: MatMut, a: MatRef, b: MatRef, scale: f32, parallel: bool) {
    gemm_with(dst, a, b, false, scale, parallelism(parallel));
}

/// `dst = a · b` (or `dst += a · b` with `accumulate`) on the calling thread only: the small
/// products of one head inside an op that runs its heads side by side.
pub fn gemm_into(dst: MatMut, a: MatRef, b: MatRef, accumulate: bool) {
    gemm_with(dst, a, b, accumulate, 1.0, gemm::Parallelism::None);
}

fn parallelism(parallel: bool) -> gemm::Parallelism {
    let threads = rayon::current_num_threads();
    if parallel && threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    }
}

fn gemm_with(
    dst: MatMut,
    a: MatRef,
    b: MatRef,
    accumulate: bool,
    scale: f32,
    parallelism: gemm::Parallelism,
) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(k, b.rows, "gemm: inner dimensions differ");
    assert_eq!((dst.rows, dst.cols), (m, n), "gemm: output shape differs");
    assert!(a.fits() && b.fits(), "gemm: operand view out of bounds");
    assert!(
        fits(dst.data.len(), m, n, dst.row_stride, 1),
        "gemm: output too small"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for row in dst.data.chunks_mut(dst.row_stride).take(m) {
                row[..n].fill(0.0);
            }
        }
        return;
    }
    // SAFETY: the asserts above keep every element gemm reads or writes inside its slice;
    // `dst` is borrowed mutably, so it aliases neither operand. Strides fit in isize because
    // the views fit in slices (at most isize::MAX bytes).
    #[allow(unsafe_code)]
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.data.as_mut_ptr(),
            1,
            dst.row_stride as isize,
            accumulate,
            a.data.as_ptr(),
            a.col_stride as isize,
            a.row_stride as isize,
            b.data.as_ptr(),
            b.col_stride as isize,
            b.row_stride as isize,
            1.0,
            scale,
            false,
            false,
            false,
            parallelism,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_match_the_definition_with_transposes_and_accumulation() {
        // a (2×3), b (3×2) given as the transpose of a row-major (2×3).
        let a = [1f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let bt = [1f32, 0.0, -1.0, 2.0, 1.0, 0.0];
        let mut dst = vec![10f32; 4];
        gemm(
            &mut dst,
            MatRef::row_major(&a, 2, 3),
            MatRef::row_major(&bt, 2, 3).t(),
            false,
        );
        // row 0: [1·1+2·0+3·(−1), 1·2+2·1+3·0] = [−2, 4]; row 1: [4−6, 8+5] = [−2, 13]
        assert_eq!(dst, vec![-2.0, 4.0, -2.0, 13.0]);
        gemm(
            &mut dst,
            MatRef::row_major(&a, 2, 3),
            MatRef::row_major(&bt, 2, 3).t(),
            true,
        );
        assert_eq!(dst, vec![-4.0, 8.0, -4.0, 26.0]);
    }

    #[test]
    fn scaled_products_fill_interleaved_column_blocks() {
        // Two 1×1·1×2 products side by side in rows of width 4: [x x | y y].
        let (a, b) = ([2f32], [1f32, 3.0]);
        let mut dst = vec![0f32; 4];
        let a = MatRef::row_major(&a, 1, 1);
        let b = MatRef::row_major(&b, 1, 2);
        fn block(dst: &mut [f32], start: usize) -> MatMut<'_> {
            MatMut {
                data: &mut dst[start..],
                rows: 1,
                cols: 2,
                row_stride: 4,
            }
        }
        gemm_scaled(block(&mut dst, 0), a, b, 0.5, false);
        gemm_scaled(block(&mut dst, 2), a, b, -1.0, true);
        assert_eq!(dst, vec![1.0, 3.0, -2.0, -6.0]);
    }

    #[test]
    #[should_panic(expected = "out of bounds")]
    fn a_view_past_its_slice_is_refused() {
        let a = [1f32; 5];
        let mut dst = vec![0f32; 4];
        gemm(
            &mut dst,
            MatRef::row_major(&a, 2, 3),
            MatRef::row_major(&a, 3, 2),
            false,
        );
    }
}
