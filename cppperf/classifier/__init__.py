"""The classifier's offline tooling, used by `cppperf classify` only (the service never imports it):
`corpus` (labelled and CppPerf-DB commits, mined negatives), `crossval` (grouped cross-validation
of every scorer), `quality` (precision/recall on a labelled set), `cost` (tokens and dollars per
commit)."""
