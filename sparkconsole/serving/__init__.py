"""What a serving engine (vLLM, SGLang) reports about itself: its ``/metrics`` page, read purely.

Kept apart from :mod:`sparkconsole.probe` because these figures come from the engine's HTTP
endpoint, not from the node's shell, and apart from :mod:`sparkconsole.ui` so the same arithmetic
serves the dashboard, ``sparkconsole parse vllm-metrics`` and tests without Textual.
"""
