//! What the recurrent mixers (retention, GLA, DeltaNet) share: each has an explicit form, the
//! signed matrix of its hidden attention for a block of queries (what the views show), and a
//! chunked form that never holds more than a chunk's weights (what trains and evaluates long
//! sequences). [`forms!`] writes a mixer's `Mechanism` methods from those two; the tests share
//! the check that the recurrence, the explicit form and the chunked form agree.

use candle_core::Tensor;

use crate::Result;
use crate::encodings::{Encoding, QueryBlock};
use crate::ops::{Combine, add_bias_replicas, affine_replicas, with_bias};
use crate::params::{Init, Params};

/// Mamba-2's decay per head, which Gated DeltaNet shares: dt = softplus(raw + dt_bias) and the
/// log-decay g = −exp(A_log)·dt of each step, A = exp(A_log) uniform in a range (Mamba-2:
/// (1, 16); FLA's Gated DeltaNet: (0, 16)) and softplus(dt_bias) log-uniform in [1e-3, 0.1] at
/// init (`mamba2.py`, FLA's `gated_deltanet.py`).
#[derive(Clone)]
pub(super) struct Decay {
    /// (H), or (R, H) for replicas.
    a_log: Tensor,
    dt_bias: Tensor,
}

impl Decay {
    pub(super) fn new(heads: usize, (lo, hi): (f64, f64), params: &Params) -> Result<Self> {
        Ok(Self {
            a_log: params.get("A_log", heads, Init::LogOfUniform(lo, hi))?,
            dt_bias: params.get("dt_bias", heads, Init::InverseSoftplusLogUniform(1e-3, 0.1))?,
        })
    }

    /// (dt, g), each (B, H, T, 1), from the raw inputs (B, T, H).
    pub(super) fn of(&self, raw: &Tensor) -> Result<(Tensor, Tensor)> {
        let (batch, t, h) = raw.dims3()?;
        // A replica's (R, H) row acts on its block of rows; a lone model's is one row.
        let row = |p: &Tensor| match p.rank() {
            1 => p.unsqueeze(0),
            _ => Ok(p.clone()),
        };
        let rows = raw.reshape((batch * t, h))?;
        let dt = softplus(&add_bias_replicas(&rows, &row(&self.dt_bias)?)?)?;
        let g = affine_replicas(&dt, &row(&self.a_log.exp()?.neg()?)?, None)?;
        let per_head = |x: Tensor| heads_first(&x.reshape((batch, t, h))?);
        Ok((per_head(dt)?, per_head(g)?))
    }
}

/// (B, T, H) per-token values per head → (B, H, T, 1).
pub(super) fn heads_first(x: &Tensor) -> Result<Tensor> {
    Ok(x.transpose(1, 2)?.contiguous()?.unsqueeze(3)?)
}

/// A per-head parameter, (H) or (R, H) for replicas, as (batch, H, 1, 1): each replica's row
/// for its block of the batch.
pub(super) fn per_head(p: &Tensor, batch: usize) -> Result<Tensor> {
    if p.rank() == 1 {
        return Ok(p.reshape((1, p.dim(0)?, 1, 1))?);
    }
    let (r, h) = p.dims2()?;
    let rows = p.reshape((r, 1, h))?.broadcast_as((r, batch / r, h))?;
    Ok(rows.contiguous()?.reshape((batch, h, 1, 1))?)
}

