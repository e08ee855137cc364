#!/usr/bin/env python3
"""PyTorch references of attnlab's recurrent mixers on the MQAR benchmark, for
`attnlab bench --torch scripts/ref_mqar_torch_mixers.py --set attention.kind=MIXER`.

The model, data and training loop are ../shared/bench/ref_mqar_torch.py's, unchanged (found as
$REF_MQAR_TORCH, else ref_mqar_torch.py beside this script, else in ../shared/bench/), with its
softmax attention swapped for the mixer `--mixer` names (attnlab passes its [attention] table as
JSON). Each mixer is the layer attnlab builds (src/attention/*.rs, src/model/stages.rs): the
fused q/k/v projection without a bias, then the mechanism's chunked form as
flash-linear-attention's naive chunk references and mamba_ssm's `ssd_minimal` write it in eager
PyTorch, then its output stage and the output projection:

- retention: fla/ops/simple_gla/naive.py (scalar decay γ_h = 1 − 2^(−5−h) per head), RMSNorm over
  each head ⊙ swish(W_g x);
- mamba2: mamba_ssm/modules/ssd_minimal.py's chunked SSD (scalar A per head, dt = softplus(raw +
  dt_bias), keys dt·B, skip D), conv 4 + silu over C, B and x, RMSNorm(y ⊙ silu(z));
- gla: the chunked form of fla/ops/gla (its naive.py is the recurrence), q and k scaled about
  each chunk's start as attnlab's, low-rank gate log α = logsigmoid(W₂W₁x + b)/16, RMSNorm over
  each head ⊙ swish(W_g x);
- deltanet, gated-deltanet: fla/ops/delta_rule/naive.py's `delta_rule_chunkwise` (the WY form,
  its triangular inverse by torch.linalg.solve_triangular), conv 4 + silu, L2-normalised q and k,
  β = sigmoid(w_βᵀx), Gated DeltaNet's decay as Mamba-2's, RMSNorm over each head (⊙ swish(W_g x)
  where gated).

Same outputs as the reference script (`--steps-only`: one JSON line with ms_per_step).
"""
import argparse, json, math, os, runpy, sys
import torch, torch.nn as nn, torch.nn.functional as F

here = os.path.dirname(os.path.abspath(__file__))
candidates = [
    os.environ.get("REF_MQAR_TORCH"),
    os.path.join(here, "ref_mqar_torch.py"),
    os.path.join(here, "..", "..", "shared", "bench", "ref_mqar_torch.py"),
]


def causal(n, device):
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def decay_within(g):
    """e^(g_i − g_j) below and on the diagonal, 0 above, for g (…, L)."""
    diff = g[..., :, None] - g[..., None, :]
    return diff.masked_fill(~causal(g.shape[-1], g.device), float("-inf")).exp()


def chunk_scalar_decay(q, k, v, G, C):
    """o_i = Σ_{j≤i} e^(G_i − G_j) (q_i·k_j) v_j by chunks of C (simple_gla's naive chunk form);
    q, k (B, H, T, K), v (B, H, T, V), G (B or 1, H, T) the cumulative log-decay."""
    B, H, T, _ = q.shape
    S, out = None, []
    for s in range(0, T, C):
        e = min(s + C, T)
        qc, kc, vc = q[:, :, s:e], k[:, :, s:e], v[:, :, s:e]
        g = G[..., s:e] - (G[..., s - 1:s] if s else 0)
        o = ((qc @ kc.transpose(-1, -2)) * decay_within(g)) @ vc
        if S is not None:
            o = o + (qc * g.exp()[..., None]) @ S
        out.append(o)
        if e < T:
            last = g[..., -1:]
            written = (kc * (last - g).exp()[..., None]).transpose(-1, -2) @ vc
            S = written if S is None else S * last.exp()[..., None] + written
    return torch.cat(out, 2)


def chunk_gla(q, k, v, b, C):
    """GLA by chunks of C, q and k scaled by e^(±(b − b_a)) about the position a before each
    chunk; b (B, H, T, K) the cumulative log α."""
    B, H, T, K = q.shape
    S = q.new_zeros(B, H, K, v.shape[-1])
    anchor = q.new_zeros(B, H, 1, K)
    out = []
    for s in range(0, T, C):
        e = min(s + C, T)
        qc, kc, vc, bc = q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], b[:, :, s:e]
        rel = bc - anchor
        qs, ks = qc * rel.exp(), kc * (-rel).exp()
        own = (qs @ ks.transpose(-1, -2)).masked_fill(~causal(e - s, q.device), 0.0)
        out.append(own @ vc + qs @ S)
        end = bc[:, :, -1:]
        S = S * (end - anchor).exp().transpose(-1, -2) + (kc * (end - bc).exp()).transpose(-1, -2) @ vc
        anchor = end
    return torch.cat(out, 2)


