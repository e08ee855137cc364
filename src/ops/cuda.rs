//! The GPU side of the fused ops: launches the kernels of `kernels.cu`, which build.rs compiles
//! to PTX with `--features cuda`. Each function here is the `cuda_fwd` of one op in `fused.rs`,
//! `embed.rs` or `adamw.rs`, taking and returning contiguous f32 storages like its CPU twin.
//!
//! `ATTNLAB_CUDA_KERNELS=0` turns them all off (the composed candle ops run instead): a switch
//! for measuring what they buy, and a way round a kernel that misbehaves on some GPU.

// A reviewed exception to the crate's `unsafe_code = "deny"`: launching a kernel and allocating
// its uninitialised output are unsafe in cudarc. Each launch passes exactly the parameters its
// kernel declares, in order and type, and every kernel writes every element of its output.
#![allow(unsafe_code)]

use std::sync::OnceLock;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, LaunchConfig, PushKernelArg};
use candle_core::{CudaDevice, CudaStorage, Layout, Result, Shape, bail};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/attnlab_kernels.ptx"));
const MODULE: &str = "attnlab";
/// Rows per block of the one-warp-per-row kernels (`ROWS_PER_BLOCK` in kernels.cu).
const ROWS_PER_BLOCK: usize = 4;
/// Rows each block sums in the first pass of [`column_sums`].
const COLUMN_CHUNK_ROWS: usize = 256;

/// Whether the fused CUDA kernels are on (`ATTNLAB_CUDA_KERNELS` other than `0`).
pub fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("ATTNLAB_CUDA_KERNELS").map_or(true, |v| v != "0"))
}

/// Launches kernel `$name` of attnlab's module with the arguments given, in order. One
/// expression, so that temporaries such as `&(n as i64)` live until the launch.
macro_rules! launch {
    ($dev:expr, $name:expr, $cfg:expr, $($arg:expr),+ $(,)?) => {{
        let func = $dev.get_or_load_custom_func($name, MODULE, PTX)?;
        // SAFETY: the arguments are the kernel's parameters, in order and type.
        unsafe { func.builder()$(.arg($arg))+.launch($cfg) }.w()?;
    }};
}

/// A storage and its layout.
pub type Operand<'a> = (&'a CudaStorage, &'a Layout);

/// The contiguous data of a storage as a device view of `T`.
fn view<'a, T: candle_core::cuda_backend::CudaDType>(
    storage: &'a CudaStorage,
    layout: &Layout,
) -> Result<CudaView<'a, T>> {
    let Some((start, end)) = layout.contiguous_offsets() else {
        bail!("attnlab's CUDA kernels take contiguous tensors");
    };
    Ok(storage.as_cuda_slice::<T>()?.slice(start..end))
}

/// An output buffer of `n` f32s that the kernel will fill entirely.
fn output(dev: &CudaDevice, n: usize) -> Result<CudaSlice<f32>> {
    // SAFETY: every kernel given such a buffer writes all of its n elements.
    unsafe { dev.alloc::<f32>(n) }
}

fn wrap(slice: CudaSlice<f32>, dev: &CudaDevice, shape: impl Into<Shape>) -> (CudaStorage, Shape) {
    (
        CudaStorage::wrap_cuda_slice(slice, dev.clone()),
        shape.into(),
    )
}

