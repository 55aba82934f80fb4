"""Admissions as the kubelet makes them: many pods at once, its own choices, restarts, failures."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

import grpc
import pytest

from agent.deviceplugin.gen.deviceplugin.v1beta1 import api_pb2 as pb
from placement.snapshot import Health, NodeSnapshot
from tests.agent.deviceplugin.fake_kubelet import FakeKubelet
from tests.agent.deviceplugin.harness import Cluster, PluginProcess
from tests.waiting import wait_until
from topoplace.cli import main

NODE = "k8s-node"
GPU = "nvidia.com/gpu"


def _annotated(p: dict[str, Any]) -> list[str]:
    return str(p["metadata"]["annotations"]["topoplace.io/gpus"]).split(",")


def _start(
    cluster: Cluster, plugins: list[PluginProcess], server: str | None = None
) -> PluginProcess:
    p = PluginProcess(cluster, NODE).start(server)
    plugins.append(p)
    return p


def _held(cluster: Cluster, pod: str) -> list[str]:
    for r in cluster.reservations(NODE):
        if r["pod"] == pod:
            return sorted(r["devices"])
    return []


def test_ten_pods_in_quick_succession_each_get_their_own_reservation(
    cluster: Cluster, kubelet: FakeKubelet, plugins: list[PluginProcess]
):
    cluster.add_node("dgx2-v100", NODE)  # 16 GPUs
    _start(cluster, plugins)
    sizes = [1, 2, 1, 1, 2, 1, 1, 2, 1, 1]
    bound = [cluster.schedule(f"p{i}", n, NODE) for i, n in enumerate(sizes)]
    admitted = [kubelet.admit("ml-team", f"p{i}", GPU, n) for i, n in enumerate(sizes)]
    for p, a in zip(bound, admitted, strict=True):
        assert a.devices == _annotated(p), p["metadata"]["name"]
        assert (
            a.response.envs["TOPOPLACE_ALLOCATION"]
            == p["metadata"]["annotations"]["topoplace.io/allocation"]
        )
    every = [d for a in admitted for d in a.devices]
    assert len(every) == len(set(every)) == sum(sizes)  # none shared


def test_the_kubelets_own_choice_moves_the_allocation(
    cluster: Cluster,
    kubelet: FakeKubelet,
    plugins: list[PluginProcess],
    capsys: pytest.CaptureFixture[str],
):
    snap = cluster.add_node("hgx-h100", NODE)
    _start(cluster, plugins)
    p = cluster.schedule("trainer", 2, NODE)
    reserved = _annotated(p)
    other = [g.uuid for g in snap.gpus if g.uuid not in reserved][:2]
    admitted = kubelet.admit("ml-team", "trainer", GPU, 2, choose=other)
    assert admitted.preferred == reserved  # advisory: the kubelet took others
    assert admitted.response.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(other)
    assert "TOPOPLACE_ALLOCATION" not in admitted.response.envs
    wait_until(
        lambda: _held(cluster, "trainer") == sorted(other), "the allocation followed the truth"
    )
    mismatches = cluster.http.get("/v1/k8s/mismatches").json()
    assert mismatches["counts"]["moved"] == 1
    (seen,) = mismatches["recent"]
    assert seen["reserved"] == reserved and seen["allocated"] == other
    # What a person reads: `topoplace k8s reconcile`.
    assert main(["k8s", "reconcile", "--server", cluster.url]) == 0
    text = capsys.readouterr().out
    assert text.startswith("moved 1, created 0")
    assert f"ml-team/trainer  moved   {','.join(reserved)}  {','.join(other)}" in text


def test_a_pod_nobody_reserved_gets_an_allocation(
    cluster: Cluster, kubelet: FakeKubelet, plugins: list[PluginProcess]
):
    from bench.k8s_objects import pod

    cluster.add_node("hgx-h100", NODE)
    _start(cluster, plugins)
    manual = pod("manual", 1)
    manual["spec"]["nodeName"] = NODE  # placed by hand: no scheduler, no extender
    cluster.kube.add(manual)
    admitted = kubelet.admit("ml-team", "manual", GPU, 1)
    wait_until(lambda: _held(cluster, "manual") == admitted.devices, "an allocation was created")
    assert cluster.http.get("/v1/k8s/mismatches").json()["counts"]["created"] == 1
    # The next reserved pod does not get the manual pod's GPU.
    p = cluster.schedule("after", 1, NODE)
    assert _annotated(p) != admitted.devices
    assert kubelet.admit("ml-team", "after", GPU, 1).devices == _annotated(p)


def test_health_follows_the_node_within_an_interval(
    cluster: Cluster, kubelet: FakeKubelet, plugins: list[PluginProcess]
):
    snap = cluster.add_node("hgx-h100", NODE)
    plugin = _start(cluster, plugins)
    kubelet.plugin(GPU)
    assert set(kubelet.health(GPU).values()) == {"Healthy"}
    sick, lost = snap.gpus[1], snap.gpus[-1]
    plugin.write_node(_without_last_gpu(snap, sick=sick.index))
    health = wait_until(
        lambda: (
            (h := kubelet.health(GPU))[sick.uuid] == "Unhealthy"
            and h.get(lost.uuid) == "Unhealthy"
            and h
        ),
        "the sick and the lost GPU turned Unhealthy",
        timeout_s=5,
    )
    assert sum(v == "Healthy" for v in health.values()) == len(snap.gpus) - 2


def _without_last_gpu(snap: NodeSnapshot, sick: int) -> NodeSnapshot:
    """The node after its last GPU fell off the bus and GPU ``sick`` went bad."""
    d = snap.model_dump(mode="json")
    keep = len(d["gpus"]) - 1
    d["gpus"] = [
        {**g, "health": "unhealthy" if g["index"] == sick else g["health"]}
        for g in d["gpus"][:keep]
    ]
    d["links"] = [row[:keep] for row in d["links"][:keep]]
    d["nics"] = [{**n, "links": n["links"][:keep]} for n in d["nics"]]
    d["mig_instances"] = [m for m in d["mig_instances"] if m["parent_gpu"] < keep]
    return NodeSnapshot.model_validate(d)


def test_a_reservation_on_a_gpu_gone_bad_gets_healthy_ones(
    cluster: Cluster, kubelet: FakeKubelet, plugins: list[PluginProcess]
):
    snap = cluster.add_node("hgx-h100", NODE)
    plugin = _start(cluster, plugins)
    kubelet.plugin(GPU)
    p = cluster.schedule("unlucky", 2, NODE)
    reserved = _annotated(p)
    gpus = [
        g.model_copy(update={"health": Health.UNHEALTHY}) if g.uuid == reserved[0] else g
        for g in snap.gpus
    ]
    plugin.write_node(snap.model_copy(update={"gpus": gpus}))
    wait_until(lambda: kubelet.health(GPU)[reserved[0]] == "Unhealthy", "the GPU turned Unhealthy")
    admitted = kubelet.admit("ml-team", "unlucky", GPU, 2)
    assert reserved[0] not in admitted.devices and len(admitted.devices) == 2
    wait_until(
        lambda: _held(cluster, "unlucky") == sorted(admitted.devices), "the allocation moved"
    )


def test_a_kubelet_restart_is_followed_by_a_new_registration(
    cluster: Cluster, kubelet: FakeKubelet, plugins: list[PluginProcess]
):
    cluster.add_node("hgx-h100", NODE)
    _start(cluster, plugins)
    kubelet.plugin(GPU)
    kubelet.restart()
    wait_until(lambda: len(kubelet.registrations) == 2, "the plugin registered again", timeout_s=10)
    p = cluster.schedule("after-restart", 2, NODE)
    assert kubelet.admit("ml-team", "after-restart", GPU, 2).devices == _annotated(p)


def test_a_plugin_restart_gives_nothing_twice(
    cluster: Cluster, kubelet: FakeKubelet, plugins: list[PluginProcess]
):
    cluster.add_node("hgx-h100", NODE)
    first = _start(cluster, plugins)
    a = cluster.schedule("a", 2, NODE)
    kubelet.admit("ml-team", "a", GPU, 2)
    first.stop()
    kubelet.restart()  # the plugin's socket is gone with it, as after a node reboot
    _start(cluster, plugins)
    kubelet.plugin(GPU)
    b = cluster.schedule("b", 2, NODE)
    admitted = kubelet.admit("ml-team", "b", GPU, 2)
    assert admitted.devices == _annotated(b)
    assert not set(admitted.devices) & set(_annotated(a))


class Switch:
    """A loopback TCP forwarder to the service that can be turned off (connection refused)."""

    def __init__(self, target: str, port: int) -> None:
        host, _, target_port = target.removeprefix("http://").partition(":")
        self.target = (host, int(target_port))
        self.port = port
        self.listener: socket.socket | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def on(self) -> None:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(16)
        self.listener = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def off(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None

    def _accept(self, s: socket.socket) -> None:
        while True:
            try:
                client, _ = s.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for x in (a, b):
                with contextlib.suppress(OSError):
                    x.shutdown(socket.SHUT_RDWR)


def test_a_service_that_is_down_still_lets_pods_start_and_is_told_later(
    cluster: Cluster, kubelet: FakeKubelet, plugins: list[PluginProcess]
):
    cluster.add_node("hgx-h100", NODE)
    switch = Switch(cluster.url, 26417)
    p = cluster.schedule("offline", 2, NODE)
    reserved = _annotated(p)
    _start(cluster, plugins, server=switch.url)  # the switch is off: connection refused
    admitted = kubelet.admit("ml-team", "offline", GPU, 2)
    assert len(admitted.devices) == 2  # answered anyway, with the kubelet's own choice
    assert "NVIDIA_VISIBLE_DEVICES" in admitted.response.envs
    switch.on()
    try:
        wait_until(
            lambda: _held(cluster, "offline") == sorted(admitted.devices),
            "the truth reached the service once it was back",
            timeout_s=10,
        )
    finally:
        switch.off()
    if sorted(admitted.devices) != sorted(reserved):
        assert cluster.http.get("/v1/k8s/mismatches").json()["counts"]["moved"] == 1


def _stub(kubelet: FakeKubelet) -> Any:
    return kubelet.plugin(GPU).stub


@pytest.mark.parametrize(
    "request_",
    [
        pb.PreferredAllocationRequest(),
        pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=["GPU-nope"], allocation_size=1
                )
            ]
        ),
        pb.PreferredAllocationRequest(
            container_requests=[pb.ContainerPreferredAllocationRequest(allocation_size=1)]
        ),
    ],
    ids=["no-containers", "unknown-device", "size-above-available"],
)
def test_malformed_preferred_allocation_requests_are_invalid_arguments(
    cluster: Cluster, kubelet: FakeKubelet, plugins: list[PluginProcess], request_: Any
):
    cluster.add_node("hgx-h100", NODE)
    _start(cluster, plugins)
    with pytest.raises(grpc.RpcError) as caught:
        _stub(kubelet).GetPreferredAllocation(request_, timeout=5)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details()


def test_malformed_allocate_requests_are_invalid_arguments(
    cluster: Cluster, kubelet: FakeKubelet, plugins: list[PluginProcess]
):
    snap = cluster.add_node("hgx-h100", NODE)
    _start(cluster, plugins)
    stub = _stub(kubelet)
    uuid = snap.gpus[0].uuid
    bad = {
        "no containers": pb.AllocateRequest(),
        "no devices": pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest()]),
        "unknown device": pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=[uuid, "GPU-elsewhere"])]
        ),
        "twice": pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=[uuid, uuid])]
        ),
    }
    for what, request in bad.items():
        with pytest.raises(grpc.RpcError) as caught:
            stub.Allocate(request, timeout=5)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, what
    assert "GPU-elsewhere" in _details(stub, bad["unknown device"])
    # Nothing was handed out by the refused calls: the whole node is still free.
    assert len(kubelet.free(GPU)) == len(snap.gpus)


def _details(stub: Any, request: Any) -> str:
    try:
        stub.Allocate(request, timeout=5)
    except grpc.RpcError as exc:
        return str(exc.details())
    return ""


def test_a_preferred_allocation_asked_again_gets_the_same_reservation(
    cluster: Cluster, kubelet: FakeKubelet, plugins: list[PluginProcess]
):
    cluster.add_node("hgx-h100", NODE)
    _start(cluster, plugins)
    first = cluster.schedule("first", 1, NODE)
    second = cluster.schedule("second", 1, NODE)
    stub = kubelet.plugin(GPU).stub
    request = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=kubelet.free(GPU), allocation_size=1
            )
        ]
    )
    # The kubelet's admission of the first pod failed after the answer; it asks again.
    for _ in range(2):
        answer = stub.GetPreferredAllocation(request, timeout=5)
        assert list(answer.container_responses[0].deviceIDs) == _annotated(first)
    assert kubelet.admit("ml-team", "first", GPU, 1).devices == _annotated(first)
    assert kubelet.admit("ml-team", "second", GPU, 1).devices == _annotated(second)


def test_a_pod_split_over_two_containers_gets_its_reservation_in_parts(
    cluster: Cluster, kubelet: FakeKubelet, plugins: list[PluginProcess]
):
    cluster.add_node("hgx-h100", NODE)
    _start(cluster, plugins)
    # The extender reserves the pod's total (its containers' limits summed).
    split = cluster.schedule("split", 4, NODE)
    solo = cluster.schedule("solo", 1, NODE)
    reserved = _annotated(split)
    # The kubelet admits the pod container by container: two GPUs each.
    first = kubelet.admit("ml-team", "split", GPU, 2, container="trainer")
    second = kubelet.admit("ml-team", "split", GPU, 2, container="helper")
    assert first.devices + second.devices == reserved  # in the reservation's order
    for part in (first, second):
        assert part.response.envs["CUDA_VISIBLE_DEVICES"] == ",".join(part.devices)
        allocation = split["metadata"]["annotations"]["topoplace.io/allocation"]
        assert part.response.envs["TOPOPLACE_ALLOCATION"] == allocation
    assert kubelet.admit("ml-team", "solo", GPU, 1).devices == _annotated(solo)
    # The truth agrees: nothing moved, nothing created, nothing held twice.
    wait_until(
        lambda: (
            {r["pod"] for r in cluster.reservations(NODE)} == {"split", "solo"}
            and cluster.http.get("/v1/k8s/mismatches").json()["counts"]["moved"] == 0
        ),
        "the plugin reported both pods",
    )
    assert _held(cluster, "split") == sorted(reserved)
    counts = cluster.http.get("/v1/k8s/mismatches").json()["counts"]
    assert (counts["moved"], counts["created"], counts["unmatched"]) == (0, 0, 0)


def test_a_plugin_restarted_between_two_containers_of_a_pod_gives_it_the_rest(
    cluster: Cluster, kubelet: FakeKubelet, plugins: list[PluginProcess]
):
    cluster.add_node("hgx-h100", NODE)
    plugin = _start(cluster, plugins)
    reserved = _annotated(cluster.schedule("split", 3, NODE))
    first = kubelet.admit("ml-team", "split", GPU, 1, container="trainer")
    assert first.devices == reserved[:1]
    plugin.stop()
    kubelet.restart()  # a fresh registration to wait for
    _start(cluster, plugins)
    kubelet.plugin(GPU)
    # Rebuilt from PodResources: the pod holds part of its reservation; the rest is its own.
    second = kubelet.admit("ml-team", "split", GPU, 2, container="helper")
    assert second.devices == reserved[1:]


def test_an_app_container_reusing_its_init_containers_gpu_gets_the_rest_of_the_reservation(
    cluster: Cluster, kubelet: FakeKubelet, plugins: list[PluginProcess]
):
    cluster.add_node("hgx-h100", NODE)
    _start(cluster, plugins)
    gone = cluster.schedule("gone", 1, NODE)
    # The extender reserves the larger of the init container's and the app's counts.
    reserved = _annotated(cluster.schedule("staged", 3, NODE))
    # The first pod's GPUs are free again: the nearest free ones are not the reservation.
    gone_id = gone["metadata"]["annotations"]["topoplace.io/allocation"]
    assert cluster.http.post(f"/v1/allocations/{gone_id}/release").status_code == 200
    init = kubelet.admit("ml-team", "staged", GPU, 1, container="fetch")
    assert init.devices == reserved[:1]
    # The app container gets the init container's GPU first; the kubelet asks for the
    # rest with it as must-include, among every free GPU.
    main = kubelet.admit("ml-team", "staged", GPU, 3, reuse=init.devices)
    assert main.devices == reserved, (main.preferred, reserved)
    (allocation,) = [r["allocation_id"] for r in cluster.reservations(NODE)]
    assert main.response.envs["TOPOPLACE_ALLOCATION"] == allocation


def test_an_app_container_given_its_init_containers_gpus_alone_gets_the_reservations_wiring(
    cluster: Cluster, kubelet: FakeKubelet, plugins: list[PluginProcess]
):
    cluster.add_node("hgx-h100", NODE)
    _start(cluster, plugins)
    reserved = _annotated(cluster.schedule("warm", 2, NODE))
    init = kubelet.admit("ml-team", "warm", GPU, 2, container="check")
    assert init.devices == reserved
    # The init container's GPUs suffice: the kubelet asks nothing and allocates them in
    # its own (a set's) order.
    main = kubelet.admit("ml-team", "warm", GPU, 2, reuse=reserved[::-1])
    assert main.preferred == [] and main.devices == reserved[::-1]
    envs = main.response.envs
    assert envs["CUDA_VISIBLE_DEVICES"] == ",".join(reserved), envs
    (allocation,) = [r["allocation_id"] for r in cluster.reservations(NODE)]
    assert envs["TOPOPLACE_ALLOCATION"] == allocation
    assert envs["NCCL_P2P_LEVEL"] == "NVL"


def test_a_gang_member_the_kubelet_gave_other_gpus_moves_its_task(
    cluster: Cluster, kubelet: FakeKubelet, plugins: list[PluginProcess]
):
    snap = cluster.add_node("hgx-h100", NODE)
    _start(cluster, plugins)
    ring = {"topoplace.io/gang": "ring", "topoplace.io/gang-size": "2"}
    first = cluster.schedule("ring-0", 2, NODE, annotations=ring)
    second = cluster.schedule("ring-1", 2, NODE, annotations=ring)
    mine, theirs = _annotated(first), _annotated(second)
    other = [g.uuid for g in snap.gpus if g.uuid not in mine + theirs][:2]
    admitted = kubelet.admit("ml-team", "ring-0", GPU, 2, choose=other)
    assert admitted.response.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(other)
    # Gang members are not in the node's reservation list (docs/kubernetes.md, "Not
    # done"): here the kubelet gives ring-1 its task's GPUs itself.
    kubelet.admit("ml-team", "ring-1", GPU, 2, choose=theirs)

    def tasks() -> list[list[str]]:
        listed = cluster.http.get("/v1/allocations", params={"node": NODE}).json()
        return sorted(sorted(t["gpu_uuids"]) for a in listed["allocations"] for t in a["tasks"])

    wait_until(lambda: tasks() == sorted([sorted(other), sorted(theirs)]), "ring-0's task moved")
    assert cluster.http.get("/v1/k8s/mismatches").json()["counts"]["moved"] == 1
