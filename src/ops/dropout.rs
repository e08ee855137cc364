//! Dropout whose mask is a function of (seed, element index): the same seed drops the same
//! elements on the CPU and on a GPU, in any thread order, so a run stays reproducible. On the CPU
//! the forward pass keeps the mask as a byte per element for the backward pass (hashing again
//! cost more than reading it); on a GPU the backward pass hashes again. candle's own dropout
//! draws from an unseeded generator on the CPU.
//!
//! Element i is kept when the top 32 bits of `mix(key ^ i)` are at least p·2³², key = mix(seed)
//! (SplitMix64's finaliser); kept elements are scaled by 1/(1 − p), so the expectation is x.
//! Replicas (R models stacked along the first dimension) give one seed each: replica r's block
//! of elements is masked with its own key and its own indices from 0, exactly as its lone model
//! would be.

use std::sync::{Arc, OnceLock};

use candle_core::{CpuStorage, CustomOp1, Tensor};
use rayon::prelude::*;

use super::fused::{slice, zeros};
use crate::Result;

/// SplitMix64's output function: a bijection of u64 with good avalanche.
#[inline(always)]
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// x with each element zeroed with probability `p` (the rest scaled by 1/(1 − p)), the mask a
/// function of the seeds: one per replica, each masking its equal block of x. `p = 0` returns x
/// itself.
pub fn dropout(x: &Tensor, p: f64, seeds: &[u64]) -> Result<Tensor> {
    if p <= 0.0 {
        return Ok(x.clone());
    }
    let op = Dropout::new(p, seeds, x.elem_count());
    if super::fusable(x) {
        return Ok(x.contiguous()?.apply_op1(op)?);
    }
    dropout_composed(x, &op)
}

/// [`dropout`] as a mask tensor built on the host (any device and dtype; the reference).
fn dropout_composed(x: &Tensor, op: &Dropout) -> Result<Tensor> {
    let mask: Vec<f32> = (0..x.elem_count()).map(|i| op.factor(i)).collect();
    let mask = Tensor::from_vec(mask, x.shape(), x.device())?.to_dtype(x.dtype())?;
    Ok((x * mask)?)
}

#[derive(Clone)]
pub(super) struct Dropout {
    /// Elements whose hash is below this are dropped (p·2³²).
    threshold: u32,
    scale: f32,
    /// One key per replica.
    keys: Vec<u64>,
    /// Elements per replica.
    block: usize,
    /// The CPU forward pass's mask (1 = kept), for the backward pass: reading a byte per
    /// element instead of hashing again took the hash's half of the backward away.
    kept: Arc<OnceLock<Vec<u8>>>,
}

impl Dropout {
    /// The mask of a tensor of `elements` elements, `seeds` one per replica's equal block.
    pub(super) fn new(p: f64, seeds: &[u64], elements: usize) -> Self {
        Self {
            threshold: (p.clamp(0.0, 1.0) * 4_294_967_296.0).min(u32::MAX as f64) as u32,
            scale: (1.0 / (1.0 - p)) as f32,
            keys: seeds.iter().map(|&s| mix(s)).collect(),
            block: (elements / seeds.len().max(1)).max(1),
            kept: Arc::default(),
        }
    }

    /// 0 for a dropped element, 1/(1 − p) for a kept one.
    fn factor(&self, i: usize) -> f32 {
        self.factor_in(self.key_of(i / self.block), i % self.block)
    }

    /// The key of replica `r` (the last one's past the end, as a partial last block has).
    fn key_of(&self, r: usize) -> u64 {
        self.keys[r.min(self.keys.len() - 1)]
    }

    /// [`Self::factor`] of the element at `offset` in the block of `key`.
    #[inline(always)]
    fn factor_in(&self, key: u64, offset: usize) -> f32 {
        let hash = (mix(key ^ offset as u64) >> 32) as u32;
        if hash >= self.threshold {
            self.scale
        } else {
            0.0
        }
    }

    /// `row[i] *= factor(start + i)` and `kept[i]` whether it is kept, for a row that lies
    /// within one replica's block (a row of attention weights: the blocks are whole rows).
    pub(super) fn scale_row(&self, start: usize, row: &mut [f32], kept: &mut [u8]) {
        let key = self.key_of(start / self.block);
        let offset = start % self.block;
        super::vectorised(
            #[inline(always)]
            || {
                for (i, (x, kept)) in row.iter_mut().zip(kept).enumerate() {
                    let factor = self.factor_in(key, offset + i);
                    *x *= factor;
                    *kept = u8::from(factor != 0.0);
                }
            },
        );
    }

    /// `row[i] *= factor` of the mask [`Self::scale_row`] recorded in `kept`: the backward
    /// pass reads a byte per element instead of hashing again.
    pub(super) fn scale_kept(&self, row: &mut [f32], kept: &[u8]) {
        for (x, k) in row.iter_mut().zip(kept) {
            *x *= f32::from(*k) * self.scale;
        }
    }

