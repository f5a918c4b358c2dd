"""Static HTML reports with inline SVG plots (no network at view time).

- one instance: verdict and CIs, the distribution of run times old vs new per test (strip plot
  over a box plot, improved tests first; SVG written directly, so 347 pages take seconds), the
  statistics table, the diff;
- the dataset (`--all`, matplotlib): instances per repository, single- vs multi-file, lines
  changed, share significant, verdict and best-speed-up distributions, a per-repository table like
  the paper's Table 1, and every instance in a table that sorts and filters (a small inline
  script; without it, a plain table) with a link to its page. Every count on the overview comes
  from one `summarize` pass, so the header, the plots and the table agree.
"""

from __future__ import annotations

import html
import io
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from msgspec import UNSET

from cppperf.dataset.records import git_patch
from cppperf.shared.domain import InstanceRecord, StatsRecord, Verdict

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
#filters{margin:.5rem 0;display:flex;gap:1rem;flex-wrap:wrap;align-items:center;font-size:.85rem}
th button{font:inherit;font-weight:600;background:none;border:0;padding:0;cursor:pointer}
th[aria-sort=ascending] button::after{content:" ▲"} th[aria-sort=descending] button::after{content:" ▼"}
"""


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def test_samples(record: InstanceRecord) -> dict[str, tuple[list[float], list[float]]]:
    """Per-test run times in ms (ours: raw samples in s; imported: the published per-test times, in s)."""
    ours = record.cppperf.samples
    if ours:
        return {n: ([x * 1e3 for x in s.old_s], [x * 1e3 for x in s.new_s]) for n, s in ours.items()}
    out = {}
    for t in record.tests.tests:
        if t.old_times and t.new_times:
            out[t.test_name] = ([x * 1e3 for x in t.old_times], [x * 1e3 for x in t.new_times])
    return out


def moses_ratio_ci(old: list[float], new: list[float], level: float = 0.95) -> tuple[float, float]:
    """The distribution-free CI of the Hodges-Lehmann new/old ratio (Moses' interval: order
    statistics of the pairwise log differences at the Mann-Whitney critical rank). One partition,
    no resampling: the report computes it for thousands of tests in a second."""
    import numpy as np
    from scipy.stats import norm

    lo_old = np.log(np.asarray(old, dtype=np.float64))
    lo_new = np.log(np.asarray(new, dtype=np.float64))
    n, m = len(lo_old), len(lo_new)
    diffs = (lo_new[None, :] - lo_old[:, None]).ravel()
    z = float(norm.ppf(0.5 + level / 2))
    k = int(max(0, min(n * m // 2 - 1, np.floor(n * m / 2 - z * np.sqrt(n * m * (n + m + 1) / 12)))))
    low, high = np.partition(diffs, (k, n * m - 1 - k))[[k, n * m - 1 - k]]
    return float(np.exp(low)), float(np.exp(high))


def _speedup_ci(
    samples: dict[str, tuple[list[float], list[float]]], t: StatsRecord
) -> tuple[tuple[float, float] | None, bool]:
    """The old/new speed-up CI of one test and whether the report computed it: the stored ratio CI
    inverted, or, for imported records (which keep a CI only where the verdict needed one), the
    distribution-free interval from the raw times."""
    if t.ci_low > 0 and t.ci_high < float("inf"):
        return (1 / t.ci_high, 1 / t.ci_low), False
    old, new = samples.get(t.name, ([], []))
    if len(old) < 2 or len(new) < 2 or min(*old, *new) <= 0:
        return None, False
    low, high = moses_ratio_ci(old, new)
    return (1 / high, 1 / low), True


def _test_rows(record: InstanceRecord) -> list[dict[str, Any]]:
    ours = record.cppperf.tests
    if ours:
        samples = test_samples(record)
        rows = []
        for t in ours:
            ci, computed = _speedup_ci(samples, t)
            rows.append(
                {
                    "name": t.name,
                    "change": t.median_change,
                    "ci": ci,
                    "ci_computed": computed,
                    # the p of the side that was decided: a regression shows its own (small) p
                    "p": t.p_regress_adj if t.regressed or t.median_change < 0 else t.p_improve_adj,
                    "improved": t.improved,
                    "regressed": t.regressed,
                }
            )
        return rows
    improved = set(record.tests.significant_improvements_tests or [])
    regressed = set(record.tests.significant_regressions_tests or [])
    return [
        {
            "name": t.test_name,
            "change": 0.0 if t.relative_improvement is UNSET else t.relative_improvement,
            "ci": None,
            "ci_computed": False,
            "p": None if t.p_value is UNSET else t.p_value,
            "improved": t.test_name in improved,
            "regressed": t.test_name in regressed,
        }
        for t in record.tests.tests
    ]


def _ticks(low: float, high: float) -> list[float]:
    """About five round tick values covering [low, high]."""
    import math

    span = high - low or abs(high) or 1.0
    step = 10 ** math.floor(math.log10(span / 4))
    step *= next((f for f in (1, 2, 5, 10) if span / (step * f) <= 5), 10)
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def _quartiles(xs: list[float]) -> tuple[float, float, float, float, float]:
    """Whisker ends (1.5 IQR, clipped to the data), quartiles and median, as a box plot draws them."""
    q1, med, q3 = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else (xs[0],) * 3
    lo = min(x for x in xs if x >= q1 - 1.5 * (q3 - q1))
    hi = max(x for x in xs if x <= q3 + 1.5 * (q3 - q1))
    return lo, q1, med, q3, hi


def distribution_plot(samples: dict[str, tuple[list[float], list[float]]], order: list[str]) -> str:
    """Per test (at most 30, in `order`): a box plot with the samples strewn over it, new above old,
    on the test's own axis (ms). Written as SVG text directly: no plotting library per page."""
    names = [n for n in order if n in samples and samples[n][0] and samples[n][1]][:30]
    if not names:
        return "<p>No timing samples in this record.</p>"
    width, left, right, panel = 760, 40, 20, 78
    plot_w = width - left - right
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{panel * len(names) + 24}" '
        f'viewBox="0 0 {width} {panel * len(names) + 24}" font-size="9" font-family="sans-serif">'
    ]
    for i, name in enumerate(names):
        old, new = samples[name]
        low, high = min(*old, *new), max(*old, *new)
        pad = (high - low) * 0.05 or abs(high) * 0.05 or 1.0
        low, high = low - pad, high + pad

        def x(v: float, lo: float = low, hi: float = high) -> float:
            return left + (v - lo) / (hi - lo) * plot_w

        top = i * panel + 12
        parts.append(f'<g id="samples-{html.escape(name)}" transform="translate(0,{top})">')
        parts.append(f'<text x="{left}" y="0">{html.escape(name)}</text>')
        for row, (label, xs, color) in enumerate((("new", new, "#0a7d2c"), ("old", old, "#555"))):
            y = 14 + row * 22
            w_lo, q1, med, q3, w_hi = _quartiles(xs)
            parts.append(
                f'<text x="{left - 4}" y="{y + 3}" text-anchor="end">{label}</text>'
                f'<line x1="{x(w_lo):.1f}" x2="{x(w_hi):.1f}" y1="{y}" y2="{y}" stroke="#999"/>'
                f'<rect x="{x(q1):.1f}" y="{y - 7}" width="{max(x(q3) - x(q1), 0.5):.1f}" height="14" '
                f'fill="none" stroke="#333"/>'
                f'<line x1="{x(med):.1f}" x2="{x(med):.1f}" y1="{y - 7}" y2="{y + 7}" stroke="#e67e22" '
                f'stroke-width="1.5"/>'
            )
            parts.extend(
                f'<circle cx="{x(v):.1f}" cy="{y + (k % 5 - 2) * 2}" r="1.6" fill="{color}" fill-opacity="0.7"/>'
                for k, v in enumerate(xs)
            )
        axis = 14 + 2 * 22
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{axis - 8}" y2="{axis - 8}" stroke="#ccc"/>'
        )
        parts.extend(
            f'<text x="{x(t):.1f}" y="{axis + 2}" text-anchor="middle" fill="#555">{t:g}</text>'
            for t in _ticks(low, high)
        )
        parts.append("</g>")
    parts.append(
        f'<text x="{left + plot_w / 2}" y="{panel * len(names) + 18}" text-anchor="middle">run time (ms)</text>'
    )
    parts.append("</svg>")
    return "".join(parts)


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


