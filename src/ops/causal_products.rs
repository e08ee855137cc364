//! The matrix products of one head of causal attention on the CPU, written for its shapes:
//! a T×T matrix that is zero on one side of its diagonal, times or from (T, k) matrices with k
//! a head's width (8–64 in the sweeps). For these 64×64×8 products the `gemm` crate spends much
//! of each call setting up and computes both halves of the square (a quarter of a softmax
//! replica group's step); these loops read only the causal half and keep their sums in vector
//! registers (a block of rows × one vector of columns), through `pulp`'s vector types for
//! whichever instruction set the CPU has: written over plain arrays, the compiler kept them
//! scalar and the step took twice as long.
//!
//! [`lower_product`] makes scores (q kᵀ) and the weights' gradient (dO vᵀ);
//! [`triangular_product`] multiplies weights into values (W v, dS k) and, transposed, values
//! back (Wᵀ dO, dSᵀ q). The tests compare each with the full `gemm` product.
//!
//! Sliding-window attention's weights are a band: row i is nonzero at columns i − w + 1..=i
//! only. [`lower_band_product`] and [`band_product`] compute and read that band, so a step
//! costs T·w, not T²/2; the plain forms are the band as wide as the matrix.

use pulp::{Simd, WithSimd};

use super::gemm::{MatMut, MatRef};

/// Rows of scores per block: four sums that reuse each loaded vector of kᵀ.
const SCORE_ROWS: usize = 4;

/// Output rows per block of [`triangular_product`]: eight independent sums hide the latency of
/// the multiply-adds.
const ROWS: usize = 8;

/// How far past a row's band (either side) [`band_product`] reads weights, which must be
/// zero there: a block of [`ROWS`] rows reads the union of their bands.
pub const BAND_REACH: usize = ROWS - 1;

/// The first column of row `i`'s band of `width` columns ending at its diagonal.
pub fn band_start(i: usize, width: usize) -> usize {
    (i + 1).saturating_sub(width)
}

/// What [`lower_product`] pads its transposed operand's rows to: a whole number of vectors of
/// any instruction set (16 lanes at most).
const PAD: usize = 16;

/// The lower triangle and diagonal of `dst` (T×T, row-major) = scale · a · bᵀ, a and b (T, k).
/// Past its diagonal a row keeps what was there or gets values it must ignore (up to the end
/// of its vector of columns). `bt` is scratch space, reused between calls.
pub fn lower_product(dst: &mut [f32], a: MatRef, b: MatRef, scale: f32, bt: &mut Vec<f32>) {
    lower_band_product(dst, (a, b), scale, bt, a.rows);
}

/// [`lower_product`] on the band of `width` columns ending at each row's diagonal
/// ([`band_start`]): past either edge a row keeps what was there or gets values to ignore
/// (to its vectors of columns' ends).
pub fn lower_band_product(
    dst: &mut [f32],
    (a, b): (MatRef, MatRef),
    scale: f32,
    bt: &mut Vec<f32>,
    width: usize,
) {
    let (t, k) = (a.rows, a.cols);
    assert!(
        b.rows == t && b.cols == k && dst.len() == t * t,
        "lower_product: shapes"
    );
    // bᵀ (k, padded T), zero past T, so that every vector of columns is whole.
    let padded = t.div_ceil(PAD) * PAD;
    bt.clear();
    bt.resize(k * padded, 0.0);
    for j in 0..t {
        for d in 0..k {
            bt[d * padded + j] = b.data[j * b.row_stride + d * b.col_stride];
        }
    }
    pulp::Arch::new().dispatch(LowerProduct {
        dst,
        a,
        bt,
        padded,
        scale,
        width,
    });
}

struct LowerProduct<'a> {
    dst: &'a mut [f32],
    a: MatRef<'a>,
    bt: &'a [f32],
    padded: usize,
    scale: f32,
    width: usize,
}

impl WithSimd for LowerProduct<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(mut self, simd: S) {
        let t = self.a.rows;
        let full = t / SCORE_ROWS * SCORE_ROWS;
        for i0 in (0..full).step_by(SCORE_ROWS) {
            self.rows::<S, SCORE_ROWS>(simd, i0);
        }
        for i0 in full..t {
            self.rows::<S, 1>(simd, i0);
        }
    }
}

