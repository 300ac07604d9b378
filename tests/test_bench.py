"""Issue 24, item 4: ``sparkconsole bench`` with the tools people publish results from.

The parsers read the real outputs (``tests/fixtures/real/metrics``: a ``vllm bench serve`` run's stdout
and its ``--save-result`` JSON, a ``llama-benchy`` table, all from a DGX Spark) into named values; the
simulated cluster answers ``vllm bench serve`` (in a vLLM container) and ``uvx llama-benchy`` in the
same formats, read by the same parsers, while its ``/metrics`` counts every request; and the command
runs end to end on the demo (rows per concurrency, kept, compared with the previous run), with bad
input a one-line error and the API key never in what it prints."""

from __future__ import annotations

import contextlib
import json
import shlex

import pytest

from sparkconsole import remote as R
from sparkconsole.cli import main
from sparkconsole.errors import ValidationError
from sparkconsole.serving import bench as B
from sparkconsole.serving.metrics import parse_metrics
from sparkconsole.sim import SimClock, start_demo_cluster
from sparkconsole.sim import vllm_metrics as VM
from tests.conftest import REAL
from tests.test_sim_shell import HEAD
from tests.test_sim_shell import _connect as sim_connect
from tests.test_sim_shell import ssh as sim_ssh

METRICS = REAL / "metrics"
VLLM_TXT = METRICS / "vllm-0.20.1-bench-serve-dgxspark-ministral3-8b-office-baseline.txt"
VLLM_JSON = METRICS / "vllm-0.20.1-bench-serve-dgxspark-ministral3-8b-office-baseline.save-result.json"
BENCHY = METRICS / "llama-benchy-0.3.7-dgxspark-ministral3-8b-vllm0.20.1-pp8192-tg512.txt"
GLM_SERVED = "glm-4.7-flash"
GLM_REPO = "GadflyII/GLM-4.7-Flash-NVFP4"
KEY = "sk-bench-secret-0123456789abcdef"


# ---- the real outputs ------------------------------------------------------------------------------

def test_the_vllm_save_result_json():
    row = B.parse_vllm_bench_result(VLLM_JSON.read_text())  # its 3 '#' header lines are stripped
    assert row is not None and row.tool == "vllm"
    assert row.concurrency is None  # that run was rate-limited (0.3 rps), no --max-concurrency
    assert (row.requests, row.failed, row.input_tokens, row.output_tokens) == (200, 0, 813236, 97092)
    assert row.prompt_tokens_per_s == pytest.approx(813236 / 700.3700018370291)
    assert row.generation_tokens_per_s == pytest.approx(138.62958114330058)
    assert row.ttft_p50_s == pytest.approx(0.7744726539822295)
    assert row.ttft_p95_s == pytest.approx(1.738437473645899)
    assert row.itl_p50_s == pytest.approx(0.05387264647288248)
    assert row.itl_p95_s == pytest.approx(0.06515554960351437)
    assert row.duration_s == pytest.approx(700.37, abs=0.01)
    assert set(row.json_row()) == set(B.JSON_FIELDS)


def test_the_vllm_stdout_gives_the_same_figures_rounded():
    rows = B.parse_vllm_bench_stdout(VLLM_TXT.read_text())
    assert len(rows) == 1
    row = rows[0]
    assert row.concurrency is None  # "Maximum request concurrency: None" and max_concurrency=None
    assert (row.requests, row.failed, row.input_tokens, row.output_tokens) == (200, 0, 813236, 97092)
    assert row.generation_tokens_per_s == 138.63
    assert row.prompt_tokens_per_s == pytest.approx(813236 / 700.37)
    assert (row.ttft_p50_s, row.ttft_p95_s, row.itl_p50_s) == pytest.approx((0.77447, 1.73844, 0.05387))
    assert row.ttft_mean_s == pytest.approx(0.82876)


