#!/usr/bin/env python3
"""Plot prompt tok/s against prompt length for several engines as an SVG
(no dependencies): bench/plot_prefill.py DATA.json OUT.svg

DATA.json: {"title": str, "series": [{"name": str, "points": [[n, tok_s], ...]}]}
The x axis is logarithmic (prompt lengths are powers of two).
"""
import json
import math
import sys

COLORS = ["#c0392b", "#2471a3", "#7d3c98", "#239b56", "#b7950b"]


def main() -> None:
    data = json.load(open(sys.argv[1]))
    series = data["series"]
    xs = sorted({p[0] for s in series for p in s["points"]})
    ymax = max(p[1] for s in series for p in s["points"]) * 1.1
    w, h, left, right, top, bottom = 640, 400, 70, 180, 40, 50
    pw, ph = w - left - right, h - top - bottom
    lx0, lx1 = math.log2(xs[0]), math.log2(xs[-1])

    def px(x: float) -> float:
        return left + (math.log2(x) - lx0) / max(lx1 - lx0, 1e-9) * pw

    def py(y: float) -> float:
        return top + ph - y / ymax * ph

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<text x="{left}" y="22" font-size="14">{data["title"]}</text>',
        f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="black"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="black"/>',
        f'<text x="{left + pw / 2}" y="{h - 12}" text-anchor="middle">prompt tokens</text>',
        f'<text x="16" y="{top + ph / 2}" transform="rotate(-90 16 {top + ph / 2})" text-anchor="middle">tok/s</text>',
    ]
    for x in xs:
        out.append(f'<text x="{px(x)}" y="{top + ph + 18}" text-anchor="middle">{x}</text>')
    step = 10 ** math.floor(math.log10(ymax / 4))
    step *= 2 if ymax / step > 8 else 1
    y = 0.0
    while y <= ymax:
        out.append(f'<line x1="{left - 4}" y1="{py(y)}" x2="{left + pw}" y2="{py(y)}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 8}" y="{py(y) + 4}" text-anchor="end">{int(y)}</text>')
        y += step
    for i, s in enumerate(series):
        c = COLORS[i % len(COLORS)]
        pts = sorted(s["points"])
        path = " ".join(f"{px(x):.1f},{py(v):.1f}" for x, v in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"/>')
        for x, v in pts:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(v):.1f}" r="3" fill="{c}"/>')
        ly = top + 16 + 18 * i
        out.append(f'<line x1="{left + pw + 12}" y1="{ly}" x2="{left + pw + 32}" y2="{ly}" stroke="{c}" stroke-width="2"/>')
        out.append(f'<text x="{left + pw + 38}" y="{ly + 4}">{s["name"]}</text>')
    out.append("</svg>")
    with open(sys.argv[2], "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