def chunk_delta(q, k, v, beta, G, C):
    """The (gated) delta rule by chunks of C in its WY form; beta (B, H, T), G (B, H, T) the
    cumulative log-decay or None."""
    B, H, T, K = q.shape
    S = q.new_zeros(B, H, K, v.shape[-1])
    out = []
    for s in range(0, T, C):
        e = min(s + C, T)
        qc, kc, vc, bc = q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], beta[:, :, s:e]
        g = q.new_zeros(B, H, e - s) if G is None else G[..., s:e] - (G[..., s - 1:s] if s else 0)
        D = decay_within(g)
        lower = ((kc @ kc.transpose(-1, -2)) * D * bc[..., None]).tril(-1)
        eye = torch.eye(e - s, device=q.device).expand_as(lower)
        X = torch.linalg.solve_triangular(eye + lower, torch.diag_embed(bc), upper=False, unitriangular=True)
        R = X @ vc - (X @ (kc * g.exp()[..., None])) @ S
        out.append((qc * g.exp()[..., None]) @ S + ((qc @ kc.transpose(-1, -2)) * D) @ R)
        last = g[..., -1:]
        S = S * last.exp()[..., None] + (kc * (last - g).exp()[..., None]).transpose(-1, -2) @ R
    return torch.cat(out, 2)


