// etcd for the kind node image (tools/build-kind-tools.sh): the release kubeadm asks for,
// built from its Go module, since no registry is reachable to pull registry.k8s.io/etcd.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
