//! Small differentiable building blocks shared by attention and the model.
//!
//! candle's fused `softmax_last_dim`, `layer_norm` and `rms_norm` have no backward pass: a
//! model built on them trains silently wrong. The functions here always have one: on f32
//! tensors on the CPU or a CUDA GPU they use attnlab's own fused kernels ([`fused`],
//! [`embedding`], [`loss`], [`adamw`]; the GPU side in `cuda.rs` and `kernels.cu`), elsewhere
//! plain tensor ops (the `*_composed` versions, which also serve as the tests' reference).
//! The matrix products of [`linear`] and [`matmul`] are the CPU's own (the gemm crate); on a
//! GPU, candle's cuBLAS products run them.

/// The `cpu_fwd` of a candle custom op (`CustomOp1`, `2` or `3`), its storages and layouts
/// named as given: the signature candle's traits require, written once. `self` is passed in
/// so that the body may use it (macro hygiene).
macro_rules! cpu_fwd {
    ($this:ident, |$($storage:tt, $layout:tt),+| $body:block) => {
        fn cpu_fwd(
            &$this,
            $($storage: &candle_core::CpuStorage, $layout: &candle_core::Layout),+
        ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> $body
    };
}

/// [`cpu_fwd!`]'s twin for `cuda_fwd`, compiled with `--features cuda` only.
macro_rules! cuda_fwd {
    ($this:ident, |$($storage:tt, $layout:tt),+| $body:block) => {
        #[cfg(feature = "cuda")]
        fn cuda_fwd(
            &$this,
            $($storage: &candle_core::CudaStorage, $layout: &candle_core::Layout),+
        ) -> candle_core::Result<(candle_core::CudaStorage, candle_core::Shape)> $body
    };
}

mod adamw;
mod causal_products;
mod conv;
mod cpu_attention;
#[cfg(feature = "cuda")]
mod cuda;
mod decayed;
mod dropout;
mod elementwise;
mod embedding;
mod flash;
mod fused;
mod gemm;
mod kernel_rows;
mod layer_norm;
mod linear;
mod loss;
mod mask;
mod matmul;
mod precision;
mod replicas;
mod rotary;
mod softmax;
mod unit_triangular;

use candle_core::{D, DType, Device, Tensor};

pub use adamw::{
    AdamStep, ParamUpdate, adamw_all_in_place, adamw_in_place, adamw_step_composed, sum_squares_all,
};
pub use conv::{
    causal_conv, causal_conv_composed, causal_conv_silu_heads, causal_conv_silu_heads_composed,
};
pub use cpu_attention::{
    RowFunction, WeightDropout, cpu_attention, cpu_attention_available, cpu_attention_composed,
};
pub use decayed::{
    channel_decayed_attention, channel_decayed_attention_composed, cumulative_log_sigmoid,
    cumulative_log_sigmoid_composed, decay_matrix, decayed_attention, decayed_attention_composed,
    delta_inverse, delta_rule, delta_rule_composed,
};
pub use dropout::{dropout, mix as mix_seed};
pub use embedding::{embedding, embedding_composed};
pub use flash::{flash_attention, flash_attention_composed, flash_available, flash_enabled};
pub use kernel_rows::{RowKernel, kernel_rows, kernel_rows_composed, normalise_rows};
pub use layer_norm::RowNorm;
pub use loss::{
    cross_entropy, cross_entropy_composed, cross_entropy_groups, cross_entropy_groups_composed,
};
pub use mask::causal_mask;
pub use precision::Precision;
pub use replicas::{
    Combine, add_bias_replicas, affine_replicas, linear_replicas, per_replica, with_bias,
};
pub use unit_triangular::{unit_lower_inverse, unit_lower_inverse_composed};

use crate::Result;

/// `f` compiled for the widest vector instructions this CPU has (AVX-512, else AVX2), chosen
/// at run time. The release build targets any x86-64 (SSE2), so without this the fused ops'
/// loops use 4 lanes and no 64-bit multiply: dropout's hash was 15 % of a softmax step.
/// `f` should be an `#[inline(always)]` closure calling an `#[inline(always)]` function that
/// holds the loops: what is not inlined into the dispatched copies is compiled for SSE2 alone.
#[inline(always)]
pub(crate) fn vectorised<R>(f: impl FnOnce() -> R) -> R {
    pulp::Arch::new().dispatch(f)
}

/// Whether attnlab's fused kernels run `x`: f32 on the CPU, or on a CUDA GPU unless
/// `ATTNLAB_CUDA_KERNELS=0`.
pub(crate) fn fusable(x: &Tensor) -> bool {
    x.dtype() == DType::F32 && (x.device().is_cpu() || cuda_kernels(x.device()))
}

/// Whether `device` runs the fused CUDA kernels.
fn cuda_kernels(device: &Device) -> bool {
    #[cfg(feature = "cuda")]
    {
        device.is_cuda() && cuda::enabled()
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = device;
        false
    }
}

/// f32 on the CPU: where attnlab's own matrix products ([`linear`], [`matmul`]) run.
fn cpu_f32(x: &Tensor) -> bool {
    x.device().is_cpu() && x.dtype() == DType::F32
}

/// Softmax over the last dimension. With `causal`, row i of each (Tq, Tk) block sees only
/// keys j ≤ i + (Tk − Tq); masked weights are exactly 0.
pub fn softmax_rows(x: &Tensor, causal: bool) -> Result<Tensor> {
    if fusable(x) {
        return Ok(x.contiguous()?.apply_op1(softmax::RowSoftmax { causal })?);
    }
    softmax_rows_composed(x, causal)
}

/// softmax(x + bias) over the last dimension, masked as [`softmax_rows`]. The bias is
/// (H, Tq, Tk) or (1, Tq, Tk) for x (B, H, Tq, Tk), a relative encoding's table; fused, it is
/// added inside the softmax's pass instead of as a (B, H, Tq, Tk) tensor of its own.
pub fn softmax_rows_biased(x: &Tensor, bias: &Tensor, causal: bool) -> Result<Tensor> {
    if fusable(x) && fusable(bias) && repeats_over_rows(bias, x) {
        let op = softmax::BiasedRowSoftmax { causal };
        return Ok(x.contiguous()?.apply_op2(&bias.contiguous()?, op)?);
    }
    softmax_rows(&with_bias(x, bias, Combine::Add)?, causal)
}

/// Whether `bias` is whole rows of `x` repeated over its leading dimensions: bias's shape,
/// without leading 1s, is the end of x's.
fn repeats_over_rows(bias: &Tensor, x: &Tensor) -> bool {
    let (b, x) = (bias.dims(), x.dims());
    let start = b.iter().position(|&d| d != 1).unwrap_or(b.len());
    let b = &b[start..];
    !b.is_empty() && b.len() <= x.len() && x[x.len() - b.len()..] == *b
}

/// [`softmax_rows`] from plain tensor ops.
pub fn softmax_rows_composed(x: &Tensor, causal: bool) -> Result<Tensor> {
    let x = if causal {
        x.broadcast_add(&causal_mask(x)?)?
    } else {
        x.clone()
    };
    Ok(candle_nn::ops::softmax(&x, D::Minus1)?)
}

/// y = x Wᵀ + b for x (…, in), W (out, in), b (out), as `nn.Linear`.
pub fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    match b {
        Some(b) if fusable(x) && fusable(w) => fused_linear(x, w, b, None),
        _ => linear_composed(x, w, b),
    }
}

