//! GLA's cumulative log-decay from its gate logits, b = Σ_{s≤t} logsigmoid(x_s)·scale per head
//! and key channel, as one op.
//!
//! As tensor ops it was a stable log-sigmoid (eight element-wise passes each way), a copy into
//! heads and candle's cumsum, which is a T×T matrix product per row: together ~6 ms of a 78 ms
//! GLA step at d 128, T 64 on 2 cores. Fused, it is one pass each way, the logarithm a
//! polynomial that vectorises.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Shape, Tensor};
use rayon::prelude::*;

use crate::Result;
use crate::ops::cpu_f32;
use crate::ops::fused::{slice, zeros};
use crate::ops::softmax::exp;

/// logits x (B, T, H·D) → b (B, H, T, D), b_t = scale·Σ_{s≤t} log σ(x_s): fused on the CPU in
/// f32, [`cumulative_log_sigmoid_composed`] elsewhere.
pub fn cumulative_log_sigmoid(x: &Tensor, heads: usize, scale: f64) -> Result<Tensor> {
    let (_, _, width) = x.dims3()?;
    if cpu_f32(x) && width.is_multiple_of(heads) {
        let op = CumulativeLogSigmoid {
            heads,
            scale: scale as f32,
        };
        return Ok(x.contiguous()?.apply_op1(op)?);
    }
    cumulative_log_sigmoid_composed(x, heads, scale)
}

/// [`cumulative_log_sigmoid`] from tensor ops: log σ(x) = min(x, 0) − ln(1 + e^(−|x|)), which
/// never overflows.
pub fn cumulative_log_sigmoid_composed(x: &Tensor, heads: usize, scale: f64) -> Result<Tensor> {
    let (batch, t, width) = x.dims3()?;
    let tail = (x.abs()?.neg()?.exp()? + 1.0)?.log()?;
    let log_sigmoid = (x.minimum(0f32)? - tail)?;
    let per_head = (log_sigmoid * scale)?
        .reshape((batch, t, heads, width / heads))?
        .transpose(1, 2)?
        .contiguous()?;
    Ok(per_head.cumsum(2)?)
}

/// ln(1 + e) for e in [0, 1], within an ulp or two: 2·atanh(s) with s = e / (2 + e) ≤ 1/3,
/// its odd series to s¹³ (the next term is below 2e-8). Branch-free, so it vectorises.
#[inline(always)]
fn ln_1p_unit(e: f32) -> f32 {
    let s = e / (2.0 + e);
    let s2 = s * s;
    let series = [
        1.0 / 13.0,
        1.0 / 11.0,
        1.0 / 9.0,
        1.0 / 7.0,
        1.0 / 5.0,
        1.0 / 3.0,
        1.0,
    ]
    .iter()
    .fold(0.0, |p, c| p * s2 + c);
    2.0 * s * series
}

/// log σ(x) = min(x, 0) − ln(1 + e^(−|x|)).
#[inline(always)]
fn log_sigmoid(x: f32) -> f32 {
    x.min(0.0) - ln_1p_unit(exp(-x.abs()))
}

/// The sizes of one call: B sequences of T steps, H heads of D channels.
#[derive(Clone, Copy)]
struct Sizes {
    t: usize,
    heads: usize,
    d: usize,
}

impl Sizes {
    fn of(shape: &Shape, heads: usize) -> candle_core::Result<Self> {
        let (_, t, width) = shape.dims3()?;
        Ok(Self {
            t,
            heads,
            d: width / heads,
        })
    }

    /// x's index of (step, head, channel 0) within one sequence (T, H·D).
    fn x_at(self, step: usize, head: usize) -> usize {
        (step * self.heads + head) * self.d
    }
}

/// The forward op: x (B, T, H·D) → b (B, H, T, D).
struct CumulativeLogSigmoid {
    heads: usize,
    scale: f32,
}

impl CustomOp1 for CumulativeLogSigmoid {
    fn name(&self) -> &'static str {
        "attnlab-cumulative-log-sigmoid"
    }

    cpu_fwd!(self, |storage, layout| {
        let x = slice(storage, layout)?;
        let z = Sizes::of(layout.shape(), self.heads)?;
        let (batch, _, _) = layout.shape().dims3()?;
        let mut out = zeros(x.len());
        // One task per (sequence, head): its (T, D) block of b is contiguous.
        out.par_chunks_mut(z.t * z.d)
            .enumerate()
            .for_each(|(task, b)| {
                let x = &x[task / z.heads * z.t * z.heads * z.d..];
                let head = task % z.heads;
                crate::ops::vectorised(
                    #[inline(always)]
                    || {
                        let mut running = vec![0f32; z.d];
                        for (step, b) in b.chunks_exact_mut(z.d).enumerate() {
                            let x = &x[z.x_at(step, head)..][..z.d];
                            for ((r, b), x) in running.iter_mut().zip(b).zip(x) {
                                *r += self.scale * log_sigmoid(*x);
                                *b = *r;
                            }
                        }
                    },
                )
            });
        Ok((
            CpuStorage::F32(out),
            Shape::from((batch, z.heads, z.t, z.d)),
        ))
    });

    fn bwd(&self, x: &Tensor, _res: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let op = CumulativeLogSigmoidGrad {
            heads: self.heads,
            scale: self.scale,
        };
        Ok(Some(grad.contiguous()?.apply_op2_no_bwd(x, &op)?))
    }
}

