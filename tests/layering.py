#!/usr/bin/env python3
"""Fails when a library includes a header from a layer above its own (docs/architecture.md).

Each folder below is one layer; a file may include headers of its own folder and of the layers
listed as below it. A quoted include is resolved as the compiler would: next to the file, then in
the folders of the project. Headers that are not the project's (<...>, or not found) are not
checked.

usage: layering.py SOURCE_ROOT
"""
import pathlib
import re
import sys

# layer: (its folders, the layers it may use). The order is the build's, bottom up.
LAYERS = {
    "core": (["src"], []),
    "schedules": (["schedules"], ["core"]),
    "sim": (["sim"], ["core"]),
    "plan": (["plan"], ["schedules", "sim", "core"]),
    "runtime-base": (["runtime/base"], []),
    "runtime-cpu": (["runtime/cpu"], ["runtime-base"]),
    "runtime": (["runtime", "runtime/cuda", "runtime/mpi"], ["runtime-cpu", "runtime-base", "core"]),
    "gpu-bench": (["runtime/cuda/bench"], ["runtime", "runtime-cpu", "runtime-base", "core"]),
    "formats": (["tools/formats"], ["plan", "schedules", "sim", "core"]),
    "simulate": (["tools/simulate"], ["formats", "plan", "schedules", "sim", "core"]),
    "tune": (["tools/tune"], ["simulate", "formats", "plan", "schedules", "sim", "core"]),
    "calibrate": (["tools/calibrate"], ["formats", "plan", "schedules", "sim", "core"]),
    "jobs": (["tools/jobs"], ["formats", "plan", "schedules", "sim", "runtime", "runtime-cpu", "runtime-base",
                              "core"]),
    "cli": (["tools/cli"], ["jobs", "tune", "calibrate", "simulate", "formats", "plan", "schedules", "sim", "runtime",
                            "runtime-cpu", "runtime-base", "core"]),
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
SOURCES = ("*.h", "*.cuh", "*.cpp", "*.cu")


def layer_of(folder, root):
    """The layer a folder belongs to: the longest matching folder wins (runtime/cuda/bench)."""
    best = None
    for name, (folders, _) in LAYERS.items():
        for f in folders:
            if folder == root / f and (best is None or len(f) > len(best[1])):
                best = (name, f)
    return best[0] if best else None


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    folders = {name: [root / f for f in fs] for name, (fs, _) in LAYERS.items()}
    violations, checked = [], 0
    for name, (_, below) in LAYERS.items():
        allowed = {name, *below}
        for folder in folders[name]:
            for pattern in SOURCES:
                for source in sorted(folder.glob(pattern)):
                    if layer_of(source.parent, root) != name:
                        continue
                    for header in INCLUDE.findall(source.read_text(errors="replace")):
                        checked += 1
                        if (source.parent / header).is_file():
                            continue  # next to the file
                        owners = {other for other, fs in folders.items() for f in fs if (f / header).is_file()}
                        if owners and not owners & allowed:
                            violations.append(f"{source.relative_to(root)}: includes \"{header}\" of layer "
                                              f"{'/'.join(sorted(owners))}, above layer {name} (which may use: "
                                              f"{', '.join(sorted(below)) or 'nothing else'})")
    for v in violations:
        print(v)
    print(f"layering: {checked} includes checked, {len(violations)} from a layer above")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