def instance_section(record: InstanceRecord) -> str:
    ours = record.cppperf
    ci = record.commit_info
    rows = _test_rows(record)
    rows.sort(key=lambda r: (not r["improved"], not r["regressed"], -abs(r["change"] or 0)))
    samples = test_samples(record)
    table = ["<table><tr><th>test</th><th>change</th><th>speed-up 95% CI</th><th>p</th><th>result</th></tr>"]
    for r in rows[:200]:
        cls = "improved" if r["improved"] else ("regressed" if r["regressed"] else "")
        ci_txt = f"[{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]{'†' if r['ci_computed'] else ''}" if r["ci"] else "–"
        p_txt = f"{r['p']:.2g}" if isinstance(r["p"], (int, float)) else "–"
        table.append(
            f'<tr class="{cls}"><td>{html.escape(r["name"])}</td><td>{(r["change"] or 0) * 100:+.1f}%</td>'
            f"<td>{ci_txt}</td><td>{p_txt}</td><td>{cls or '–'}</td></tr>"
        )
    table.append("</table>")
    if any(r["ci_computed"] for r in rows):
        table.append(
            "<p>† not stored in the record (imported records keep a CI only where the verdict needed "
            "one): the distribution-free (Moses) interval of the Hodges-Lehmann ratio, from the raw times.</p>"
        )
    msg = html.escape("\n".join(ci.commit_message or []))
    return f"""
<h1>{html.escape(ours.instance_id)}</h1>
<p><span class="verdict">{html.escape(str(ours.verdict))}</span>
 paper's rule: {html.escape(str(ours.verdict_paper_rule or ""))} ·
 {html.escape(record.metadata.repository_name)} @ {ci.new_sha[:12]} (parent {ci.old_sha[:12]}) ·
 {len(ci.files_changed)} file(s), +{ci.lines_added or 0} −{ci.lines_removed or 0}</p>
<pre>{msg}</pre>
<h2>Run times, old vs new</h2>
<figure class="distributions">{distribution_plot(samples, [r["name"] for r in rows])}</figure>
<h2>Tests</h2>
{"".join(table)}
<h2>Diff</h2>
{_diff_html(git_patch(record))}
"""


