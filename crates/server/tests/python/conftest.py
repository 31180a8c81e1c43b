"""Shared fixtures: the server under test comes from the environment.

REDLITE_BASE_URL  e.g. http://127.0.0.1:8080/v1 (required)
REDLITE_API_KEY   the server's --api-key (tests also check 401 with it)
REDLITE_SERVER_PID  the server's process id, to read its VmRSS (optional)
"""

import json
import os
import urllib.error
import urllib.request

import openai
import pytest

BASE_URL = os.environ.get("REDLITE_BASE_URL", "")
API_KEY = os.environ.get("REDLITE_API_KEY", "sk-anything")

if not BASE_URL:
    pytest.skip("REDLITE_BASE_URL is not set: start `redlite serve` and point it there",
                allow_module_level=True)


@pytest.fixture(scope="session")
def client() -> openai.OpenAI:
    return openai.OpenAI(base_url=BASE_URL, api_key=API_KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="session")
def model_id(client) -> str:
    return client.models.list().data[0].id


def raw(method: str, path: str, body: bytes | None = None, key: str | None = API_KEY,
        content_type: str = "application/json"):
    """One HTTP request without the client: (status, headers, body bytes)."""
    root = BASE_URL.rsplit("/v1", 1)[0]
    req = urllib.request.Request(root + path, data=body, method=method)
    if body is not None:
        req.add_header("Content-Type", content_type)
    if key is not None:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def error_of(body: bytes) -> dict:
    """The `error` object of an OpenAI error body, with its four keys checked."""
    err = json.loads(body)["error"]
    assert set(err) >= {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    return err


def vm_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")
