//! Flash attention for training on a CUDA GPU: softmax attention's output and gradients without
//! the (B, H, T, T) weights, which at T = 1024 are 0.5 GB per layer and most of a step's memory
//! traffic. Scores are recomputed block-free, one warp per row, with an online softmax
//! (`attnlab_flash_*` in kernels.cu); the backward recomputes them from the saved log-sum-exp.
//!
//! It takes a constant bias table (ALiBi, Sandwich, the Type and window series) but not a
//! trained one (T5, Kerple, DIET): their gradient would need the weights after all, so those
//! run the explicit path, as do the CPU and every other mechanism. [`flash_attention_composed`]
//! is the reference the GPU tests compare it with; views and analyses always get the explicit
//! weights from `Mechanism::attend`. Training uses it only when asked ([`flash_enabled`]): on an
//! H200 the explicit path was 3-5x faster at T = 1024.

use candle_core::{CustomOp3, Tensor};

use crate::Result;

/// Widest head the kernels hold in registers (32 lanes × 8).
const MAX_HEAD_WIDTH: usize = 256;

/// Whether training uses flash attention where it is available: only with
/// `ATTNLAB_CUDA_FLASH=1`, for lengths whose (B, H, T, T) weights do not fit on the GPU. Off,
/// softmax attention trains on its explicit weights through cuBLAS (tensor cores in tf32 and
/// bf16) and the fused softmax kernel. On an H200 that was 86 / 48 / 57 ms a step against flash's
/// 246 / 221 / 220 ms at the large configuration in f32 / tf32 / bf16; at the reference one the
/// two were within the spread between leases (explicit 2.9 and 3.9 ms, flash 3.6; docs/gpu.md).
/// These kernels give each row one warp and
/// read k and v from memory for every row; a tiled kernel on tensor cores would beat the
/// explicit path.
pub fn flash_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("ATTNLAB_CUDA_FLASH").is_ok_and(|v| v == "1"))
}

/// Whether flash attention runs these q (B, H, T, D) and v (B, H, T, Dv): f32 on a CUDA GPU
/// with attnlab's kernels, heads at most 256 wide, and a bias, if any, that is constant.
pub fn flash_available(q: &Tensor, v: &Tensor, bias: Option<&Tensor>) -> bool {
    super::fusable(q)
        && !q.device().is_cpu()
        && q.rank() == 4
        && v.rank() == 4
        && q.dim(3).is_ok_and(|d| d <= MAX_HEAD_WIDTH)
        && v.dim(3).is_ok_and(|d| d <= MAX_HEAD_WIDTH)
        && bias.is_none_or(|b| !b.track_op() && b.rank() == 3)
}

/// softmax(q kᵀ · scale + bias, causal) · v with the heads side by side: q, k (B, H, T, D),
/// v (B, H, T, Dv), bias (H or 1, T, T) → (B, T, H·Dv). Only where [`flash_available`].
pub fn flash_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: Option<&Tensor>,
    scale: f64,
    causal: bool,
) -> Result<Tensor> {
    let op = FlashAttention {
        scale: scale as f32,
        causal,
        bias: bias.map(Tensor::contiguous).transpose()?,
        #[cfg(feature = "cuda")]
        lse: std::sync::Mutex::new(None),
    };
    Ok(q.contiguous()?
        .apply_op3(&k.contiguous()?, &v.contiguous()?, op)?)
}

/// [`flash_attention`] from the explicit weights (the reference).
pub fn flash_attention_composed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: Option<&Tensor>,
    scale: f64,
    causal: bool,
) -> Result<Tensor> {
    let scores = super::dot_scores(q, k, scale)?;
    let weights = match bias {
        Some(bias) => super::softmax_rows_biased(&scores, bias, causal)?,
        None => super::softmax_rows(&scores, causal)?,
    };
    super::matmul_merge_heads(&weights, v)
}

/// (q, k, v) → the merged output. The forward's log-sum-exp per row waits here for the
/// backward (a custom op returns one tensor).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // read by the CUDA side only
struct FlashAttention {
    scale: f32,
    causal: bool,
    bias: Option<Tensor>,
    #[cfg(feature = "cuda")]
    lse: std::sync::Mutex<Option<candle_core::cuda_backend::cudarc::driver::CudaSlice<f32>>>,
}

const CUDA_ONLY: &str = "flash attention runs on CUDA GPUs only";