def test_the_llama_benchy_table():
    rows = B.parse_llama_benchy(BENCHY.read_text())
    assert [(r.concurrency, r.requests) for r in rows] == [(5, 15), (10, 30), (20, 60)]  # 3 runs × batch
    assert [r.prompt_tokens_per_s for r in rows] == [7354.20, 7291.02, 7231.67]
    assert [r.generation_tokens_per_s for r in rows] == [81.92, 122.20, 161.68]
    assert [r.ttft_mean_s for r in rows] == pytest.approx([3.12976, 5.9185, 11.08517])
    for r in rows:  # llama-benchy reports no percentiles: unknown stays unknown
        assert (r.ttft_p50_s, r.ttft_p95_s, r.itl_p50_s, r.tool) == (None, None, None, "llama-benchy")


def test_parsers_never_raise_on_odd_text():
    for junk in ("", "\x00\xff", "{", "[1,2]", '{"a": 1}', "| x |\n|---|", "=" * 50, "Namespace(max_concurrency=x"):
        assert B.parse_vllm_bench_result(junk) is None
        assert isinstance(B.parse_vllm_bench_stdout(junk), list)
        assert B.parse_llama_benchy(junk) == []
        assert isinstance(B.rows_from_outputs("vllm", [junk]), list)


# ---- the commands ------------------------------------------------------------------------------------

def test_vllm_bench_commands_are_quoted_bounded_and_keep_the_key_out():
    key_file = R.api_key_path("/home/nvidia")
    cmds = B.bench_commands(8000, GLM_SERVED, GLM_REPO, "vllm-glm", [1, 4], 8, 256, 32, "vllm",
                            key_file=key_file, stamp="s1", time_limit_s=120)
    assert len(cmds) == 2 and all(c.mutating for c in cmds)
    text = cmds[1].shell()
    assert 'k="$(cat /home/nvidia/.config/sparkconsole/api-key)"' in text and 'OPENAI_API_KEY="$k"' in text
    bench = text.split("docker exec -e OPENAI_API_KEY vllm-glm ", 1)[1].split(" 2>&1", 1)[0]
    assert shlex.split(bench) == [
        "timeout", "120", "vllm", "bench", "serve", "--backend", "openai-chat", "--base-url",
        "http://127.0.0.1:8000", "--endpoint", "/v1/chat/completions", "--model", GLM_SERVED, "--tokenizer", GLM_REPO,
        "--dataset-name", "random", "--random-input-len", "256", "--random-output-len", "32", "--num-prompts", "8",
        "--max-concurrency", "4", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles",
        "50,90,95,99", "--save-result", "--result-dir", B.RESULT_DIR, "--result-filename", "bench-s1-c4.json"]
    assert f"docker exec vllm-glm cat {B.RESULT_DIR}/bench-s1-c4.json" in text


def test_llama_benchy_command_and_refusals():
    (cmd,) = B.bench_commands(8000, GLM_SERVED, GLM_REPO, None, [5, 10], 20, 8192, 512, "llama-benchy")
    assert shlex.split(cmd.shell()) == [
        "timeout", "600", "uvx", "--from", f"llama-benchy=={R.LLAMA_BENCHY_VERSION}", "llama-benchy",
        "--base-url", "http://127.0.0.1:8000/v1", "--model", GLM_SERVED,
        "--tokenizer", GLM_REPO, "--pp", "8192", "--tg", "512", "--depth", "0", "--concurrency", "5", "10",
        "--runs", "2", "--latency-mode", "generation", "--format", "md"]
    bad = [
        lambda: B.bench_commands(8000, GLM_SERVED, None, None, [1], 4, 8, 8, "llama-benchy", key_file="/root/k k;"),
        lambda: B.bench_commands(8000, GLM_SERVED, None, None, [1], 4, 8, 8, "vllm"),  # no container
        lambda: B.bench_commands(8000, "x; touch y", None, "c", [1], 4, 8, 8, "vllm"),
        lambda: B.bench_commands(0, GLM_SERVED, None, "c", [1], 4, 8, 8, "vllm"),
        lambda: B.bench_commands(8000, GLM_SERVED, None, "c", [0], 4, 8, 8, "vllm"),
        lambda: B.bench_commands(8000, GLM_SERVED, None, "c", [1], 4, 8, 8, "ab"),
        lambda: B.bench_commands(8000, GLM_SERVED, None, "$(x)", [1], 4, 8, 8, "vllm"),
    ]
    for f in bad:
        with pytest.raises(ValidationError) as exc:
            f()
        assert "\n" not in str(exc.value)


