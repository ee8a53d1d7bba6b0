// pause: the pod sandbox's init process for the real one-node cluster of hack/e2e.sh (no registry here to pull
// registry.k8s.io/pause from). Like upstream's pause.c: sleep until SIGINT/SIGTERM, reap nothing else.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
}
