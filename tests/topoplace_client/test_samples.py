"""The shipped nvidia-smi samples: reachable by name, and inside a built wheel."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from placement.topo_text import parse_topo_matrix
from topoplace_client.samples import SAMPLES, is_sample, sample_names, sample_text
from topoplace_client.topology_file import TopologyFileError, load_topology

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_DIR = ROOT / "topoplace_client" / "samples"


def test_every_sample_file_is_listed_parses_and_has_its_source_noted() -> None:
    files = sorted(path.stem for path in SAMPLE_DIR.glob("*.txt"))
    assert files == sample_names() == sorted(SAMPLES)
    sources = (SAMPLE_DIR / "README.md").read_text(encoding="utf-8")
    for name in files:
        assert parse_topo_matrix(sample_text(name)).gpu_count > 0
        row = next(line for line in sources.splitlines() if line.startswith(f"| {name} |"))
        assert row.rstrip(" |").split("|")[-1].strip(), f"{name}: no source noted"


def test_a_name_reads_the_sample_and_a_file_of_that_name_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load_topology(Path("hgx-h100")).gpu_count == 8
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hgx-h100").write_text("\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tNV4\t X \n")
    assert not is_sample("hgx-h100")
    assert load_topology(Path("hgx-h100")).gpu_count == 2
    with pytest.raises(TopologyFileError, match=r"no such file .*dgx1-v100"):
        load_topology(Path("no-such-sample"))


@pytest.mark.skipif(
    importlib.util.find_spec("setuptools") is None or shutil.which("git") is None,
    reason="building a wheel needs setuptools and the tracked file list (git)",
)
def test_the_samples_are_in_a_built_wheel_and_read_from_it(tmp_path: Path) -> None:
    # Built from a copy of the tracked files, so the source tree gets no build/ folder.
    source = tmp_path / "source"
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (item.decode() for item in tracked)):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*build, "-w", str(wheels), str(source)], check=True, capture_output=True)
    (wheel,) = wheels.glob("topoplace-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        archive.extractall(tmp_path / "installed")
    for name in sample_names():
        assert f"topoplace_client/samples/{name}.txt" in names
    assert "topoplace_client/samples/README.md" in names
    # -S: no site-packages, so the module comes from the unpacked wheel, not this checkout.
    script = (
        "import topoplace_client.samples as s; print(s.__file__);"
        " print(s.sample_text('dgx1-v100'), end='')"
    )
    read = subprocess.run(
        [sys.executable, "-S", "-c", script],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path / "installed"), "PATH": ""},
        capture_output=True,
        text=True,
        check=True,
    )
    where, text = read.stdout.split("\n", 1)
    assert Path(where).is_relative_to(tmp_path / "installed")
    assert text == sample_text("dgx1-v100")
