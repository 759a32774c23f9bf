"""The soak test's report (bench/soak.py): which kills explain which failed requests, the RSS
plot and the markdown results section. Split out of soak.py to keep each file short; soak.py
imports it and passes what it measured."""
import os


def cpu_line(info):
    return f"{info['model_name']} ({info['vendor']} family {info['family']} model {info['model']}, {info['nproc']} CPUs)"


def classify_failure(t0, t1, kills, slack=2.0):
    """in_flight_at_kill: the request started before a kill and ended after it; during_restart: it
    started between a kill and the recovery (+ slack); outside_restart: neither (suspicious)."""
    for k in kills:
        if "t" not in k:
            continue
        if t0 <= k["t"] <= t1:
            return "in_flight_at_kill"
    for k in kills:
        if "t" not in k:
            continue
        end = k["t"] + (k.get("recovery_s") or 1e9) + slack
        if k["t"] <= t0 <= end:
            return "during_restart"
    return "outside_restart"


def plot(path, rss, metrics, kills, title):
    """rss: the JSON's "rss" list; metrics: its "metrics_series"; kills: its "kills"."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, axc, ax2) = plt.subplots(3, 1, figsize=(13, 10), sharex=True,
                                       gridspec_kw={"height_ratios": [3, 1.4, 1.3]})
    colors = {"coordinator": "black", "mpirun": "tab:gray"}
    shard_colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
    seen = set()
    # shards on the top panel (rank 0 first, the others dashed over it: their lines overlap), the
    # small processes (coordinator, mpirun) on their own scale below
    order = sorted((s for s in rss if s["t"]), key=lambda s: (s["role"] != "shard", s["rank"] or 0, s["pid"]))
    for s in order:
        ls = "-"
        if s["role"] == "shard":
            a = ax
            c = shard_colors[(s["rank"] or 0) % len(shard_colors)]
            ls = ["-", "--", ":", "-."][(s["rank"] or 0) % 4]
            legend = f"shard rank {s['rank']}"
        else:
            a = axc
            c = colors.get(s["role"], "tab:olive")
            legend = s["role"]
        lbl = legend if legend not in seen else None
        seen.add(legend)
        xs = [t / 60 for t in s["t"]]
        a.plot(xs, s["rss_mib"], color=c, lw=1.8 if ls == "-" else 1.2, ls=ls, label=lbl)
        if s["role"] == "shard" and len(xs) > 1 and (s["rank"] or 0) == 0:   # each generation at its start
            a.annotate(f"g{s['generation']}", (xs[0], s["rss_mib"][0]), fontsize=7, color="dimgray",
                       xytext=(2, 4), textcoords="offset points")
    for a in (ax, axc, ax2):
        for i, k in enumerate(kills):
            if "t" in k:
                a.axvline(k["t"] / 60, color="red", ls="--", lw=0.8,
                          label=("shard SIGKILL" if i == 0 and a is ax else None))
    for k in kills:
        if "t" in k:
            ax.annotate(f"kill r{k['rank']}", (k["t"] / 60, 1.0), xycoords=("data", "axes fraction"),
                        fontsize=7, color="red", xytext=(2, -10), textcoords="offset points")
    ax.set_ylabel("shard RSS (MiB)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    axc.set_ylabel("RSS (MiB)")
    axc.set_ylim(bottom=0)
    axc.grid(alpha=0.3)
    axc.legend(fontsize=8, loc="lower right")
    mt = [t / 60 for t in metrics["t"]]
    ax2.plot(mt, [float("nan") if v is None else v for v in metrics["used_blocks"]],
             color="tab:blue", lw=1, label="KV blocks used")
    ax2.set_ylabel("KV blocks used")
    ax3 = ax2.twinx()
    ax3.plot(mt, [float("nan") if v is None else v for v in metrics["open_requests"]],
             color="tab:green", lw=0.8, alpha=0.7, label="open requests")
    ax3.set_ylabel("open requests")
    ax2.set_xlabel("minutes")
    ax2.grid(alpha=0.3)
    h1, l1 = ax2.get_legend_handles_labels()
    h2, l2 = ax3.get_legend_handles_labels()
    ax2.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_title(res):
    c = res["config"]
    return (f"tessera serve TP {c['tp']}, {res['cpu']['model_name']} ({res['cpu']['tag']}): RSS per process; "
            f"shard SIGKILL every {c['kill_every_s']:g} s")


def write_md(path, res):
    tot = res["totals"]
    rec = [k["recovery_s"] for k in res["kills"] if k.get("recovery_s") is not None]
    lines = [
        f"# Soak: {res['config']['minutes']:g} min, shard SIGKILL every {res['config']['kill_every_s']:g} s, TP {res['config']['tp']}",
        "",
        "| | |",
        "| --- | --- |",
        f"| CPU | {cpu_line(res['cpu'])} |",
        f"| date | {res['date']} |",
        f"| command | `{res['command']}` |",
        f"| server | `{res['server_command']}` |",
        f"| model | {res['config']['model']} |",
        f"| clients | {res['config']['concurrency']} (seed {res['config']['seed']}) |",
        f"| ran | {res['elapsed_s'] / 60:.1f} min |",
        f"| requests issued | {tot['issued']} |",
        f"| completed | {tot['completed']} |",
        f"| failed with error | {tot['failed_with_error']} ({res['failed_breakdown_text']}; "
        f"{res['errors_outside_restart_windows']} outside a kill-to-recovery window) |",
        f"| **lost** | **{tot['lost']}** |",
        f"| dropped by client on purpose | {tot['disconnected_by_client']} |",
        f"| malformed, rejected with 4xx/503 | {tot['rejected_as_expected']} |",
        f"| anomalies | {tot['anomalies']} |",
        f"| tokens generated (counted by the clients) | {res['tokens']} |",
        f"| shard kills / restarts counted by the server | {len(res['kills'])} / {res['final'].get('restarts_total')} |",
        f"| recovery per kill (s) | {', '.join(f'{r:.2f}' for r in rec) or '-'} |",
        f"| recovery max (s) | {max(rec):.2f} |" if rec else "| recovery max (s) | - |",
        f"| RSS coordinator first -> last (MiB) | {res['rss_summary'].get('coordinator', '-')} |",
        f"| RSS shards, per generation max (MiB) | {res['rss_summary'].get('shards', '-')} |",
        f"| KV blocks used at the end | {res['final'].get('used_blocks')} |",
        f"| server shutdown | {res['shutdown']['how']}, exit {res['shutdown']['exit_code']}, "
        f"{res['shutdown']['seconds']:.1f} s; processes left behind: {len(res['shutdown']['orphans'])} |",
        "",
        "| check | result |",
        "| --- | --- |",
        f"| lost == 0 | {'PASS' if res['pass']['lost_zero'] else 'FAIL'} |",
        f"| KV blocks used == 0 at the end | {'PASS' if res['pass']['blocks_zero'] else 'FAIL'} |",
        f"| every kill recovered | {'PASS' if res['pass']['recovered'] else 'FAIL'} |",
        "",
        f"RSS plot: `{os.path.basename(res['files']['png'])}`; everything else: `{os.path.basename(res['files']['json'])}`.",
        "",
    ]
    if res["notes"]:
        lines += ["Notes:", ""] + [f"- {n}" for n in res["notes"]] + [""]
    with open(path, "w") as f:
        f.write("\n".join(lines))
