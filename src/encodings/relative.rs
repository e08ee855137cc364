//! Relative biases b_h(i − j): the machinery shared by every encoding whose logit term depends
//! only on how far back the key is. Fixed formulas are tabulated once per length on the CPU;
//! learned ones compute their per-distance row with differentiable ops on every forward pass
//! and spread it into the (T, T) Toeplitz matrix with `index_select`, which has a backward.

use std::sync::Arc;

use candle_core::{Device, Tensor};

use super::{DistanceBias, Encoding, LengthCache};
use crate::Result;

/// Per-distance values (H, T) → (H, T, T) with entry [h, i, j] = v[h, i − j] for j ≤ i.
/// Entries above the diagonal repeat v[h, 0]; every mechanism masks them.
pub(crate) fn toeplitz(per_distance: &Tensor, index: &Tensor) -> Result<Tensor> {
    let (h, t) = per_distance.dims2()?;
    Ok(per_distance.index_select(index, 1)?.reshape((h, t, t))?)
}

/// The flat (T·T) gather index of [`toeplitz`]: i − j below the diagonal, 0 above it.
pub(crate) fn distance_index(t: usize, device: &Device) -> Result<Tensor> {
    let index: Vec<u32> = (0..t * t)
        .map(|ij| (ij / t).saturating_sub(ij % t) as u32)
        .collect();
    Ok(Tensor::from_vec(index, t * t, device)?)
}

/// The distances 0..t as a (1, t) f32 row, for learned biases written as formulas of t.
pub(crate) fn distance_row(t: usize, device: &Device) -> Result<Tensor> {
    Ok(Tensor::arange(0u32, t as u32, device)?
        .to_dtype(candle_core::DType::F32)?
        .unsqueeze(0)?)
}

/// A bias given by a formula per head, with no trainable parameter (ALiBi, Sandwich, the
/// paper's Type 1/2 and divergent controls, the sliding window).
pub struct FixedBias {
    /// One entry per head, or a single entry shared by all heads.
    heads: Vec<Arc<dyn DistanceBias>>,
    n_heads: usize,
    device: Device,
    cache: LengthCache,
}

impl FixedBias {
    pub fn new(heads: Vec<Arc<dyn DistanceBias>>, n_heads: usize, device: &Device) -> Self {
        Self {
            heads,
            n_heads,
            device: device.clone(),
            cache: LengthCache::default(),
        }
    }

    /// (H|1, T, T) tabulated from the formulas.
    fn table(&self, t: usize) -> Result<Tensor> {
        let mut row = vec![0f64; t];
        let mut data = Vec::with_capacity(self.heads.len() * t);
        for head in &self.heads {
            head.fill(&mut row);
            data.extend(row.iter().map(|&p| p as f32));
        }
        let per_distance = Tensor::from_vec(data, (self.heads.len(), t), &self.device)?;
        toeplitz(&per_distance, &distance_index(t, &self.device)?)
    }
}

impl Encoding for FixedBias {
    fn logit_bias(&self, t: usize) -> Result<Option<Tensor>> {
        Ok(Some(self.cache.get_or(t, || self.table(t))?))
    }

    fn distance_biases(&self) -> Result<Option<Vec<Arc<dyn DistanceBias>>>> {
        Ok(Some(per_head(&self.heads, self.n_heads)))
    }
}

/// `heads` as exactly `n_heads` entries (a shared entry is repeated).
pub(crate) fn per_head(
    heads: &[Arc<dyn DistanceBias>],
    n_heads: usize,
) -> Vec<Arc<dyn DistanceBias>> {
    if heads.len() == n_heads {
        heads.to_vec()
    } else {
        (0..n_heads)
            .map(|h| heads[h % heads.len()].clone())
            .collect()
    }
}

/// A relative bias with trainable parameters (Kerple, T5, DIET-REL).
pub trait LearnedDistance: Send + Sync {
    /// The bias at distances 0..t for every head, (H, t), differentiable in the parameters.
    fn per_distance(&self, t: usize) -> Result<Tensor>;
    /// The bias of each head as plain numbers, with the parameters' current values.
    fn current(&self) -> Result<Vec<Arc<dyn DistanceBias>>>;
}

/// Turns a [`LearnedDistance`] into an encoding.
pub struct LearnedBias<L> {
    inner: L,
    device: Device,
    indices: LengthCache,
}

impl<L: LearnedDistance + 'static> LearnedBias<L> {
    pub fn new(inner: L, device: &Device) -> Self {
        Self {
            inner,
            device: device.clone(),
            indices: LengthCache::default(),
        }
    }

    /// The encoding for a just-built `inner`, behind an `Arc` as models hold it.
    pub fn shared(device: &Device, inner: Result<L>) -> Result<Arc<dyn Encoding>> {
        Ok(Arc::new(Self::new(inner?, device)))
    }
}

impl<L: LearnedDistance> Encoding for LearnedBias<L> {
    fn logit_bias(&self, t: usize) -> Result<Option<Tensor>> {
        let index = self.indices.get_or(t, || distance_index(t, &self.device))?;
        Ok(Some(toeplitz(&self.inner.per_distance(t)?, &index)?))
    }

    fn distance_biases(&self) -> Result<Option<Vec<Arc<dyn DistanceBias>>>> {
        Ok(Some(self.inner.current()?))
    }
}

/// The values of a trained (H, 1) or (H,) parameter, one per head.
pub(crate) fn head_values(param: &Tensor) -> Result<Vec<f64>> {
    Ok(param
        .flatten_all()?
        .to_vec1::<f32>()?
        .into_iter()
        .map(f64::from)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toeplitz_puts_distance_values_on_diagonals() {
        let v = Tensor::new(&[[0f32, 1.0, 2.0]], &Device::Cpu).unwrap();
        let m = toeplitz(&v, &distance_index(3, &Device::Cpu).unwrap())
            .unwrap()
            .to_vec3::<f32>()
            .unwrap();
        assert_eq!(m[0][2], vec![2.0, 1.0, 0.0]);
        assert_eq!(m[0][1][0], 1.0);
        assert_eq!(m[0][0][2], 0.0);
    }

    #[test]
    fn fixed_bias_tabulates_each_head() {
        let heads: Vec<Arc<dyn DistanceBias>> =
            vec![Arc::new(|t: f64| -t), Arc::new(|t: f64| -2.0 * t)];
        let bias = FixedBias::new(heads, 2, &Device::Cpu);
        let m = bias
            .logit_bias(3)
            .unwrap()
            .unwrap()
            .to_vec3::<f32>()
            .unwrap();
        assert_eq!(m[0][2], vec![-2.0, -1.0, 0.0]);
        assert_eq!(m[1][2], vec![-4.0, -2.0, 0.0]);
    }
}
