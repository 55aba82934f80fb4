from tests.agent.deviceplugin.harness import cluster, kubelet, plugins

__all__ = ["cluster", "kubelet", "plugins"]
