"""What the comparison scripts (published-runs.py, vocab-paper.py, fit-fp8.py) share: a simulation's
result, and the summary line they print."""
import json
import subprocess


def simulate(pipesim, config, sets, fail):
    """`pipesim simulate CONFIG --set ... --format json`, parsed; `fail` takes the message when it fails."""
    command = [pipesim, "simulate", str(config), "--format", "json"]
    for item in sets:
        command += ["--set", item]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        fail(f"{' '.join(command)} failed:\n{done.stderr.strip()}")
    return json.loads(done.stdout)


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
