"""Static HTML reports with inline SVG plots (matplotlib, no network, no JavaScript).

- one instance: verdict and CIs, the distribution of run times old vs new per test (strip plot
  over a box plot, improved tests first), the statistics table, the diff;
- the dataset (`--all`): instances per repository, single- vs multi-file, lines changed, share
  significant, verdict and best-speed-up distributions, a per-repository table like the paper's
  Table 1, and every instance with a link to its page.
"""

from __future__ import annotations

import html
import io
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from cppperf.dataset.records import git_patch, is_significant

plt.rcParams.update({"svg.fonttype": "none", "font.size": 9})

CSS = """
body{font-family:system-ui,sans-serif;margin:2rem auto;max-width:1100px;color:#222}
h1{font-size:1.5rem} h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.85rem} td,th{padding:.25rem .6rem;border-bottom:1px solid #eee;text-align:right}
td:first-child,th:first-child{text-align:left} .improved{color:#0a7d2c;font-weight:600} .regressed{color:#b00020}
.verdict{display:inline-block;padding:.2rem .6rem;border-radius:1rem;background:#eef;font-weight:600}
pre.diff{background:#f7f7f7;padding:1rem;overflow-x:auto;font-size:.8rem}
.add{color:#0a7d2c} .del{color:#b00020} figure{margin:1rem 0} .kpi{display:inline-block;margin-right:2rem}
.kpi b{display:block;font-size:1.6rem}
"""


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def test_samples(record: dict[str, Any]) -> dict[str, tuple[list[float], list[float]]]:
    """Per-test run times in ms (ours: raw samples in s; imported: the published per-test times, in s)."""
    ours = (record.get("cppperf") or {}).get("samples") or {}
    if ours:
        return {n: ([x * 1e3 for x in s["old_s"]], [x * 1e3 for x in s["new_s"]]) for n, s in ours.items()}
    out = {}
    for t in (record.get("tests") or {}).get("tests") or []:
        if t.get("old_times") and t.get("new_times"):
            out[t["test_name"]] = ([x * 1e3 for x in t["old_times"]], [x * 1e3 for x in t["new_times"]])
    return out


def _speedup_ci(
    samples: dict[str, tuple[list[float], list[float]]], t: dict[str, Any], seed: int
) -> tuple[float, float] | None:
    """The old/new speed-up CI of one test: the stored ratio CI inverted, or, for imported records
    (which keep a CI only where the verdict needed one), bootstrapped from the raw times now."""
    if t["ci_low"] > 0 and t["ci_high"] < float("inf"):
        return (1 / t["ci_high"], 1 / t["ci_low"])
    old, new = samples.get(t["name"], ([], []))
    if len(old) < 2 or len(new) < 2 or min(*old, *new) <= 0:
        return None
    import numpy as np

    from cppperf.dataset.records import IMPORT_RESAMPLES
    from cppperf.shared.engine.stats import bootstrap_ratio_ci

    low, high = bootstrap_ratio_ci(
        np.asarray(old, dtype=np.float64),
        np.asarray(new, dtype=np.float64),
        resamples=IMPORT_RESAMPLES,
        rng=np.random.default_rng(seed),
    )
    return (1 / high, 1 / low)


def _test_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    ours = (record.get("cppperf") or {}).get("tests") or []
    if ours:
        samples = test_samples(record)
        return [
            {
                "name": t["name"],
                "change": t["median_change"],
                "ci": _speedup_ci(samples, t, seed=i),
                # the p of the side that was decided: a regression shows its own (small) p
                "p": t["p_regress_adj"] if t["regressed"] or t["median_change"] < 0 else t["p_improve_adj"],
                "improved": t["improved"],
                "regressed": t["regressed"],
            }
            for i, t in enumerate(ours)
        ]
    improved = set((record.get("tests") or {}).get("significant_improvements_tests") or [])
    regressed = set((record.get("tests") or {}).get("significant_regressions_tests") or [])
    return [
        {
            "name": t["test_name"],
            "change": t.get("relative_improvement", 0.0),
            "ci": None,
            "p": t.get("p_value"),
            "improved": t["test_name"] in improved,
            "regressed": t["test_name"] in regressed,
        }
        for t in (record.get("tests") or {}).get("tests") or []
    ]


