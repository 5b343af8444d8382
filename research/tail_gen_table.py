"""Tables of the generated-world studies (``research.tail_gen_study``): error by family × S.

PYTHONPATH=. python -m research.tail_gen_table /tmp/tailgen/held_out.pt
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch


def errors(rows: list[dict], name: str) -> list[tuple[dict, float]]:
    return [(r, r["map"][name] - r["truth"]) for r in rows if name in r["map"]]


def summary(errs: list[float]) -> str:
    t = torch.tensor(errs, dtype=torch.float64)
    worst = float(t[t.abs().argmax()])
    return f"{float(t.abs().mean()):.4f}  {float(t.mean()):+.4f}  {worst:+.3f}  ({len(errs)})"


def table(rows: list[dict], names: list[str], by: str = "family") -> str:
    lines = [f"{'estimator':<18}{'group':<16}{'S':>6}   mean|err|  bias     worst   (n)"]
    for name in names:
        errs = errors(rows, name)
        groups: dict[tuple, list[float]] = defaultdict(list)
        for r, e in errs:
            g = r[by] if by != "all" else "all"
            for key in {(g, r["S"]), (g, 0), ("all", r["S"]), ("all", 0)}:
                groups[key].append(e)
        for (g, s), es in sorted(groups.items(), key=lambda kv: (kv[0][0] != "all", kv[0])):
            if by == "all" and g != "all":
                continue
            size = "all" if s == 0 else f"{s // 1000}k"
            lines.append(f"{name:<18}{g:<16}{size:>6}   {summary(es)}")
        secs = [r["seconds"][name] for r, _ in errs]
        lines.append(
            f"{name:<18}{'time / world':<16}{'':>6}   {sum(secs) / max(len(secs), 1):.2f} s"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="+")
    p.add_argument("--by", default="family", choices=("family", "all"))
    p.add_argument("--candidates", default=None)
    args = p.parse_args(argv)
    rows = [r for path in args.paths for r in torch.load(path, weights_only=False)]
    names = args.candidates.split(",") if args.candidates else list(rows[0]["map"])
    print(table(rows, names, args.by))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
