"""Privacy: encryption at rest over any store, erasure by subject, retention, redaction.

``EncryptedStore(store, Keyring(folder, LocalKeyProvider.from_env()))``
seals every entry with its subject's data key before the store sees it.
``erase_subject`` destroys a subject's keys, which erases its content
wherever a sealed copy went. ``prune(store, RetentionPolicy(...))`` expires
sessions and old branches without breaking a path; ``RedactingStore`` takes
e-mail addresses, card numbers and phone numbers out, on the way in or out.
See docs/privacy.md.
"""

from __future__ import annotations

from threadline.privacy._envelope import CIPHER
from threadline.privacy._keyring import KeyErasure, Keyring, Rewrapped
from threadline.privacy._keys import KeyProvider, LocalKeyProvider
from threadline.privacy._migrate import delete_with_forks, migrate_session
from threadline.privacy._redact import (
    CARD,
    EMAIL,
    PHONE,
    Detector,
    RedactingStore,
    Redactor,
    Rule,
    luhn,
)
from threadline.privacy._retention import PruneReport, RetentionPolicy, prune
from threadline.privacy._store import EncryptedStore, Subject

__all__ = [
    "CARD",
    "CIPHER",
    "EMAIL",
    "PHONE",
    "Detector",
    "EncryptedStore",
    "KeyErasure",
    "KeyProvider",
    "Keyring",
    "LocalKeyProvider",
    "PruneReport",
    "RedactingStore",
    "Redactor",
    "RetentionPolicy",
    "Rewrapped",
    "Rule",
    "Subject",
    "delete_with_forks",
    "luhn",
    "migrate_session",
    "prune",
]
