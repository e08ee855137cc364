//! The GPU side of the fused ops: launches the kernels of `kernels.cu`, which build.rs compiles
//! to PTX with `--features cuda`. Each function here is the `cuda_fwd` of one op of `ops/`
//! (`softmax.rs`, `layer_norm.rs`, `linear.rs`, `embedding.rs`, `adamw.rs`, …), taking and
//! returning contiguous f32 storages like its CPU twin.
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
/// Rows up to which [`column_sums`] takes one pass (`attnlab_column_sums_one_pass`, 32 threads
/// down the rows, 512 rows each at most) rather than partial sums and their total.
const ONE_PASS_ROWS: usize = 16_384;

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
    grid(
        (rows.div_ceil(ROWS_PER_BLOCK).max(1), 1, 1),
        (32 * ROWS_PER_BLOCK as u32, 1),
    )
}

/// A grid-stride loop over `n` elements.
fn per_element(n: usize) -> LaunchConfig {
    grid((n.div_ceil(256).clamp(1, 65_535), 1, 1), (256, 1))
}

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

/// `attnlab_standardise_grad`: the gradient of standardise from (dy, x, y = standardise(x)),
/// one warp per row.
pub fn standardise_grad(
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
    launch!(
        dev,
        "attnlab_standardise_grad",
        per_row(rows),
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

/// `attnlab_layer_norm`: γ ⊙ standardise(x) + β per row of x (rows, d), γ and β (R, d) for R
/// replicas of `rows / R` rows each (R = 1 for one model).
pub fn layer_norm(
    [(x, lx), (g, lg), (b, lb)]: [Operand<'_>; 3],
    eps: f32,
) -> Result<(CudaStorage, Shape)> {
    let dev = x.device();
    let (rows, d) = rows_and_width(lx);
    let replicas = (lg.shape().elem_count() / d).max(1);
    let out = output(dev, rows * d)?;
    let (xv, gv, bv) = (
        view::<f32>(x, lx)?,
        view::<f32>(g, lg)?,
        view::<f32>(b, lb)?,
    );
    launch!(
        dev,
        "attnlab_layer_norm",
        per_row(rows),
        &xv,
        &gv,
        &bv,
        &out,
        &(rows as i64),
        &(d as i32),
        &eps,
        &((rows / replicas).max(1) as i64)
    );
    Ok(wrap(out, dev, lx.shape().clone()))
}

/// LayerNorm's gradients from (dy, x, γ), flat as the CPU's: [dx | dγ (R·d) | dβ (R·d)].
/// `attnlab_layer_norm_grad` writes dx and the rows dγ and dβ sum; their column sums, a
/// replica's rows at a time, land after dx.
pub fn layer_norm_grad(
    [(dy, ldy), (x, lx), (g, lg)]: [Operand<'_>; 3],
    eps: f32,
) -> Result<(CudaStorage, Shape)> {
    let dev = x.device();
    let (rows, d) = rows_and_width(lx);
    let params = lg.shape().elem_count();
    let replicas = (params / d).max(1);
    let n = rows * d;
    let mut out = output(dev, n + 2 * params)?;
    let sums = output(dev, 2 * n)?;
    let (dyv, xv, gv) = (
        view::<f32>(dy, ldy)?,
        view::<f32>(x, lx)?,
        view::<f32>(g, lg)?,
    );
    let mut dx = out.slice_mut(0..n);
    launch!(
        dev,
        "attnlab_layer_norm_grad",
        per_row(rows),
        &dyv,
        &xv,
        &gv,
        &mut dx,
        &sums,
        &(rows as i64),
        &(d as i32),
        &eps,
        &((rows / replicas).max(1) as i64)
    );
    // [dy ⊙ ŷ; dy] in 2R blocks of rows: R of dγ, then R of dβ.
    let sums_layout = Layout::contiguous((2 * rows, d));
    let sums = CudaStorage::wrap_cuda_slice(sums, dev.clone());
    column_sums_into((&sums, &sums_layout), 2 * replicas, &mut out.slice_mut(n..))?;
    Ok(wrap(out, dev, n + 2 * params))
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

/// `attnlab_swap_middle_axes`: x (a, b, c, d) → (a, c, b, d), plus `bias` (c·d, one row of d
/// per index of c) if given: (B, T, H, D) → (B, H, T, D) splits heads, the reverse merges them.
pub fn swap_middle_axes(
    (x, l): Operand,
    bias: Option<Operand>,
    (a, b, c, d): (usize, usize, usize, usize),
) -> Result<CudaStorage> {
    let dev = x.device();
    let rows = a * b * c;
    let out = output(dev, rows * d)?;
    if rows * d == 0 {
        return Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()));
    }
    let xv = view::<f32>(x, l)?;
    // Without a bias the kernel is told so and given x in its place (never read).
    let (bv, has_bias) = match bias {
        Some((s, lb)) => (view::<f32>(s, lb)?, 1i32),
        None => (view::<f32>(x, l)?, 0),
    };
    // A block per output row of d, as many threads as d takes (whole warps, at most 256).
    let cfg = grid((rows, 1, 1), (d.next_multiple_of(32).min(256) as u32, 1));
    launch!(
        dev,
        "attnlab_swap_middle_axes",
        cfg,
        &xv,
        &bv,
        &has_bias,
        &out,
        &(b as i64),
        &(c as i64),
        &(d as i32)
    );
    Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
}

/// x Wᵀ + b for x (rows, in) and W (out, in), contiguous: cuBLAS's product (on TF32 or bf16
/// tensor cores where `device::use_precision` set candle's switches), then the bias added in
/// the pass that splits `heads` into
/// (B, heads, T, out / heads) for the `shape` given, or over (rows, out).
pub fn linear(
    (x, lx): Operand,
    (w, lw): Operand,
    b: Operand,
    rows: usize,
    shape: &Shape,
    heads: Option<usize>,
) -> Result<CudaStorage> {
    let (out_dim, in_dim) = lw.shape().dims2()?;
    let (Some((x_start, _)), Some((w_start, _))) =
        (lx.contiguous_offsets(), lw.contiguous_offsets())
    else {
        bail!("attnlab's CUDA linear takes contiguous x and W");
    };
    let x_flat = Layout::contiguous_with_offset((rows, in_dim), x_start);
    let w_t = Layout::contiguous_with_offset((out_dim, in_dim), w_start).transpose(0, 1)?;
    let y = x.matmul(w, (1, rows, out_dim, in_dim), &x_flat, &w_t)?;
    let y_layout = Layout::contiguous((rows, out_dim));
    match (heads, shape.dims()) {
        (Some(_), &[batch, heads, t, width]) => {
            swap_middle_axes((&y, &y_layout), Some(b), (batch, t, heads, width))
        }
        _ => Ok(add_broadcast((&y, &y_layout), b)?.0),
    }
}

/// Column sums (d) of (rows, d): [`block_column_sums`] of one block.
pub fn column_sums(x: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
    let (_, d) = rows_and_width(l);
    Ok((block_column_sums((x, l), 1)?, Shape::from(d)))
}

/// Column sums (blocks, d) of each of `blocks` equal blocks of rows of (rows, d).
pub fn block_column_sums(x: Operand, blocks: usize) -> Result<CudaStorage> {
    let dev = x.0.device();
    let (_, d) = rows_and_width(x.1);
    let mut out = output(dev, blocks * d)?;
    column_sums_into(x, blocks, &mut out.slice_mut(..))?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
}

/// [`block_column_sums`] written into `out` (blocks·d), in a fixed order: in one pass up to
/// [`ONE_PASS_ROWS`] rows a block, else partial sums of [`COLUMN_CHUNK_ROWS`] rows, then their
/// total.
fn column_sums_into(
    (x, l): Operand,
    blocks: usize,
    out: &mut candle_core::cuda_backend::cudarc::driver::CudaViewMut<'_, f32>,
) -> Result<()> {
    let dev = x.device();
    let (all_rows, d) = rows_and_width(l);
    let rows = all_rows / blocks.max(1);
    let xv = view::<f32>(x, l)?;
    if rows <= ONE_PASS_ROWS {
        let cfg = grid((d.div_ceil(32), blocks, 1), (32, 32));
        launch!(
            dev,
            "attnlab_column_sums_one_pass",
            cfg,
            &xv,
            out,
            &(rows as i64),
            &(d as i32)
        );
        return Ok(());
    }
    let chunks = rows.div_ceil(COLUMN_CHUNK_ROWS).max(1);
    let partial = output(dev, blocks * chunks * d)?;
    let cfg = grid((d.div_ceil(32), chunks, blocks), (32, 8));
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
    column_total(dev, &partial, out, (blocks, chunks, d))
}

/// `attnlab_column_total`: out (blocks, width) = each block's `chunks` partial rows of
/// `partial` (blocks, chunks, width) added in order.
fn column_total(
    dev: &CudaDevice,
    partial: &CudaSlice<f32>,
    out: &mut candle_core::cuda_backend::cudarc::driver::CudaViewMut<'_, f32>,
    (blocks, chunks, width): (usize, usize, usize),
) -> Result<()> {
    launch!(
        dev,
        "attnlab_column_total",
        grid((width.div_ceil(256), blocks, 1), (256, 1)),
        partial,
        out,
        &(chunks as i32),
        &(width as i32)
    );
    Ok(())
}

/// The sizes of a causal convolution: (replicas, sequences per replica, k, T, D).
pub type ConvShape = (usize, usize, usize, usize, usize);

/// `attnlab_causal_conv` (`input_grad: false`) or `attnlab_causal_conv_input_grad` (true):
/// an element-wise pass over (N, T, D) reading k taps of `x` (u, or the output's gradient)
/// with the kernel, plus the bias in the forward pass.
pub fn causal_conv(
    (x, lx): Operand,
    (w, lw): Operand,
    bias: Option<Operand>,
    (_, per_replica, k, t, d): ConvShape,
) -> Result<CudaStorage> {
    let dev = x.device();
    let n = lx.shape().elem_count();
    let out = output(dev, n)?;
    let (xv, wv) = (view::<f32>(x, lx)?, view::<f32>(w, lw)?);
    let sizes = (n as i64, t as i32, d as i32, k as i32, per_replica as i64);
    match bias {
        Some((b, lb)) => launch!(
            dev,
            "attnlab_causal_conv",
            per_element(n),
            &xv,
            &wv,
            &view::<f32>(b, lb)?,
            &out,
            &sizes.0,
            &sizes.1,
            &sizes.2,
            &sizes.3,
            &sizes.4
        ),
        None => launch!(
            dev,
            "attnlab_causal_conv_input_grad",
            per_element(n),
            &xv,
            &wv,
            &out,
            &sizes.0,
            &sizes.1,
            &sizes.2,
            &sizes.3,
            &sizes.4
        ),
    }
    Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
}

/// The convolution kernel's and bias's gradients (R, k + 1, D) from u and the output's
/// gradient g: partial sums over `chunk` sequences at a time, then their total, in a fixed
/// order.
pub fn causal_conv_kernel_grad(
    (u, lu): Operand,
    (g, lg): Operand,
    (replicas, per_replica, k, t, d): ConvShape,
    chunk: usize,
) -> Result<CudaStorage> {
    let dev = u.device();
    let width = (k + 1) * d;
    let chunks = per_replica.div_ceil(chunk).max(1);
    let partial = output(dev, replicas * chunks * width)?;
    let cfg = grid((width.div_ceil(128), chunks, replicas), (128, 1));
    launch!(
        dev,
        "attnlab_causal_conv_kernel_partials",
        cfg,
        &view::<f32>(u, lu)?,
        &view::<f32>(g, lg)?,
        &partial,
        &(t as i32),
        &(d as i32),
        &(k as i32),
        &(per_replica as i64),
        &(chunk as i64)
    );
    let mut out = output(dev, replicas * width)?;
    column_total(
        dev,
        &partial,
        &mut out.slice_mut(..),
        (replicas, chunks, width),
    )?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
}

/// `attnlab_block_broadcast`: x (R, M, n) combined with y (R, n) row by replica, a product
/// where `mul`, else a sum.
pub fn block_broadcast(
    (x, lx): Operand,
    (y, ly): Operand,
    replicas: usize,
    mul: bool,
) -> Result<CudaStorage> {
    let dev = x.device();
    let n_total = lx.shape().elem_count();
    let n = ly.shape().elem_count() / replicas.max(1);
    let out = output(dev, n_total)?;
    let (xv, yv) = (view::<f32>(x, lx)?, view::<f32>(y, ly)?);
    launch!(
        dev,
        "attnlab_block_broadcast",
        per_element(n_total),
        &xv,
        &yv,
        &out,
        &(n_total as i64),
        &((n_total / replicas.max(1)) as i64),
        &(n as i64),
        &i32::from(mul)
    );
    Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
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

/// The (vocab, d) gradient of the weight from dy (n_ids, d), each row summed over its tokens in
/// token order ([`super::embedding::tokens_by_id`]), a segment of them at a time as on the CPU
/// (`attnlab_embedding_grad_segments`, then `attnlab_embedding_grad` over the segments), so
/// the same on every run and the same bits as the CPU's.
///
/// The ids are copied to the host for that: one small copy that waits for the backward pass so
/// far (the step's gradient norm waits for all of it right after). A kernel that found each id's
/// tokens itself, a block per id scanning every id, was deterministic too but took 9.4 ms a
/// step in ncu at vocabulary 2048 × 65536 tokens on an H200; one serial sum per id, 8 ms (the
/// filler token's 60k rows).
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
    let segment = super::embedding::SEGMENT as u32;
    // Segments of at most SEGMENT tokens, an id's consecutive: [begin, end) in `order` each,
    // and id v's segments first_segment[v]..first_segment[v + 1]. Where no id has more than a
    // segment (gathered rows: one token each), a segment per id, empty for ids without
    // tokens, and the first pass alone writes the gradient.
    let one_each = offsets.windows(2).all(|w| w[1] - w[0] <= segment);
    let (begins, ends, first_segment) = if one_each {
        (offsets[..vocab].to_vec(), offsets[1..].to_vec(), Vec::new())
    } else {
        let (mut begins, mut ends, mut first_segment) = (Vec::new(), Vec::new(), Vec::new());
        for v in 0..vocab {
            first_segment.push(begins.len() as u32);
            let (start, end) = (offsets[v], offsets[v + 1]);
            for begin in (start..end).step_by(super::embedding::SEGMENT) {
                begins.push(begin);
                ends.push(end.min(begin + segment));
            }
        }
        first_segment.push(begins.len() as u32);
        (begins, ends, first_segment)
    };
    let (segments, n_order) = (begins.len(), order.len());
    // One copy to the device: [order | begins | ends | first_segment].
    let table = dev.clone_htod(&[order, begins, ends, first_segment].concat())?;
    let order = table.slice(0..n_order);
    let begins = table.slice(n_order..n_order + segments);
    let ends = table.slice(n_order + segments..n_order + 2 * segments);
    let first_segment = table.slice(n_order + 2 * segments..);
    let sums = output(dev, segments.max(1) * d)?;
    let columns = d.div_ceil(256);
    if segments > 0 {
        launch!(
            dev,
            "attnlab_embedding_grad_segments",
            grid((segments, columns, 1), (256, 1)),
            &view::<f32>(dy, ld)?,
            &order,
            &begins,
            &ends,
            &sums,
            &(d as i32)
        );
    }
    if one_each {
        return Ok(wrap(sums, dev, (vocab, d)));
    }
    let dw = output(dev, vocab * d)?;
    launch!(
        dev,
        "attnlab_embedding_grad",
        grid((vocab, columns, 1), (256, 1)),
        &sums,
        &first_segment,
        &dw,
        &(d as i32)
    );
    Ok(wrap(dw, dev, (vocab, d)))
}

/// Mean cross-entropy of logits (rows, v) against u32 targets: per-row losses, then their mean.
pub fn cross_entropy(
    (x, lx): (&CudaStorage, &Layout),
    (t, lt): (&CudaStorage, &Layout),
    groups: usize,
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
    let out = output(dev, groups)?;
    launch!(
        dev,
        "attnlab_group_means",
        blocks_of_256(groups),
        &per_row_loss,
        &out,
        &((rows / groups) as i64)
    );
    Ok(wrap(out, dev, groups))
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
    let groups = lg.shape().elem_count().max(1);
    launch!(
        dev,
        "attnlab_cross_entropy_grad",
        cfg,
        &xv,
        &tv,
        &gv,
        &out,
        &(rows as i64),
        &(v as i32),
        &((rows / groups).max(1) as i64)
    );
    Ok(wrap(out, dev, lx.shape().clone()))
}

/// Elements per block of the multi-tensor kernels (`MULTI_CHUNK` in kernels.cu).
const MULTI_CHUNK: usize = 4096;

/// The device address of a contiguous f32 tensor's first element. Valid while the tensor
/// lives: candle frees device memory in stream order, after the kernels launched before.
fn address(t: &candle_core::Tensor) -> Result<u64> {
    use candle_core::cuda_backend::cudarc::driver::DevicePtr;
    let (storage, layout) = t.storage_and_layout();
    let candle_core::Storage::Cuda(s) = &*storage else {
        bail!("attnlab's multi-tensor kernels take CUDA tensors");
    };
    let Some((start, _)) = layout.contiguous_offsets() else {
        bail!("attnlab's multi-tensor kernels take contiguous tensors");
    };
    let stream = s.device().cuda_stream();
    let (ptr, _sync) = s.as_cuda_slice::<f32>()?.device_ptr(&stream);
    Ok(ptr + (start * std::mem::size_of::<f32>()) as u64)
}

/// Blocks of [`MULTI_CHUNK`] elements for tensors of `sizes`: the first block of each and the
/// total. Empty tensors get none.
fn chunk_blocks(sizes: impl Iterator<Item = usize>) -> (Vec<i64>, usize) {
    let mut total = 0;
    let first = sizes
        .map(|n| {
            let first = total as i64;
            total += n.div_ceil(MULTI_CHUNK);
            first
        })
        .collect();
    (first, total)
}

/// A grid of `blocks` blocks of 256 threads.
fn blocks_of_256(blocks: usize) -> LaunchConfig {
    grid((blocks, 1, 1), (256, 1))
}

/// A launch of `blocks` (x, y, z) blocks of `threads` (x, y) threads.
fn grid((x, y, z): (usize, usize, usize), (tx, ty): (u32, u32)) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (x as u32, y as u32, z as u32),
        block_dim: (tx, ty, 1),
        shared_mem_bytes: 0,
    }
}

/// One tensor of `attnlab_sum_squares_multi` (`SumTensor` in kernels.cu, field for field).
#[repr(C)]
#[derive(Clone, Copy)]
struct SumTensor {
    x: u64,
    n: i64,
    first_block: i64,
}

// SAFETY: plain data, laid out as kernels.cu's struct.
unsafe impl candle_core::cuda_backend::cudarc::driver::DeviceRepr for SumTensor {}

/// Σ x² of each contiguous f32 tensor: one launch writes a partial sum per block, the host
/// adds each tensor's partials in block order (one copy back for all).
pub fn sum_squares_all(xs: &[candle_core::Tensor]) -> Result<Vec<f64>> {
    let Some(first) = xs.first() else {
        return Ok(Vec::new());
    };
    let candle_core::Device::Cuda(dev) = first.device() else {
        bail!("sum_squares_all: not a CUDA tensor");
    };
    let (starts, blocks) = chunk_blocks(xs.iter().map(|x| x.elem_count()));
    let table = xs
        .iter()
        .zip(&starts)
        .map(|(x, &first_block)| {
            Ok(SumTensor {
                x: address(x)?,
                n: x.elem_count() as i64,
                first_block,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut sums = vec![0.0; xs.len()];
    if blocks == 0 {
        return Ok(sums);
    }
    let table = dev.clone_htod(&table)?;
    let partial = output(dev, blocks)?;
    launch!(
        dev,
        "attnlab_sum_squares_multi",
        blocks_of_256(blocks),
        &table,
        &(xs.len() as i32),
        &partial
    );
    let partial = dev.clone_dtoh(&partial)?;
    for (i, x) in xs.iter().enumerate() {
        let first = starts[i] as usize;
        let chunks = x.elem_count().div_ceil(MULTI_CHUNK);
        sums[i] = partial[first..first + chunks]
            .iter()
            .map(|&p| f64::from(p))
            .sum();
    }
    Ok(sums)
}

/// One parameter of `attnlab_adam_multi` (`AdamTensor` in kernels.cu, field for field).
#[repr(C)]
#[derive(Clone, Copy)]
struct AdamTensor {
    p: u64,
    mv: u64,
    g: u64,
    n: i64,
    first_block: i64,
    constants: [f32; 7],
    pad: f32,
}

// SAFETY: plain data, laid out as kernels.cu's struct.
unsafe impl candle_core::cuda_backend::cudarc::driver::DeviceRepr for AdamTensor {}

/// AdamW's step of every (parameter, [m; v], gradient, rule) in one launch: moments and
/// parameter in one pass, in place. All contiguous f32 on one CUDA device.
pub fn adam_all(
    parts: &[(
        &candle_core::Tensor,
        &candle_core::Tensor,
        &candle_core::Tensor,
        super::AdamStep,
    )],
) -> Result<()> {
    let Some((first, ..)) = parts.first() else {
        return Ok(());
    };
    let candle_core::Device::Cuda(dev) = first.device() else {
        bail!("adam_all: not a CUDA tensor");
    };
    let (starts, blocks) = chunk_blocks(parts.iter().map(|(p, ..)| p.elem_count()));
    let table = parts
        .iter()
        .zip(&starts)
        .map(|(&(p, mv, g, s), &first_block)| {
            let n = p.elem_count();
            if mv.elem_count() != 2 * n || g.elem_count() != n {
                bail!(
                    "AdamW moments hold {} entries and the gradient {} for {n} parameters",
                    mv.elem_count(),
                    g.elem_count()
                );
            }
            Ok(AdamTensor {
                p: address(p)?,
                mv: address(mv)?,
                g: address(g)?,
                n: n as i64,
                first_block,
                constants: [
                    s.beta1,
                    s.beta2,
                    s.grad_scale,
                    s.decay,
                    s.step_size,
                    s.v_correction,
                    s.eps,
                ],
                pad: 0.0,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    if blocks == 0 {
        return Ok(());
    }
    let table = dev.clone_htod(&table)?;
    launch!(
        dev,
        "attnlab_adam_multi",
        blocks_of_256(blocks),
        &table,
        &(parts.len() as i32)
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