/// [`linear`] of x (B, T, in), split into heads: (B, heads, T, out / heads), what attention
/// takes as q, k or v. In f32 it is one contiguous node (see `linear.rs`), which a GPU's
/// attention products read without copying the heads out of a (B, T, H, D) view.
pub fn linear_heads(x: &Tensor, w: &Tensor, b: Option<&Tensor>, heads: usize) -> Result<Tensor> {
    match b {
        Some(b) if fusable(x) && fusable(w) => fused_linear(x, w, b, Some(heads)),
        _ => linear_heads_composed(x, w, b, heads),
    }
}

/// The fused [`linear::LinearOp`], its output split into `heads` if given.
fn fused_linear(x: &Tensor, w: &Tensor, b: &Tensor, heads: Option<usize>) -> Result<Tensor> {
    let op = linear::LinearOp { heads };
    Ok(x.contiguous()?
        .apply_op3(&w.contiguous()?, &b.contiguous()?, op)?)
}

/// [`linear_heads`] from plain tensor ops: the heads are a view of the (B, T, out) output.
pub fn linear_heads_composed(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    heads: usize,
) -> Result<Tensor> {
    let (batch, t, _) = x.dims3()?;
    let y = linear_composed(x, w, b)?;
    let width = y.dim(2)? / heads;
    Ok(y.reshape((batch, t, heads, width))?.transpose(1, 2)?)
}

/// [`linear`] from plain tensor ops: one (rows, in) × (in, out) product.
pub fn linear_composed(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let (out_dim, in_dim) = w.dims2()?;
    let mut dims = x.dims().to_vec();
    let rows = x.elem_count() / in_dim;
    let y = x.reshape((rows, in_dim))?.matmul(&w.t()?)?;
    let y = match b {
        Some(b) => y.broadcast_add(b)?,
        None => y,
    };
    if let Some(last) = dims.last_mut() {
        *last = out_dim;
    }
    Ok(y.reshape(dims)?)
}

/// x + y, y broadcast over x's leading dimensions: y's shape is the end of x's, as a (T, D)
/// position table is of a (B, T, D) batch.
pub fn add_broadcast(x: &Tensor, y: &Tensor) -> Result<Tensor> {
    if fusable(x) && fusable(y) {
        return Ok(x
            .contiguous()?
            .apply_op2(&y.contiguous()?, elementwise::AddBroadcast)?);
    }
    Ok(x.broadcast_add(y)?)
}

/// GELU, exact erf form (PyTorch's `nn.GELU()`).
pub fn gelu_erf(x: &Tensor) -> Result<Tensor> {
    if fusable(x) {
        return Ok(x.contiguous()?.apply_op1(elementwise::GeluErf)?);
    }
    Ok(x.gelu_erf()?)
}

/// GELU's tanh approximation, 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³))) (GPT-2's
/// `gelu_new`): candle's, with its backward.
pub fn gelu_tanh(x: &Tensor) -> Result<Tensor> {
    Ok(x.gelu()?)
}

