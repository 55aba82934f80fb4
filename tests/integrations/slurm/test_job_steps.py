"""Job steps get the GPUs their job holds: every srun form, inside and outside a
placed job, with salloc, on clients with and without cli_filter.lua.

A client without cli_filter.lua is one given a slurm.conf without
CliFilterPlugins (Slurm's clients read it from their own slurm.conf).
"""

from __future__ import annotations

import re

import pytest

from tests.integrations.slurm.loopback import LoopbackCluster

# Each step prints its form and what it got; tasks print one line each.
STEPS = {
    "plain": "srun -n1",
    "gres2": "srun -n1 --gres=gpu:2",
    "gpus2": "srun -n1 --gpus=2",
    "pernode2": "srun -n1 --gpus-per-node=2",
    "pertask": "srun -n2 --gpus-per-task=1",
}
SHOW = "sh -c 'echo STEP={form} CVD=$CUDA_VISIBLE_DEVICES'"


def _steps_script(forms: dict[str, str], conf: str) -> str:
    # slurmd gives a batch job its own SLURM_CONF: the client's is set again here.
    lines = [
        f"export SLURM_CONF={conf}",
        "echo STEP=job CVD=$CUDA_VISIBLE_DEVICES JOB=$SLURM_JOB_ID",
    ]
    lines += [f"{command} {SHOW.format(form=form)} 2>&1" for form, command in forms.items()]
    return "; ".join(lines)


def _got(text: str) -> dict[str, list[list[int]]]:
    """Per form, each task's GPUs."""
    found: dict[str, list[list[int]]] = {}
    for form, cvd in re.findall(r"STEP=(\S+) CVD=(\S*)", text):
        found.setdefault(form, []).append(sorted(int(g) for g in cvd.split(",") if g))
    return found


# Slurm 22.05 matches a step's plain per-node count against one of a pinned job's
# per-GPU types alone; only cli_filter.lua can name the GPUs instead (docs/slurm.md).
PER_NODE_COUNT = ("gres2", "pernode2")
REFUSED = "Step requested gres_per_node=gpu:2 is more than the job's gres_per_node=gpu:1"


def _check_steps(
    got: dict[str, list[list[int]]], job: list[int], output: str, refused: tuple[str, ...] = ()
) -> None:
    held = set(job)
    assert got.get("plain") == [job], output
    for form in refused:
        assert form not in got, output
    assert output.count(REFUSED) == len(refused), output
    for form in {"gres2", "gpus2", "pernode2"} - set(refused):
        [step] = got.get(form) or [[]]
        assert len(step) == 2 and set(step) <= held, (form, output)
    tasks = got.get("pertask", [])
    assert len(tasks) == 2 and all(len(t) == 1 and set(t) <= held for t in tasks), output


@pytest.mark.parametrize("cli_filter", [True, False], ids=["cli_filter", "no_cli_filter"])
def test_every_step_form_gets_the_gpus_the_job_holds(
    cluster: LoopbackCluster, cli_filter: bool
) -> None:
    env = cluster.client_env(cli_filter=cli_filter)

    # A placed batch job running every step form; meanwhile each form as its own
    # srun (outside any job), then under salloc. These run one after another:
    # cli_filter.lua's proposals reserve nothing, so two submitted at the same
    # moment may be proposed the same GPUs, and the second then waits for them.
    batch = cluster.sbatch(
        "--gres=gpu:4", "-n2", script=_steps_script(STEPS, env["SLURM_CONF"]), env=env
    )
    assert batch.returncode == 0, batch.stderr
    outputs = {
        form: cluster.run(
            *command.split(), "sh", "-c", f"echo STEP={form} CVD=$CUDA_VISIBLE_DEVICES", env=env
        )
        for form, command in STEPS.items()
        if form != "plain"
    }
    salloc = cluster.run(
        "salloc",
        "--gres=gpu:4",
        "-n2",
        "sh",
        "-c",
        _steps_script(STEPS, env["SLURM_CONF"]),
        env=env,
        timeout_s=60,
    )
    salloc_output = salloc.stdout + salloc.stderr
    cluster.wait_state(batch.id, ("COMPLETED", "FAILED"), timeout_s=60)
    batch_output = cluster.output(batch.id)

    got = _got(batch_output)
    [job] = got["job"]
    assert len(job) == 4, batch_output
    # A batch job's steps run srun on the node: without cli_filter.lua there,
    # nothing can rewrite their plain per-node counts.
    _check_steps(got, job, batch_output, () if cli_filter else PER_NODE_COUNT)

    got = _got(salloc_output)
    [job] = got.get("plain") or [[]]
    assert len(job) == 4, salloc_output
    _check_steps(got, job, salloc_output)

    for form, done in outputs.items():
        text = done.stdout + done.stderr
        tasks = _got(text).get(form, [])
        wanted = [[0]] * 2 if form == "pertask" else [[0, 0]]
        assert [len(t) for t in tasks] == [len(w) for w in wanted], (form, text)
