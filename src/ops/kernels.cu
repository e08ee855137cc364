// attnlab's CUDA kernels: the GPU side of the fused ops of `src/ops/` and of AdamW's step.
//
// Compiled to PTX by build.rs, only with `--features cuda`. Every kernel takes contiguous f32
// data (the Rust side makes inputs contiguous first) and is the GPU twin of a CPU kernel with
// the same name in Rust; tests/gpu.rs checks each against the composed candle ops, in value and
// gradient. Layout conventions:
// - "rows" kernels treat the data as (rows, d), d the last dimension, and give each row one
//   warp (32 lanes, ROWS_PER_BLOCK rows per block): rows here are short (64 to a few thousand
//   entries), where a warp's shuffles beat a block-wide reduction through shared memory;
// - element-wise kernels use a grid-stride loop over n elements.
// Sums run in a fixed order (no atomics), so a step gives the same numbers run to run on the
// same GPU: a stopped run resumes exactly as on the CPU.

#include <stdint.h>

#define WARP 32
#ifndef ROWS_PER_BLOCK  // rows (warps) per block; cuda.rs launches blocks of 32·ROWS_PER_BLOCK
#define ROWS_PER_BLOCK 4
#endif
#define FULL_MASK 0xffffffffu

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = WARP / 2; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(FULL_MASK, v, offset);
    }
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = WARP / 2; offset > 0; offset >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, offset));
    }
    return v;
}

// The row this warp handles, or -1 past the end; `lane` is set to the thread's lane.
__device__ __forceinline__ long long warp_row(long long rows, int *lane) {
    *lane = threadIdx.x % WARP;
    long long row = (long long)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    return row < rows ? row : -1;
}

// Mean and 1/sqrt(var + eps) of a row, in two passes (the row stays in cache).
__device__ __forceinline__ void row_moments(const float *x, int d, int lane, float eps,
                                            float *mean, float *inv_std) {
    float sum = 0.f;
    for (int c = lane; c < d; c += WARP) sum += x[c];
    float m = warp_sum(sum) / d;
    float sq = 0.f;
    for (int c = lane; c < d; c += WARP) {
        float t = x[c] - m;
        sq += t * t;
    }
    *mean = m;
    *inv_std = rsqrtf(warp_sum(sq) / d + eps);
}

// y = (x − mean) / sqrt(var + eps) per row.
extern "C" __global__ void attnlab_standardise(const float *x, float *y, long long rows, int d,
                                               float eps) {
    int lane;
    long long row = warp_row(rows, &lane);
    if (row < 0) return;
    const float *xr = x + row * d;
    float *yr = y + row * d;
    float mean, inv;
    row_moments(xr, d, lane, eps, &mean, &inv);
    for (int c = lane; c < d; c += WARP) yr[c] = (xr[c] - mean) * inv;
}

// y = γ ⊙ standardise(x) + β per row, γ and β (d) those of the row's replica: row r takes
// γ[r / per_replica] (per_replica = rows for one model).
extern "C" __global__ void attnlab_layer_norm(const float *x, const float *gamma,
                                              const float *beta, float *y, long long rows, int d,
                                              float eps, long long per_replica) {
    int lane;
    long long row = warp_row(rows, &lane);
    if (row < 0) return;
    const float *xr = x + row * d;
    const float *g = gamma + (row / per_replica) * d, *b = beta + (row / per_replica) * d;
    float *yr = y + row * d;
    float mean, inv;
    row_moments(xr, d, lane, eps, &mean, &inv);
    for (int c = lane; c < d; c += WARP) yr[c] = (xr[c] - mean) * inv * g[c] + b[c];
}

// LayerNorm's backward per row, γ of the row's replica as above: dx = (ĝ − mean(ĝ) − ŷ·mean(ĝ·ŷ))/σ
// with ĝ = dy ⊙ γ and ŷ = standardise(x); and, for dγ and dβ as column sums, sums[row] = dy ⊙ ŷ
// and sums[rows + row] = dy (sums is (2·rows, d)).
extern "C" __global__ void attnlab_layer_norm_grad(const float *dy, const float *x,
                                                   const float *gamma, float *dx, float *sums,
                                                   long long rows, int d, float eps,
                                                   long long per_replica) {
    int lane;
    long long row = warp_row(rows, &lane);
    if (row < 0) return;
    const long long o = row * d;
    const float *g = gamma + (row / per_replica) * d;
    float mean, inv;
    row_moments(x + o, d, lane, eps, &mean, &inv);
    float s_g = 0.f, s_gy = 0.f;
    for (int c = lane; c < d; c += WARP) {
        float y = (x[o + c] - mean) * inv, gy = dy[o + c] * g[c];
        s_g += gy;
        s_gy += gy * y;
        sums[o + c] = dy[o + c] * y;
        sums[rows * d + o + c] = dy[o + c];
    }
    float mean_g = warp_sum(s_g) / d, mean_gy = warp_sum(s_gy) / d;
    for (int c = lane; c < d; c += WARP) {
        float y = (x[o + c] - mean) * inv;
        dx[o + c] = inv * (dy[o + c] * g[c] - mean_g - y * mean_gy);
    }
}

