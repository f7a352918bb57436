#!/usr/bin/env python3
"""Predicted against published training throughput, for every run in docs/data/published-runs.json.

Simulates each run with `pipesim simulate --format json` and prints a Markdown table (tokens/s per
GPU, published and predicted, and the error), then the mean |error|, the worst and the mean signed
error (positive: pipesim optimistic) over all runs, per source, for pp = 1 against pp > 1 and per
GPU. Where a source gives
TFLOP/s per GPU, both sides are converted with the FLOPs formula that source counts with, so the
error is the error in iteration time either way. Progress goes to stderr.

usage: tools/published-runs.py [--pipesim PATH] [--only TEXT] [--data FILE] [--fit [--grid LOW:HIGH:STEP]]

--fit: instead of the table, fits hardware.sustained_compute_fraction, one per hardware preset (docs/cost-model.md,
"Sustained throughput"), to the even-numbered runs of that preset in table order, and reports the errors on those
and on the odd-numbered ones, held out. The presets carry the fractions it prints.

--data docs/data/published-runs-moe.json: the mixture-of-experts runs; a row whose model pipesim
cannot describe yet names the config it waits for and is listed as skipped.
"""
import json
import pathlib
import sys

from comparison import grid_values, pipesim_parser, require_pipesim, simulate, summarize

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "data" / "published-runs.json"


def fail(message):
    print(f"published-runs.py: {message}", file=sys.stderr)
    sys.exit(1)


def model_of(config_path, overrides):
    """The config's model and parallel fields after the run's --set overrides (plain dotted keys)."""
    config = json.loads((ROOT / config_path).read_text())
    for item in overrides:
        key, value = item.split("=", 1)
        section, field = key.split(".", 1)
        try:
            config.setdefault(section, {})[field] = json.loads(value)
        except json.JSONDecodeError:  # a bare word, as --set takes it
            config.setdefault(section, {})[field] = value
    return config["model"], config["parallel"], config.get("hardware", {}).get("preset", "")


def flops_per_token(formula, model):
    """FLOPs one token costs under the formula a source counts its TFLOP/s with."""
    s, l, h, V = model["seq_len"], model["layers"], model["hidden"], model["vocab"]
    if formula == "megatron_recompute":  # 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) per iteration, / (B s)
        return 96 * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    if formula == "six_n_causal":
        kv = model.get("kv_heads", model["heads"]) / model["heads"]
        f = model["ffn_hidden"]
        mlp = 3 if model.get("mlp") == "swiglu" else 2
        params = l * (h * h * (2 + 2 * kv) + mlp * h * f) + 2 * V * h
        return 6 * params + 6 * l * s * h
    fail(f"{DATA}: unknown flops formula '{formula}'")


def published_tokens_per_gpu(run, model):
    """The source's figure as tokens/s per GPU."""
    if "iteration_s" in run:
        return run["tokens_per_iteration"] / run["iteration_s"] / run["gpus"]
    return run["tflops_per_gpu"] * 1e12 / flops_per_token(run["flops"], model)


def rate(tokens_per_s):
    """Three significant figures at least: 1T-parameter runs do about 20 tokens/s per GPU."""
    return f"{tokens_per_s:,.0f}" if tokens_per_s >= 100 else f"{tokens_per_s:.1f}"


def check_layout(run, model, parallel, result):
    """The row's GPUs and batch must be what the config simulates: a typo here would be silent."""
    gpus = result["pp"] * result["tp"] * result["dp"] * parallel.get("cp", 1)
    tokens = result["dp"] * result["microbatches"] * model.get("micro_batch_size", 1) * model["seq_len"]
    if gpus != run["gpus"] or tokens != run["tokens_per_iteration"]:
        fail(f"{DATA}: run '{run['name']}': the config simulates {gpus} GPUs and {tokens} tokens an iteration, "
             f"the row says {run['gpus']} and {run['tokens_per_iteration']}")


def gpu_of(preset):
    return "A100" if preset.startswith("a100") else "H100" if preset.startswith("h100") else preset


def errors_by_fraction(pipesim, runs, grid):
    """{fraction: [each run's error at hardware.sustained_compute_fraction = fraction]}, one
    `pipesim sweep` over the grid per run."""
    by = {k: [] for k in grid}
    for i, run in enumerate(runs, 1):
        print(f"published-runs.py: fit [{i}/{len(runs)}] {run['name']}", file=sys.stderr, flush=True)
        model, parallel, preset = model_of(run["config"], run["set"])
        points = simulate(pipesim, ROOT / run["config"], run["set"], lambda m: fail(f"{run['name']}: {m}"),
                          grid="hardware.sustained_compute_fraction=" + ",".join(str(k) for k in grid))
        for point in points:
            error = point["tokens_per_s"] / run["gpus"] / published_tokens_per_gpu(run, model) - 1
            by[point["hardware.sustained_compute_fraction"]].append(
                {"error": error, "name": run["name"], "pp": point["pp"], "gpu": gpu_of(preset)})
    return by


