//! Relative biases b_h(i − j): the machinery shared by every encoding whose logit term depends
//! only on how far back the key is. Fixed formulas are tabulated once per length on the CPU;
//! learned ones compute their per-distance row with differentiable ops on every forward pass
//! and spread it into the (T, T) Toeplitz matrix with `index_select`, which has a backward.

use std::sync::Arc;

use candle_core::{Device, Tensor};

use super::{DistanceBias, Encoding, EncodingShape, LengthCache, QueryBlock};
use crate::Result;

/// Per-distance values (…, H, ≥ keys) → (…, H, len, keys) with entry [h, r, j] = v[h, i − j]
/// for query i = start + r and key j ≤ i: the whole Toeplitz matrix for [`QueryBlock::whole`].
/// Entries above the diagonal repeat v[h, 0]; every mechanism masks them. A leading replica
/// dimension (R, H, …) carries through.
pub(crate) fn toeplitz(per_distance: &Tensor, index: &Tensor, block: QueryBlock) -> Result<Tensor> {
    let last = per_distance.rank() - 1;
    let mut dims = per_distance.dims()[..last].to_vec();
    dims.extend([block.len, block.keys()]);
    Ok(per_distance.index_select(index, last)?.reshape(dims)?)
}

/// The flat (len·keys) gather index of [`toeplitz`]: i − j below the diagonal, 0 above it.
pub(crate) fn distance_index(block: QueryBlock, device: &Device) -> Result<Tensor> {
    let keys = block.keys();
    let index: Vec<u32> = (0..block.len * keys)
        .map(|rj| (block.start + rj / keys).saturating_sub(rj % keys) as u32)
        .collect();
    Ok(Tensor::from_vec(index, block.len * keys, device)?)
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
    /// Per-distance rows (H, T) per sequence length, for blocks.
    rows: LengthCache,
}

impl FixedBias {
    pub fn new(heads: Vec<Arc<dyn DistanceBias>>, n_heads: usize, device: &Device) -> Self {
        Self {
            heads,
            n_heads,
            device: device.clone(),
            cache: LengthCache::default(),
            rows: LengthCache::default(),
        }
    }

    /// (H|1, T) per-distance values at distances 0..t, from the formulas.
    fn per_distance(&self, t: usize) -> Result<Tensor> {
        let mut row = vec![0f64; t];
        let mut data = Vec::with_capacity(self.heads.len() * t);
        for head in &self.heads {
            head.fill(&mut row);
            data.extend(row.iter().map(|&p| p as f32));
        }
        Ok(Tensor::from_vec(data, (self.heads.len(), t), &self.device)?)
    }

    /// The bias rows of `block`, (H|1, len, keys).
    fn block_table(&self, block: QueryBlock) -> Result<Tensor> {
        let per_distance = self
            .rows
            .get_or(block.total, || self.per_distance(block.total))?;
        toeplitz(&per_distance, &distance_index(block, &self.device)?, block)
    }
}

/// The fixed bias of `heads` (one shared by every head, or one per head) as the encoding of a
/// model of `shape`.
pub(crate) fn fixed(
    heads: Vec<Arc<dyn DistanceBias>>,
    shape: &EncodingShape,
    device: &Device,
) -> Result<Arc<dyn Encoding>> {
    Ok(Arc::new(FixedBias::new(heads, shape.n_heads, device)))
}

impl Encoding for FixedBias {
    fn has_logit_bias(&self) -> bool {
        true
    }

    fn logit_bias(&self, t: usize) -> Result<Option<Tensor>> {
        let whole = QueryBlock::whole(t);
        Ok(Some(self.cache.get_or(t, || self.block_table(whole))?))
    }

    fn block_bias(&self, block: QueryBlock) -> Result<Option<Tensor>> {
        Ok(Some(self.block_table(block)?))
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
    fn has_logit_bias(&self) -> bool {
        true
    }

    fn logit_bias(&self, t: usize) -> Result<Option<Tensor>> {
        let whole = QueryBlock::whole(t);
        let index = self
            .indices
            .get_or(t, || distance_index(whole, &self.device))?;
        Ok(Some(toeplitz(&self.inner.per_distance(t)?, &index, whole)?))
    }

    fn block_bias(&self, block: QueryBlock) -> Result<Option<Tensor>> {
        let index = distance_index(block, &self.device)?;
        let per_distance = self.inner.per_distance(block.keys())?;
        Ok(Some(toeplitz(&per_distance, &index, block)?))
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
        let whole = QueryBlock::whole(3);
        let m = toeplitz(&v, &distance_index(whole, &Device::Cpu).unwrap(), whole)
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