impl LowerProduct<'_> {
    /// Rows i0..i0 + R, over the vectors of columns from the first row's band to the last
    /// row's diagonal.
    #[inline(always)]
    fn rows<S: Simd, const R: usize>(&mut self, simd: S, i0: usize) {
        let (a, t, lanes) = (self.a, self.a.rows, S::F32_LANES);
        let first = band_start(i0, self.width) / lanes * lanes;
        for c0 in (first..i0 + R).step_by(lanes) {
            let mut acc = [simd.splat_f32s(0.0); R];
            for d in 0..a.cols {
                let column = S::as_simd_f32s(&self.bt[d * self.padded + c0..][..lanes]).0[0];
                for (r, acc) in acc.iter_mut().enumerate() {
                    let x = simd.splat_f32s(a.data[(i0 + r) * a.row_stride + d * a.col_stride]);
                    *acc = simd.mul_add_e_f32s(x, column, *acc);
                }
            }
            let (n, scale) = (lanes.min(t - c0), simd.splat_f32s(self.scale));
            for (r, acc) in acc.iter().enumerate() {
                let row = &mut self.dst[(i0 + r) * t + c0..][..n];
                simd.partial_store_f32s(row, simd.mul_f32s(*acc, scale));
            }
        }
    }
}

/// `dst` (T, n) = scale · w · x for a row-major T×T `w` that is 0 above its diagonal, or, with
/// `transposed`, scale · wᵀ · x (wᵀ is 0 below its diagonal): each output row reads only the
/// rows of x its nonzero weights reach. x is (T, n) with unit column stride.
pub fn triangular_product(dst: MatMut, w: &[f32], x: MatRef, transposed: bool, scale: f32) {
    let t = x.rows;
    band_product(dst, (w, t), x, transposed, scale);
}

/// [`triangular_product`] for weights nonzero only on the band of `width` columns ending at
/// each row's diagonal ([`band_start`]), and zero for [`BAND_REACH`] columns past either edge.
pub fn band_product(
    dst: MatMut,
    (w, width): (&[f32], usize),
    x: MatRef,
    transposed: bool,
    scale: f32,
) {
    let (t, n) = (x.rows, x.cols);
    assert!(
        w.len() == t * t && dst.rows == t && dst.cols == n && x.col_stride == 1,
        "triangular_product: shapes"
    );
    let arch = pulp::Arch::new();
    let width = width.max(1);
    match transposed {
        false => arch.dispatch(WeightedProduct::<false> {
            dst,
            w,
            x,
            scale,
            width,
        }),
        true => arch.dispatch(WeightedProduct::<true> {
            dst,
            w,
            x,
            scale,
            width,
        }),
    }
}

/// [`band_product`], with or without the transpose fixed at compile time.
struct WeightedProduct<'a, const TRANSPOSED: bool> {
    dst: MatMut<'a>,
    w: &'a [f32],
    x: MatRef<'a>,
    scale: f32,
    width: usize,
}

impl<const TRANSPOSED: bool> WithSimd for WeightedProduct<'_, TRANSPOSED> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(mut self, simd: S) {
        let (t, n) = (self.x.rows, self.x.cols);
        let full = t / ROWS * ROWS;
        for c0 in (0..n).step_by(S::F32_LANES) {
            for i0 in (0..full).step_by(ROWS) {
                self.rows::<S, ROWS>(simd, (i0, c0));
            }
            for i0 in full..t {
                self.rows::<S, 1>(simd, (i0, c0));
            }
        }
    }
}

