"""The cppperf exception tree.

    CppPerfError
    ├── ConfigError              a setting has an invalid value (names the key)
    ├── BadInput                 permanent: the message or item can never succeed -> dead letter now
    │   ├── MalformedMessage     payload did not decode into the subject's schema
    │   │   └── UnsupportedSchema  a `schema_version` whose major this worker does not read
    │   ├── RepoRejected         a repository fails a static check (reason recorded)
    │   └── PatchRejected        an agent's patch fails a safety/shape check (reason recorded)
    ├── TransientError           may succeed later -> nak with delay, dead letter after max_deliver
    │   ├── ServiceUnavailable   a collaborator (LLM server, GitHub, engine) is down or rate limited
    │   └── InfraFailure         the machine failed us (OOM, disk, engine) -- never a patch verdict
    ├── ToolMissing              a required binary (nats-server, git, cmake) is not installed
    ├── NotProvisioned           a stream or bucket is missing on a bus the admin provisions
    └── StoreInUse               another cppperf process runs the embedded NATS on this store

A *verdict* about a patch (rejected build, failing test, no speed-up) is a value, not an exception:
runners return results; exceptions are kept for infrastructure and bad input.
"""

from __future__ import annotations


class CppPerfError(Exception):
    """Base of every error cppperf raises on purpose."""


class ConfigError(CppPerfError):
    """A setting has an invalid value."""


class BadInput(CppPerfError):
    """Permanent failure: retrying the same input cannot succeed."""


class MalformedMessage(BadInput):
    """A bus payload could not be decoded into its subject's schema."""


class UnsupportedSchema(MalformedMessage):
    """A message carries a `schema_version` major this worker cannot read."""


class RepoRejected(BadInput):
    """A repository fails a static check."""


class PatchRejected(BadInput):
    """An agent's patch fails a shape or safety check."""


class TransientError(CppPerfError):
    """May succeed on a later attempt."""


class ServiceUnavailable(TransientError):
    """A collaborator (LLM server, GitHub, container engine) is down or rate limited."""


class InfraFailure(TransientError):
    """The machine failed (OOM, disk full, engine error); says nothing about the patch."""


class ToolMissing(CppPerfError):
    """A required external program is not installed."""


class StoreInUse(CppPerfError):
    """Another process already runs the embedded nats-server on this store directory."""


class NotProvisioned(CppPerfError):
    """A stream, KV bucket or the object store is missing (or the bus refused to say) on a bus
    whose streams only the admin creates: `cppperf bus provision` with the admin credentials."""
