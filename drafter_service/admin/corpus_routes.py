"""Corpora of a live datastore: add a file from the server's storage (a job), list, remove."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import Path, Request, Response

from drafter_service.admin import routes
from drafter_service.admin.corpus_files import build_corpus, resolve_corpus_path
from drafter_service.admin.http_errors import conflict, not_found
from drafter_service.admin.schemas import NAME_PATTERN, CorpusAdd, CorpusInfo, CorpusList, JobInfo
from drafter_service.live.live_datastore import Corpus, DatastoreFull

CorpusName = Annotated[str, Path(pattern=NAME_PATTERN, description="corpus name")]
router = routes.v1_router("corpora")


@router.get("/datastores/{name}/corpora")
async def list_corpora(request: Request, name: routes.DatastoreName) -> CorpusList:
    live = routes.context(request).live(name)
    return CorpusList(corpora=[_info(c) for c in live.corpora])


@router.post(
    "/datastores/{name}/corpora",
    status_code=202,
    summary="build a corpus file into static sub-indices of the datastore (a job)",
    description="The file lies under the server's --corpora-dir. The corpus is kept across "
    "rebuilds (never rotated out), is written into every later snapshot, and is durable "
    "once the job succeeds (the job writes a snapshot).",
)
async def add_corpus(
    request: Request, response: Response, name: routes.DatastoreName, body: CorpusAdd
) -> JobInfo:
    ctx = routes.context(request)
    live = ctx.live(name)
    if any(c.name == body.name for c in live.corpora):
        raise conflict(f"datastore {name!r} already has a corpus {body.name!r}")
    config = ctx.config
    path = await asyncio.to_thread(resolve_corpus_path, config.corpora_dir, body.path)
    if body.kind not in ("token-ids", "npy") and config.tokenizer is None:
        raise conflict(
            f"corpus kind {body.kind!r} needs the service's tokenizer.json: start it with "
            "--tokenizer (or add token ids: kind token-ids or npy)"
        )

    def work() -> dict[str, Any]:
        corpus = build_corpus(body, path, live, config)
        try:
            info = live.add_corpus(corpus)
        except (DatastoreFull, ValueError) as exc:  # a job reports only the message
            raise conflict(str(exc)) from None
        return {
            "corpus": corpus.name,
            "num_tokens": corpus.num_tokens,
            "sub_indices": len(corpus.sub_indices),
            "snapshot": info.path.name,
        }

    return routes.start_job(request, response, "corpus-add", name, work)


@router.delete("/datastores/{name}/corpora/{corpus}", status_code=204)
async def remove_corpus(request: Request, name: routes.DatastoreName, corpus: CorpusName) -> None:
    live = routes.context(request).live(name)
    try:
        await asyncio.to_thread(live.remove_corpus, corpus)
    except KeyError:
        raise not_found(f"datastore {name!r} has no corpus {corpus!r}") from None


def _info(corpus: Corpus) -> CorpusInfo:
    return CorpusInfo(
        name=corpus.name,
        num_tokens=corpus.num_tokens,
        sub_indices=len(corpus.sub_indices),
        resident_bytes=corpus.resident_bytes,
        metadata=dict(corpus.metadata),
    )