/// ∂L/∂x (B, T, H·D) from ∂L/∂b (B, H, T, D): the gradient summed from the end of the sequence
/// back (b_t reads every x_s, s ≤ t), times scale·σ(−x).
struct CumulativeLogSigmoidGrad {
    heads: usize,
    scale: f32,
}

impl CustomOp2 for CumulativeLogSigmoidGrad {
    fn name(&self) -> &'static str {
        "attnlab-cumulative-log-sigmoid-grad"
    }

    cpu_fwd!(self, |s1, l1, s2, l2| {
        let (db, x) = (slice(s1, l1)?, slice(s2, l2)?);
        let z = Sizes::of(l2.shape(), self.heads)?;
        let per_sequence = z.t * z.heads * z.d;
        let mut out = zeros(x.len());
        out.par_chunks_mut(per_sequence)
            .zip(x.par_chunks(per_sequence).zip(db.par_chunks(per_sequence)))
            .for_each(|(dx, (x, db))| {
                crate::ops::vectorised(
                    #[inline(always)]
                    || {
                        let mut running = vec![0f32; z.d];
                        for head in 0..z.heads {
                            running.fill(0.0);
                            for step in (0..z.t).rev() {
                                let at = z.x_at(step, head);
                                let db = &db[(head * z.t + step) * z.d..][..z.d];
                                let (dx, x) = (&mut dx[at..][..z.d], &x[at..][..z.d]);
                                for (((r, dx), x), db) in running.iter_mut().zip(dx).zip(x).zip(db)
                                {
                                    *r += db;
                                    *dx = *r * self.scale / (1.0 + exp(*x));
                                }
                            }
                        }
                    },
                )
            });
        Ok((CpuStorage::F32(out), l2.shape().clone()))
    });
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Var};

    use super::*;
    use crate::ops::testing::{max_diff, random};

    /// The series against f64's ln_1p across [0, 1], and log σ at its extremes.
    #[test]
    fn the_polynomial_logarithm_is_within_two_ulp() {
        for i in 0..=1000 {
            let e = i as f32 / 1000.0;
            let want = (e as f64).ln_1p();
            let got = ln_1p_unit(e) as f64;
            assert!(
                (got - want).abs() <= 2.0 * f32::EPSILON as f64 * want.max(1e-30),
                "{e}"
            );
        }
        assert_eq!(log_sigmoid(-200.0), -200.0);
        assert!(log_sigmoid(200.0).abs() < 1e-30);
        assert!((log_sigmoid(0.0) + std::f32::consts::LN_2).abs() < 1e-7);
    }

    /// One step of five channels: b is log σ(x), exact at both extremes, fused and composed.
    #[test]
    fn log_sigmoid_is_stable_and_exact() {
        let x = Tensor::new(&[[[-200f32, -1.0, 0.0, 3.0, 200.0]]], &Device::Cpu).unwrap();
        let exact = [
            -200.0,
            -1.313_261_7,
            -std::f32::consts::LN_2,
            -0.048_587_35,
            0.0,
        ];
        for f in [cumulative_log_sigmoid, cumulative_log_sigmoid_composed] {
            let b = f(&x, 1, 1.0).unwrap().flatten_all().unwrap();
            for (b, e) in b.to_vec1::<f32>().unwrap().iter().zip(exact) {
                assert!((b - e).abs() < 1e-5, "{b} against {e}");
            }
        }
    }

    /// Value and gradient equal the tensor ops', three heads.
    #[test]
    fn the_fused_cumulative_log_sigmoid_matches_the_tensor_ops() {
        let x = Var::from_tensor(&(random(&[2, 5, 6], 1, "gate") * 3.0).unwrap()).unwrap();
        let weights = random(&[2, 3, 5, 2], 2, "gate");
        let run = |f: fn(&Tensor, usize, f64) -> Result<Tensor>| {
            let b = f(x.as_tensor(), 3, 1.0 / 16.0).unwrap();
            let grads = (&b * &weights).unwrap().sum_all().unwrap().backward();
            (b, grads.unwrap().get(x.as_tensor()).unwrap().clone())
        };
        let (fused, composed) = (
            run(cumulative_log_sigmoid),
            run(cumulative_log_sigmoid_composed),
        );
        assert_eq!(fused.0.dims(), &[2, 3, 5, 2]);
        assert!(max_diff(&fused.0, &composed.0) < 1e-6);
        assert!(max_diff(&fused.1, &composed.1) < 1e-6);
    }
}