def distribution_plot(samples: dict[str, tuple[list[float], list[float]]], order: list[str]) -> str:
    names = [n for n in order if n in samples][:30]
    if not names:
        return "<p>No timing samples in this record.</p>"
    fig, axes = plt.subplots(len(names), 1, figsize=(8, 0.9 * len(names) + 0.6), squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        old, new = samples[name]
        ax.boxplot(
            [new, old], orientation="horizontal", widths=0.6, showfliers=False, tick_labels=["new", "old"]
        )
        for y, xs, color in ((1, new, "#0a7d2c"), (2, old, "#555")):
            ax.scatter(
                xs,
                [y + (i % 5 - 2) * 0.04 for i in range(len(xs))],
                s=6,
                color=color,
                alpha=0.7,
                gid=f"samples-{name}",
            )
        ax.set_title(name, fontsize=8, loc="left")
        ax.tick_params(labelsize=7)
    axes[-1, 0].set_xlabel("run time (ms)")
    fig.tight_layout()
    return _svg(fig)


def _diff_html(patch: str) -> str:
    lines = []
    for ln in patch.splitlines()[:2000]:
        esc = html.escape(ln)
        if ln.startswith("+") and not ln.startswith("+++"):
            lines.append(f'<span class="add">{esc}</span>')
        elif ln.startswith("-") and not ln.startswith("---"):
            lines.append(f'<span class="del">{esc}</span>')
        else:
            lines.append(esc)
    return '<pre class="diff">' + "\n".join(lines) + "</pre>"


def instance_section(record: dict[str, Any]) -> str:
    ours = record.get("cppperf") or {}
    ci = record["commit_info"]
    rows = _test_rows(record)
    rows.sort(key=lambda r: (not r["improved"], not r["regressed"], -abs(r["change"] or 0)))
    samples = test_samples(record)
    table = ["<table><tr><th>test</th><th>change</th><th>speed-up 95% CI</th><th>p</th><th>result</th></tr>"]
    for r in rows[:200]:
        cls = "improved" if r["improved"] else ("regressed" if r["regressed"] else "")
        ci_txt = f"[{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]" if r["ci"] else "–"
        p_txt = f"{r['p']:.2g}" if isinstance(r["p"], (int, float)) else "–"
        table.append(
            f'<tr class="{cls}"><td>{html.escape(r["name"])}</td><td>{(r["change"] or 0) * 100:+.1f}%</td>'
            f"<td>{ci_txt}</td><td>{p_txt}</td><td>{cls or '–'}</td></tr>"
        )
    table.append("</table>")
    msg = html.escape("\n".join(ci.get("commit_message") or []))
    return f"""
<h1>{html.escape(ours.get("instance_id", ""))}</h1>
<p><span class="verdict">{html.escape(str(ours.get("verdict", "")))}</span>
 paper's rule: {html.escape(str(ours.get("verdict_paper_rule", "")))} ·
 {html.escape(record["metadata"]["repository_name"])} @ {ci["new_sha"][:12]} (parent {ci["old_sha"][:12]}) ·
 {len(ci.get("files_changed") or [])} file(s), +{ci.get("lines_added", 0)} −{ci.get("lines_removed", 0)}</p>
<pre>{msg}</pre>
<h2>Run times, old vs new</h2>
<figure class="distributions">{distribution_plot(samples, [r["name"] for r in rows])}</figure>
<h2>Tests</h2>
{"".join(table)}
<h2>Diff</h2>
{_diff_html(git_patch(record))}
"""


def best_speedup(record: dict[str, Any]) -> float | None:
    """The largest speed-up (old/new) among the instance's improved tests, None when none improved."""
    ours = (record.get("cppperf") or {}).get("tests") or []
    ups = [1.0 / t["ratio"] for t in ours if t.get("improved") and t.get("ratio")]
    if not ours:
        improved = set((record.get("tests") or {}).get("significant_improvements_tests") or [])
        ups = [
            1.0 / (1.0 - t["relative_improvement"])
            for t in (record.get("tests") or {}).get("tests") or []
            if t.get("test_name") in improved and 0 < (t.get("relative_improvement") or 0) < 1
        ]
    return max(ups) if ups else None


def _distributions(records: list[dict[str, Any]]) -> str:
    verdicts = Counter(str((r.get("cppperf") or {}).get("verdict")) for r in records)
    ups = [u for u in (best_speedup(r) for r in records) if u is not None]
    fig, axes = plt.subplots(1, 2, figsize=(9, 2.8))
    names = [v for v, _ in verdicts.most_common()]
    colors = {"improved": "#0a7d2c", "regressed": "#b00020"}
    axes[0].bar(
        names, [verdicts[v] for v in names], color=[colors.get(v, "#888") for v in names], gid="verdicts"
    )
    axes[0].set_title("verdicts", loc="left")
    axes[0].tick_params(axis="x", labelsize=7, rotation=20)
    if ups:
        axes[1].hist(ups, bins=30, color="#0a7d2c", gid="speedups")
    axes[1].set_title(f"best speed-up of improved instances (n={len(ups)})", loc="left")
    axes[1].set_xlabel("old / new run time (×)")
    return _svg(fig)


def _instance_links(records: list[dict[str, Any]], link: Callable[[str], str] | None) -> str:
    rows = ["<table><tr><th>instance</th><th>verdict</th><th>best speed-up</th><th>files</th></tr>"]
    for r in sorted(records, key=lambda r: str((r.get("cppperf") or {}).get("instance_id"))):
        ours = r.get("cppperf") or {}
        iid = html.escape(str(ours.get("instance_id")))
        name = f'<a href="{html.escape(link(str(ours.get("instance_id"))))}">{iid}</a>' if link else iid
        up = best_speedup(r)
        verdict = str(ours.get("verdict"))
        cls = verdict if verdict in ("improved", "regressed") else ""
        rows.append(
            f'<tr><td>{name}</td><td class="{cls}">{html.escape(verdict)}</td>'
            f"<td>{f'{up:.2f}×' if up else '–'}</td><td>{len(r['commit_info'].get('files_changed') or [])}</td></tr>"
        )
    rows.append("</table>")
    return "".join(rows)


def overview_section(records: list[dict[str, Any]], link: Callable[[str], str] | None = None) -> str:
    """The dataset page; `link(instance_id)` gives the href of each instance's page."""
    per_repo: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        per_repo[r["metadata"]["repository_name"]].append(r)
    n = len(records)
    sig = sum(is_significant(r) for r in records)
    single = sum(len(r["commit_info"].get("files_changed") or []) == 1 for r in records)
    counts = Counter({k: len(v) for k, v in per_repo.items()})
    top = counts.most_common(30)
    fig, ax = plt.subplots(figsize=(8, 0.22 * len(top) + 0.8))
    ax.barh([k for k, _ in reversed(top)], [v for _, v in reversed(top)], color="#4a6fa5", gid="per-repo")
    ax.set_xlabel("instances")
    ax.set_title("instances per repository (top 30)", loc="left")
    per_repo_svg = _svg(fig)
    changed = [
        int(r["commit_info"].get("lines_added") or 0) + int(r["commit_info"].get("lines_removed") or 0)
        for r in records
    ]
    fig, axes = plt.subplots(1, 2, figsize=(9, 2.8))
    axes[0].bar(
        ["single-file", "multi-file"], [single, n - single], color=["#4a6fa5", "#a5774a"], gid="files"
    )
    axes[0].set_title("files changed", loc="left")
    axes[1].hist([max(c, 1) for c in changed], bins=30, color="#4a6fa5", log=False, gid="lines")
    axes[1].set_xscale("log")
    axes[1].set_title("lines changed per patch", loc="left")
    shape_svg = _svg(fig)
    rows = [
        "<table><tr><th>repository</th><th>instances</th><th>single-file</th><th>multi-file</th>"
        "<th>mean lines changed</th><th>significant</th></tr>"
    ]
    for repo, rs in sorted(per_repo.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        s1 = sum(len(r["commit_info"].get("files_changed") or []) == 1 for r in rs)
        lines = [
            int(r["commit_info"].get("lines_added") or 0) + int(r["commit_info"].get("lines_removed") or 0)
            for r in rs
        ]
        rows.append(
            f"<tr><td>{html.escape(repo)}</td><td>{len(rs)}</td><td>{s1}</td><td>{len(rs) - s1}</td>"
            f"<td>{statistics.fmean(lines):.1f}</td><td>{sum(is_significant(r) for r in rs)}</td></tr>"
        )
    rows.append("</table>")
    return (
        f"""
<h1>Dataset overview</h1>
<p><span class="kpi"><b>{n}</b>instances</span><span class="kpi"><b>{len(per_repo)}</b>repositories</span>
<span class="kpi"><b>{single}</b>single-file</span><span class="kpi"><b>{n - single}</b>multi-file</span>
<span class="kpi"><b>{sig} ({sig / n:.0%})</b>with a significantly faster test</span></p>
<figure class="per-repo">{per_repo_svg}</figure>
<figure class="shape">{shape_svg}</figure>
<h2>Verdicts and speed-ups</h2>
<figure class="distributions">{_distributions(records)}</figure>
<h2>Per repository (the paper's Table 1)</h2>
{"".join(rows)}
<h2>Instances</h2>
{_instance_links(records, link)}
"""
        if n
        else "<h1>Dataset overview</h1><p>No instances.</p>"
    )


def page(title: str, body: str) -> str:
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{CSS}</style></head><body>{body}</body></html>"
    )
