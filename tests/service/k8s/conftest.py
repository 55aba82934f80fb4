from tests.service.k8s.fixtures import k8s_client, kube

__all__ = ["k8s_client", "kube"]
