"""The engine: building and running C++ for the builder and the evaluator.

Workspaces and tree export, backends (local, docker) behind one `Backend` protocol with sides as
data (`prepare(repo, {"old": sha, "new": sha})`; the evaluator's `old`/`agent`/`expert` are three
sides, a side may be a tree on the host), `build_sides` (stop at the first failure), sandbox and
`limits_for` (one place for test limits and CPU pinning), CMake/CTest discovery and rules, case
splitting, the dependency table, container images, the measurement protocol and its statistics.
Stages orchestrate the engine; they never import each other.
"""
