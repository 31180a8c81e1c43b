#!/usr/bin/env python3
"""Speed-up of speculative decoding against the per-token acceptance rate,
from measured verify-pass costs, as an SVG (no dependencies):
bench/plot_spec.py DATA.json OUT.svg

DATA.json: {"title": str, "step_ms": float, "verify_ms": {"k": ms, ...}}
(`redlite bench model --verify-k` numbers). A pass of k drafts, each kept
with probability a while the previous ones were, emits on average
(1 - a^(k+1)) / (1 - a) tokens; the speed-up is that times step / verify(k).
"""
import json
import sys

COLORS = ["#c0392b", "#2471a3", "#7d3c98", "#239b56", "#b7950b"]


def tokens_per_pass(a: float, k: int) -> float:
    return k + 1.0 if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


def main() -> None:
    data = json.load(open(sys.argv[1]))
    step = data["step_ms"]
    curves = []
    for k, ms in sorted(data["verify_ms"].items(), key=lambda kv: int(kv[0])):
        k = int(k)
        pts = [(i / 100, tokens_per_pass(i / 100, k) * step / ms) for i in range(101)]
        curves.append((k, pts))
    ymax = max(1.2, max(y for _, p in curves for _, y in p) * 1.1)
    w, h, left, right, top, bottom = 640, 400, 60, 150, 40, 50
    pw, ph = w - left - right, h - top - bottom

    def px(x: float) -> float:
        return left + x * pw

    def py(y: float) -> float:
        return top + ph - y / ymax * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{left}" y="20" font-size="13">{data["title"]}</text>',
           f'<line x1="{left}" y1="{py(1)}" x2="{left + pw}" y2="{py(1)}" stroke="#888" stroke-dasharray="4 3"/>',
           f'<text x="{left + pw + 4}" y="{py(1) + 4}" fill="#888">plain</text>']
    for i in range(6):
        x = i / 5
        out.append(f'<line x1="{px(x)}" y1="{top + ph}" x2="{px(x)}" y2="{top + ph + 4}" stroke="black"/>')
        out.append(f'<text x="{px(x)}" y="{top + ph + 18}" text-anchor="middle">{x:.1f}</text>')
    yt = 0.0
    while yt <= ymax:
        out.append(f'<text x="{left - 6}" y="{py(yt) + 4}" text-anchor="end">{yt:.1f}x</text>')
        yt += 0.5 if ymax < 4 else 1.0
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="black"/>')
    out.append(f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="black"/>')
    out.append(f'<text x="{left + pw / 2}" y="{h - 8}" text-anchor="middle">per-token acceptance rate a</text>')
    for i, (k, pts) in enumerate(curves):
        c = COLORS[i % len(COLORS)]
        d = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        out.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="2"/>')
        out.append(f'<text x="{left + pw + 4}" y="{py(pts[-1][1]) + 4}" fill="{c}">k = {k}</text>')
    out.append("</svg>")
    open(sys.argv[2], "w").write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
