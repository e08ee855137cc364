//! Token embedding as one op with its own backward: the rows of the (vocab, d) weight at the
//! ids, and a gradient that sums each token's row into its id's row.
//!
//! candle's backward for `index_select` zero-fills the whole (vocab, d) gradient and runs
//! `index_add`, whose CUDA kernel is launched as a single block that walks every id in turn
//! (33 ms of a 260 ms step on an H100 at d_model 512 and 64k tokens). Here the CPU groups the
//! tokens by id ([`tokens_by_id`]) and sums each id's rows in token order, [`SEGMENT`] tokens
//! at a time, then the segments' sums in order; the GPU takes the same index and sums in the
//! same order, a block per segment and then a block per id. Both give the same bits every run
//! (atomic adds on the GPU would not: a resumed run could drift). Segments keep a frequent id
//! from being one long serial sum: MQAR's filler token is most of a batch, and summed row by row
//! it took 8 ms of a 35 ms step on an H200.

use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::fused::{indices, last_dim, slice, zeros};
use crate::Result;

/// weight (vocab, d), ids (…) u32 → (…, d).
pub fn embedding(weight: &Tensor, ids: &Tensor) -> Result<Tensor> {
    if !super::fusable(weight) {
        return embedding_composed(weight, ids);
    }
    let (vocab, d) = weight.dims2()?;
    let mut dims = ids.dims().to_vec();
    let rows = weight
        .contiguous()?
        .apply_op2(&ids.flatten_all()?.contiguous()?, Embed { vocab })?;
    dims.push(d);
    Ok(rows.reshape(dims)?)
}

/// [`embedding`] from candle's `index_select` (the reference).
pub fn embedding_composed(weight: &Tensor, ids: &Tensor) -> Result<Tensor> {
    let mut dims = ids.dims().to_vec();
    dims.push(weight.dim(1)?);
    Ok(weight.index_select(&ids.flatten_all()?, 0)?.reshape(dims)?)
}

/// The u32 ids of a CPU storage, each checked against the vocabulary.
fn ids_of<'a>(
    storage: &'a CpuStorage,
    layout: &Layout,
    vocab: usize,
) -> candle_core::Result<&'a [u32]> {
    indices(storage, layout, vocab, |bad| {
        format!("token id {bad} is outside the vocabulary of {vocab}")
    })
}

/// (weight, ids) → weight[ids].
struct Embed {
    vocab: usize,
}

impl CustomOp2 for Embed {
    fn name(&self) -> &'static str {
        "attnlab-embedding"
    }

    cpu_fwd!(self, |s1, l1, s2, l2| {
        let weight = slice(s1, l1)?;
        let ids = ids_of(s2, l2, self.vocab)?;
        let d = last_dim(l1);
        let mut out = zeros(ids.len() * d);
        out.par_chunks_mut(d).zip(ids).for_each(|(row, &id)| {
            let id = id as usize;
            row.copy_from_slice(&weight[id * d..(id + 1) * d]);
        });
        Ok((CpuStorage::F32(out), Shape::from((ids.len(), d))))
    });

    cuda_fwd!(self, |s1, l1, s2, l2| {
        super::cuda::embedding((s1, l1), (s2, l2))
    });

    fn bwd(
        &self,
        _weight: &Tensor,
        ids: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let dw = grad.apply_op2_no_bwd(ids, &EmbedGrad { vocab: self.vocab })?;
        Ok((Some(dw), None))
    }
}

/// (dy (n, d), ids (n)) → dW (vocab, d), dW[v] = Σ_{i: ids[i] = v} dy[i].
struct EmbedGrad {
    vocab: usize,
}

impl CustomOp2 for EmbedGrad {
    fn name(&self) -> &'static str {
        "attnlab-embedding-grad"
    }

    cpu_fwd!(self, |s1, l1, s2, l2| {
        let dy = slice(s1, l1)?;
        let ids = ids_of(s2, l2, self.vocab)?;
        let d = last_dim(l1);
        let (offsets, order) = tokens_by_id(ids, self.vocab);
        let mut dw = zeros(self.vocab * d);
        dw.par_chunks_mut(d).enumerate().for_each(|(id, row)| {
            let tokens = &order[offsets[id] as usize..offsets[id + 1] as usize];
            let mut partial = vec![0f32; d];
            for segment in tokens.chunks(SEGMENT) {
                partial.fill(0.0);
                for &i in segment {
                    let i = i as usize;
                    partial
                        .iter_mut()
                        .zip(&dy[i * d..(i + 1) * d])
                        .for_each(|(p, g)| *p += g);
                }
                row.iter_mut().zip(&partial).for_each(|(w, p)| *w += p);
            }
        });
        Ok((CpuStorage::F32(dw), Shape::from((self.vocab, d))))
    });

    cuda_fwd!(self, |s1, l1, s2, l2| {
        super::cuda::embedding_grad((s1, l1), (s2, l2), self.vocab)
    });
}

