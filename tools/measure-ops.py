#!/usr/bin/env python3
"""Per-op times of transformer layers, LM heads and embeddings in PyTorch on one GPU.

The reference that `h100-sxm`'s cost model is fitted to (docs/cost-model.md): bf16 weights and
activations, cuBLAS GEMMs, PyTorch's fused attention (F.scaled_dot_product_attention, causal), fp32
cross-entropy, eager mode. Each op is timed with CUDA events around it, after warm-up, as the median of
--reps runs; the pieces an op is made of (each GEMM, attention, cross-entropy) are timed on their own too,
so a model can be fitted piece by piece and checked op by op.

Ops, as pipesim names them (one microbatch, one layer / one vocabulary layer):
  layer F   forward of one decoder layer (autograd recording, as in training)
  layer B   input-gradient backward (autograd.grad with respect to the layer input only: every dX GEMM,
            attention backward, the norms' and activations' backward)
  layer W   weight-gradient GEMMs, dW = dYᵀX for every linear (bf16), and the bias gradients
  layer BW  the whole backward (loss.backward()), for comparison with B + W
  head F    logits = XWᵀ (bf16) and fp32 cross-entropy
  head B    input gradient: cross-entropy backward and dX = dlogits·W
  head W    dW = dlogitsᵀX
  emb F     gather of b·s rows;  emb W  scatter-add of the output gradient into an fp32 V×h gradient
            (both shorter than PyTorch's dispatch: timed as replays of a CUDA graph of 20 calls)

Layers: GPT (LayerNorm, biases, GELU, f = 4h, multi-head) and Llama (RMSNorm, no biases, SwiGLU,
grouped-query attention; no rotary embedding: pipesim does not cost it). Dropout is off.

Usage: python3 tools/measure-ops.py [-o FILE.json] [--reps N] [--quick | --reference | --tensor-parallel | --attention]
--reference: only the two layers docs/benchmark.md holds pipesim's CUDA backend to (b 1, s 2048, bf16):
GPT h 4096, 32 heads, FFN 16384, and Llama-3-8B (h 4096, 32 heads, 8 KV heads, SwiGLU 14336).
Writes one JSON object: {"device": ..., "torch": ..., "ops": [...]} with every case's times in ms.
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

BF16 = torch.bfloat16


def time_ms(fn, reps, warmup=3):
    """Median time of fn() in ms over reps runs, each bracketed by CUDA events on the current stream."""
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def time_graphed_ms(fn, reps, inner=20):
    """Median GPU time of fn() in ms for ops shorter than PyTorch's own dispatch (~20 µs): inner calls
    captured in one CUDA graph and replayed, so the events see the kernels, not the Python between them
    (in training the CPU runs ahead and hides that)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    return time_ms(graph.replay, reps) / inner


def time_after(prepare, fn, reps, warmup=2):
    """Median time of fn(prepare()) in ms: prepare runs untimed before each timed call."""
    samples = []
    for i in range(warmup + reps):
        state = prepare()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(state)
        e.record()
        torch.cuda.synchronize()
        if i >= warmup:
            samples.append(s.elapsed_time(e))
    return statistics.median(samples)


def param(*shape, scale=0.02):
    return (torch.randn(*shape, device="cuda", dtype=BF16) * scale).requires_grad_()


