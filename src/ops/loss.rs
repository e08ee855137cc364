//! Mean cross-entropy of logits against class ids, as one op with its own backward.
//!
//! candle-nn's `cross_entropy` is log-softmax (six ops) then a gather and a mean, each a
//! kernel and a gradient on the GPU, and it keeps the (rows, V) log-probabilities for the
//! backward. Fused, the forward is one pass per row plus a mean, and the backward recomputes
//! the softmax from the logits: dx = (softmax(x) − onehot(target)) · g / rows.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::fused::{indices, last_dim, slice, zeros};
use super::softmax::{exp_shifted_scaled, max_and_exp_sum};
use crate::Result;

/// Mean over rows of −log softmax(logits)[target]: logits (rows, V) f32, targets (rows) u32.
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    Ok(cross_entropy_groups(logits, targets, 1)?.reshape(())?)
}

/// [`cross_entropy`] of each of `groups` equal blocks of rows, (groups): the losses of
/// replicas whose rows are stacked, in one op (a narrow per replica cost a full-size gradient
/// each, assembled from zeros).
pub fn cross_entropy_groups(logits: &Tensor, targets: &Tensor, groups: usize) -> Result<Tensor> {
    if !super::fusable(logits) {
        return cross_entropy_groups_composed(logits, targets, groups);
    }
    Ok(logits
        .contiguous()?
        .apply_op2(&targets.contiguous()?, CrossEntropy { groups })?)
}

/// [`cross_entropy`] by candle-nn (the reference).
pub fn cross_entropy_composed(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    Ok(candle_nn::loss::cross_entropy(logits, targets)?)
}

/// [`cross_entropy_groups`] by candle-nn, a group at a time.
pub fn cross_entropy_groups_composed(
    logits: &Tensor,
    targets: &Tensor,
    groups: usize,
) -> Result<Tensor> {
    let rows = rows_per_group(targets.elem_count(), groups)?;
    let losses = (0..groups)
        .map(|g| {
            let (x, t) = (
                logits.narrow(0, g * rows, rows)?,
                targets.narrow(0, g * rows, rows)?,
            );
            cross_entropy_composed(&x, &t)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Tensor::stack(&losses, 0)?)
}

/// Rows in each of `groups` equal blocks of `rows`, or why there are none.
fn rows_per_group(rows: usize, groups: usize) -> candle_core::Result<usize> {
    if groups == 0 || !rows.is_multiple_of(groups) {
        candle_core::bail!("cross-entropy: {rows} rows do not split into {groups} equal groups");
    }
    Ok(rows / groups)
}

/// The targets of a CPU storage, each checked against the number of classes.
fn targets_of<'a>(s: &'a CpuStorage, l: &Layout, classes: usize) -> candle_core::Result<&'a [u32]> {
    indices(s, l, classes, |bad| {
        format!("target {bad} is outside the {classes} classes of the logits")
    })
}

/// (logits, targets) → the mean loss of each group of rows, (groups).
struct CrossEntropy {
    groups: usize,
}

impl CustomOp2 for CrossEntropy {
    fn name(&self) -> &'static str {
        "attnlab-cross-entropy"
    }

    cpu_fwd!(self, |s1, l1, s2, l2| {
        let logits = slice(s1, l1)?;
        let v = last_dim(l1);
        let targets = targets_of(s2, l2, v)?;
        if targets.len() * v != logits.len() {
            candle_core::bail!(
                "cross-entropy: {} targets for {} logits",
                targets.len(),
                logits.len()
            );
        }
        let rows = rows_per_group(targets.len(), self.groups)?;
        let per_row: Vec<f32> = logits
            .par_chunks(v)
            .zip(targets)
            .map(|(row, &t)| {
                let (max, sum) = max_and_exp_sum(row);
                max + sum.ln() - row[t as usize]
            })
            .collect();
        let means = (0..self.groups)
            .map(|g| per_row[g * rows..][..rows].iter().sum::<f32>() / rows.max(1) as f32)
            .collect();
        Ok((CpuStorage::F32(means), Shape::from(self.groups)))
    });

    cuda_fwd!(self, |s1, l1, s2, l2| {
        rows_per_group(l2.shape().elem_count(), self.groups)?;
        super::cuda::cross_entropy((s1, l1), (s2, l2), self.groups)
    });

    fn bwd(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        _loss: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.reshape(self.groups)?.contiguous()?;
        let dx = logits.apply_op3_no_bwd(targets, &grad, &CrossEntropyGrad)?;
        Ok((Some(dx), None))
    }
}

/// (logits, targets, g) → (softmax(logits) − onehot(targets)) · g / rows, g (groups) the
/// upstream gradient of each group's mean and rows those of a group.
struct CrossEntropyGrad;

