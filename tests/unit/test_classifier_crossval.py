"""Cross-validation over repositories: folds over the union of repositories stay disjoint and
spread the positives; both evaluation populations (hand-labelled commits; CppPerf-DB positives
against mined commits) are scored for the rules and every pre-registered variant, with figures a
reader can check by hand on a small synthetic corpus; the thresholds the variants choose."""

from __future__ import annotations

import json

import pytest

from cppperf.classifier.crossval import (
    RULES,
    VARIANTS,
    cross_validate,
    labelled_neg_weight,
    union_folds,
)
from cppperf.services.classifier.heuristic import score_commit
from cppperf.services.classifier.scorer import Example, TrainConfig, f1_threshold

DIFF = "diff --git a/s.cpp b/s.cpp\n--- a/s.cpp\n+++ b/s.cpp\n@@ -1 +1 @@\n-  v.push_back(x);\n+  v.reserve(n);\n"


def ex(repo: str, sha: str, msg: str, label: bool, source: str) -> Example:
    return Example(repo, sha, msg, "", DIFF, label, source)


def test_union_folds_are_disjoint_cover_every_repository_and_spread_positives() -> None:
    tests = [ex("lab/a", "a1", "m", True, "labels"), ex("lab/a", "a2", "m", True, "labels")]
    tests += [ex("lab/b", "b1", "m", True, "labels"), ex("lab/c", "c1", "m", True, "labels")]
    tests += [ex("lab/c", "c2", "m", False, "labels")]
    pool = [ex("db/d", f"d{i}", "m", True, "cppperf-db") for i in range(5)]
    pool += [ex("db/e", f"e{i}", "m", True, "cppperf-db") for i in range(3)]
    pool += [ex("db/f", "f0", "m", True, "cppperf-db"), ex("lab/a", "am", "m", False, "mined")]
    pool += [ex("neg/g", f"g{i}", "m", False, "mined") for i in range(10)]
    pool += [ex("neg/h", "h0", "m", False, "mined")]
    folds = union_folds(tests, pool, 3)
    repos = {e.repo for e in [*tests, *pool]}
    assert len(folds) == 3
    assert set().union(*folds) == repos
    assert sum(len(f) for f in folds) == len(repos)  # no repository in two folds

    def fold_of(repo: str) -> int:
        return next(i for i, f in enumerate(folds) if repo in f)

    # the three repositories with labelled positives go to three folds, and so do the three with
    # pool positives: the scarce positives spread before sizes even out
    assert len({fold_of(r) for r in ("lab/a", "lab/b", "lab/c")}) == 3
    assert len({fold_of(r) for r in ("db/d", "db/e", "db/f")}) == 3
    assert union_folds(tests, pool, 3) == folds  # deterministic
    assert len(union_folds(tests[:1], [], 4)) == 1  # empty folds are dropped


def test_f1_threshold_at_another_prevalence() -> None:
    scores = [0.9, 0.8, 0.7, 0.1]
    labels = [True, False, True, False]
    # by hand: t=0.9 F1 2/3, t=0.8 F1 2/4, t=0.7 F1 4/5, t=0.1 F1 4/6
    assert f1_threshold(scores, labels) == 0.7
    # each negative counted 10 times: t=0.9 F1 2/3, t=0.7 F1 4/14
    assert f1_threshold(scores, labels, neg_weight=10.0) == 0.9


def test_negative_weight_matches_the_labelled_prevalence() -> None:
    pool = [ex("o/r", f"p{i}", "m", True, "cppperf-db") for i in range(10)]
    pool += [ex("o/r", f"n{i}", "m", False, "mined") for i in range(70)]
    lab = [ex("o/s", f"l{i}", "m", i < 2, "labels") for i in range(20)]  # 2 of 20 positive
    # 12 positives, 88 negatives; 12 / (12 + w 88) = 0.1  =>  w = 12 * 0.9 / (0.1 * 88)
    assert labelled_neg_weight(pool + lab) == pytest.approx(12 * 0.9 / (0.1 * 88))
    assert labelled_neg_weight(pool) == 1.0  # no labelled commits: the sample's own prevalence