// dx = (dy − mean(dy) − y·mean(dy·y)) / σ per row, y = standardise(x).
extern "C" __global__ void attnlab_standardise_grad(const float *dy, const float *x,
                                                    const float *y, float *dx, long long rows,
                                                    int d, float eps) {
    int lane;
    long long row = warp_row(rows, &lane);
    if (row < 0) return;
    long long o = row * d;
    float mean, inv;
    row_moments(x + o, d, lane, eps, &mean, &inv);
    float s_dy = 0.f, s_dyy = 0.f;
    for (int c = lane; c < d; c += WARP) {
        s_dy += dy[o + c];
        s_dyy += dy[o + c] * y[o + c];
    }
    float mean_dy = warp_sum(s_dy) / d;
    float mean_dyy = warp_sum(s_dyy) / d;
    for (int c = lane; c < d; c += WARP) {
        dx[o + c] = inv * (dy[o + c] - mean_dy - y[o + c] * mean_dyy);
    }
}

// Softmax of one row of length tk, keys from `visible` on masked (weight exactly 0); with a
// bias row b, of x + b.
__device__ __forceinline__ void softmax_row(const float *xr, const float *br, float *yr, int tk,
                                            int visible, int lane) {
    float m = -INFINITY;
    for (int c = lane; c < visible; c += WARP) m = fmaxf(m, xr[c] + (br ? br[c] : 0.f));
    m = warp_max(m);
    float sum = 0.f;
    for (int c = lane; c < visible; c += WARP) sum += expf(xr[c] + (br ? br[c] : 0.f) - m);
    float inv = 1.f / warp_sum(sum);
    for (int c = lane; c < tk; c += WARP) {
        yr[c] = c < visible ? expf(xr[c] + (br ? br[c] : 0.f) - m) * inv : 0.f;
    }
}

// Keys row `row` of a (…, tq, tk) tensor sees: with `causal`, keys j ≤ i + (tk − tq) of query i.
__device__ __forceinline__ int visible_keys(long long row, int tq, int tk, int causal) {
    if (!causal) return tk;
    int offset = tk > tq ? tk - tq : 0;
    int visible = (int)(row % tq) + 1 + offset;
    return visible < tk ? visible : tk;
}

// Softmax of each row of a (…, tq, tk) tensor. With `causal`, row i of each (tq, tk) block sees
// keys j ≤ i + (tk − tq) only; the others get exactly 0.
extern "C" __global__ void attnlab_row_softmax(const float *x, float *y, long long rows, int tq,
                                               int tk, int causal) {
    int lane;
    long long row = warp_row(rows, &lane);
    if (row < 0) return;
    softmax_row(x + row * tk, nullptr, y + row * tk, tk, visible_keys(row, tq, tk, causal), lane);
}

// softmax(x + bias) per row, as attnlab_row_softmax; the bias has `bias_rows` rows of tk
// (a (H, tq, tk) or (1, tq, tk) table) repeated over x's leading dimensions.
extern "C" __global__ void attnlab_row_softmax_bias(const float *x, const float *bias, float *y,
                                                    long long rows, int tq, int tk, int causal,
                                                    long long bias_rows) {
    int lane;
    long long row = warp_row(rows, &lane);
    if (row < 0) return;
    const float *br = bias + (row % bias_rows) * tk;
    softmax_row(x + row * tk, br, y + row * tk, tk, visible_keys(row, tq, tk, causal), lane);
}

// ds = w ⊙ (dw − Σ dw·w) per row (masked entries have w = 0 and get 0).
extern "C" __global__ void attnlab_row_softmax_grad(const float *dw, const float *w, float *ds,
                                                    long long rows, int d) {
    int lane;
    long long row = warp_row(rows, &lane);
    if (row < 0) return;
    long long o = row * d;
    float dot = 0.f;
    for (int c = lane; c < d; c += WARP) dot += dw[o + c] * w[o + c];
    dot = warp_sum(dot);
    for (int c = lane; c < d; c += WARP) ds[o + c] = w[o + c] * (dw[o + c] - dot);
}

#define GRID_STRIDE(i, n)                                                                \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n);        \
         i += (long long)blockDim.x * gridDim.x)