# ---- runs kept and compared -----------------------------------------------------------------------------

def _row(c: int, gen: float) -> B.BenchRow:
    return B.BenchRow(c, 8, 1000.0, gen, 0.3, 0.4, 0.02, "vllm")


def test_runs_are_kept_per_key_and_compared_side_by_side(tmp_path):
    key = B.deployment_key("sparks", HEAD, GLM_SERVED, 8000)
    old = B.BenchRun(id="a", key=key, created="2026-01-01T00:00:00+00:00", tool="vllm", cluster="sparks", node=HEAD,
                     model=GLM_SERVED, port=8000, rows=[_row(1, 40.0), _row(4, 120.0)])
    new = B.BenchRun(id="b", key=key, created="2026-01-02T00:00:00+00:00", tool="vllm", cluster="sparks", node=HEAD,
                     model=GLM_SERVED, port=8000, rows=[_row(1, 44.0), _row(8, 200.0)])
    for r in (new, old):
        path = B.save_run(r, root=tmp_path)
        assert oct(path.stat().st_mode & 0o777) == "0o600"
    (tmp_path / "junk.json").write_text("{")
    runs = B.load_runs(key, root=tmp_path)
    assert [r.id for r in runs] == ["a", "b"] and runs[1].rows == new.rows
    assert B.load_runs("another", root=tmp_path) == []
    cmp = B.compare_runs(runs[0], runs[1])
    assert [c["concurrency"] for c in cmp] == [1, 4, 8]
    assert cmp[0]["generation_tokens_per_s"] == {"old": 40.0, "new": 44.0, "change_pct": pytest.approx(10.0)}
    assert cmp[1]["generation_tokens_per_s"]["new"] is None and cmp[2]["generation_tokens_per_s"]["old"] is None


# ---- the simulated cluster answers in the real formats ---------------------------------------------------

def _put_key(demo, path: str) -> None:
    fs = demo.sim.fs(HEAD)
    fs.mkdir(path.rsplit("/", 1)[0], parents=True)
    fs.write_text(path, KEY + "\n")


def _glm(demo):
    return next(c.engine for c in demo.sim.containers if c.name == "vllm-glm" and c.engine is not None)


async def test_vllm_bench_serve_in_the_sim_container_moves_metrics_and_takes_sim_time():
    async with start_demo_cluster(clock=SimClock.frozen()) as demo:
        run = _glm(demo)
        async with sim_connect(demo.config.node(HEAD)) as conn:
            before = VM.render(run, demo.clock.now(), demo.clock.epoch(0.0))
            gen0 = next(m for m in parse_metrics(before) if m.model == GLM_SERVED).generation_tokens or 0.0
            t0 = demo.clock.now()
            (cmd,) = B.bench_commands(8000, GLM_SERVED, GLM_REPO, "vllm-glm", [2], 6, 300, 20, "vllm", stamp="t1")
            r = await sim_ssh(demo, HEAD, cmd.shell(), step=0.25, conn=conn)
            took = demo.clock.now() - t0
        assert r.exit_status == 0, r.stderr
        out = B.section_text(r.stdout, "bench")
        # the real stdout's lines and block (tests/fixtures/real/metrics/vllm-0.20.1-bench-serve-*.txt)
        assert "Starting initial single prompt test run..." in out and "Starting main benchmark run..." in out
        assert "============ Serving Benchmark Result ============" in out
        assert "Successful requests:                     6         " in out
        assert "---------------Time to First Token----------------" in out
        assert "-----Time per Output Token (excl. 1st token)------" in out
        assert out.rstrip().endswith("=" * 50)
        (row,) = B.rows_from_outputs("vllm", [r.stdout])  # from the saved JSON, read back
        (printed,) = B.parse_vllm_bench_stdout(out)
        assert row.concurrency == printed.concurrency == 2 and row.requests == 6 and row.failed == 0
        assert row.generation_tokens_per_s == pytest.approx(printed.generation_tokens_per_s, abs=0.01)
        assert row.ttft_p50_s == pytest.approx(printed.ttft_p50_s, abs=1e-5)
        assert row.ttft_p95_s is not None and row.itl_p50_s > 0 and row.prompt_tokens_per_s > 0
        assert row.input_tokens == 6 * 300 and row.output_tokens == 6 * 20
        assert took >= row.duration_s  # the command returned after the run's sim time had passed
        after = VM.render(run, demo.clock.now(), demo.clock.epoch(0.0))
        gen1 = next(m for m in parse_metrics(after) if m.model == GLM_SERVED).generation_tokens
        assert gen1 - gen0 >= 7 * 20  # the test request and the six, counted by the engine


