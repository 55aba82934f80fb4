"""The prolog asks scontrol for its own job's record alone, and reports it to a real service
on loopback, which a proxy or another program may stand in front of."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import Response

from service.app import create_app
from service.settings import Settings
from tests.agent.scripted_front import BUSY, DOWN, TRY_LATER, Answer, ScriptedFront
from tests.live_server import live_server
from tests.service.conftest import ADMIN_TOKEN, secured
from tests.service.slurm.test_het_jobs import COMPONENT_0
from tests.tls_ca import make_pki
from topoplace.slurm_prolog import main, own_record


def test_an_array_task_is_asked_for_by_array_and_index() -> None:
    """`scontrol show job 1` shows every task of array 1 when task 1 kept the id 1."""
    task = {"SLURM_JOB_ID": "1", "SLURM_ARRAY_JOB_ID": "1", "SLURM_ARRAY_TASK_ID": "1"}
    assert own_record(task) == "1_1"
    assert own_record({"SLURM_JOB_ID": "7"}) == "7"


def test_a_het_job_component_is_asked_for_by_het_job_and_offset() -> None:
    """`scontrol show job 1` shows every component of het job 1 (its leader's id)."""
    leader = {"SLURM_JOB_ID": "1", "SLURM_HET_JOB_ID": "1", "SLURM_HET_JOB_OFFSET": "0"}
    assert own_record(leader) == "1+0"
    other = {"SLURM_JOB_ID": "2", "SLURM_HET_JOB_ID": "1", "SLURM_HET_JOB_OFFSET": "1"}
    assert own_record(other) == "1+1"


@pytest.fixture(scope="module")
def fronted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ScriptedFront]]:
    """A real service behind a front that answers some requests itself."""
    db = tmp_path_factory.mktemp("slurm-prolog") / "t.sqlite3"
    settings = Settings(database_url=f"sqlite:///{db}", heartbeat_ttl_s=3600)
    app = create_app(settings, background=False)
    front = ScriptedFront(app)
    with live_server(app) as url:
        yield url, front


def _config(tmp_path: Path, server: str, token: str | None = "tpp_0123456789ab_secret") -> Path:
    """topoplace.conf naming the service, a token file (unless None) and a stand-in
    scontrol."""
    (tmp_path / "job.txt").write_text(COMPONENT_0)  # as Slurm 22.05 printed a job
    script = tmp_path / "scontrol"
    script.write_text(f"#!/bin/sh\ncat {tmp_path / 'job.txt'}\n")
    script.chmod(0o755)
    config = tmp_path / "topoplace.conf"
    config.write_text(f"server = {server}\nscontrol = {script}\n")
    if token is not None:
        token_file = tmp_path / "token"
        token_file.write_text(f"{token}\n")
        with config.open("a") as text:
            text.write(f"token_file = {token_file}\n")
    return config


