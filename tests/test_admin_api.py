"""The REST admin API, driven over HTTP against real servers: `drafter serve` in process
(the uvicorn server on the same loop as gRPC) and as a subprocess; drafts through the
real gRPC client (verifier_client)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn
from service_support import VOCAB, LoopThread, Subprocess, config

from drafter_service.admin.admin_jobs import AdminJobs
from drafter_service.admin.body_limit import BodyLimit
from drafter_service.admin.http_errors import AdminError
from drafter_service.admin.http_server import AdminServer
from drafter_service.admin.schemas import JobInfo
from drafter_service.datastore.sub_indices import Datastore
from drafter_service.service import DrafterServer, ServeConfig
from drafter_service.serving import drafter_server, start_server
from drafter_service.snapshot.store import TokenizerIdentity, write_snapshot
from verifier_client import BudgetRule, DrafterClient

TOKEN = "test-admin-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WRONG = {"Authorization": "Bearer not-the-token-0123456789abcdef"}
WORDS = [f"w{i}" for i in range(40)]

# A corpus continuation that nothing else in the tests contains.
CORPUS_DOC = [900, 901, 902, 903, 904, 905, 906, 907, 908, 909]
PROMPTS = {"a": [11, 12, 13, 14], "b": [21, 22, 23], "c": [31, 32]}
BEFORE_DOCS = [[11, 12, 13, 14, 15, 16, 17, 18], [21, 22, 23, 24, 25, 26], [31, 32, 33, 34, 35]]
AFTER_DOCS = [[11, 12, 13, 14, 50, 51, 52] * 3, [21, 22, 23, 60, 61, 62] * 3, [31, 32, 70] * 4]


class Admin:
    """An in-process server with its admin API, and an HTTP client for it."""

    def __init__(self, loop: LoopThread, server: DrafterServer) -> None:
        self.loop = loop
        self.server = server
        assert server.admin_port is not None
        self.base = f"http://127.0.0.1:{server.admin_port}"
        self.http = httpx.Client(base_url=self.base, timeout=30)

    def wait_job(self, response: httpx.Response, timeout_s: float = 60) -> dict[str, Any]:
        assert response.status_code == 202, response.text
        job = response.json()
        assert response.headers["location"] == f"/v1/jobs/{job['id']}"
        deadline = time.monotonic() + timeout_s
        while job["state"] in ("queued", "running"):
            assert time.monotonic() < deadline, job
            time.sleep(0.02)
            job = self.http.get(f"/v1/jobs/{job['id']}", headers=AUTH).json()
        return dict(job)

    def drafts(self, prompts: dict[str, list[int]] = PROMPTS) -> dict[str, Any]:
        """Fresh requests through the real client: one step each, trees as lists."""
        with DrafterClient(
            self.server.address, deadline_ms=10_000, mode="unary", budget=BudgetRule.fixed(12)
        ) as client:
            client.wait_ready()
            for request_id, prompt in prompts.items():
                client.add_request(request_id, prompt)
            result = client.step({request_id: [] for request_id in prompts})
            out = {}
            for request_id in prompts:
                tree = result[request_id]
                assert tree is not None, request_id
                out[request_id] = (
                    tree.tokens.tolist(),
                    tree.parents.tolist(),
                    [round(s, 6) for s in tree.scores.tolist()],
                )
                client.abort(request_id)
            return out

    def ingest(self, docs: list[list[int]]) -> None:
        with DrafterClient(self.server.address, deadline_ms=10_000, mode="unary") as client:
            client.wait_ready()
            assert client.ingest(docs)
            assert client.flush(10)
        job = self.wait_job(self.http.post("/v1/datastores/default/rebuild", headers=AUTH))
        assert job["state"] == "succeeded", job

    def close(self) -> None:
        self.http.close()
        self.loop.run(self.server.stop(0))


def word_tokenizer(path: Path) -> Path:
    """A real tokenizer.json (word level, whitespace split) with ids 0..len(WORDS)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


@pytest.fixture
def corpora_dir(tmp_path: Path) -> Path:
    root = tmp_path / "corpora"
    (root / "sub").mkdir(parents=True)
    lines = [json.dumps({"prompt_ids": [1, 2], "output_ids": CORPUS_DOC})]
    (root / "ids.jsonl").write_text("\n".join(lines) + "\n")
    np.save(root / "sub" / "ids.npy", np.array([*CORPUS_DOC, -1, 5, 6, 7], dtype=np.int64))
    (root / "words.txt").write_text("w1 w2 w3 w4 w5 w6 w7 w8 w9 w10\n")
    outside = tmp_path / "outside.jsonl"
    outside.write_text(lines[0] + "\n")
    (root / "escape.jsonl").symlink_to(outside)
    (root / "inside-link.jsonl").symlink_to(root / "ids.jsonl")
    return root


def start(loop: LoopThread, cfg: ServeConfig) -> Admin:
    return Admin(loop, loop.run(start_server(cfg)))


