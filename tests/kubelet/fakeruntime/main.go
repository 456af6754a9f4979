// flexvol-fakeruntime serves the kubelet's own in-tree fake CRI runtime
// (k8s.io/kubernetes/pkg/kubelet/cri/remote/fake) on a unix socket, so a
// standalone kubelet can run (and drive volume plugins) without a real
// container runtime. It is built by tests/kubelet/setup inside the Debian
// kubernetes source tree (GOPATH mode, vendored dependencies).
//
// Usage: flexvol-fakeruntime unix:///path/to/runtime.sock
package main

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	fakeremote "k8s.io/kubernetes/pkg/kubelet/cri/remote/fake"
)

func main() {
	if len(os.Args) != 2 || !strings.HasPrefix(os.Args[1], "unix://") {
		fmt.Fprintln(os.Stderr, "usage: flexvol-fakeruntime unix:///path/to/runtime.sock")
		os.Exit(2)
	}
	endpoint := os.Args[1]
	sockPath := strings.TrimPrefix(endpoint, "unix://")
	// A stale socket from a killed run would make Listen fail.
	_ = os.Remove(sockPath)

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)

	rt := fakeremote.NewFakeRemoteRuntime()
	if err := rt.Start(endpoint); err != nil {
		fmt.Fprintf(os.Stderr, "flexvol-fakeruntime: start %s: %v\n", endpoint, err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "flexvol-fakeruntime: serving fake CRI on %s (pid %d)\n", endpoint, os.Getpid())

	sig := <-sigs
	fmt.Fprintf(os.Stderr, "flexvol-fakeruntime: got %v, stopping\n", sig)
	rt.Stop()
	_ = os.Remove(sockPath)
}