/// SiLU, x·σ(x): fused on the CPU in f32, candle's elsewhere.
pub fn silu(x: &Tensor) -> Result<Tensor> {
    if cpu_f32(x) {
        return Ok(x.contiguous()?.apply_op1(elementwise::Silu)?);
    }
    Ok(x.silu()?)
}

/// x (…, T, d) rotated by its (cos, sin) tables (2, T|1, r): x·cos + rotate_half(x)·sin on
/// the first r channels, with rotate_half(x) = [−x₂, x₁]; the others pass through. Fused on
/// the CPU in f32 ([`rotary::Rotation`]), [`rotary_composed`] elsewhere. The fused op gives
/// the tables no gradient, so tables that train (none do today) take the composed ops.
pub fn rotary(x: &Tensor, tables: &Tensor) -> Result<Tensor> {
    let constant = !tables.track_op();
    if cpu_f32(x) && cpu_f32(tables) && constant && rotary::fusable_tables(x.dims(), tables.dims())
    {
        let op = rotary::Rotation { transposed: false };
        return Ok(x.contiguous()?.apply_op2(&tables.contiguous()?, op)?);
    }
    rotary_composed(x, tables)
}

/// [`rotary`] from narrows, a concatenation and broadcast products: the reference.
pub fn rotary_composed(x: &Tensor, tables: &Tensor) -> Result<Tensor> {
    let (d, r) = (x.dim(D::Minus1)?, tables.dim(D::Minus1)?);
    if r < d {
        let rotated = rotary_composed(&x.narrow(D::Minus1, 0, r)?, tables)?;
        return Ok(Tensor::cat(
            &[&rotated, &x.narrow(D::Minus1, r, d - r)?],
            D::Minus1,
        )?);
    }
    let (cos, sin) = (tables.get(0)?, tables.get(1)?);
    let half = d / 2;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    Ok((x.broadcast_mul(&cos)? + rotated.broadcast_mul(&sin)?)?)
}

/// x ⊙ silu(gate), the two the same shape: fused on the CPU in f32 ([`elementwise::SiluGate`]),
/// [`silu_gate_composed`] elsewhere.
pub fn silu_gate(x: &Tensor, gate: &Tensor) -> Result<Tensor> {
    if cpu_f32(x) && cpu_f32(gate) && x.shape() == gate.shape() {
        return Ok(x
            .contiguous()?
            .apply_op2(&gate.contiguous()?, elementwise::SiluGate)?);
    }
    silu_gate_composed(x, gate)
}

/// [`silu_gate`] from a product and SiLU: the reference.
pub fn silu_gate_composed(x: &Tensor, gate: &Tensor) -> Result<Tensor> {
    Ok((x * silu(gate)?)?)
}

/// LayerNorm over the last dimension: γ ⊙ standardised x + β. γ and β are (d), or (R, d) for
/// R replicas of a model whose rows x (R·N…, d) stacks (`replicas.rs`): replica r's block of rows
/// takes row r.
pub fn layer_norm(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f64) -> Result<Tensor> {
    affine_norm(x, (gamma, beta), RowNorm::Standard, eps)
}

/// [`layer_norm`] from plain tensor ops.
pub fn layer_norm_composed(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f64) -> Result<Tensor> {
    let y = normalise_composed(x, RowNorm::Standard, eps)?;
    by_parameter_composed(
        &by_parameter_composed(&y, gamma, Combine::Mul)?,
        beta,
        Combine::Add,
    )
}

/// RMSNorm over the last dimension: γ ⊙ x / √(mean(x²) + eps), γ (d) or (R, d) as
/// [`layer_norm`]'s.
pub fn rms_norm(x: &Tensor, gamma: &Tensor, eps: f64) -> Result<Tensor> {
    affine_norm(x, (gamma, &gamma.zeros_like()?), RowNorm::Rms, eps)
}

/// [`rms_norm`] from plain tensor ops.
pub fn rms_norm_composed(x: &Tensor, gamma: &Tensor, eps: f64) -> Result<Tensor> {
    by_parameter_composed(
        &normalise_composed(x, RowNorm::Rms, eps)?,
        gamma,
        Combine::Mul,
    )
}

/// x (…, d) combined with a parameter row p, (d) for one model or (R, d) per replica, by
/// tensor ops.
fn by_parameter_composed(x: &Tensor, p: &Tensor, combine: Combine) -> Result<Tensor> {
    match (p.rank(), combine) {
        (2, _) => replicas::per_replica_composed(x, p, combine),
        (_, Combine::Mul) => Ok(x.broadcast_mul(p)?),
        (_, Combine::Add) => Ok(x.broadcast_add(p)?),
    }
}

/// γ ⊙ ŷ + β, fused where [`fused_norm`] says so.
fn affine_norm(
    x: &Tensor,
    (gamma, beta): (&Tensor, &Tensor),
    norm: RowNorm,
    eps: f64,
) -> Result<Tensor> {
    if fused_norm(x, norm) {
        let op = layer_norm::AffineNorm {
            norm,
            eps: eps as f32,
        };
        return Ok(x
            .contiguous()?
            .apply_op3(&gamma.contiguous()?, &beta.contiguous()?, op)?);
    }
    let y = by_parameter_composed(&normalise_composed(x, norm, eps)?, gamma, Combine::Mul)?;
    by_parameter_composed(&y, beta, Combine::Add)
}

