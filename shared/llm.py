"""An OpenAI-compatible chat client for the vote (vLLM's server is the production target).

Each request asks for one label: temperature 0, a fixed seed, a few output tokens, and vLLM's
structured-output choice (`structured_outputs.choice`, and the older `guided_choice`) so the reply
is exactly a label. Replies are still parsed robustly (`<think>` blocks, case, punctuation) for
servers without structured outputs. Bounded concurrency per model (a semaphore) lets the server
batch; retries with exponential backoff on 429/5xx/timeouts; when retries run out the error is
`ServiceUnavailable`, so the bus naks the message (never dropped, never labelled).
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass

import httpx

from cppperf.shared.errors import ServiceUnavailable

_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL | re.IGNORECASE)


def parse_label(text: str, choices: list[str]) -> str | None:
    """The first allowed label in a reply, ignoring think blocks, case and punctuation."""
    cleaned = _THINK.sub(" ", text or "")
    words = re.findall(r"[A-Za-z]+", cleaned)
    lowered = {c.lower(): c for c in choices}
    for w in words:
        if w.lower() in lowered:
            return lowered[w.lower()]
    return None


@dataclass(frozen=True)
class Answer:
    label: str
    latency_ms: float
    prompt_tokens: int
    completion_tokens: int


class ChatClient:
    def __init__(
        self,
        base_url: str,
        *,
        api_key: str = "EMPTY",
        timeout: float = 120.0,
        retries: int = 4,
        max_concurrency: int = 32,
        seed: int = 0,
        backoff: float = 0.5,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self.seed = seed
        self.backoff = backoff
        self._sem = asyncio.Semaphore(max_concurrency)
        self._client = httpx.AsyncClient(
            timeout=timeout, headers={"Authorization": f"Bearer {api_key}"}, transport=transport
        )
        self.calls = 0

    async def close(self) -> None:
        await self._client.aclose()

    async def complete(self, model: str, system: str, prompt: str, *, max_tokens: int = 256) -> str:
        """A free-text answer (no structured output), with the same retries."""
        body: dict[str, object] = {
            "model": model,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": prompt}],
            "temperature": 0,
            "seed": self.seed,
            "max_tokens": max_tokens,
            "chat_template_kwargs": {"enable_thinking": False},
        }
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            async with self._sem:
                try:
                    self.calls += 1
                    resp = await self._client.post(f"{self.base_url}/chat/completions", json=body)
                except httpx.HTTPError as exc:
                    last = f"{type(exc).__name__}: {exc}"
                    continue
            if resp.status_code == 429 or resp.status_code >= 500:
                last = f"HTTP {resp.status_code}"
                continue
            if resp.status_code != 200:
                raise ServiceUnavailable(f"{model}: HTTP {resp.status_code}: {resp.text[:200]}")
            content: str = resp.json()["choices"][0]["message"].get("content") or ""
            return _THINK.sub(" ", content).strip()
        raise ServiceUnavailable(
            f"{model} at {self.base_url}: no answer after {self.retries + 1} attempts ({last})"
        )

    async def ask(self, model: str, system: str, prompt: str, choices: list[str]) -> Answer:
        body = {
            "model": model,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": prompt}],
            "temperature": 0,
            "seed": self.seed,
            "max_tokens": 512,
            "structured_outputs": {"choice": choices},
            "guided_choice": choices,
            "chat_template_kwargs": {"enable_thinking": False},
        }
        last: str = ""
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            async with self._sem:
                t0 = time.perf_counter()
                try:
                    self.calls += 1
                    resp = await self._client.post(f"{self.base_url}/chat/completions", json=body)
                except httpx.HTTPError as exc:
                    last = f"{type(exc).__name__}: {exc}"
                    continue
                latency = (time.perf_counter() - t0) * 1000
            if resp.status_code == 429 or resp.status_code >= 500:
                last = f"HTTP {resp.status_code}"
                retry_after = resp.headers.get("retry-after")
                if retry_after and retry_after.isdigit():
                    await asyncio.sleep(min(float(retry_after), 30.0))
                continue
            if resp.status_code != 200:
                raise ServiceUnavailable(f"{model}: HTTP {resp.status_code}: {resp.text[:200]}")
            data = resp.json()
            content = data["choices"][0]["message"].get("content") or ""
            label = parse_label(content, choices)
            if label is None:
                last = f"unparseable reply {content[:80]!r}"
                continue
            usage = data.get("usage") or {}
            return Answer(
                label, latency, int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
            )
        raise ServiceUnavailable(
            f"{model} at {self.base_url}: no answer after {self.retries + 1} attempts ({last})"
        )
