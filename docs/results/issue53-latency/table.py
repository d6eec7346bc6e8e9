"""Issue 53: the latency table of run.sh's outputs (one row per offered load and mode):
time to first decode and per-token latency, P50 / P90 / P99 in ms, tokens/s, requests refused."""
import json, os, re, sys

root = sys.argv[1]
rows = []
for name in os.listdir(root):
    m = re.fullmatch(r"rate([0-9.]+)-(\w+)", name)
    p = os.path.join(root, name, "run.json")
    if not m or not os.path.exists(p):
        continue
    for run in json.load(open(p)):
        lat, s = run["latency"], run["summary"]
        f, t = lat["first_decode"], lat["per_token"]
        rows.append((float(m.group(1)), run["mode"], f, t, s))
print("| offered load (req/s) | mode | first decode P50 / P90 / P99 (ms) | per token P50 / P90 / P99 (ms) | tokens/s | most running | finished |")
print("| --- | --- | --- | --- | --- | --- | --- |")
ms = lambda p: " / ".join(f"{1e3 * p[k]:.1f}" for k in ("p50", "p90", "p99"))
for rate, mode, f, t, s in sorted(rows, key=lambda r: (r[0], r[1] != "resident")):
    print(f"| {rate:g} | {mode} | {ms(f)} | {ms(t)} | {s['tokens_per_s']:.1f} | {s['max_running']} | {s['finished']} |")