/// Whether attnlab's own kernels normalise `x` by `norm`: [`fusable`], and on a GPU only where
/// a CUDA kernel exists ([`RowNorm::on_cuda`]).
fn fused_norm(x: &Tensor, norm: RowNorm) -> bool {
    fusable(x) && (x.device().is_cpu() || norm.on_cuda())
}

/// Each row of the last dimension normalised ([`RowNorm`]: standardised as LayerNorm does
/// without its affine part, scaled as RMSNorm, or to unit length).
pub fn normalise(x: &Tensor, norm: RowNorm, eps: f64) -> Result<Tensor> {
    if fused_norm(x, norm) {
        let op = layer_norm::Normalise {
            norm,
            eps: eps as f32,
        };
        return Ok(x.contiguous()?.apply_op1(op)?);
    }
    normalise_composed(x, norm, eps)
}

/// [`normalise`] from plain tensor ops.
pub fn normalise_composed(x: &Tensor, norm: RowNorm, eps: f64) -> Result<Tensor> {
    let x = match norm {
        RowNorm::Standard => x.broadcast_sub(&x.mean_keepdim(D::Minus1)?)?,
        RowNorm::Rms | RowNorm::L2 => x.clone(),
    };
    let m = match norm {
        RowNorm::Standard | RowNorm::Rms => x.sqr()?.mean_keepdim(D::Minus1)?,
        RowNorm::L2 => x.sqr()?.sum_keepdim(D::Minus1)?,
    };
    Ok(x.broadcast_div(&(m + eps)?.sqrt()?)?)
}

/// a (…, m, k) · b (…, k, n). Batches of f32 CPU matrices run in parallel, one product per
/// thread, transposed operands and heads split from (B, T, H, D) read in place (see
/// `matmul.rs`); anything else is candle's, with such views copied first.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    scaled_matmul(a, b, 1.0)
}

/// scale · a · b, the scale applied inside the product (no extra pass over the result).
fn scaled_matmul(a: &Tensor, b: &Tensor, scale: f64) -> Result<Tensor> {
    if cpu_f32(a) && matmul::fits(a, b, false) {
        let op = matmul::BatchedMatmul {
            scale: scale as f32,
            ..Default::default()
        };
        return Ok(a.apply_op2(b, op)?);
    }
    let (a, b) = (matmul::flat_for_candle(a)?, matmul::flat_for_candle(b)?);
    if scale == 1.0 {
        return Ok(a.matmul(&b)?);
    }
    // candle's product has no scale: scale the smallest of a, b and the product, a pass over
    // q (B, H, T, d) instead of over the (B, H, T, T) scores, forward and backward.
    let (m, k, n) = (a.dim(D::Minus2)?, a.dim(D::Minus1)?, b.dim(D::Minus1)?);
    Ok(match smallest_of(m * k, k * n, m * n) {
        0 => (a * scale)?.matmul(&b)?,
        1 => a.matmul(&(b * scale)?)?,
        _ => (a.matmul(&b)? * scale)?,
    })
}

/// The index of the smallest of three sizes, the first on ties.
fn smallest_of(x: usize, y: usize, z: usize) -> usize {
    if x <= y && x <= z {
        0
    } else if y <= z {
        1
    } else {
        2
    }
}

/// Attention outputs with the heads merged: weights (B, H, Tq, Tk) · values (B, H, Tk, Dh)
/// → (B, Tq, H·Dh), what the output projection reads.
pub fn matmul_merge_heads(weights: &Tensor, values: &Tensor) -> Result<Tensor> {
    let (b, h, tq, _) = weights.dims4()?;
    let dh = values.dim(3)?;
    if cpu_f32(weights) && matmul::fits(weights, values, false) {
        let op = matmul::BatchedMatmul {
            merge_heads: true,
            ..Default::default()
        };
        return Ok(weights.apply_op2(values, op)?);
    }
    let y = matmul(weights, values)?;
    if fusable(&y) {
        return Ok(linear::merge_heads(&y)?);
    }
    Ok(y.transpose(1, 2)?.reshape((b, tq, h * dh))?)
}

/// q·kᵀ·scale for q (…, Tq, d), k (…, Tk, d) → (…, Tq, Tk).
pub fn dot_scores(q: &Tensor, k: &Tensor, scale: f64) -> Result<Tensor> {
    if cpu_f32(q) && matmul::fits(q, k, true) {
        let op = matmul::BatchedMatmul {
            scale: scale as f32,
            b_transposed: true,
            ..Default::default()
        };
        return Ok(q.apply_op2(k, op)?);
    }
    scaled_matmul(q, &k.t()?, scale)
}

/// What the ops' tests share.
#[cfg(test)]
pub(crate) mod testing {
    use candle_core::{Device, Tensor, Var};

    /// `y`, then the gradient of each of `vars`, under the upstream gradient, flattened.
    pub fn value_and_grads(y: &Tensor, upstream: &Tensor, vars: &[&Var]) -> Vec<Vec<f32>> {
        let grads = (y * upstream)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        std::iter::once(flat(y))
            .chain(vars.iter().map(|v| flat(grads.get(v.as_tensor()).unwrap())))
            .collect()
    }

