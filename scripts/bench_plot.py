#!/usr/bin/env python3
# lanebus — MIT License.
# Plot the key=value lines of the bench drivers (scripts/bench_report.sh):
#   bench_plot.py RESULTS.txt OUTDIR
# writes OUTDIR/bench_throughput_ratios.png (lanebus / baseline per case),
# bench_latency.png (p50 / p99 / p99.9 per path) and bench_durable_batch.png
# (Sync durable throughput and latency against the group-commit batch).
import re
import shlex
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def parse(path):
    header, rows = [], []
    for line in open(path, encoding="utf-8"):
        line = line.strip()
        if line.startswith("# "):
            header.append(line[2:])
        if not line.startswith("bench="):
            continue
        kv = {}
        for tok in shlex.split(line):
            if "=" in tok:
                k, v = tok.split("=", 1)
                kv[k] = v
        rows.append(kv)
    return header, rows


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def subtitle(header):
    return header[0].replace("lanebus benchmark report: ", "") if header else ""


def throughput_ratios(rows):
    """(label, ratio) for every throughput comparison (higher = lanebus faster)."""
    out = []
    for r in rows:
        if "ratio" not in r or "case" not in r:
            continue
        case, bench = r["case"], r["bench"]
        if case in ("latency1to1", "e2e_latency_queue", "batch_sweep"):
            continue  # paced latency runs and the sweep have their own plots
        if "baseline" in r:
            base = r["baseline"]
        else:  # durable's median lines: "msg_per_s=.. BASE=.. BASE_spread=.."
            base = next((k[: -len("_spread")] for k in r if k.endswith("_spread") and k != "msg_per_s_spread"), "?")
        # bench/inproc's interleaved cases give the median of their rounds' own
        # ratios too: less exposed to the VM's placement changes than the
        # ratio of the two medians, so it is the one plotted where present.
        ratio = num(r.get("pair_ratio_median") or r["ratio"])
        if ratio:
            out.append((f"{bench}: {case} vs {base}", ratio))
    return out


