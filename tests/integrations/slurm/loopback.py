"""A whole Slurm cluster on loopback: munged, slurmctld and several slurmd, plus the service.

Used by the integration tests and by bench/slurm_submit.py. Every daemon is
started here with its own process handle and stopped by that handle (SIGTERM,
then SIGKILL) in ``stop``, which runs even when start-up or a test failed.
Everything lives in one temporary directory: configuration, state, munge key
and socket, logs, job output, and the fake GPUs (character devices 195:N, as
Slurm only fills CUDA_VISIBLE_DEVICES for real device nodes). Ports are free
ones picked at start.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from placement.profiles import build_profile
from topoplace_client.api import TopoplaceClient

REPO = Path(__file__).resolve().parents[3]
LUA_DIR = REPO / "integrations" / "slurm"
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel")
PACKAGES = "slurmctld slurmd slurm-client munge lua-socket lua-cjson lua-sec lua5.1"


def missing_prerequisites() -> str | None:
    """Why a loopback cluster cannot run here, or None when it can."""
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    cjson = any(Path(p).exists() for p in Path("/usr/lib").glob("*/lua/5.1/cjson.so"))
    if not Path("/usr/share/lua/5.1/socket.lua").exists():
        missing.append("lua-socket")
    if not cjson:
        missing.append("lua-cjson")
    if missing:
        return f"missing {', '.join(missing)} (Debian: apt-get install {PACKAGES})"
    if os.geteuid() != 0:
        return "needs root (SlurmUser=root, mknod for the fake GPUs)"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Daemon:
    name: str
    process: subprocess.Popen[bytes]

    def stop(self, grace_s: float = 5.0) -> None:
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@dataclass
class Service:
    """`topoplace serve` on a free port with its own SQLite file."""

    root: Path
    env_extra: dict[str, str] = field(default_factory=dict)
    daemon: Daemon | None = None
    url: str = ""

    def start(self) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = {
            **os.environ,
            "TOPOPLACE_DATABASE_URL": f"sqlite:///{self.root / 'topoplace.sqlite3'}",
            "TOPOPLACE_HEARTBEAT_TTL_S": "86400",
            # A cluster of its own on loopback, for the Slurm tests and bench.slurm_submit:
            # its scripts carry no token (a test that wants one sets it in env_extra).
            "TOPOPLACE_INSECURE_DEV": "1",
            **self.env_extra,
        }
        log = open(self.root / "service.log", "wb")  # noqa: SIM115 - the process owns it
        process = subprocess.Popen(
            [sys.executable, "-m", "topoplace", "serve", "--port", str(port), "--no-grpc"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.daemon = Daemon("topoplace", process)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"topoplace serve exited: {self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"topoplace serve not ready: {self.log_tail()}")

    def log_tail(self) -> str:
        path = self.root / "service.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def client(self) -> TopoplaceClient:
        return TopoplaceClient(self.url, timeout=10)

    def report(self, profile: str, names: Sequence[str]) -> None:
        with self.client() as client:
            for name in names:
                snap = build_profile(profile, name)
                client.put_snapshot(name, snap.model_dump(mode="json"))

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()


@dataclass
class Job:
    id: str
    returncode: int
    stdout: str
    stderr: str
    seconds: float


class LoopbackCluster:
    """munged + slurmctld + one slurmd per node, configured from the service's snapshots."""

    def __init__(
        self,
        root: Path,
        nodes: Sequence[str],
        service: Service,
        *,
        with_filter: bool,
        cli_filter: bool = True,
        timeout_ms: int = 100,
    ) -> None:
        self.root = root
        self.nodes = list(nodes)
        self.service = service
        self.with_filter = with_filter
        self.cli_filter = with_filter and cli_filter  # cli_filter.lua beside job_submit.lua
        self.timeout_ms = timeout_ms
        self.daemons: list[Daemon] = []
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    # -- configuration --------------------------------------------------------

    def _topoplace(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "topoplace", "slurm", *args, "--server", self.service.url],
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout

    def write_config(self) -> None:
        root = self.root
        for sub in ("state", "log", "dev", "out"):
            (root / sub).mkdir(exist_ok=True)
        for index in range(8):
            device = root / "dev" / f"nvidia{index}"
            if not device.exists():
                os.mknod(device, 0o666 | 0o020000, os.makedev(195, index))
        subprocess.run(
            ["mungekey", "--create", f"--keyfile={root / 'munge.key'}", "--force"],
            check=True,
            capture_output=True,
        )
        (root / "munge.key").chmod(0o600)
        node_lines = []
        for line in self._topoplace("node-conf", *self.nodes).splitlines():
            port = free_port()
            node_lines.append(
                f"{line} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} State=UNKNOWN"
            )
        (root / "gres.conf").write_text(
            self._topoplace("gres-conf", "--device-dir", str(root / "dev"), *self.nodes)
        )
        plugins = "JobSubmitPlugins=lua\n" if self.with_filter else ""
        if self.with_filter:
            plugins += f"PrologSlurmctld={root / 'topoplace-prolog'}\n"
        if self.cli_filter:
            plugins += "CliFilterPlugins=cli_filter/lua\n"
        self.conf.write_text(
            f"""ClusterName=loop{free_port()}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root / "munge.socket"}
CredType=cred/munge
StateSaveLocation={root / "state"}
SlurmdSpoolDir={root / "spool-%n"}
SlurmctldPidFile={root / "slurmctld.pid"}
SlurmdPidFile={root / "slurmd-%n.pid"}
SlurmctldLogFile={root / "log" / "slurmctld.log"}
SlurmdLogFile={root / "log" / "slurmd-%n.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=1
MinJobAge=600
EpilogSlurmctld={root / "epilog.sh"}
{plugins}{chr(10).join(node_lines)}
PartitionName=gpu Nodes={",".join(self.nodes)} Default=YES MaxTime=INFINITE State=UP
PartitionName=whole Nodes={",".join(self.nodes)} OverSubscribe=EXCLUSIVE MaxTime=INFINITE State=UP
"""
        )
        self.write_filter_config(self.service.url)
        for name in ("job_submit.lua", "cli_filter.lua", "topoplace_client.lua"):
            shutil.copy(LUA_DIR / name, root / name)
        # The shipped EpilogSlurmctld script, pointed at this environment's topoplace;
        # the wrapper's marker file stands for a lost epilog.
        shipped = (LUA_DIR / "topoplace-epilog").read_text()
        # Run from this checkout (slurmctld gives its scripts no environment, and an
        # installed entry point may be another checkout's).
        python = root / "python"
        python.write_text(f'#!/bin/sh\ncd "{REPO}" || exit 1\nexec "{sys.executable}" "$@"\n')
        python.chmod(0o755)
        program = root / "topoplace"
        program.write_text(f'#!/bin/sh\nexec "{python}" -m topoplace "$@"\n')
        program.chmod(0o755)
        if "TOPOPLACE=/opt/topoplace/bin/topoplace" not in shipped:
            raise RuntimeError("integrations/slurm/topoplace-epilog no longer names its program")
        (root / "topoplace-epilog").write_text(
            shipped.replace("TOPOPLACE=/opt/topoplace/bin/topoplace", f"TOPOPLACE={program}")
        )
        (root / "topoplace-epilog").chmod(0o755)
        shipped = (LUA_DIR / "topoplace-prolog").read_text()
        if "PYTHON=/opt/topoplace/bin/python" not in shipped:
            raise RuntimeError("integrations/slurm/topoplace-prolog no longer names its Python")
        (root / "topoplace-prolog").write_text(
            shipped.replace("PYTHON=/opt/topoplace/bin/python", f"PYTHON={python}").replace(
                '"$CONFIG"', f'"$CONFIG" >> "{root / "log" / "prolog.log"}" 2>&1'
            )
        )
        (root / "topoplace-prolog").chmod(0o755)
        epilog = root / "epilog.sh"
        epilog.write_text(
            "#!/bin/sh\n"
            f'[ -e "{root / "epilog-off"}" ] && exit 0\n'
            f'exec "{root / "topoplace-epilog"}" >> "{root / "log" / "epilog.log"}" 2>&1\n'
        )
        epilog.chmod(0o755)

    def write_filter_config(self, server: str) -> None:
        """Point the filter at a server; slurmctld reloads job_submit.lua when it changes."""
        (self.root / "topoplace.conf").write_text(
            f"server = {server}\ntimeout_ms = {self.timeout_ms}\n"
            f"scontrol = {shutil.which('scontrol')}\nslurm_conf = {self.conf}\n"
        )
        script = self.root / "job_submit.lua"
        if script.exists():
            # slurmctld compares whole-second mtimes: each change moves it a second on.
            later = max(time.time(), script.stat().st_mtime) + 1
            os.utime(script, (later, later))

    # -- daemons --------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.root / "log" / f"{name}.out", "wb")  # noqa: SIM115 - the process owns it
        process = subprocess.Popen(
            argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.daemons.append(Daemon(name, process))

    def start(self) -> None:
        self.write_config()
        root = self.root
        self._spawn(
            "munged",
            [
                "munged",
                "-F",
                "-f",
                f"--socket={root / 'munge.socket'}",
                f"--key-file={root / 'munge.key'}",
                f"--pid-file={root / 'munged.pid'}",
                f"--log-file={root / 'log' / 'munged.log'}",
                f"--seed-file={root / 'munge.seed'}",
            ],
        )
        self._wait_for(lambda: (root / "munge.socket").exists(), "munged socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-i", "-f", str(self.conf)])
        for node in self.nodes:
            self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(self.conf)])
        self._wait_for(self._all_idle, "every node idle", timeout_s=30)

    def _all_idle(self) -> bool:
        done = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env, capture_output=True, text=True
        )
        states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
        return all(states.get(n) == "idle" for n in self.nodes)

    def _wait_for(self, check: object, what: str, timeout_s: float = 10) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for daemon in self.daemons:
                if daemon.process.poll() is not None:
                    raise RuntimeError(f"{daemon.name} exited: {self.logs()}")
            if callable(check) and check():
                return
            time.sleep(0.1)
        raise TimeoutError(f"{what} not reached in {timeout_s}s: {self.logs()}")

    def logs(self) -> str:
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-1500:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel jobs and let them end, then stop every daemon by its own handle.

        slurmstepd (one per running job) leaves slurmd's session and outlives
        it, retrying forever to report to a slurmd that is gone, so jobs are
        ended first, and any process still carrying this cluster's SLURM_CONF
        afterwards is killed by its PID.
        """
        if any(d.name == "slurmctld" and d.process.poll() is None for d in self.daemons):
            for partition in ("gpu", "whole"):
                self.run("scancel", "--full", "--quiet", f"--partition={partition}", timeout_s=10)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                active = self.run("squeue", "-h", "-t", "R,CG,CF,S", "-o", "%i", timeout_s=10)
                if active.returncode == 0 and not active.stdout.strip():
                    break
                time.sleep(0.2)
        order = sorted(self.daemons, key=lambda d: (d.name == "munged", d.name == "slurmctld"))
        for daemon in order:  # SIGTERM every slurmd at once: each takes 1-3 s to stop
            if daemon.name.startswith("slurmd") and daemon.process.poll() is None:
                daemon.process.send_signal(signal.SIGTERM)
        for daemon in order:
            daemon.stop()
        for pid in self._strays():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # A killed process keeps its /proc entry, environment included, until it has
        # died, which on a loaded machine is not at once: return only when it has.
        deadline = time.monotonic() + 10
        while self._strays() and time.monotonic() < deadline:
            time.sleep(0.05)

    def connections(self, daemon: str, port: int) -> int:
        """How many TCP connections the named daemon has established to a local port."""
        pid = next(d.process.pid for d in self.daemons if d.name == daemon)
        inodes = set()
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
        count = 0
        for table in (Path("/proc/net/tcp"), Path("/proc/net/tcp6")):
            if not table.exists():
                continue
            for line in table.read_text().splitlines()[1:]:
                fields = line.split()  # sl local remote state ... uid timeout inode
                remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                if fields[3] == "01" and remote_port == port and fields[9] in inodes:
                    count += 1  # 01: ESTABLISHED
        return count

    def _strays(self) -> list[int]:
        """PIDs of this cluster's leftover job steps and job processes: slurmstepd or a
        process with a job id, carrying this cluster's SLURM_CONF (the service and its
        squeue carry the conf too, but no job id)."""
        mark = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
                command = (entry / "comm").read_text().strip()
            except OSError:
                continue
            in_job = command == "slurmstepd" or any(v.startswith(b"SLURM_JOB_ID=") for v in environ)
            if mark in environ and in_job:
                found.append(int(entry.name))
        return found

    # -- jobs -----------------------------------------------------------------

    def client_env(self, *, cli_filter: bool) -> dict[str, str]:
        """The environment of a client on this cluster, with or without cli_filter.lua.

        Slurm's clients read CliFilterPlugins from the slurm.conf they are given;
        a copy without that line is a site that never installed the client filter."""
        if cli_filter:
            return self.env
        bare = self.root / "slurm-no-cli-filter.conf"
        lines = self.conf.read_text().splitlines()
        bare.write_text("\n".join(x for x in lines if not x.startswith("CliFilterPlugins")) + "\n")
        return {**self.env, "SLURM_CONF": str(bare)}

    def run(
        self, *argv: str, timeout_s: float = 30, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), env=env or self.env, capture_output=True, text=True, timeout=timeout_s
        )

    def sbatch(
        self, *args: str, script: str = "sleep 30", env: dict[str, str] | None = None
    ) -> Job:
        started = time.perf_counter()
        done = self.run(
            "sbatch",
            "--parsable",
            f"--output={self.root / 'out' / 'job-%j.out'}",
            *args,
            "--wrap",
            script,
            env=env,
        )
        seconds = time.perf_counter() - started
        return Job(
            done.stdout.strip().split(";")[0], done.returncode, done.stdout, done.stderr, seconds
        )

    def show_job(self, job: str) -> str:
        return self.run("scontrol", "-d", "show", "job", job).stdout

    def job_state(self, job: str) -> str:
        out = self.run("scontrol", "show", "job", "-o", job).stdout
        for word in out.split():
            if word.startswith("JobState="):
                return word.split("=", 1)[1]
        return "UNKNOWN"

    def wait_state(self, job: str, states: Sequence[str], timeout_s: float = 20) -> str:
        deadline = time.monotonic() + timeout_s
        state = ""
        while time.monotonic() < deadline:
            state = self.job_state(job)
            if state in states:
                return state
            time.sleep(0.1)
        raise TimeoutError(f"job {job} is {state}, not {states}: {self.show_job(job)}")

    def output(self, job: str) -> str:
        path = self.root / "out" / f"job-{job}.out"
        return path.read_text() if path.exists() else ""

    def wait_output(self, job: str, needle: str, timeout_s: float = 20) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.output(job)
            if needle in text:
                return text
            time.sleep(0.1)
        raise TimeoutError(f"job {job} printed no {needle!r}: {self.output(job)!r}")