impl<const TRANSPOSED: bool> WeightedProduct<'_, TRANSPOSED> {
    /// Output rows i0..i0 + R, columns from c0 (one vector, or what is left of the row).
    #[inline(always)]
    fn rows<S: Simd, const R: usize>(&mut self, simd: S, (i0, c0): (usize, usize)) {
        let (w, x, t) = (self.w, self.x, self.x.rows);
        let n = S::F32_LANES.min(x.cols - c0);
        // The rows of x that rows i0..i0 + R reach: from the first one's band to the last one's
        // diagonal, or (transposed) from the first one's diagonal to the last one's band's end.
        let reach = if TRANSPOSED {
            i0..(i0 + R - 1 + self.width).min(t)
        } else {
            band_start(i0, self.width)..(i0 + R).min(t)
        };
        let mut acc = [simd.splat_f32s(0.0); R];
        for j in reach {
            let xs = simd.partial_load_f32s(&x.data[j * x.row_stride + c0..][..n]);
            for (r, acc) in acc.iter_mut().enumerate() {
                let weight = if TRANSPOSED {
                    w[j * t + i0 + r]
                } else {
                    w[(i0 + r) * t + j]
                };
                *acc = simd.mul_add_e_f32s(simd.splat_f32s(weight), xs, *acc);
            }
        }
        let scale = simd.splat_f32s(self.scale);
        for (r, acc) in acc.iter().enumerate() {
            let row = &mut self.dst.data[(i0 + r) * self.dst.row_stride + c0..][..n];
            simd.partial_store_f32s(row, simd.mul_f32s(*acc, scale));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gemm::gemm_scaled;

    fn random(n: usize, seed: u64) -> Vec<f32> {
        crate::rng::normal_vec(&mut crate::rng::stream(seed, "causal products"), n, 1.0)
    }

    /// A T×T matrix zeroed above its diagonal.
    fn lower(t: usize, seed: u64) -> Vec<f32> {
        let mut w = random(t * t, seed);
        for (i, row) in w.chunks_mut(t).enumerate() {
            row[i + 1..].fill(0.0);
        }
        w
    }

    fn assert_close(got: &[f32], want: &[f32], what: &str) {
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                "{what}[{i}]: {g} vs {w}"
            );
        }
    }

    #[test]
    fn lower_products_equal_the_full_product_on_and_below_the_diagonal() {
        // Lengths around the block sizes (whole, partial and single-row blocks), widths 8 and 5.
        for (t, k) in [(1, 8), (7, 5), (16, 8), (37, 8), (64, 16)] {
            let (a, b) = (random(t * k, 1), random(t * k, 2));
            let (a, b) = (MatRef::row_major(&a, t, k), MatRef::row_major(&b, t, k));
            let mut want = vec![0f32; t * t];
            gemm_scaled(MatMut::row_major(&mut want, t, t), a, b.t(), 0.5, false);
            let mut got = vec![f32::NAN; t * t];
            lower_product(&mut got, a, b, 0.5, &mut Vec::new());
            for i in 0..t {
                let row = i * t..i * t + i + 1;
                assert_close(
                    &got[row.clone()],
                    &want[row],
                    &format!("t {t} k {k} row {i}"),
                );
            }
        }
    }

    #[test]
    fn band_products_equal_the_full_products_of_the_band() {
        // Widths of one column, within a block of rows, across vectors, and the whole matrix.
        for (t, k, width) in [(9, 5, 1), (37, 8, 3), (70, 8, 20), (64, 16, 64)] {
            let (a, b) = (random(t * k, 1), random(t * k, 2));
            let (a, b) = (MatRef::row_major(&a, t, k), MatRef::row_major(&b, t, k));
            let mut full = vec![0f32; t * t];
            gemm_scaled(MatMut::row_major(&mut full, t, t), a, b.t(), 0.5, false);
            let mut got = vec![f32::NAN; t * t];
            lower_band_product(&mut got, (a, b), 0.5, &mut Vec::new(), width);
            for i in 0..t {
                let band = i * t + band_start(i, width)..i * t + i + 1;
                let context = format!("t {t} width {width} row {i}");
                assert_close(&got[band.clone()], &full[band], &context);
            }
            // The band of `full` times x, zero outside, and NaN beyond the zeros the products
            // may read: a read past them would show.
            let mut w = vec![f32::NAN; t * t];
            for i in 0..t {
                let start = band_start(i, width);
                let reach = start.saturating_sub(BAND_REACH)..(i + 1 + BAND_REACH).min(t);
                w[i * t..][reach].fill(0.0);
                w[i * t + start..=i * t + i].copy_from_slice(&full[i * t + start..=i * t + i]);
            }
            let zeroed: Vec<f32> = w
                .iter()
                .map(|x| if x.is_nan() { 0.0 } else { *x })
                .collect();
            let xs = random(t * k, 4);
            let x = MatRef::row_major(&xs, t, k);
            for transposed in [false, true] {
                let w_ref = MatRef::row_major(&zeroed, t, t);
                let w_ref = if transposed { w_ref.t() } else { w_ref };
                let mut want = vec![0f32; t * k];
                gemm_scaled(MatMut::row_major(&mut want, t, k), w_ref, x, 2.0, false);
                let mut got = vec![f32::NAN; t * k];
                let dst = MatMut::row_major(&mut got, t, k);
                band_product(dst, (&w, width), x, transposed, 2.0);
                let context = format!("t {t} width {width} transposed {transposed}");
                assert_close(&got, &want, &context);
            }
        }
    }

    #[test]
    fn triangular_products_equal_the_full_product_either_way_round() {
        // x with rows wider than its columns (a head of a merged (T, H·n) matrix).
        for (t, n) in [(1, 8), (9, 5), (64, 8), (70, 24)] {
            let w = lower(t, 3);
            let xs = random(t * 2 * n, 4);
            let x = MatRef {
                data: &xs,
                rows: t,
                cols: n,
                row_stride: 2 * n,
                col_stride: 1,
            };
            for transposed in [false, true] {
                let w_ref = MatRef::row_major(&w, t, t);
                let w_ref = if transposed { w_ref.t() } else { w_ref };
                let mut want = vec![0f32; t * n];
                gemm_scaled(MatMut::row_major(&mut want, t, n), w_ref, x, 2.0, false);
                let mut got = vec![f32::NAN; t * n];
                triangular_product(MatMut::row_major(&mut got, t, n), &w, x, transposed, 2.0);
                assert_close(&got, &want, &format!("t {t} n {n} transposed {transposed}"));
            }
        }
    }
}
