//! How matrix products are computed: `train.precision`.
//!
//! - `f32`: everything in f32 (the reference, and the only mode of the CPU's own products).
//! - `tf32`: f32 tensors, but CUDA's matrix products on tensor cores with TF32 inputs (a 10-bit
//!   mantissa, f32 accumulation), PyTorch's `allow_tf32`. No effect on the CPU.
//! - `bf16`: mixed precision as PyTorch's `autocast(bfloat16)`: the operands of every matrix
//!   product (linear layers, attention scores, weights · values) are rounded to bf16 and the
//!   product summed in f32; parameters (the master weights), optimiser state,
//!   normalisations, softmax, kernel-attention normalisers and the loss stay f32.
//!   [`Precision::product`] casts the operands (and rounds the product to bf16 too, as
//!   autocast). On CUDA a training run instead has cuBLAS round them on its bf16 tensor cores
//!   ([`crate::device::use_precision`]): the tensors stay f32, the fused f32 kernels run as in
//!   f32 and no cast kernel is launched, and products come back unrounded. That switch is one
//!   per process and rounds every f32 product while it is on, those the CPU keeps in f32 too:
//!   the recurrent mixers' chunk products, cumulative sums (candle computes them as products)
//!   and the kernel normalisers' products. On the CPU candle widens bf16 products to f32
//!   internally, so bf16 there is slower than f32 and shows only the rounding.

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::Result;

/// The `train.precision` setting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    #[default]
    F32,
    Tf32,
    Bf16,
}

impl Precision {
    pub const ALL: [Self; 3] = [Self::F32, Self::Tf32, Self::Bf16];

    /// The name used in presets, the CLI and the GUI.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Tf32 => "tf32",
            Self::Bf16 => "bf16",
        }
    }

    /// What it costs in accuracy and where it helps, for help text and tooltips.
    pub fn summary(self) -> &'static str {
        match self {
            Self::F32 => "full f32: the reference numbers",
            Self::Tf32 => {
                "CUDA matrix products on TF32 tensor cores (10-bit mantissa inputs, f32 sums); \
                 the same as f32 on the CPU"
            }
            Self::Bf16 => {
                "bf16 operands for every matrix product (8-bit mantissa), f32 master weights, \
                 optimiser, softmax, norms and loss; slower than f32 on the CPU"
            }
        }
    }

    /// Whether a product on `device` casts its operands to bf16 itself: in bf16, unless cuBLAS
    /// rounds them on its bf16 tensor cores, a process-wide switch that only a training run
    /// turns on ([`crate::device::use_precision`]): an analysis of a bf16 run, or a run whose
    /// switch another run turned off, still rounds, by casting.
    pub fn casts_operands(self, device: &Device) -> bool {
        self == Self::Bf16 && !products_in_bf16(device)
    }

    /// `f(a, b)` with both operands rounded to this precision's product dtype and the result in
    /// f32: the one place where a bf16 tensor enters a computation.
    pub fn product(
        self,
        a: &Tensor,
        b: &Tensor,
        f: impl Fn(&Tensor, &Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        if !self.casts_operands(a.device()) {
            return f(a, b);
        }
        let product = f(&a.to_dtype(DType::BF16)?, &b.to_dtype(DType::BF16)?)?;
        Ok(product.to_dtype(DType::F32)?)
    }
}

/// Whether cuBLAS computes `device`'s f32 products on bf16 tensor cores now.
fn products_in_bf16(device: &Device) -> bool {
    #[cfg(feature = "cuda")]
    if device.is_cuda() {
        return candle_core::cuda_backend::gemm_bf16_compute_f32();
    }
    let _ = device;
    false
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn bf16_products_round_their_operands_and_return_f32() {
        // 1 + 2⁻⁹ is not a bf16 number (8 bits of mantissa): it rounds to 1.
        let a = Tensor::new(&[[1.0f32 + 1.0 / 512.0]], &Device::Cpu).unwrap();
        let b = Tensor::new(&[[1.0f32]], &Device::Cpu).unwrap();
        let product = |p: Precision| {
            let y = p.product(&a, &b, |a, b| Ok(a.matmul(b)?)).unwrap();
            assert_eq!(y.dtype(), DType::F32);
            y.to_vec2::<f32>().unwrap()[0][0]
        };
        assert_eq!(product(Precision::F32), 1.0 + 1.0 / 512.0);
        assert_eq!(product(Precision::Bf16), 1.0);
    }

    #[test]
    fn names_round_trip_through_serde() {
        for p in Precision::ALL {
            let text = toml::to_string(&std::collections::BTreeMap::from([("p", p)])).unwrap();
            assert!(text.contains(p.name()), "{text}");
        }
    }
}
