"""The HTTP layer: FastAPI routes around mutate.decide. Every request gets an answer: a malformed
AdmissionReview is a 400 with the reason, and an unexpected error still admits or denies under
the pod's policy rather than surfacing as a 500 (a 500 makes the API server apply the webhook's
failurePolicy, which the user did not choose per pod)."""

from __future__ import annotations

import logging
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from pydantic import ValidationError

from api import annotations as ann
from kubeclient.metrics_server import zeroed
from webhook import mutate, review
from webhook.lookup import LookupFn

log = logging.getLogger("snapshot.webhook")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.admissions = zeroed(
            Counter(
                "snapshot_webhook_admissions",
                "Admission reviews answered, by result (unchanged, mutated, fell-back, denied, "
                "malformed, error)",
                ["result"],
                registry=self.registry,
            ),
            "unchanged",
            "mutated",
            "fell-back",
            "denied",
            "malformed",
            "error",
        )
        self.latency = Histogram(
            "snapshot_webhook_admission_seconds",
            "Time to answer an admission review, including the PodSnapshot lookup",
            registry=self.registry,
        )
        self.lookups = zeroed(
            Counter(
                "snapshot_webhook_snapshot_lookups",
                "PodSnapshot lookups, by outcome (found, not-found, unavailable)",
                ["outcome"],
                registry=self.registry,
            ),
            "found",
            "not-found",
            "unavailable",
        )


def create_app(
    lookup: LookupFn,
    runtime_class: str = mutate.DEFAULT_RUNTIME_CLASS,
    ready: bool = True,
    pin_to_source: bool = False,
) -> FastAPI:
    app = FastAPI(title="snapshot-webhook", docs_url=None, redoc_url=None, openapi_url=None)
    metrics = Metrics()
    app.state.metrics = metrics
    app.state.ready = ready

    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> str:
        return "ok"

    @app.get("/readyz", response_class=PlainTextResponse)
    async def readyz() -> Response:
        if app.state.ready:
            return PlainTextResponse("ok")
        return PlainTextResponse("not ready", status_code=503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/mutate")
    async def admit(request: Request) -> JSONResponse:
        started = time.monotonic()
        try:
            rev = review.parse(await _read_bounded(request))
        except review.TooLarge as e:
            metrics.admissions.labels("malformed").inc()
            log.warning("%s", e)
            return JSONResponse({"error": str(e)}, status_code=413)
        except (ValueError, ValidationError, RecursionError) as e:
            metrics.admissions.labels("malformed").inc()
            message = f"malformed AdmissionReview: {e}"
            log.warning("%s", message.splitlines()[0])
            return JSONResponse({"error": message[:2000]}, status_code=400)
        req = rev.request
        try:
            decision = await _decide(req, lookup, runtime_class, metrics, pin_to_source)
        except Exception as e:  # a bug here must not block pod creation cluster-wide
            log.exception("admission %s failed", req.uid)
            decision = _on_error(req, e)
            metrics.admissions.labels("error").inc()
        else:
            metrics.admissions.labels(decision.result).inc()
        metrics.latency.observe(time.monotonic() - started)
        name = (req.object or {}).get("metadata", {}).get("name") or req.name or "(generated)"
        log.info(
            "%s pod %s/%s: %s%s",
            req.operation,
            req.namespace,
            name,
            decision.result,
            f" ({decision.message or '; '.join(decision.warnings)})"
            if decision.message or decision.warnings
            else "",
        )
        return JSONResponse(review.response(req.uid, decision))

    return app


async def _read_bounded(request: Request) -> bytes:
    """The request body, refused once it passes review.MAX_BODY: a client must not make the
    webhook buffer more than any real AdmissionReview can be."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > review.MAX_BODY:
        raise review.TooLarge(int(declared))
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > review.MAX_BODY:
            raise review.TooLarge(size)
        chunks.append(chunk)
    return b"".join(chunks)


async def _decide(
    req: review.AdmissionRequest,
    lookup: LookupFn,
    runtime_class: str,
    metrics: Metrics,
    pin_to_source: bool = False,
) -> mutate.Decision:
    if req.kind.kind != "Pod" or req.object is None:
        return mutate.Decision(allowed=True)
    annotations = (req.object.get("metadata") or {}).get("annotations") or {}
    try:
        name = ann.RestoreAnnotations.parse(annotations).restore_from
    except ann.AnnotationError:
        name = None  # decide() denies it with the reason
    found = None
    if name is not None:
        found = await lookup(req.namespace, name)
        outcome = {mutate.Found: "found", mutate.NotFound: "not-found"}.get(
            type(found), "unavailable"
        )
        metrics.lookups.labels(outcome).inc()
    return mutate.decide(req.object, req.namespace, found, runtime_class, pin_to_source)


def _on_error(req: review.AdmissionRequest, error: Exception) -> mutate.Decision:
    """An unexpected error admits the pod without a restore, unless it asks for ``strict``
    or carries webhook-only annotations, which must never pass unchecked."""
    annotations = ((req.object or {}).get("metadata") or {}).get("annotations") or {}
    internal = sorted(k for k in annotations if str(k).startswith(ann.INTERNAL_PREFIX))
    if internal:
        return mutate.Decision.deny(
            f"snapshot webhook error ({error}) on a pod carrying {internal}"
        )
    if annotations.get(ann.RESTORE_POLICY) == ann.RestorePolicy.STRICT.value:
        return mutate.Decision.deny(f"snapshot webhook error: {error}")
    return mutate.Decision(
        allowed=True,
        warnings=[f"snapshot webhook error ({error}); starting without restore"],
        result="error",
    )
