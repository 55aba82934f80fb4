"""The Kubernetes integration: kube-scheduler extender (filter, prioritize, bind, preempt)."""
