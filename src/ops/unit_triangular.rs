//! The inverse of a unit lower-triangular matrix, (I + L)⁻¹ with L strictly lower: DeltaNet's
//! chunked form solves one per chunk and head (the keys' overlaps inside its WY form). candle has
//! no triangular solve; as tensor ops the forward substitution is a row at a time, each row an
//! op reading every row before it ([`unit_lower_inverse_composed`], the reference): at d 128,
//! T 64 it was 1,100 of a DeltaNet step's 1,500 autograd nodes. Fused on the CPU it is one pass
//! per matrix each way, the backward pass the inverse's own gradient, dL = −Yᵀ dY Yᵀ on the
//! strict lower triangle (Y = (I + L)⁻¹). On a GPU the inverse goes by blocks
//! ([`unit_lower_inverse_blocked`]): log₂ n levels of batched products instead of n rows, each
//! row's concatenation a copy kernel per earlier row (an H100 took 110 ms a DeltaNet step at
//! d 128, T 64, one chunk of 64, against 3.4 ms for softmax; 13.8 ms by blocks).

use candle_core::{CpuStorage, CustomOp1, Layout, Tensor};
use rayon::prelude::*;

use super::cpu_f32;
use super::fused::{last_dim, slice, zeros};
use super::gemm::{MatMut, MatRef, gemm_into};
use crate::Result;

/// (I + tril(l, −1))⁻¹ for l (…, n, n): what is on or above l's diagonal is not read. Fused on
/// the CPU in f32, [`unit_lower_inverse_blocked`] elsewhere.
pub fn unit_lower_inverse(l: &Tensor) -> Result<Tensor> {
    if cpu_f32(l) && l.rank() >= 2 {
        return Ok(l.contiguous()?.apply_op1(UnitLowerInverse)?);
    }
    unit_lower_inverse_blocked(l)
}

/// [`unit_lower_inverse`] by blocks, in tensor ops: the inverses of the diagonal blocks of side
/// b (at first the unit diagonal) pair up into those of side 2b,
/// [[A, 0], [C, B]]⁻¹ = [[A⁻¹, 0], [−B⁻¹ C A⁻¹, B⁻¹]], every pair of every matrix in two
/// batched products, until one block covers the matrix (padded to a power of two with zeros,
/// which invert to the identity). Blocked forward substitution: the same sums, grouped.
pub fn unit_lower_inverse_blocked(l: &Tensor) -> Result<Tensor> {
    let n = square(l.layout())?;
    let size = n.next_power_of_two();
    let count = l.elem_count() / (n * n).max(1);
    let padded = l
        .reshape((count, n, n))?
        .pad_with_zeros(1, 0, size - n)?
        .pad_with_zeros(2, 0, size - n)?;
    // (count, blocks, b, b): the inverses of the diagonal blocks of side b.
    let mut inverses = Tensor::ones((count, size, 1, 1), l.dtype(), l.device())?;
    let mut b = 1;
    while b < size {
        let pairs = size / (2 * b);
        let c = diagonal_blocks(&padded, 2 * b)?
            .narrow(2, b, b)?
            .narrow(3, 0, b)?
            .contiguous()?;
        let halves = inverses.reshape((count, pairs, 2, b, b))?;
        let half = |i| -> Result<Tensor> { Ok(halves.narrow(2, i, 1)?.squeeze(2)?.contiguous()?) };
        let (a, b_inv) = (half(0)?, half(1)?);
        let below = b_inv.matmul(&c)?.matmul(&a)?.neg()?;
        let top = Tensor::cat(&[&a, &a.zeros_like()?], 3)?;
        let bottom = Tensor::cat(&[&below, &b_inv], 3)?;
        inverses = Tensor::cat(&[&top, &bottom], 2)?;
        b *= 2;
    }
    let inverse = inverses
        .reshape((count, size, size))?
        .narrow(1, 0, n)?
        .narrow(2, 0, n)?;
    Ok(inverse.contiguous()?.reshape(l.shape())?)
}