/// The block's scores by `read` (q, k → (B, H, len, keys)) after the encoding has positioned
/// q and k, times exp(b) where it has a bias `bias`: the mixers' convention, as the kernel
/// mechanisms', that a bias is a log-weight.
pub(super) fn read_scores(
    q: &Tensor,
    k: &Tensor,
    pos: &dyn Encoding,
    block: QueryBlock,
    bias: Option<Tensor>,
    read: &dyn Fn(&Tensor, &Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let scores = pos.block_scores(q, k, block, read)?;
    match bias {
        Some(bias) => with_bias(&scores, &bias.exp()?, Combine::Mul),
        None => Ok(scores),
    }
}

/// q and k as the chunked forms take them: positioned by the encoding; `None` where it adds
/// a bias or does not act on q and k alone (ReRoPE), which take the explicit form.
pub(super) fn positioned_for_chunks(
    q: &Tensor,
    k: &Tensor,
    pos: &dyn Encoding,
) -> Result<Option<(Tensor, Tensor)>> {
    match pos.has_logit_bias() {
        true => Ok(None),
        false => pos.positioned(q, k),
    }
}

/// A chunked form's (B, H, T, Dh) outputs with the heads side by side, (B, T, H·Dh), as
/// `Mechanism::fused_output` returns them.
pub(super) fn heads_side_by_side(y: Option<Tensor>) -> Result<Option<Tensor>> {
    let Some(y) = y else { return Ok(None) };
    let (b, h, t, dh) = y.dims4()?;
    Ok(Some(y.transpose(1, 2)?.reshape((b, t, h * dh))?))
}

/// softplus(x) = ln(1 + eˣ), as relu(x) + ln(1 + e^(−|x|)) so that it never overflows.
pub(super) fn softplus(x: &Tensor) -> Result<Tensor> {
    let tail = (x.abs()?.neg()?.exp()? + 1.0)?.log()?;
    Ok((x.relu()? + tail)?)
}

/// `attend`, `attend_block`, `fused_output` and `output_blocks` of a mixer from its inherent
/// `attention(q, k, v, pos, block, bias)` (the explicit form of a block of queries) and
/// `chunked_output(q, k, v, pos)` (the chunked form, `None` where the encoding needs the
/// explicit one); the mixers have no weight dropout. Used inside `impl Mechanism for …`.
macro_rules! forms {
    () => {
        fn attend(
            &self,
            q: &Tensor,
            k: &Tensor,
            v: &Tensor,
            pos: &dyn Encoding,
        ) -> Result<Attention> {
            let t = q.dim(2)?;
            self.attention(q, k, v, pos, QueryBlock::whole(t), pos.logit_bias(t)?)
        }

        fn attend_block(
            &self,
            q: &Tensor,
            k: &Tensor,
            v: &Tensor,
            pos: &dyn Encoding,
            block: QueryBlock,
        ) -> Result<Attention> {
            self.attention(q, k, v, pos, block, pos.block_bias(block)?)
        }

        fn fused_output(
            &self,
            q: &Tensor,
            k: &Tensor,
            v: &Tensor,
            pos: &dyn Encoding,
            _dropout: Option<crate::ops::WeightDropout>,
        ) -> Result<Option<Tensor>> {
            super::recurrent::heads_side_by_side(self.chunked_output(q, k, v, pos)?)
        }

        fn output_blocks(
            &self,
            q: &Tensor,
            k: &Tensor,
            v: &Tensor,
            pos: &dyn Encoding,
            chunk: usize,
        ) -> Result<Tensor> {
            match self.chunked_output(q, k, v, pos)? {
                Some(output) => Ok(output),
                None => super::blockwise_output(self, q, k, v, pos, chunk),
            }
        }
    };
}
pub(super) use forms;

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn softplus_is_stable_and_exact() {
        let x = Tensor::new(&[-200f32, -1.0, 0.0, 3.0, 200.0], &Device::Cpu).unwrap();
        let y = softplus(&x).unwrap().to_vec1::<f32>().unwrap();
        let exact = [0.0, 0.313_261_7, std::f32::consts::LN_2, 3.048_587_4, 200.0];
        for (y, e) in y.iter().zip(exact) {
            assert!((y - e).abs() < 1e-5, "{y} against {e}");
        }
    }

    /// A replica's parameter row reaches its own block of the batch.
    #[test]
    fn per_head_parameters_follow_the_replicas() {
        let p = Tensor::new(&[[1f32, 2.0], [3.0, 4.0]], &Device::Cpu).unwrap();
        let rows = per_head(&p, 4).unwrap().flatten_all().unwrap();
        assert_eq!(
            rows.to_vec1::<f32>().unwrap(),
            [1.0, 2.0, 1.0, 2.0, 3.0, 4.0, 3.0, 4.0]
        );
    }
}

#[cfg(test)]
pub(super) mod testing {
    use std::sync::Arc;

    use candle_core::{Device, Tensor, Var};