// GELU, exact erf form: x·Φ(x).
extern "C" __global__ void attnlab_gelu_erf(const float *x, float *y, long long n) {
    GRID_STRIDE(i, n) { y[i] = 0.5f * x[i] * (1.f + erff(x[i] * 0.70710678118654752f)); }
}

// dx = dy·(Φ(x) + x·φ(x)).
extern "C" __global__ void attnlab_gelu_erf_grad(const float *dy, const float *x, float *dx,
                                                 long long n) {
    GRID_STRIDE(i, n) {
        float v = x[i];
        float cdf = 0.5f * (1.f + erff(v * 0.70710678118654752f));
        float pdf = 0.39894228040143268f * expf(-0.5f * v * v);
        dx[i] = dy[i] * (cdf + v * pdf);
    }
}

// out = x + y, y repeated over x's leading dimensions (ny divides n).
extern "C" __global__ void attnlab_add_broadcast(const float *x, const float *y, float *out,
                                                 long long n, long long ny) {
    GRID_STRIDE(i, n) { out[i] = x[i] + y[i % ny]; }
}

// y (a, c, b, d) = x (a, b, c, d) with its middle axes swapped, plus bias[k·d + l] at (i, k, j, l)
// when has_bias: (B, T, H, D) → (B, H, T, D) splits heads (with the projection's bias), the
// reverse merges them. A block per output row (i, k, j) of d, its index found once: per
// element, three 64-bit divisions made the kernel compute-bound.
extern "C" __global__ void attnlab_swap_middle_axes(const float *x, const float *bias,
                                                    int has_bias, float *y, long long b,
                                                    long long c, int d) {
    const long long r = blockIdx.x;
    const long long j = r % b, ik = r / b;
    const long long k = ik % c, i = ik / c;
    const float *src = x + ((i * b + j) * c + k) * d;
    float *dst = y + r * d;
    if (has_bias) {
        const float *row_bias = bias + k * d;
        for (int l = threadIdx.x; l < d; l += blockDim.x) dst[l] = src[l] + row_bias[l];
    } else {
        for (int l = threadIdx.x; l < d; l += blockDim.x) dst[l] = src[l];
    }
}

// x (R, M, n) combined with y (R, n), y's row r with every row of x's block r (replicas.rs's
// BlockBroadcast): x·y where mul, else x + y.
extern "C" __global__ void attnlab_block_broadcast(const float *x, const float *y, float *out,
                                                   long long n_total, long long per_replica,
                                                   long long n, int mul) {
    GRID_STRIDE(i, n_total) {
        float yv = y[(i / per_replica) * n + i % n];
        out[i] = mul ? x[i] * yv : x[i] + yv;
    }
}

// ---------------------------------------------------------------------------------------------
// The depthwise causal convolution of conv.rs: u, y (N, T, D); kernel (R, k, D), bias (R, D)
// for R replicas of per_replica sequences each (R = 1 for one model).

// y[s, t, c] = bias[r, c] + Σ_j kernel[r, j, c] · u[s, t − (k − 1) + j, c], taps before the start
// left out, in tap order.
extern "C" __global__ void attnlab_causal_conv(const float *u, const float *kernel,
                                               const float *bias, float *y, long long n, int t,
                                               int d, int k, long long per_replica) {
    GRID_STRIDE(i, n) {
        int c = (int)(i % d);
        int step = (int)((i / d) % t);
        long long r = i / ((long long)t * d) / per_replica;
        const float *w = kernel + r * k * d + c;
        float acc = bias[r * d + c];
        for (int j = max(0, k - 1 - step); j < k; ++j) acc += u[i + (long long)(j + 1 - k) * d] * w[j * d];
        y[i] = acc;
    }
}

// du[s, t, c] = Σ_j g[s, t + (k − 1) − j, c] · kernel[r, j, c] over the taps that land in the
// sequence.
extern "C" __global__ void attnlab_causal_conv_input_grad(const float *g, const float *kernel,
                                                          float *du, long long n, int t, int d,
                                                          int k, long long per_replica) {
    GRID_STRIDE(i, n) {
        int c = (int)(i % d);
        int step = (int)((i / d) % t);
        long long r = i / ((long long)t * d) / per_replica;
        const float *w = kernel + r * k * d + c;
        float acc = 0.f;
        for (int j = 0; j < k; ++j) {
            int later = step + k - 1 - j;
            if (later < t) acc += g[i + (long long)(k - 1 - j) * d] * w[j * d];
        }
        du[i] = acc;
    }
}

