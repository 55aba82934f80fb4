"""`topoplace region register|list|show|update|retire` against a live global service."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from agent.signing import NodeKey
from service.app import create_app
from service.settings import Settings
from tests.live_server import live_server
from tests.service.conftest import ADMIN_TOKEN, secured
from tests.service.federation.test_regions_api import signed, summary
from topoplace.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_register_list_show_and_retire(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file = tmp_path / "region.pem"
    public = NodeKey.generate().save(key_file)
    forward = tmp_path / "forward.token"
    forward.write_text("tpp_0123456789ab_secret\n")
    settings = secured(Settings(database_url=f"sqlite:///{tmp_path / 'global.sqlite3'}"))
    with live_server(create_app(settings, background=False)) as server:
        monkeypatch.setenv("TOPOPLACE_SERVER", server)
        monkeypatch.setenv("TOPOPLACE_TOKEN", ADMIN_TOKEN)
        register = (
            "region", "register", "aws-east", "--cloud", "aws", "--location", "us-east-1",
            "--url", "https://topoplace.use1.example", "--public-key-file", str(public),
            "--forward-token-file", str(forward), "--price", "H100=4.10/1.60",
            "--price", "A100=2", "--egress-region", "0.02", "--egress-internet", "0.09",
            "--label", "interconnect=efa",
        )  # fmt: skip
        code, token, err = run(capsys, *register)
        assert code == 0, err
        assert token.strip().startswith("tpp_") and "aws-east (aws) registered" in err

        code, out, err = run(capsys, *register)
        assert code == 1 and "conflict" in err  # the name is taken

        code, out, _ = run(capsys, "region", "list")
        assert "aws-east" in out and "never pushed" in out and "live" in out
        code, out, _ = run(capsys, "region", "show", "aws-east")
        assert "H100: 4.1/GPU-hour on demand, spot 1.6" in out
        assert "A100: 2/GPU-hour on demand" in out and "label interconnect=efa" in out
        code, out, _ = run(capsys, "region", "show", "aws-east", "--json")
        shown = json.loads(out)
        assert shown["prices"][0] == {"gpu_model": "H100", "on_demand": 4.1, "spot": 1.6}
        assert "forward_token" not in shown

        code, out, err = run(
            capsys, "region", "update", "aws-east", "--url", "https://tp.use1.example:8443/",
            "--forward-token-file", str(forward),
        )  # fmt: skip
        assert code == 0 and "url https://tp.use1.example:8443" in out, err
        assert "its forward token" in out
        code, out, err = run(capsys, "region", "update", "aws-east", "--url", "ftp://x")
        assert code == 2 and "invalid_request" in err and "url" in err  # 422: usage
        code, out, err = run(capsys, "region", "update", "aws-east")
        assert code == 2 and "--url" in err  # nothing to set: not sent
        code, out, err = run(capsys, "region", "update", "nowhere", "--no-forward-token")
        assert code == 1 and "not_found" in err
        code, out, _ = run(capsys, "region", "show", "aws-east")
        assert "at https://tp.use1.example:8443" in out

        code, out, err = run(capsys, "region", "retire", "aws-east")
        assert code == 0 and "retired" in out, err
        code, out, _ = run(capsys, "region", "list", "--retired", "--json")
        assert json.loads(out)["regions"][0]["retired_at"] is not None
        code, out, err = run(capsys, "region", "show", "nowhere")
        assert code == 1 and "not_found" in err


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [("--price", "H100", "MODEL=ON_DEMAND"), ("--price", "H100=cheap", "MODEL=ON_DEMAND"),
     ("--label", "novalue", "KEY=VALUE")],
)  # fmt: skip
def test_bad_flags_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, said: str
) -> None:
    argv = [
        "region", "register", "r", "--cloud", "c", "--url", "http://x", "--public-key-file",
        str(tmp_path / "none.pub"), "--price", "H100=1", "--egress-region", "0",
        "--egress-internet", "0", flag, value,
    ]  # fmt: skip
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2 and said in capsys.readouterr().err


def test_an_unreadable_key_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(
        capsys, "region", "register", "r", "--cloud", "c", "--url", "http://127.0.0.1:27999",
        "--public-key-file", str(tmp_path / "none.pub"), "--price", "H100=1",
        "--egress-region", "0", "--egress-internet", "0",
    )  # fmt: skip
    assert code == 2 and not out and "cannot read the public key file" in err


def test_serve_refuses_an_incomplete_federation_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    database = f"sqlite:///{tmp_path / 'region.sqlite3'}"
    serve = ("serve", "--insecure-dev", "--no-grpc", "--database-url", database)
    code, _, err = run(capsys, *serve, "--federation-global", "http://127.0.0.1:27998")
    assert code == 2
    assert "TOPOPLACE_REGION_NAME" in err and "TOPOPLACE_REGION_KEY" in err
    token = tmp_path / "region.token"
    token.write_text("tpp_0123456789ab_secret")
    code, _, err = run(
        capsys, *serve, "--federation-global", "http://127.0.0.1:27998",
        "--region-name", "aws-east", "--region-token-file", str(token),
        "--region-key", str(tmp_path / "missing.pem"),
    )  # fmt: skip
    assert code == 2 and "cannot read the key file" in err


def test_a_summary_cut_to_fit_is_shown_with_its_region(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A region past a summary limit pushes a cut summary: the GPUs it left out are free
    but routed to by no job, so `list` and `show` say so, and say nothing where none went."""
    keys = {name: NodeKey.generate() for name in ("big", "small")}
    settings = secured(Settings(database_url=f"sqlite:///{tmp_path / 'global.sqlite3'}"))
    with live_server(create_app(settings, background=False)) as server:
        monkeypatch.setenv("TOPOPLACE_SERVER", server)
        monkeypatch.setenv("TOPOPLACE_TOKEN", ADMIN_TOKEN)
        for name, key in keys.items():
            public = key.save(tmp_path / f"{name}.pem")
            code, token, err = run(
                capsys, "region", "register", name, "--cloud", "aws", "--url",
                f"https://{name}.example", "--public-key-file", str(public),
                "--price", "H100=2", "--egress-region", "0", "--egress-internet", "0",
            )  # fmt: skip
            assert code == 0, err
            cut = {"designs": 8, "free_gpus": 12, "cliques": 0, "names": 1}
            body = summary(name, **({"cut": cut} if name == "big" else {}))
            pushed = httpx.put(
                f"{server}/v1/regions/{name}/summary",
                json=signed(body, key),
                headers={"Authorization": f"Bearer {token.strip()}"},
                trust_env=False,
            )
            assert pushed.status_code == 200, pushed.text

        code, out, err = run(capsys, "region", "list")
        assert code == 0, err
        header, *rows = out.splitlines()
        assert header.split("  ")[-1] == "CUT TO FIT"
        [big] = [r for r in rows if r.startswith("big ")]
        [small] = [r for r in rows if r.startswith("small ")]
        assert big.endswith("8 designs (12 free GPUs) left out, 1 names shortened"), big
        assert small.endswith(" -"), small
        code, out, _ = run(capsys, "region", "show", "big")
        assert "summary cut to fit the global service's limits: 8 designs" in out
        code, out, _ = run(capsys, "region", "show", "small")
        assert code == 0 and "cut" not in out

        run(capsys, "region", "retire", "big")
        code, out, _ = run(capsys, "region", "list")
        assert "CUT TO FIT" not in out, "a column shown though no listed region cut"