impl CustomOp3 for FlashAttention {
    fn name(&self) -> &'static str {
        "attnlab-flash-attention"
    }

    cpu_fwd!(self, |_, _, _, _, _, _| {
        candle_core::bail!("{CUDA_ONLY}")
    });

    cuda_fwd!(self, |s1, l1, s2, l2, s3, l3| {
        let bias = self.bias.as_ref().map(Tensor::storage_and_layout);
        let bias = match &bias {
            Some((guard, layout)) => Some((cuda_storage(guard)?, *layout)),
            None => None,
        };
        let shape =
            super::cuda::FlashShape::new(l1, l3, bias.map(|(_, l)| l), self.scale, self.causal)?;
        let (out, lse) = super::cuda::flash_forward([(s1, l1), (s2, l2), (s3, l3)], bias, shape)?;
        *self.lse.lock().unwrap_or_else(|p| p.into_inner()) = Some(lse);
        let [b, h, t, _] = l1.dims() else {
            candle_core::bail!("flash attention takes q of rank 4");
        };
        Ok((out, candle_core::Shape::from((*b, *t, h * l3.dims()[3]))))
    });

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        #[cfg(feature = "cuda")]
        {
            let lse = self.lse.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let Some(lse) = lse else {
                candle_core::bail!("flash attention's backward ran before its forward");
            };
            let op = FlashGrad {
                scale: self.scale,
                causal: self.causal,
                bias: self.bias.clone(),
                out: out.contiguous()?,
                dout: grad.contiguous()?,
                lse,
            };
            let grads = q.apply_op3_no_bwd(k, v, &op)?;
            let (n_q, n_v) = (q.elem_count(), v.elem_count());
            let dq = grads.narrow(0, 0, n_q)?.reshape(q.shape())?;
            let dk = grads.narrow(0, n_q, n_q)?.reshape(k.shape())?;
            let dv = grads.narrow(0, 2 * n_q, n_v)?.reshape(v.shape())?;
            Ok((Some(dq), Some(dk), Some(dv)))
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (q, k, v, out, grad);
            candle_core::bail!("{CUDA_ONLY}")
        }
    }
}

/// The CUDA storage behind a guard.
#[cfg(feature = "cuda")]
fn cuda_storage<'a>(
    guard: &'a candle_core::StorageRef<'_>,
) -> candle_core::Result<&'a candle_core::CudaStorage> {
    match &**guard {
        candle_core::Storage::Cuda(storage) => Ok(storage),
        _ => candle_core::bail!("flash attention's tensors must all be on the GPU"),
    }
}

/// (q, k, v) → [dq | dk | dv] flat, given the forward's output, log-sum-exp and the output's
/// gradient.
#[cfg(feature = "cuda")]
struct FlashGrad {
    scale: f32,
    causal: bool,
    bias: Option<Tensor>,
    out: Tensor,
    dout: Tensor,
    lse: candle_core::cuda_backend::cudarc::driver::CudaSlice<f32>,
}

#[cfg(feature = "cuda")]
impl CustomOp3 for FlashGrad {
    fn name(&self) -> &'static str {
        "attnlab-flash-attention-grad"
    }

    cpu_fwd!(self, |_, _, _, _, _, _| {
        candle_core::bail!("{CUDA_ONLY}")
    });

    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &candle_core::Layout,
        s2: &candle_core::CudaStorage,
        l2: &candle_core::Layout,
        s3: &candle_core::CudaStorage,
        l3: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, candle_core::Shape)> {
        let (out, out_l) = self.out.storage_and_layout();
        let (dout, dout_l) = self.dout.storage_and_layout();
        let bias = self.bias.as_ref().map(Tensor::storage_and_layout);
        let bias = match &bias {
            Some((guard, layout)) => Some((cuda_storage(guard)?, *layout)),
            None => None,
        };
        let shape =
            super::cuda::FlashShape::new(l1, l3, bias.map(|(_, l)| l), self.scale, self.causal)?;
        let grads = super::cuda::flash_backward(
            [(s1, l1), (s2, l2), (s3, l3)],
            bias,
            [(cuda_storage(&out)?, out_l), (cuda_storage(&dout)?, dout_l)],
            &self.lse,
            shape,
        )?;
        let n = 2 * l1.shape().elem_count() + l3.shape().elem_count();
        Ok((grads, candle_core::Shape::from(n)))
    }
}