def server_config(tmp_path: Path, corpora: Path, **overrides: Any) -> ServeConfig:
    """A token, a corpora directory, a tokenizer, a read-only datastore "ro"; no
    background maintenance (rebuilds and snapshots happen when a test asks)."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    tokenizer = word_tokenizer(tmp_path / "tok" / "tokenizer.json")
    readonly = tmp_path / "readonly-snapshot"
    if not readonly.exists():
        identity = TokenizerIdentity.from_file(tokenizer, vocab_size=VOCAB)
        write_snapshot(readonly, Datastore.from_documents([[1, 2, 3, 4]], VOCAB), identity)
    settings: dict[str, Any] = dict(
        admin_token_file=token_file,
        corpora_dir=corpora,
        tokenizer=tokenizer,
        rebuild_interval_s=3600,
        rebuild_min_tokens=10**6,
        rebuild_max_share=0,
        snapshot_interval_s=0,
        datastores=(("ro", readonly),),
    )
    settings.update(overrides)
    return config(tmp_path / "data", **settings)


@pytest.fixture
def admin(loop_thread: LoopThread, tmp_path: Path, corpora_dir: Path) -> Iterator[Admin]:
    running = start(loop_thread, server_config(tmp_path, corpora_dir))
    yield running
    running.close()


# -- probes and reads ------------------------------------------------------------------


def test_probes_are_public_and_reads_need_the_token(admin: Admin) -> None:
    http = admin.http
    assert http.get("/healthz").json() == {"status": "ok"}
    assert http.get("/readyz").json() == {"status": "ok"}
    assert http.get("/openapi.json").json()["info"]["title"] == "drafter admin"
    assert "swagger" in http.get("/docs").text.lower()
    for headers in ({}, WRONG, {"Authorization": TOKEN}, {"Authorization": "Basic abc"}):
        r = http.get("/v1/datastores", headers=headers)
        assert r.status_code == 401, r.text
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert r.json()["error"]["code"] == "unauthenticated"
    r = http.get("/v1/datastores", headers=AUTH)
    assert r.status_code == 200
    names = [d["name"] for d in r.json()["datastores"]]
    assert names == ["default", "ro"]


class _PageUrls(HTMLParser):
    """The URLs an HTML page makes the browser load (src, href)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [value for name, value in attrs if name in ("src", "href") and value]


def test_docs_render_with_no_network(admin: Admin) -> None:
    """/docs is Swagger UI served whole by the admin server (an air-gapped cluster reaches
    no CDN): every script, stylesheet and icon the page loads, and the schema it reads,
    are local URLs that answer 200 without the token, as a browser asks for them."""
    page = admin.http.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "://" not in page.text, "the page names an absolute URL"
    parser = _PageUrls()
    parser.feed(page.text)
    names = {url.rsplit("/", 1)[-1] for url in parser.urls}
    assert {"swagger-ui-bundle.js", "swagger-ui.css"} <= names, parser.urls
    kinds = {".js": "javascript", ".css": "text/css", ".png": "image/"}
    for url in parser.urls:
        assert url.startswith("/") and not url.startswith("//"), url
        asset = admin.http.get(url)
        assert asset.status_code == 200 and asset.content, url
        kind = next(k for suffix, k in kinds.items() if url.endswith(suffix))
        assert kind in asset.headers["content-type"], (url, asset.headers["content-type"])
    schema_url = re.search(r"url: '([^']+)'", page.text)
    assert schema_url is not None and schema_url.group(1) == "/openapi.json"
    schema = admin.http.get(schema_url.group(1)).json()
    # FastAPI writes OpenAPI 3.1, which Swagger UI renders from version 5 on (4.x shows
    # "Unable to render this definition"): the bundle served must know 3.1.
    assert schema["openapi"].startswith("3.1")
    assert "isOAS31" in admin.http.get(next(u for u in parser.urls if u.endswith(".js"))).text
    # the assets' prefix is no way around the token (the server decodes %2e to ".")
    assert admin.http.get("/docs/assets/%2e%2e/v1/datastores").status_code == 401


def test_datastore_stats(admin: Admin) -> None:
    http = admin.http
    admin.ingest([[5, 6, 7, 8]])
    d = http.get("/v1/datastores/default", headers=AUTH).json()
    assert d["live"] is True and d["num_tokens"] == 4 and d["sub_indices"] == 1
    assert d["live_state"]["rebuilds"] == 1 and d["live_state"]["wal_position"] == 1
    assert d["live_state"]["pending_tokens"] == 0 and d["active_requests"] == 0
    ro = http.get("/v1/datastores/ro", headers=AUTH).json()
    assert ro["live"] is False and ro["num_tokens"] == 4 and ro["live_state"] is None
    listed = {d["name"]: d for d in http.get("/v1/datastores", headers=AUTH).json()["datastores"]}
    assert listed["default"]["num_tokens"] == 4
    r = http.get("/v1/datastores/nope", headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = http.get("/v1/datastores/-bad", headers=AUTH)
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"


def test_readyz_is_503_until_the_datastores_are_loaded(
    loop_thread: LoopThread, tmp_path: Path, corpora_dir: Path
) -> None:
    server = drafter_server(server_config(tmp_path, corpora_dir))
    loop_thread.run(server.listen())  # serving, datastores not loaded yet
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.admin_port}") as http:
            assert http.get("/healthz").json() == {"status": "loading"}
            r = http.get("/readyz")
            assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable"
            assert http.get("/v1/datastores", headers=AUTH).status_code == 503
            r = http.post("/v1/datastores/default/rebuild", headers=AUTH)
            assert r.status_code == 503
            loop_thread.run(server.load())
            assert http.get("/readyz").status_code == 200
    finally:
        loop_thread.run(server.stop(0))


