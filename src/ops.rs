//! Small differentiable building blocks shared by attention and the model.
//!
//! candle's fused `softmax_last_dim`, `layer_norm` and `rms_norm` have no backward pass: a
//! model built on them trains silently wrong. These versions use plain tensor ops only.

use candle_core::{D, Tensor};

use crate::Result;

/// Softmax over the last dimension.
pub fn softmax_last(x: &Tensor) -> Result<Tensor> {
    Ok(candle_nn::ops::softmax(x, D::Minus1)?)
}

/// (x − mean) / √(var + eps) over the last dimension: LayerNorm without its affine part.
pub fn standardise(x: &Tensor, eps: f64) -> Result<Tensor> {
    let mean = x.mean_keepdim(D::Minus1)?;
    let centred = x.broadcast_sub(&mean)?;
    let var = centred.sqr()?.mean_keepdim(D::Minus1)?;
    Ok(centred.broadcast_div(&(var + eps)?.sqrt()?)?)
}

/// q·kᵀ·scale for q (…, Tq, d), k (…, Tk, d) → (…, Tq, Tk).
pub fn dot_scores(q: &Tensor, k: &Tensor, scale: f64) -> Result<Tensor> {
    Ok((q.matmul(&k.t()?)? * scale)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn standardise_matches_layer_norm_and_has_gradients() {
        let x = Var::new(&[[1f32, 2.0, 3.0]], &Device::Cpu).unwrap();
        let y = standardise(x.as_tensor(), 0.0).unwrap();
        let got = y.to_vec2::<f32>().unwrap();
        // candle-nn's layer_norm doc-test value: [-1.2247, 0.0, 1.2247]
        assert!((got[0][0] + 1.2247).abs() < 1e-4 && got[0][1].abs() < 1e-6);
        let w = Tensor::new(&[[1f32, 0.0, 0.0]], &Device::Cpu).unwrap();
        let grads = (y * w).unwrap().sum_all().unwrap().backward().unwrap();
        let g = grads
            .get(x.as_tensor())
            .unwrap()
            .abs()
            .unwrap()
            .sum_all()
            .unwrap();
        assert!(g.to_scalar::<f32>().unwrap() > 0.0);
    }
}
