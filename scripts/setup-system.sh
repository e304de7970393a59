#!/usr/bin/env bash
# Installs the system packages Snapshot needs, idempotently, on Debian 12 or 13.
#
# CRIU must be >= 4.2: Debian 12's 3.17 fails on current kernels ("vdso: Unexpected
# rt vDSO area bounds") and 4.1.1 cannot dump TCP sockets on kernel 6.18. 4.2.x is
# only in unstable, so apt pinning takes criu and its three newer libraries from
# unstable and everything else from Debian 13, keeping the upgrade as small as apt
# allows.
set -euo pipefail

log() { printf '[setup-system] %s\n' "$*"; }

if [[ $(id -u) -ne 0 ]]; then
  echo "setup-system.sh must run as root (it installs packages)" >&2
  exit 1
fi

criu_ok() {
  command -v criu >/dev/null 2>&1 || return 1
  local v
  v=$(criu --version 2>/dev/null | awk '/^Version:/ {print $2}')
  dpkg --compare-versions "${v:-0}" ge 4.2
}

# procps: pgrep, which the tests use to find (and the teardown check for) leftover processes
# mmdebstrap, skopeo, docker-registry: the project image without Docker, pushed to a
# loopback registry (devnode's cluster); conntrack: kube-proxy's; docker.io: kind's (the kind
# smoke starts a private daemon of its own, devnode/docker.py)
PKGS=(containerd runc iptables containernetworking-plugins busybox-static etcd-server
      iproute2 procps python3-pycriu criu mmdebstrap skopeo docker-registry conntrack docker.io
      docker-cli)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]] && criu_ok; then
  log "all system packages present ($(criu --version | head -1))"
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
. /etc/os-release
if [[ "${VERSION_CODENAME}" != "sid" ]]; then
  log "adding Debian 13 and unstable sources with low pin priority"
  cat > /etc/apt/sources.list.d/snapshot-trixie-sid.sources <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie sid
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  cat > /etc/apt/preferences.d/snapshot-pin <<PIN
Package: *
Pin: release n=${VERSION_CODENAME}
Pin-Priority: 500

Package: *
Pin: release n=trixie
Pin-Priority: 100

Package: *
Pin: release n=sid
Pin-Priority: 50
PIN
fi
apt-get update -q
SID=(criu/sid libcompel1/sid libnet9/sid libnl-3-200/sid python3-pycriu/sid)
EXTRA=()
if [[ "${VERSION_CODENAME}" == "bookworm" ]]; then
  # libc6 >= 2.38 is needed by criu; the t64 gnutls replaces bookworm's libgnutls30.
  EXTRA=(libc6/trixie libc-bin/trixie libgnutls30-)
  dpkg-query -W tmux >/dev/null 2>&1 && EXTRA+=(tmux)
fi
log "installing: ${PKGS[*]}"
# No service may start on install: a Docker daemon with its defaults rewrites the host's
# iptables (FORWARD policy DROP), which the CNI tests would meet.
printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
chmod 755 /usr/sbin/policy-rc.d
trap 'rm -f /usr/sbin/policy-rc.d' EXIT
apt-get install -y -q -o Dpkg::Options::=--force-confold -t trixie \
  containerd runc iptables containernetworking-plugins busybox-static etcd-server iproute2 \
  procps mmdebstrap skopeo docker-registry conntrack "${SID[@]}" "${EXTRA[@]}"
# Docker for kind, without its recommends (needrestart, which hooks into every later apt run;
# apparmor; git; perl): the daemon and the CLI only
apt-get install -y -q --no-install-recommends -o Dpkg::Options::=--force-confold -t trixie \
  docker.io docker-cli
# The distro services are not used: tests and the demo run private instances.
systemctl disable --now containerd etcd docker-registry docker docker.socket >/dev/null 2>&1 || true
criu_ok || { echo "criu >= 4.2 not installed: $(criu --version 2>&1 | head -1)" >&2; exit 1; }
log "done: $(criu --version | head -1), $(runc --version | head -1), containerd $(containerd --version | awk '{print $3}')"
