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
  IB            the input layer's backward (vocabulary modes)

then the mean signed error of each (positive: pipesim slower). `redistribute` moves layers between
stages and is left out. Progress goes to stderr.

usage: tools/vocab-passes.py [--pipesim PATH] [--set KEY=VALUE ...]
"""
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

from comparison import pipesim_parser, require_pipesim

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "data" / "vocab-paper-passes.json"
METHODS = ("baseline", "vocab-1", "vocab-2", "interlaced")


def fail(message):
    print(f"vocab-passes.py: {message}", file=sys.stderr)
    sys.exit(1)


def mean(values):
    return sum(values) / len(values)


def predicted_passes(pipesim, case, sets, folder):
    """{(device, pass): mean ms over its microbatches} from pipesim's Chrome trace of the case."""
    config = ROOT / "configs" / "paper" / f"1f1b-8gpu-seq{case['seq']}.json"
    trace = pathlib.Path(folder) / f"{case['name']}.json"
    command = [pipesim, "simulate", str(config), "--vocab", case["method"], "--set", f"model.vocab={case['vocab']}",
               *(x for item in sets for x in ("--set", item)), "--trace", str(trace)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        fail(f"{' '.join(command)} failed:\n{done.stderr.strip()}")
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    durations = {}
    for event in events:
        if event.get("ph") == "X":
            durations.setdefault((event["pid"], event["name"].split()[0]), []).append(event["dur"] / 1e3)
    return {key: mean(values) for key, values in durations.items()}


def main():
    parser = pipesim_parser(__doc__.splitlines()[0])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field of every config (pipesim's --set; repeatable)")
    args = parser.parse_args()
    require_pipesim(args.pipesim, fail)
    cases = [c for c in json.loads(DATA.read_text())["cases"] if c["method"] in METHODS]
    print("| run | pass | measured ms | predicted ms | error |")
    print("|---|---|---:|---:|---:|")
    errors = {}
    with tempfile.TemporaryDirectory() as folder:
        for i, case in enumerate(cases, 1):
            print(f"vocab-passes.py: [{i}/{len(cases)}] {case['name']}", file=sys.stderr, flush=True)
            p = predicted_passes(args.pipesim, case, args.set, folder)
            middle = range(1, 7)
            f = mean([p[(d, "F")] for d in middle])
            b = mean([p[(d, "B")] for d in middle])
            pairs = [("layers F", mean(case["forward_ms"][1:7]), f), ("layers B", mean(case["backward_ms"][1:7]), b)]
            if case["method"] == "baseline":
                pairs += [("head F", case["forward_ms"][7] - mean(case["forward_ms"][1:7]), p[(7, "F")] - f),
                          ("head B", case["backward_ms"][7] - mean(case["backward_ms"][1:7]), p[(7, "B")] - b),
                          ("embedding B", case["backward_ms"][0] - mean(case["backward_ms"][1:7]), p[(0, "B")] - b)]
            else:
                devices = range(8)
                pairs += [("S + T", mean(case["s_ms"]), mean([p[(d, "S")] + p[(d, "T")] for d in devices])),
                          ("IB", mean(case["input_backward_ms"]), mean([p[(d, "IB")] for d in devices]))]
            label = f"{case['method']} {case['vocab'] // 1000}k s{case['seq']}"
            for what, measured, predicted in pairs:
                error = predicted / measured - 1
                errors.setdefault(what, []).append(error)
                print(f"| {label} | {what} | {measured:.2f} | {predicted:.2f} | {error:+.1%} |")
    print()
    for what, values in errors.items():
        print(f"{what}: {len(values)} runs, mean signed error {statistics.mean(values):+.1%}, "
              f"from {min(values):+.1%} to {max(values):+.1%}")


if __name__ == "__main__":
    main()
