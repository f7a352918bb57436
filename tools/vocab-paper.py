#!/usr/bin/env python3
"""Predicted against measured, for every row of the Vocabulary Parallelism paper's Tables 5 and 6.

docs/data/vocab-paper.json holds the paper's MFU and peak memory per setup x sequence length x
vocabulary x method (Yeung et al., MLSys 2025, arXiv:2411.05288, Appendix F). For each setup, sequence
length and vocabulary this runs `pipesim compare configs/paper/SETUP-seqSEQ.json --schedules SCHED
--vocab baseline,... --set model.vocab=V --format json` and prints a Markdown table, a row per paper row:
the measured MFU (the paper's) and pipesim's; the throughput ratio against the same setup's
baseline, the paper's (its MFU over the baseline's: both count the same FLOPs) and pipesim's (tokens/s over the baseline's),
and the ratio error (predicted ratio / paper ratio - 1); the paper's peak memory, pipesim's, and the
memory error (predicted / paper - 1). The ratio is the comparison that matters: pipesim's absolute
MFU rests on the configs' kernel efficiencies, the ratio on where the pipeline stalls.

Memory: the paper labels its peak memory 'GB', but the figures are GiB. Megatron-LM's report_memory
prints torch.cuda.max_memory_reserved() / 2^20 as 'memory (MB)', and the authors' artifact scripts
divide that by 1024 and print it as 'Peak Memory (GB)'. pipesim's peak_memory_bytes is divided by 2^30,
so both sides are GiB and no conversion is made. The artifact reads the caching allocator's 'max
reserved' (Figure 14's caption says 'maximum allocated'; the tables do not say which); pipesim counts
tensors only (hardware.reserved_gib is left out of the peak), so a reserved figure would sit a few
per cent above a perfect prediction.

Rows the paper marks '-' (out of memory) show 'OOM' and whether pipesim says the config fits; they, the
baseline rows' ratios (1 by definition) and rows whose baseline ran out of memory are left out of the
error summaries. After the table: mean |error|, worst and mean signed error of the throughput ratio
(non-baseline rows) and of peak memory (all rows with a figure), over all rows, per method and per
schedule. Progress goes to stderr.

A row may carry "set": pipesim --set options for that row alone (the authors' layer split for a
redistribute row); it is simulated beside the baseline in a compare of its own.

--data docs/data/vocab-artifact.json compares the authors' artifact run of the 8-GPU setups instead
(their code in the container the artifact names, schedule timers off; the file says what differs).

usage: tools/vocab-paper.py [--pipesim PATH] [--data FILE] [--only TEXT] [--set KEY=VALUE ...]
  --data FILE  the measured rows (default docs/data/vocab-paper.json)
  --only TEXT  only the rows whose name ('1f1b-8gpu-seq2048 256k vocab-1') contains TEXT
  --set K=V    override a field of every config, as pipesim's --set (repeatable)
"""
import json
import pathlib
import subprocess
import sys

from comparison import add_set_option, pipesim_parser, require_pipesim, set_options, summarize


ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "data" / "vocab-paper.json"
METHODS = ["baseline", "redistribute", "vocab-1", "vocab-2", "interlaced"]


def fail(message):
    print(f"vocab-paper.py: {message}", file=sys.stderr)
    sys.exit(1)


def name_of(row):
    return f"{row['setup']}-seq{row['seq']} {row['vocab'] // 1000}k {row['method']}"


def schedule_of(setup):
    return "v-half" if setup.startswith("v-half") else "1f1b"