impl CustomOp3 for CrossEntropyGrad {
    fn name(&self) -> &'static str {
        "attnlab-cross-entropy-grad"
    }

    cpu_fwd!(self, |s1, l1, s2, l2, s3, l3| {
        let logits = slice(s1, l1)?;
        let v = last_dim(l1);
        let targets = targets_of(s2, l2, v)?;
        let g = slice(s3, l3)?;
        let rows = rows_per_group(targets.len(), g.len())?;
        let mut dx = zeros(logits.len());
        dx.par_chunks_mut(v)
            .zip(logits.par_chunks(v).zip(targets))
            .enumerate()
            .for_each(|(i, (out, (row, &t)))| {
                let scale = g[i / rows] / rows as f32;
                let (max, sum) = max_and_exp_sum(row);
                exp_shifted_scaled(row, out, max, scale / sum);
                out[t as usize] -= scale;
            });
        Ok((CpuStorage::F32(dx), l1.shape().clone()))
    });

    cuda_fwd!(self, |s1, l1, s2, l2, s3, l3| {
        super::cuda::cross_entropy_grad((s1, l1), (s2, l2), (s3, l3))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn cross_entropy_matches_candle_nn_in_value_and_gradient() {
        let data = crate::rng::normal_vec(&mut crate::rng::stream(4, "loss"), 6 * 9, 3.0);
        let logits =
            Var::from_tensor(&Tensor::from_vec(data, (6, 9), &Device::Cpu).unwrap()).unwrap();
        let targets = Tensor::new(&[0u32, 8, 3, 3, 1, 7], &Device::Cpu).unwrap();
        let run = |f: fn(&Tensor, &Tensor) -> Result<Tensor>| {
            let loss = f(logits.as_tensor(), &targets).unwrap();
            assert_eq!(loss.dims(), &[] as &[usize]);
            // A non-unit upstream gradient, as when the loss is scaled.
            let grads = (&loss * 0.7).unwrap().backward().unwrap();
            let grad = grads
                .get(logits.as_tensor())
                .unwrap()
                .flatten_all()
                .unwrap();
            (
                loss.to_scalar::<f32>().unwrap(),
                grad.to_vec1::<f32>().unwrap(),
            )
        };
        let ((loss, grad), (want_loss, want_grad)) =
            (run(cross_entropy), run(cross_entropy_composed));
        assert!((loss - want_loss).abs() < 1e-5, "{loss} vs {want_loss}");
        for (g, w) in grad.iter().zip(&want_grad) {
            assert!((g - w).abs() < 1e-6, "{g} vs {w}");
        }
    }

    /// Three groups of two rows: each group's mean and, under a different upstream gradient
    /// per group, the logits' gradient, against candle-nn a group at a time.
    #[test]
    fn each_groups_loss_and_gradient_is_its_own() {
        let data = crate::rng::normal_vec(&mut crate::rng::stream(5, "loss"), 6 * 9, 3.0);
        let logits =
            Var::from_tensor(&Tensor::from_vec(data, (6, 9), &Device::Cpu).unwrap()).unwrap();
        let targets = Tensor::new(&[0u32, 8, 3, 3, 1, 7], &Device::Cpu).unwrap();
        let weights = Tensor::new(&[0.5f32, -1.0, 2.0], &Device::Cpu).unwrap();
        let run = |f: fn(&Tensor, &Tensor, usize) -> Result<Tensor>| {
            let losses = f(logits.as_tensor(), &targets, 3).unwrap();
            let grads = (&losses * &weights)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let grad = grads
                .get(logits.as_tensor())
                .unwrap()
                .flatten_all()
                .unwrap();
            (
                losses.to_vec1::<f32>().unwrap(),
                grad.to_vec1::<f32>().unwrap(),
            )
        };
        let (fused, composed) = (
            run(cross_entropy_groups),
            run(cross_entropy_groups_composed),
        );
        for (a, b) in fused
            .0
            .iter()
            .chain(&fused.1)
            .zip(composed.0.iter().chain(&composed.1))
        {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
        let error = cross_entropy_groups(logits.as_tensor(), &targets, 4).unwrap_err();
        assert!(
            error.to_string().contains("6 rows do not split into 4"),
            "{error}"
        );
    }

    #[test]
    fn a_target_outside_the_classes_is_an_error() {
        let logits = Tensor::zeros((1, 3), candle_core::DType::F32, &Device::Cpu).unwrap();
        let targets = Tensor::new(&[3u32], &Device::Cpu).unwrap();
        let error = cross_entropy(&logits, &targets).unwrap_err().to_string();
        assert!(
            error.contains("target 3 is outside the 3 classes"),
            "{error}"
        );
    }
}
