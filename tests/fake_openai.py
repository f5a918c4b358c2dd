"""A local OpenAI-compatible chat-completions server for tests (real HTTP on loopback).

Scriptable: `answer(model, prompt) -> str` decides the reply; `failures` is a list of HTTP
statuses returned (in order) before normal replies; `delay` slows replies; `structured=False`
ignores structured-output requests and returns the raw scripted text (think blocks and all).
Records every request and the highest number of requests in flight at once.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeOpenAI:
    def __init__(self, answer: Callable[[str, str], str]) -> None:
        self.answer = answer
        self.failures: list[int] = []
        self.always_fail: int | None = None
        self.delay = 0.0
        self.structured = True
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server._lock:
                    server.requests.append(body)
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                    status = server.always_fail or (server.failures.pop(0) if server.failures else 200)
                try:
                    time.sleep(server.delay)
                    if status != 200:
                        self.send_response(status)
                        self.end_headers()
                        self.wfile.write(b'{"error": "scripted"}')
                        return
                    prompt = body["messages"][-1]["content"]
                    text = server.answer(body["model"], prompt)
                    choices = (body.get("structured_outputs") or {}).get("choice") or body.get(
                        "guided_choice"
                    )
                    if server.structured and choices:
                        text = next(
                            (c for c in choices if c.lower() in text.lower().split("</think>")[-1].lower()),
                            choices[-1],
                        )
                    payload = {
                        "id": "x",
                        "object": "chat.completion",
                        "model": body["model"],
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": text},
                                "finish_reason": "stop",
                            }
                        ],
                        "usage": {"prompt_tokens": len(prompt) // 4, "completion_tokens": 1},
                    }
                    data = json.dumps(payload).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                finally:
                    with server._lock:
                        server.in_flight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
