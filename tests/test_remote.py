"""Every remote command is built and quoted in one place; hostile values never reach a shell."""

from __future__ import annotations

import shlex
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkconsole import remote
from sparkconsole.errors import ValidationError


@pytest.mark.parametrize("good", ["Qwen/Qwen3.5-122B-A10B-FP8", "deepseek-ai/DeepSeek-V3", "a/b", "org_x/m.v1"])
def test_model_ids_accepted(good):
    assert remote.validate_model_id(good) == good


@pytest.mark.parametrize(
    "bad", ["../etc/passwd", "a/b;rm -rf /", "$(id)/x", "a/b/c", "Qwen", "a/..", "a/b\n", "-a/b", "a/b c", "a--b/c", ""],
)
def test_hostile_model_ids_rejected(bad):
    with pytest.raises(ValidationError):
        remote.validate_model_id(bad)


@pytest.mark.parametrize("bad", ["x;reboot", "-rf", "a b", "$(x)", "`x`", "a\nb", ""])
def test_hostile_container_names_rejected(bad):
    with pytest.raises(ValidationError):
        remote.docker_action("stop", bad)


def test_mutating_commands_are_marked():
    assert remote.docker_action("restart", "vllm-glm").mutating
    assert remote.systemctl_action("stop", "ollama.service").mutating
    assert remote.drop_caches().mutating
    assert not remote.docker_ps().mutating
    with pytest.raises(ValidationError):
        remote.docker_action("kill -9", "x")


@given(st.text(min_size=1, max_size=60))
def test_any_value_survives_quoting_as_one_argument(value):
    """Whatever text becomes an argument, the shell sees exactly that one argument."""
    cmd = remote.RemoteCommand(("printf", "%s", value))
    if "\x00" in value:
        return
    out = subprocess.run(["sh", "-c", cmd.shell()], capture_output=True, check=True)
    assert out.stdout == value.encode()
    assert shlex.split(cmd.shell())[2] == value


def test_env_is_quoted_and_names_checked():
    cmd = remote.RemoteCommand(("sh", "-c", 'printf %s "$X"'), env=(("X", "a b;c"),))
    assert subprocess.run(["sh", "-c", cmd.shell()], capture_output=True, text=True).stdout == "a b;c"
    with pytest.raises(ValidationError):
        remote.RemoteCommand(("true",), env=(("X;Y", "1"),)).shell()
