"""What the serving poll found, as Rich renderables: a line per engine on the node's card, a cell in
the table row, and a panel per engine in the engine view (issue 24).

The figures come from :meth:`sparkconsole.serving.watch.EngineWatch.figures`; what was not read is
"—", never a made-up number. A model name, a container name, an image and a reason are the node's
words: they go on screen through :func:`~sparkconsole.ui.render.node_text` / ``node_str`` only.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group
from rich.table import Table
from rich.text import Text

from sparkconsole.probe.alerts import Alert
from sparkconsole.probe.state import NodeState
from sparkconsole.serving import engines as engine_kinds
from sparkconsole.serving.watch import EngineFigures, EngineWatch
from sparkconsole.ui.render import DASH, node_str, node_text, sparkline

CARD_ENGINES = 3  # engines a card shows one line each; more: two lines and "+N more"
CARD_SPARK = 8  # the sparkline's cells on a card line
PANEL_SPARK = 30  # and in the engine view (at most: it follows the panel's width)
KV_BAR = 30


def kind_name(kind: str) -> str:
    """An engine's name as people read it ("vLLM"), from its object; an unknown one as it came."""
    engine = engine_kinds.known(kind)
    return engine.label if engine is not None else node_str(kind)


def short_model(model: str | None) -> str:
    """``Qwen/Qwen3-Embedding-0.6B`` → ``Qwen3-Embedding-0.6B``: a card line has no room for the org."""
    name = node_str(model)
    return name.rsplit("/", 1)[-1] if name else ""


def num(value: float | None, digits: int = 0) -> str:
    return DASH if value is None else f"{value:.{digits}f}"


def pct(value: float | None) -> str:
    """A 0-1 fraction as a percentage, or "—"."""
    return DASH if value is None else f"{value * 100:.0f}%"


def secs(value: float | None, below: float | None = None) -> str:
    """A latency: milliseconds under a second, else seconds; "—" when not known; "< BOUND" when it fell
    in its histogram's first bucket (``below``: that bucket's bound, where the value is a guess)."""
    if value is None:
        return DASH
    if below is not None:
        return "< " + secs(below)
    if value < 1.0:
        return f"{value * 1000:.0f} ms" if value >= 0.01 else f"{value * 1000:.1f} ms"
    return f"{value:.2f} s"


def tok_s(value: float | None) -> str:
    if value is None:
        return f"{DASH} tok/s"
    return f"{value:.0f} tok/s" if value >= 10 or value == 0 else f"{value:.1f} tok/s"


def engine_key(watch: EngineWatch) -> tuple:
    """What a line or a panel of this engine shows changes only when this does: a new read, a page or
    a failure (the watch counts them; its engine and version are fixed for its life)."""
    return (watch, watch.reads)


def serving_key(state: NodeState) -> tuple:
    return tuple(engine_key(w) for _, w in sorted(state.engines.items()))


def _state_glyph(f: EngineFigures, silent: bool) -> Text:
    if f.answering:
        return Text("▶", style="green")
    if silent:
        return Text("✖", style="bold red")
    return Text("◌", style="yellow")


def engine_line(watch: EngineWatch, *, spark: int = CARD_SPARK) -> list[Text]:
    """One engine on a card, as the cells of a row: state, model, port, what it says."""
    f = watch.figures()
    glyph = _state_glyph(f, watch.silent)
    model = node_text(short_model(f.model) or f.kind, "bold")
    port = Text(f":{f.port}", style="dim")
    if not f.answering:
        why = "no answer: " if watch.silent or watch.answered else ""
        return [glyph, model, port, Text(f"{why}{node_str(f.reason) or 'not read yet'}",
                                         style="red" if watch.silent else "dim")]
    busy = Text()
    busy.append("run ", style="dim")
    busy.append(num(f.requests_running))
    busy.append(" wait ", style="dim")
    waiting = f.requests_waiting
    busy.append(num(waiting), style="dark_orange" if waiting else "")
    busy.append(" KV ", style="dim")
    kv = f.kv_cache_usage
    busy.append(pct(kv), style="red" if kv is not None and kv >= 0.95 else
                ("dark_orange" if kv is not None and kv >= 0.9 else ""))
    busy.append("  ")
    busy.append(tok_s(f.generation_tokens_per_s))
    busy.append(" ")
    busy.append_text(sparkline(watch.rates(last=spark), spark, 0.0, None, "cyan"))
    return [glyph, model, port, busy]