// The kernel's and bias's gradients, first pass: partial[r, chunk, q] for q = j·D + c (j < k:
// Σ g[s, t, c] · u[s, t − (k − 1) + j, c]; j = k: Σ g[s, t, c]) over the chunk's `chunk`
// sequences of replica r = grid.z and all their steps, in order. attnlab_column_total then adds
// the chunks.
extern "C" __global__ void attnlab_causal_conv_kernel_partials(const float *u, const float *g,
                                                               float *partial, int t, int d,
                                                               int k, long long per_replica,
                                                               long long chunk) {
    int q = blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= (k + 1) * d) return;
    int j = q / d, c = q % d;
    long long first = (long long)blockIdx.z * per_replica + (long long)blockIdx.y * chunk;
    long long last = min(first + chunk, (long long)(blockIdx.z + 1) * per_replica);
    float acc = 0.f;
    for (long long s = first; s < last; ++s) {
        const float *gs = g + s * t * d + c, *us = u + s * t * d + c;
        for (int step = 0; step < t; ++step) {
            if (j == k) {
                acc += gs[(long long)step * d];
            } else if (step + j + 1 - k >= 0) {
                acc += gs[(long long)step * d] * us[(long long)(step + j + 1 - k) * d];
            }
        }
    }
    partial[((long long)blockIdx.z * gridDim.y + blockIdx.y) * (k + 1) * d + q] = acc;
}

// Column sums of (rows, d) in one pass, for up to a few thousand rows a block: block (32, 32),
// 32 columns, 32 threads down the rows, their sums added in a fixed order; grid.y: blocks of
// `rows` rows summed on their own (out[block, c]). One launch where the two passes below were
// two, at sizes where a step is launch-bound.
extern "C" __global__ void attnlab_column_sums_one_pass(const float *x, float *out,
                                                        long long rows, int d) {
    __shared__ float acc[32][33];
    x += (long long)blockIdx.y * rows * d;
    out += (long long)blockIdx.y * d;
    int c = blockIdx.x * 32 + threadIdx.x;
    float s = 0.f;
    if (c < d) {
        for (long long r = threadIdx.y; r < rows; r += 32) s += x[r * d + c];
    }
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < d) {
        float total = 0.f;
        for (int k = 0; k < 32; ++k) total += acc[k][threadIdx.x];
        out[c] = total;
    }
}

// Column sums of (rows, d), first pass: partial[chunk, c] = Σ over the chunk's rows of x[r, c].
// Block (32, 8): 32 columns, 8 threads down the rows, combined in shared memory; grid.y chunks.
// grid.z: blocks of `rows` rows summed on their own (a replica's each), side by side in partial.
extern "C" __global__ void attnlab_column_partials(const float *x, float *partial,
                                                   long long rows, int d, long long chunk_rows) {
    __shared__ float acc[8][33];
    x += (long long)blockIdx.z * rows * d;
    partial += (long long)blockIdx.z * gridDim.y * d;
    int c = blockIdx.x * 32 + threadIdx.x;
    long long start = (long long)blockIdx.y * chunk_rows;
    long long end = start + chunk_rows < rows ? start + chunk_rows : rows;
    float s = 0.f;
    if (c < d) {
        for (long long r = start + threadIdx.y; r < end; r += 8) s += x[r * d + c];
    }
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < d) {
        float total = 0.f;
        for (int k = 0; k < 8; ++k) total += acc[k][threadIdx.x];
        partial[(long long)blockIdx.y * d + c] = total;
    }
}

// Column sums, second pass: out[c] = Σ_chunk partial[chunk, c], in chunk order; grid.y: the
// block of rows (out[block, c]).
extern "C" __global__ void attnlab_column_total(const float *partial, float *out, int chunks,
                                                int d) {
    partial += (long long)blockIdx.y * chunks * d;
    out += (long long)blockIdx.y * d;
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= d) return;
    float s = 0.f;
    for (int k = 0; k < chunks; ++k) s += partial[(long long)k * d + c];
    out[c] = s;
}

// Token embedding: out[i, :] = weight[ids[i], :]. An id past the vocabulary gives zeros (the
// Rust side checks ids before the launch).
extern "C" __global__ void attnlab_embedding(const float *weight, const uint32_t *ids,
                                             float *out, long long n_ids, int d, int vocab) {
    GRID_STRIDE(i, n_ids * d) {
        long long row = i / d;
        int c = (int)(i % d);
        uint32_t id = ids[row];
        out[i] = id < (uint32_t)vocab ? weight[(long long)id * d + c] : 0.f;
    }
}

