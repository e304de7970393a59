# One image for every cluster component: snapshot-webhook, snapshot-controller and the node
# agent (snapshot-agent run, which runs runc and CRIU). The shim itself runs on the host, under
# containerd; the agent's init container (snapshot-agent install-node) puts it there
# (docs/kubernetes.md).
#
#   docker build -t <registry>/snapshot:0.1.0 .
FROM debian:trixie-slim

# The Debian packages: image/debian-packages, the one list this build and the one without
# Docker (tools/build-image.sh, mmdebstrap) both install. CRIU >= 4.2 is only in unstable:
# pinned from there (the /sid entries), the rest from trixie, as scripts/setup-system.sh does.
COPY image/debian-packages /tmp/debian-packages
RUN printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: sid\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      > /etc/apt/sources.list.d/sid.sources \
 && printf 'Package: *\nPin: release n=sid\nPin-Priority: 50\n' > /etc/apt/preferences.d/sid \
 && apt-get update -q \
 && apt-get install -y -q --no-install-recommends $(grep -v '^#' /tmp/debian-packages) \
 && rm -rf /var/lib/apt/lists/* /tmp/debian-packages

COPY pyproject.toml README.md /src/
COPY api /src/api
COPY restore_runtime /src/restore_runtime
COPY shim /src/shim
COPY webhook /src/webhook
COPY controller /src/controller
COPY agent /src/agent
COPY signer /src/signer
COPY kubeclient /src/kubeclient
COPY scripts/link-pycriu.sh /src/scripts/
RUN python3 -m venv /opt/snapshot \
 && /opt/snapshot/bin/pip install --no-cache-dir '/src[control,gpu]' \
 && bash /src/scripts/link-pycriu.sh /opt/snapshot \
 && rm -rf /src
ENV PATH=/opt/snapshot/bin:$PATH
# the webhook and controller run as this user (the chart sets runAsUser); the agent as root
USER 65532:65532
