"""`topoplace slurm gres-conf|node-conf|epilog` against a real service on loopback."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from placement.profiles import build_profile
from service.app import create_app
from service.settings import Settings
from slurm_formats.conf import gres_conf_lines, node_conf_line
from tests.agent.scripted_front import BUSY, DOWN, TRY_LATER, Answer, ScriptedFront
from tests.live_server import live_server
from topoplace.cli import main
from topoplace_client.api import TopoplaceClient


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = tmp_path_factory.mktemp("slurm-cmd") / "t.sqlite3"
    app = create_app(Settings(database_url=f"sqlite:///{db}", heartbeat_ttl_s=3600))
    with live_server(app) as url:
        with TopoplaceClient(url) as client:
            for name in ("gpu1", "gpu2"):
                snap = build_profile("dgx1-v100", name)
                client.put_snapshot(name, snap.model_dump(mode="json"))
        yield url


def test_gres_conf_prints_every_gpu_of_every_node(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["slurm", "gres-conf", "gpu[1-2]", "--device-dir", "/fake", "--server", server])
    assert code == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if not x.startswith("#")]
    expected = [
        line
        for name in ("gpu1", "gpu2")
        for line in gres_conf_lines(build_profile("dgx1-v100", name), "/fake")
    ]
    assert lines == expected


def test_node_conf_prints_one_line_per_node(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["slurm", "node-conf", "gpu1", "--extra", "State=UNKNOWN", "--server", server]) == 0
    assert capsys.readouterr().out.splitlines() == [
        node_conf_line(build_profile("dgx1-v100", "gpu1"), "State=UNKNOWN")
    ]


def test_an_unknown_node_is_a_refusal(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["slurm", "gres-conf", "nope", "--server", server]) == 1
    assert "no node named 'nope'" in capsys.readouterr().err


def _config(
    tmp_path: Path, server: str, admin_comment: str, exit_code: int = 0, name: str = "x"
) -> Path:
    """topoplace.conf naming the service and a stand-in scontrol printing the job."""
    script = tmp_path / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        f"echo 'JobId=7 JobName={name} WorkDir=/tmp AdminComment={admin_comment}"
        " StdErr=/dev/null'\n"
        f"exit {exit_code}\n"
    )
    script.chmod(0o755)
    config = tmp_path / "topoplace.conf"
    config.write_text(f"# as job_submit.lua reads it\nserver = {server}\nscontrol = {script}\n")
    return config


def test_the_epilog_releases_the_allocations_named_in_the_admin_comment(
    server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = {"tres_per_node": "gres:gpu:2", "user_name": "alice"}
    decision = httpx.post(f"{server}/v1/slurm/job-submit", json=body, trust_env=False).json()
    config = _config(tmp_path, server, decision["set"]["admin_comment"])
    argv = ["slurm", "epilog", "--config", str(config), "--job", "7", "--user", "alice"]
    assert main(argv) == 0
    [allocation_id] = decision["allocation_ids"]
    assert f"allocation {allocation_id} released: True" in capsys.readouterr().out
    with TopoplaceClient(server) as client:
        assert client.allocation(allocation_id)["state"] == "released"


def test_the_epilog_leaves_other_jobs_alone_and_reports_a_failed_read(
    server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, server, "")
    assert main(["slurm", "epilog", "--config", str(config), "--job", "7"]) == 0
    assert capsys.readouterr().out == ""
    config = _config(tmp_path, server, "", exit_code=1)
    assert main(["slurm", "epilog", "--config", str(config), "--job", "7"]) == 3
    assert "cannot read job 7" in capsys.readouterr().err


def test_the_epilog_releases_only_allocations_made_for_the_jobs_user(
    server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """scontrol prints the job's name (and work directory) as the user wrote them, before
    the admin comment: a job named like an admin comment must not end another user's job."""

    def submit(user: str) -> dict[str, Any]:
        body = {"tres_per_node": "gres:gpu:1", "user_name": user}
        answer: dict[str, Any] = httpx.post(
            f"{server}/v1/slurm/job-submit", json=body, trust_env=False
        ).json()
        return answer

    victim, own = submit("alice"), submit("mallory")
    name = f"x AdminComment={victim['set']['admin_comment']}"
    config = _config(tmp_path, server, own["set"]["admin_comment"], name=name)
    monkeypatch.setenv("SLURM_JOB_USER", "mallory")
    assert main(["slurm", "epilog", "--config", str(config), "--job", "7"]) == 0
    with TopoplaceClient(server) as client:
        kept = client.allocation(victim["allocation_ids"][0])
        mine = client.allocation(own["allocation_ids"][0])
    assert kept["state"] == "active", "another user's allocation was released"
    assert mine["state"] == "released", capsys.readouterr().out