class HeadNorm(nn.Module):
    """RMSNorm over each head's outputs with one gain per channel (FLA's FusedRMSNormGated),
    gated by swish(W_g x) after it, or (Mamba-2) by silu(W_z x) before it."""

    def __init__(s, d, dh, gated, gate_first=False):
        super().__init__()
        s.dh, s.gate_first = dh, gate_first
        s.weight = nn.Parameter(torch.ones(dh))
        s.gate = nn.Linear(d, d, bias=False) if gated else None

    def norm(s, y):
        B, T, W = y.shape
        rows = y.reshape(B, T, W // s.dh, s.dh)
        rows = rows * torch.rsqrt(rows.pow(2).mean(-1, keepdim=True) + 1e-5) * s.weight
        return rows.reshape(B, T, W)

    def forward(s, x, y):
        if s.gate is not None and s.gate_first:
            return s.norm(y * F.silu(s.gate(x)))
        y = s.norm(y)
        return y * F.silu(s.gate(x)) if s.gate is not None else y


class Conv(nn.Module):
    """Depthwise causal convolutions over blocks of channels, each then silu (FLA's
    ShortConvolution, no bias)."""

    def __init__(s, widths, size):
        super().__init__()
        s.convs = nn.ModuleList(nn.Conv1d(w, w, size, groups=w, padding=size - 1, bias=False) for w in widths)

    def forward(s, blocks):
        T = blocks[0].shape[1]
        return [F.silu(c(u.transpose(1, 2))[..., :T].transpose(1, 2)) for c, u in zip(s.convs, blocks)]


def heads(x, h):
    B, T, W = x.shape
    return x.reshape(B, T, h, W // h).transpose(1, 2)


def merged(y):
    B, H, T, D = y.shape
    return y.transpose(1, 2).reshape(B, T, H * D)


def decay_gate(h, lo):
    """Mamba-2's A_log (A uniform in (lo, 16)) and dt_bias (softplus⁻¹ of log-uniform dt)."""
    a_log = nn.Parameter(torch.empty(h).uniform_(lo, 16).log())
    dt = torch.exp(torch.rand(h) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
    return a_log, nn.Parameter(dt + torch.log(-torch.expm1(-dt)))


class Retention(nn.Module):
    def __init__(s, d, h, cfg):
        super().__init__()
        s.h, s.dh, s.chunk = h, d // h, cfg.get("chunk", 64)
        s.qkv = nn.Linear(d, 3 * d, bias=False)
        s.out_stage = HeadNorm(d, s.dh, cfg.get("gate", True))
        s.register_buffer("log_gamma", torch.log(1 - 2.0 ** (-5.0 - torch.arange(h, dtype=torch.float32))))

    def forward(s, x):
        q, k, v = (heads(t, s.h) for t in s.qkv(x).chunk(3, -1))
        T = x.shape[1]
        G = (torch.arange(T, device=x.device)[None, :] * s.log_gamma[:, None])[None]
        y = chunk_scalar_decay(q, k * s.dh ** -0.5, v, G, s.chunk)
        return s.out_stage(x, merged(y))


class Mamba2(nn.Module):
    def __init__(s, d, h, cfg):
        super().__init__()
        s.h, s.dh, s.n, s.chunk = h, d // h, cfg.get("d_state", 16), cfg.get("chunk", 16)
        s.qkv = nn.Linear(d, h * (2 * s.n + s.dh) + h, bias=False)
        s.conv = Conv([h * s.n, h * s.n, d], cfg.get("conv", 4))
        s.A_log, s.dt_bias = decay_gate(h, 1.0)
        s.D = nn.Parameter(torch.ones(h))
        s.out_stage = HeadNorm(d, s.dh, True, gate_first=True)

    def forward(s, x):
        h, n = s.h, s.n
        c, b, u, raw = s.qkv(x).split([h * n, h * n, h * s.dh, h], -1)
        c, b, u = (heads(t, h) for t in s.conv([c, b, u]))
        dt = F.softplus(raw + s.dt_bias).transpose(1, 2)  # (B, H, T)
        G = torch.cumsum(-torch.exp(s.A_log)[:, None] * dt, -1)
        y = chunk_scalar_decay(c, b * dt[..., None], u, G, s.chunk) + u * s.D[:, None, None]
        return s.out_stage(x, merged(y))


class Gla(nn.Module):
    def __init__(s, d, h, cfg):
        super().__init__()
        s.h, s.dh, s.chunk = h, d // h, cfg.get("chunk", 16)
        s.dk = max(1, round(s.dh * cfg.get("expand_k", 0.5)))
        s.rank = 16
        s.qkv = nn.Linear(d, h * (2 * s.dk + s.dh) + s.rank, bias=False)
        s.gate_up = nn.Linear(s.rank, h * s.dk, bias=True)
        s.out_stage = HeadNorm(d, s.dh, cfg.get("gate", True))

    def forward(s, x):
        h, dk = s.h, s.dk
        q, k, v, low = s.qkv(x).split([h * dk, h * dk, h * s.dh, s.rank], -1)
        log_alpha = heads(F.logsigmoid(s.gate_up(low)) / 16, h)
        y = chunk_gla(heads(q, h) * dk ** -0.5, heads(k, h), heads(v, h), torch.cumsum(log_alpha, 2), s.chunk)
        return s.out_stage(x, merged(y))


class DeltaNet(nn.Module):
    def __init__(s, d, h, cfg, gated):
        super().__init__()
        s.h, s.dh, s.chunk, s.gated = h, d // h, cfg.get("chunk", 16), gated
        s.qkv = nn.Linear(d, 3 * d + h * (2 if gated else 1), bias=False)
        s.conv = Conv([d, d, d], cfg.get("conv", 4))
        if gated:
            s.A_log, s.dt_bias = decay_gate(h, 1e-4)  # FLA: A ~ U(0, 16)
        s.out_stage = HeadNorm(d, s.dh, cfg.get("gate", gated))

    def forward(s, x):
        h, d = s.h, s.h * s.dh
        q, k, v, raw = s.qkv(x).split([d, d, d, s.qkv.out_features - 3 * d], -1)
        q, k, v = (heads(t, h) for t in s.conv([q, k, v]))
        q, k = F.normalize(q, dim=-1, eps=1e-6), F.normalize(k, dim=-1, eps=1e-6)
        beta = torch.sigmoid(raw[..., :h]).transpose(1, 2)
        G = None
        if s.gated:
            dt = F.softplus(raw[..., h:] + s.dt_bias).transpose(1, 2)
            G = torch.cumsum(-torch.exp(s.A_log)[:, None] * dt, -1)
        y = chunk_delta(q * s.dh ** -0.5, k, v, beta, G, s.chunk)
        return s.out_stage(x, merged(y))


MIXERS = {
    "retention": Retention,
    "mamba2": Mamba2,
    "gla": Gla,
    "deltanet": lambda d, h, cfg: DeltaNet(d, h, cfg, gated=False),
    "gated-deltanet": lambda d, h, cfg: DeltaNet(d, h, cfg, gated=True),
}


def block_class(ref, cfg):
    """The reference's pre-LN block with the mixer `cfg` in place of its attention."""
    make = MIXERS.get(cfg["kind"])
    if make is None:
        sys.exit(f"ref_mqar_torch_mixers.py: no PyTorch port of '{cfg['kind']}' (ported: {', '.join(MIXERS)})")

    class Block(nn.Module):
        def __init__(s, d, h):
            super().__init__()
            s.ln1, s.mix, s.o = nn.LayerNorm(d), make(d, h, cfg), nn.Linear(d, d)
            s.ln2 = nn.LayerNorm(d)
            s.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(s, x):
            x = x + s.o(s.mix(s.ln1(x)))
            return x + s.mlp(s.ln2(x))

    return Block


def main():
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--mixer", required=True, help="attnlab's [attention] table as JSON")
    a, rest = ap.parse_known_args()
    ref_path = next((c for c in candidates if c and os.path.isfile(c)), None)
    if ref_path is None:
        sys.exit("ref_mqar_torch_mixers.py: reference script not found; set REF_MQAR_TORCH")
    ref = runpy.run_path(ref_path, run_name="ref_mqar_torch")
    cfg = json.loads(a.mixer)
    # LM builds its blocks from the module's `Block`, looked up when it runs.
    ref["LM"].__init__.__globals__["Block"] = block_class(ref, cfg)
    sys.argv = [ref_path] + rest
    ref["main"]()


if __name__ == "__main__":
    main()
