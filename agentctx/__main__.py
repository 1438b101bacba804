"""``python -m agentctx``: the same as the ``agentctx`` command."""

from agentctx.replay.cli import main

raise SystemExit(main())