async def test_vllm_bench_serve_needs_the_key_an_engine_wants():
    async with start_demo_cluster(clock=SimClock.frozen()) as demo:
        run = _glm(demo)
        run.api_key = KEY
        key_file = R.api_key_path(demo.sim.login(HEAD).home)
        _put_key(demo, key_file)
        async with sim_connect(demo.config.node(HEAD)) as conn:
            (plain,) = B.bench_commands(8000, GLM_SERVED, GLM_REPO, "vllm-glm", [1], 1, 64, 4, "vllm", stamp="k0")
            r = await sim_ssh(demo, HEAD, plain.shell(), step=0.25, conn=conn)
            assert B.section_rc(r.stdout, "bench") == 1 and "Initial test run failed" in r.stdout
            (keyed,) = B.bench_commands(8000, GLM_SERVED, GLM_REPO, "vllm-glm", [1], 1, 64, 4, "vllm",
                                        key_file=key_file, stamp="k1")
            assert KEY not in keyed.shell()
            r = await sim_ssh(demo, HEAD, keyed.shell(), step=0.25, conn=conn)
        assert B.section_rc(r.stdout, "bench") == 0, r.stdout[-500:]
        assert KEY not in r.stdout + r.stderr
        assert B.rows_from_outputs("vllm", [r.stdout])[0].requests == 1


async def _run_on_head(scenario: str, text: str):
    async with start_demo_cluster(scenario=scenario, clock=SimClock.frozen()) as demo:
        return await sim_ssh(demo, HEAD, text, step=0.25)


async def test_llama_benchy_through_uvx_where_the_host_has_it():
    (cmd,) = B.bench_commands(8000, GLM_SERVED, GLM_REPO, None, [1, 3], 3, 200, 16, "llama-benchy")
    r = await _run_on_head("permissive", cmd.shell())
    assert r.exit_status == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "llama-benchy (0.3.7)" and "Concurrency levels: [1, 3]" in lines
    assert "Printing results in MD format:" in lines and "Coherence test PASSED." in lines
    rows = B.parse_llama_benchy(r.stdout)
    assert [(x.concurrency, x.requests) for x in rows] == [(1, 1), (3, 3)]
    assert all(x.prompt_tokens_per_s > 0 and x.generation_tokens_per_s > 0 for x in rows)
    assert rows[1].generation_tokens_per_s > rows[0].generation_tokens_per_s
    r = await _run_on_head("story", cmd.shell())  # a stock DGX OS host: no uvx
    assert r.exit_status == 127 and "uvx: not found" in r.stderr


# ---- the command, end to end on the demo -------------------------------------------------------------------

FAST = ["--requests", "4", "--input-len", "128", "--output-len", "16", "--speed", "400"]


@pytest.fixture
def captured_demo(monkeypatch):
    """The demo cluster ``bench --demo`` opens, kept for the test to read its engines afterwards;
    ``prepare(demo)`` runs before the command talks to it."""
    import sparkconsole.sim as sim_pkg

    seen: list = []
    prepare: list = []
    real = sim_pkg.start_demo_cluster

    @contextlib.asynccontextmanager
    async def wrapped(*a, **kw):
        async with real(*a, **kw) as demo:
            seen.append(demo)
            for f in prepare:
                f(demo)
            yield demo

    monkeypatch.setattr(sim_pkg, "start_demo_cluster", wrapped)
    return seen, prepare


