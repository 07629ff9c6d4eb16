"""The ``threadline`` command: demo, and tools to inspect and move sessions.

Every command takes ``--store URL`` before or after its name (a folder,
``file:``, ``sqlite:``, ``postgresql://`` or ``memory:``; default
``$THREADLINE_STORE`` or ``./threadline-demo``). Errors print one line naming
what and where and exit with status 1 (2 for bad usage); no traceback for
bad input. Stored and user-given text is printed literally.
"""

from threadline.cli._app import main

__all__ = ["main"]