// Embedding gradient, first pass: partial[s, c] = Σ dy[order[k], c] over segment s's tokens
// k in [begin[s], end[s]), in order (embedding.rs's SEGMENT tokens of one id at most).
extern "C" __global__ void attnlab_embedding_grad_segments(const float *dy, const uint32_t *order,
                                                           const uint32_t *begin,
                                                           const uint32_t *end, float *partial,
                                                           int d) {
    const long long s = blockIdx.x;
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= d) return;
    float sum = 0.f;
    for (uint32_t k = begin[s]; k < end[s]; ++k) sum += dy[(long long)order[k] * d + c];
    partial[s * d + c] = sum;
}

// Embedding gradient, second pass: dw[v, c] = Σ partial[s, c] over id v's segments
// s in [first[v], first[v + 1]), in order; 0 for an id without tokens.
extern "C" __global__ void attnlab_embedding_grad(const float *partial, const uint32_t *first,
                                                  float *dw, int d) {
    const long long v = blockIdx.x;
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= d) return;
    float sum = 0.f;
    for (uint32_t s = first[v]; s < first[v + 1]; ++s) sum += partial[(long long)s * d + c];
    dw[v * d + c] = sum;
}

// Cross-entropy, first pass: per_row[r] = logsumexp(x[r, :]) − x[r, target[r]].
extern "C" __global__ void attnlab_cross_entropy_rows(const float *x, const uint32_t *target,
                                                      float *per_row, long long rows, int v) {
    int lane;
    long long row = warp_row(rows, &lane);
    if (row < 0) return;
    const float *xr = x + row * v;
    float m = -INFINITY;
    for (int c = lane; c < v; c += WARP) m = fmaxf(m, xr[c]);
    m = warp_max(m);
    float sum = 0.f;
    for (int c = lane; c < v; c += WARP) sum += expf(xr[c] - m);
    sum = warp_sum(sum);
    if (lane == 0) {
        uint32_t t = target[row];
        float picked = t < (uint32_t)v ? xr[t] : NAN;
        per_row[row] = m + logf(sum) - picked;
    }
}

// out[g] = the mean of x's block g of n values (a block of 256 threads per group, in a fixed
// order): each replica's mean loss.
extern "C" __global__ void attnlab_group_means(const float *x, float *out, long long n) {
    __shared__ float acc[256];
    x += (long long)blockIdx.x * n;
    float s = 0.f;
    for (long long i = threadIdx.x; i < n; i += 256) s += x[i];
    acc[threadIdx.x] = s;
    __syncthreads();
    for (int width = 128; width > 0; width >>= 1) {
        if (threadIdx.x < width) acc[threadIdx.x] += acc[threadIdx.x + width];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = acc[0] / (float)n;
}

// Cross-entropy gradient: dx[r, c] = (softmax(x[r])[c] − [c = target[r]]) · g[r / per_group] /
// per_group, with g the upstream gradient of each group's mean loss (on the device).
extern "C" __global__ void attnlab_cross_entropy_grad(const float *x, const uint32_t *target,
                                                      const float *g, float *dx, long long rows,
                                                      int v, long long per_group) {
    int lane;
    long long row = warp_row(rows, &lane);
    if (row < 0) return;
    const float *xr = x + row * v;
    float *dr = dx + row * v;
    float m = -INFINITY;
    for (int c = lane; c < v; c += WARP) m = fmaxf(m, xr[c]);
    m = warp_max(m);
    float sum = 0.f;
    for (int c = lane; c < v; c += WARP) sum += expf(xr[c] - m);
    float scale = g[row / per_group] / (float)per_group;
    float inv = 1.f / warp_sum(sum);
    uint32_t t = target[row];
    for (int c = lane; c < v; c += WARP) {
        float p = expf(xr[c] - m) * inv;
        dr[c] = (p - (c == (int)t ? 1.f : 0.f)) * scale;
    }
}

// ---------------------------------------------------------------------------------------------
// Multi-tensor kernels: one launch over many tensors, each cut into blocks of MULTI_CHUNK
// elements; a block finds its tensor by binary search over the tensors' first blocks.

#define MULTI_CHUNK 4096

// The index of the last tensor whose first block is at most `block` (tensors in block order).
template <typename T>
__device__ __forceinline__ int tensor_of_block(const T *ts, int count, long long block) {
    int lo = 0, hi = count - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (ts[mid].first_block <= block) lo = mid; else hi = mid - 1;
    }
    return lo;
}

struct SumTensor {
    const float *x;
    long long n;
    long long first_block;
};