# -- authentication ----------------------------------------------------------------------


def mutating_routes(schema: dict[str, Any]) -> list[tuple[str, str]]:
    """(method, concrete path) of every state-changing operation in the schema."""
    values = {"name": "default", "snapshot": "snap1", "corpus": "corpus1", "job_id": "job-1"}
    routes = []
    for path, operations in schema["paths"].items():
        for method in operations:
            if method.upper() not in ("GET", "HEAD", "OPTIONS"):
                routes.append((method.upper(), path.format(**values)))
    return sorted(routes)


MUTATING = [
    ("POST", "/v1/datastores/default/rebuild"),
    ("PATCH", "/v1/datastores/default/settings"),
    ("POST", "/v1/datastores/default/snapshots"),
    ("DELETE", "/v1/datastores/default/snapshots/snap1"),
    ("POST", "/v1/datastores/default/snapshots/snap1/restore"),
    ("POST", "/v1/datastores/default/corpora"),
    ("DELETE", "/v1/datastores/default/corpora/corpus1"),
]


def test_the_mutating_routes_listed_here_are_all_of_them(admin: Admin) -> None:
    served = admin.http.get("/openapi.json").json()
    assert mutating_routes(served) == sorted(MUTATING)


def test_mutating_calls_need_the_right_token(admin: Admin) -> None:
    """Each mutating route (one server: a refused call changes nothing)."""
    before = admin.http.get("/v1/datastores/default", headers=AUTH).json()
    body = {"name": "x", "path": "ids.jsonl", "kind": "token-ids"}
    bad = ({}, WRONG, {"Authorization": f"Bearer {TOKEN[:-1]}"}, {"X-Token": TOKEN})
    for (method, path), headers in itertools.product(MUTATING, bad):
        r = admin.http.request(method, path, headers=headers, json=body)
        assert r.status_code == 401, (method, path, headers, r.text)
        assert r.headers["www-authenticate"] == 'Bearer realm="drafter-admin"'
        assert r.json() == {
            "error": {"code": "unauthenticated", "message": r.json()["error"]["message"]}
        }
    assert admin.http.get("/v1/jobs", headers=AUTH).json() == {"jobs": []}
    assert admin.http.get("/v1/datastores/default", headers=AUTH).json() == before


@pytest.fixture
def tokenless(loop_thread: LoopThread, tmp_path: Path, corpora_dir: Path) -> Iterator[Admin]:
    running = start(loop_thread, server_config(tmp_path, corpora_dir, admin_token_file=None))
    yield running
    running.close()


def test_without_a_configured_token_mutating_calls_are_refused(tokenless: Admin) -> None:
    for (method, path), headers in itertools.product(MUTATING, ({}, AUTH)):
        r = tokenless.http.request(method, path, headers=headers, json={})
        assert r.status_code == 403, (method, path, r.text)
        assert "--admin-token-file" in r.json()["error"]["message"]
        assert "DRAFTER_ADMIN_TOKEN" in r.json()["error"]["message"]
    # Reads stay open without a token (there is none to present).
    assert tokenless.http.get("/v1/datastores/default").status_code == 200
    assert tokenless.http.get("/v1/jobs").json() == {"jobs": []}


def test_bad_token_settings_fail_the_start(tmp_path: Path) -> None:
    from drafter_service.service.admin_token import load_token

    short = tmp_path / "short"
    short.write_text("abc\n")
    with pytest.raises(ValueError, match="at least 16"):
        load_token(short, {})
    with pytest.raises(ValueError, match="cannot read"):
        load_token(tmp_path / "missing", {})
    assert load_token(None, {"DRAFTER_ADMIN_TOKEN": f" {TOKEN} "}) == TOKEN
    assert load_token(None, {}) is None


# -- snapshots ---------------------------------------------------------------------------


