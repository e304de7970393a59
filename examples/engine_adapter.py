"""Handshake adapters for inference engines: map the snapshot handshake onto an engine's own
controls, over its HTTP API on localhost.

    checkpoint-requested  ->  Engine.quiesce()   (stop serving, free what need not be saved)
    restore-complete      ->  Engine.resume()    (re-allocate, serve again), then re-register
                              the new pod address with a router when --register-url is given

An adapter runs as a second process in the engine's container, so a checkpoint captures it
with the engine and a restored replica resumes both:

    sh -c 'python3 -m examples.vllm.adapter & exec vllm serve ...'

Standard library only (plus restore_runtime.workload, itself standard library only), so it
can run in any engine image: `pip install --no-deps gpu-snapshot`."""

from __future__ import annotations

import argparse
import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Protocol

from restore_runtime.workload import Handshake, RestoreComplete

log = logging.getLogger("snapshot.adapter")


class EngineError(RuntimeError):
    pass


class Http:
    """A tiny JSON-over-HTTP client for an engine on localhost."""

    def __init__(self, base_url: str, timeout: float = 120.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def call(
        self,
        method: str,
        path: str,
        params: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
        ok_missing: bool = False,
    ) -> Any:
        url = self.base_url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            if ok_missing and e.code == 404:
                log.info("%s %s: not offered by this engine version; skipped", method, path)
                return None
            raise EngineError(f"{method} {url}: HTTP {e.code} {e.read()[:200]!r}") from e
        except OSError as e:
            raise EngineError(f"{method} {url}: {e}") from e
        try:
            return json.loads(raw) if raw else None
        except json.JSONDecodeError:
            return raw.decode(errors="replace")

    def wait_until(self, check, what: str, timeout: float = 300.0, poll: float = 0.2) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise EngineError(f"timed out after {timeout:g}s waiting for {what}")
            time.sleep(poll)


class Engine(Protocol):
    name: str

    def quiesce(self) -> dict[str, Any]: ...

    def resume(self, info: RestoreComplete) -> None: ...


def register(url_template: str | None, info: RestoreComplete, port: int) -> None:
    """Tell a router where this replica now serves: POST to the template with {url}, {ip} and
    {port} filled in, e.g. http://router:30000/add_worker?url={url} (SGLang's router)."""
    if not url_template or not info.pod_ip:
        return
    url = f"http://{info.pod_ip}:{port}"
    target = url_template.format(url=urllib.parse.quote(url, safe=""), ip=info.pod_ip, port=port)
    req = urllib.request.Request(
        target,
        data=json.dumps({"url": url}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()
    log.info("registered %s with %s", url, target.split("?")[0])


def serve(
    engine: Engine, handshake: Handshake, register_url: str | None, port: int, stop=None
) -> None:
    def quiesce() -> dict[str, Any]:
        t0 = time.monotonic()
        info = engine.quiesce()
        log.info("%s quiesced in %.2fs", engine.name, time.monotonic() - t0)
        return {"engine": engine.name, "quiesceSeconds": round(time.monotonic() - t0, 3), **info}

    def resume(info: RestoreComplete) -> None:
        t0 = time.monotonic()
        engine.resume(info)
        register(register_url, info, port)
        log.info(
            "%s resumed (%s) in %.2fs at %s",
            engine.name,
            info.mode,
            time.monotonic() - t0,
            info.pod_ip,
        )

    handshake.serve(quiesce, resume, stop)


def main(make_engine, default_port: int, argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine-url", default=f"http://127.0.0.1:{default_port}")
    p.add_argument("--port", type=int, default=default_port, help="the port replicas serve on")
    p.add_argument("--register-url", help="router URL template, e.g. .../add_worker?url={url}")
    p.add_argument("--control-dir", help="default: $SNAPSHOT_CONTROL_DIR")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s adapter: %(message)s")
    hs = Handshake(args.control_dir)
    if not hs.enabled:
        log.warning("no control directory at %s: nothing to do", hs.control_dir)
        return 0
    serve(make_engine(Http(args.engine_url)), hs, args.register_url, args.port)
    return 0
