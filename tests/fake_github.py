"""A local HTTP server speaking the GitHub REST shapes githubkit expects (real HTTP on loopback):
`/search/repositories` (qualifiers `stars:a..b`, `stars:>=n`, `created:a..b`, `fork:`, `archived:`;
total_count, per_page/page paging, the 1,000-result cap), `/repos/{o}/{r}/git/trees/{ref}`,
`/repos/{o}/{r}/issues/{n}`, rate-limit headers, and scripted 403/429 answers.
"""

from __future__ import annotations

import json
import re
import threading
import time
from datetime import date, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse


def make_repos(n: int, seed: int = 1) -> list[dict[str, Any]]:
    import random

    rng = random.Random(seed)
    repos = []
    for i in range(n):
        created = date(2010, 1, 1) + timedelta(days=rng.randrange(0, 5000))
        repos.append(
            {
                "id": i,
                "full_name": f"org{i % 97}/repo{i}",
                "name": f"repo{i}",
                "clone_url": f"https://github.example/org{i % 97}/repo{i}.git",
                "stargazers_count": int(300 + rng.paretovariate(1.2) * 50) % 60000,
                "created_at": created.isoformat() + "T00:00:00Z",
                "language": "C++",
                "fork": False,
                "archived": False,
                "default_branch": "main",
            }
        )
    for r in repos:
        r["stargazers_count"] = max(r["stargazers_count"], 300)
    return repos


class FakeGitHub:
    def __init__(self, repos: list[dict[str, Any]]) -> None:
        self.repos = repos
        self.trees: dict[str, list[str]] = {}
        self.issues: dict[tuple[str, int], dict[str, Any]] = {}
        self.scripted: list[tuple[int, dict[str, str], dict[str, Any]]] = []  # status, headers, body
        self.remaining_zero_once = False
        self.requests: list[tuple[str, str | None]] = []  # (path+query, Authorization)
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                with server._lock:
                    server.requests.append((self.path, self.headers.get("Authorization")))
                    scripted = server.scripted.pop(0) if server.scripted else None
                    zero = server.remaining_zero_once
                    server.remaining_zero_once = False
                if scripted:
                    self._send(scripted[0], scripted[2], scripted[1])
                    return
                url = urlparse(self.path)
                qs = {k: v[0] for k, v in parse_qs(url.query).items()}
                rl = {
                    "x-ratelimit-limit": "30",
                    "x-ratelimit-remaining": "0" if zero else "29",
                    "x-ratelimit-reset": str(int(time.time()) + 20),
                }
                if url.path == "/search/repositories":
                    status, body = server.search(qs)
                    self._send(status, body, rl)
                    return
                m = re.fullmatch(r"/repos/([^/]+/[^/]+)/git/trees/([^/]+)", url.path)
                if m:
                    paths = server.trees.get(m.group(1))
                    if paths is None:
                        self._send(404, {"message": "Not Found"})
                    else:
                        self._send(
                            200,
                            {
                                "sha": "x",
                                "truncated": False,
                                "tree": [{"path": p, "type": "blob", "mode": "100644"} for p in paths],
                            },
                            rl,
                        )
                    return
                m = re.fullmatch(r"/repos/([^/]+/[^/]+)/issues/(\d+)", url.path)
                if m:
                    issue = server.issues.get((m.group(1), int(m.group(2))))
                    if issue is None:
                        self._send(404, {"message": "Not Found"})
                    else:
                        self._send(200, issue, rl)
                    return
                self._send(404, {"message": "Not Found"})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def search(self, qs: dict[str, str]) -> tuple[int, dict[str, Any]]:
        q = qs.get("q", "")
        per_page = int(qs.get("per_page", 30))
        page = int(qs.get("page", 1))
        if page * per_page > 1000 and (page - 1) * per_page >= 1000:
            return 422, {"message": "Only the first 1000 search results are available"}
        lo, hi = 0, 10**9
        if m := re.search(r"stars:(\d+)\.\.(\d+)", q):
            lo, hi = int(m.group(1)), int(m.group(2))
        elif m := re.search(r"stars:>=(\d+)", q):
            lo = int(m.group(1))
        c_from, c_to = "0000", "9999"
        if m := re.search(r"created:(\S+)\.\.(\S+)", q):
            c_from, c_to = m.group(1), m.group(2)
        hits = [
            r
            for r in self.repos
            if lo <= r["stargazers_count"] <= hi and c_from <= r["created_at"][:10] <= c_to
        ]
        hits.sort(key=lambda r: (-r["stargazers_count"], r["id"]))
        start = (page - 1) * per_page
        return 200, {
            "total_count": len(hits),
            "incomplete_results": False,
            "items": hits[start : min(start + per_page, 1000)],
        }

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> FakeGitHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
