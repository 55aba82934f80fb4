"""`topoplace device-plugin`: the kubelet device plugin, run beside the agent on a GPU node.

Exit status, as the agent's (docs/agent.md): 0 stopped by SIGTERM or SIGINT;
2 bad settings (an unknown source kind or profile, a missing or unreadable
topology file among them); 4 the node cannot be read on this machine (NVML
missing).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path

from agent import SOURCE_KINDS
from agent.deviceplugin.container import STRATEGIES, ContainerOptions
from agent.deviceplugin.mig_caps import MIG_MINORS
from topoplace_client.arguments import positive_seconds

EXIT_OK, EXIT_USAGE, EXIT_DISCOVERY = 0, 2, 4
ENV = "TOPOPLACE_DEVICE_PLUGIN_"
log = logging.getLogger("topoplace.deviceplugin")


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(ENV + name, default)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "device-plugin",
        help="run the kubelet device plugin: pods get exactly the GPUs topoplace chose",
        description=(
            "Advertise this node's GPUs (and MIG instances) to the kubelet, hand each pod the"
            " GPUs of its topoplace reservation, and report what the kubelet really allocated"
            f" (docs/kubernetes.md). Flags, else {ENV}* environment variables."
        ),
        epilog="exit status: 0 stopped; 2 bad settings; 4 the node cannot be read",
    )
    p.add_argument("--server", metavar="URL", default=_env("SERVER"), help="the service")
    p.add_argument(
        "--token-file",
        type=Path,
        metavar="PATH",
        default=_env("TOKEN_FILE"),
        help="the node's agent token (the agent's own; read again when the service refuses it)",
    )
    p.add_argument("--ca-bundle", type=Path, metavar="PEM", default=_env("CA_BUNDLE"))
    p.add_argument("--node-name", metavar="NAME", default=_env("NODE_NAME"))
    p.add_argument("--source", metavar="SOURCE", default=_env("SOURCE", "nvml"), help=SOURCE_KINDS)
    p.add_argument("--gpu-model", metavar="MODEL", default="unknown", help="for smi:FILE sources")
    p.add_argument(
        "--resource",
        dest="resources",
        action="append",
        metavar="NAME",
        help="a resource to serve (repeatable; default: whole GPUs and every MIG profile present)",
    )
    p.add_argument(
        "--gpu-resource",
        default=_env("GPU_RESOURCE", "nvidia.com/gpu"),
        help="the name whole GPUs are advertised as (default nvidia.com/gpu)",
    )
    p.add_argument(
        "--kubelet-dir",
        type=Path,
        default=Path(_env("KUBELET_DIR", "/var/lib/kubelet/device-plugins") or ""),
        help="the kubelet's device-plugin folder (kubelet.sock is there)",
    )
    p.add_argument(
        "--pod-resources-socket",
        type=Path,
        default=Path(_env("POD_RESOURCES", "/var/lib/kubelet/pod-resources/kubelet.sock") or ""),
    )
    p.add_argument(
        "--strategy",
        dest="strategies",
        action="append",
        choices=STRATEGIES,
        help="how the runtime is told the devices (repeatable; default envvar)",
    )
    p.add_argument("--device-specs", action="store_true", help="also list /dev/nvidia* nodes")
    p.add_argument(
        "--driver-root",
        metavar="PATH",
        default=_env("DRIVER_ROOT", "/"),
        help="where the driver's /dev is on the host, for --device-specs: their host paths"
        " are under it, the container's stay /dev/... (NVIDIA's GPU operator:"
        " /run/nvidia/driver; default %(default)s)",
    )
    p.add_argument(
        "--mig-minors",
        type=Path,
        metavar="PATH",
        default=Path(_env("MIG_MINORS", str(MIG_MINORS)) or ""),
        help="the driver's MIG capability list, for --device-specs (default %(default)s)",
    )
    p.add_argument("--no-cuda-env", action="store_true", help="no CUDA_VISIBLE_DEVICES")
    p.add_argument("--no-nccl-hints", action="store_true", help="no NCCL_P2P_LEVEL")
    p.add_argument(
        "--interval",
        dest="interval_s",
        type=positive_seconds,
        default=15.0,
        help="how often the node's health is read (the agent's interval)",
    )
    p.add_argument(
        "--reconcile-interval",
        dest="truth_interval_s",
        type=positive_seconds,
        default=10.0,
        help="how often PodResources is read and reported",
    )
    p.add_argument(
        "--timeout",
        dest="timeout_s",
        type=positive_seconds,
        default=2.0,
        help="service calls (the kubelet waits on admissions)",
    )
    p.add_argument(
        "--publish-topology",
        action="store_true",
        help="keep this node's NodeResourceTopology object (in-cluster account)",
    )
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.set_defaults(func=run_plugin)


def _fail(message: str, code: int) -> int:
    print(f"topoplace device-plugin: {message}", file=sys.stderr)
    return code


def run_plugin(args: argparse.Namespace) -> int:
    from agent.deviceplugin.daemon import DevicePluginDaemon, PluginSettings, ServiceLink
    from agent.deviceplugin.token_file import TokenFile, read_token
    from agent.sources import DiscoveryUnavailable, Identity, SourceError, open_source
    from topoplace_client.api import TopoplaceClient

    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not args.server:
        return _fail(f"no service: set --server or {ENV}SERVER", EXIT_USAGE)
    if not args.driver_root.startswith("/"):
        # The kubelet takes a device spec's host path as it is: a relative one would be
        # read against whatever folder the runtime happens to run in.
        return _fail(f"--driver-root {args.driver_root!r} is not an absolute path", EXIT_USAGE)
    if args.driver_root.rstrip("/") and not args.device_specs:
        log.warning(
            "--driver-root %s changes only the host paths of --device-specs, which is off:"
            " the runtime finds the devices itself",
            args.driver_root,
        )
    if not args.kubelet_dir.is_dir():
        return _fail(
            f"--kubelet-dir {args.kubelet_dir} is not a folder (mount the kubelet's"
            " device-plugins folder into the container)",
            EXIT_USAGE,
        )
    token = None
    if args.token_file is not None:
        try:
            token = read_token(args.token_file)
        except OSError as exc:
            return _fail(f"cannot read --token-file {args.token_file}: {exc.strerror}", EXIT_USAGE)
    node = args.node_name or socket.gethostname()
    try:
        source = open_source(args.source, Identity(node), gpu_model=args.gpu_model)
    except DiscoveryUnavailable as exc:
        return _fail(str(exc), EXIT_DISCOVERY)
    except SourceError as exc:
        return _fail(str(exc), EXIT_USAGE)
    ca = str(args.ca_bundle) if args.ca_bundle else None
    try:
        clients = [
            TopoplaceClient(args.server, timeout=args.timeout_s, token=token, ca_bundle=ca)
            for _ in range(2)
        ]
    except ValueError as exc:
        return _fail(str(exc), EXIT_USAGE)
    options = ContainerOptions(
        strategies=tuple(args.strategies or ("envvar",)),
        device_specs=args.device_specs,
        cuda_env=not args.no_cuda_env,
        nccl_hints=not args.no_nccl_hints,
        driver_root=args.driver_root,
    )
    settings = PluginSettings(
        node=node,
        resources=tuple(args.resources or ()),
        whole_gpu_resource=args.gpu_resource,
        kubelet_dir=args.kubelet_dir,
        pod_resources_socket=args.pod_resources_socket,
        options=options,
        interval_s=args.interval_s,
        truth_interval_s=args.truth_interval_s,
        mig_minors=args.mig_minors,
    )
    publisher = None
    if args.publish_topology:
        from agent.deviceplugin.kube_publish import PublishError, TopologyPublisher

        try:
            publisher = TopologyPublisher.in_cluster()
        except PublishError as exc:
            return _fail(str(exc), EXIT_USAGE)
    tokens = None if args.token_file is None else TokenFile(args.token_file, clients, token)
    link = ServiceLink(node, clients[0], clients[1], tokens)
    daemon = DevicePluginDaemon(settings, source, link, publisher)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: daemon.stop.set())
    try:
        daemon.run()
    finally:
        for client in clients:
            client.close()
    return EXIT_OK
