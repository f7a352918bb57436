#!/usr/bin/env python3
"""pipesim's pass times against those the Vocabulary Parallelism authors measured, pass by pass.

docs/data/vocab-paper-passes.json holds the per-device pass times of the authors' 8-GPU 1F1B runs (their
artifact's experiment list; the file says which column is what). For each run of baseline, vocab-1,
vocab-2 and interlaced this simulates configs/paper/1f1b-8gpu-seqSEQ.json with the run's method and
vocabulary, writes a Chrome trace, averages each pass over its microbatches and prints, in ms, measured
against predicted:

  layers F, B   a transformer stage's forward and backward (devices 1-6, four layers each)
  head F, B     the last stage's less a transformer stage's: the output layer and loss (baseline)
  embedding B   the first stage's backward less a transformer stage's: the embedding (baseline)
  S + T         one output-layer step, the T of a microbatch and the S of the next (vocabulary modes)
  IF, IB        the input layer's forward and backward (vocabulary modes)

then the mean signed error of each (positive: pipesim slower), and each vocabulary-mode pass split by
vocabulary: a straight line through its four vocabulary sizes, per method and sequence, measured and
predicted. The slope (ms per 1,000 entries) is what grows with the shard, the kernels pipesim counts
a logit or a table row at a time; the intercept is what the pass costs whatever the vocabulary.
`redistribute` moves layers between stages and is left out. Progress goes to stderr.

--fit: instead, fits the GEMM and attention efficiencies of the configs' hardware to the transformer
stages of the baseline runs, in which no vocabulary collective runs beside them: what the authors'
machine ran this model at. A stage's time is G/e_gemm + A/e_attention + M (GEMMs, attention,
memory-bound kernels); three simulations a run (both efficiencies 0.5, then each at 1) give G, A and
M, and least squares over the runs' F and B gives the two efficiencies.

--fit-comm-sms: instead, fits hardware.comm_sms, the SMs an NCCL kernel resident beside the layers
holds from them: the vocab-1 and vocab-2 runs' transformer stages against their baseline's (same
vocabulary and sequence), the ratio measured against the ratio predicted, over the grid (--grid
LOW:HIGH, whole SMs). Fitted on the sequence-2048 runs, reported on those and on the held-out 4096 ones.

--compose: instead, times each run's schedule with the passes the run measured (a `costs` block: each
device's F and B, stage by stage as its layers lie, the output-layer step split into S and T as pipesim
divides it, the input layer's passes; the collectives, transfers and optimizer step at pipesim's own
analytic times) and sets the iteration time beside the one the run measured (the file's iteration_ms):
how far pipesim's schedules are off with the cost model taken out. Then each mode's speed-up over the
baseline of its vocabulary and sequence, measured and so composed.

usage: tools/vocab-passes.py [--pipesim PATH] [--set KEY=VALUE ...] [--fit | --fit-comm-sms [--grid LOW:HIGH] | --compose]
"""
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

from comparison import add_set_option, pipesim_parser, require_pipesim, set_options

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "data" / "vocab-paper-passes.json"
METHODS = ("baseline", "vocab-1", "vocab-2", "interlaced")
LAYERS, DEVICES = 32, 8  # the runs' model and pipeline
VOCABULARY_PASSES = ("S + T", "IF", "IB")


def fail(message):
    print(f"vocab-passes.py: {message}", file=sys.stderr)
    sys.exit(1)


def mean(values):
    return sum(values) / len(values)