def serving_block(state: NodeState, limit: int = CARD_ENGINES, width: int = 76) -> Table | None:
    """The card's serving lines, one per engine (up to ``limit``, then "+N more"); None without engines.
    The sparkline takes what a card of ``width`` cells leaves (8 to 24 cells)."""
    if not state.engines:
        return None
    watches = [w for _, w in sorted(state.engines.items())]
    table = Table.grid(padding=(0, 1))
    table.add_column(width=1, no_wrap=True)
    table.add_column(ratio=1, no_wrap=True, overflow="ellipsis", min_width=8)
    table.add_column(no_wrap=True)
    table.add_column(no_wrap=True, overflow="ellipsis")
    shown = watches if len(watches) <= limit else watches[:limit - 1]
    spark = max(CARD_SPARK, min(24, width - 66))
    for w in shown:
        table.add_row(*engine_line(w, spark=spark))
    if len(shown) < len(watches):
        table.add_row("", Text(f"+{len(watches) - len(shown)} more (e in the node's detail)", style="dim"), "", "")
    return table


def serving_title(state: NodeState) -> Text:
    text = Text("Serving  ", style="bold")
    answering = sum(1 for w in state.engines.values() if w.failures == 0 and w.pages)
    text.append(f"{len(state.engines)} engine{'' if len(state.engines) == 1 else 's'}")
    if answering != len(state.engines):
        text.append(f" · {len(state.engines) - answering} not answering", style="dark_orange")
    return text


def busiest(state: NodeState) -> tuple[EngineWatch, EngineFigures] | None:
    """The engine a table row names: a silent one first (it needs the eye), then the most tokens out."""
    best: tuple[tuple, EngineWatch, EngineFigures] | None = None
    for _, w in sorted(state.engines.items()):
        f = w.figures()
        rank = (w.silent, f.generation_tokens_per_s or 0.0, f.requests_running or 0.0, -f.port)
        if best is None or rank > best[0]:
            best = (rank, w, f)
    return None if best is None else (best[1], best[2])


def serving_cell(state: NodeState) -> tuple:
    """The table row's serving cell, as comparable values (equal rows render the same strip):
    (model, tok/s rounded, silent, reason, engines); () without engines."""
    top = busiest(state)
    if top is None:
        return ()
    w, f = top
    rate = f.generation_tokens_per_s
    return (short_model(f.model) or f.kind, None if rate is None else round(rate), w.silent,
            "" if f.answering else node_str(f.reason), len(state.engines))


def serving_cell_text(cell: tuple, width: int = 21) -> Text:
    """The cell in ``width`` cells: the rate and the count always, the model's name cut to what is left."""
    if not cell:
        return Text(DASH, style="dim")
    model, rate, silent, reason, count = cell
    tail = Text()
    if silent:
        tail.append(" no answer", style="red")
    elif reason:
        tail.append(" …", style="dim")
    else:
        tail.append(f" {DASH if rate is None else rate} t/s", style="cyan")
    if count > 1:
        tail.append(f" +{count - 1}", style="dim")
    name = Text(model)
    name.truncate(max(1, width - 2 - tail.cell_len), overflow="ellipsis")
    text = Text()
    text.append("✖ " if silent else "▶ ", style="bold red" if silent else "green")
    text.append_text(name)
    text.append_text(tail)
    return text


# ---- the engine view's panel ---------------------------------------------------------------------


def kv_bar(usage: float | None, width: int = KV_BAR) -> Text:
    if usage is None:
        return Text(f"{'·' * width} {DASH}", style="dim")
    filled = max(0, min(width, round(usage * width)))
    style = "red" if usage >= 0.95 else ("dark_orange" if usage >= 0.9 else "green")
    text = Text("█" * filled, style=style)
    text.append("░" * (width - filled), style="dim")
    text.append(f" {pct(usage)}")
    return text


def _where(f: EngineFigures) -> str:
    return f"pid {node_str(f.where)} (on the host)" if f.image is None else f"container {node_str(f.where)}"


LATENCY_WIDTH = 12 + 4 * (10 + 2)  # the latency table: its label column and four figures
FIGURES_MAX_WIDTH = 64
SIDE_BY_SIDE_AT = LATENCY_WIDTH + 2 + 44  # a panel this wide shows the figures beside the latencies