class Layer:
    """One decoder layer, or one tensor-parallel rank's part of it (tp > 1): the rank's heads
    (key/value heads kept whole when fewer than tp), its columns of qkv and up, its rows of proj and
    down. The all-reduces that join the ranks are not run: pipesim costs them as communication."""

    def __init__(self, h, heads, kv_heads, f, llama, tp=1):
        self.h, self.llama = h, llama
        self.hd = h // heads
        self.heads, self.kv_heads, self.f = heads // tp, max(1, kv_heads // tp), f // tp
        q_width, kv_width = self.heads * self.hd, self.kv_heads * self.hd
        qkv_out = q_width + 2 * kv_width
        up_out = 2 * self.f if llama else self.f
        bias = not llama
        self.linears = {  # name: (weight [out, in], bias or None)
            "qkv": (param(qkv_out, h), param(qkv_out) if bias else None),
            "proj": (param(h, q_width), param(h) if bias else None),
            "up": (param(up_out, h), param(up_out) if bias else None),
            "down": (param(h, self.f), param(h) if bias else None),
        }
        self.norms = [torch.ones(h, device="cuda", dtype=BF16, requires_grad=True) for _ in range(2)]
        self.norm_biases = [] if llama else [torch.zeros(h, device="cuda", dtype=BF16, requires_grad=True) for _ in range(2)]

    def params(self):
        out = self.norms + self.norm_biases
        for w, b in self.linears.values():
            out += [w] + ([b] if b is not None else [])
        return out

    def norm(self, x, i):
        if self.llama:
            return F.rms_norm(x, (self.h,), self.norms[i], eps=1e-5)
        return F.layer_norm(x, (self.h,), self.norms[i], self.norm_biases[i])

    def linear(self, x, name):
        w, b = self.linears[name]
        return F.linear(x, w, b)

    def forward(self, x):
        b, s, h = x.shape
        y = self.norm(x, 0)
        qkv = self.linear(y, "qkv")
        q_width, kv = self.heads * self.hd, self.kv_heads * self.hd
        q, k, v = qkv.split([q_width, kv, kv], dim=-1)
        q = q.view(b, s, self.heads, self.hd).transpose(1, 2)
        k = k.reshape(b, s, self.kv_heads, self.hd).transpose(1, 2)
        v = v.reshape(b, s, self.kv_heads, self.hd).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        o = o.transpose(1, 2).reshape(b, s, q_width)
        x = x + self.linear(o, "proj")
        y = self.norm(x, 1)
        if self.llama:
            gate, up = self.linear(y, "up").chunk(2, dim=-1)
            z = F.silu(gate) * up
        else:
            z = F.gelu(self.linear(y, "up"), approximate="tanh")
        return x + self.linear(z, "down")

    def gemm_shapes(self):
        """(name, out, in) of every linear; the forward GEMM is tokens × in × out."""
        return [(n, w.shape[0], w.shape[1]) for n, (w, _) in self.linears.items()]


def causal_attention(b, s, heads, kv_heads, head_dim):
    """Fused causal attention (F.scaled_dot_product_attention, grouped-query when kv_heads < heads) on
    random bf16 Q, K and V: forward() runs it, backward(out) its input gradients for a random dO."""
    q = torch.randn(b, heads, s, head_dim, device="cuda", dtype=BF16, requires_grad=True)
    k = torch.randn(b, kv_heads, s, head_dim, device="cuda", dtype=BF16, requires_grad=True)
    v = torch.randn(b, kv_heads, s, head_dim, device="cuda", dtype=BF16, requires_grad=True)
    do = torch.randn(b, heads, s, head_dim, device="cuda", dtype=BF16)

    def forward():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv_heads != heads)

    def backward(out):
        return torch.autograd.grad(out, [q, k, v], do)
    return forward, backward


def measure_layer(case, reps):
    b, s, h, heads, kv, f, llama = (case[k] for k in ("b", "s", "h", "heads", "kv_heads", "f", "llama"))
    layer = Layer(h, heads, kv, f, llama, case.get("tp", 1))
    x = (torch.randn(b, s, h, device="cuda", dtype=BF16)).requires_grad_()
    dy = torch.randn(b, s, h, device="cuda", dtype=BF16)
    params = layer.params()
    out = dict(case)
    out["F"] = time_ms(lambda: layer.forward(x), reps)
    out["B"] = time_after(lambda: layer.forward(x), lambda y: torch.autograd.grad(y, [x], dy), reps)

    def full_backward(y):
        torch.autograd.grad(y, [x] + params, dy)
    out["BW"] = time_after(lambda: layer.forward(x), full_backward, reps)

    # The pieces: each linear's three GEMMs, attention forward and backward.
    tokens = b * s
    pieces = {}
    w_total = 0.0
    for name, n_out, n_in in layer.gemm_shapes():
        w = layer.linears[name][0].detach()
        a = torch.randn(tokens, n_in, device="cuda", dtype=BF16)
        g = torch.randn(tokens, n_out, device="cuda", dtype=BF16)
        fwd = time_ms(lambda: a @ w.t(), reps)
        dx = time_ms(lambda: g @ w, reps)
        dw = time_ms(lambda: g.t() @ a, reps)
        bias_grad = 0.0
        if layer.linears[name][1] is not None:
            bias_grad = time_ms(lambda: g.sum(0), reps)
        pieces[name] = {"m": tokens, "n": n_out, "k": n_in, "fwd": fwd, "dx": dx, "dw": dw, "dbias": bias_grad}
        w_total += dw + bias_grad
        del a, g
    out["W"] = w_total
    attn, attn_grad = causal_attention(b, s, layer.heads, layer.kv_heads, layer.hd)
    pieces["attention"] = {"fwd": time_ms(attn, reps), "bwd": time_after(attn, attn_grad, reps)}
    out["pieces"] = pieces
    return out


