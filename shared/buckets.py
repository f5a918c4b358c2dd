"""The KV buckets by name, and typed access to the ones whose values are domain Structs.

    REPOS        repos        RepoState        by repo id `owner/name`
    COMMITS      commits      CommitState      by commit id `owner/name@sha`
    INSTANCES    instances    InstanceState    by instance id `owner__name-<sha12>`
    EVALUATIONS  evaluations  EvaluationState  by evaluation id
    PROGRESS     progress     the crawler's resumable search position (JSON)
    CACHE        cache        fetched data by key (JSON: the classifier's and the filter's)
    CLAIMS       claims       build leases and worker heartbeats (shared/claims.py)

`await get(records, REPOS, repo)` is the value as its Struct (None when absent); `put` and
`create` write one. A bucket name is spelled here only: stores provision `NAMES`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Generic, TypeVar

import msgspec

from cppperf.shared.domain import (
    CommitState,
    EvaluationState,
    InstanceState,
    RepoState,
    to_json_dict,
    to_struct,
)
from cppperf.shared.ports import Records

S = TypeVar("S", bound=msgspec.Struct)


@dataclass(frozen=True)
class Bucket(Generic[S]):
    """A KV bucket whose values are one domain Struct (`value`)."""

    name: str
    value: type[S]


REPOS: Final = Bucket("repos", RepoState)
COMMITS: Final = Bucket("commits", CommitState)
INSTANCES: Final = Bucket("instances", InstanceState)
EVALUATIONS: Final = Bucket("evaluations", EvaluationState)
PROGRESS: Final = "progress"
CACHE: Final = "cache"
CLAIMS: Final = "claims"
NAMES: Final = (REPOS.name, COMMITS.name, INSTANCES.name, EVALUATIONS.name, PROGRESS, CACHE, CLAIMS)


async def get(records: Records, bucket: Bucket[S], item_id: str) -> S | None:
    raw = await records.get(bucket.name, item_id)
    return None if raw is None else to_struct(raw, bucket.value)


async def put(records: Records, bucket: Bucket[S], item_id: str, value: S) -> None:
    await records.put(bucket.name, item_id, to_json_dict(value))


async def create(records: Records, bucket: Bucket[S], item_id: str, value: S) -> bool:
    """Write only if absent; False when the item is recorded already."""
    return await records.create(bucket.name, item_id, to_json_dict(value))
