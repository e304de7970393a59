"""N replicas of one GPU worker restored at once on one GPU, through containerd and the shim
(bench/gpu/shim_proof.py --replicas 1,2,4).

Replicas listen on the same port, so each container gets a network namespace of its own
(``ctr run --with-ns network:...``, loopback only), as pods do; the source is checkpointed
from one too, so its artifact restores into another. Each replica is probed from inside its
namespace. The figure is the slowest replica's first bitwise-identical answer, counted from
the moment all N ``ctr run`` calls were issued."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import subprocess
import time
from collections.abc import Callable

from devnode.probe import first_response
from restore_runtime.netns import in_netns


def netns_add(name: str) -> str:
    """A network namespace with loopback up, at /run/netns/NAME (pyroute2: the GPU machine
    may lack iproute2)."""
    from pyroute2 import NetNS, netns

    netns.create(name)
    with NetNS(name) as ns:
        ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
    return f"/run/netns/{name}"


def netns_del(name: str) -> None:
    from pyroute2 import netns

    with contextlib.suppress(OSError):
        netns.remove(name)


def answer_in(netns: str, port: int, since: float, timeout: float) -> tuple[float, str]:
    return in_netns(netns, lambda: first_response("127.0.0.1", port, since, timeout))


def round_of(
    n: int,
    start: Callable[[str, str], subprocess.CompletedProcess],
    port: int,
    same: Callable[[str], bool],
    report_of: Callable[[str], dict],
    run: str,
    cleanup: Callable[[str], None],
) -> dict:
    """Restore ``n`` replicas at once: ``start(container_id, netns_path)`` runs one."""
    names = [f"r{n}x{i}-{run}" for i in range(n)]
    nets = {c: netns_add(f"snap-{c}") for c in names}
    try:
        t0 = time.monotonic()
        try:
            with cf.ThreadPoolExecutor(n * 2) as pool:
                started = list(pool.map(lambda c: start(c, nets[c]), names))
                answers = list(pool.map(lambda c: answer_in(nets[c], port, t0, 150), names))
        except Exception as e:  # what each replica reported says why
            return {
                "replicas": n,
                "error": f"{type(e).__name__}: {e}",
                "after_s": round(time.monotonic() - t0, 1),
                "reports": [report_of(c) for c in names],
            }
        reports = [report_of(c) for c in names]
        firsts = [round(s, 3) for s, _ in answers]
        return {
            "replicas": n,
            "slowest_first_response_s": max(firsts),
            "first_response_s": firsts,
            "all_identical": all(same(d) for _, d in answers),
            "outcomes": [r.get("outcome") for r in reports],
            "phases": [r.get("timings") for r in reports],
            "start_rc": [p.returncode for p in started],
        }
    finally:
        for c in names:
            cleanup(c)
        for c in names:
            netns_del(f"snap-{c}")


def curve(
    rounds: list[int], before: Callable[[], None] | None = None, suffix: str = "", **kw
) -> dict:
    """Round ``n`` for each of ``rounds``, keyed ``f"{n}{suffix}"``; ``before`` runs ahead of
    each (the node's fill ledger emptied, for rounds that start cold)."""
    out: dict = {}
    for n in rounds:
        key = f"{n}{suffix}"
        try:
            if before is not None:
                before()
            out[key] = round_of(n, **{**kw, "run": kw["run"] + suffix})  # names unused yet
        except Exception as e:  # keep the rounds that ran
            out[key] = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps({key: out[key].get("slowest_first_response_s")}), flush=True)
    return out
