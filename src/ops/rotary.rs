//! Rotary position embedding (RoPE and its relatives) applied to queries or keys as one op.
//!
//! Composed, the rotation x·cos + rotate_half(x)·sin is seven nodes (two narrows, a negation,
//! a concatenation, two broadcast products and a sum), each a pass over x, and their backward
//! pass as many again. In MAD's model (16 heads of 8 channels, L 128, batch 128) those passes
//! were 12–14 % of a training step alone and more in a group of replicas. Fused, the forward
//! pass is one pass over x and the backward one pass over its gradient: the transposed
//! rotation, the same op with the angles negated.

use candle_core::{CpuStorage, CustomOp2, Shape, Tensor};
use rayon::prelude::*;

use super::fused::{slice, zeros};

/// (x, tables) → x rotated on its first r channels: for c < r/2, with h = r/2,
/// y_c = x_c cos_c − x_{c+h} sin_c and y_{c+h} = x_{c+h} cos_{c+h} + x_c sin_{c+h};
/// the channels from r on pass through. x is (…, T, d) and the tables (2, n, r) with n = T
/// (a row per position) or n = 1 (one row for every position), both contiguous.
/// `transposed` applies the transposed map (the rotation back), which is the gradient.
pub(super) struct Rotation {
    pub(super) transposed: bool,
}

/// Whether the fused op takes tables (2, n, r) for x (…, T, d): n is T or 1, r even and ≤ d.
pub(super) fn fusable_tables(x: &[usize], tables: &[usize]) -> bool {
    let (Some(&d), Some(&t)) = (x.last(), x.iter().rev().nth(1)) else {
        return false;
    };
    matches!(tables, &[2, n, r] if (n == t || n == 1) && r % 2 == 0 && r <= d)
}

impl Rotation {
    /// One position's row: `out` from `x` under its (cos, sin) rows.
    #[inline(always)]
    fn row(&self, out: &mut [f32], x: &[f32], cos: &[f32], sin: &[f32]) {
        let half = cos.len() / 2;
        let (x1, rest) = x.split_at(half);
        let (x2, passed) = rest.split_at(half);
        let (o1, rest) = out.split_at_mut(half);
        let (o2, o_passed) = rest.split_at_mut(half);
        let (cos1, cos2) = cos.split_at(half);
        let (sin1, sin2) = sin.split_at(half);
        // The forward map's matrix on (x1, x2) is [[cos1, −sin1], [sin2, cos2]]; the
        // transposed one [[cos1, sin2], [−sin1, cos2]].
        for c in 0..half {
            let (a, b) = (x1[c], x2[c]);
            (o1[c], o2[c]) = if self.transposed {
                (a * cos1[c] + b * sin2[c], b * cos2[c] - a * sin1[c])
            } else {
                (a * cos1[c] - b * sin1[c], b * cos2[c] + a * sin2[c])
            };
        }
        o_passed.copy_from_slice(passed);
    }
}

