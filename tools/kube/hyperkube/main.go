// hyperkube: the control plane, the kubelet, kube-proxy and kubectl in one binary, for the
// GPU machine, which takes at most 64 MiB of files per run (bench/gpu/k8s-carry.sh): they
// share most of their code, so one binary compresses to far less than six. Run as
// `hyperkube <component> [flags]`, or through a link named after the component.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

var commands = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	"kube-proxy":              func() *cobra.Command { return proxy.NewProxyCommand() },
	"kubelet":                 func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
	"kubectl":                 cmd.NewDefaultKubectlCommand,
}

func main() {
	args := os.Args
	if commands[filepath.Base(args[0])] == nil { // not a link: the component is the first argument
		args = args[1:]
	}
	if len(args) == 0 || commands[filepath.Base(args[0])] == nil {
		fmt.Fprintln(os.Stderr, "usage: hyperkube kube-apiserver|kube-controller-manager|kube-scheduler|kube-proxy|kubelet|kubectl [flags]")
		os.Exit(2)
	}
	c := commands[filepath.Base(args[0])]()
	c.SetArgs(args[1:])
	os.Exit(cli.Run(c))
}
