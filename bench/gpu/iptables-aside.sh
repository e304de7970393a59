#!/usr/bin/env bash
# Debian's iptables on a GPU machine whose image has none (CRIU's network lock, kube-proxy):
# unpacked under PREFIX, behind wrappers in BINDIR that find its libraries and match modules
# there (so whatever runs them, CRIU included, needs no environment of its own). The nft
# backend first, legacy where the kernel lacks nf_tables.
#
#   bash bench/gpu/iptables-aside.sh DEBDIR PREFIX BINDIR
set -euo pipefail
debs=$1 prefix=$2 bin=$3
for f in "$debs"/{iptables,libip4tc2,libip6tc2,libnetfilter-conntrack3,libnfnetlink0,libxtables12}_*.deb; do
  [[ -e $f ]] && dpkg -x "$f" "$prefix"  # libxtables12 may come with CRIU's own packages
done
libs=$prefix/usr/lib/x86_64-linux-gnu
mkdir -p "$bin"
for backend in nft legacy; do
  for c in iptables iptables-restore iptables-save ip6tables ip6tables-restore ip6tables-save; do
    # the multi-call binary takes the command as its first argument (dpkg -x makes no links)
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} XTABLES_LIBDIR=%s/xtables exec %s/usr/sbin/xtables-%s-multi %s "$@"\n' \
      "$libs" "$libs" "$prefix" "$backend" "$c" > "$bin/$c"
    chmod +x "$bin/$c"
  done
  if "$bin/iptables" -L -n >/dev/null 2>&1; then
    echo "iptables: xtables-$backend in $bin"
    exit 0
  fi
done
echo "iptables: neither backend works on this kernel" >&2
exit 1
