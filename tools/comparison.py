"""What the comparison scripts (published-runs.py, vocab-paper.py, vocab-passes.py, fit-fp8.py) share:
their --pipesim and --set options, a simulation's result (or a sweep's), a --grid's values, and the
summary line they print."""
import argparse
import json
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent


def pipesim_parser(description):
    """An argument parser with the --pipesim option every script takes (the README's build by default)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--pipesim", default=str(ROOT / "build" / "tools" / "pipesim"))
    return parser


def add_set_option(parser):
    """The --set option of the scripts that pass overrides on to every config they simulate."""
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field of every config (pipesim's --set; repeatable)")


def set_options(sets):
    """pipesim's command-line options for the overrides `sets` ("key.path=value" each)."""
    return [option for item in sets for option in ("--set", item)]


def require_pipesim(path, fail):
    """`fail` with the fix unless `path` is a file (a build not there yet)."""
    if not pathlib.Path(path).is_file():
        fail(f"{path} is not a pipesim executable; build it (README) or give --pipesim PATH")


def simulate(pipesim, config, sets, fail, grid=None):
    """`pipesim simulate CONFIG --set ... --format json`, parsed; `fail` takes the message when it fails.
    With `grid` ("key=v1,v2,..."), `pipesim sweep` over it instead: a list of points."""
    command = [pipesim, "simulate" if grid is None else "sweep", str(config), "--format", "json"]
    if grid is not None:
        command += ["--grid", grid]
    command += set_options(sets)
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        fail(f"{' '.join(command)} failed:\n{done.stderr.strip()}")
    return json.loads(done.stdout)


def grid_values(spec):
    """The values a --grid option names: LOW:HIGH:STEP (LOW and HIGH included), or several of them
    joined by commas."""
    values = []
    for part in spec.split(","):
        low, high, step = (float(x) for x in part.split(":"))
        values += [round(low + i * step, 6) for i in range(int(round((high - low) / step)) + 1)]
    return sorted(set(values))


def summarize(label, errors, noun="runs"):
    """One line: how many, mean |error|, the worst, and the mean signed error (the bias). `errors` are
    dicts with "error" (predicted / published - 1) and "name"; nothing is printed for none."""
    if not errors:
        return
    mean = sum(abs(e["error"]) for e in errors) / len(errors)
    signed = sum(e["error"] for e in errors) / len(errors)
    worst = max(errors, key=lambda e: abs(e["error"]))
    print(f"{label}: {len(errors)} {noun}, mean |error| {mean:.1%}, worst {worst['error']:+.1%} ({worst['name']}), "
          f"mean signed {signed:+.1%}")
