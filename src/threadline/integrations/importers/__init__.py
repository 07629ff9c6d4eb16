"""Importers: other tools' transcripts as threadline sessions.

Each importer returns ``Imported`` sessions (record, entries, counts) and
writes nothing; ``threadline import --format ...`` or your own code appends
them to a store. Ids derive from the source, so importing a file again
yields the same entries and a store copy skips it. ``move_inline`` moves
the images they carry inline into the target store's blobs (``threadline
import`` does it whenever the target keeps blobs).
"""

from threadline.integrations.importers._agents_sqlite import import_agents_sqlite
from threadline.integrations.importers._blobs import move_inline
from threadline.integrations.importers._claude_code import import_claude_code
from threadline.integrations.importers._common import Imported
from threadline.integrations.importers._pi import import_pi

__all__ = ["Imported", "import_agents_sqlite", "import_claude_code", "import_pi", "move_inline"]