/// One warp per row, [`ROWS_PER_BLOCK`] rows per block.
fn per_row(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.div_ceil(ROWS_PER_BLOCK).max(1) as u32, 1, 1),
        block_dim: (32 * ROWS_PER_BLOCK as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A grid-stride loop over `n` elements.
fn per_element(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).clamp(1, 65_535) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block of 256 threads (the fixed-order reductions to one value).
const ONE_BLOCK: LaunchConfig = LaunchConfig {
    grid_dim: (1, 1, 1),
    block_dim: (256, 1, 1),
    shared_mem_bytes: 0,
};

/// (rows, d) of a layout whose last dimension is d.
fn rows_and_width(layout: &Layout) -> (usize, usize) {
    let d = layout.dims().last().copied().unwrap_or(1).max(1);
    (layout.shape().elem_count() / d, d)
}

/// `attnlab_standardise`: (x − mean) / √(var + eps) per row.
pub fn standardise(x: &CudaStorage, l: &Layout, eps: f32) -> Result<(CudaStorage, Shape)> {
    let dev = x.device();
    let (rows, d) = rows_and_width(l);
    let out = output(dev, rows * d)?;
    let cfg = per_row(rows);
    launch!(
        dev,
        "attnlab_standardise",
        cfg,
        &view::<f32>(x, l)?,
        &out,
        &(rows as i64),
        &(d as i32),
        &eps
    );
    Ok(wrap(out, dev, l.shape().clone()))
}

/// A one-warp-per-row kernel of three inputs shaped like its output, the first (rows, d), and
/// `eps`: `attnlab_layer_norm` (x, γ, β: γ ⊙ standardise(x) + β) and `attnlab_standardise_grad`
/// (dy, x, y = standardise(x)).
pub fn rows3(
    kernel: &'static str,
    [(a, la), (b, lb), (c, lc)]: [Operand<'_>; 3],
    eps: f32,
) -> Result<(CudaStorage, Shape)> {
    let dev = a.device();
    let (rows, d) = rows_and_width(la);
    let out = output(dev, rows * d)?;
    let (a, b, c) = (
        view::<f32>(a, la)?,
        view::<f32>(b, lb)?,
        view::<f32>(c, lc)?,
    );
    let cfg = per_row(rows);
    launch!(
        dev,
        kernel,
        cfg,
        &a,
        &b,
        &c,
        &out,
        &(rows as i64),
        &(d as i32),
        &eps
    );
    Ok(wrap(out, dev, la.shape().clone()))
}

/// `attnlab_row_softmax`: softmax per row, the causal mask of each (tq, tk) block applied.
pub fn row_softmax(x: &CudaStorage, l: &Layout, causal: bool) -> Result<(CudaStorage, Shape)> {
    let dev = x.device();
    let dims = l.dims();
    let (rows, tk) = rows_and_width(l);
    let tq = if dims.len() >= 2 {
        dims[dims.len() - 2]
    } else {
        1
    };
    let out = output(dev, rows * tk)?;
    let cfg = per_row(rows);
    let causal = i32::from(causal);
    let x = view::<f32>(x, l)?;
    launch!(
        dev,
        "attnlab_row_softmax",
        cfg,
        &x,
        &out,
        &(rows as i64),
        &(tq as i32),
        &(tk as i32),
        &causal
    );
    Ok(wrap(out, dev, l.shape().clone()))
}

/// `attnlab_row_softmax_bias`: softmax(x + bias) per row, the bias's rows repeated over x's.
pub fn row_softmax_bias(
    (x, lx): (&CudaStorage, &Layout),
    (bias, lb): (&CudaStorage, &Layout),
    causal: bool,
) -> Result<(CudaStorage, Shape)> {
    let dev = x.device();
    let dims = lx.dims();
    let (rows, tk) = rows_and_width(lx);
    let tq = if dims.len() >= 2 {
        dims[dims.len() - 2]
    } else {
        1
    };
    let bias_rows = (lb.shape().elem_count() / tk) as i64;
    let out = output(dev, rows * tk)?;
    let (xv, bv) = (view::<f32>(x, lx)?, view::<f32>(bias, lb)?);
    let cfg = per_row(rows);
    let causal = i32::from(causal);
    launch!(
        dev,
        "attnlab_row_softmax_bias",
        cfg,
        &xv,
        &bv,
        &out,
        &(rows as i64),
        &(tq as i32),
        &(tk as i32),
        &causal,
        &bias_rows
    );
    Ok(wrap(out, dev, lx.shape().clone()))
}

/// A kernel over (upstream, saved) pairs: per row (`attnlab_row_softmax_grad`) or per element
/// (`attnlab_gelu_erf_grad`), as `fused::ChunkGrad` on the CPU.
pub fn pair_grad(
    kernel: &'static str,
    per_row_kernel: bool,
    (upstream, l1): (&CudaStorage, &Layout),
    (saved, l2): (&CudaStorage, &Layout),
) -> Result<(CudaStorage, Shape)> {
    let dev = upstream.device();
    let (rows, d) = rows_and_width(l1);
    let out = output(dev, rows * d)?;
    let (up, saved) = (view::<f32>(upstream, l1)?, view::<f32>(saved, l2)?);
    if per_row_kernel {
        launch!(
            dev,
            kernel,
            per_row(rows),
            &up,
            &saved,
            &out,
            &(rows as i64),
            &(d as i32)
        );
    } else {
        let n = rows * d;
        launch!(dev, kernel, per_element(n), &up, &saved, &out, &(n as i64));
    }
    Ok(wrap(out, dev, l1.shape().clone()))
}

/// `attnlab_gelu_erf`: x·Φ(x).
pub fn gelu_erf(x: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
    let dev = x.device();
    let n = l.shape().elem_count();
    let out = output(dev, n)?;
    launch!(
        dev,
        "attnlab_gelu_erf",
        per_element(n),
        &view::<f32>(x, l)?,
        &out,
        &(n as i64)
    );
    Ok(wrap(out, dev, l.shape().clone()))
}

/// `attnlab_add_broadcast`: x + y, y the trailing dimensions of x.
pub fn add_broadcast(
    (x, l1): (&CudaStorage, &Layout),
    (y, l2): (&CudaStorage, &Layout),
) -> Result<(CudaStorage, Shape)> {
    let dev = x.device();
    let (n, ny) = (l1.shape().elem_count(), l2.shape().elem_count());
    let out = output(dev, n)?;
    let (xv, yv) = (view::<f32>(x, l1)?, view::<f32>(y, l2)?);
    launch!(
        dev,
        "attnlab_add_broadcast",
        per_element(n),
        &xv,
        &yv,
        &out,
        &(n as i64),
        &(ny as i64)
    );
    Ok(wrap(out, dev, l1.shape().clone()))
}

/// Column sums (d) of (rows, d): partial sums of [`COLUMN_CHUNK_ROWS`] rows, then their total,
/// both in a fixed order.
pub fn column_sums(x: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
    let dev = x.device();
    let (rows, d) = rows_and_width(l);
    let chunks = rows.div_ceil(COLUMN_CHUNK_ROWS).max(1);
    let partial = output(dev, chunks * d)?;
    let cfg = LaunchConfig {
        grid_dim: (d.div_ceil(32) as u32, chunks as u32, 1),
        block_dim: (32, 8, 1),
        shared_mem_bytes: 0,
    };
    let xv = view::<f32>(x, l)?;
    let chunk = COLUMN_CHUNK_ROWS as i64;
    launch!(
        dev,
        "attnlab_column_partials",
        cfg,
        &xv,
        &partial,
        &(rows as i64),
        &(d as i32),
        &chunk
    );
    let out = output(dev, d)?;
    let cfg = LaunchConfig {
        grid_dim: (d.div_ceil(256) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    launch!(
        dev,
        "attnlab_column_total",
        cfg,
        &partial,
        &out,
        &(chunks as i32),
        &(d as i32)
    );
    Ok(wrap(out, dev, d))
}

/// `attnlab_embedding`: rows of the (vocab, d) weight at the u32 ids.
pub fn embedding(
    (w, lw): (&CudaStorage, &Layout),
    (ids, li): (&CudaStorage, &Layout),
) -> Result<(CudaStorage, Shape)> {
    let dev = w.device();
    let (vocab, d) = rows_and_width(lw);
    let n_ids = li.shape().elem_count();
    let out = output(dev, n_ids * d)?;
    let (wv, iv) = (view::<f32>(w, lw)?, view::<u32>(ids, li)?);
    let cfg = per_element(n_ids * d);
    launch!(
        dev,
        "attnlab_embedding",
        cfg,
        &wv,
        &iv,
        &out,
        &(n_ids as i64),
        &(d as i32),
        &(vocab as i32)
    );
    Ok(wrap(out, dev, (n_ids, d)))
}

/// `attnlab_embedding_grad`: the (vocab, d) gradient of the weight from dy (n_ids, d), each
/// row summed over its tokens in token order
/// ([`super::embedding::tokens_by_id`]), so the same on every run.
///
/// The ids are copied to the host for that: one small copy that waits for the backward pass so
/// far (the step's gradient norm waits for all of it right after). A kernel that found each id's
/// tokens itself, a block per id scanning every id, was deterministic too but took 9.4 ms a
/// step in ncu at vocabulary 2048 × 65536 tokens on an H200.
pub fn embedding_grad(
    (dy, ld): (&CudaStorage, &Layout),
    (ids, li): (&CudaStorage, &Layout),
    vocab: usize,
) -> Result<(CudaStorage, Shape)> {
    let dev = dy.device();
    let (_, d) = rows_and_width(ld);
    if vocab * d == 0 {
        return Ok(wrap(output(dev, 0)?, dev, (vocab, d)));
    }
    let host_ids = dev.clone_dtoh(&view::<u32>(ids, li)?)?;
    let (offsets, order) = super::embedding::tokens_by_id(&host_ids, vocab);
    let (offsets, order) = (dev.clone_htod(&offsets)?, dev.clone_htod(&order)?);
    let dw = output(dev, vocab * d)?;
    let dv = view::<f32>(dy, ld)?;
    let cfg = LaunchConfig {
        grid_dim: (vocab.max(1) as u32, d.div_ceil(256) as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    launch!(
        dev,
        "attnlab_embedding_grad",
        cfg,
        &dv,
        &order,
        &offsets,
        &dw,
        &(d as i32)
    );
    Ok(wrap(dw, dev, (vocab, d)))
}

/// Mean cross-entropy of logits (rows, v) against u32 targets: per-row losses, then their mean.
pub fn cross_entropy(
    (x, lx): (&CudaStorage, &Layout),
    (t, lt): (&CudaStorage, &Layout),
) -> Result<(CudaStorage, Shape)> {
    let dev = x.device();
    let (rows, v) = rows_and_width(lx);
    let per_row_loss = output(dev, rows)?;
    let (xv, tv) = (view::<f32>(x, lx)?, view::<u32>(t, lt)?);
    let cfg = per_row(rows);
    launch!(
        dev,
        "attnlab_cross_entropy_rows",
        cfg,
        &xv,
        &tv,
        &per_row_loss,
        &(rows as i64),
        &(v as i32)
    );
    let out = output(dev, 1)?;
    launch!(
        dev,
        "attnlab_mean",
        ONE_BLOCK,
        &per_row_loss,
        &out,
        &(rows as i64)
    );
    Ok(wrap(out, dev, ()))
}

/// The gradient of [`cross_entropy`] with respect to the logits, g the upstream gradient.
pub fn cross_entropy_grad(
    (x, lx): (&CudaStorage, &Layout),
    (t, lt): (&CudaStorage, &Layout),
    (g, lg): (&CudaStorage, &Layout),
) -> Result<(CudaStorage, Shape)> {
    let dev = x.device();
    let (rows, v) = rows_and_width(lx);
    let out = output(dev, rows * v)?;
    let (xv, tv, gv) = (
        view::<f32>(x, lx)?,
        view::<u32>(t, lt)?,
        view::<f32>(g, lg)?,
    );
    let cfg = per_row(rows);
    launch!(
        dev,
        "attnlab_cross_entropy_grad",
        cfg,
        &xv,
        &tv,
        &gv,
        &out,
        &(rows as i64),
        &(v as i32)
    );
    Ok(wrap(out, dev, lx.shape().clone()))
}

/// Σ x², one value on the device.
pub fn sum_squares(x: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
    let dev = x.device();
    let n = l.shape().elem_count();
    let out = output(dev, 1)?;
    launch!(
        dev,
        "attnlab_sum_squares",
        ONE_BLOCK,
        &view::<f32>(x, l)?,
        &out,
        &(n as i64)
    );
    Ok(wrap(out, dev, ()))
}

/// The mutable contiguous data of an in-place op's destination.
fn view_mut<'a>(
    storage: &'a mut CudaStorage,
    layout: &Layout,
) -> Result<candle_core::cuda_backend::cudarc::driver::CudaViewMut<'a, f32>> {
    let Some((start, end)) = layout.contiguous_offsets() else {
        bail!("attnlab's CUDA kernels take contiguous tensors");
    };
    Ok(storage.as_cuda_slice_mut::<f32>()?.slice_mut(start..end))
}

/// AdamW's moments [m; v] (2n) updated in place from the gradient g (n).
pub fn adam_moments(
    (mv, lmv): (&mut CudaStorage, &Layout),
    (g, lg): (&CudaStorage, &Layout),
    [beta1, beta2, scale]: [f32; 3],
) -> Result<()> {
    let dev = g.device().clone();
    let n = lg.shape().elem_count();
    let gv = view::<f32>(g, lg)?;
    let mut mvv = view_mut(mv, lmv)?;
    launch!(
        dev,
        "attnlab_adam_moments",
        per_element(n),
        &mut mvv,
        &gv,
        &(n as i64),
        &beta1,
        &beta2,
        &scale
    );
    Ok(())
}

/// AdamW's parameter update in place from the moments [m; v].
pub fn adam_param(
    (p, lp): (&mut CudaStorage, &Layout),
    (mv, lmv): (&CudaStorage, &Layout),
    [decay, step_size, v_correction, eps]: [f32; 4],
) -> Result<()> {
    let dev = mv.device().clone();
    let n = lp.shape().elem_count();
    let mvv = view::<f32>(mv, lmv)?;
    let mut pv = view_mut(p, lp)?;
    let cfg = per_element(n);
    launch!(
        dev,
        "attnlab_adam_param",
        cfg,
        &mut pv,
        &mvv,
        &(n as i64),
        &decay,
        &step_size,
        &v_correction,
        &eps
    );
    Ok(())
}

/// `attnlab_dropout`: the mask of dropout.rs, (threshold, scale), one key per replica block
/// of `block` elements.
pub fn dropout(
    x: &CudaStorage,
    l: &Layout,
    (threshold, scale): (u32, f32),
    keys: &[u64],
    block: usize,
) -> Result<(CudaStorage, Shape)> {
    let dev = x.device();
    let n = l.shape().elem_count();
    let out = output(dev, n)?;
    let xv = view::<f32>(x, l)?;
    let nkeys = keys.len().max(1) as i64;
    let keys = dev.clone_htod(keys)?;
    let cfg = per_element(n);
    let block = block as i64;
    launch!(
        dev,
        "attnlab_dropout",
        cfg,
        &xv,
        &out,
        &(n as i64),
        &threshold,
        &scale,
        &keys,
        &nkeys,
        &block
    );
    Ok(wrap(out, dev, l.shape().clone()))
}

/// The kernels' `FlashShape`, field for field (kernels.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FlashShape {
    heads_rows: i64,
    h: i32,
    t: i32,
    d: i32,
    dv: i32,
    hb: i32,
    scale: f32,
    causal: i32,
}

// SAFETY: a plain #[repr(C)] struct of integers and a float, laid out as the kernels' struct.
unsafe impl candle_core::cuda_backend::cudarc::driver::DeviceRepr for FlashShape {}

impl FlashShape {
    /// q (B, H, T, D), v (B, H, T, Dv), the bias (Hb, T, T) if any.
    pub fn new(
        q: &Layout,
        v: &Layout,
        bias: Option<&Layout>,
        scale: f32,
        causal: bool,
    ) -> Result<Self> {
        let (&[b, h, t, d], &[_, _, _, dv]) = (q.dims(), v.dims()) else {
            bail!("flash attention takes q, k, v of rank 4");
        };
        let hb = bias.map_or(0, |l| l.shape().elem_count() / (t * t).max(1));
        Ok(Self {
            heads_rows: (b * h * t) as i64,
            h: h as i32,
            t: t as i32,
            d: d as i32,
            dv: dv as i32,
            hb: hb as i32,
            scale,
            causal: i32::from(causal),
        })
    }

    fn rows(&self) -> usize {
        self.heads_rows as usize
    }
}

/// Flash attention forward: the output (B, T, H·Dv) and each row's log-sum-exp (B·H·T), which
/// the backward needs.
pub fn flash_forward(
    [q, k, v]: [Operand<'_>; 3],
    bias: Option<Operand<'_>>,
    shape: FlashShape,
) -> Result<(CudaStorage, CudaSlice<f32>)> {
    let dev = q.0.device();
    let rows = shape.rows();
    let out = output(dev, rows * shape.dv as usize)?;
    let lse = output(dev, rows)?;
    let (qv, kv, vv) = (
        view::<f32>(q.0, q.1)?,
        view::<f32>(k.0, k.1)?,
        view::<f32>(v.0, v.1)?,
    );
    let cfg = per_row(rows);
    match bias {
        Some((b, lb)) => {
            let bv = view::<f32>(b, lb)?;
            launch!(
                dev,
                "attnlab_flash_fwd_bias",
                cfg,
                &qv,
                &kv,
                &vv,
                &bv,
                &out,
                &lse,
                &shape
            );
        }
        None => launch!(
            dev,
            "attnlab_flash_fwd",
            cfg,
            &qv,
            &kv,
            &vv,
            &out,
            &lse,
            &shape
        ),
    }
    Ok((CudaStorage::wrap_cuda_slice(out, dev.clone()), lse))
}

/// Flash attention backward: dq, dk and dv side by side in one buffer
/// (B·H·T·(2·D + Dv) entries, in that order), from the forward's output, its log-sum-exp and
/// the output's gradient.
pub fn flash_backward(
    [q, k, v]: [Operand<'_>; 3],
    bias: Option<Operand<'_>>,
    [out, dout]: [Operand<'_>; 2],
    lse: &CudaSlice<f32>,
    shape: FlashShape,
) -> Result<CudaStorage> {
    let dev = q.0.device();
    let rows = shape.rows();
    let (d, dv) = (shape.d as usize, shape.dv as usize);
    let (qv, kv, vv) = (
        view::<f32>(q.0, q.1)?,
        view::<f32>(k.0, k.1)?,
        view::<f32>(v.0, v.1)?,
    );
    let (ov, dov) = (view::<f32>(out.0, out.1)?, view::<f32>(dout.0, dout.1)?);
    let delta = output(dev, rows)?;
    let cfg = per_row(rows);
    launch!(dev, "attnlab_flash_delta", cfg, &dov, &ov, &delta, &shape);
    let mut grads = output(dev, rows * (2 * d + dv))?;
    {
        let (mut dq, mut rest) = grads.split_at_mut(rows * d);
        let (mut dk, mut dvv) = rest.split_at_mut(rows * d);
        match bias {
            Some((b, lb)) => {
                let bv = view::<f32>(b, lb)?;
                launch!(
                    dev,
                    "attnlab_flash_dq_bias",
                    cfg,
                    &qv,
                    &kv,
                    &vv,
                    &bv,
                    &dov,
                    lse,
                    &delta,
                    &mut dq,
                    &shape
                );
                launch!(
                    dev,
                    "attnlab_flash_dkv_bias",
                    cfg,
                    &qv,
                    &kv,
                    &vv,
                    &bv,
                    &dov,
                    lse,
                    &delta,
                    &mut dk,
                    &mut dvv,
                    &shape
                );
            }
            None => {
                launch!(
                    dev,
                    "attnlab_flash_dq",
                    cfg,
                    &qv,
                    &kv,
                    &vv,
                    &dov,
                    lse,
                    &delta,
                    &mut dq,
                    &shape
                );
                launch!(
                    dev,
                    "attnlab_flash_dkv",
                    cfg,
                    &qv,
                    &kv,
                    &vv,
                    &dov,
                    lse,
                    &delta,
                    &mut dk,
                    &mut dvv,
                    &shape
                );
            }
        }
    }
    Ok(CudaStorage::wrap_cuda_slice(grads, dev.clone()))
}