def test_gres_conf_names_device_files_by_the_stored_minor_numbers(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    snap = build_profile("dgx1-v100", "gpu9")
    minors = [7, 6, 5, 4, 3, 2, 1, 0]
    gpus = [
        g.model_copy(update={"minor_number": m}) for g, m in zip(snap.gpus, minors, strict=True)
    ]
    with TopoplaceClient(server) as client:
        client.put_snapshot("gpu9", snap.model_copy(update={"gpus": gpus}).model_dump(mode="json"))
    assert main(["slurm", "gres-conf", "gpu9", "--device-dir", "/fake", "--server", server]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if not x.startswith("#")]
    # Was: File=/fake/nvidia<index>, another GPU's device file wherever the two differ.
    assert [line.split()[3] for line in lines] == [f"File=/fake/nvidia{m}" for m in minors]


@pytest.fixture(scope="module")
def fronted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ScriptedFront]]:
    """A real service behind a front that answers some requests itself (429, 503)."""
    db = tmp_path_factory.mktemp("slurm-front") / "t.sqlite3"
    # No background loops: the reconcile loop's squeue must not release what a test holds.
    settings = Settings(database_url=f"sqlite:///{db}", heartbeat_ttl_s=3600)
    app = create_app(settings, background=False)
    front = ScriptedFront(app)
    with live_server(app) as url:
        with TopoplaceClient(url) as client:
            client.put_snapshot("gpu1", build_profile("dgx1-v100", "gpu1").model_dump(mode="json"))
        yield url, front
        front.answers.clear()


def _reserve(server: str, user: str) -> tuple[str, str]:
    """A job's reservation by the submit filter: its allocation id and admin comment."""
    body = {"tres_per_node": "gres:gpu:1", "user_name": user}
    decision = httpx.post(f"{server}/v1/slurm/job-submit", json=body, trust_env=False).json()
    [allocation_id] = decision["allocation_ids"]
    return allocation_id, decision["set"]["admin_comment"]