// partial[b] = Σ x² over block b's chunk of its tensor (256 threads, a fixed-order reduction).
extern "C" __global__ void attnlab_sum_squares_multi(const SumTensor *ts, int count,
                                                     float *partial) {
    __shared__ float acc[256];
    const SumTensor t = ts[tensor_of_block(ts, count, blockIdx.x)];
    long long start = (blockIdx.x - t.first_block) * MULTI_CHUNK;
    long long end = min(start + MULTI_CHUNK, t.n);
    float s = 0.f;
    for (long long i = start + threadIdx.x; i < end; i += 256) s += t.x[i] * t.x[i];
    acc[threadIdx.x] = s;
    __syncthreads();
    for (int width = 128; width > 0; width >>= 1) {
        if (threadIdx.x < width) acc[threadIdx.x] += acc[threadIdx.x + width];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = acc[0];
}

// One parameter of AdamW's step: c = (β₁, β₂, grad_scale, decay, step_size, v_correction, eps).
struct AdamTensor {
    float *p;
    float *mv;
    const float *g;
    long long n;
    long long first_block;
    float c[7];
    float pad;
};

// AdamW in place, moments and parameter in one pass (adamw.rs's rule): mv = [m; v] (2n),
// g' = grad_scale·g, m ← β₁m + (1 − β₁)g', v ← β₂v + (1 − β₂)g'²,
// p ← p·decay − step_size·m / (√v·v_correction + eps).
extern "C" __global__ void attnlab_adam_multi(const AdamTensor *ts, int count) {
    const AdamTensor t = ts[tensor_of_block(ts, count, blockIdx.x)];
    const float beta1 = t.c[0], beta2 = t.c[1], scale = t.c[2], decay = t.c[3];
    const float step_size = t.c[4], v_correction = t.c[5], eps = t.c[6];
    long long start = (blockIdx.x - t.first_block) * MULTI_CHUNK;
    long long end = min(start + MULTI_CHUNK, t.n);
    for (long long i = start + threadIdx.x; i < end; i += blockDim.x) {
        float gi = t.g[i] * scale;
        float m = beta1 * t.mv[i] + (1.f - beta1) * gi;
        float v = beta2 * t.mv[t.n + i] + (1.f - beta2) * gi * gi;
        t.mv[i] = m;
        t.mv[t.n + i] = v;
        t.p[i] = t.p[i] * decay - step_size * m / (sqrtf(v) * v_correction + eps);
    }
}

// SplitMix64's output function (dropout.rs's `mix`, bit for bit).
__device__ __forceinline__ unsigned long long splitmix(unsigned long long z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Dropout with the mask of dropout.rs: element i of replica block r = min(i / block, nkeys − 1)
// kept when the top 32 bits of splitmix(keys[r] ^ (i % block)) are at least `threshold`, kept
// elements scaled by `scale`.
extern "C" __global__ void attnlab_dropout(const float *x, float *y, long long n,
                                           unsigned int threshold, float scale,
                                           const unsigned long long *keys, long long nkeys,
                                           long long block) {
    GRID_STRIDE(i, n) {
        unsigned long long key = keys[min(i / block, nkeys - 1)];
        unsigned int hash = (unsigned int)(splitmix(key ^ (unsigned long long)(i % block)) >> 32);
        y[i] = hash >= threshold ? x[i] * scale : 0.f;
    }
}

// ---------------------------------------------------------------------------------------------
// Flash attention (softmax, causal or not, an optional constant bias table): the output and its
// gradients without ever holding the (T, T) weights. One warp per query row (forward, dq) or
// key row (dk, dv); each lane holds every 32nd entry of its head's vectors, so head widths up to
// 32·FLASH_MAX_PER_LANE = 256. q, k: (B, H, T, D), v: (B, H, T, Dv) contiguous; the output and
// its gradient are (B, T, H·Dv), the heads side by side as the output projection reads them;
// the bias (Hb, T, T), Hb = 1 or H. Scores of −∞ (a window's far keys) are skipped.

#define FLASH_MAX_PER_LANE 8

struct FlashShape {
    long long heads_rows;  // B·H·T
    int h, t, d, dv, hb;   // heads, length, q/k width, v width, bias heads (0: no bias)
    float scale;
    int causal;
};

// (b, h, i) of a flat row b·H·T + h·T + i.
__device__ __forceinline__ void flash_coords(long long row, const FlashShape &s, int *b, int *h,
                                             int *i) {
    *i = (int)(row % s.t);
    long long bh = row / s.t;
    *h = (int)(bh % s.h);
    *b = (int)(bh / s.h);
}

// Lane's entries of a length-n vector x (every 32nd from `lane`) into r[].
__device__ __forceinline__ void flash_load(const float *x, int n, int lane, float *r) {
#pragma unroll
    for (int k = 0; k < FLASH_MAX_PER_LANE; ++k) {
        int c = lane + WARP * k;
        r[k] = c < n ? x[c] : 0.f;
    }
}

// x · y for y given as the lane's entries.
__device__ __forceinline__ float flash_dot(const float *x, int n, int lane, const float *y) {
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < FLASH_MAX_PER_LANE; ++k) {
        int c = lane + WARP * k;
        if (c < n) s += x[c] * y[k];
    }
    return warp_sum(s);
}

// The score of query i and key j of head (b, h): scale·q_i·k_j + bias.
__device__ __forceinline__ float flash_score(const float *qi, const float *kj, const float *bias,
                                             const FlashShape &s, int h, int i, int j, int lane) {
    float score = s.scale * flash_dot(kj, s.d, lane, qi);
    if (bias) score += bias[((long long)(s.hb == 1 ? 0 : h) * s.t + i) * s.t + j];
    return score;
}

// Forward: out (B, T, H·Dv) and lse (B·H·T) = the log-sum-exp of each row's scores.
__device__ void flash_fwd(const float *q, const float *k, const float *v, const float *bias,
                          float *out, float *lse, FlashShape s) {
    int lane;
    long long row = warp_row(s.heads_rows, &lane);
    if (row < 0) return;
    int b, h, i;
    flash_coords(row, s, &b, &h, &i);
    long long head = (long long)b * s.h + h;
    float qi[FLASH_MAX_PER_LANE], o[FLASH_MAX_PER_LANE];
    flash_load(q + row * s.d, s.d, lane, qi);
#pragma unroll
    for (int c = 0; c < FLASH_MAX_PER_LANE; ++c) o[c] = 0.f;
    float m = -INFINITY, l = 0.f;
    int last = s.causal ? i : s.t - 1;
    for (int j = 0; j <= last; ++j) {
        const float *kj = k + (head * s.t + j) * s.d;
        float score = flash_score(qi, kj, bias, s, h, i, j, lane);
        if (score == -INFINITY) continue;
        float m_new = fmaxf(m, score);
        float correction = expf(m - m_new);
        float p = expf(score - m_new);
        l = l * correction + p;
        const float *vj = v + (head * s.t + j) * s.dv;
#pragma unroll
        for (int c = 0; c < FLASH_MAX_PER_LANE; ++c) {
            int col = lane + WARP * c;
            o[c] = o[c] * correction + (col < s.dv ? p * vj[col] : 0.f);
        }
        m = m_new;
    }
    float inv = 1.f / l;
    float *orow = out + (((long long)b * s.t + i) * s.h + h) * s.dv;
#pragma unroll
    for (int c = 0; c < FLASH_MAX_PER_LANE; ++c) {
        int col = lane + WARP * c;
        if (col < s.dv) orow[col] = o[c] * inv;
    }
    if (lane == 0) lse[row] = m + logf(l);
}

extern "C" __global__ void attnlab_flash_fwd(const float *q, const float *k, const float *v,
                                             float *out, float *lse, FlashShape s) {
    flash_fwd(q, k, v, nullptr, out, lse, s);
}

extern "C" __global__ void attnlab_flash_fwd_bias(const float *q, const float *k, const float *v,
                                                  const float *bias, float *out, float *lse,
                                                  FlashShape s) {
    flash_fwd(q, k, v, bias, out, lse, s);
}

// delta[row] = dOut_row · Out_row, per (b, h, i): the softmax backward's row term.
extern "C" __global__ void attnlab_flash_delta(const float *dout, const float *out, float *delta,
                                               FlashShape s) {
    int lane;
    long long row = warp_row(s.heads_rows, &lane);
    if (row < 0) return;
    int b, h, i;
    flash_coords(row, s, &b, &h, &i);
    long long at = (((long long)b * s.t + i) * s.h + h) * s.dv;
    float acc = 0.f;
    for (int c = lane; c < s.dv; c += WARP) acc += dout[at + c] * out[at + c];
    acc = warp_sum(acc);
    if (lane == 0) delta[row] = acc;
}

// dq of one query row: Σ_j ds_ij · scale · k_j, ds_ij = p_ij (dO_i · v_j − delta_i).
__device__ void flash_dq(const float *q, const float *k, const float *v, const float *bias,
                         const float *dout, const float *lse, const float *delta, float *dq,
                         FlashShape s) {
    int lane;
    long long row = warp_row(s.heads_rows, &lane);
    if (row < 0) return;
    int b, h, i;
    flash_coords(row, s, &b, &h, &i);
    long long head = (long long)b * s.h + h;
    float qi[FLASH_MAX_PER_LANE], doi[FLASH_MAX_PER_LANE], acc[FLASH_MAX_PER_LANE];
    flash_load(q + row * s.d, s.d, lane, qi);
    flash_load(dout + (((long long)b * s.t + i) * s.h + h) * s.dv, s.dv, lane, doi);
#pragma unroll
    for (int c = 0; c < FLASH_MAX_PER_LANE; ++c) acc[c] = 0.f;
    float lse_i = lse[row], delta_i = delta[row];
    int last = s.causal ? i : s.t - 1;
    for (int j = 0; j <= last; ++j) {
        const float *kj = k + (head * s.t + j) * s.d;
        float score = flash_score(qi, kj, bias, s, h, i, j, lane);
        if (score == -INFINITY) continue;
        float p = expf(score - lse_i);
        float dp = flash_dot(v + (head * s.t + j) * s.dv, s.dv, lane, doi);
        float ds = p * (dp - delta_i) * s.scale;
#pragma unroll
        for (int c = 0; c < FLASH_MAX_PER_LANE; ++c) {
            int col = lane + WARP * c;
            if (col < s.d) acc[c] += ds * kj[col];
        }
    }
#pragma unroll
    for (int c = 0; c < FLASH_MAX_PER_LANE; ++c) {
        int col = lane + WARP * c;
        if (col < s.d) dq[row * s.d + col] = acc[c];
    }
}

// dk and dv of one key row j: dv_j = Σ_i p_ij dO_i, dk_j = Σ_i ds_ij · scale · q_i.
__device__ void flash_dkv(const float *q, const float *k, const float *v, const float *bias,
                          const float *dout, const float *lse, const float *delta, float *dk,
                          float *dv, FlashShape s) {
    int lane;
    long long row = warp_row(s.heads_rows, &lane);
    if (row < 0) return;
    int b, h, j;
    flash_coords(row, s, &b, &h, &j);
    long long head = (long long)b * s.h + h;
    float kj[FLASH_MAX_PER_LANE], vj[FLASH_MAX_PER_LANE];
    float dk_acc[FLASH_MAX_PER_LANE], dv_acc[FLASH_MAX_PER_LANE];
    flash_load(k + row * s.d, s.d, lane, kj);
    flash_load(v + row * s.dv, s.dv, lane, vj);
#pragma unroll
    for (int c = 0; c < FLASH_MAX_PER_LANE; ++c) dk_acc[c] = dv_acc[c] = 0.f;
    int first = s.causal ? j : 0;
    for (int i = first; i < s.t; ++i) {
        long long qrow = head * s.t + i;
        const float *qi = q + qrow * s.d;
        float score = s.scale * flash_dot(qi, s.d, lane, kj);
        if (bias) score += bias[((long long)(s.hb == 1 ? 0 : h) * s.t + i) * s.t + j];
        if (score == -INFINITY) continue;
        float p = expf(score - lse[qrow]);
        const float *doi = dout + (((long long)b * s.t + i) * s.h + h) * s.dv;
        float dp = flash_dot(doi, s.dv, lane, vj);
        float ds = p * (dp - delta[qrow]) * s.scale;
#pragma unroll
        for (int c = 0; c < FLASH_MAX_PER_LANE; ++c) {
            int col = lane + WARP * c;
            if (col < s.dv) dv_acc[c] += p * doi[col];
            if (col < s.d) dk_acc[c] += ds * qi[col];
        }
    }
#pragma unroll
    for (int c = 0; c < FLASH_MAX_PER_LANE; ++c) {
        int col = lane + WARP * c;
        if (col < s.d) dk[row * s.d + col] = dk_acc[c];
        if (col < s.dv) dv[row * s.dv + col] = dv_acc[c];
    }
}

extern "C" __global__ void attnlab_flash_dq(const float *q, const float *k, const float *v,
                                            const float *dout, const float *lse,
                                            const float *delta, float *dq, FlashShape s) {
    flash_dq(q, k, v, nullptr, dout, lse, delta, dq, s);
}

extern "C" __global__ void attnlab_flash_dq_bias(const float *q, const float *k, const float *v,
                                                 const float *bias, const float *dout,
                                                 const float *lse, const float *delta, float *dq,
                                                 FlashShape s) {
    flash_dq(q, k, v, bias, dout, lse, delta, dq, s);
}

extern "C" __global__ void attnlab_flash_dkv(const float *q, const float *k, const float *v,
                                             const float *dout, const float *lse,
                                             const float *delta, float *dk, float *dv,
                                             FlashShape s) {
    flash_dkv(q, k, v, nullptr, dout, lse, delta, dk, dv, s);
}

extern "C" __global__ void attnlab_flash_dkv_bias(const float *q, const float *k, const float *v,
                                                  const float *bias, const float *dout,
                                                  const float *lse, const float *delta, float *dk,
                                                  float *dv, FlashShape s) {
    flash_dkv(q, k, v, bias, dout, lse, delta, dk, dv, s);
}
