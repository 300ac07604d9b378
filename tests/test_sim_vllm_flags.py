"""The simulated ``vllm serve`` takes exactly the options the image's real vLLM takes.

The options come from each release's own parser (sparkconsole/sim/data/vllm_serve_flags.json, read
from the release's wheel: see its ``source``); what the twin does with a command line is what vLLM's
``FlexibleArgumentParser`` and argparse do (``--max_model_len`` as ``--max-model-len``, ``--x=v``,
unambiguous abbreviations, ``-tp``), and an option the release does not know ends the container
with argparse's two lines and exit 2, as ``vllm serve`` does.
"""

from __future__ import annotations

import pytest

from sparkconsole.recipes.catalogue import bundled_recipes
from sparkconsole.serving.engines.base import ServeSpec
from sparkconsole.serving.engines.vllm import Vllm
from sparkconsole.sim import SimClock, build
from sparkconsole.sim import vllm_logs as vl
from sparkconsole.sim.model import IMAGE_NEW, IMAGE_NGC, IMAGE_OLD, IMAGES
from tests.test_sim_model import sh

HEAD = "spark-1a32"
EMBED = "Qwen/Qwen3-Embedding-0.6B"
M = "Qwen/Qwen3-8B"
TOP_USAGE = "usage: vllm [-h] [-v] {chat,complete,serve,bench,collect-env,run-batch} ..."
# 0.20 added `vllm launch`: argparse wraps the longer usage at 80 columns (no terminal in a container)
TOP_USAGE_020 = "usage: vllm [-h] [-v]\n            {chat,complete,serve,bench,collect-env,run-batch,launch} ..."
SERVE_USAGE = "usage: vllm serve [model_tag] [options]"
IMAGE_VERSIONS = sorted({img.vllm_version for img in IMAGES.values() if img.vllm_version})
# the releases whose parser the data holds; a patch release (NGC 26.03's 0.17.1) takes its minor
# release's parser (a patch release adds no serve flags), checked below
VERSIONS = [v for v in IMAGE_VERSIONS if v.endswith(".0") or v in ("0.14.1", "0.20.1")]


def unknown(*args: str, version: str = "0.14.1") -> str:
    usage = TOP_USAGE_020 if version.startswith("0.20") else TOP_USAGE
    return f"{usage}\nvllm: error: unrecognized arguments: {' '.join(args)}"


def refused(argv: list[str], version: str) -> str:
    with pytest.raises(vl.ServeArgError) as exc:
        vl.parse_serve_args(argv, version=version)
    return str(exc.value)


def test_the_data_names_its_source_and_covers_every_image():
    data = vl.serve_flag_data()
    src = data["source"]
    assert src["repository"] == "https://github.com/vllm-project/vllm"
    assert {"vllm/engine/arg_utils.py", "vllm/entrypoints/openai/cli_args.py",
            "vllm/entrypoints/cli/serve.py"} <= set(src["files"])
    for v in IMAGE_VERSIONS:  # every image's vLLM has its minor release's parser
        assert vl.serve_parser_version(v).rsplit(".", 1)[0] == v.rsplit(".", 1)[0], v
    for v in VERSIONS:  # and these their own release's
        rel = data["versions"][v]
        assert rel["tag"] == f"v{v}" and rel["commit"] and rel["wheel"].startswith(f"vllm-{v}")
        assert rel["serve_prog"] == "vllm serve" and rel["serve_usage"] == SERVE_USAGE
        assert vl.serve_parser_version(v) == v
    # a version between releases takes the newest at or below it; one below all, the oldest
    assert vl.serve_parser_version("0.15.2") == "0.14.1"
    assert vl.serve_parser_version("0.19.0") == "0.17.0"
    assert vl.serve_parser_version("0.12.0") == "0.14.1"


@pytest.mark.parametrize("version", VERSIONS)
def test_known_options_of_every_kind_parse(version):
    a = vl.parse_serve_args([M, "--port", "8011", "--gpu-memory-utilization=0.5", "--max_model_len", "8k",
                             "-tp", "2", "-pp=1", "--no-enable-prefix-caching", "--enforce-eager",
                             "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder",
                             "--served-model-name", "a", "--api-key", "k", "--max-num-seq", "4", "-O3"],
                            version=version)
    assert (a.model, a.port, a.gmu, a.max_model_len, a.tp, a.pp) == (M, 8011, 0.5, 8000, 2, 1)
    assert a.enable_prefix_caching is False and a.enforce_eager is True and a.served_name == "a"
    assert a.max_num_seqs == 4  # an unambiguous abbreviation, as argparse allows it
    assert a.extra["enable_auto_tool_choice"] is True and a.extra["tool_call_parser"] == "qwen3_coder"
    assert a.extra["api_key"] == ["k"] and a.extra["optimization_level"] == "3"
    b = vl.parse_serve_args(["--model", M, "--enable-prefix-caching", "-n", "2", "-r", "1", "--headless",
                             "--compilation-config.mode", "3"], version=version)
    assert (b.model, b.enable_prefix_caching, b.nnodes, b.node_rank, b.headless) == (M, True, 2, 1, True)
    assert b.extra["compilation_config"] == '{"mode": 3}'


