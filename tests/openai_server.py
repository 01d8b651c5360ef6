"""A tiny deterministic OpenAI-compatible ``/v1/chat/completions`` server, run as a separate process by tests.

    python tests/openai_server.py [--port 0] [--delay 0.2] [--fail-substring TEXT]

Prints ``PORT <n>`` once listening (port 0 = a free port chosen by the OS). Replies, by prompt kind:

* judge prompt (``Reference Answer:``): ``yes`` if the normalized reference occurs in the prediction, else ``no``;
* memory-agent prompt (``Memory block (steps A to B)``): ``NONE`` if the block has no line sharing a
  word of 3+ letters with the question, else ``facts A..B: <that first matching line>``;
* anything else (an answer prompt): the first line after ``Memory:``.

A user message containing ``--fail-substring`` gets HTTP 500 every time. ``GET /stats`` returns
``{"requests": n, "max_in_flight": m}`` (m > 1 proves requests arrived concurrently).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STATE = {"requests": 0, "in_flight": 0, "max_in_flight": 0}
LOCK = threading.Lock()


def _norm(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def reply_for(content: str) -> str:
    if "Reference Answer:" in content:
        ref = re.search(r"Reference Answer: (.*)\n", content).group(1)
        pred = re.search(r"Predicted Answer: (.*)\n", content).group(1)
        return "yes" if _norm(ref) and _norm(ref) in _norm(pred) else "no"
    m = re.match(r"Memory block \(steps (\S+) to (\S+)\):\n(.*?)\n\nQuestion: (.*?)\n", content, re.S)
    if m:
        words = {w for w in re.findall(r"[a-z]+", m.group(4).lower()) if len(w) >= 3}
        for line in m.group(3).splitlines():
            if words & set(re.findall(r"[a-z]+", line.lower())):
                return f"facts {m.group(1)}..{m.group(2)}: {line}"
        return "NONE"
    if "Memory:\n" in content:
        return content.split("Memory:\n", 1)[1].split("\n", 1)[0]
    return "ok"


def make_handler(delay: float, fail_substring: str | None):
    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, payload: dict):
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path.rstrip("/").endswith("/stats"):
                with LOCK:
                    self._send(200, {"requests": STATE["requests"], "max_in_flight": STATE["max_in_flight"]})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with LOCK:
                STATE["requests"] += 1
                STATE["in_flight"] += 1
                STATE["max_in_flight"] = max(STATE["max_in_flight"], STATE["in_flight"])
            try:
                if delay:
                    time.sleep(delay)
                content = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
                if fail_substring and fail_substring in content:
                    self._send(500, {"error": "injected failure"})
                    return
                self._send(200, {"object": "chat.completion", "model": body.get("model"),
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": reply_for(content)}}]})
            finally:
                with LOCK:
                    STATE["in_flight"] -= 1

        def log_message(self, *args):
            pass

    return Handler


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--fail-substring", default=None)
    args = parser.parse_args(argv)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(args.delay, args.fail_substring))
    print(f"PORT {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    sys.exit(main())