def trace_events(pipesim, case, sets, folder):
    """(device, op, ms) for every op of pipesim's analytic Chrome trace of the case, op as its first word."""
    config = ROOT / "configs" / "paper" / f"1f1b-8gpu-seq{case['seq']}.json"
    trace = pathlib.Path(folder) / f"{case['name']}.json"
    command = [pipesim, "simulate", str(config), "--vocab", case["method"], "--set", f"model.vocab={case['vocab']}",
               *set_options(sets), "--trace", str(trace)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        fail(f"{' '.join(command)} failed:\n{done.stderr.strip()}")
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    return [(e["pid"], e["name"].split()[0], e["dur"] / 1e3) for e in events if e.get("ph") == "X"]


def predicted_passes(pipesim, case, sets, folder):
    """{(device, pass): mean ms over its microbatches} from pipesim's Chrome trace of the case."""
    durations = {}
    for device, op, ms in trace_events(pipesim, case, sets, folder):
        durations.setdefault((device, op), []).append(ms)
    return {key: mean(values) for key, values in durations.items()}


def transformer_stage(passes):
    """A transformer stage's F and B, in ms: their means over devices 1-6, which hold neither vocabulary layer."""
    return [mean([passes[(d, kind)] for d in range(1, 7)]) for kind in ("F", "B")]


def measured_stage(case):
    """transformer_stage as the authors measured it in the case."""
    return [mean(case["forward_ms"][1:7]), mean(case["backward_ms"][1:7])]


def stage_times(pipesim, case, sets, folder):
    """transformer_stage as pipesim predicts it for the case."""
    return transformer_stage(predicted_passes(pipesim, case, sets, folder))


def fit(pipesim, cases, sets):
    """Least-squares GEMM and attention efficiencies from the baseline runs' transformer stages."""
    baseline = [c for c in cases if c["method"] == "baseline"]
    rows = []  # (G, A, measured - M): a pass takes G/e_gemm + A/e_attention + M
    # The configs run FlashAttention-2 (precision.attention_kernel): its efficiency is the one fitted.
    at = lambda gemm, attention: sets + [f"hardware.compute_efficiency={gemm}",
                                         f"hardware.flash2_attention_efficiency={attention}"]
    with tempfile.TemporaryDirectory() as folder:
        for i, case in enumerate(baseline, 1):
            print(f"vocab-passes.py: fit [{i}/{len(baseline)}] {case['name']}", file=sys.stderr, flush=True)
            both = stage_times(pipesim, case, at(0.5, 0.5), folder)
            gemm = stage_times(pipesim, case, at(1, 0.5), folder)
            attention = stage_times(pipesim, case, at(0.5, 1), folder)
            for k, measured in enumerate(measured_stage(case)):
                g, a = both[k] - gemm[k], both[k] - attention[k]
                rows.append((g, a, measured - (both[k] - 2 * g - 2 * a)))
    gg, aa, ga = (sum(x * y for x, y in pairs) for pairs in
                  (((g, g) for g, _, _ in rows), ((a, a) for _, a, _ in rows), ((g, a) for g, a, _ in rows)))
    gy, ay = sum(g * y for g, _, y in rows), sum(a * y for _, a, y in rows)
    det = gg * aa - ga * ga
    inverse_gemm, inverse_attention = (gy * aa - ay * ga) / det, (ay * gg - gy * ga) / det
    return 1 / inverse_gemm, 1 / inverse_attention, len(rows)


def fit_comm_sms(pipesim, cases, sets, grid):
    """{k: (fitted-half errors, held-out errors)}: each vocab-1/vocab-2 run's F and B ratio to its
    baseline, predicted at hardware.comm_sms = k over measured, less one."""
    baseline = {(c["vocab"], c["seq"]): c for c in cases if c["method"] == "baseline"}
    runs = [c for c in cases if c["method"] in ("vocab-1", "vocab-2") and (c["vocab"], c["seq"]) in baseline]
    errors = {}
    with tempfile.TemporaryDirectory() as folder:
        base = {key: stage_times(pipesim, c, sets, folder) for key, c in baseline.items()}
        for k in grid:
            print(f"vocab-passes.py: comm_sms {k}", file=sys.stderr, flush=True)
            fitted, held_out = [], []
            for case in runs:
                key = (case["vocab"], case["seq"])
                predicted = stage_times(pipesim, case, sets + [f"hardware.comm_sms={k}"], folder)
                measured, measured_base = measured_stage(case), measured_stage(baseline[key])
                half = fitted if case["seq"] == 2048 else held_out
                half += [(predicted[i] / base[key][i]) / (measured[i] / measured_base[i]) - 1 for i in (0, 1)]
            errors[k] = (fitted, held_out)
    return errors


def stage_layers(case):
    """The runs' layer split: four a stage, or under redistribute the last stage's final_stage_layers and
    the layers it gives up one each on the stages just before it (the artifact's 4 4 4 5 5 5 5 0 at 256k)."""
    layers = [LAYERS // DEVICES] * DEVICES
    given_up = layers[-1] - case["final_stage_layers"]
    layers[-1] = case["final_stage_layers"]
    for d in range(DEVICES - 1 - given_up, DEVICES - 1):
        layers[d] += 1
    return layers


def composed_iteration(pipesim, case, sets, folder):
    """pipesim's iteration time for the case with the run's own pass times (the --compose costs block)."""
    events = [(op, ms) for _, op, ms in trace_events(pipesim, case, sets, folder)]
    analytic = lambda *names: mean([ms for name, ms in events if name in names] or [0.0])
    layers, share = stage_layers(case), LAYERS / DEVICES
    # costs are per even share of the layers: a stage's measured pass scaled back to it; a stage with
    # no layers (redistribute at 256k) keeps only the output layer, given as such.
    per_share = lambda times: [t * share / n if n else 0.0 for t, n in zip(times, layers)]
    costs = {"forward_ms": per_share(case["forward_ms"]), "backward_ms": per_share(case["backward_ms"]),
             "p2p_ms": analytic("SEND"), "optimizer_ms": analytic("OPTIMIZER"),
             "allreduce_ms": analytic("ALLREDUCE", "BROADCAST", "REDUCE")}
    if layers[-1] == 0:
        costs["output_forward_ms"], costs["output_backward_ms"] = case["forward_ms"][-1], case["backward_ms"][-1]
    if "s_ms" in case:  # the vocabulary passes, given for the whole layer: each device runs 1/p of it
        s, t = analytic("S"), analytic("T")
        step = DEVICES * mean(case["s_ms"])
        costs.update(output_forward_ms=step * s / (s + t), output_backward_ms=step * t / (s + t),
                     input_forward_ms=DEVICES * mean(case["input_forward_ms"]),
                     input_backward_ms=DEVICES * mean(case["input_backward_ms"]))
    config = json.loads((ROOT / "configs" / "paper" / f"1f1b-8gpu-seq{case['seq']}.json").read_text())
    config["costs"] = costs
    config["schedule"]["layers_per_stage"] = layers
    path = pathlib.Path(folder) / f"{case['name']}-measured-passes.json"
    path.write_text(json.dumps(config))
    command = [pipesim, "simulate", str(path), "--vocab", case["method"], "--set", f"model.vocab={case['vocab']}",
               *set_options(sets), "--format", "json"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        fail(f"{' '.join(command)} failed:\n{done.stderr.strip()}")
    return json.loads(done.stdout)["iteration_time_s"] * 1e3


def compose(pipesim, cases, sets):
    """The --compose table and summaries."""
    print("| run | measured iteration ms | with the measured passes | error |")
    print("|---|---:|---:|---:|")
    composed, errors = {}, {}
    with tempfile.TemporaryDirectory() as folder:
        for i, case in enumerate(cases, 1):
            print(f"vocab-passes.py: compose [{i}/{len(cases)}] {case['name']}", file=sys.stderr, flush=True)
            ms = composed_iteration(pipesim, case, sets, folder)
            composed[case["name"]] = ms
            error = ms / case["iteration_ms"] - 1
            errors.setdefault(case["method"], []).append(error)
            print(f"| {case['method']} {case['vocab'] // 1000}k s{case['seq']} | {case['iteration_ms']:.1f} | {ms:.1f} | "
                  f"{error:+.1%} |")
    print()
    for method, values in errors.items():
        print(f"{method}: {len(values)} runs, mean |error| {mean([abs(v) for v in values]):.1%}, "
              f"mean signed {statistics.mean(values):+.1%}, from {min(values):+.1%} to {max(values):+.1%}")
    baseline = {(c["vocab"], c["seq"]): c for c in cases if c["method"] == "baseline"}
    ratios = [(baseline[(c["vocab"], c["seq"])], c) for c in cases
              if c["method"] != "baseline" and (c["vocab"], c["seq"]) in baseline]
    gaps = [(composed[b["name"]] / composed[c["name"]]) / (b["iteration_ms"] / c["iteration_ms"]) - 1 for b, c in ratios]
    print(f"speed-up over the baseline: {len(gaps)} runs, mean |error| {mean([abs(g) for g in gaps]):.1%}, "
          f"mean signed {statistics.mean(gaps):+.1%}, from {min(gaps):+.1%} to {max(gaps):+.1%}")


def main():
    parser = pipesim_parser(__doc__.splitlines()[0])
    add_set_option(parser)
    parser.add_argument("--fit", action="store_true", help="fit the GEMM and attention efficiencies instead")
    parser.add_argument("--fit-comm-sms", action="store_true", help="fit hardware.comm_sms instead")
    parser.add_argument("--grid", default="0:16", help="with --fit-comm-sms: the SM counts tried, LOW:HIGH")
    parser.add_argument("--compose", action="store_true",
                        help="time each run's schedule with its measured passes instead")
    args = parser.parse_args()
    require_pipesim(args.pipesim, fail)
    if args.compose:
        compose(args.pipesim, json.loads(DATA.read_text())["cases"], args.set)
        return
    cases = [c for c in json.loads(DATA.read_text())["cases"] if c["method"] in METHODS]
    if args.fit:
        gemm, attention, n = fit(args.pipesim, cases, args.set)
        print(f"fitted on {n} baseline transformer-stage passes: compute_efficiency {gemm:.3f}, "
              f"flash2_attention_efficiency {attention:.3f}")
        return
    if args.fit_comm_sms:
        try:
            low, high = (int(x) for x in args.grid.split(":"))
        except ValueError:
            fail(f"--grid {args.grid}: expected LOW:HIGH, two whole numbers")
        if not 0 <= low <= high:
            fail(f"--grid {args.grid}: expected 0 <= LOW <= HIGH")
        errors = fit_comm_sms(args.pipesim, cases, args.set, range(low, high + 1))
        absolute = lambda values: mean([abs(v) for v in values])
        best = min(errors, key=lambda k: absolute(errors[k][0]))
        for name, values in zip(("fitted (sequence 2048)", "held out (sequence 4096)"), errors[best]):
            print(f"comm_sms {best}, {name}: {len(values)} ratios, mean |error| {absolute(values):.1%}, "
                  f"mean signed {statistics.mean(values):+.1%}")
        if low == 0:
            none = errors[0][0] + errors[0][1]
            print(f"comm_sms 0 (none held), all runs: {len(none)} ratios, mean |error| {absolute(none):.1%}, "
                  f"mean signed {statistics.mean(none):+.1%}")
        return
    print("| run | pass | measured ms | predicted ms | error |")
    print("|---|---|---:|---:|---:|")
    errors, by_vocabulary = {}, {}
    with tempfile.TemporaryDirectory() as folder:
        for i, case in enumerate(cases, 1):
            print(f"vocab-passes.py: [{i}/{len(cases)}] {case['name']}", file=sys.stderr, flush=True)
            p = predicted_passes(args.pipesim, case, args.set, folder)
            f, b = transformer_stage(p)
            measured_f, measured_b = measured_stage(case)
            pairs = [("layers F", measured_f, f), ("layers B", measured_b, b)]
            if case["method"] == "baseline":
                pairs += [("head F", case["forward_ms"][7] - measured_f, p[(7, "F")] - f),
                          ("head B", case["backward_ms"][7] - measured_b, p[(7, "B")] - b),
                          ("embedding B", case["backward_ms"][0] - measured_b, p[(0, "B")] - b)]
            else:
                devices = range(8)
                pairs += [("S + T", mean(case["s_ms"]), mean([p[(d, "S")] + p[(d, "T")] for d in devices])),
                          ("IF", mean(case["input_forward_ms"]), mean([p[(d, "IF")] for d in devices])),
                          ("IB", mean(case["input_backward_ms"]), mean([p[(d, "IB")] for d in devices]))]
            label = f"{case['method']} {case['vocab'] // 1000}k s{case['seq']}"
            for what, measured, predicted in pairs:
                error = predicted / measured - 1
                errors.setdefault(what, []).append(error)
                print(f"| {label} | {what} | {measured:.2f} | {predicted:.2f} | {error:+.1%} |")
                if what in VOCABULARY_PASSES:
                    key = (what, case["method"], case["seq"])
                    by_vocabulary.setdefault(key, []).append((case["vocab"] / 1000, measured, predicted))
    print()
    for what, values in errors.items():
        print(f"{what}: {len(values)} runs, mean signed error {statistics.mean(values):+.1%}, "
              f"from {min(values):+.1%} to {max(values):+.1%}")
    print()
    for (what, method, seq), points in sorted(by_vocabulary.items(), key=lambda item: VOCABULARY_PASSES.index(item[0][0])):
        vocab = [v for v, _, _ in points]
        measured = statistics.linear_regression(vocab, [m for _, m, _ in points])
        predicted = statistics.linear_regression(vocab, [p for _, _, p in points])
        line = lambda fit: f"{round(fit.intercept, 2) + 0.0:.2f} ms {round(fit.slope, 4) + 0.0:+.4f} ms per 1k"  # no -0
        print(f"{what}, {method} s{seq}: measured {line(measured)}, predicted {line(predicted)}")


if __name__ == "__main__":
    main()
