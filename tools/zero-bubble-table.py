#!/usr/bin/env python3
"""pipesim's bubble rate for every schedule of the zero-bubble paper's Table 5 on each of its setups
(configs/paper/zero-bubble-*: its Table 9 op times), and ZB-2p's peak activations against 1F1B's, as
one Markdown table; docs/schedules.md sets it beside the paper's.

Usage: tools/zero-bubble-table.py [path/to/pipesim]
"""
import json
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCHEDULES = ["1f1b", "zb-h1", "zb-h2", "zb-1p", "zb-2p"]


def simulate(pipesim, config, schedule):
    out = subprocess.run([pipesim, "simulate", str(config), "--schedule", schedule, "--vocab", "baseline",
                          "--format", "json"], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    pipesim = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "build/tools/pipesim")
    if not os.access(pipesim, os.X_OK):
        sys.exit(f"zero-bubble-table.py: {pipesim} is not an executable pipesim; build it (tools/setup.sh) or pass its path")
    def setup(path):
        size, m = re.match(r"zero-bubble-([\d.]+)b-m(\d+)\.json", path.name).groups()
        return float(size), int(m)
    print("| model | p | m | " + " | ".join(SCHEDULES) + " | zb-2p peak activation ÷ 1f1b's |")
    print("|---|---:|---:|" + "---:|" * (len(SCHEDULES) + 1))
    for config in sorted((ROOT / "configs/paper").glob("zero-bubble-*.json"), key=setup):
        size, m = setup(config)
        runs = {s: simulate(pipesim, config, s) for s in SCHEDULES}
        peak = {s: max(d["peak_activation_bytes"] for d in r["devices"]) for s, r in runs.items()}
        bubbles = " | ".join(f"{runs[s]['bubble_fraction']:.4f}" for s in SCHEDULES)
        print(f"| {size:g}B | {runs['1f1b']['pp']} | {m} | {bubbles} | {peak['zb-2p'] / peak['1f1b']:.2f} |")


if __name__ == "__main__":
    main()
