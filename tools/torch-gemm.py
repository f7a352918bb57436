#!/usr/bin/env python3
"""cuBLAS's bf16 GEMM through PyTorch at 8192^3: the reference the runtime's GEMM is measured against
(tools/gpu-figures.sh, tools/gpu-check.sh). Prints one line: ms and TFLOP/s, the mean of 50 after 5
warm-up calls."""
import torch

a, b = (torch.rand(8192, 8192, device="cuda", dtype=torch.bfloat16) - 0.5 for _ in range(2))
for _ in range(5):
    a @ b
start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(50):
    a @ b
stop.record()
torch.cuda.synchronize()
ms = start.elapsed_time(stop) / 50
print(f"cuBLAS through PyTorch {torch.__version__}: bf16 GEMM 8192x8192x8192: {ms:.3f} ms, "
      f"{2 * 8192**3 / ms / 1e9:.1f} TFLOP/s (mean of 50)")
