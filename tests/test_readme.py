"""README.md's command blocks, run as a new user would run them from a fresh clone.

Every ```bash block of README.md is one of:

- run here as it is written (the offline engine on a shipped sample; the
  ```json block that follows it is the output it must print);
- run against a demo service this test starts on a free loopback port (the
  curl walk-through; ``localhost:8080`` becomes that port);
- not run, with the reason: ``make demo`` starts a service that runs until
  stopped (the curl block runs against the same demo cluster instead), and
  ``make test`` runs the whole suite, this test among it.

A block that is none of these fails the test, so a new example gets a
decision instead of going untested.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.service.replica_processes import free_port
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[1]
BLOCK_RE = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
NOT_RUN = {
    "make demo": "starts a service that runs until stopped; the curl block runs against one",
    "make test": "runs the whole suite, this test among it",
}


def blocks() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return [(lang, body) for lang, body in BLOCK_RE.findall(text)]


def command_blocks() -> list[str]:
    return [body for lang, body in blocks() if lang == "bash"]


def _expected_output(block: str) -> str | None:
    """The ```json block right after ``block`` in README.md, if any."""
    found = blocks()
    for (lang, body), after in zip(found, [*found[1:], ("", "")], strict=True):
        if lang == "bash" and body == block and after[0] == "json":
            return after[1]
    return None


def _environment() -> dict[str, str]:
    """The README's `.venv/bin/topoplace` where the clone has one, else this interpreter's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOPOPLACE_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _shell(block: str) -> subprocess.CompletedProcess[str]:
    if not (ROOT / ".venv" / "bin" / "topoplace").exists():
        block = block.replace(".venv/bin/topoplace", "topoplace")
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        cwd=ROOT,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def kind(block: str) -> str:
    if block.strip() in NOT_RUN:
        return "not run"
    if "localhost:8080" in block:
        return "service"
    if all(line.startswith(".venv/bin/topoplace ") for line in block.strip().splitlines()):
        return "offline"
    return "unknown"


def test_every_command_block_has_a_decision() -> None:
    found = command_blocks()
    assert found, "README.md has no command blocks"
    assert [b for b in found if kind(b) == "unknown"] == []
    assert [kind(b) for b in found].count("offline") >= 1
    assert [kind(b) for b in found].count("service") >= 1


@pytest.mark.parametrize(
    "block", [b for b in command_blocks() if kind(b) == "offline"], ids=lambda b: b[:60]
)
def test_offline_block_runs_and_prints_what_the_readme_shows(block: str) -> None:
    done = _shell(block)
    assert done.returncode == 0, done.stderr
    expected = _expected_output(block)
    if expected is not None:
        last = done.stdout.strip().splitlines()[-1]
        assert json.loads(last) == json.loads(expected)


@pytest.fixture
def demo_service(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    env = {**_environment(), "TOPOPLACE_DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}"}
    command = [sys.executable, "-m", "topoplace", "serve", "--demo", "--port", str(port)]
    proc = subprocess.Popen(
        [*command, "--no-grpc"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert proc.poll() is None, "the demo service exited"
        try:
            answer = httpx.get(f"{url}/readyz", timeout=1, trust_env=False)
        except httpx.TransportError:
            return False
        return answer.status_code == 200 and answer.json()["nodes"] > 0

    try:
        wait_until(ready, "the demo service ready with its nodes", timeout_s=60)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.mark.skipif(shutil.which("curl") is None, reason="the walk-through uses curl")
def test_the_curl_walk_through_runs_against_the_demo_cluster(demo_service: str) -> None:
    (block,) = [b for b in command_blocks() if kind(b) == "service"]
    done = _shell(block.replace("localhost:8080", demo_service))
    assert done.returncode == 0, done.stderr
    # One JSON answer per curl, none of them an error.
    decoder = json.JSONDecoder()
    text, answers = done.stdout.strip(), []
    while text:
        value, end = decoder.raw_decode(text)
        answers.append(value)
        text = text[end:].lstrip()
    assert len(answers) == block.count("curl ")
    assert not [a for a in answers if isinstance(a, dict) and "error" in a]
    placed = answers[1]
    assert placed["job_id"] == "job-42" and placed["tasks"][0]["nvlink_connected"]
    assert answers[-1] == {"released": [placed["id"]]}
