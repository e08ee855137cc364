//! The building blocks for R replicas of a model computed as one (see `params.rs`): the
//! replicas' batches are stacked along the batch dimension, replica-major ((R·B, …) is R blocks
//! of B rows), and each parameter has a leading dimension R. A layer applies replica r's slice
//! of its parameters to replica r's block of rows, as one batched product or broadcast, so R
//! small models cost about what one R-times-larger batch costs.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Shape, Tensor};
use rayon::prelude::*;

use super::fused::{column_sums_of, slice, zeros};
use crate::Result;

/// x (R·N…, d) as (R, N·…, d): one block of rows per replica.
fn blocks(x: &Tensor, replicas: usize) -> Result<Tensor> {
    let d = x.dim(candle_core::D::Minus1)?;
    Ok(x.reshape((replicas, x.elem_count() / (replicas * d), d))?)
}

/// y = x Wᵣᵀ + bᵣ for each replica's rows: x (R·N…, in), W (R, out, in), b (R, out).
pub fn linear_replicas(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let (replicas, out, _) = w.dims3()?;
    let y = super::dot_scores(&blocks(x, replicas)?, w, 1.0)?; // (R, N, out)
    let mut dims = x.dims().to_vec();
    if let Some(last) = dims.last_mut() {
        *last = out;
    }
    let y = y.reshape(dims)?;
    match b {
        Some(b) => add_bias_replicas(&y, b),
        None => Ok(y),
    }
}

/// y + bᵣ for each replica's rows: y (R·N…, d), b (R, d).
pub fn add_bias_replicas(y: &Tensor, b: &Tensor) -> Result<Tensor> {
    per_replica(y, b, Combine::Add)
}

/// γᵣ ⊙ x + βᵣ for each replica's rows: x (R·N…, d), γ and β (R, d).
pub fn affine_replicas(x: &Tensor, gamma: &Tensor, beta: Option<&Tensor>) -> Result<Tensor> {
    let y = per_replica(x, gamma, Combine::Mul)?;
    match beta {
        Some(beta) => add_bias_replicas(&y, beta),
        None => Ok(y),
    }
}

/// How [`per_replica`] combines x with a replica's y.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Combine {
    Add,
    Mul,
}

impl Combine {
    fn apply(self, x: &Tensor, y: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Combine::Add => x.broadcast_add(y),
            Combine::Mul => x.broadcast_mul(y),
        }
    }
}

/// x (R·B, …) combined with a per-replica y (R, …), y broadcast over its replica's B rows.
///
/// Where y's dimensions after R are the end of x's, in f32 (CPU or CUDA), it is one fused pass
/// whose backward sums y's gradient per replica by [`column sums`](super::fused::column_sums);
/// candle's broadcast reduces it with a strided loop that was a fifth of a replica group's step.
pub fn per_replica(x: &Tensor, y: &Tensor, combine: Combine) -> Result<Tensor> {
    let replicas = y.dim(0)?;
    let trailing = &y.dims()[1..];
    let fits = x.rank() > trailing.len() && x.dims().ends_with(trailing);
    if fits && super::fusable(x) && super::fusable(y) {
        let op = BlockBroadcast { combine, replicas };
        return Ok(x.contiguous()?.apply_op2(&y.contiguous()?, op)?);
    }
    per_replica_composed(x, y, combine)
}

/// [`per_replica`] by candle's broadcast ops (any device and shape): the reference.
pub fn per_replica_composed(x: &Tensor, y: &Tensor, combine: Combine) -> Result<Tensor> {
    let replicas = y.dim(0)?;
    let mut dims = x.dims().to_vec();
    dims[0] /= replicas;
    dims.insert(0, replicas);
    let mut y = y.clone();
    while y.rank() < dims.len() {
        y = y.unsqueeze(1)?;
    }
    Ok(combine.apply(&x.reshape(dims)?, &y)?.reshape(x.shape())?)
}

/// `combine(x, bias)` for a bias shared by every row (rank below x's), or per replica for a
/// replicated bias (R, …) of x's rank: an attention score matrix (R·B, H, T, T) and a learned
/// encoding's bias (R, H, T, T).
pub fn with_bias(x: &Tensor, bias: &Tensor, combine: Combine) -> Result<Tensor> {
    if bias.rank() == x.rank() && bias.dim(0)? != x.dim(0)? {
        return per_replica(x, bias, combine);
    }
    Ok(combine.apply(x, bias)?)
}

/// x (R, M, n) ∘ y (R, n), y's row r combined with every row of x's block r.
struct BlockBroadcast {
    combine: Combine,
    replicas: usize,
}

impl BlockBroadcast {
    /// Each x row (n entries) combined with its replica's y row.
    fn forward(&self, x: &[f32], y: &[f32]) -> Vec<f32> {
        let n = y.len() / self.replicas;
        let per_replica = x.len() / self.replicas;
        let mut out = zeros(x.len());
        out.par_chunks_mut(n)
            .zip(x.par_chunks(n))
            .enumerate()
            .for_each(|(row, (o, x))| {
                let y = &y[(row * n / per_replica) * n..][..n];
                match self.combine {
                    Combine::Add => o
                        .iter_mut()
                        .zip(x)
                        .zip(y)
                        .for_each(|((o, x), y)| *o = x + y),
                    Combine::Mul => o
                        .iter_mut()
                        .zip(x)
                        .zip(y)
                        .for_each(|((o, x), y)| *o = x * y),
                }
            });
        out
    }
}

