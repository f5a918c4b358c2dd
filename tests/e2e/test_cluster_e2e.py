"""The deployed topology end to end (bench/cluster_e2e.py, #25 item 7): three NATS nodes from the
shipped configs, each service its own `cppperf serve` process with its own NKey, the demo mined
while the node leading the builder's queue is killed, and an external agent process evaluating
the expert's and an empty patch over the bus. Then every log line, output file and store record
is searched for the run's secrets (NKey seeds, GitHub token, API key; #25 item 4)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from cluster_e2e import Result, run

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.nats,
    pytest.mark.build,
    pytest.mark.timeout(600),
    pytest.mark.stage2,
]


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory: pytest.TempPathFactory) -> Result:
    if not shutil.which("bwrap"):
        pytest.skip("bubblewrap (bwrap) is not installed: the image's builder and evaluator need it")
    return run(tmp_path_factory.mktemp("e2e"), runs=11, eval_runs=5, timeout=420)


def _logs(r: Result) -> dict[str, str]:
    return {p.name: p.read_text(errors="replace") for p in (Path(r.root) / "logs").glob("*.log")}


def test_the_deployed_topology_mines_survives_a_node_and_evaluates(cluster_run: Result) -> None:
    r = cluster_run
    assert set(r.replicas.values()) == {3}, r.replicas  # every stream, KV bucket and the blobs: R=3
    assert r.killed_node.startswith("nats-"), r.killed_while
    [(iid, verdict)] = r.instances.items()
    assert iid.startswith("local__demo-") and verdict == "improved"
    assert (r.funnel["selected"], r.funnel["built"], r.funnel["improved"]) == (1, 1, 1)
    assert r.dead_letters == []
    assert r.agent == {"expert": "opt", "empty": "empty-patch"} and r.agent_exit == 0
    assert r.agent_opt == {"expert": True, "empty": False}
    assert r.service_exits == dict.fromkeys(("crawler", "filter", "classifier", "builder", "evaluator"), 0)
    for name, text in _logs(r).items():
        assert "permissions violation" not in text, name  # each service kept to its own subjects
        if not name.startswith("nats-"):
            assert "Traceback" not in text, (name, text[text.find("Traceback") :][:1500])


def test_no_secret_in_any_log_output_or_record(cluster_run: Result) -> None:
    r = cluster_run
    assert r.control_hits >= 6  # the search finds the seeds where they are (the creds files)
    assert r.github_calls_with_token >= 1  # the token was in the crawler's environment and used
    assert r.searched_files > 20 and (Path(r.root) / "logs" / "store-dump.json").is_file()
    assert r.secret_hits == []