    /// N(0, 1) values of `shape` on the CPU, from the stream `(seed, what)`.
    pub fn random(shape: &[usize], seed: u64, what: &str) -> Tensor {
        let n = shape.iter().product();
        let data = crate::rng::normal_vec(&mut crate::rng::stream(seed, what), n, 1.0);
        Tensor::from_vec(data, shape, &Device::Cpu).unwrap()
    }

    /// Asserts that `got` is within `rel` × max(|want|, 1) of `want` everywhere, and that `want`
    /// is not all zeros (a comparison with zeros tests nothing).
    pub fn assert_close_to(got: &Tensor, want: &Tensor, rel: f32, what: &str) {
        let scale = max_abs(want);
        assert!(scale > 0.0, "{what}: zero tests nothing");
        let diff = max_diff(got, want);
        assert!(
            diff <= rel * scale.max(1.0),
            "{what} differs by {diff} (scale {scale})"
        );
    }

    /// The largest absolute difference between two tensors of one shape.
    pub fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        assert_eq!(a.dims(), b.dims());
        max_abs(&(a - b).unwrap())
    }

    /// The largest absolute value of a tensor.
    pub fn max_abs(a: &Tensor) -> f32 {
        let abs = a.abs().unwrap().flatten_all().unwrap();
        abs.max(0).unwrap().to_scalar::<f32>().unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::value_and_grads;
    use super::*;
    use candle_core::{Device, Var};

    /// Value and gradient (under a random upstream gradient) of `f` at `x`.
    fn value_and_grad(
        f: impl Fn(&Tensor) -> Result<Tensor>,
        x: &Var,
        upstream: &Tensor,
    ) -> (Vec<f32>, Vec<f32>) {
        let mut flat = value_and_grads(&f(x.as_tensor()).unwrap(), upstream, &[x]);
        let grad = flat.pop().unwrap();
        (flat.pop().unwrap(), grad)
    }

    /// Asserts each pair of flattened tensors agree, naming the first that does not.
    fn assert_all_close(a: &[Vec<f32>], b: &[Vec<f32>], names: &[&str]) {
        assert_eq!((a.len(), b.len()), (names.len(), names.len()));
        for ((a, b), name) in a.iter().zip(b).zip(names) {
            assert_close(a, b, name);
        }
    }

    fn assert_close(a: &[f32], b: &[f32], what: &str) {
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-4, "{what}: {x} vs {y}");
        }
    }

    fn random(shape: (usize, usize, usize, usize), seed: u64) -> Tensor {
        let n = shape.0 * shape.1 * shape.2 * shape.3;
        let data = crate::rng::normal_vec(&mut crate::rng::stream(seed, "ops"), n, 2.0);
        Tensor::from_vec(data, shape, &Device::Cpu).unwrap()
    }

    /// GPT-2's `gelu_new` at a few points, from its formula in f64, and its derivative
    /// against a central difference: the tanh form differs from the erf form by 1.5e-4 at 1
    /// and 4e-4 at 3, more than a checkpoint's logits tolerate.
    #[test]
    fn tanh_gelu_is_gpt2s_gelu_new_in_value_and_slope() {
        let points = [-3.0f64, -1.0, -0.3, 0.0, 0.5, 2.0, 4.0];
        let formula = |x: f64| {
            let inner = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3));
            0.5 * x * (1.0 + inner.tanh())
        };
        let x = Var::new(&points.map(|p| p as f32), &Device::Cpu).unwrap();
        let y = gelu_tanh(x.as_tensor()).unwrap();
        let slopes = y.sum_all().unwrap().backward().unwrap();
        let slopes = slopes.get(&x).unwrap().to_vec1::<f32>().unwrap();
        for ((p, y), slope) in points.iter().zip(y.to_vec1::<f32>().unwrap()).zip(slopes) {
            assert!((y as f64 - formula(*p)).abs() < 1e-6, "gelu_new({p}) = {y}");
            let h = 1e-4;
            let difference = (formula(p + h) - formula(p - h)) / (2.0 * h);
            assert!(
                (slope as f64 - difference).abs() < 1e-4,
                "slope at {p}: {slope}"
            );
        }
        let erf = gelu_erf(&Tensor::new(&[3f32], &Device::Cpu).unwrap()).unwrap();
        let erf = erf.to_vec1::<f32>().unwrap()[0] as f64;
        assert!(
            (erf - formula(3.0)).abs() > 3e-4,
            "the two forms differ at 3"
        );
    }

    #[test]
    fn layer_norm_matches_the_composed_ops_for_one_model_and_for_replicas() {
        // x (R·B, T, d) with R = 3 replicas of B = 2; γ and β (d) for one model, (R, d) for
        // the replicas. Values and the gradients of x, γ and β.
        let x = Var::from_tensor(&random((6, 5, 7, 1), 5).squeeze(3).unwrap()).unwrap();
        let upstream = random((6, 5, 7, 1), 6).squeeze(3).unwrap();
        for shape in [vec![7], vec![3, 7]] {
            let n = shape.iter().product();
            let param = |seed| {
                let data = crate::rng::normal_vec(&mut crate::rng::stream(seed, "ops"), n, 1.0);
                Var::from_tensor(&Tensor::from_vec(data, shape.as_slice(), &Device::Cpu).unwrap())
                    .unwrap()
            };
            let (gamma, beta) = (param(7), param(8));
            let run = |f: fn(&Tensor, &Tensor, &Tensor, f64) -> Result<Tensor>| {
                let y = f(x.as_tensor(), gamma.as_tensor(), beta.as_tensor(), 1e-5).unwrap();
                value_and_grads(&y, &upstream, &[&x, &gamma, &beta])
            };
            let (fused, composed) = (run(layer_norm), run(layer_norm_composed));
            for (name, values) in ["value", "dx", "dγ", "dβ"].iter().zip(&composed) {
                assert!(values.iter().any(|v| v.abs() > 1e-3), "{name} is zero");
            }
            assert_all_close(&fused, &composed, &["value", "dx", "dγ", "dβ"]);
        }
    }

    #[test]
    fn rms_norm_matches_the_composed_ops_for_one_model_and_for_replicas() {
        let x = Var::from_tensor(&random((6, 5, 7, 1), 9).squeeze(3).unwrap()).unwrap();
        let upstream = random((6, 5, 7, 1), 10).squeeze(3).unwrap();
        for shape in [vec![7], vec![3, 7]] {
            let n = shape.iter().product();
            let data = crate::rng::normal_vec(&mut crate::rng::stream(11, "ops"), n, 1.0);
            let gamma = Tensor::from_vec(data, shape.as_slice(), &Device::Cpu).unwrap();
            let gamma = Var::from_tensor(&gamma).unwrap();
            let run = |f: fn(&Tensor, &Tensor, f64) -> Result<Tensor>| {
                let y = f(x.as_tensor(), gamma.as_tensor(), 1e-5).unwrap();
                value_and_grads(&y, &upstream, &[&x, &gamma])
            };
            let (fused, composed) = (run(rms_norm), run(rms_norm_composed));
            assert_all_close(&fused, &composed, &["value", "dx", "dγ"]);
        }
    }

    /// RMSNorm and the L2 norm of a row by hand: [1, 2, 3] has mean square 14/3 and norm √14.
    #[test]
    fn rms_and_l2_norms_divide_by_the_root_of_the_mean_and_of_the_sum_of_squares() {
        let x = Tensor::new(&[[1f32, 2.0, 3.0]], &Device::Cpu).unwrap();
        for (norm, root) in [
            (RowNorm::Rms, (14f32 / 3.0).sqrt()),
            (RowNorm::L2, 14f32.sqrt()),
        ] {
            let got = normalise(&x, norm, 0.0).unwrap().to_vec2::<f32>().unwrap();
            for (got, x) in got[0].iter().zip([1f32, 2.0, 3.0]) {
                assert!((got - x / root).abs() < 1e-6, "{norm:?}: {got}");
            }
        }
    }

    #[test]
    fn fused_kernels_match_the_composed_ops() {
        let x = Var::from_tensor(&random((2, 3, 5, 7), 1)).unwrap();
        let upstream = random((2, 3, 5, 7), 2);
        for norm in [RowNorm::Standard, RowNorm::Rms, RowNorm::L2] {
            let fused = value_and_grad(|x| normalise(x, norm, 1e-5), &x, &upstream);
            let composed = value_and_grad(|x| normalise_composed(x, norm, 1e-5), &x, &upstream);
            assert_close(&fused.0, &composed.0, &format!("{norm:?} value"));
            assert_close(&fused.1, &composed.1, &format!("{norm:?} gradient"));
        }
        let gamma = Var::from_tensor(
            &random((1, 1, 1, 7), 3)
                .squeeze(0)
                .unwrap()
                .squeeze(0)
                .unwrap()
                .squeeze(0)
                .unwrap(),
        )
        .unwrap();
        let beta = random((1, 1, 1, 7), 4)
            .squeeze(0)
            .unwrap()
            .squeeze(0)
            .unwrap()
            .squeeze(0)
            .unwrap();
        let fused = value_and_grad(
            |x| layer_norm(x, gamma.as_tensor(), &beta, 1e-5),
            &x,
            &upstream,
        );
        let composed = value_and_grad(
            |x| layer_norm_composed(x, gamma.as_tensor(), &beta, 1e-5),
            &x,
            &upstream,
        );
        assert_close(&fused.0, &composed.0, "layer_norm value");
        assert_close(&fused.1, &composed.1, "layer_norm gradient");
        let fused = value_and_grad(gelu_erf, &x, &upstream);
        let composed = value_and_grad(|x| Ok(x.gelu_erf()?), &x, &upstream);
        assert_close(&fused.0, &composed.0, "gelu value");
        assert_close(&fused.1, &composed.1, "gelu gradient");
        let fused = value_and_grad(silu, &x, &upstream);
        let composed = value_and_grad(|x| Ok(x.silu()?), &x, &upstream);
        assert_close(&fused.0, &composed.0, "silu value");
        assert_close(&fused.1, &composed.1, "silu gradient");
        // The gate: both gradients, against the product of the composed ops.
        let gate = Var::from_tensor(&random((2, 3, 5, 7), 23)).unwrap();
        let run = |f: fn(&Tensor, &Tensor) -> Result<Tensor>| {
            let y = f(x.as_tensor(), gate.as_tensor()).unwrap();
            value_and_grads(&y, &upstream, &[&x, &gate])
        };
        let (fused, composed) = (run(silu_gate), run(silu_gate_composed));
        let names = ["silu_gate value", "silu_gate dx", "silu_gate dgate"];
        assert_all_close(&fused, &composed, &names);
        for causal in [false, true] {
            let fused = value_and_grad(|x| softmax_rows(x, causal), &x, &upstream);
            let composed = value_and_grad(|x| softmax_rows_composed(x, causal), &x, &upstream);
            assert_close(&fused.0, &composed.0, "softmax value");
            assert_close(&fused.1, &composed.1, "softmax gradient");
        }
    }

    #[test]
    fn biased_softmax_matches_the_composed_ops_in_value_and_both_gradients() {
        let x = Var::from_tensor(&random((2, 3, 5, 7), 18)).unwrap();
        let upstream = random((2, 3, 5, 7), 19);
        // Per-head and shared tables; five queries over seven keys (a block of queries).
        for bias in [
            random((1, 3, 5, 7), 20).squeeze(0).unwrap(),
            random((1, 1, 5, 7), 21).squeeze(0).unwrap(),
        ] {
            let bias = Var::from_tensor(&bias).unwrap();
            let run = |f: &dyn Fn(&Tensor, &Tensor) -> Result<Tensor>| {
                let out = f(x.as_tensor(), bias.as_tensor()).unwrap();
                value_and_grads(&out, &upstream, &[&x, &bias])
            };
            let fused = run(&|x, b| softmax_rows_biased(x, b, true));
            let composed = run(&|x, b| softmax_rows_composed(&x.broadcast_add(b)?, true));
            assert_all_close(&fused, &composed, &["value", "dx", "dbias"]);
        }
        // A constant bias gets no gradient work, and the result is the same.
        let fixed = random((1, 3, 5, 7), 22).squeeze(0).unwrap();
        let y = softmax_rows_biased(x.as_tensor(), &fixed, false).unwrap();
        let want =
            softmax_rows_composed(&x.as_tensor().broadcast_add(&fixed).unwrap(), false).unwrap();
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_close(&flat(&y), &flat(&want), "constant bias");
    }

    #[test]
    fn broadcast_add_matches_candle_in_value_and_both_gradients() {
        let x = Var::from_tensor(&random((2, 3, 5, 7), 15)).unwrap();
        let y = Var::from_tensor(&random((1, 3, 5, 7), 16).squeeze(0).unwrap()).unwrap();
        let upstream = random((2, 3, 5, 7), 17);
        let run = |f: &dyn Fn(&Tensor, &Tensor) -> Result<Tensor>| {
            let out = f(x.as_tensor(), y.as_tensor()).unwrap();
            value_and_grads(&out, &upstream, &[&x, &y])
        };
        let candle = run(&|x, y| Ok(x.broadcast_add(y)?));
        assert_all_close(&run(&add_broadcast), &candle, &["value", "dx", "dy"]);
        let wrong = Tensor::zeros((3, 7), DType::F32, &Device::Cpu).unwrap();
        assert!(add_broadcast(x.as_tensor(), &wrong).is_err());
    }

    #[test]
    fn fused_linear_matches_the_composed_op_in_value_and_every_gradient() {
        let x = Var::from_tensor(&random((2, 3, 5, 7), 5)).unwrap();
        let w = Var::from_tensor(
            &random((1, 1, 4, 7), 6)
                .squeeze(0)
                .unwrap()
                .squeeze(0)
                .unwrap(),
        )
        .unwrap();
        let b = Var::from_tensor(&random((1, 1, 1, 4), 7).flatten_all().unwrap()).unwrap();
        let upstream = random((2, 3, 5, 4), 8);
        type LinearFn = dyn Fn(&Tensor, &Tensor, Option<&Tensor>) -> Result<Tensor>;
        let run = |f: &LinearFn| {
            let y = f(x.as_tensor(), w.as_tensor(), Some(b.as_tensor())).unwrap();
            assert_eq!(y.dims(), &[2, 3, 5, 4]);
            value_and_grads(&y, &upstream, &[&x, &w, &b])
        };
        let names = ["value", "dx", "dW", "db"];
        assert_all_close(&run(&linear), &run(&linear_composed), &names);
        // Split into heads: x (B, T, in) = (6, 5, 7), 4 outputs as 2 heads of 2.
        let x3 = Var::from_tensor(&x.as_tensor().reshape((6, 5, 7)).unwrap()).unwrap();
        let upstream = random((6, 2, 5, 2), 14);
        type HeadsFn = dyn Fn(&Tensor, &Tensor, Option<&Tensor>, usize) -> Result<Tensor>;
        let run = |f: &HeadsFn| {
            let y = f(x3.as_tensor(), w.as_tensor(), Some(b.as_tensor()), 2).unwrap();
            assert_eq!(y.dims(), &[6, 2, 5, 2]);
            value_and_grads(&y, &upstream, &[&x3, &w, &b])
        };
        assert_all_close(&run(&linear_heads), &run(&linear_heads_composed), &names);
    }

    #[test]
    fn batched_matmul_matches_candle_in_value_and_gradients() {
        let a = Var::from_tensor(&random((2, 3, 5, 7), 9)).unwrap();
        let b = Var::from_tensor(&random((2, 3, 4, 7), 10)).unwrap();
        let upstream = random((2, 3, 5, 4), 11);
        let run = |f: &dyn Fn(&Tensor, &Tensor) -> Result<Tensor>| {
            let y = f(a.as_tensor(), &b.as_tensor().t().unwrap()).unwrap();
            value_and_grads(&y, &upstream, &[&a, &b])
        };
        let candle = run(&|a, b| Ok(a.matmul(b)?));
        assert_all_close(&run(&matmul), &candle, &["value", "da", "db"]);
        // Scaled (scores) and heads-merged (outputs) products, against candle's ops composed.
        let scaled = run(&|a, b| scaled_matmul(a, b, 0.3));
        let candle_scaled = run(&|a, b| Ok((a.matmul(b)? * 0.3)?));
        assert_all_close(&scaled, &candle_scaled, &["scaled", "da", "db"]);
        // Scores q·kᵀ read k (…, Tk, d) as it is, a transposed operand.
        let scores = run(&|q, kt| dot_scores(q, &kt.t()?, 0.3));
        assert_all_close(&scores, &candle_scaled, &["scores", "dq", "dk"]);
        let merged = |a: &Tensor, b: &Tensor| -> Result<Tensor> {
            // Back to (B, H, Tq, Dh) so that it compares with the plain product.
            let (batch, heads, tq, _) = a.dims4()?;
            let y = matmul_merge_heads(a, b)?;
            assert_eq!(y.dims(), &[batch, tq, heads * b.dim(3)?]);
            Ok(y.reshape((batch, tq, heads, b.dim(3)?))?.transpose(1, 2)?)
        };
        assert_all_close(&run(&merged), &candle, &["merged", "da", "db"]);
        // A batch smaller than the thread pool takes the one-product-at-a-time path.
        let (a, b) = (random((1, 1, 5, 7), 12), random((1, 1, 7, 3), 13));
        let flat = |t: Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let small = flat(matmul(&a, &b).unwrap());
        assert_close(&small, &flat(a.matmul(&b).unwrap()), "one product");
    }

    /// Off the CPU's f32 path (here f64, as a GPU's products go) the scale falls on the
    /// smallest of a, b and the product: the same value and gradients whichever it is.
    #[test]
    fn a_scaled_product_scales_its_smallest_operand_to_the_same_result() {
        let f64_var = |t: Tensor| Var::from_tensor(&t.to_dtype(DType::F64).unwrap()).unwrap();
        // (m, k, n): a smallest, b smallest, the product smallest.
        for (m, k, n) in [(3, 2, 9), (9, 2, 3), (4, 9, 5)] {
            let a = f64_var(random((2, 1, m, k), 21));
            let b = f64_var(random((2, 1, k, n), 22));
            let upstream = random((2, 1, m, n), 23).to_dtype(DType::F64).unwrap();
            let run = |f: &dyn Fn(&Tensor, &Tensor) -> Result<Tensor>| {
                let y = f(a.as_tensor(), b.as_tensor()).unwrap();
                let grads = (&y * &upstream)
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .backward()
                    .unwrap();
                [
                    &y,
                    grads.get(a.as_tensor()).unwrap(),
                    grads.get(b.as_tensor()).unwrap(),
                ]
                .map(|t| t.to_dtype(DType::F32).unwrap().flatten_all().unwrap())
                .map(|t| t.to_vec1::<f32>().unwrap())
            };
            let scaled = run(&|a, b| scaled_matmul(a, b, 0.3));
            let plain = run(&|a, b| Ok((a.matmul(b)? * 0.3)?));
            assert_all_close(&scaled, &plain, &["value", "da", "db"]);
        }
        assert_eq!(
            [
                smallest_of(1, 2, 3),
                smallest_of(2, 1, 3),
                smallest_of(3, 2, 1)
            ],
            [0, 1, 2]
        );
    }

    #[test]
    fn fast_erf_is_within_1e_6_of_libm() {
        let worst = (-60_000..=60_000)
            .map(|i| i as f32 * 1e-4)
            .map(|x| (elementwise::erf(x) - libm::erff(x)).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-6, "max |erf − erff| = {worst}");
        assert!((elementwise::erf(100.0) - 1.0).abs() < 1e-6);
        assert!((elementwise::erf(-100.0) + 1.0).abs() < 1e-6);
    }

    #[test]
    fn causal_softmax_masks_the_future() {
        let x = Tensor::zeros((1, 3, 3), DType::F32, &Device::Cpu).unwrap();
        let w = softmax_rows(&x, true)
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        assert_eq!(w[0], vec![1.0, 0.0, 0.0]);
        assert_eq!(w[1], vec![0.5, 0.5, 0.0]);
    }

    #[test]
    fn standardise_matches_layer_norm_and_has_gradients() {
        let x = Var::new(&[[1f32, 2.0, 3.0]], &Device::Cpu).unwrap();
        let y = normalise(x.as_tensor(), RowNorm::Standard, 0.0).unwrap();
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
