"""A real control plane for tests, as controller-runtime's envtest runs one: Debian's etcd and a
kube-apiserver built from its Go module (tools/build-kube-tools.sh), both on loopback with
self-signed certificates, a token for a system:masters user, and a kubeconfig for clients.

No controller-manager or scheduler runs: objects are stored and validated (CRD schemas, CEL
rules, admission webhooks) but pods are never scheduled."""

from __future__ import annotations

import contextlib
import secrets
import shutil
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from devnode import free_port, stop_process, wait_until
from devnode.cri import TOOLS_BIN
from kubeclient import certs

KUBE_APISERVER = TOOLS_BIN / "kube-apiserver"
CHART = Path(__file__).resolve().parent.parent / "charts" / "snapshot"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def missing() -> str | None:
    """Why the control plane cannot start here, or None."""
    if not KUBE_APISERVER.exists():
        return f"{KUBE_APISERVER} not built (make tools runs tools/build-kube-tools.sh)"
    if shutil.which("etcd") is None:
        return "etcd not installed (Debian's etcd-server; make system installs it)"
    return None


@dataclass
class ControlPlane:
    url: str
    token: str
    ca: Path
    kubeconfig: Path
    log: Path

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    def get(self, path: str) -> bytes:
        req = urllib.request.Request(
            self.url + path, headers={"Authorization": f"Bearer {self.token}"}
        )
        with urllib.request.urlopen(req, context=self.ssl_context(), timeout=5) as r:
            return r.read()

    def client(self) -> httpx.Client:
        """A plain REST client as the admin user (tests read raw responses and Warning
        headers through it)."""
        return httpx.Client(
            base_url=self.url,
            verify=self.ssl_context(),
            timeout=30,
            headers={"Authorization": f"Bearer {self.token}"},
        )

    def install_crds(self, crd_dir: Path = CHART / "crds") -> list[str]:
        """Creates (or replaces) the chart's CRDs and waits until each is Established."""
        names = []
        with self.client() as c:
            for path in sorted(crd_dir.glob("*.yaml")):
                crd = yaml.safe_load(path.read_text())
                name = crd["metadata"]["name"]
                r = c.post(f"{CRD_PATH}", json=crd)
                if r.status_code == 409:
                    old = c.get(f"{CRD_PATH}/{name}").json()
                    crd["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
                    r = c.put(f"{CRD_PATH}/{name}", json=crd)
                r.raise_for_status()
                names.append(name)
            deadline = time.monotonic() + 30
            for name in names:
                while not any(
                    cond["type"] == "Established" and cond["status"] == "True"
                    for cond in c.get(f"{CRD_PATH}/{name}")
                    .json()
                    .get("status", {})
                    .get("conditions", [])
                ):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"CRD {name} not Established after 30s")
                    time.sleep(0.2)
                # Established comes before the storage serves: lists answer 429 for a moment.
                plural, group = name.split(".", 1)
                version = crd["spec"]["versions"][0]["name"]
                while c.get(f"/apis/{group}/{version}/{plural}").status_code != 200:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"CRD {name} not served after 30s")
                    time.sleep(0.2)
        return names


def _write_kubeconfig(path: Path, url: str, ca: Path, token: str) -> None:
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "local", "cluster": {"server": url, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "admin"}}],
        "current-context": "local",
    }
    path.write_text(yaml.safe_dump(cfg))


#: the ``kubernetes`` Service's ClusterIP: the first address of --service-cluster-ip-range
SERVICE_IP = "10.96.0.1"
IN_CLUSTER_NAMES = [
    SERVICE_IP,
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
]


@contextlib.contextmanager
def control_plane(workdir: Path, address: str | None = None) -> Iterator[ControlPlane]:
    """``address``: serve on this (non-loopback) host address for pods to reach, through
    the ``kubernetes`` Service (kube-proxy routes its ClusterIP here), with service-account
    tokens admitted into pods. Default: loopback only, no pods (envtest's setting)."""
    workdir.mkdir(parents=True, exist_ok=True)
    host = address or "127.0.0.1"
    names = ["localhost", "127.0.0.1"] + ([address, *IN_CLUSTER_NAMES] if address else [])
    tls = certs.ensure(workdir / "pki", names)
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (workdir / "sa.key").write_bytes(
        sa_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    (workdir / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    token = secrets.token_hex(16)
    (workdir / "tokens.csv").write_text(f'{token},admin,admin-uid,"system:masters"\n')
    etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
    etcd_url = f"http://127.0.0.1:{etcd_port}"
    peer_url = f"http://127.0.0.1:{peer_port}"
    log = workdir / "control-plane.log"
    logf = log.open("ab")
    procs: list[subprocess.Popen] = []
    try:
        procs.append(
            subprocess.Popen(
                [
                    "etcd",
                    "--name",
                    "default",
                    "--data-dir",
                    str(workdir / "etcd"),
                    "--listen-client-urls",
                    etcd_url,
                    "--advertise-client-urls",
                    etcd_url,
                    "--listen-peer-urls",
                    peer_url,
                    "--initial-advertise-peer-urls",
                    peer_url,
                    "--initial-cluster",
                    f"default={peer_url}",
                    "--unsafe-no-fsync",
                    "--log-level",
                    "warn",
                ],
                stdout=logf,
                stderr=subprocess.STDOUT,
            )
        )
        procs.append(
            subprocess.Popen(
                [
                    str(KUBE_APISERVER),
                    f"--etcd-servers={etcd_url}",
                    f"--bind-address={host}",
                    f"--advertise-address={host}",
                    f"--secure-port={api_port}",
                    f"--tls-cert-file={tls.cert}",
                    f"--tls-private-key-file={tls.key}",
                    f"--token-auth-file={workdir / 'tokens.csv'}",
                    "--authorization-mode=RBAC",
                    "--service-account-issuer=https://kubernetes.default.svc",
                    f"--service-account-key-file={workdir / 'sa.pub'}",
                    f"--service-account-signing-key-file={workdir / 'sa.key'}",
                    "--service-cluster-ip-range=10.96.0.0/24",
                    *(
                        []
                        if address
                        else [
                            # No controller-manager makes the default ServiceAccount; pods
                            # must still be admitted.
                            "--disable-admission-plugins=ServiceAccount",
                            # The kubernetes Service endpoint may not be a loopback address.
                            "--endpoint-reconciler-type=none",
                        ]
                    ),
                    "--allow-privileged=true",
                    # devnode's kubelet is reached at its InternalIP (no DNS for node names)
                    "--kubelet-preferred-address-types=InternalIP",
                    f"--cert-dir={workdir / 'certs'}",
                ],
                stdout=logf,
                stderr=subprocess.STDOUT,
            )
        )
        url = f"https://{host}:{api_port}"
        kubeconfig = workdir / "kubeconfig"
        _write_kubeconfig(kubeconfig, url, tls.ca, token)
        cp = ControlPlane(url, token, tls.ca, kubeconfig, log)
        wait_until(lambda: cp.get("/readyz") == b"ok", procs, "kube-apiserver", log, 90, 0.5)
        yield cp
    finally:
        for p in reversed(procs):
            stop_process(p, 15)
        logf.close()