def test_a_redirect_is_not_followed_nor_taken_for_the_services_answer(
    fronted: tuple[str, ScriptedFront], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A proxy's 302: the report is not resent as a GET, with the token, to the Location,
    and the page there is not printed as the service's answer. Was: both."""
    server, front = fronted
    front.seen.clear()
    front.answer(302, {"Location": f"{server}/v1/elsewhere"})
    assert main(["--config", str(_config(tmp_path, server)), "--job", "7"]) == 0
    out, err = capsys.readouterr()
    assert front.seen == [("POST", "/v1/slurm/job-started")], front.seen
    assert out == "" and "job 7 not reported" in err and "/v1/elsewhere" in err, err


def test_an_answer_that_is_not_the_services_is_not_taken_for_a_report(
    fronted: tuple[str, ScriptedFront], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 200 without a JSON object (a captive portal, another program) records nothing."""
    server, front = fronted
    front.answers.append(Response("<html>welcome</html>", 200, media_type="text/html"))
    assert main(["--config", str(_config(tmp_path, server)), "--job", "7"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "job 7 not reported" in err and "<html>welcome" in err, err


def test_a_listener_that_does_not_speak_http_is_reported_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A status line that is no HTTP (http.client.BadStatusLine, not an OSError) must not
    end the prolog in a traceback and exit 1, which would have slurmctld requeue the job."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer_garbage() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")

    thread = threading.Thread(target=answer_garbage, daemon=True)
    thread.start()
    server = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        assert main(["--config", str(_config(tmp_path, server)), "--job", "7"]) == 0
    finally:
        thread.join(5)
        listener.close()
    out, err = capsys.readouterr()
    assert out == "" and "job 7 not reported" in err and "Traceback" not in err, err


def test_an_https_service_is_reported_to_only_with_the_configured_ca(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ca_file is the only CA the prolog trusts: the service's certificate chains to it."""
    pki = make_pki(tmp_path)
    settings = secured(Settings(database_url=f"sqlite:///{tmp_path / 't.sqlite3'}"))
    tls = {"ssl_certfile": str(pki.cert), "ssl_keyfile": str(pki.key)}
    with live_server(
        create_app(settings, background=False), options=tls, ca_bundle=str(pki.ca)
    ) as server:
        config = _config(tmp_path, server, ADMIN_TOKEN)
        for ca, reported in ((pki.ca, True), (pki.other_ca, False)):
            with config.open("a") as text:
                text.write(f"ca_file = {ca}\n")
            assert main(["--config", str(config), "--job", "7", "--name", "wrap"]) == 0
            out, err = capsys.readouterr()
            assert out.startswith("job 7: {") is reported, (out, err)
            assert ("CERTIFICATE_VERIFY_FAILED" in err) is not reported, err


@pytest.mark.parametrize("content", [None, "", "\n"], ids=["missing", "empty", "blank"])
def test_a_token_file_that_gives_no_token_is_named_and_nothing_is_sent(
    fronted: tuple[str, ScriptedFront],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: str | None,
) -> None:
    """Sent without its token the report is refused (401) for a reason no log names.
    Was: an unreadable or empty token_file was taken for 'no token' and the report sent."""
    server, front = fronted
    config = _config(tmp_path, server)
    token_file = tmp_path / "token"
    if content is None:
        token_file.unlink()
    else:
        token_file.write_text(content)
    front.seen.clear()
    assert main(["--config", str(config), "--job", "7"]) == 0
    err = capsys.readouterr().err
    assert "job 7 not reported: " in err and f"token_file {token_file}" in err, err
    assert front.seen == []


def test_a_refused_report_says_why_and_so_does_a_failed_scontrol(
    fronted: tuple[str, ScriptedFront], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The log line names the service's code and message (and a Retry-After), and
    scontrol's own words. Was: 'HTTP Error 400: Bad Request', and 'Command [...]
    returned non-zero exit status 1.', which say nothing of why."""
    server, front = fronted
    config = _config(tmp_path, server, None)  # the fronted service takes no token
    assert main(["--config", str(config), "--job", "7", "--name", "not-wrap"]) == 0
    err = capsys.readouterr().err
    assert "HTTP 400 Bad Request: bad_request: the job's text does not carry the job_name" in err
    front.answer(429, {"Retry-After": "7"}, {"error": {"code": "rate_limited", "message": "slow"}})
    assert main(["--config", str(config), "--job", "7", "--name", "wrap"]) == 0
    assert "HTTP 429 Too Many Requests: rate_limited: slow (Retry-After: 7)" in (
        capsys.readouterr().err
    )
    (tmp_path / "scontrol").write_text(
        "#!/bin/sh\necho 'slurm_load_jobs error: Socket timed out on send/recv' >&2\nexit 1\n"
    )
    assert main(["--config", str(config), "--job", "7"]) == 0
    err = capsys.readouterr().err
    assert "job 7 not reported: " in err and "Socket timed out on send/recv" in err, err


def test_a_config_given_that_does_not_exist_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: a --config that did not exist was read as no settings, and the job reported
    to the default server with $TOPOPLACE_TOKEN."""
    missing = tmp_path / "topoplace.conf"
    sent: list[object] = []
    monkeypatch.setattr("topoplace.slurm_prolog.report", lambda *a: sent.append(a) or "")
    assert main(["--config", str(missing), "--job", "7"]) == 2
    assert sent == []
    err = capsys.readouterr().err
    assert err == f"topoplace prolog: cannot read --config {missing}: no such file\n"


def test_the_default_config_missing_means_the_defaults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("topoplace.slurm_prolog.DEFAULT_CONFIG", str(tmp_path / "absent"))
    sent: list[dict[str, str]] = []
    monkeypatch.setattr(
        "topoplace.slurm_prolog.report", lambda config, *_: sent.append(config) or "matched"
    )
    assert main(["--job", "7"]) == 0
    assert sent == [{}]
    assert capsys.readouterr().out == "job 7: matched\n"


def test_a_service_that_asks_to_be_asked_later_is_asked_again(
    fronted: tuple[str, ScriptedFront], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 429 and a 503: the report is posted again, after the 429's Retry-After, and the
    job's GPUs are recorded. Was: the first 429 or 503 ended the prolog, the job unknown
    to the service until the reconcile loop's next read."""
    server, front = fronted
    front.seen.clear()
    front.answer(429, {"Retry-After": "1"}, BUSY)
    front.answer(503, None, DOWN)
    config = _config(tmp_path, server, None)  # the fronted service takes no token
    started = time.monotonic()
    assert main(["--config", str(config), "--job", "7", "--name", "wrap"]) == 0
    took = time.monotonic() - started
    out, err = capsys.readouterr()
    assert out.startswith("job 7: {") and err == "", (out, err)
    assert front.seen == [("POST", "/v1/slurm/job-started")] * 3, front.seen
    assert took >= 1.0, took  # the Retry-After waited


@pytest.mark.parametrize("answer", TRY_LATER)
def test_the_prolog_gives_up_in_time_and_exits_0(
    fronted: tuple[str, ScriptedFront],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    answer: Answer,
) -> None:
    """A service that keeps asking to be asked later holds the job's launch back no longer
    than --retry-for (and one request), and the prolog still exits 0 (a failed prolog
    would requeue the job), saying what it gave up on."""
    server, front = fronted
    for _ in range(20):
        front.answer(*answer)
    config = _config(tmp_path, server, None)
    started = time.monotonic()
    code = main(["--config", str(config), "--job", "7", "--name", "wrap", "--retry-for", "1.5"])
    took = time.monotonic() - started
    asked = len(front.answers)
    front.answers.clear()
    out, err = capsys.readouterr()
    assert code == 0 and out == "", (out, err)
    # The limit, not the clock, is what is checked: within 1.5 s the 429's Retry-After
    # (1 s) leaves room for 2 tries and the 503's backoff (0.25 s, doubling) for 3; the
    # default 5 s would have made 5. A slow machine makes fewer, never more (the retry
    # itself: test_a_service_that_asks_to_be_asked_later_is_asked_again). Wall time is
    # only bounded against a hang.
    assert 1 <= 20 - asked <= 3, asked
    assert took < 10, took
    assert "job 7 not reported: try later: HTTP " in err and answer[2]["error"]["code"] in err


def test_a_service_that_never_answers_is_given_up_on_within_the_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A listener that accepts and never answers: each try waits no longer than
    --retry-for, and no try starts past it."""
    listener = socket.create_server(("127.0.0.1", 0))
    server = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        started = time.monotonic()
        code = main(["--config", str(_config(tmp_path, server)), "--job", "7", "--retry-for", "1"])
        took = time.monotonic() - started
    finally:
        listener.close()
    err = capsys.readouterr().err
    assert code == 0 and "job 7 not reported: try later: no answer" in err, err
    # One try of at most 1 s, and no second (the backoff would end past the limit): about
    # 1 s on a quiet machine. The default 5 s limit, with tries of 2 s, takes 5 s or
    # more; the margin is a slow machine's.
    assert took < 4.5, took


def test_the_prolog_loads_no_http_client_library() -> None:
    """The job's launch waits for the prolog: it must not pay httpx's (or the engine's)
    import time, which sharing the epilog's retry could bring in."""
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, topoplace.slurm_prolog;"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in"
            " {'httpx', 'pydantic', 'placement', 'service'}))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout.strip() == "[]", loaded.stdout
