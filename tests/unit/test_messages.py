"""Message contracts: every subject's type round-trips, tolerates unknown fields, rejects wrong
types, and exposes the stable id docs/design.md defines."""

from __future__ import annotations

import msgspec
import pytest

from cppperf.services.evaluator.pipeline import safe_name
from cppperf.shared import messages as m
from cppperf.shared.errors import BadInput, MalformedMessage

COMMIT = m.CommitSelected(
    repo="fmtlib/fmt",
    url="https://github.com/fmtlib/fmt.git",
    sha="a" * 40,
    parent="b" * 40,
    date="2024-01-01T00:00:00+00:00",
    message="Speed up format_to",
    files=[m.FileChange(path="include/fmt/format.h", added=3, deleted=1)],
    linked=[m.LinkedText(kind="issue", number=12, title="slow", body="it is slow")],
    diff="diff --git a b",
)
SAMPLES: list[msgspec.Struct] = [
    m.RepoCandidate(repo="fmtlib/fmt", url="https://github.com/fmtlib/fmt.git", stars=20000),
    m.RepoFound(repo="fmtlib/fmt", url="x", validated=True, test_count=3),
    COMMIT,
    m.CommitClassified(
        commit=COMMIT,
        label=True,
        backend="openai",
        phase=2,
        votes=[m.Vote(model="q", phase=1, answer="Maybe")],
    ),
    m.PatchBuilt(
        instance_id="fmtlib__fmt-aaaaaaaaaaaa",
        repo="fmtlib/fmt",
        sha="a" * 40,
        parent="b" * 40,
        verdict="improved",
        improved_tests=["t1"],
    ),
    m.EvalRequested(
        request_id="r1", run_id="run", model="gpt", instance_id="fmtlib__fmt-aaaaaaaaaaaa", patch="d"
    ),
    m.EvalCompleted(
        request_id="r1",
        run_id="run",
        model="gpt",
        instance_id="fmtlib__fmt-aaaaaaaaaaaa",
        verdict="opt",
        opt=True,
        report={"speedup": 1.5},
    ),
    m.DeadLetter(
        subject="commit.selected",
        service="classifier",
        error="boom",
        error_type="ValueError",
        attempts=3,
        payload=b"\x00raw",
    ),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda s: type(s).__name__)
def test_round_trip(msg: msgspec.Struct) -> None:
    data = m.encode(msg)
    assert m.decode(data, type(msg)) == msg
    assert msg.schema_version == m.SCHEMA_VERSION  # type: ignore[attr-defined]


def test_every_subject_has_a_type() -> None:
    subjects = {
        m.REPO_CANDIDATE,
        m.REPO_FOUND,
        m.COMMIT_SELECTED,
        m.COMMIT_CLASSIFIED,
        m.PATCH_BUILT,
        m.EVAL_REQUESTED,
        m.EVAL_COMPLETED,
        m.VALIDATE_REQUESTED,
    }
    assert set(m.SUBJECT_TYPES) == subjects


def test_unknown_field_is_tolerated() -> None:
    raw = msgspec.json.decode(m.encode(SAMPLES[1]))
    raw["added_in_v2"] = {"anything": [1, 2]}
    decoded = m.decode(msgspec.json.encode(raw), m.RepoFound)
    assert decoded.repo == "fmtlib/fmt"


def test_wrong_type_is_rejected_as_malformed() -> None:
    raw = msgspec.json.decode(m.encode(SAMPLES[1]))
    raw["test_count"] = "three"
    with pytest.raises(MalformedMessage, match="test_count"):
        m.decode(msgspec.json.encode(raw), m.RepoFound)
    with pytest.raises(MalformedMessage):
        m.decode(b"not json", m.RepoFound)


def test_stable_ids() -> None:
    assert m.msg_id(COMMIT) == "fmtlib/fmt@" + "a" * 40
    assert m.instance_id("fmtlib/fmt", "a" * 40) == "fmtlib__fmt-aaaaaaaaaaaa"
    assert m.msg_id(SAMPLES[5]) == "run/gpt/fmtlib__fmt-aaaaaaaaaaaa"
    assert m.msg_id(SAMPLES[0]) == "fmtlib/fmt"


@pytest.mark.parametrize("iid", ["", ".", "..", "../x", "a/b", "/etc/passwd", "a\0b", "x" * 231, "é" * 116])
def test_an_instance_id_is_one_file_name(iid: str) -> None:
    with pytest.raises(BadInput, match="not an instance id"):
        m.check_instance_id(iid)


@pytest.mark.parametrize(
    "run_id", ["", ".", "..", "_", "_x", "x_", ".x", "x.", "a/b", "a b", "a\0b", "r\u00e9", "x" * 129, "x\n"]
)
def test_a_run_id_that_would_be_renamed_is_refused(run_id: str) -> None:
    """Before: `evaluate --run-id ""` (or `..`, `_x`, `a/b`) ran under another folder name
    (`model`, `x`, `a_b`) without a word."""
    with pytest.raises(BadInput, match="not a run id"):
        m.check_run_id(run_id)


@pytest.mark.parametrize("run_id", ["default", "r1", "demo.v2", "a-b_c.d", "-x", "x-", "7", "x" * 128])
def test_a_run_id_names_its_folder_unchanged(run_id: str) -> None:
    assert m.check_run_id(run_id) == run_id and safe_name(run_id) == run_id


def test_every_instance_id_the_system_makes_is_accepted() -> None:
    longest = m.instance_id("o" * 39 + "/" + "n" * 100, "a" * 40)
    for iid in (m.instance_id("fmtlib/fmt", "a" * 40), m.instance_id("local/..", "b" * 40), longest):
        assert m.check_instance_id(iid) == iid


@pytest.mark.parametrize(
    "repo", ["", "o", "o/", "/r", "o/r/x", "./r", "o/..", "o/r\0", "o\n/r", "o/r\x7f", "o/" + "n" * 215]
)
def test_a_name_no_repository_can_have_is_refused(repo: str) -> None:
    with pytest.raises(BadInput, match="not a repository id"):
        m.check_repo_id(repo)


def test_every_repository_id_the_system_makes_is_accepted() -> None:
    longest = "o" * 39 + "/" + "n" * 100
    for repo in (
        "fmtlib/fmt",
        "local/demo",
        "local/my project",
        "url/0123456789ab",
        longest,
        "o/" + "n" * 214,
    ):
        assert m.check_repo_id(repo) == repo
        m.check_instance_id(m.instance_id(repo, "a" * 40))  # its instance ids name a file


@pytest.mark.parametrize(
    "sha", ["", "HEAD", "a" * 39, "A" * 40, "--output=/tmp/x", "a" * 40 + "\n", "a" * 41]
)
def test_a_sha_that_is_not_a_full_commit_name_is_refused(sha: str) -> None:
    with pytest.raises(BadInput, match="not a commit sha"):
        m.check_sha(sha)


def test_decode_refuses_a_consumed_message_whose_id_no_worker_can_process() -> None:
    good = m.RepoFound(repo="o/r", url="/src/r")
    assert m.decode(m.encode(good), m.RepoFound) == good
    with pytest.raises(MalformedMessage, match=r"RepoFound\.repo: not a repository id: 'o/r\\x00'"):
        m.decode(m.encode(m.RepoFound(repo="o/r\0", url="/src/r")), m.RepoFound)