def test_a_snapshot_restored_over_rest_gives_identical_drafts(
    loop_thread: LoopThread, tmp_path: Path, corpora_dir: Path
) -> None:
    cfg = server_config(tmp_path, corpora_dir)
    admin = start(loop_thread, cfg)
    try:
        http = admin.http
        admin.ingest(BEFORE_DOCS)
        before = admin.drafts()
        assert all(tree[0] for tree in before.values())  # the datastore drafts something
        job = admin.wait_job(
            http.post("/v1/datastores/default/snapshots", headers=AUTH, json={"name": "before"})
        )
        assert job["state"] == "succeeded", job
        assert job["kind"] == "snapshot" and job["result"]["snapshot"] == "before"
        assert job["result"]["wal_position"] == 3 and job["result"]["num_tokens"] > 0

        admin.ingest(AFTER_DOCS)
        after = admin.drafts()
        assert after != before  # the new data changed the drafts

        listed = http.get("/v1/datastores/default/snapshots", headers=AUTH).json()["snapshots"]
        assert [s["name"] for s in listed] == ["before"]
        assert listed[0]["pinned"] and listed[0]["newest"]
        r = http.post("/v1/datastores/default/snapshots/before/restore", headers=AUTH)
        job = admin.wait_job(r)
        assert job["state"] == "succeeded", job
        assert job["result"]["restored"] == "before" and job["result"]["discarded_through"] == 6
        assert admin.drafts() == before

        # The restored state is the newest snapshot, so a restart keeps it; the
        # ingests after "before" are discarded from the log as well.
        listed = http.get("/v1/datastores/default/snapshots", headers=AUTH).json()["snapshots"]
        assert listed[-1]["name"] == job["result"]["snapshot"] and listed[-1]["newest"]
        shown = http.get(f"/v1/datastores/default/snapshots/{listed[-1]['name']}", headers=AUTH)
        assert shown.json()["metadata"]["restored_from"] == "before"
        assert shown.json()["tokenizer"]["vocab_size"] == VOCAB
    finally:
        admin.close()
    again = start(loop_thread, cfg)
    try:
        assert again.drafts() == before
        stats = again.http.get("/v1/datastores/default", headers=AUTH).json()
        assert stats["live_state"]["pending_tokens"] == 0
    finally:
        again.close()


def test_drafting_keeps_serving_while_the_datastore_is_swapped(admin: Admin) -> None:
    import threading

    http = admin.http
    admin.ingest(BEFORE_DOCS)
    assert (
        admin.wait_job(
            http.post("/v1/datastores/default/snapshots", headers=AUTH, json={"name": "s"})
        )["state"]
        == "succeeded"
    )
    admin.ingest(AFTER_DOCS)
    stop = threading.Event()
    steps: list[bool] = []
    errors: list[BaseException] = []

    def draft_continuously() -> None:
        try:
            with DrafterClient(
                admin.server.address, deadline_ms=10_000, mode="unary", budget=BudgetRule.fixed(8)
            ) as client:
                client.wait_ready()
                i = 0
                while not stop.is_set():
                    client.add_request(f"r{i}", PROMPTS["a"])
                    steps.append(client.step({f"r{i}": []})[f"r{i}"] is not None)
                    client.abort(f"r{i}")
                    i += 1
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=draft_continuously)
    thread.start()
    try:
        # Three rounds of swaps at least, and more until drafting has stepped ten times
        # meanwhile, however the two threads are scheduled (a count bounds failure only).
        for rounds in itertools.count():
            if rounds >= 3 and len(steps) >= 10:
                break
            assert rounds < 300 and not errors, (rounds, len(steps), errors)
            job = admin.wait_job(
                http.post("/v1/datastores/default/snapshots/s/restore", headers=AUTH)
            )
            assert job["state"] == "succeeded", job
            body = {"name": "c", "path": "ids.jsonl", "kind": "token-ids"}
            job = admin.wait_job(
                http.post("/v1/datastores/default/corpora", headers=AUTH, json=body)
            )
            assert job["state"] == "succeeded", job
            assert http.delete("/v1/datastores/default/corpora/c", headers=AUTH).status_code == 204
    finally:
        stop.set()
        thread.join(30)
    assert not errors, errors
    assert len(steps) >= 10 and all(steps)  # every step drafted: none fell back


def test_snapshot_list_show_delete_and_conflicts(admin: Admin) -> None:
    http = admin.http
    base = "/v1/datastores/default/snapshots"
    admin.ingest([[1, 2, 3]])
    assert admin.wait_job(http.post(base, headers=AUTH, json={"name": "one"}))["state"] == (
        "succeeded"
    )
    r = http.post(base, headers=AUTH, json={"name": "one"})
    assert r.status_code == 409 and "already exists" in r.json()["error"]["message"]
    job = admin.wait_job(http.post(base, headers=AUTH))  # no body: a generated name
    assert job["state"] == "succeeded"
    generated = job["result"]["snapshot"]
    names = [s["name"] for s in http.get(base, headers=AUTH).json()["snapshots"]]
    assert names == ["one", generated]
    shown = http.get(f"{base}/one", headers=AUTH).json()
    assert shown["name"] == "one" and shown["pinned"] and not shown["newest"]
    assert shown["sub_indices"] == 1 and shown["num_tokens"] == 3
    r = http.delete(f"{base}/{generated}", headers=AUTH)  # the restart point
    assert r.status_code == 409 and "newest" in r.json()["error"]["message"]
    assert http.delete(f"{base}/one", headers=AUTH).status_code == 204
    assert http.get(f"{base}/one", headers=AUTH).status_code == 404
    assert http.delete(f"{base}/one", headers=AUTH).status_code == 404
    assert http.post(f"{base}/one/restore", headers=AUTH).status_code == 404
    # Read-only datastores have no snapshots, rebuilds, corpora or settings.
    for method, path in [
        ("GET", "/v1/datastores/ro/snapshots"),
        ("POST", "/v1/datastores/ro/snapshots"),
        ("POST", "/v1/datastores/ro/rebuild"),
        ("GET", "/v1/datastores/ro/corpora"),
        ("GET", "/v1/datastores/ro/settings"),
    ]:
        r = http.request(method, path, headers=AUTH)
        assert r.status_code == 409 and "read-only" in r.json()["error"]["message"], path
    assert http.get("/v1/jobs/job-999999", headers=AUTH).status_code == 404
    jobs = http.get("/v1/jobs", headers=AUTH).json()["jobs"]
    assert [j["kind"] for j in jobs] == ["rebuild", "snapshot", "snapshot"]