def _latency_table(f: EngineFigures) -> Table:
    lat = Table.grid(padding=(0, 2))
    lat.add_column(width=10, style="dim", no_wrap=True)
    heads = ("p50 1 min", "p95 1 min", "p50 5 min", "p95 5 min")
    for _ in heads:
        lat.add_column(width=10, justify="right", no_wrap=True)
    lat.add_row(Text("latency", style="bold"), *(Text(h, style="dim") for h in heads))
    def cell(name: str) -> str:
        return secs(getattr(f, name), f.below.get(name))

    lat.add_row("TTFT", cell("ttft_p50_s"), cell("ttft_p95_s"), cell("ttft_p50_5m_s"), cell("ttft_p95_5m_s"))
    lat.add_row("ITL", cell("itl_p50_s"), cell("itl_p95_s"), cell("itl_p50_5m_s"), cell("itl_p95_5m_s"))
    lat.add_row("queue", cell("queue_p50_s"), cell("queue_p95_s"), "", "")
    lat.add_row("end to end", "", "", cell("e2e_p50_s"), "")
    return lat


def _figures_table(watch: EngineWatch, f: EngineFigures, width: int) -> Table:
    """Requests, KV cache, tok/s with the sparkline, prefix-cache hits, preemptions, in ``width`` cells."""
    value_w = max(20, width - 14)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(width=12, style="dim", no_wrap=True)
    grid.add_column(no_wrap=True, overflow="ellipsis", max_width=value_w)
    req = Text(f"running {num(f.requests_running)} · waiting ")
    req.append(num(f.requests_waiting), style="dark_orange" if f.requests_waiting else "")
    if f.waiting_rising:
        req.append(" (rising)", style="dark_orange")
    grid.add_row("requests", req)
    grid.add_row("KV cache", kv_bar(f.kv_cache_usage, max(10, min(KV_BAR, value_w - 5))))
    grid.add_row("prompt", Text(tok_s(f.prompt_tokens_per_s).rjust(11)))
    gen = Text(tok_s(f.generation_tokens_per_s).rjust(11) + " ")
    cells = max(8, min(PANEL_SPARK, value_w - 12))
    gen.append_text(sparkline(watch.rates(last=cells), cells, 0.0, None, "cyan"))
    grid.add_row("generation", gen)
    grid.add_row("prefix cache", Text(f"{pct(f.prefix_hit_rate)} hits (5 min)"))
    pre = Text(f"{num(f.preemptions)} since start · ")
    pre.append(f"{num(f.preemptions_1m)} last minute", style="dark_orange" if f.preemptions_1m else "")
    grid.add_row("preemptions", pre)
    return grid


def engine_panel(watch: EngineWatch, alerts: Sequence[Alert], width: int = 100) -> Group:
    """Everything the console knows of one engine, at ``width`` cells: the figures beside the
    latencies on a wide panel, above them on a narrow one."""
    f = watch.figures()
    kind = kind_name(f.kind)
    head = Text()
    head.append_text(_state_glyph(f, watch.silent))
    head.append(" ")
    head.append_text(node_text(f.model or DASH, "bold"))
    head.append(f"  {kind} {node_str(f.version) or DASH} · :{f.port} · ", style="dim")
    if f.answering:
        head.append("answering /metrics", style="green")
    else:
        why = node_str(f.reason) or "not read yet"
        head.append("not answering: " + why if watch.answered else why,
                    style="bold red" if watch.silent else "yellow")
    where = Text(f"{_where(f)} · image {node_str(f.image) or DASH}", style="dim")
    parts: list = [head, where, Text("")]
    if width >= SIDE_BY_SIDE_AT:
        # the figures' column no wider than they need: on a wide screen the latencies sit beside
        # them, not across the panel at its far edge
        left = min(width - LATENCY_WIDTH - 2, FIGURES_MAX_WIDTH)
        both = Table.grid(padding=(0, 2))
        both.add_column(width=left, no_wrap=True)
        both.add_column(width=LATENCY_WIDTH, no_wrap=True)
        both.add_row(_figures_table(watch, f, left), _latency_table(f))
        parts.append(both)
    else:
        parts += [_figures_table(watch, f, width), Text(""), _latency_table(f)]
    for alert in alerts:
        style = "bold red" if alert.severity == "critical" else "dark_orange"
        parts.append(Text(f"⚠ {alert.text}", style=style))
    return Group(*parts)