def best_speedup(record: InstanceRecord) -> float | None:
    """The largest speed-up (old/new) among the instance's improved tests, None when none improved."""
    ours = record.cppperf.tests
    ups = [1.0 / t.ratio for t in ours if t.improved and t.ratio]
    if not ours:
        improved = set(record.tests.significant_improvements_tests or [])
        ups = [
            1.0 / (1.0 - t.relative_improvement)
            for t in record.tests.tests
            if t.test_name in improved and t.relative_improvement and 0 < t.relative_improvement < 1
        ]
    return max(ups) if ups else None


@dataclass(frozen=True)
class Summary:
    """One instance as the overview counts it; every number on the overview comes from these."""

    instance_id: str
    repo: str
    verdict: str
    speedup: float | None  # best speed-up among improved tests, for an improved instance only
    files: int
    lines: int

    @property
    def improved(self) -> bool:
        return self.verdict == Verdict.IMPROVED

    @property
    def single_file(self) -> bool:
        return self.files == 1


def summarize(records: list[InstanceRecord]) -> list[Summary]:
    """The overview's one pass over the records, sorted by instance id."""
    out = []
    for r in records:
        ci = r.commit_info
        verdict = str(r.cppperf.verdict)
        out.append(
            Summary(
                instance_id=r.cppperf.instance_id,
                repo=r.metadata.repository_name,
                verdict=verdict,
                speedup=best_speedup(r) if verdict == Verdict.IMPROVED else None,
                files=len(ci.files_changed),
                lines=(ci.lines_added or 0) + (ci.lines_removed or 0),
            )
        )
    return sorted(out, key=lambda x: x.instance_id)


def verdict_counts(rows: list[Summary]) -> list[tuple[str, int]]:
    """Instances per verdict, most common first (ties by name)."""
    return sorted(Counter(r.verdict for r in rows).items(), key=lambda kv: (-kv[1], kv[0]))