def test_bench_demo_json_end_to_end(capsys, captured_demo):
    seen, _prepare = captured_demo
    rc = main(["bench", "--demo", "--json", "--yes", "--concurrency", "1,4", *FAST])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    data = json.loads(cap.out)
    assert [r["concurrency"] for r in data["rows"]] == [1, 4]
    for r in data["rows"]:
        assert list(r) == list(B.JSON_FIELDS) and r["tool"] == "vllm" and r["requests"] == 4
        assert r["prompt_tokens_per_s"] > 0 and r["generation_tokens_per_s"] > 0
        assert r["ttft_p50_s"] > 0 and r["ttft_p95_s"] >= r["ttft_p50_s"] and r["itl_p50_s"] > 0
    assert data["rows"][1]["generation_tokens_per_s"] > data["rows"][0]["generation_tokens_per_s"]
    assert data["model"] == GLM_SERVED and data["port"] == 8000 and data["previous"] is None
    assert data["engine_max_concurrency"] and data["engine_max_concurrency"] > 0
    assert "vllm bench serve" in cap.err  # the commands are shown (on stderr with --json)
    demo = seen[0]
    page = VM.render(_glm(demo), demo.clock.now(), demo.clock.epoch(0.0))
    m = next(x for x in parse_metrics(page) if x.model == GLM_SERVED)
    assert m.generation_tokens >= (4 + 4 + 2) * 16  # both runs and their test requests, on /metrics
    # a second run is kept beside the first and compared
    rc = main(["bench", "--demo", "--yes", "--concurrency", "1", *FAST])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "compared with the previous run" in cap.out and "TTFT p50" in cap.out and "kept:" in cap.out


def test_bench_demo_never_prints_the_api_key(capsys, captured_demo):
    _seen, prepare = captured_demo

    def keyed(demo):
        _glm(demo).api_key = KEY
        _put_key(demo, R.api_key_path(demo.sim.login(HEAD).home))

    prepare.append(keyed)
    rc = main(["bench", "--demo", "--json", "--yes", "--concurrency", "2", *FAST])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert json.loads(cap.out)["rows"][0]["requests"] == 4
    assert KEY not in cap.out + cap.err
    from sparkconsole.journal import default_journal_path

    assert KEY not in default_journal_path().read_text()
    for p in B.bench_root().rglob("*.json"):
        assert KEY not in p.read_text()


@pytest.mark.parametrize("argv, code, words", [
    (["--concurrency", "0,x"], 2, "--concurrency"),
    (["--concurrency", ""], 2, "--concurrency"),
    (["--requests", "0"], 2, "--requests"),
    (["--port", "70000"], 2, "--port"),
    (["--time-limit", "1"], 2, "--time-limit"),
    (["--port", "8123", "--yes"], 1, "no engine on port 8123"),
    (["--tool", "llama-benchy", "--yes"], 1, "llama-benchy failed"),
    ([], 1, "pass --yes"),  # not a terminal and no --yes: nothing runs
    (["--read-only", "--yes"], 1, "read-only"),
])
def test_bad_input_is_one_line_and_no_traceback(capsys, argv, code, words):
    rc = main(["bench", "--demo", *FAST, *argv])
    cap = capsys.readouterr()
    assert rc == code
    err = [ln for ln in cap.err.splitlines() if ln.startswith("sparkconsole:")]
    assert len(err) == 1 and words in err[0], cap.err
    assert "Traceback" not in cap.err + cap.out


def test_a_run_names_the_deployment_that_serves_its_port_and_the_plans_concurrency(tmp_path, monkeypatch):
    """The wizard's endpoint is ``http://HOST:PORT/v1``: a run on that port names the deployment and
    carries the planner's concurrency figure it was served with; another port names none."""
    from sparkconsole.commands.bench import _deployment
    from sparkconsole.deploy.state import DeploymentState, StateStore

    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path))
    st = DeploymentState.new("Qwen/Qwen3.5-122B-A10B-FP8", {}, "lab")
    st.endpoint = "http://10.0.0.5:8000/v1"
    st.plan.max_concurrency = 6.0
    StateStore().save(st)
    assert _deployment("lab", 8000) == (st.id, 6.0)
    assert _deployment("lab", 8001) == (None, None)
    assert _deployment("other", 8000) == (None, None)