def test_the_epilog_retries_a_service_that_asks_to_be_asked_later(
    fronted: tuple[str, ScriptedFront], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 429 and a 503 before the allocation is read: it is retried, after the 429's
    Retry-After, and released. It used to be taken for an id naming nothing: left alone."""
    server, front = fronted
    allocation_id, comment = _reserve(server, "alice")
    front.seen.clear()
    front.answer(429, {"Retry-After": "1"}, BUSY)
    front.answer(503, None, DOWN)
    config = _config(tmp_path, server, comment)
    started = time.monotonic()
    argv = ["slurm", "epilog", "--config", str(config), "--job", "7", "--user", "alice"]
    assert main(argv) == 0, capsys.readouterr().err
    took = time.monotonic() - started
    assert f"allocation {allocation_id} released: True" in capsys.readouterr().out
    reads = [seen for seen in front.seen if seen[0] == "GET"]
    assert len(reads) == 3 and took >= 1.0, (front.seen, took)  # the Retry-After waited
    with TopoplaceClient(server) as client:
        assert client.allocation(allocation_id)["state"] == "released"


@pytest.mark.parametrize("answer", TRY_LATER)
def test_the_epilog_gives_up_in_time_and_says_what_is_left_held(
    fronted: tuple[str, ScriptedFront],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    answer: Answer,
) -> None:
    """A service that keeps answering 429 or 503: exit 3, try later, within the limit, with
    a line per thing left held. It used to exit 0 with the allocation 'left alone'."""
    server, front = fronted
    allocation_id, comment = _reserve(server, "alice")
    front.seen.clear()
    for _ in range(20):
        front.answer(*answer)
    config = _config(tmp_path, server, comment)
    argv = ["slurm", "epilog", "--config", str(config), "--job", "7", "--user", "alice"]
    started = time.monotonic()
    code = main([*argv, "--retry-for", "1.5"])
    took = time.monotonic() - started
    front.answers.clear()
    out, err = capsys.readouterr()
    assert code == 3, (out, err)
    # The limit, not the clock, is what is checked: within 1.5 s the 429's Retry-After
    # (1 s) leaves room for 2 tries and the 503's backoff (0.25 s, doubling) for 3; the
    # default 5 s would have made 5. A slow machine makes fewer, never more. Wall time
    # is only bounded against a hang: a busy machine took 3.1 s where a quiet one takes
    # 1.6 (the limit plus the last request, docs/slurm.md).
    assert 1 <= len(front.seen) <= 3, front.seen
    assert took < 10, took
    assert f"allocation {allocation_id} left held (try later: " in err
    assert str(answer[2]["error"]["code"]) in err
    assert "the allocations carrying job 7 left held" in err and "left alone" not in out
    with TopoplaceClient(server) as client:
        assert client.allocation(allocation_id)["state"] == "active"


def test_the_epilog_leaves_an_id_the_service_does_not_know_alone(
    fronted: tuple[str, ScriptedFront], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """404 not_found, the service's own answer, is a fact about the id: left alone, exit 0."""
    server, _ = fronted
    config = _config(tmp_path, server, "topoplace alloc=no-such-allocation ring=1GB/s")
    argv = ["slurm", "epilog", "--config", str(config), "--job", "7", "--user", "alice"]
    assert main(argv) == 0
    assert "allocation no-such-allocation is not the job's: left alone" in capsys.readouterr().out


def test_an_unreadable_job_still_has_what_carries_its_id_released(
    fronted: tuple[str, ScriptedFront], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """scontrol failing (slurmctld busy) says nothing of the allocations carrying the job
    id: they are released, and the epilog exits 3 for what its admin comment may name.
    It used to exit 3 at once, leaving the job's GPUs held."""
    server, _ = fronted
    with TopoplaceClient(server) as client:
        carried = client.place({"gpus": 1, "job_id": "8"})["id"]
    config = _config(tmp_path, server, "", exit_code=1)
    assert main(["slurm", "epilog", "--config", str(config), "--job", "8"]) == 3
    out, err = capsys.readouterr()
    assert f"allocation {carried} released: True" in out
    assert "cannot read job 8" in err and "left held" in err
    with TopoplaceClient(server) as client:
        assert client.allocation(carried)["state"] == "released"


def test_an_unreadable_config_is_named_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config that is there but cannot be read (a directory, not UTF-8) says so and
    exits 2. Was: a traceback and exit 1."""
    (tmp_path / "binary.conf").write_bytes(b"server = \xff\xfe\n")
    for config in (tmp_path, tmp_path / "binary.conf"):
        assert main(["slurm", "epilog", "--config", str(config), "--job", "7"]) == 2
        assert f"cannot read --config {config}: " in capsys.readouterr().err


@pytest.mark.parametrize(
    "history",
    [[], [{"seq": 1}], [{"snapshot": {"name": "gpu1", "gpus": "eight"}}], ["gpu1"]],
    ids=["empty", "no-snapshot", "unreadable-snapshot", "not-an-object"],
)
def test_a_history_without_a_readable_snapshot_is_a_refusal_in_one_line(
    fronted: tuple[str, ScriptedFront], capsys: pytest.CaptureFixture[str], history: list[Any]
) -> None:
    """No configuration rather than a traceback (and exit 1) from an answer naming no
    snapshot this version can read."""
    server, front = fronted
    front.answer(200, None, history)
    assert main(["slurm", "node-conf", "gpu1", "--server", server]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "invalid_response: node gpu1: no snapshot this version can read" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ("inf", "must be a finite number of seconds, got inf"),
        ("nan", "must be more than 0 seconds, got nan"),
        ("-1", "must be more than 0 seconds, got -1"),
        ("61", "must be at most 60 seconds, got 61"),
    ],
)
def test_epilog_retry_for_must_end(
    given: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An epilog that never ends keeps the job's nodes completing: --retry-for is finite,
    positive and at most 60 s. 'inf' used to be accepted, and the epilog retried forever."""
    with pytest.raises(SystemExit) as exited:
        main(["slurm", "epilog", "--job", "7", "--user", "alice", "--retry-for", given])
    assert exited.value.code == 2
    assert f"--retry-for: {words}" in capsys.readouterr().err


def test_epilog_config_given_that_does_not_exist_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: a --config that did not exist was read as no settings, and the epilog went on
    against the default server."""
    missing = tmp_path / "topoplace.conf"
    assert main(["slurm", "epilog", "--config", str(missing), "--job", "7"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"error: cannot read --config {missing}: no such file\n"


@pytest.mark.parametrize("content", [None, b"\n"], ids=["missing", "blank"])
def test_an_epilog_token_file_from_the_config_is_named_by_the_configs_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None
) -> None:
    """Was: 'error: --token-file: ...', an option the epilog was not given."""
    token = tmp_path / "token"
    if content is not None:
        token.write_bytes(content)
    config = _config(tmp_path, "http://127.0.0.1:9", "topoplace_allocation=a-1")
    config.write_text(config.read_text() + f"token_file = {token}\n")
    assert main(["slurm", "epilog", "--config", str(config), "--job", "7"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: token_file in {config}: "), err
    assert "--token-file" not in err
