"""Input bundles over HTTP: a job's pickled inputs uploaded (content-addressed, for the
uploader alone), shared with another user, and downloaded again (`cellscale_hub.bundles`
keeps them; the bytes are never unpickled here)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.responses import FileResponse

from cellscale.spec import MAX_INPUTS_BYTES, BundleRef, BundleShare
from cellscale_hub.api.context import Ctx, Reader, Submitter
from cellscale_hub.api.errors import refusals
from cellscale_hub.bundles import BundleRefused

router = APIRouter()


@router.post("/bundles", response_model=BundleRef, status_code=201, responses=refusals(401, 403, 413))
async def upload_bundle(request: Request, who: Submitter, ctx: Ctx) -> BundleRef:
    """Store a job's pickled inputs, content-addressed, for you alone (share one with
    POST /bundles/{sha256}/share). The bytes are never unpickled here."""
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > MAX_INPUTS_BYTES:
            raise HTTPException(413, f"inputs are larger than {MAX_INPUTS_BYTES // 2**20} MiB; ship big data by URL")
    try:
        stored = await asyncio.to_thread(ctx.bundles.put, who.user, bytes(data))
    except BundleRefused as exc:
        raise HTTPException(413, str(exc)) from exc
    return BundleRef(sha256=stored.sha256, size=stored.size)


@router.post("/bundles/{sha256}/share", status_code=204, responses=refusals(401, 403, 404, 422))
def share_bundle(sha256: str, body: BundleShare, who: Submitter, ctx: Ctx) -> Response:
    """Let another user's jobs use one of your input bundles (by its hash)."""
    try:
        ctx.bundles.share(who.user, sha256, body.user)
    except BundleRefused as exc:
        raise HTTPException(404, str(exc)) from exc
    return Response(status_code=204)


@router.get(
    "/bundles/{sha256}",
    responses={200: {"content": {"application/octet-stream": {}}}, **refusals(401, 403, 404, 422)},
)
def download_bundle(sha256: str, who: Reader, ctx: Ctx) -> Response:
    """One of your input bundles (uploaded by you or shared with you), the bytes as uploaded:
    what `%cluster promote` saves beside the asset it writes. Never unpickled here."""
    path = ctx.bundles.path(who.user, sha256)
    if path is None:
        raise HTTPException(
            404,
            f"you have no input bundle {sha256} (neither uploaded by you nor shared with you; one no waiting "
            f"or running job uses is removed after {ctx.bundles.grace_s / 3600:g} h)",
        )
    return FileResponse(path, media_type="application/octet-stream")