@pytest.mark.parametrize("version", VERSIONS)
def test_an_unknown_option_is_argparse_s_error(version):
    assert refused([M, "--port", "8000", "--foo", "bar"], version) == unknown("--foo", "bar", version=version)
    assert refused([M, "--foo=1", "--bar"], version) == unknown("--foo=1", "--bar", version=version)
    assert refused([M, "-tp2"], version) == unknown("-tp2", version=version)
    assert refused([M, "N"], version) == unknown("N", version=version)
    assert refused([M, "--port"], version) == f"{SERVE_USAGE}\nvllm serve: error: argument --port: expected one argument"
    assert refused([M, "--port", "x"], version) == (f"{SERVE_USAGE}\nvllm serve: error: argument --port: "
                                                      "invalid int value: 'x'")
    assert refused([M, "--enforce-eager=1"], version) == (
        f"{SERVE_USAGE}\nvllm serve: error: argument --enforce-eager/--no-enforce-eager: ignored explicit "
        "argument '1'")
    assert refused([M, "--max"], version).startswith(
        f"{SERVE_USAGE}\nvllm serve: error: ambiguous option: --max could match --max-log-len, --max-model-len")


def test_options_are_those_of_the_image_s_release():
    # --language-model-only came with 0.17; --disable-log-requests went with it; --task was gone by 0.14
    assert refused([M, "--language-model-only"], "0.14.1") == unknown("--language-model-only")
    assert vl.parse_serve_args([M, "--language-model-only"], version="0.17.0").extra["language_model_only"] is True
    assert vl.parse_serve_args([M, "--disable-log-requests"], version="0.14.1").extra["disable_log_requests"] is True
    assert refused([M, "--disable-log-requests"], "0.17.0") == unknown("--disable-log-requests")
    assert refused([M, "--task", "embed"], "0.14.1") == unknown("--task", "embed")
    # 0.20 dropped --swap-space and added --shutdown-timeout
    assert vl.parse_serve_args([M, "--swap-space", "4"], version="0.17.0").extra["swap_space"] == 4.0
    assert refused([M, "--swap-space", "4"], "0.20.1") == unknown("--swap-space", "4", version="0.20.1")
    assert refused([M, "--shutdown-timeout", "5"], "0.17.0") == unknown("--shutdown-timeout", "5")
    assert vl.parse_serve_args([M, "--shutdown-timeout", "5"], version="0.20.1").extra["shutdown_timeout"] == 5


def test_what_the_product_and_the_scenarios_pass_is_known_to_their_images():
    vllm = Vllm()
    spec = ServeSpec(M, "m", "0.0.0.0", 8000, tp=2, pp=2, gpu_memory_utilization=0.7, max_model_len=32768,
                     kv_cache_dtype="fp8", extra_args=("--load-format", "fastsafetensors", "--enable-prefix-caching",
                                                      "--enable-auto-tool-choice", "--tool-call-parser",
                                                      "qwen3_coder", "--reasoning-parser", "qwen3"))
    nodes = [("a", "10.0.0.1"), ("b", "10.0.0.2")]
    for version in VERSIONS:
        for executor in ("single", "ray", "native"):
            for launch in vllm.launches(spec, executor, nodes):
                assert launch.args[0] == "serve"
                vl.parse_serve_args(list(launch.args[1:]), version=version)
    for recipe in bundled_recipes():
        if recipe.engine == "vllm":
            version = IMAGES[recipe.image].vllm_version if recipe.image else IMAGE_NEW.vllm_version
            vl.parse_serve_args([M, *recipe.serve_args], version=version)
    build("story", clock=SimClock.frozen())  # its services' command lines parse as 0.14.1 takes them


async def test_an_unknown_option_ends_the_container_with_exit_2():
    c = build("story", clock=SimClock.frozen())
    hf = c.login(HEAD).hf_home
    for name, image in (("old", IMAGE_OLD.ref), ("ngc", IMAGE_NGC.ref)):
        run = "vllm serve " if image == IMAGE_NGC.ref else ""
        _out, err, rc = await sh(c, HEAD, f"docker run -d --name {name} --network host --gpus all "
                                          f"-v {hf}:/root/.cache/huggingface {image} {run}{EMBED} --port 8011 "
                                          "--gpu-memory-utilization 0.05 --bogus-flag 1")
        assert rc == 0, err
    c.clock.advance(30)
    for name in ("old", "ngc"):
        state = (await sh(c, HEAD, f"docker inspect -f '{{{{.State.Status}}}} {{{{.State.ExitCode}}}}' {name}"))[0]
        assert state.split() == ["exited", "2"]
        log = (await sh(c, HEAD, f"docker logs {name} 2>&1"))[0]
        assert unknown("--bogus-flag", "1", version="0.20.1" if name == "ngc" else "0.14.1") in log
    # the same start the 0.17 image knows: --language-model-only is refused by 0.14.1 only
    for name, image in (("lm14", IMAGE_OLD.ref), ("lm17", IMAGE_NEW.ref)):
        await sh(c, HEAD, f"docker run -d --name {name} --network host --gpus all -v {hf}:/root/.cache/huggingface "
                          f"{image} {EMBED} --port 8012 --gpu-memory-utilization 0.05 --language-model-only")
    c.clock.advance(10)
    log = (await sh(c, HEAD, "docker logs lm14 2>&1"))[0]
    assert unknown("--language-model-only") in log
    assert (await sh(c, HEAD, "docker inspect -f '{{.State.ExitCode}}' lm14"))[0].strip() == "2"
    assert "unrecognized arguments" not in (await sh(c, HEAD, "docker logs lm17 2>&1"))[0]