    /// `out[i] = x[i] · factor(start + i)` and `kept[i]` whether it is kept, one replica's
    /// block at a time (a 64-bit division per element took a third of the dropout's time, and
    /// a block check per element kept the loop from vectorising).
    fn apply(&self, start: usize, x: &[f32], out: &mut [f32], kept: &mut [u8]) {
        let mut done = 0;
        while done < x.len() {
            let (r, offset) = ((start + done) / self.block, (start + done) % self.block);
            let n = (self.block - offset).min(x.len() - done);
            let (key, span) = (self.key_of(r), done..done + n);
            let (x, out, kept) = (&x[span.clone()], &mut out[span.clone()], &mut kept[span]);
            super::vectorised(
                #[inline(always)]
                || self.apply_from(key, offset, x, out, kept),
            );
            done += n;
        }
    }

    /// [`Self::apply`] within the block of `key`, from `offset`.
    #[inline(always)]
    fn apply_from(&self, key: u64, offset: usize, x: &[f32], out: &mut [f32], kept: &mut [u8]) {
        for (i, ((o, x), kept)) in out.iter_mut().zip(x).zip(kept).enumerate() {
            let factor = self.factor_in(key, offset + i);
            *o = x * factor;
            *kept = u8::from(factor != 0.0);
        }
    }
}

/// Elements per parallel task.
const CHUNK: usize = 4096;

impl CustomOp1 for Dropout {
    fn name(&self) -> &'static str {
        "attnlab-dropout"
    }

    cpu_fwd!(self, |storage, layout| {
        let x = slice(storage, layout)?;
        let mut out = zeros(x.len());
        let mut kept = vec![0u8; x.len()];
        out.par_chunks_mut(CHUNK)
            .zip(x.par_chunks(CHUNK))
            .zip(kept.par_chunks_mut(CHUNK))
            .enumerate()
            .for_each(|(chunk, ((o, x), k))| self.apply(chunk * CHUNK, x, o, k));
        // Applied once per op; a second forward (none is made) would keep the first mask, the same.
        let _ = self.kept.set(kept);
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    });

    cuda_fwd!(self, |storage, layout| {
        super::cuda::dropout(
            storage,
            layout,
            (self.threshold, self.scale),
            &self.keys,
            self.block,
        )
    });

    /// The same mask on the gradient: the forward pass's bytes on the CPU, hashed again on a GPU.
    fn bwd(&self, _x: &Tensor, _y: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let grad = grad.contiguous()?;
        match self.kept.get() {
            Some(kept) if grad.device().is_cpu() && kept.len() == grad.elem_count() => {
                let masked = Masked {
                    kept: self.kept.clone(),
                    scale: self.scale,
                };
                Ok(Some(grad.apply_op1_no_bwd(&masked)?))
            }
            _ => Ok(Some(grad.apply_op1_no_bwd(self)?)),
        }
    }
}

/// x ⊙ a stored dropout mask (kept elements scaled by 1/(1 − p)): the backward pass on the CPU.
struct Masked {
    kept: Arc<OnceLock<Vec<u8>>>,
    scale: f32,
}

impl CustomOp1 for Masked {
    fn name(&self) -> &'static str {
        "attnlab-dropout-masked"
    }

    cpu_fwd!(self, |storage, layout| {
        let x = slice(storage, layout)?;
        let Some(kept) = self.kept.get().filter(|k| k.len() == x.len()) else {
            candle_core::bail!("dropout's backward pass has no mask of {} entries", x.len());
        };
        let mut out = zeros(x.len());
        out.par_chunks_mut(CHUNK)
            .zip(x.par_chunks(CHUNK).zip(kept.par_chunks(CHUNK)))
            .for_each(|(o, (x, k))| {
                for ((o, x), k) in o.iter_mut().zip(x).zip(k) {
                    *o = x * f32::from(*k) * self.scale;
                }
            });
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};

    #[test]
    fn dropout_keeps_the_expectation_and_repeats_with_its_seed() {
        let x =
            Var::from_tensor(&Tensor::ones(100_000, DType::F32, &Device::Cpu).unwrap()).unwrap();
        let y = dropout(x.as_tensor(), 0.1, &[7]).unwrap();
        let values = y.to_vec1::<f32>().unwrap();
        let dropped = values.iter().filter(|v| **v == 0.0).count() as f64 / values.len() as f64;
        assert!((dropped - 0.1).abs() < 0.005, "dropped {dropped}");
        let mean = values.iter().sum::<f32>() / values.len() as f32;
        assert!((mean - 1.0).abs() < 0.01, "mean {mean}");
        assert_eq!(
            dropout(x.as_tensor(), 0.1, &[7])
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
            values
        );
        assert_ne!(
            dropout(x.as_tensor(), 0.1, &[8])
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
            values
        );
        // The composed reference drops the same elements.
        let composed = dropout_composed(x.as_tensor(), &Dropout::new(0.1, &[7], 100_000)).unwrap();
        assert_eq!(composed.to_vec1::<f32>().unwrap(), values);
        // The gradient goes through the same mask.
        let grads = y.sum_all().unwrap().backward().unwrap();
        assert_eq!(
            grads.get(x.as_tensor()).unwrap().to_vec1::<f32>().unwrap(),
            values
        );
        assert_eq!(
            dropout(x.as_tensor(), 0.0, &[7]).unwrap().id(),
            x.as_tensor().id()
        );
    }
}
