// Command pause holds a pod's namespaces open: it sleeps until it is told to stop and reaps
// the orphans that the pod's other processes leave to it as PID 1 of the pod's PID namespace.
// It is the sandbox image of the lab's clusters, built here like every other image they run.
// With -v it prints its name and exits 0, as the upstream pause does: kubeadm's upgrade health
// check runs the pause image with -v in a Job and waits for it to complete.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("pause (gpuinfra)")
		return
	}
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