def compare(pipesim, setup, seq, vocab, methods, sets=()):
    """pipesim's results for one setup, sequence and vocabulary, by method."""
    config = ROOT / "configs" / "paper" / f"{setup}-seq{seq}.json"
    if not config.is_file():
        fail(f"{DATA}: setup '{setup}' at sequence {seq} has no config {config.relative_to(ROOT)}")
    command = [pipesim, "compare", str(config), "--schedules", schedule_of(setup), "--vocab", ",".join(methods),
               "--set", f"model.vocab={vocab}", *set_options(sets), "--format", "json"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        fail(f"{' '.join(command)} failed:\n{done.stderr.strip()}")
    results = {result["vocab"]: result for result in json.loads(done.stdout)}
    missing = [method for method in methods if method not in results]
    if missing:
        fail(f"{' '.join(command)} gave no result for {', '.join(missing)}")
    return results


def cell(value, form):
    return "–" if value is None else format(value, form)


def main():
    parser = pipesim_parser(__doc__.splitlines()[0])
    parser.add_argument("--data", type=pathlib.Path, default=DATA, help="the measured rows (default %(default)s)")
    parser.add_argument("--only", default="", help="only the rows whose name contains this text")
    add_set_option(parser)
    args = parser.parse_args()
    require_pipesim(args.pipesim, fail)
    if not args.data.is_file():
        fail(f"{args.data}: no such file (the paper's rows are docs/data/vocab-paper.json, the artifact run's "
             "docs/data/vocab-artifact.json)")
    try:
        data = json.loads(args.data.read_text())
    except (OSError, json.JSONDecodeError) as error:
        fail(f"{args.data}: {error}")
    for row in data["rows"]:
        if row["method"] not in METHODS:
            fail(f"{args.data}: row '{name_of(row)}': unknown method (one of {', '.join(METHODS)})")
        if row["method"] == "baseline" and row.get("set"):
            fail(f"{args.data}: row '{name_of(row)}': a baseline row takes no set (every ratio is against the config as it is)")
    rows = [row for row in data["rows"] if args.only in name_of(row)]
    if not rows:
        fail(f"no row in {args.data} has '{args.only}' in its name")
    # The measured baseline of each setup, sequence and vocabulary: every ratio is against it.
    baselines = {(r["setup"], r["seq"], r["vocab"]): r for r in data["rows"] if r["method"] == "baseline"}
    groups = list(dict.fromkeys((r["setup"], r["seq"], r["vocab"]) for r in rows))

    print("| setup | seq | vocab | method | measured MFU % | predicted MFU % | measured ratio | predicted ratio | ratio error "
          "| measured GiB | predicted GiB | memory error | pipesim fits |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    ratio_errors, memory_errors, mfu_errors, oom = [], [], [], []
    for i, key in enumerate(groups, 1):
        setup, seq, vocab = key
        mine = [r for r in rows if (r["setup"], r["seq"], r["vocab"]) == key]
        plain = [m for m in METHODS[1:] if any(r["method"] == m and not r.get("set") for r in mine)]
        print(f"vocab-paper.py: [{i}/{len(groups)}] {setup}-seq{seq} {vocab // 1000}k", file=sys.stderr, flush=True)
        results = compare(args.pipesim, setup, seq, vocab, ["baseline"] + plain, args.set)
        for row in mine:
            if row.get("set"):
                own = compare(args.pipesim, setup, seq, vocab, [row["method"]], [*args.set, *row["set"]])
                results[row["method"]] = own[row["method"]]
        base = baselines.get(key)
        for row in sorted(mine, key=lambda r: METHODS.index(r["method"])):
            result = results[row["method"]]
            label = {"name": name_of(row), "method": row["method"], "schedule": schedule_of(setup)}
            predicted_mfu = result["mfu"] * 100
            predicted_ratio = result["tokens_per_s"] / results["baseline"]["tokens_per_s"]
            predicted_gib = result["peak_memory_bytes"] / 2**30
            fits = "yes" if result["fits_in_memory"] else "no"
            measured_mfu, measured_gib = row["mfu_pct"], row["peak_memory_gb"]
            if measured_mfu is None:
                oom.append({**label, "fits": result["fits_in_memory"]})
                print(f"| {setup} | {seq} | {vocab // 1000}k | {row['method']} | OOM | {predicted_mfu:.2f} | – "
                      f"| {predicted_ratio:.3f} | – | OOM | {predicted_gib:.2f} | – | {fits} |")
                continue
            measured_ratio = None
            if base is not None and base["mfu_pct"] is not None:
                measured_ratio = measured_mfu / base["mfu_pct"]
            ratio_error = None
            if measured_ratio is not None and row["method"] != "baseline":
                ratio_error = predicted_ratio / measured_ratio - 1
                ratio_errors.append({**label, "error": ratio_error})
            memory_error = predicted_gib / measured_gib - 1
            memory_errors.append({**label, "error": memory_error})
            mfu_errors.append({**label, "error": predicted_mfu / measured_mfu - 1})
            print(f"| {setup} | {seq} | {vocab // 1000}k | {row['method']} | {measured_mfu:.2f} | {predicted_mfu:.2f} "
                  f"| {cell(measured_ratio, '.3f')} | {predicted_ratio:.3f} | {cell(ratio_error, '+.1%')} "
                  f"| {measured_gib:.2f} | {predicted_gib:.2f} | {memory_error:+.1%} | {fits} |")
    print()
    for what, errors, methods in (("throughput ratio", ratio_errors, METHODS[1:]),
                                  ("peak memory", memory_errors, METHODS)):
        summarize(f"{what}, all methods", errors, "rows")
        for method in methods:
            summarize(f"{what}, {method}", [e for e in errors if e["method"] == method], "rows")
        for schedule in ("1f1b", "v-half"):
            summarize(f"{what}, {schedule}", [e for e in errors if e["schedule"] == schedule], "rows")
    summarize("MFU (absolute), all rows", mfu_errors, "rows")
    if oom:
        fitting = [o["name"] for o in oom if o["fits"]]
        print(f"out of memory in the paper: {len(oom)} rows; pipesim predicts {len(oom) - len(fitting)} of them do not fit"
              + (f", {len(fitting)} fit ({', '.join(fitting)})" if fitting else ""))


if __name__ == "__main__":
    main()
