"""The iptables chains devnode's cluster leaves (the kubelet's canaries and firewall, the
hint chain, kube-proxy's rules), in both address families: removed on the way out, and by the
sweep after a killed run. Only while no kubelet or kube-proxy runs on the host any more, so
they cannot be a real node's."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

FAMILIES = ("iptables", "ip6tables")


def _commands() -> list[str]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                argv0 = (p / "cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
            except OSError:
                continue
            out.append(Path(argv0).name)
    return out


def running(*names: str) -> bool:
    """Whether a process of one of these program names runs on the host."""
    return any(c in names for c in _commands())


def remove_chains(prefixes: tuple[str, ...]) -> list[str]:
    """Every chain of these prefixes, in every table of both families (the rules jumping to
    them first); returns what was removed, as ``family:table:chain``."""
    removed = []
    for family in FAMILIES:
        for table in ("filter", "nat", "mangle", "raw"):
            dump = subprocess.run(
                [f"{family}-save", "-t", table], capture_output=True, text=True
            ).stdout
            chains = [
                ln[1:].split()[0]
                for ln in dump.splitlines()
                if ln.startswith(":") and ln[1:].startswith(prefixes)
            ]
            for ln in dump.splitlines():
                parts = shlex.split(ln)  # comments are quoted
                if (
                    ln.startswith("-A ")
                    and "-j" in parts
                    and parts[parts.index("-j") + 1] in chains
                ):
                    subprocess.run(
                        [family, "-w", "-t", table, "-D", *parts[1:]], capture_output=True
                    )
            for verb in ("-F", "-X"):  # flushed first: they jump to each other
                for chain in chains:
                    subprocess.run([family, "-w", "-t", table, verb, chain], capture_output=True)
            removed += [f"{family}:{table}:{c}" for c in chains]
    return removed


def remove_kube_chains() -> list[str]:
    """The KUBE- chains, unless a kubelet or kube-proxy (then a real node's) still runs."""
    return [] if running("kubelet", "kube-proxy") else remove_chains(("KUBE-",))
