from tests.service.k8s.fixtures import api, k8s_client, kube

__all__ = ["api", "k8s_client", "kube"]