impl CustomOp2 for BlockBroadcast {
    fn name(&self) -> &'static str {
        "attnlab-replica-broadcast"
    }

    cpu_fwd!(self, |s1, l1, s2, l2| {
        let out = self.forward(slice(s1, l1)?, slice(s2, l2)?);
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    });

    cuda_fwd!(self, |s1, l1, s2, l2| {
        let mul = self.combine == Combine::Mul;
        let out = super::cuda::block_broadcast((s1, l1), (s2, l2), self.replicas, mul)?;
        Ok((out, l1.shape().clone()))
    });

    fn bwd(
        &self,
        x: &Tensor,
        y: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let (dx, summed) = match self.combine {
            Combine::Add => (grad.clone(), grad),
            Combine::Mul => (grad.apply_op2_no_bwd(y, self)?, (&grad * x)?),
        };
        let op = BlockColumnSums {
            replicas: self.replicas,
            n: y.elem_count() / self.replicas,
        };
        let dy = summed.apply_op1_no_bwd(&op)?.reshape(y.shape())?;
        Ok((Some(dx), Some(dy)))
    }
}

/// (R, M, n) → (R, n): each replica's rows summed.
struct BlockColumnSums {
    replicas: usize,
    n: usize,
}

impl CustomOp1 for BlockColumnSums {
    fn name(&self) -> &'static str {
        "attnlab-replica-column-sums"
    }

    cpu_fwd!(self, |storage, layout| {
        let x = slice(storage, layout)?;
        let sums = x
            .chunks(x.len() / self.replicas)
            .flat_map(|block| column_sums_of(block, self.n))
            .collect();
        Ok((CpuStorage::F32(sums), Shape::from((self.replicas, self.n))))
    });

    cuda_fwd!(self, |storage, layout| {
        // Rows of n, the replicas' blocks of them summed each on its own.
        let rows = candle_core::Layout::contiguous_with_offset(
            (layout.shape().elem_count() / self.n, self.n),
            layout.start_offset(),
        );
        let sums = super::cuda::block_column_sums((storage, &rows), self.replicas)?;
        Ok((sums, Shape::from((self.replicas, self.n))))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(shape: &[usize], seed: u64) -> Tensor {
        crate::ops::testing::random(shape, seed, "replicas")
    }

    fn close(a: &Tensor, b: &Tensor) {
        assert!(crate::ops::testing::max_diff(a, b) < 1e-5);
    }

    /// Each replica's block equals the lone layer applied with that replica's parameters.
    #[test]
    fn each_block_gets_its_replicas_parameters() {
        let (x, w, b) = (
            random(&[6, 5, 4], 1),
            random(&[3, 7, 4], 2),
            random(&[3, 7], 3),
        );
        let (gamma, beta) = (random(&[3, 4], 4), random(&[3, 4], 5));
        let y = linear_replicas(&x, &w, Some(&b)).unwrap();
        let a = affine_replicas(&x, &gamma, Some(&beta)).unwrap();
        let bias = random(&[3, 5, 4], 6);
        let s = per_replica(&x, &bias, Combine::Add).unwrap();
        assert_eq!(y.dims(), &[6, 5, 7]);
        for r in 0..3 {
            let xr = x.narrow(0, 2 * r, 2).unwrap();
            let (wr, br) = (w.get(r).unwrap(), b.get(r).unwrap());
            let lone = super::super::linear_composed(&xr, &wr, Some(&br)).unwrap();
            close(&y.narrow(0, 2 * r, 2).unwrap(), &lone);
            let affine = xr
                .broadcast_mul(&gamma.get(r).unwrap())
                .unwrap()
                .broadcast_add(&beta.get(r).unwrap())
                .unwrap();
            close(&a.narrow(0, 2 * r, 2).unwrap(), &affine);
            let added = xr.broadcast_add(&bias.get(r).unwrap()).unwrap();
            close(&s.narrow(0, 2 * r, 2).unwrap(), &added);
        }
    }

    /// The fused op and candle's broadcasts agree in value and in both gradients.
    #[test]
    fn the_fused_broadcast_matches_the_composed_one() {
        for combine in [Combine::Add, Combine::Mul] {
            for (xs, ys) in [(&[6, 5, 4][..], &[3, 4][..]), (&[6, 5, 4], &[3, 5, 4])] {
                let x = candle_core::Var::from_tensor(&random(xs, 7)).unwrap();
                let y = candle_core::Var::from_tensor(&random(ys, 8)).unwrap();
                let w = random(xs, 9);
                let run = |f: &dyn Fn(&Tensor, &Tensor) -> Result<Tensor>| {
                    let out = f(x.as_tensor(), y.as_tensor()).unwrap();
                    let grads = (&out * &w).unwrap().sum_all().unwrap().backward().unwrap();
                    let g = |v: &candle_core::Var| grads.get(v.as_tensor()).unwrap().clone();
                    (out, g(&x), g(&y))
                };
                let fused = run(&|x, y| per_replica(x, y, combine));
                let composed = run(&|x, y| per_replica_composed(x, y, combine));
                close(&fused.0, &composed.0);
                close(&fused.1, &composed.1);
                close(&fused.2, &composed.2);
            }
        }
    }
}