/// The diagonal blocks of side `s` of matrices m (count, n, n), n a multiple of s:
/// (count, n / s, s, s).
fn diagonal_blocks(m: &Tensor, s: usize) -> Result<Tensor> {
    let (count, n, _) = m.dims3()?;
    let blocks = n / s;
    let all = m
        .reshape((count, blocks, s, blocks, s))?
        .transpose(2, 3)?
        .contiguous()?
        .reshape((count, blocks * blocks, s, s))?;
    let diagonal: Vec<u32> = (0..blocks as u32)
        .map(|i| i * (blocks as u32 + 1))
        .collect();
    let diagonal = Tensor::new(diagonal.as_slice(), m.device())?;
    Ok(all.index_select(&diagonal, 1)?)
}

/// [`unit_lower_inverse`] by forward substitution in tensor ops: row i of Y is
/// e_i − Σ_{j<i} L_ij Y_j.
pub fn unit_lower_inverse_composed(l: &Tensor) -> Result<Tensor> {
    let rank = l.rank();
    let n = l.dim(rank - 1)?;
    let eye = Tensor::eye(n, l.dtype(), l.device())?;
    let mut rows: Vec<Tensor> = Vec::with_capacity(n);
    for i in 0..n {
        let unit = eye.narrow(0, i, 1)?;
        let row = match i {
            0 => unit
                .broadcast_as(l.narrow(rank - 2, 0, 1)?.shape())?
                .contiguous()?,
            _ => {
                let earlier = Tensor::cat(&rows, rank - 2)?; // (…, i, n)
                let li = l
                    .narrow(rank - 2, i, 1)?
                    .narrow(rank - 1, 0, i)?
                    .contiguous()?;
                unit.broadcast_sub(&li.matmul(&earlier)?)?
            }
        };
        rows.push(row);
    }
    Ok(Tensor::cat(&rows, rank - 2)?)
}

struct UnitLowerInverse;

/// Y = (I + L)⁻¹ of one n×n matrix into `y` (zeros on entry), row by row; L's diagonal
/// and what is above it are not read, and Y is zero above its diagonal.
pub(crate) fn invert(l: &[f32], y: &mut [f32], n: usize) {
    for i in 0..n {
        let (done, rest) = y.split_at_mut(i * n);
        let row = &mut rest[..n];
        row[i] = 1.0;
        for j in 0..i {
            let lij = l[i * n + j];
            if lij != 0.0 {
                // Row j of Y is zero past column j.
                for (y, x) in row[..=j].iter_mut().zip(&done[j * n..][..=j]) {
                    *y -= lij * x;
                }
            }
        }
    }
}

impl CustomOp1 for UnitLowerInverse {
    fn name(&self) -> &'static str {
        "attnlab-unit-lower-inverse"
    }

    cpu_fwd!(self, |storage, layout| {
        let l = slice(storage, layout)?;
        let n = square(layout)?;
        let mut out = zeros(l.len());
        out.par_chunks_mut(n * n)
            .zip(l.par_chunks(n * n))
            .for_each(|(y, l)| invert(l, y, n));
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    });

    fn bwd(&self, _l: &Tensor, y: &Tensor, dy: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let grad = dy
            .contiguous()?
            .apply_op2_no_bwd(y, &UnitLowerInverseGrad)?;
        Ok(Some(grad))
    }
}

/// The side of the square matrices a layout holds.
fn square(layout: &Layout) -> candle_core::Result<usize> {
    let n = last_dim(layout);
    let dims = layout.dims();
    if dims.len() < 2 || dims[dims.len() - 2] != n {
        candle_core::bail!("unit_lower_inverse takes square matrices, not {dims:?}");
    }
    Ok(n)
}

/// dL = −Yᵀ dY Yᵀ on the strict lower triangle, 0 elsewhere; inputs (dY, Y).
struct UnitLowerInverseGrad;

