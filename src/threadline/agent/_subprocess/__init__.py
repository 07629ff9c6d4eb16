"""Drive an external agent CLI over JSON lines: wire, process, turns, loop."""

from threadline.agent._subprocess._loop import SubprocessLoop, subprocess
from threadline.agent._subprocess._wire import PROTOCOL_VERSION

__all__ = ["PROTOCOL_VERSION", "SubprocessLoop", "subprocess"]