# -- corpora -----------------------------------------------------------------------------


def corpus_draft(admin: Admin) -> list[int]:
    return list(admin.drafts({"probe": CORPUS_DOC[:3]})["probe"][0])


@pytest.mark.parametrize(
    ("path", "kind"),
    [("ids.jsonl", "token-ids"), ("sub/ids.npy", "npy"), ("inside-link.jsonl", "token-ids")],
)
def test_an_added_corpus_drafts_survives_rebuilds_and_is_removable(
    admin: Admin, path: str, kind: str
) -> None:
    http = admin.http
    base = "/v1/datastores/default/corpora"
    assert CORPUS_DOC[3] not in corpus_draft(admin)
    job = admin.wait_job(
        http.post(base, headers=AUTH, json={"name": "mine", "path": path, "kind": kind})
    )
    assert job["state"] == "succeeded", job
    assert job["result"]["num_tokens"] >= len(CORPUS_DOC)
    drafted = corpus_draft(admin)
    assert drafted[:4] == CORPUS_DOC[3:7]  # the best chain continues the corpus text
    listed = http.get(base, headers=AUTH).json()["corpora"]
    assert [c["name"] for c in listed] == ["mine"] and listed[0]["metadata"]["kind"] == kind
    r = http.post(base, headers=AUTH, json={"name": "mine", "path": path, "kind": kind})
    assert r.status_code == 409

    admin.ingest([[1, 2, 3, 4, 5]])  # a rebuild keeps the corpus
    assert corpus_draft(admin)[:4] == CORPUS_DOC[3:7]
    snaps = http.get("/v1/datastores/default/snapshots", headers=AUTH).json()["snapshots"]
    assert snaps[-1]["corpora"] == ["mine"]  # durable: the add wrote a snapshot

    assert http.delete(f"{base}/mine", headers=AUTH).status_code == 204
    assert CORPUS_DOC[3] not in corpus_draft(admin)
    assert http.get(base, headers=AUTH).json() == {"corpora": []}
    assert http.delete(f"{base}/mine", headers=AUTH).status_code == 404


def test_a_text_corpus_is_tokenized_with_the_service_tokenizer(admin: Admin) -> None:
    body = {"name": "words", "path": "words.txt", "kind": "text"}
    job = admin.wait_job(admin.http.post("/v1/datastores/default/corpora", headers=AUTH, json=body))
    assert job["state"] == "succeeded", job
    assert job["result"]["num_tokens"] == 10
    # "w1 w2 w3" are ids 2, 3, 4 of the word tokenizer; the corpus continues with w4 w5.
    assert admin.drafts({"t": [2, 3, 4]})["t"][0][:2] == [5, 6]


def test_a_bad_corpus_file_fails_its_job(admin: Admin, corpora_dir: Path) -> None:
    (corpora_dir / "bad.jsonl").write_text('{"output_ids": [1, 2, 99999]}\n')
    body = {"name": "bad", "path": "bad.jsonl", "kind": "token-ids"}
    job = admin.wait_job(admin.http.post("/v1/datastores/default/corpora", headers=AUTH, json=body))
    assert job["state"] == "failed" and "99999" in job["error"]
    assert admin.http.get("/v1/datastores/default/corpora", headers=AUTH).json() == {"corpora": []}


def test_text_corpora_need_a_tokenizer_and_corpora_need_a_directory(
    loop_thread: LoopThread, tmp_path: Path, corpora_dir: Path
) -> None:
    # (what the server is started without, a corpus that needs it, the option the 409 names)
    refusals = [
        ({"tokenizer": None}, {"name": "words", "path": "words.txt", "kind": "text"},
         "--tokenizer"),
        ({"corpora_dir": None}, {"name": "ids", "path": "ids.jsonl", "kind": "token-ids"},
         "--corpora-dir"),
    ]  # fmt: skip
    for without, body, option in refusals:
        admin = start(loop_thread, server_config(tmp_path, corpora_dir, **without))
        try:
            r = admin.http.post("/v1/datastores/default/corpora", headers=AUTH, json=body)
            assert r.status_code == 409 and option in r.json()["error"]["message"]
        finally:
            admin.close()


