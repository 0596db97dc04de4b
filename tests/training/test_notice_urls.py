"""`[run] preempt_notice` URLs: credentials and ports outside 1..65535 are refused at
`check` (one line naming the key, no secret shown), as `checkpoint_dir`'s are."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedtrain.cli import main
from schedtrain.spec.deadlines import check_notice

SECRET = "SeCrEt+pw"


def _spec(tmp_path: Path, notice: str) -> Path:
    spec = tmp_path / "job.toml"
    spec.write_text(f'[run]\ntask = "jobs.crash:make_task"\nmax_steps = 2\n'
                    f'preempt_notice = "{notice}"\n\n[callbacks.checkpoint]\n'
                    f'type = "ModelSaver"\ntrigger = {{ every = "1 steps" }}\n')
    return spec


@settings(max_examples=100, deadline=None)
@given(kind=st.sampled_from(["aws", "gce"]), scheme=st.sampled_from(["http", "https"]),
       user=st.from_regex(r"[A-Za-z0-9_]{1,10}", fullmatch=True),
       password=st.from_regex(r"[A-Za-z0-9_+!$]{0,20}", fullmatch=True),
       port=st.integers(1, 65535))
def test_credentials_refused_and_redacted(kind: str, scheme: str, user: str, password: str,
                                          port: int) -> None:
    """Any user-info: refused, the refusal showing the URL with ``***@`` in its place."""
    secret = f"Pw{password}Zz"
    for userinfo in (f"{user}:{secret}", secret):
        problem = check_notice(f"{kind}+{scheme}://{userinfo}@host:{port}")
        assert problem is not None and "credentials" in problem and secret not in problem
        assert "***@host" in problem


@given(port=st.integers(1, 65535))
def test_ports_in_range_pass(port: int) -> None:
    """A port from 1 to 65535 (or none: the scheme's) is a server."""
    assert check_notice(f"aws+http://127.0.0.1:{port}") is None
    assert check_notice("gce+http://metadata.internal") is None


@given(port=st.one_of(st.just(0), st.integers(65536, 10**8)))
def test_ports_out_of_range_refused(port: int) -> None:
    """Port 0 and ports past 65535: refused, naming the range."""
    problem = check_notice(f"aws+http://h:{port}")
    assert problem is not None and "1 to 65535" in problem


@pytest.mark.parametrize("notice", [f"aws+http://user:{SECRET}@127.0.0.1:9",
                                    "aws+http://127.0.0.1:99999"])
def test_check_and_train_refuse(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                notice: str) -> None:
    """`check` and `train` exit 2 with one line at run.preempt_notice; the password is
    printed nowhere and nothing runs."""
    spec = _spec(tmp_path, notice)
    assert main(["check", str(spec)]) == 2
    err = capsys.readouterr().err
    [line] = [x for x in err.splitlines() if x.startswith("error")]
    assert "preempt_notice" in line and SECRET not in err
    assert main(["train", str(spec), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "preempt_notice" in err and SECRET not in err and "Traceback" not in err
    assert not (tmp_path / "run" / "checkpoints").exists()
