"""Issue 24, item 3 (the console): the serving line on the node cards and table rows, the engine view
from the node detail and from a log, its figures moving with the twin's traffic, and --no-serving.

The demo's story scenario serves GLM (vllm-glm, :8000), an embedding model (:8001) and a reranker
(:8002) on the head, and an embedding model on the worker; its engines answer ``/metrics`` over the
node's SSH connection as real vLLM V1 servers do (tests/test_sim_metrics.py). The tests drive every
poll (tests/ui_support.py); the serving poll reads the pages every third tick.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from sparkconsole.probe.poller import SERVING_EVERY
from sparkconsole.sim import Shell
from sparkconsole.ui.screens.engines import EnginePanel, EngineScreen
from sparkconsole.ui.widgets.node_card import NodeCard
from sparkconsole.ui.widgets.node_table import NodeTable
from sparkconsole.ui.widgets.serving import engine_line, engine_panel, secs, serving_cell, serving_cell_text
from tests.ui_support import demo_app, holds, poll_ticks, screen_is, started

SIZE = (160, 48)
HEAD = "spark-1a32"


@pytest.fixture(autouse=True)
def _state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))


def card_text(app, index: int = 1) -> str:
    return app.screen.query_one(f"#card-{index}", NodeCard).plain_text()


def engines_read(app, node: str = HEAD, count: int = 3) -> bool:
    """The node's engines found and every one's page read at least twice (rates need two)."""
    engines = app.node_state(node).engines
    return len(engines) >= count and all(len(w.pages) >= 2 for w in engines.values())


async def served(pilot, app, ticks: int = 3 * SERVING_EVERY + 1) -> None:
    await started(pilot, app, ticks=ticks)
    await holds(pilot, lambda: engines_read(app), "the head's engines read twice")


def chat(prompt: str, port: int = 8000, model: str = "glm-4.7-flash") -> str:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}]})
    return (f"curl -s -m 60 http://127.0.0.1:{port}/v1/chat/completions -H 'Content-Type: application/json' "
            f"-d '{body}'")


async def send_chats(pilot, app, prompts: list[str], node: str = HEAD) -> list[dict]:
    """Chat completions on the twin, moving sim time until every one has its answer."""
    sim = app.demo_cluster.sim
    tasks = [asyncio.ensure_future(Shell(sim, node).capture(chat(p))) for p in prompts]
    for _ in range(2000):
        if all(t.done() for t in tasks):
            break
        app.demo.sim_clock.advance(0.25)
        await pilot.pause(0.01)
    outs = []
    for t in tasks:
        out, _err, rc = t.result()
        assert rc == 0, out
        outs.append(json.loads(out))
    return outs


# ---- the card and the row ----------------------------------------------------------------------


async def test_the_card_shows_a_serving_line_per_engine(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await served(pilot, app)
        text = card_text(app, 1)
        assert "Serving  3 engines" in text
        lines = [ln for ln in text.splitlines() if ":800" in ln]
        assert len(lines) == 3, text
        glm = next(ln for ln in lines if "glm-4.7-flash" in ln)
        assert ":8000" in glm and "run " in glm and "wait " in glm and "KV " in glm and "tok/s" in glm
        assert any("Qwen3-Embedding-0.6B" in ln for ln in lines)  # the org is cut on a card line
        worker = card_text(app, 2)
        assert "Serving  1 engine" in worker and "Qwen3-Embedding-0.6B" in worker


async def test_the_table_row_names_the_busiest_engine(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await served(pilot, app)
        await pilot.press("v")
        table = app.screen.query_one(NodeTable)
        await holds(pilot, lambda: all(r.serving for r in table.rows.values()), "the rows' serving cells")
        lines = table.plain_lines()
        assert "serving" in lines[0]
        head = next(ln for ln in lines[1:] if HEAD in ln)
        assert "+2" in head and "t/s" in head  # the busiest of three, and two more
        # the filter finds a node by its engines' models
        table.set_filter("reranker")
        assert table.order == [HEAD]


async def test_no_serving_turns_the_serving_poll_off(tmp_path):
    app = demo_app(tmp_path)
    app.serving = False
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app, ticks=3 * SERVING_EVERY + 1)
        assert all(not p.serving for p in app.poller.pollers.values())
        assert not app.node_state(HEAD).engines
        assert "Serving" not in card_text(app, 1)
        await pilot.press("1")
        await screen_is(pilot, app, "NodeDetailScreen")
        await pilot.press("e")
        screen = await screen_is(pilot, app, "EngineScreen")
        await holds(pilot, lambda: "serving poll is off" in screen.title_text(), "the title says why")
        assert not screen.panels()


# ---- the engine view ---------------------------------------------------------------------------


async def test_the_engine_view_opens_from_the_detail_and_moves_with_traffic(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await served(pilot, app)
        await pilot.press("1")
        await screen_is(pilot, app, "NodeDetailScreen")
        await pilot.press("e")
        screen = await screen_is(pilot, app, "EngineScreen")
        assert isinstance(screen, EngineScreen) and screen.node == HEAD
        await holds(pilot, lambda: len([p for p in screen.panels() if p.watch is not None]) == 3, "three panels")
        glm = screen.panel(8000)
        assert glm is not None
        before = glm.plain_text()
        for want in ("glm-4.7-flash", "vLLM 0.14.1", ":8000", "container vllm-glm", "vllm/vllm-openai:v0.14.1",
                     "answering /metrics", "requests", "running", "waiting", "KV cache", "prompt", "generation",
                     "TTFT", "ITL", "queue", "end to end", "p50 1 min", "p95 5 min", "prefix cache", "preemptions"):
            assert want in before, want
        watch = app.node_state(HEAD).engines[8000]
        gen_before = watch.pages[-1][1].generation_tokens
        draws = glm.draws
        outs = await send_chats(pilot, app, ["12*17", "Say hello", "12*17"])
        assert all(o["usage"]["completion_tokens"] > 0 for o in outs)
        await poll_ticks(pilot, app, ticks=SERVING_EVERY)  # one more read of the pages
        await holds(pilot, lambda: watch.pages[-1][1].generation_tokens > gen_before, "the new tokens read")
        await holds(pilot, lambda: glm.draws > draws, "the panel drawn again")
        after = glm.plain_text()
        assert after != before
        f = watch.figures()
        assert f.generation_tokens_per_s is not None and f.generation_tokens_per_s > 0
        assert f"{f.generation_tokens_per_s:.0f} tok/s" in after or f"{f.generation_tokens_per_s:.1f} tok/s" in after
        assert secs(f.ttft_p50_s) in after
        # the detail's selected service's engine is focused; j moves to the next one; Esc goes back
        focused = app.screen.focused
        assert isinstance(focused, EnginePanel)
        ports = [p.port for p in screen.panels()]
        await pilot.press("j")
        assert app.screen.focused is screen.panel(ports[(ports.index(focused.port) + 1) % len(ports)])
        await pilot.press("escape")
        await screen_is(pilot, app, "NodeDetailScreen")


async def select_service(pilot, detail, name: str) -> None:
    """Put the node detail's services cursor on ``name`` once the table lists it."""
    table = detail.query_one("#containers-table")
    rows = lambda: [str(table.get_row_at(r)[0]) for r in range(table.row_count)]  # noqa: E731
    await holds(pilot, lambda: name in rows(), f"{name} in the services")
    table.move_cursor(row=rows().index(name))


