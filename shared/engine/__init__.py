"""The engine: building and running C++ for the builder and the evaluator.

Workspaces and tree export, backends (local, docker), sandbox and limits, CMake/CTest discovery and
rules, case splitting, the dependency table, container images, the measurement protocol and its
statistics. Stages orchestrate the engine; they never import each other.
"""