def plot_ratios(rows, header, path):
    data = throughput_ratios(rows)
    if not data:
        return False
    fig, ax = plt.subplots(figsize=(10, 0.42 * len(data) + 1.6))
    labels = [d[0] for d in data][::-1]
    values = [d[1] for d in data][::-1]
    colors = ["#2e7d32" if v >= 1 else "#c62828" for v in values]
    ax.barh(labels, values, color=colors)
    ax.axvline(1.0, color="#333", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("throughput ratio lanebus / baseline (log scale; > 1 = lanebus faster)")
    for y, v in enumerate(values):
        ax.text(v * (1.04 if v >= 1 else 0.96), y, f"{v:.2f}x", va="center", ha="left" if v >= 1 else "right", fontsize=8)
    lo, hi = min(values + [1]), max(values + [1])
    ax.set_xlim(lo / 2, hi * 2.5)
    ax.set_title(f"lanebus against each baseline, same work, same process\n{subtitle(header)}", fontsize=10)
    ax.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def latency_series(rows):
    """name -> {p50, p99, p99.9} in microseconds."""
    s = {}
    for r in rows:
        case = r.get("case")
        if r.get("bench") == "inproc" and case == "latency1to1":
            for who, key in (("lanebus", "in-process: lanebus 1->1"), ("baseline", "in-process: raw moodycamel")):
                s[key] = {q: num(r.get(f"{who}_{f}_ns")) / 1e3 for q, f in (("p50", "p50"), ("p99", "p99"), ("p99.9", "p999"))
                          if num(r.get(f"{who}_{f}_ns")) is not None}
        elif r.get("bench") == "durable" and case == "e2e_latency_queue":
            s["durable queue: publish -> handler (Sync)"] = {
                "p50": num(r.get("p50_us")), "p99": num(r.get("p99_us")), "p99.9": num(r.get("p999_us"))}
            s["raw LMDB: one fsynced commit"] = {
                "p50": num(r.get("lmdb_commit_p50_us")), "p99": num(r.get("lmdb_commit_p99_us")),
                "p99.9": num(r.get("lmdb_commit_p999_us"))}
        elif r.get("bench") == "durable" and case in ("sync_1p", "sync_4p") and "lanebus_p50_ns" in r \
                and f"durable publish {case}" not in s:
            s[f"durable publish: {case} (Sync, to fsync)"] = {
                q: num(r.get(f"lanebus_{f}_ns")) / 1e3 for q, f in (("p50", "p50"), ("p99", "p99"), ("p99.9", "p999"))
                if num(r.get(f"lanebus_{f}_ns")) is not None}
    return {k: v for k, v in s.items() if v and all(x is not None for x in v.values())}


def plot_latency(rows, header, path):
    s = latency_series(rows)
    if not s:
        return False
    qs = ["p50", "p99", "p99.9"]
    names = list(s)
    fig, ax = plt.subplots(figsize=(10, 4.8))
    width = 0.8 / len(qs)
    shades = ["#90caf9", "#1e88e5", "#0d47a1"]
    for i, q in enumerate(qs):
        xs = [n + (i - 1) * width for n in range(len(names))]
        vals = [s[name].get(q, 0) for name in names]
        bars = ax.bar(xs, vals, width, label=q, color=shades[i])
        for b, v in zip(bars, vals):
            label = f"{v:.0f}" if v >= 10 else f"{v:.1f}"
            ax.text(b.get_x() + b.get_width() / 2, v * 1.08, label, ha="center", va="bottom", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("latency, microseconds (log scale)")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([re.sub(r": ", ":\n", n) for n in names], fontsize=8)
    ax.legend(title="percentile", fontsize=8)
    top = max(v for d in s.values() for v in d.values())
    ax.set_ylim(top=top * 6)
    ax.set_title(f"Latency distribution (percentiles of each run's samples)\n{subtitle(header)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_batch(rows, header, path):
    sweep = [r for r in rows if r.get("case") == "batch_sweep"]
    if not sweep:
        return False
    batch = [num(r["lanebus_avg_batch"]) for r in sweep]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.4))
    ax.plot(batch, [num(r["lanebus_msgs_per_sec"]) for r in sweep], "o-", color="#1e88e5", label="lanebus Sync publish (4 producers)")
    ax.plot(batch, [num(r["baseline_msgs_per_sec"]) for r in sweep], "s--", color="#757575",
            label="raw LMDB, same batch per fsynced commit")
    for r, b in zip(sweep, batch):
        ax.annotate(f"window {r['window']}", (b, num(r["lanebus_msgs_per_sec"])), textcoords="offset points",
                    xytext=(4, -12), fontsize=7, color="#1e88e5")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("messages per commit (group-commit batch, log)")
    ax.set_ylabel("durable messages / second (log)")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title("Durable throughput against batch size", fontsize=10)
    ax2.plot(batch, [num(r["lanebus_p50_ns"]) / 1e3 for r in sweep], "o-", color="#90caf9", label="p50")
    ax2.plot(batch, [num(r["lanebus_p99_ns"]) / 1e3 for r in sweep], "o-", color="#0d47a1", label="p99")
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel("messages per commit (log)")
    ax2.set_ylabel("publish -> fsynced, microseconds (log)")
    ax2.legend(fontsize=8)
    ax2.grid(True, which="both", alpha=0.3)
    ax2.set_title("Publish latency at that batch", fontsize=10)
    fig.suptitle(subtitle(header), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: bench_plot.py RESULTS.txt OUTDIR")
    header, rows = parse(sys.argv[1])
    out = sys.argv[2].rstrip("/")
    made = []
    for fn, name in ((plot_ratios, "bench_throughput_ratios.png"), (plot_latency, "bench_latency.png"),
                     (plot_batch, "bench_durable_batch.png")):
        if fn(rows, header, f"{out}/{name}"):
            made.append(f"{out}/{name}")
    if not made:
        sys.exit(f"{sys.argv[1]}: no benchmark lines to plot")
    print("\n".join(made))


if __name__ == "__main__":
    main()
