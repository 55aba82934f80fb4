from __future__ import annotations

import pytest

from service.slurm.job_options import JobOptionError, parse
from service.slurm.settings import SlurmSettings

DEFAULTS = SlurmSettings(locality="any", policy="spread")


def test_defaults_come_from_the_settings() -> None:
    options = parse("a plain comment", DEFAULTS)
    assert (options.locality, options.policy, options.objective, options.numa, options.off) == (
        "any",
        "spread",
        "performance",
        "preferred",
        False,
    )


def test_options_after_other_text() -> None:
    options = parse("sweep 12 topoplace:locality=nvlink,policy=pack,numa=required", DEFAULTS)
    assert (options.locality, options.policy, options.numa) == ("nvlink", "pack", "required")


def test_off() -> None:
    assert parse("topoplace:off", DEFAULTS).off


@pytest.mark.parametrize(
    ("comment", "says"),
    [
        ("topoplace:loc=nvlink", "unknown option 'loc'"),
        ("topoplace:policy=fast", "policy='fast' is not one of pack|spread"),
    ],
)
def test_mistakes_are_named(comment: str, says: str) -> None:
    with pytest.raises(JobOptionError, match=says):
        parse(comment, DEFAULTS)
