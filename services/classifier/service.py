"""The classifier stage's plain logic: prefilter, then the configured backend, with a cache.

Cache key: (backend, models, prompt version, commit id); a re-run never asks again.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgspec

from cppperf.services.classifier import prompts
from cppperf.services.classifier.cascade import gate
from cppperf.services.classifier.heuristic import score_commit
from cppperf.services.classifier.prefilter import prefilter
from cppperf.services.classifier.scorer import Model, load_model
from cppperf.services.classifier.vote import Asker, two_phase
from cppperf.shared.errors import ConfigError
from cppperf.shared.llm import Answer, ChatClient
from cppperf.shared.messages import CommitClassified, CommitSelected
from cppperf.shared.settings import ClassifierSettings


class Cache(Protocol):
    async def get(self, key: str) -> dict[str, Any] | None: ...
    async def put(self, key: str, value: dict[str, Any]) -> None: ...


@dataclass
class MemoryCache:
    data: dict[str, dict[str, Any]] = field(default_factory=dict)

    async def get(self, key: str) -> dict[str, Any] | None:
        return self.data.get(key)

    async def put(self, key: str, value: dict[str, Any]) -> None:
        self.data[key] = value


def linked_text(commit: CommitSelected) -> str:
    return "\n\n".join(
        f"#{lt.number} {lt.title}\n{lt.body}".strip() for lt in commit.linked if lt.title or lt.body
    )


class MultiServerAsker:
    """Routes each model to its server: `base_urls[i]` for `models[i]`, or one server for all."""

    def __init__(self, settings: ClassifierSettings, **client_kwargs: Any) -> None:
        urls = settings.base_urls or ["http://127.0.0.1:8000/v1"]
        self.clients: dict[str, ChatClient] = {}
        by_url: dict[str, ChatClient] = {}
        for i, model in enumerate(settings.models):
            url = urls[i] if i < len(urls) else urls[0]
            if url not in by_url:
                by_url[url] = ChatClient(
                    url,
                    api_key=settings.api_key,
                    timeout=settings.timeout,
                    retries=settings.retries,
                    max_concurrency=settings.max_concurrency,
                    seed=settings.seed,
                    **client_kwargs,
                )
            self.clients[model] = by_url[url]

    @property
    def calls(self) -> int:
        return sum(c.calls for c in set(self.clients.values()))

    async def ask(self, model: str, system: str, prompt: str, choices: list[str]) -> Answer:
        return await self.clients[model].ask(model, system, prompt, choices)

    async def close(self) -> None:
        for c in set(self.clients.values()):
            await c.close()


class VllmAsker:
    """In-process vLLM engines (extra `[gpu]`), one per model, loaded lazily on first use."""

    def __init__(self, settings: ClassifierSettings) -> None:
        try:
            import vllm
        except ImportError as exc:
            raise ConfigError(
                "classifier.backend=vllm needs the GPU extra: pip install 'cppperf[gpu]' "
                "(or use backend=openai against a vLLM server)"
            ) from exc
        self._vllm: Any = vllm
        self._engines: dict[str, Any] = {}
        self.settings = settings
        self.calls = 0
        self._lock = threading.Lock()

    async def ask(self, model: str, system: str, prompt: str, choices: list[str]) -> Answer:
        """Off the event loop (loading and generating take seconds to minutes: heartbeats go on)."""
        return await asyncio.to_thread(self._ask_blocking, model, system, prompt, choices)

    def _ask_blocking(self, model: str, system: str, prompt: str, choices: list[str]) -> Answer:
        with self._lock:  # one generation at a time per engine set
            return self._generate(model, system, prompt, choices)

    def _generate(self, model: str, system: str, prompt: str, choices: list[str]) -> Answer:
        vllm = self._vllm
        if model not in self._engines:
            self._engines[model] = vllm.LLM(model=model, seed=self.settings.seed)
        params = vllm.SamplingParams(
            temperature=0,
            max_tokens=16,
            seed=self.settings.seed,
            structured_outputs=vllm.sampling_params.StructuredOutputsParams(choice=choices),
        )
        t0 = time.perf_counter()
        self.calls += 1
        out = self._engines[model].chat(
            [{"role": "system", "content": system}, {"role": "user", "content": prompt}], params
        )
        text = out[0].outputs[0].text.strip()
        return Answer(
            text if text in choices else choices[-1],
            (time.perf_counter() - t0) * 1000,
            len(out[0].prompt_token_ids),
            len(out[0].outputs[0].token_ids),
        )

    async def close(self) -> None:
        self._engines.clear()


@dataclass
class Classifier:
    settings: ClassifierSettings
    cache: Cache
    asker: Asker | None = None
    llm_calls: int = 0
    cache_hits: int = 0
    gated: int = 0  # commits the cascade answered without an LLM call
    _scorer: Model | None = None

    @property
    def scorer(self) -> Model:
        """The trained scorer (`model_path`, else the shipped model), loaded on first use."""
        if self._scorer is None:
            path = self.settings.model_path
            try:
                self._scorer = load_model(Path(path) if path else None)
            except (OSError, ValueError, KeyError) as exc:
                raise ConfigError(
                    f"classifier.model_path: cannot load {path or 'the shipped model'}: {exc}"
                ) from exc
        return self._scorer

    @property
    def gate_threshold(self) -> float:
        t = self.settings.cascade_threshold
        return self.scorer.gate_threshold if t is None else t

    def uses_cascade(self) -> bool:
        return self.settings.cascade and self.settings.backend in ("openai", "vllm")

    @classmethod
    def create(
        cls, settings: ClassifierSettings, cache: Cache | None = None, **client_kwargs: Any
    ) -> Classifier:
        asker: Asker | None = None
        if settings.backend == "openai":
            asker = MultiServerAsker(settings, **client_kwargs)
        elif settings.backend == "vllm":
            asker = VllmAsker(settings)
        clf = cls(settings, cache or MemoryCache(), asker)
        if clf.uses_cascade() or settings.backend == "model":
            _ = clf.scorer  # a bad `model_path` fails at start, not on the first commit
        return clf

    def cache_key(self, commit_id: str) -> str:
        backend = self.settings.backend
        if backend == "heuristic":
            models = "rules"
        elif backend == "model":
            models = f"model-{self.scorer.digest}"
        else:
            models = "+".join(self.settings.models)
        return f"{self.settings.backend}/{models}/{prompts.PROMPT_VERSION}/{commit_id}"

    async def classify(
        self, commit: CommitSelected, diff: str, *, resolve_diff: Callable[[], Awaitable[str]] | None = None
    ) -> CommitClassified:
        s = self.settings
        if s.prefilter:
            pf = prefilter(commit.message, diff)
            if not pf.keep:
                return CommitClassified(
                    commit=commit,
                    label=False,
                    backend="prefilter",
                    phase=0,
                    evidence=[pf.reason],
                    prompt_version=prompts.PROMPT_VERSION,
                )
        issues = linked_text(commit)
        if self.uses_cascade():
            g = gate(
                self.scorer,
                self.gate_threshold,
                commit.message,
                issues,
                diff,
                heuristic_threshold=s.heuristic_threshold,
            )
            if not g.passed:
                self.gated += 1
                return CommitClassified(
                    commit=commit,
                    label=False,
                    backend="cascade",
                    phase=0,
                    score=round(g.probability, 4),
                    evidence=g.evidence,
                    prompt_version=f"model-{self.scorer.digest}",
                )
        key = self.cache_key(commit.id)
        cached = await self.cache.get(key)
        if cached is not None:
            self.cache_hits += 1
            restored = msgspec.convert({**cached, "commit": msgspec.to_builtins(commit)}, CommitClassified)
            return msgspec.structs.replace(restored, commit=commit)
        if s.backend == "heuristic":
            h = score_commit(commit.message, issues, diff, threshold=s.heuristic_threshold)
            result = CommitClassified(
                commit=commit,
                label=h.label,
                backend="heuristic",
                phase=0,
                score=h.score,
                evidence=h.evidence,
                prompt_version="rules-1",
            )
        elif s.backend == "model":
            p = self.scorer.probability(commit.message, issues, diff)
            result = CommitClassified(
                commit=commit,
                label=p >= self.scorer.label_threshold,
                backend="model",
                phase=0,
                score=round(p, 4),
                evidence=self.scorer.explain(commit.message, issues, diff),
                prompt_version=f"model-{self.scorer.digest}",
            )
        else:
            assert self.asker is not None
            v = await two_phase(
                self.asker,
                s.models,
                message=commit.message,
                issues=issues,
                diff=diff,
                phase2_model=s.phase2_model,
                diff_budget=s.diff_token_budget,
            )
            self.llm_calls += len(v.votes)
            result = CommitClassified(
                commit=commit,
                label=v.label,
                backend=s.backend,
                phase=v.phase,
                votes=v.votes,
                prompt_version=prompts.PROMPT_VERSION,
            )
        stored = msgspec.to_builtins(result)
        stored.pop("commit", None)
        await self.cache.put(key, stored)
        return result

    async def close(self) -> None:
        close = getattr(self.asker, "close", None)
        if close is not None:
            await close()