# -- path traversal ----------------------------------------------------------------------


ESCAPING_PATHS = [
    ("../outside.jsonl", 400),
    ("sub/../../outside.jsonl", 400),
    ("/etc/passwd", 400),
    (str(Path("/tmp").resolve()), 400),
    ("%2e%2e%2foutside.jsonl", 400),
    ("..%2Foutside.jsonl", 400),
    ("sub\\..\\..\\outside.jsonl", 400),
    (".hidden", 400),
    ("escape.jsonl", 400),  # a symlink leading outside the corpora directory
    ("sub", 400),  # a directory
    ("missing.jsonl", 404),
    ("a\x00b", 400),
]


def test_corpus_paths_cannot_leave_the_corpora_directory(admin: Admin) -> None:
    for path, status in ESCAPING_PATHS:
        body = {"name": "c1", "path": path, "kind": "token-ids"}
        r = admin.http.post("/v1/datastores/default/corpora", headers=AUTH, json=body)
        assert r.status_code == status, (path, r.text)
        assert r.json()["error"]["code"] in ("bad_request", "not_found")
    assert admin.http.get("/v1/jobs", headers=AUTH).json() == {"jobs": []}


BAD_NAMES = [
    "..",
    "%2e%2e",
    "%2e%2e%2f%2e%2e%2fwal",
    "..%2f..%2fwal",
    "%2fetc%2fpasswd",
    "a.b",
    "-x",
    "x" * 65,
    "%00",
]


def test_snapshot_and_corpus_names_are_validated(admin: Admin) -> None:
    admin.ingest([[1, 2, 3]])
    assert (
        admin.wait_job(
            admin.http.post("/v1/datastores/default/snapshots", headers=AUTH, json={"name": "keep"})
        )["state"]
        == "succeeded"
    )
    data_dir = admin.server.config.data_dir
    before = sorted(p.name for p in data_dir.rglob("*"))
    base = "/v1/datastores/default"
    for raw_name in BAD_NAMES:
        requests = [
            ("GET", f"{base}/snapshots/{raw_name}"),
            ("DELETE", f"{base}/snapshots/{raw_name}"),
            ("POST", f"{base}/snapshots/{raw_name}/restore"),
            ("DELETE", f"{base}/corpora/{raw_name}"),
        ]
        for method, target in requests:
            # The raw request target: no client-side normalisation of dot segments.
            request = admin.http.build_request(method, base, headers=AUTH)
            request.extensions["target"] = target.encode()
            r = admin.http.send(request)
            assert r.status_code in (404, 422), (method, target, r.status_code, r.text)
            assert r.json()["error"]["code"] in ("not_found", "invalid_request")
        decoded = raw_name.replace("%2e", ".").replace("%2f", "/").replace("%00", "\x00")
        for body in ({"name": decoded}, {"name": f"../{decoded}"}):
            r = admin.http.post("/v1/datastores/default/snapshots", headers=AUTH, json=body)
            assert r.status_code == 422, r.text
            r = admin.http.post(
                "/v1/datastores/default/corpora",
                headers=AUTH,
                json={**body, "path": "ids.jsonl", "kind": "token-ids"},
            )
            assert r.status_code == 422, r.text
    assert sorted(p.name for p in data_dir.rglob("*")) == before
    assert (data_dir / "snapshots" / "keep" / "manifest.json").is_file()


def test_jobs_run_one_at_a_time_in_order_and_close_drops_the_queued_ones() -> None:
    release = threading.Event()
    alone = threading.Lock()  # held by the job running
    ran: list[str] = []

    def work(name: str) -> Callable[[], dict[str, Any]]:
        def run() -> dict[str, Any]:
            assert alone.acquire(blocking=False), "two jobs ran at once"
            try:
                ran.append(name)
                if name == "held":
                    assert release.wait(60)
            finally:
                alone.release()
            return {"name": name}

        return run

    async def scenario() -> tuple[list[JobInfo], list[JobInfo]]:
        jobs = AdminJobs()
        done = [jobs.submit("rebuild", "default", work(f"job{i}")) for i in range(3)]
        while any(j.state in ("queued", "running") for j in done):
            await asyncio.sleep(0)
        held = jobs.submit("snapshot", "default", work("held"))
        queued = [jobs.submit("snapshot", "default", work(f"queued{i}")) for i in range(2)]
        while held.state != "running":
            await asyncio.sleep(0)
        closing = asyncio.ensure_future(jobs.close())
        await asyncio.sleep(0)  # close has begun: the queued jobs are dropped
        release.set()
        await closing
        with pytest.raises(AdminError, match="shutting down"):
            jobs.submit("rebuild", "default", work("late"))
        return done, [held, *queued]

    done, closed = asyncio.run(scenario())
    assert ran == ["job0", "job1", "job2", "held"]
    assert [j.result for j in done] == [{"name": f"job{i}"} for i in range(3)]
    assert [j.state for j in closed] == ["succeeded", "failed", "failed"]
    assert [j.error for j in closed[1:]] == ["cancelled at shutdown"] * 2
    assert all(j.started_unix is None for j in closed[1:])