def kernel_ms(fn, reps):
    """Mean GPU time of fn()'s kernels in ms, summed from PyTorch's profiler: the kernels alone, without
    the gaps a CPU-bound caller leaves between them (for ops shorter than PyTorch's dispatch)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    total_us = sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return total_us / 1e3 / reps


def measure_attention(case, reps):
    """Fused causal attention alone (F.scaled_dot_product_attention), forward and forward + backward,
    timed both ways: CUDA events around each call (what measure_layer's pieces record) and the sum of
    its kernels' times (kernel_ms)."""
    forward, backward = causal_attention(case["b"], case["s"], case["heads"], case["kv_heads"], case["head_dim"])

    def forward_backward():
        backward(forward())
    out = dict(case)
    out["fwd_events"] = time_ms(forward, reps)
    out["fwd_bwd_events"] = time_ms(forward_backward, reps)
    out["fwd_kernels"] = kernel_ms(forward, reps)
    out["fwd_bwd_kernels"] = kernel_ms(forward_backward, reps)
    return out


def measure_head(case, reps):
    b, s, h, V = case["b"], case["s"], case["h"], case["V"]
    tokens = b * s
    x = (torch.randn(tokens, h, device="cuda", dtype=BF16)).requires_grad_()
    w = param(V, h)
    labels = torch.randint(0, V, (tokens,), device="cuda")

    def forward():
        return F.cross_entropy((x @ w.t()).float(), labels)
    out = dict(case)
    out["F"] = time_ms(forward, reps)
    out["B"] = time_after(forward, lambda loss: torch.autograd.grad(loss, [x]), reps)
    out["BW"] = time_after(forward, lambda loss: torch.autograd.grad(loss, [x, w]), reps)
    with torch.no_grad():
        logits = x @ w.t()
        dlogits = torch.randn(tokens, V, device="cuda", dtype=BF16)
        xd, wd = x.detach(), w.detach()
        pieces = {"gemm_fwd": time_ms(lambda: xd @ wd.t(), reps),
                  "gemm_dx": time_ms(lambda: dlogits @ wd, reps),
                  "gemm_dw": time_ms(lambda: dlogits.t() @ xd, reps)}
        out["W"] = pieces["gemm_dw"]
    lf = logits.float().requires_grad_()
    pieces["ce_fwd"] = time_ms(lambda: F.cross_entropy(lf, labels), reps)
    pieces["ce_bwd"] = time_after(lambda: F.cross_entropy(lf, labels), lambda loss: torch.autograd.grad(loss, [lf]), reps)
    out["pieces"] = pieces
    return out


def measure_embedding(case, reps):
    b, s, h, V = case["b"], case["s"], case["h"], case["V"]
    table = param(V, h)
    ids = torch.randint(0, V, (b, s), device="cuda")
    dout = torch.randn(b, s, h, device="cuda", dtype=BF16)
    main_grad = torch.zeros(V, h, device="cuda", dtype=torch.float32)
    out = dict(case)
    with torch.no_grad():
        out["F"] = time_graphed_ms(lambda: F.embedding(ids, table), reps)
        flat_ids = ids.flatten()
        out["W"] = time_graphed_ms(lambda: main_grad.index_add_(0, flat_ids, dout.view(-1, h).float()), reps)
    # What autograd does by default: a dense V×h bf16 gradient, then added into the fp32 main gradient.
    table_out = lambda: F.embedding(ids, table)
    out["W_dense"] = time_after(table_out, lambda e: main_grad.add_(torch.autograd.grad(e, [table], dout)[0]), reps)
    return out


def cases(quick):
    layers, heads, embeds = [], [], []
    gpt_h = [3072, 4096] if quick else [3072, 4096, 5120, 6144]
    # Llama-style shapes: Llama-3-8B, Qwen2.5-7B, and a 6144-wide grouped-query model.
    llama = [(4096, 32, 8, 14336), (3584, 28, 4, 18944), (6144, 48, 8, 16384)]
    seqs = [2048] if quick else [2048, 4096]
    mbs = [1] if quick else [1, 2, 4]
    for s in seqs:
        for b in mbs:
            for h in gpt_h:
                layers.append(dict(op="layer", arch="gpt", b=b, s=s, h=h, heads=h // 128, kv_heads=h // 128,
                                   f=4 * h, llama=False))
            for h, a, kv, f in ([] if quick else llama):
                layers.append(dict(op="layer", arch="llama", b=b, s=s, h=h, heads=a, kv_heads=kv, f=f, llama=True))
    vocabs = [32000, 128256] if quick else [32000, 50304, 128256, 152064, 256000]
    for h in ([4096] if quick else [3072, 4096, 6144]):
        for s in seqs:
            for b in ([1] if quick else [1, 4]):
                for V in vocabs:
                    heads.append(dict(op="head", b=b, s=s, h=h, V=V))
                    embeds.append(dict(op="embedding", b=b, s=s, h=h, V=V))
    return layers, heads, embeds


def reference_cases():
    gpt = dict(op="layer", arch="gpt", b=1, s=2048, h=4096, heads=32, kv_heads=32, f=16384, llama=False)
    llama = dict(op="layer", arch="llama", b=1, s=2048, h=4096, heads=32, kv_heads=8, f=14336, llama=True)
    return [gpt, llama], [], []


def tensor_parallel_cases():
    """One rank's part of a layer at tensor parallelism 1, 2, 4 and 8: Llama-3-8B at 2K and 8K tokens
    (torchtitan's runs), Llama-3-70B at 4K, GPT-3 175B at 2K (Megatron-LM's)."""
    models = [("llama", 4096, 32, 8, 14336, 2048), ("llama", 4096, 32, 8, 14336, 8192),
              ("llama", 8192, 64, 8, 28672, 4096), ("gpt", 12288, 96, 96, 49152, 2048)]
    return [dict(op="layer", arch=arch, b=1, s=s, h=h, heads=a, kv_heads=kv, f=f, llama=arch == "llama", tp=tp)
            for arch, h, a, kv, f, s in models for tp in (1, 2, 4, 8)], [], []


def attention_cases():
    """Attention alone at head dim 128 over the heads one rank holds (128 down to 4: tensor parallelism
    splits them) and 2K to 8K tokens, so the kernels' launch grid (batch · heads · query blocks) spans
    64 to 8,192 blocks."""
    return [dict(op="attention", b=1, s=s, heads=a, kv_heads=a, head_dim=128)
            for s in (2048, 4096, 8192) for a in (4, 8, 16, 32, 64, 128)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", help="JSON file to write (default: stdout table only)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="a few shapes only")
    ap.add_argument("--reference", action="store_true", help="only the GPT and Llama-3-8B layers the CUDA backend is held to")
    ap.add_argument("--attention", action="store_true",
                    help="fused attention alone over heads and sequence lengths, events and kernel sums")
    ap.add_argument("--tensor-parallel", action="store_true",
                    help="one rank's part of four layers at tensor parallelism 1, 2, 4 and 8 (the \"tp\" field)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("measure-ops: no CUDA device", file=sys.stderr)
        return 77
    torch.backends.cuda.matmul.allow_tf32 = False
    props = torch.cuda.get_device_properties(0)
    result = {"device": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
              "cuda": torch.version.cuda, "date": time.strftime("%Y-%m-%d", time.gmtime()), "reps": args.reps,
              "ops": []}
    layers, heads, embeds = (reference_cases() if args.reference else
                             tensor_parallel_cases() if args.tensor_parallel else cases(args.quick))
    todo = [(measure_layer, c) for c in layers] + [(measure_head, c) for c in heads] + \
           [(measure_embedding, c) for c in embeds]
    if args.attention:
        todo = [(measure_attention, c) for c in attention_cases()]
    started = time.time()
    for i, (measure, case) in enumerate(todo, 1):
        try:
            row = measure(case, args.reps)
        except Exception as error:  # out of memory, or a shape this PyTorch cannot run: recorded, not fatal
            row = dict(case, error=repr(error))
        torch.cuda.empty_cache()
        result["ops"].append(row)
        keys = {k: v for k, v in row.items() if k in ("arch", "b", "s", "h", "V", "f", "heads", "kv_heads", "tp")}
        times = row.get("error") or " ".join(f"{k}={row[k]:.3f}" for k in ("F", "B", "W", "BW", "W_dense", "fwd_events",
                                                                         "fwd_bwd_events", "fwd_kernels", "fwd_bwd_kernels")
                                             if k in row)
        print(f"[{i}/{len(todo)} {time.time() - started:5.0f}s] {row['op']:9s} {keys} {times}", flush=True)
        if args.output:  # rewritten after every case, so a run cut short keeps what it measured
            with open(args.output, "w") as fh:
                json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
