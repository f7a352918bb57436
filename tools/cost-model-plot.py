#!/usr/bin/env python3
"""Predicted against measured op times, as an SVG scatter on log axes, from `pipesim calibrate` output.

Usage: build/tools/pipesim calibrate docs/data/h100-torch-ops.json | tools/cost-model-plot.py OUT.svg [--column preset_ms]

Each op is a dot at (measured, predicted), coloured by its kind (layer F, B, W; head F, B, W; embedding
F, W); the diagonal is a perfect prediction and the band around it ±10%. --column picks which of
calibrate's predictions to plot: preset_ms (the preset as it ships, the default) or fitted_ms.
"""
import argparse
import math
import re
import sys

COLOURS = {"layer F": "#1f77b4", "layer B": "#ff7f0e", "layer W": "#2ca02c", "head F": "#d62728",
           "head B": "#9467bd", "head W": "#8c564b", "embedding F": "#e377c2", "embedding W": "#7f7f7f"}


def read_rows(lines, column):
    header, rows = None, []
    for line in lines:
        fields = line.split()
        if fields[:1] == ["op"] and "measured_ms" in fields:
            header = fields
            continue
        if header is None or len(fields) < len(header):
            continue
        numbers = fields[-(len(header) - 1):]
        try:
            values = dict(zip(header[1:], map(float, numbers)))
        except ValueError:
            continue
        label = " ".join(fields[:len(fields) - len(numbers)])
        match = re.match(r"(layer|head|embedding) .* ([FBW])$", label)
        kind = f"{match.group(1)} {match.group(2)}" if match else "other"
        rows.append((kind, values["measured_ms"], values[column]))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("output")
    ap.add_argument("--column", default="preset_ms", choices=["preset_ms", "fitted_ms"])
    ap.add_argument("--title", default="pipesim's prediction against measured op times")
    args = ap.parse_args()
    rows = read_rows(sys.stdin, args.column)
    if not rows:
        sys.exit("cost-model-plot: no op rows in the input (pipe `pipesim calibrate FILE` into it)")
    low = min(min(m, p) for _, m, p in rows) / 1.5
    high = max(max(m, p) for _, m, p in rows) * 1.5
    size, margin = 560, 70
    lo, hi = math.log10(low), math.log10(high)

    def x(v):
        return margin + (math.log10(v) - lo) / (hi - lo) * size

    def y(v):
        return margin + size - (math.log10(v) - lo) / (hi - lo) * size

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{size + 2 * margin + 150}" height="{size + 2 * margin}" '
           'font-family="sans-serif" font-size="12">',
           f'<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{margin}" y="{margin - 30}" font-size="14">{args.title}</text>']
    band = [(low, low * 1.1), (high, high * 1.1), (high, high / 1.1), (low, low / 1.1)]
    out.append('<polygon fill="#eeeeee" points="' + " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in band) + '"/>')
    out.append(f'<line x1="{x(low):.1f}" y1="{y(low):.1f}" x2="{x(high):.1f}" y2="{y(high):.1f}" stroke="#888"/>')
    for decade in range(math.floor(lo), math.ceil(hi) + 1):
        for mantissa in (1, 2, 5):
            v = mantissa * 10 ** decade
            if low <= v <= high:
                out.append(f'<line x1="{x(v):.1f}" y1="{margin + size}" x2="{x(v):.1f}" y2="{margin + size + 5}" stroke="black"/>')
                out.append(f'<text x="{x(v):.1f}" y="{margin + size + 18}" text-anchor="middle">{v:g}</text>')
                out.append(f'<line x1="{margin - 5}" y1="{y(v):.1f}" x2="{margin}" y2="{y(v):.1f}" stroke="black"/>')
                out.append(f'<text x="{margin - 8}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
    out.append(f'<rect x="{margin}" y="{margin}" width="{size}" height="{size}" fill="none" stroke="black"/>')
    out.append(f'<text x="{margin + size / 2}" y="{margin + size + 40}" text-anchor="middle">measured ms</text>')
    out.append(f'<text transform="translate({margin - 50},{margin + size / 2}) rotate(-90)" text-anchor="middle">'
               f'predicted ms ({args.column.replace("_ms", "")})</text>')
    for kind, measured, predicted in rows:
        colour = COLOURS.get(kind, "black")
        out.append(f'<circle cx="{x(measured):.1f}" cy="{y(predicted):.1f}" r="3" fill="{colour}" fill-opacity="0.7"/>')
    legend_y = margin
    for kind, colour in COLOURS.items():
        errors = [abs(p / m - 1) for k, m, p in rows if k == kind]
        if not errors:
            continue
        mean = 100 * sum(errors) / len(errors)
        out.append(f'<circle cx="{margin + size + 20}" cy="{legend_y}" r="4" fill="{colour}"/>')
        out.append(f'<text x="{margin + size + 30}" y="{legend_y + 4}">{kind} ({mean:.1f}%)</text>')
        legend_y += 18
    out.append(f'<text x="{margin + size + 14}" y="{legend_y + 10}" fill="#666">grey band: ±10%</text>')
    out.append("</svg>")
    with open(args.output, "w") as fh:
        fh.write("\n".join(out) + "\n")
    print(f"cost-model-plot: {len(rows)} ops written to {args.output}")


if __name__ == "__main__":
    main()
