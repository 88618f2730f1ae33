"""The kubernetes role: kubeadm HA control plane on the external etcd, Calico with native
routing, GPU workers registered with the preflight taint, rate-limited joins."""
