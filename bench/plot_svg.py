#!/usr/bin/env python3
"""Draws the CUDA benchmark JSON as an SVG bar chart (no plotting library needed).

Usage: plot_svg.py cuda_bench.json out.svg
Bars: sparse attention TFLOPS per shape against the GEMM ceiling of the same run.
"""
import json
import sys


def main() -> None:
    report = json.load(open(sys.argv[1]))
    gemm = report["ceilings"]["gemm_bf16_tflops"]
    rows = [(f"H{c['heads']} k{c['topk']} {c['keys'] // 1024}K", c["tflops"])
            for c in report.get("sparse_attention", [])]
    width, bar_h, left = 720, 26, 150
    height = 60 + bar_h * len(rows)
    scale = (width - left - 80) / max(gemm, 1.0)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           'font-family="sans-serif" font-size="12">',
           f'<text x="10" y="20" font-size="14">csattn sparse attention forward, '
           f'{report.get("device", "")} (bf16 GEMM ceiling {gemm:.0f} TFLOPS)</text>']
    for i, (name, tf) in enumerate(rows):
        y = 40 + i * bar_h
        out.append(f'<text x="10" y="{y + 16}">{name}</text>')
        out.append(f'<rect x="{left}" y="{y + 4}" width="{tf * scale:.1f}" height="{bar_h - 8}" '
                   'fill="#4878cf"/>')
        out.append(f'<text x="{left + tf * scale + 6:.1f}" y="{y + 16}">{tf:.1f} TFLOPS '
                   f'({tf / gemm:.1%})</text>')
    gx = left + gemm * scale
    out.append(f'<line x1="{gx:.1f}" y1="30" x2="{gx:.1f}" y2="{height - 10}" stroke="#c44" '
               'stroke-dasharray="4,3"/>')
    out.append("</svg>")
    open(sys.argv[2], "w").write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