def corpus(repos: int = 6) -> tuple[list[Example], list[Example]]:
    """Per repository: 3 CppPerf-DB entries the rules call positive and 1 they miss; 6 mined bug
    fixes and 1 mined "Faster …" (label noise the rules call positive); labelled: one optimisation,
    one rename, one crash fix. repo 0's CppPerf-DB also holds its labelled positive (same sha)."""
    pool, tests = [], []
    for r in range(repos):
        repo, x = f"o{r}/lib{r}", f"module{r}"
        pool += [
            ex(repo, f"d{r}-{i}", f"Speed up {x} by avoiding copies", True, "cppperf-db") for i in range(3)
        ]
        pool.append(ex(repo, f"d{r}-u", f"Update {x}", True, "cppperf-db"))
        pool += [ex(repo, f"m{r}-{i}", f"Fix crash in {x} case {i}", False, "mined") for i in range(6)]
        pool.append(ex(repo, f"m{r}-f", f"Faster {x}", False, "mined"))
        tests.append(ex(repo, f"l{r}-p", f"Optimize {x} hot loop", True, "labels"))
        tests.append(ex(repo, f"l{r}-r", f"Rename {x}", False, "labels"))
        tests.append(ex(repo, f"l{r}-c", f"Fix crash in {x} parser", False, "labels"))
    pool.append(ex("o0/lib0", "l0-p", "Optimize module0 hot loop", True, "cppperf-db"))
    return pool, tests


def test_both_populations_are_scored_with_figures_checkable_by_hand() -> None:
    pool, tests = corpus()
    # the rules as the corpus was built: otherwise the expected figures below would be wrong
    assert [score_commit(m, "", DIFF).label for m in ("Speed up a by avoiding copies", "Update a")] == [
        True,
        False,
    ]
    assert [score_commit(m, "", DIFF).label for m in ("Fix crash in a case 1", "Faster a")] == [False, True]
    assert [score_commit(m, "", DIFF).label for m in ("Optimize a hot loop", "Rename a")] == [True, False]
    rep = cross_validate(pool, tests, k=3, cfg=TrainConfig(inner_folds=2))
    s = rep.summary
    pops = s["populations"]
    assert set(pops) == {"labelled", "cppperf_db_vs_mined"}
    # population 2: 4 CppPerf-DB entries + 7 mined commits per repository; the one CppPerf-DB entry
    # that is also a labelled commit is scored only as labelled
    assert pops["cppperf_db_vs_mined"]["commits"] == 6 * 11
    assert pops["cppperf_db_vs_mined"]["positives"] == 6 * 4
    assert pops["labelled"]["commits"] == 18 and pops["labelled"]["positives"] == 6
    rules2 = pops["cppperf_db_vs_mined"]["scorers"][RULES]
    # by hand, per repository: tp 3 ("Speed up"), fn 1 ("Update"), fp 1 ("Faster"), tn 6
    assert {k: rules2["pooled"][k] for k in ("tp", "fn", "fp", "tn")} == {
        "tp": 18,
        "fn": 6,
        "fp": 6,
        "tn": 36,
    }
    for m in ("precision", "recall", "f1"):  # every fold is alike: 0.75, no spread
        assert rules2[m] == {"mean": 0.75, "sd": 0.0}
    rules1 = pops["labelled"]["scorers"][RULES]
    assert rules1["pooled"]["tp"] == 6 and rules1["pooled"]["fp"] == 0 and rules1["f1"]["mean"] == 1.0
    assert s["heuristic"]["f1"] == rules1["f1"]  # the older keys are the labelled population's
    assert s["model"]["f1"] == pops["labelled"]["scorers"]["shipped"]["f1"]
    names = [v.name for v in VARIANTS]
    assert [v["name"] for v in s["variants"]] == names and len(names) == 5
    for pop in pops.values():
        assert list(pop["scorers"]) == [RULES, *names]
        for sc in pop["scorers"].values():
            p = sc["pooled"]
            assert p["tp"] + p["fp"] + p["fn"] + p["tn"] == pop["commits"]
    held = [set(f.held_out) for f in rep.folds]
    assert sum(len(h) for h in held) == len(set().union(*held)) == 6  # disjoint, all repositories
    for f in rep.folds:
        assert f.cppperf_db_positives == 4 * len(f.held_out)
        assert f.mined_commits == 7 * len(f.held_out)
        assert set(f.chosen) == set(names)
        assert all(0.0 <= c["threshold"] <= 1.0 for c in f.chosen.values())
        assert "stack_rules_weight" in f.chosen["stacked-rules"]
        assert "stack_rules_weight" not in f.chosen["shipped"]
        assert f.chosen["shipped"]["l2"] in (1.0, 3.0, 10.0)
        assert f.chosen["wide-l2"]["l2"] in (0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
    by_pop = s["targets"]["no_model"]["by_population"]
    assert by_pop["cppperf_db_vs_mined"][RULES] is True  # F1 0.75 >= 0.55 at P 0.75 >= 0.6
    json.dumps(rep.as_dict())