impl CustomOp2 for Rotation {
    fn name(&self) -> &'static str {
        "attnlab-rotary"
    }

    cpu_fwd!(self, |s1, l1, s2, l2| {
        let (x, tables) = (slice(s1, l1)?, slice(s2, l2)?);
        if !fusable_tables(l1.dims(), l2.dims()) {
            candle_core::bail!("rotary: tables {:?} for x {:?}", l2.dims(), l1.dims());
        }
        let dims = l1.dims();
        let (t, d) = (dims[dims.len() - 2], dims[dims.len() - 1]);
        let (n, r) = (l2.dims()[1], l2.dims()[2]);
        let (cos, sin) = tables.split_at(n * r);
        let mut out = zeros(x.len());
        if out.is_empty() {
            return Ok((CpuStorage::F32(out), Shape::from(dims)));
        }
        out.par_chunks_mut(t * d)
            .zip(x.par_chunks(t * d))
            .for_each(|(out, x)| {
                super::vectorised(
                    #[inline(always)]
                    || {
                        let rows = out.chunks_mut(d).zip(x.chunks(d)).enumerate();
                        for (i, (out, x)) in rows {
                            let at = if n == 1 { 0 } else { i * r };
                            self.row(out, x, &cos[at..at + r], &sin[at..at + r]);
                        }
                    },
                )
            });
        Ok((CpuStorage::F32(out), Shape::from(dims)))
    });

    /// The tables are constants (built from positions), so they get no gradient.
    fn bwd(
        &self,
        _x: &Tensor,
        tables: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let back = Rotation {
            transposed: !self.transposed,
        };
        Ok((
            Some(grad.contiguous()?.apply_op2_no_bwd(tables, &back)?),
            None,
        ))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Tensor, Var};

    use super::super::testing::{assert_close_to, random, value_and_grads};
    use super::super::{rotary, rotary_composed};
    use super::*;

    /// How a test hands x to the op: as it is, or a view of it.
    type View = fn(&Tensor) -> Tensor;

    /// Value and dx of `f` at `view(x)` under tables (random, not rotations, so that the
    /// transposed map is not the inverse by accident), as tensors.
    fn value_and_dx(
        f: fn(&Tensor, &Tensor) -> crate::Result<Tensor>,
        (x, view): (&Var, View),
        tables: &Tensor,
    ) -> [Tensor; 2] {
        let y = f(&view(x.as_tensor()), tables).unwrap();
        let upstream = random(y.dims(), 3, "upstream");
        let [value, dx] = value_and_grads(&y, &upstream, &[x]).try_into().unwrap();
        [value, dx].map(|v| Tensor::new(v, &candle_core::Device::Cpu).unwrap())
    }

    /// The fused op at `view(x)` under tables of `table_dims`, against the composed ops.
    fn assert_fused_matches_composed(x_dims: &[usize], view: View, table_dims: &[usize]) {
        let x = Var::from_tensor(&random(x_dims, 1, "x")).unwrap();
        let viewed = view(x.as_tensor());
        let what = format!("x {:?}, tables {table_dims:?}", viewed.dims());
        assert!(fusable_tables(viewed.dims(), table_dims), "{what}");
        let tables = random(table_dims, 2, "tables");
        let fused = value_and_dx(rotary, (&x, view), &tables);
        let composed = value_and_dx(rotary_composed, (&x, view), &tables);
        for (name, (f, c)) in ["value", "dx"].iter().zip(fused.iter().zip(&composed)) {
            assert_close_to(f, c, 1e-5, &format!("{what}: {name}"));
        }
    }

    #[test]
    fn the_fused_rotation_matches_the_composed_ops_in_value_and_gradient() {
        let whole: View = Tensor::clone;
        assert_fused_matches_composed(&[2, 3, 5, 8], whole, &[2, 5, 8]); // a row per position
        assert_fused_matches_composed(&[2, 3, 5, 8], whole, &[2, 1, 8]); // one row for all (ReRoPE)
        assert_fused_matches_composed(&[2, 3, 5, 8], whole, &[2, 5, 4]); // a fraction (GPT-NeoX)
        assert_fused_matches_composed(&[6, 7, 4], whole, &[2, 7, 4]); // rank 3
        // A transposed (non-contiguous) view, as heads read out of (B, T, H, D) would be.
        let heads: View = |x| x.transpose(1, 2).unwrap();
        assert!(!heads(&random(&[2, 5, 3, 8], 0, "x")).is_contiguous());
        assert_fused_matches_composed(&[2, 5, 3, 8], heads, &[2, 5, 8]);
    }

    #[test]
    fn tables_the_op_cannot_take_go_to_the_composed_ops() {
        // Three positions of tables for five of x, an odd rotated width, more rotated channels
        // than x has, no position axis, an x without positions.
        assert!(!fusable_tables(&[2, 5, 8], &[2, 3, 8]));
        assert!(!fusable_tables(&[2, 5, 8], &[2, 5, 3]));
        assert!(!fusable_tables(&[2, 5, 4], &[2, 5, 8]));
        assert!(!fusable_tables(&[2, 5, 8], &[2, 8]));
        assert!(!fusable_tables(&[8], &[2, 1, 8]));
        // Tables without a position axis broadcast over every position in the composed ops.
        let x = random(&[2, 5, 8], 4, "x");
        let tables = random(&[2, 8], 5, "tables");
        let got = rotary(&x, &tables).unwrap();
        assert_close_to(&got, &rotary_composed(&x, &tables).unwrap(), 0.0, "(2, r)");
        // Three rows of tables cannot cover five positions.
        assert!(rotary(&x, &random(&[2, 3, 8], 5, "tables")).is_err());
    }

    /// Trainable tables (none are today) would lose their gradient in the fused op, so they
    /// take the composed ops, which give it.
    #[test]
    fn trainable_tables_keep_their_gradient() {
        let x = random(&[2, 5, 8], 6, "x");
        let tables = Var::from_tensor(&random(&[2, 5, 8], 7, "tables")).unwrap();
        let y = rotary(&x, tables.as_tensor()).unwrap();
        let grads = y.sum_all().unwrap().backward().unwrap();
        assert!(grads.get(tables.as_tensor()).is_some());
    }
}
