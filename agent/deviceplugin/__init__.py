"""``topoplace device-plugin``: the kubelet device plugin giving a pod the GPUs the service chose.

docs/kubernetes.md ("The device plugin") says how it finds the pod behind an
admission, what the container gets, and how the kubelet's real choice is
reported back.
"""