impl candle_core::CustomOp2 for UnitLowerInverseGrad {
    fn name(&self) -> &'static str {
        "attnlab-unit-lower-inverse-grad"
    }

    cpu_fwd!(self, |s1, l1, s2, l2| {
        let (dy, y) = (slice(s1, l1)?, slice(s2, l2)?);
        let n = square(l1)?;
        let mut out = zeros(dy.len());
        out.par_chunks_mut(n * n)
            .zip(dy.par_chunks(n * n).zip(y.par_chunks(n * n)))
            .for_each_init(
                || vec![0f32; n * n],
                |tmp, (dl, (dy, y))| {
                    let y = MatRef::row_major(y, n, n);
                    let dy = MatRef::row_major(dy, n, n);
                    gemm_into(MatMut::row_major(tmp, n, n), dy, y.t(), false);
                    gemm_into(
                        MatMut::row_major(dl, n, n),
                        y.t(),
                        MatRef::row_major(tmp, n, n),
                        false,
                    );
                    for (i, row) in dl.chunks_mut(n).enumerate() {
                        row[..i].iter_mut().for_each(|x| *x = -*x);
                        row[i..].fill(0.0);
                    }
                },
            );
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{assert_close_to, max_abs, max_diff, random};
    use candle_core::Var;

    type Inverse = fn(&Tensor) -> Result<Tensor>;

    /// (I + L) Y = I, and the fused inverse, the blocked one and their gradients equal the
    /// forward substitution's, for a batch of matrices at several sizes, powers of two and not
    /// (entries on and above L's diagonal ignored).
    #[test]
    fn the_fused_and_blocked_inverses_equal_forward_substitution_in_value_and_gradient() {
        let paths: [(&str, Inverse); 2] = [
            ("fused", unit_lower_inverse),
            ("blocked", unit_lower_inverse_blocked),
        ];
        for (path, inverse) in paths {
            for n in [1, 2, 5, 16, 33, 64] {
                check_against_forward_substitution(&format!("{path}, n {n}"), inverse, n);
            }
        }
    }

    fn check_against_forward_substitution(what: &str, inverse: Inverse, n: usize) {
        let l = Var::from_tensor(&(random(&[2, 3, n, n], 1, "l") * 0.3).unwrap()).unwrap();
        let upstream = random(&[2, 3, n, n], 2, "upstream");
        let run = |inverse: Inverse| {
            let y = inverse(l.as_tensor()).unwrap();
            let grads = (&y * &upstream)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            // A 1×1 inverse does not read l: the composed path has no gradient for it.
            let dl = grads.get(&l).cloned();
            (y, dl.unwrap_or_else(|| l.zeros_like().unwrap()))
        };
        let ((y, dl), (y_ref, dl_ref)) = (run(inverse), run(unit_lower_inverse_composed));
        let mask: Vec<f32> = (0..n * n).map(|x| f32::from(x % n < x / n)).collect();
        let mask = Tensor::from_vec(mask, (n, n), l.device()).unwrap();
        let strict = l.as_tensor().broadcast_mul(&mask).unwrap();
        let eye = Tensor::eye(n, candle_core::DType::F32, l.device()).unwrap();
        let product = strict.broadcast_add(&eye).unwrap().matmul(&y).unwrap();
        let identity = eye.broadcast_as(y.shape()).unwrap();
        assert!(
            max_diff(&product, &identity) < 1e-4,
            "{what}: (I + L) Y = I"
        );
        assert_close_to(&y, &y_ref, 1e-4, &format!("{what}: value"));
        match n {
            // A 1×1 inverse is 1 whatever l holds.
            1 => assert_eq!(max_abs(&dl), 0.0, "{what}: gradient"),
            _ => assert_close_to(&dl, &dl_ref, 1e-4, &format!("{what}: gradient")),
        }
    }
}
