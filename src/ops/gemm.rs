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

/// `dst = a · b` (or `dst += a · b` with `accumulate`), dst row-major (a.rows, b.cols).
/// Runs on rayon's pool, like candle's own matmul.
///
/// # Panics
/// If the shapes disagree or a view reaches past its slice: callers pass shapes they built.
pub fn gemm(dst: &mut [f32], a: MatRef, b: MatRef, accumulate: bool) {
    let threads = rayon::current_num_threads();
    let parallelism = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    gemm_with(dst, a, b, accumulate, parallelism);
}

/// [`gemm`] on the calling thread only: for many small products run in parallel.
pub fn gemm_serial(dst: &mut [f32], a: MatRef, b: MatRef) {
    gemm_with(dst, a, b, false, gemm::Parallelism::None);
}

fn gemm_with(
    dst: &mut [f32],
    a: MatRef,
    b: MatRef,
    accumulate: bool,
    parallelism: gemm::Parallelism,
) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(k, b.rows, "gemm: inner dimensions differ");
    assert!(a.fits() && b.fits(), "gemm: operand view out of bounds");
    assert!(fits(dst.len(), m, n, n, 1), "gemm: output too small");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            dst[..m * n].fill(0.0);
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
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.data.as_ptr(),
            a.col_stride as isize,
            a.row_stride as isize,
            b.data.as_ptr(),
            b.col_stride as isize,
            b.row_stride as isize,
            1.0,
            1.0,
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
