#!/usr/bin/env python3
"""Fits hardware.fp8_efficiency on half of the published FP8 runs and reports the other half.

Each FP8 row of docs/data/published-runs.json whose BF16 twin (same config and overrides, without
precision.fp8) is in the table gives a published speedup, BF16 time over FP8 time. The speedup cancels
what the BF16 model gets wrong for both, so it measures the FP8 GEMMs alone. Rows alternate between a
fitting half (even positions) and a held-out half (odd): the efficiency that minimises the fitting
half's squared log error of predicted against published speedup is printed, then each half's errors
at it. Progress goes to stderr.

usage: tools/fit-fp8.py [--pipesim PATH] [--grid LOW:HIGH:STEP]
"""
import json
import math
import pathlib
import sys

from comparison import grid_values, pipesim_parser, require_pipesim, simulate, summarize

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "data" / "published-runs.json"


def fail(message):
    print(f"fit-fp8.py: {message}", file=sys.stderr)
    sys.exit(1)


def iteration_s(pipesim, config, sets):
    return simulate(pipesim, ROOT / config, sets, fail)["iteration_time_s"]


def pairs(runs):
    """(FP8 row, its BF16 twin) for every FP8 row that has one, in table order."""
    out = []
    for run in runs:
        if not any(s.startswith("precision.fp8=") for s in run["set"]):
            continue
        plain = [s for s in run["set"] if not s.startswith("precision.fp8=")]
        twin = next((r for r in runs if r["config"] == run["config"] and r["set"] == plain), None)
        if twin and "iteration_s" in run and "iteration_s" in twin:
            out.append((run, twin))
    return out


def main():
    parser = pipesim_parser(__doc__.splitlines()[0])
    parser.add_argument("--grid", default="0.40:0.80:0.01", help="efficiencies tried, LOW:HIGH:STEP")
    args = parser.parse_args()
    require_pipesim(args.pipesim, fail)
    grid = grid_values(args.grid)
    found = pairs(json.loads(DATA.read_text())["runs"])
    if len(found) < 2:
        fail(f"{DATA} has {len(found)} FP8 rows with a BF16 twin; the fit needs two")
    fit, held_out = found[0::2], found[1::2]
    bf16 = {}
    predicted = {}  # (row name, efficiency) -> predicted speedup
    for i, (fp8, twin) in enumerate(found, 1):
        print(f"fit-fp8.py: [{i}/{len(found)}] {fp8['name']}", file=sys.stderr, flush=True)
        bf16[fp8["name"]] = iteration_s(args.pipesim, twin["config"], twin["set"])
        for e in grid:
            t = iteration_s(args.pipesim, fp8["config"], fp8["set"] + [f"hardware.fp8_efficiency={e}"])
            predicted[fp8["name"], e] = bf16[fp8["name"]] / t

    def loss(rows, e):
        return sum(math.log(predicted[f["name"], e] / (t["iteration_s"] / f["iteration_s"])) ** 2 for f, t in rows)

    best = min(grid, key=lambda e: loss(fit, e))
    print(f"fp8_efficiency {best:.2f} (fitted on {len(fit)} rows; {len(held_out)} held out)\n")
    print("| run | half | published speedup | predicted | error |")
    print("|---|---|---:|---:|---:|")
    rows = {"fit": fit, "held out": held_out}
    errors = {label: [] for label in rows}
    for label, pairs_of_half in rows.items():
        for f, t in pairs_of_half:
            published = t["iteration_s"] / f["iteration_s"]
            error = predicted[f["name"], best] / published - 1
            errors[label].append({"error": error, "name": f["name"]})
            print(f"| {f['name']} | {label} | {published:.3f} | {predicted[f['name'], best]:.3f} | {error:+.1%} |")
    print()
    for label, half in errors.items():
        summarize(label, half, "rows")

if __name__ == "__main__":
    main()