def test_a_failed_admin_server_still_closes_its_jobs_and_raises_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutdown = uvicorn.Server.shutdown

    async def failing_shutdown(self: uvicorn.Server, *args: Any, **kwargs: Any) -> None:
        await shutdown(self, *args, **kwargs)  # the socket is closed, then the task fails
        raise RuntimeError("uvicorn failed")

    async def scenario() -> AdminServer:
        server = AdminServer(config(tmp_path), lambda: None, lambda: "ok")
        await server.start()
        monkeypatch.setattr(uvicorn.Server, "shutdown", failing_shutdown)
        with pytest.raises(RuntimeError, match="uvicorn failed"):
            await server.stop()
        await server.stop()  # stopped: the failure is not raised again
        return server

    server = asyncio.run(scenario())
    with pytest.raises(AdminError, match="shutting down"):  # the jobs closed all the same
        server.jobs.submit("rebuild", "default", dict)


# -- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize("declared", [b"abc", b"-5", b"1e3"])
def test_body_limit_refuses_a_bad_content_length_under_any_server(declared: bytes) -> None:
    """uvicorn answers these 400 before the app; the app itself (any ASGI server) answers
    400 too instead of failing, and never calls what it guards."""
    sent: list[dict[str, Any]] = []

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("the guarded app was called")

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/x", "headers": [
        (b"content-length", declared)]}  # fmt: skip
    asyncio.run(BodyLimit(guarded, 100)(scope, receive, send))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 400
    assert b"invalid Content-Length" in b"".join(m.get("body", b"") for m in sent[1:])


