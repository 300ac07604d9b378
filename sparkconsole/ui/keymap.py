"""Key bindings as data: every binding has an id (remappable from the config's ``[keymap]``)
and a tooltip (shown in the help screen), in the manner of Posting and Harlequin.
"""

from __future__ import annotations

from textual.binding import Binding

APP_BINDINGS: list[Binding] = [
    Binding("q", "quit", "Quit", id="app.quit", tooltip="Leave sparkconsole (nothing on the nodes stops)."),
    Binding("question_mark,f1", "help", "Help", key_display="?", id="app.help",
            tooltip="Show the keys that work here, with what each does."),
    Binding("ctrl+p", "command_palette", "Commands", id="app.commands", show=False,
            tooltip="Search every command: jump to a node, tail a log, stop or start a service."),
    Binding("p", "toggle_pause", "Pause", id="app.pause",
            tooltip="Pause or resume polling (the last samples stay on screen)."),
    Binding("r", "refresh_now", "Refresh", id="app.refresh", tooltip="Poll every node now."),
    Binding("m", "planner", "Plan", id="app.planner",
            tooltip="Memory planner: will a model fit on one Spark or on N? (vLLM's own arithmetic)"),
    Binding("w", "wizard", "Deploy", id="app.wizard",
            tooltip="The deployment wizard: every step, its decisions and the nodes' memory, live."),
    Binding("plus,equals_sign", "faster", "+rate", key_display="+", id="app.faster",
            tooltip="Poll more often (shorter interval)."),
    Binding("minus", "slower", "-rate", key_display="-", id="app.slower",
            tooltip="Poll less often (longer interval)."),
] + [
    Binding(str(i), f"open_node({i})", f"Node {i}", show=False, id=f"app.node{i}",
            tooltip=f"Open the detail of node {i}.")
    for i in range(1, 10)
]

OVERVIEW_BINDINGS: list[Binding] = [
    Binding("enter", "open_focused", "Detail", id="overview.open",
            tooltip="Open the detail of the focused node."),
    Binding("v", "toggle_view", "Table/cards", id="overview.view",
            tooltip="One row per node (sortable, filterable) or one card per node. The table is chosen "
                    "by itself when the cards would not fit."),
    Binding("s", "sort(1)", "Sort", id="overview.sort",
            tooltip="Sort the nodes by the next column: node, status, GPU, memory, temp, power, alerts."),
    Binding("S", "sort(0)", "Reverse", show=False, id="overview.reverse", tooltip="Reverse the sort order."),
    Binding("slash", "filter", "Filter", key_display="/", id="overview.filter",
            tooltip="Show only the nodes whose name, status, containers or alerts contain the text."),
    Binding("right,l,tab", "focus_next_card", "Next", show=False, id="overview.next",
            tooltip="Focus the next node."),
    Binding("left,h,shift+tab", "focus_previous_card", "Prev", show=False, id="overview.prev",
            tooltip="Focus the previous node."),
]

NODE_TABLE_BINDINGS: list[Binding] = [
    Binding("up,k", "cursor(-1)", "Up", show=False, id="table.up", tooltip="Highlight the node above."),
    Binding("down,j", "cursor(1)", "Down", show=False, id="table.down", tooltip="Highlight the node below."),
    Binding("pageup", "page(-1)", "Page up", show=False, id="table.pageup", tooltip="A page of nodes up."),
    Binding("pagedown", "page(1)", "Page down", show=False, id="table.pagedown", tooltip="A page of nodes down."),
    Binding("home,g", "edge(0)", "First", show=False, id="table.first", tooltip="The first node."),
    Binding("end,G", "edge(1)", "Last", show=False, id="table.last", tooltip="The last node."),
    Binding("enter", "open", "Detail", id="table.open", tooltip="Open the highlighted node's detail."),
]

