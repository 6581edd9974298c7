// Command pause is the CRI lab's image (a pod sandbox's and a test
// container's): a static binary that sleeps until SIGTERM or SIGINT, as
// Kubernetes' pause does. No image registry is reachable from the lab.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// As PID 1 of its PID namespace only handled signals reach it.
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