def test_error_statuses_and_shape(admin: Admin) -> None:
    http = admin.http
    corpora = "/v1/datastores/default/corpora"
    r = http.post(corpora, headers={**AUTH, "Content-Type": "application/json"}, content=b"{oops")
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request"
    r = http.post(corpora, headers=AUTH, json={"name": "x", "path": "ids.jsonl"})
    assert r.status_code == 422 and "kind" in r.json()["error"]["message"]
    r = http.post(corpora, headers=AUTH, json={"name": "x", "path": "a", "kind": "x", "extra": 1})
    assert r.status_code == 422
    big = {"name": "x", "path": "a" * 100_000, "kind": "token-ids"}
    r = http.post(corpora, headers=AUTH, json=big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while read
        for _ in range(100):
            yield b" " * 1024

    r = http.post(corpora, headers={**AUTH, "Content-Type": "application/json"}, content=chunks())
    assert r.status_code == 413
    # An invalid Content-Length never reaches the app: uvicorn's HTTP parser answers 400.
    with socket.create_connection(("127.0.0.1", admin.server.admin_port or 0)) as raw:
        raw.sendall(f"POST {corpora} HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n".encode())
        assert raw.recv(100).startswith(b"HTTP/1.1 400 ")
    r = http.get("/v1/nothing-here", headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = http.put("/v1/datastores/default/settings", headers=AUTH, json={})
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    r = http.patch("/v1/datastores/default/settings", headers=AUTH, json={"rebuild_interval_s": 0})
    assert r.status_code == 422
    r = http.patch("/v1/datastores/default/settings", headers=AUTH, json={"rebuild_max_share": 1})
    assert r.status_code == 422
    r = http.patch("/v1/datastores/default/settings", headers=AUTH, json={"max_sub_indices": 2})
    assert r.status_code == 422  # not a live setting
    assert admin.http.get("/v1/jobs", headers=AUTH).json() == {"jobs": []}


# -- live settings -----------------------------------------------------------------------


def test_live_settings_change_when_maintenance_runs(admin: Admin) -> None:
    http = admin.http
    url = "/v1/datastores/default/settings"
    assert http.get(url, headers=AUTH).json() == {
        "rebuild_min_tokens": 10**6,
        "rebuild_interval_s": 3600.0,
        "rebuild_max_share": 0.0,
        "snapshot_interval_s": 0.0,
        "keep_snapshots": 2,
    }
    with DrafterClient(admin.server.address, deadline_ms=10_000, mode="unary") as client:
        client.wait_ready()
        assert client.ingest([[1, 2, 3, 4]]) and client.flush(10)
    # Hourly rebuilds: a turn of the schedule a minute on folds nothing in (stepped by
    # hand, at a chosen time, rather than slept for).
    assert admin.server.engine is not None
    live = admin.server.engine.catalog.slots["default"].live
    assert live is not None
    assert live.run_maintenance_once(time.monotonic() + 60) == (False, False)
    stats = http.get("/v1/datastores/default", headers=AUTH).json()
    assert stats["live_state"]["pending_tokens"] == 4

    r = http.patch(url, headers=AUTH, json={"rebuild_interval_s": 0.05, "keep_snapshots": 3})
    assert r.status_code == 200
    assert r.json()["rebuild_interval_s"] == 0.05 and r.json()["keep_snapshots"] == 3
    deadline = time.monotonic() + 60  # a bound on failure only
    while http.get("/v1/datastores/default", headers=AUTH).json()["num_tokens"] != 4:
        assert time.monotonic() < deadline, "the background rebuild never ran"
        time.sleep(0.05)
    assert http.get(url, headers=AUTH).json()["rebuild_interval_s"] == 0.05

    # Back to hourly, then cheap rebuilds brought forward: the next ingest is folded in
    # about a second after the last rebuild, not an hour.
    r = http.patch(url, headers=AUTH, json={"rebuild_interval_s": 3600, "rebuild_max_share": 0.5})
    assert r.status_code == 200 and r.json()["rebuild_max_share"] == 0.5
    with DrafterClient(admin.server.address, deadline_ms=10_000, mode="unary") as client:
        assert client.ingest([[5, 6, 7]]) and client.flush(10)
    deadline = time.monotonic() + 60  # a bound on failure only
    while http.get("/v1/datastores/default", headers=AUTH).json()["num_tokens"] != 4 + 1 + 3:
        assert time.monotonic() < deadline, "the cheap rebuild was not brought forward"
        time.sleep(0.05)


# -- as a subprocess -----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.system
def test_drafter_serve_subprocess_serves_admin_with_an_env_token(tmp_path: Path) -> None:
    port = free_port()
    os.environ["DRAFTER_ADMIN_TOKEN"] = TOKEN  # inherited by the child only for this call
    try:
        proc = Subprocess(
            "--data-dir",
            str(tmp_path),
            "--vocab-size",
            str(VOCAB),
            "--port",
            "0",
            "--admin-port",
            str(port),
            "--snapshot-interval-s",
            "0",
        )
    finally:
        del os.environ["DRAFTER_ADMIN_TOKEN"]
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            assert http.get("/readyz").status_code == 200
            assert http.get("/v1/datastores").status_code == 401
            assert http.post("/v1/datastores/default/snapshots").status_code == 401
            r = http.post("/v1/datastores/default/snapshots", headers=AUTH, json={"name": "s1"})
            assert r.status_code == 202
            job_url = r.headers["location"]
            deadline = time.monotonic() + 30
            while (job := http.get(job_url, headers=AUTH).json())["state"] != "succeeded":
                assert job["state"] in ("queued", "running") and time.monotonic() < deadline, job
                time.sleep(0.05)
            assert (tmp_path / "snapshots" / "s1" / "manifest.json").is_file()
    finally:
        code, rest, err = proc.stop(signal.SIGTERM)
    assert code == 0, err
    assert rest == ""  # still exactly one line on stdout
    assert f"admin API on http://127.0.0.1:{port}" in err


# -- fuzzing against the served OpenAPI schema ---------------------------------------------


FUZZ_EXAMPLES = 3  # per operation and generation mode: every operation, valid and invalid inputs


@pytest.mark.parametrize("authenticated", [True, False])
@pytest.mark.system
def test_fuzz_against_the_openapi_schema(admin: Admin, authenticated: bool) -> None:
    """Every operation of the served schema with generated inputs, valid (positive) and
    invalid (negative): never a 5xx, and every response (status, content type, body)
    conforms to the schema. Without the token, everything but the probes is 401."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode, checks

    admin.ingest([[1, 2, 3, 4]])
    headers = AUTH if authenticated else {}
    schema = schemathesis.openapi.from_url(f"{admin.base}/openapi.json")
    selected = [
        checks.not_a_server_error,
        checks.status_code_conformance,
        checks.content_type_conformance,
        checks.response_schema_conformance,
    ]
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 20
    statuses: dict[int, int] = {}
    variants: list[tuple[Any, GenerationMode, dict[str, str] | None]] = []
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            variants.append((operation, mode, None))
            if authenticated and "{name}" in operation.path:  # reach past the 404
                variants.append((operation, mode, {"name": "default"}))
    for operation, mode, fixed in variants:

        @settings(
            max_examples=FUZZ_EXAMPLES,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(generation_mode=mode, path_parameters=fixed))
        def call(case: Any) -> None:
            response = case.call_and_validate(headers=headers, checks=selected)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            if not authenticated and case.path not in ("/healthz", "/readyz"):
                assert response.status_code == 401, response.text

        try:
            call()
        except Unsatisfiable:  # an operation without inputs has no invalid ones
            assert mode == GenerationMode.NEGATIVE
    print(f"schemathesis ({'with' if authenticated else 'without'} token): {statuses}")
    assert sum(statuses.values()) >= 2 * len(operations)
    assert not any(status >= 500 for status in statuses)
    assert admin.http.get("/healthz").json() == {"status": "ok"}