/// Tokens per partial sum of an id's gradient row (see the module docs): about the square root
/// of a batch's tokens, so that neither the segments nor the sum of their partials is long.
pub(super) const SEGMENT: usize = 256;

/// Each id's tokens in token order, as (offsets, order): id v's tokens are
/// `order[offsets[v]..offsets[v + 1]]`. The CPU sums each row of the gradient in that order, and
/// so does the GPU, which takes the two lists as they are: a run's gradient is the same every
/// time. Ids past the vocabulary are left out (the CPU refuses them first; on the GPU their
/// forward rows are zeros).
pub(super) fn tokens_by_id(ids: &[u32], vocab: usize) -> (Vec<u32>, Vec<u32>) {
    let mut offsets = vec![0u32; vocab + 1];
    for &id in ids.iter().filter(|&&id| (id as usize) < vocab) {
        offsets[id as usize + 1] += 1;
    }
    for v in 0..vocab {
        offsets[v + 1] += offsets[v];
    }
    let mut next = offsets.clone();
    let mut order = vec![0u32; offsets[vocab] as usize];
    for (token, &id) in ids.iter().enumerate() {
        let id = id as usize;
        if id < vocab {
            order[next[id] as usize] = token as u32;
            next[id] += 1;
        }
    }
    (offsets, order)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::value_and_grads;
    use candle_core::{DType, Device, Var};

    #[test]
    fn embedding_matches_index_select_in_value_and_gradient() {
        let data = crate::rng::normal_vec(&mut crate::rng::stream(3, "embedding"), 7 * 5, 1.0);
        let weight =
            Var::from_tensor(&Tensor::from_vec(data, (7, 5), &Device::Cpu).unwrap()).unwrap();
        let ids = Tensor::new(&[[1u32, 6, 1], [0, 1, 3]], &Device::Cpu).unwrap();
        let upstream = Tensor::arange(0f32, 30.0, &Device::Cpu)
            .unwrap()
            .reshape((2, 3, 5))
            .unwrap();
        let run = |f: fn(&Tensor, &Tensor) -> Result<Tensor>| {
            let y = f(weight.as_tensor(), &ids).unwrap();
            assert_eq!(y.dims(), &[2, 3, 5]);
            let [y, grad] =
                <[Vec<f32>; 2]>::try_from(value_and_grads(&y, &upstream, &[&weight])).unwrap();
            (y, grad)
        };
        let (fused, composed) = (run(embedding), run(embedding_composed));
        assert_eq!(fused, composed);
        // Id 1 is at flat positions 0, 2 and 4: its gradient sums those upstream rows.
        let want: Vec<f32> = (0..5).map(|c| (c + (10 + c) + (20 + c)) as f32).collect();
        assert_eq!(fused.1[5..10], want);
    }

    /// An id with more tokens than a segment sums them a segment at a time: the same as
    /// index_add's gradient to float tolerance.
    #[test]
    fn a_frequent_ids_gradient_sums_its_segments() {
        let weight =
            Var::from_tensor(&Tensor::zeros((3, 4), DType::F32, &Device::Cpu).unwrap()).unwrap();
        let n = 2 * SEGMENT + 7;
        let ids: Vec<u32> = (0..n as u32).map(|i| u32::from(i % 9 != 0)).collect();
        let ids = Tensor::new(ids.as_slice(), &Device::Cpu).unwrap();
        let data = crate::rng::normal_vec(&mut crate::rng::stream(5, "embedding"), 4 * n, 1.0);
        let upstream = Tensor::from_vec(data, (n, 4), &Device::Cpu).unwrap();
        let grad = |f: fn(&Tensor, &Tensor) -> Result<Tensor>| {
            let y = f(weight.as_tensor(), &ids).unwrap();
            crate::ops::testing::value_and_grads(&y, &upstream, &[&weight]).swap_remove(1)
        };
        let (fused, composed) = (grad(embedding), grad(embedding_composed));
        for (a, b) in fused.iter().zip(&composed) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
        assert!(fused[4..8].iter().all(|g| *g != 0.0) && fused[8..].iter().all(|g| *g == 0.0));
    }

    #[test]
    fn tokens_by_id_lists_each_ids_tokens_in_order_and_drops_ids_past_the_vocabulary() {
        let (offsets, order) = tokens_by_id(&[2, 0, 2, 9, 3, 2], 4);
        assert_eq!(offsets, [0, 1, 1, 4, 5]);
        assert_eq!(order, [1, 0, 2, 5, 4]);
        assert_eq!(tokens_by_id(&[], 2), (vec![0, 0, 0], vec![]));
    }

    #[test]
    fn an_id_outside_the_vocabulary_is_an_error() {
        let weight = Tensor::zeros((4, 2), candle_core::DType::F32, &Device::Cpu).unwrap();
        let ids = Tensor::new(&[4u32], &Device::Cpu).unwrap();
        let error = embedding(&weight, &ids).unwrap_err().to_string();
        assert!(
            error.contains("token id 4 is outside the vocabulary of 4"),
            "{error}"
        );
    }
}