def _distributions(rows: list[Summary]) -> str:
    verdicts = verdict_counts(rows)
    ups = [r.speedup for r in rows if r.improved and r.speedup is not None]
    fig, axes = plt.subplots(1, 2, figsize=(9, 2.8))
    colors = {"improved": "#0a7d2c", "regressed": "#b00020"}
    axes[0].bar(
        [v for v, _ in verdicts],
        [c for _, c in verdicts],
        color=[colors.get(v, "#888") for v, _ in verdicts],
        gid="verdicts",
    )
    axes[0].set_title("verdicts", loc="left")
    axes[0].tick_params(axis="x", labelsize=7, rotation=20)
    if ups:
        axes[1].hist(ups, bins=30, color="#0a7d2c", gid="speedups")
    axes[1].set_title(f"best speed-up of improved instances (n={len(ups)})", loc="left")
    axes[1].set_xlabel("old / new run time (×)")
    return _svg(fig)


SCRIPT = """
(function () {
  var table = document.getElementById("instances"), form = document.getElementById("filters");
  if (!table || !form) return;
  var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
  form.hidden = false;
  function apply() {
    var repo = form.repo.value, verdict = form.verdict.value, files = form.files.value;
    var min = parseFloat(form.min.value), shown = 0;
    rows.forEach(function (r) {
      var d = r.dataset, up = parseFloat(d.speedup);
      var ok = (!repo || d.repo === repo) && (!verdict || d.verdict === verdict) &&
        (!files || d.files === files) && (isNaN(min) || (!isNaN(up) && up >= min));
      r.hidden = !ok;
      if (ok) shown++;
    });
    document.getElementById("shown").textContent = shown;
  }
  form.addEventListener("input", apply);
  form.addEventListener("change", apply);
  form.addEventListener("reset", function () { setTimeout(apply, 0); });
  table.tHead.addEventListener("click", function (e) {
    var th = e.target.closest("th[data-key]");
    if (!th) return;
    var key = th.dataset.key, num = th.dataset.type === "num";
    var dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (c) { c.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
    rows.sort(function (a, b) {
      var x = a.dataset[key] || "", y = b.dataset[key] || "";
      if (num) {
        x = parseFloat(x); y = parseFloat(y);
        if (isNaN(x)) x = -Infinity;
        if (isNaN(y)) y = -Infinity;
        return x === y ? 0 : (x < y ? -dir : dir);
      }
      return x < y ? -dir : (x > y ? dir : 0);
    });
    rows.forEach(function (r) { body.appendChild(r); });
  });
})();
"""


def _options(name: str, label: str, values: list[str]) -> str:
    opts = "".join(f'<option value="{html.escape(v)}">{html.escape(v)}</option>' for v in values)
    return f'<label>{label} <select name="{name}"><option value="">all</option>{opts}</select></label>'


def _instance_table(rows: list[Summary], link: Callable[[str], str] | None) -> str:
    """Every instance; `data-*` attributes carry what the inline script sorts and filters on."""
    form = (
        '<form id="filters" hidden>'
        + _options("repo", "repository", sorted({r.repo for r in rows}))
        + _options("verdict", "verdict", [v for v, _ in verdict_counts(rows)])
        + _options("files", "files", ["single", "multi"])
        + '<label>best speed-up ≥ <input name="min" type="number" step="0.05" min="0" size="5"></label>'
        + f' <button type="reset">clear</button> <span><b id="shown">{len(rows)}</b> of {len(rows)} shown</span>'
        + "</form>"
    )
    head = (
        '<table id="instances" class="sortable"><thead><tr>'
        '<th data-key="id"><button type="button">instance</button></th>'
        '<th data-key="repo"><button type="button">repository</button></th>'
        '<th data-key="verdict"><button type="button">verdict</button></th>'
        '<th data-key="speedup" data-type="num"><button type="button">best speed-up</button></th>'
        '<th data-key="nfiles" data-type="num"><button type="button">files</button></th>'
        '<th data-key="lines" data-type="num"><button type="button">lines changed</button></th>'
        "</tr></thead><tbody>"
    )
    body = []
    for r in rows:
        iid = html.escape(r.instance_id)
        name = f'<a href="{html.escape(link(r.instance_id))}">{iid}</a>' if link else iid
        cls = r.verdict if r.verdict in ("improved", "regressed") else ""
        up = f"{r.speedup:.4f}" if r.speedup is not None else ""
        body.append(
            f'<tr data-id="{iid}" data-repo="{html.escape(r.repo)}" data-verdict="{html.escape(r.verdict)}" '
            f'data-speedup="{up}" data-files="{"single" if r.single_file else "multi"}" '
            f'data-nfiles="{r.files}" data-lines="{r.lines}">'
            f'<td>{name}</td><td>{html.escape(r.repo)}</td><td class="{cls}">{html.escape(r.verdict)}</td>'
            f"<td>{f'{r.speedup:.2f}×' if r.speedup is not None else '–'}</td><td>{r.files}</td>"
            f"<td>{r.lines}</td></tr>"
        )
    return form + head + "".join(body) + f"</tbody></table><script>{SCRIPT}</script>"


