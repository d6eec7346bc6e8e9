"""Issue 53: latency against offered load, one line per mode, from run.sh's outputs (each
argument a folder of rate<R>-<mode>/run.json): time to first decode and per-token latency,
P50 (solid) and P99 (dashed), in seconds on log axes. Writes latency.svg into the folders' common
parent folder (the folder itself when one is given).
Needs matplotlib (not a dependency of the project: pip install matplotlib)."""
import json, os, re, sys

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt

points = {}  # (mode, metric, pct) -> [(rate, seconds)]
for root in sys.argv[1:]:
    for name in os.listdir(root):
        m = re.fullmatch(r"rate([0-9.]+)-(\w+)", name)
        p = os.path.join(root, name, "run.json")
        if not m or not os.path.exists(p):
            continue
        for run in json.load(open(p)):
            for metric in ("first_decode", "per_token"):
                for pct in ("p50", "p99"):
                    key = (run["mode"], metric, pct)
                    points.setdefault(key, []).append((float(m.group(1)), run["latency"][metric][pct]))
if not points:
    sys.exit("no rate<R>-<mode>/run.json under " + " ".join(sys.argv[1:]))
fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
colors = {"resident": "tab:blue", "hisparse": "tab:orange", "hybrid": "tab:green"}
titles = {"first_decode": "time to first decode", "per_token": "per-token latency"}
for ax, metric in zip(axes, ("first_decode", "per_token")):
    for (mode, met, pct), xy in sorted(points.items()):
        if met != metric:
            continue
        xy.sort()
        ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o", color=colors.get(mode, "gray"),
                linestyle="-" if pct == "p50" else "--", label=f"{mode} {pct.upper()}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("offered load (requests/s, Poisson)")
    ax.set_ylabel("seconds")
    ax.set_title(titles[metric])
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
fig.suptitle("GLM-5.1 emulation, 32k fp8, H200: the modes under load")
fig.tight_layout()
common = os.path.commonpath([os.path.abspath(a) for a in sys.argv[1:]])
out = os.path.join(common if len(sys.argv) > 2 else sys.argv[1], "latency.svg")
fig.savefig(out)
print(out)
