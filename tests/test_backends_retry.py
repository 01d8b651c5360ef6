"""LLM backends: left truncation of over-long prompts (generation header kept), and the HTTP client's retries:
Retry-After honoured, 429 / 5xx retried with jittered exponential backoff, other 4xx not retried."""

from __future__ import annotations

import email.utils
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import routers.backends as backends
from routers.backends import OpenAICompatibleBackend, TransformersBackend, retry_after_seconds


class Server:
    """Replies with the given (status, headers) in turn, then 200."""

    def __init__(self, replies):
        self.replies, self.hits = list(replies), 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.hits += 1
                status, headers = outer.replies.pop(0) if outer.replies else (200, {})
                body = json.dumps({"choices": [{"message": {"content": "fine"}}]} if status == 200 else {"error": "x"}).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def sleeps(monkeypatch):
    waited: list[float] = []
    monkeypatch.setattr(backends.time, "sleep", waited.append)
    return waited


def ask(srv, **kw):
    b = OpenAICompatibleBackend(model="m", base_url=srv.url, timeout=5, **kw)
    return b.generate([[{"role": "user", "content": "q"}]])


def test_retry_after_seconds_is_honoured(sleeps):
    srv = Server([(429, {"Retry-After": "7"}), (503, {"Retry-After": "0.5"})])
    try:
        assert ask(srv, max_retries=3, backoff=0.01) == ["fine"]
    finally:
        srv.close()
    assert srv.hits == 3 and sleeps == [7.0, 0.5]


def test_retry_after_http_date_and_cap(sleeps):
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= retry_after_seconds(when) <= 31
    assert retry_after_seconds("garbage") is None and retry_after_seconds(None) is None
    srv = Server([(429, {"Retry-After": when}), (429, {"Retry-After": "9999"})])
    try:
        ask(srv, max_retries=2, backoff=0.01, max_backoff=10.0)
    finally:
        srv.close()
    assert 9.0 <= sleeps[0] <= 10.0 and sleeps[1] == 10.0


def test_jittered_exponential_backoff_without_retry_after(sleeps):
    srv = Server([(500, {}), (502, {}), (429, {})])
    try:
        assert ask(srv, max_retries=3, backoff=1.0) == ["fine"]
    finally:
        srv.close()
    assert len(sleeps) == 3
    for attempt, s in enumerate(sleeps):
        assert 0.5 * 2 ** attempt <= s <= 1.5 * 2 ** attempt
    delays = {OpenAICompatibleBackend(model="m", backoff=1.0).retry_delay(0) for _ in range(20)}
    assert len(delays) > 1  # jittered, not a fixed schedule


def test_client_errors_are_not_retried(sleeps):
    srv = Server([(400, {"Retry-After": "1"})] * 3)
    try:
        with pytest.raises(RuntimeError, match="failed after 4 attempts"):
            ask(srv, max_retries=3)
    finally:
        srv.close()
    assert srv.hits == 1 and sleeps == []


def test_generate_keeps_the_end_of_an_over_long_prompt(tiny_llama_dir):
    backend = TransformersBackend(model=tiny_llama_dir, device="cpu", max_input_tokens=24)
    model, tok = backend._load()
    seen = {}

    def fake_generate(input_ids=None, attention_mask=None, **kw):
        seen["ids"] = input_ids
        return input_ids

    model.generate = fake_generate
    conv = [{"role": "user", "content": "word " * 200 + "final question?"}]
    backend.generate([conv], max_new_tokens=2)
    full = tok.encode(tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True),
                      add_special_tokens=False)
    assert seen["ids"].shape[1] == 24
    assert seen["ids"][0].tolist() == full[-24:]  # the generation header ("<|im_start|>assistant") survives