def overview_section(records: list[InstanceRecord], link: Callable[[str], str] | None = None) -> str:
    """The dataset page; `link(instance_id)` gives the href of each instance's page."""
    rows = summarize(records)
    n = len(rows)
    if not n:
        return "<h1>Dataset overview</h1><p>No instances.</p>"
    per_repo: dict[str, list[Summary]] = defaultdict(list)
    for r in rows:
        per_repo[r.repo].append(r)
    sig = sum(r.improved for r in rows)
    single = sum(r.single_file for r in rows)
    top = Counter({k: len(v) for k, v in per_repo.items()}).most_common(30)
    fig, ax = plt.subplots(figsize=(8, 0.22 * len(top) + 0.8))
    ax.barh([k for k, _ in reversed(top)], [v for _, v in reversed(top)], color="#4a6fa5", gid="per-repo")
    ax.set_xlabel("instances")
    ax.set_title("instances per repository (top 30)", loc="left")
    per_repo_svg = _svg(fig)
    fig, axes = plt.subplots(1, 2, figsize=(9, 2.8))
    axes[0].bar(
        ["single-file", "multi-file"], [single, n - single], color=["#4a6fa5", "#a5774a"], gid="files"
    )
    axes[0].set_title("files changed", loc="left")
    axes[1].hist([max(r.lines, 1) for r in rows], bins=30, color="#4a6fa5", log=False, gid="lines")
    axes[1].set_xscale("log")
    axes[1].set_title("lines changed per patch", loc="left")
    shape_svg = _svg(fig)
    table = [
        "<table><tr><th>repository</th><th>instances</th><th>single-file</th><th>multi-file</th>"
        "<th>mean lines changed</th><th>significant</th></tr>"
    ]
    for repo, rs in sorted(per_repo.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        s1 = sum(r.single_file for r in rs)
        table.append(
            f"<tr><td>{html.escape(repo)}</td><td>{len(rs)}</td><td>{s1}</td><td>{len(rs) - s1}</td>"
            f"<td>{statistics.fmean(r.lines for r in rs):.1f}</td><td>{sum(r.improved for r in rs)}</td></tr>"
        )
    table.append("</table>")
    verdict_line = " · ".join(
        f'<span data-verdict="{html.escape(v)}"><b>{c}</b> {html.escape(v)}</span>'
        for v, c in verdict_counts(rows)
    )
    return f"""
<h1>Dataset overview</h1>
<p><span class="kpi"><b>{n}</b>instances</span><span class="kpi"><b>{len(per_repo)}</b>repositories</span>
<span class="kpi"><b>{single}</b>single-file</span><span class="kpi"><b>{n - single}</b>multi-file</span>
<span class="kpi" data-verdict="improved"><b>{sig} ({sig / n:.0%})</b>improved (a significantly faster test, none slower)</span></p>
<p class="verdicts">verdicts: {verdict_line}</p>
<figure class="per-repo">{per_repo_svg}</figure>
<figure class="shape">{shape_svg}</figure>
<h2>Verdicts and speed-ups</h2>
<figure class="distributions">{_distributions(rows)}</figure>
<h2>Per repository (the paper's Table 1)</h2>
{"".join(table)}
<h2 id="all-instances">Instances</h2>
{_instance_table(rows, link)}
"""


def page(title: str, body: str) -> str:
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{CSS}</style></head><body>{body}</body></html>"
    )