DETAIL_BINDINGS: list[Binding] = [
    Binding("escape", "back", "Back", id="detail.back", tooltip="Back to the overview."),
    Binding("slash", "filter", "Filter", key_display="/", id="detail.filter",
            tooltip="Filter the services by name or image."),
    Binding("l,enter", "logs", "Logs", id="detail.logs",
            tooltip="Follow the selected service's log (docker logs -f / journalctl -f)."),
    Binding("s", "service('stop')", "Stop", id="detail.stop",
            tooltip="Stop the selected service (asks first; refused read-only)."),
    Binding("S", "service('start')", "Start", id="detail.start",
            tooltip="Start the selected service (asks first; refused read-only)."),
    Binding("R", "service('restart')", "Restart", id="detail.restart",
            tooltip="Restart the selected service (asks first; refused read-only)."),
    Binding("D", "service('remove')", "Remove", id="detail.remove", show=False,
            tooltip="Remove the selected container once it has exited (asks first; refused read-only)."),
    Binding("e", "engines", "Engines", id="detail.engines",
            tooltip="The engines this node serves (vLLM, SGLang): requests, KV cache, tok/s, TTFT and ITL "
                    "percentiles, queue time, prefix-cache hits, preemptions. The selected service's first."),
]

# The log screen's own keys live with it (screens/logs.py); this one opens another screen
LOGS_ENGINES_BINDING = Binding(
    "E", "engines", "Engines", id="logs.engines",
    tooltip="The engines of this log's node, the one this container runs first (e is the next error here).")

ENGINE_BINDINGS: list[Binding] = [
    Binding("escape", "back", "Back", id="engines.back", tooltip="Back to the previous screen."),
    Binding("down,j,tab", "move(1)", "Next engine", show=False, id="engines.next",
            tooltip="Focus the next engine's panel."),
    Binding("up,k,shift+tab", "move(-1)", "Prev engine", show=False, id="engines.prev",
            tooltip="Focus the previous engine's panel."),
    Binding("l", "logs", "Logs", id="engines.logs",
            tooltip="Follow the focused engine's container log (docker logs -f)."),
]

HELP_BINDINGS: list[Binding] = [
    Binding("escape,q,question_mark", "dismiss", "Close", id="help.close", tooltip="Close the help."),
]

WIZARD_BINDINGS: list[Binding] = [
    Binding("enter,r", "start", "Start/resume", key_display="⏎", id="wizard.start",
            tooltip="Start the deployment, or resume it where it stopped (finished steps are not run again)."),
    Binding("a", "toggle_auto", "Auto", id="wizard.auto",
            tooltip="Auto: take every recommended answer and run each step's commands without asking."),
    Binding("t", "teardown", "Teardown", id="wizard.teardown",
            tooltip="Remove what this deployment started (asks first) and offer its stopped services back."),
    Binding("R", "rehearse", "Rehearse", id="wizard.rehearse",
            tooltip="Read the nodes without changing them, build their twin and run the whole deployment there "
                    "first: the decisions, every node's commands, the failures ahead and how long it will take."),
    Binding("up,k", "browse(-1)", "Prev step", show=False, id="wizard.prev",
            tooltip="Show an earlier step's commands and notes."),
    Binding("down,j", "browse(1)", "Next step", show=False, id="wizard.next",
            tooltip="Show a later step's commands and notes."),
    Binding("l", "logs", "Logs", id="wizard.logs",
            tooltip="Follow the log of the container this deployment started on the head node."),
    Binding("escape", "back", "Back", id="wizard.back",
            tooltip="Back to the previous screen; the run goes on, and w shows it again."),
]

DECISION_BINDINGS: list[Binding] = [
    Binding("up,k", "move(-1)", "Up", show=False, id="decision.up", tooltip="Highlight the option above."),
    Binding("down,j", "move(1)", "Down", show=False, id="decision.down", tooltip="Highlight the option below."),
    Binding("enter", "choose", "Choose", key_display="⏎", id="decision.choose",
            tooltip="Answer with the highlighted option."),
    Binding("e", "edit", "Other value", id="decision.edit",
            tooltip="Type an answer that is not in the list (where the decision allows one)."),
    Binding("escape", "cancel", "Stop here", id="decision.cancel",
            tooltip="Do not answer: the run stops at this decision (enter in the wizard asks again)."),
] + [
    Binding(str(i), f"pick({i})", show=False, id=f"decision.pick{i}", tooltip=f"Highlight option {i}.")
    for i in range(1, 10)
]

REHEARSAL_BINDINGS: list[Binding] = [
    Binding("escape,q", "close", "Close", id="rehearsal.close", tooltip="Back to the wizard."),
    Binding("up,k", "scroll_up", "Up", show=False, id="rehearsal.up", tooltip="Scroll the report up."),
    Binding("down,j", "scroll_down", "Down", show=False, id="rehearsal.down", tooltip="Scroll the report down."),
]
