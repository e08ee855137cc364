//! What the recurrent mixers (retention, GLA, DeltaNet) share: each has an explicit form, the
//! signed matrix of its hidden attention for a block of queries (what the views show), and a
//! chunked form that never holds more than a chunk's weights (what trains and evaluates long
//! sequences). [`forms!`] writes a mixer's `Mechanism` methods from those two; the tests share
//! the check that the recurrence, the explicit form and the chunked form agree.

use candle_core::Tensor;

use crate::Result;

/// A chunked form's (B, H, T, Dh) outputs with the heads side by side, (B, T, H·Dh), as
/// `Mechanism::fused_output` returns them.
pub(super) fn heads_side_by_side(y: Option<Tensor>) -> Result<Option<Tensor>> {
    let Some(y) = y else { return Ok(None) };
    let (b, h, t, dh) = y.dims4()?;
    Ok(Some(y.transpose(1, 2)?.reshape((b, t, h * dh))?))
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