    use crate::attention::{Mechanism, MechanismShape};
    use crate::encodings::{Encoding, EncodingShape, EncodingSpec, QueryBlock};
    use crate::ops::Precision;
    use crate::ops::testing::{max_diff, random, value_and_grads};
    use crate::params::Params;

    /// A layer of `n_heads` heads of 4 query/key and 3 value channels.
    pub fn shape(n_heads: usize) -> MechanismShape {
        MechanismShape {
            n_heads,
            qk_dim: 4,
            head_dim: 3,
            max_len: 32,
            precision: Precision::F32,
        }
    }

    /// RoPE for 2 heads of 4 query/key channels.
    pub fn rope() -> Arc<dyn Encoding> {
        let shape = EncodingShape {
            d_model: 6,
            n_heads: 2,
            qk_dim: 4,
            max_len: 32,
            embedding_std: 1.0,
        };
        EncodingSpec::Rope(Default::default())
            .build(&shape, &Params::new(0, &Device::Cpu))
            .unwrap()
    }

    /// Random q, k (2, 2, t, 4) and v (2, 2, t, 3), as variables.
    pub fn heads(t: usize, what: &str) -> [Var; 3] {
        let var = |d, seed| Var::from_tensor(&random(&[2, 2, t, d], seed, what)).unwrap();
        [var(4, 1), var(4, 2), var(3, 3)]
    }

    /// Asserts that the explicit matrix times the values and the chunked form (as
    /// `fused_output` gives it) equal `recurrent`, in value and in the gradients of `vars`
    /// (within 1e-3 relative), for q, k, v the first three of `vars`.
    pub fn assert_forms_agree(
        mechanism: &dyn Mechanism,
        pos: &dyn Encoding,
        vars: &[&Var],
        recurrent: &Tensor,
        what: &str,
    ) {
        let (q, k, v) = (
            vars[0].as_tensor(),
            vars[1].as_tensor(),
            vars[2].as_tensor(),
        );
        let explicit = mechanism.attend(q, k, v, pos).unwrap();
        let explicit = explicit.weights.matmul(&explicit.values).unwrap();
        let (b, h, t, dh) = v.dims4().unwrap();
        let chunked = mechanism.fused_output(q, k, v, pos, None).unwrap().unwrap();
        let chunked = chunked
            .reshape((b, t, h, dh))
            .unwrap()
            .transpose(1, 2)
            .unwrap();
        assert!(max_diff(&explicit, recurrent) < 1e-4, "explicit, {what}");
        assert!(max_diff(&chunked, recurrent) < 1e-4, "chunked, {what}");
        let upstream = random(&[b, h, t, dh], 5, "upstream");
        let grads = |y: &Tensor| value_and_grads(y, &upstream, vars);
        let (a, b, c) = (grads(&explicit), grads(&chunked), grads(recurrent));
        for ((a, b), c) in a.iter().zip(&b).zip(&c) {
            for ((a, b), c) in a.iter().zip(b).zip(c) {
                let tolerance = 1e-3 * c.abs().max(1.0);
                assert!(
                    (a - c).abs() < tolerance && (b - c).abs() < tolerance,
                    "{what}: {a} {b} against {c}"
                );
            }
        }
    }

    /// Asserts that queries 4..7 of 9 as a block give those rows of the whole matrix.
    pub fn assert_blocks_give_rows(mechanism: &dyn Mechanism, pos: &dyn Encoding, what: &str) {
        let (q, k, v) = (
            random(&[1, 2, 9, 4], 5, what),
            random(&[1, 2, 9, 4], 6, what),
            random(&[1, 2, 9, 3], 7, what),
        );
        let whole = mechanism.attend(&q, &k, &v, pos).unwrap().weights;
        let block = QueryBlock {
            start: 4,
            len: 3,
            total: 9,
        };
        let rows = mechanism
            .attend_block(
                &q.narrow(2, 4, 3).unwrap(),
                &k.narrow(2, 0, 7).unwrap(),
                &v.narrow(2, 0, 7).unwrap(),
                pos,
                block,
            )
            .unwrap()
            .weights;
        let expected = whole.narrow(2, 4, 3).unwrap().narrow(3, 0, 7).unwrap();
        assert!(max_diff(&rows, &expected) < 1e-5, "{what}");
    }
}