def fit(pipesim, runs, grid):
    """Per preset, the sustained fraction that minimises the mean |error| of its even-numbered runs, and
    the errors it gives on those and on the odd-numbered ones (held out)."""
    fitted_all = []
    mean = lambda errors: sum(abs(e["error"]) for e in errors) / len(errors)
    runs_of = {}  # a fraction per preset: one GPU at two power limits is two presets
    for run in runs:
        runs_of.setdefault(model_of(run["config"], run["set"])[2], []).append(run)
    for preset in sorted(runs_of):
        by = errors_by_fraction(pipesim, runs_of[preset], grid)
        fitted = {k: errors[0::2] for k, errors in by.items()}
        best = min(grid, key=lambda k: mean(fitted[k]))
        print(f"{preset}: sustained_compute_fraction {best:.2f}, fitted to {len(fitted[best])} runs, "
              f"held out {len(by[best][1::2])}")
        summarize(f"{preset} fitted half", fitted[best])
        summarize(f"{preset} held-out half", by[best][1::2])
        fitted_all += by[best]
    summarize("all runs, fitted fractions", fitted_all)
    summarize("pp = 1, fitted fractions", [e for e in fitted_all if e["pp"] == 1])
    summarize("pp > 1, fitted fractions", [e for e in fitted_all if e["pp"] > 1])


def main():
    global DATA  # the file the messages name
    parser = pipesim_parser(__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="only the runs whose name contains this text")
    parser.add_argument("--data", default=str(DATA), help="the runs' file (default: %(default)s)")
    parser.add_argument("--fit", action="store_true",
                        help="instead of the table, fit hardware.sustained_compute_fraction per GPU on half the runs and report the other half")
    parser.add_argument("--grid", default="0.50:1.00:0.01", help="with --fit: the fractions tried, LOW:HIGH:STEP")
    args = parser.parse_args()
    DATA = pathlib.Path(args.data)
    if not DATA.is_file():
        fail(f"{DATA}: no such file; give --data docs/data/published-runs.json or docs/data/published-runs-moe.json")
    require_pipesim(args.pipesim, fail)
    data = json.loads(DATA.read_text())
    runs = [run for run in data["runs"] if args.only in run["name"]]
    waiting = [run for run in runs if not (ROOT / run["config"]).is_file()]
    runs = [run for run in runs if run not in waiting]
    for run in waiting:
        print(f"published-runs.py: skipped '{run['name']}': {run['config']}", file=sys.stderr)
    if not runs:
        fail(f"no run in {DATA} has '{args.only}' in its name")

    if args.fit:  # the fit alone: it simulates every run once per fraction tried
        fit(args.pipesim, runs, grid_values(args.grid))
        return
    print("| run | source | GPUs | tp·pp·dp·cp | published tokens/s/GPU | predicted | error | peak GiB (fits) |")
    print("|---|---|---:|---|---:|---:|---:|---|")
    errors = []
    for i, run in enumerate(runs, 1):
        print(f"published-runs.py: [{i}/{len(runs)}] {run['name']}", file=sys.stderr, flush=True)
        model, parallel, preset = model_of(run["config"], run["set"])
        result = simulate(args.pipesim, ROOT / run["config"], run["set"], lambda m: fail(f"{run['name']}: {m}"))
        check_layout(run, model, parallel, result)
        published = published_tokens_per_gpu(run, model)
        predicted = result["tokens_per_s"] / run["gpus"]
        error = predicted / published - 1
        errors.append({"error": error, "name": run["name"], "source": run["source"], "pp": result["pp"],
                       "gpu": gpu_of(preset), "preset": preset})
        layout = f"{result['tp']}·{result['pp']}·{result['dp']}·{parallel.get('cp', 1)}"
        peak = result["peak_memory_bytes"] / 2**30
        fits = "fits" if result["fits_in_memory"] else "does not fit"
        print(f"| {run['name']} | {run['source']} | {run['gpus']} | {layout} | {rate(published)} | {rate(predicted)} "
              f"| {error:+.1%} | {peak:.1f} ({fits}) |")
    print()
    summarize("all runs", errors)
    for source in dict.fromkeys(e["source"] for e in errors):
        summarize(source, [e for e in errors if e["source"] == source])
    summarize("pp = 1", [e for e in errors if e["pp"] == 1])
    summarize("pp > 1", [e for e in errors if e["pp"] > 1])
    for gpu in sorted({e["gpu"] for e in errors}):
        summarize(gpu, [e for e in errors if e["gpu"] == gpu])
    for preset in sorted({e["preset"] for e in errors}):
        summarize(f"preset {preset}", [e for e in errors if e["preset"] == preset])


if __name__ == "__main__":
    main()