async def test_the_engine_view_from_a_log_focuses_its_containers_engine(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await served(pilot, app)
        await pilot.press("1")
        detail = await screen_is(pilot, app, "NodeDetailScreen")
        await select_service(pilot, detail, "reranker")
        await pilot.press("l")
        await screen_is(pilot, app, "LogScreen")
        await pilot.press("E")
        screen = await screen_is(pilot, app, "EngineScreen")
        await holds(pilot, lambda: isinstance(app.screen.focused, EnginePanel), "an engine focused")
        assert app.screen.focused is screen.panel(8002)
        assert "Qwen/Qwen3-Reranker-0.6B" in screen.panel(8002).plain_text()
        # l follows the focused engine's log; E there goes back to this view, not a second one
        await pilot.press("l")
        await screen_is(pilot, app, "LogScreen")
        depth = len(app.screen_stack)
        await pilot.press("E")
        await screen_is(pilot, app, "EngineScreen")
        assert len(app.screen_stack) == depth - 1


async def test_the_detail_opens_the_selected_containers_engine(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await served(pilot, app)
        await pilot.press("1")
        detail = await screen_is(pilot, app, "NodeDetailScreen")
        await select_service(pilot, detail, "embeddings")
        await pilot.press("e")
        screen = await screen_is(pilot, app, "EngineScreen")
        await holds(pilot, lambda: isinstance(app.screen.focused, EnginePanel), "an engine focused")
        assert app.screen.focused is screen.panel(8001)


async def test_a_silent_engine_shows_its_reason(tmp_path):
    """The engine's process stops listening while its container runs: the card line, the row and the
    panel say why, and the engine-silent alert shows."""
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await served(pilot, app)
        sim = app.demo_cluster.sim
        run = sim.engine_on_port(HEAD, 8002, sim.now())
        assert run is not None
        watch = app.node_state(HEAD).engines[8002]
        # the page answers nothing: the read fails as a refused connection does
        watch_record = watch.record
        watch.record = lambda t, text, rc, parsed=None: watch_record(t, "curl: (7) Failed to connect to 127.0.0.1 port 8002", 7)
        await poll_ticks(pilot, app, ticks=3 * SERVING_EVERY)
        await holds(pilot, lambda: watch.silent, "the engine silent")
        text = card_text(app, 1)
        line = next(ln for ln in text.splitlines() if ":8002" in ln)
        assert "no answer: not listening (connection refused)" in line
        assert "stopped answering /metrics" in text  # the alert, under the card
        await pilot.press("1")
        await screen_is(pilot, app, "NodeDetailScreen")
        await pilot.press("e")
        screen = await screen_is(pilot, app, "EngineScreen")
        await holds(pilot, lambda: screen.panel(8002) is not None and screen.panel(8002).watch is not None, "panel")
        panel_text = screen.panel(8002).plain_text()
        assert "not answering: not listening (connection refused)" in panel_text
        assert "stopped answering /metrics" in panel_text
        assert screen.panel(8002).has_class("-silent")


# ---- pure rendering: unknown stays unknown -------------------------------------------------------


def _watch(pages: list[tuple[float, str]]):
    from sparkconsole.serving.discover import Engine
    from sparkconsole.serving.watch import EngineWatch

    w = EngineWatch(Engine(node="n", kind="vllm", where="vllm-x", image="vllm/vllm-openai:v0.17.0",
                           model="org/[bold]m", port=8000, host="0.0.0.0"), version="0.17.0")
    for t, text in pages:
        w.record(t, text, 0)
    return w


def test_none_shows_a_dash_never_a_number():
    from pathlib import Path

    from sparkconsole.ui.widgets.node_card import renderable_text

    page = (Path(__file__).parent / "fixtures" / "real" / "metrics").glob("vllm-0.11-*idle*.prom")
    w = _watch([(0.0, next(page).read_text())])  # one page: no rates yet
    f = w.figures()
    assert f.generation_tokens_per_s is None and f.prompt_tokens_per_s is None
    text = renderable_text(engine_panel(w, [], 100), 100)
    assert "prompt            — tok/s" in text and "generation        — tok/s" in text
    line = Text_plain(engine_line(w))
    assert "— tok/s" in line
    never = _watch([])  # never read
    text = renderable_text(engine_panel(never, [], 100), 100)
    assert "not read yet" in text and "TTFT" in text
    assert "0 ms" not in text and "0%" not in text
    assert "not read yet" in Text_plain(engine_line(never))


def test_model_names_are_data_not_markup():
    from sparkconsole.ui.widgets.node_card import renderable_text

    w = _watch([])
    text = renderable_text(engine_panel(w, [], 100), 100)
    assert "org/[bold]m" in text
    assert "[bold]m" in Text_plain(engine_line(w))


def test_the_serving_cell():
    from sparkconsole.probe.state import NodeState

    state = NodeState("n")
    assert serving_cell(state) == ()
    assert serving_cell_text(()).plain == "—"
    state.engines[8000] = _watch([])
    cell = serving_cell(state)
    assert serving_cell_text(cell).plain.startswith("▶ [bold]m")


def Text_plain(cells) -> str:
    return " ".join(c.plain if hasattr(c, "plain") else str(c) for c in cells)
