//! One layer's attention weights as plain numbers: the one matrix type the views draw and the
//! analyses measure, whatever produced it (saved at an evaluation, or recomputed from a
//! checkpoint for IoU and spectra).

use candle_core::{Device, Tensor};

use crate::Result;

/// The row-normalised attention of one layer, (B, H, Tq, Tk), on the CPU.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionWeights {
    /// Index of the layer in the model.
    pub layer: usize,
    /// (B, H, Tq, Tk)
    pub shape: [usize; 4],
    /// Row-major weights.
    pub weights: Vec<f32>,
}

impl AttentionWeights {
    /// The weights of layer `layer` from a (B, H, Tq, Tk) tensor on any device.
    pub fn from_tensor(layer: usize, weights: &Tensor) -> Result<Self> {
        let (b, h, tq, tk) = weights.dims4()?;
        Ok(Self {
            layer,
            shape: [b, h, tq, tk],
            weights: weights
                .to_device(&Device::Cpu)?
                .flatten_all()?
                .to_vec1::<f32>()?,
        })
    }

    /// |A| with each row scaled to sum 1 (a row of zeros stays zero): how the analyses that
    /// read rows as distributions (IoU, ERF) read a signed mixing matrix.
    pub fn magnitudes(&self) -> Self {
        let tk = self.shape[3].max(1);
        let mut weights: Vec<f32> = self.weights.iter().map(|w| w.abs()).collect();
        for row in weights.chunks_mut(tk) {
            let sum: f32 = row.iter().sum();
            if sum > 0.0 {
                row.iter_mut().for_each(|w| *w /= sum);
            }
        }
        Self {
            layer: self.layer,
            shape: self.shape,
            weights,
        }
    }

    /// The Tq × Tk matrix of example `b`, head `h`.
    pub fn matrix(&self, b: usize, h: usize) -> &[f32] {
        let [_, heads, tq, tk] = self.shape;
        let start = (b * heads + h) * tq * tk;
        &self.weights[start..start + tq * tk]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_matrix_is_the_block_of_its_example_and_head() {
        let values: Vec<f32> = (0..2 * 3 * 2 * 2).map(|v| v as f32).collect();
        let tensor = Tensor::from_vec(values, (2, 3, 2, 2), &Device::Cpu).unwrap();
        let weights = AttentionWeights::from_tensor(4, &tensor).unwrap();
        assert_eq!((weights.layer, weights.shape), (4, [2, 3, 2, 2]));
        assert_eq!(weights.matrix(0, 0), &[0.0, 1.0, 2.0, 3.0]);
        assert_eq!(weights.matrix(1, 2), &[20.0, 21.0, 22.0, 23.0]);
    }

    #[test]
    fn magnitudes_are_absolute_values_scaled_to_rows_of_one() {
        let tensor = Tensor::new(&[[[[-3f32, 1.0], [0.0, 0.0]]]], &Device::Cpu).unwrap();
        let weights = AttentionWeights::from_tensor(0, &tensor).unwrap();
        assert_eq!(weights.magnitudes().weights, [0.75, 0.25, 0.0, 0.0]);
    }
}
