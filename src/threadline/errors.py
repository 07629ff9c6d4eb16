"""The one error tree of threadline.

Every exception the library raises on purpose derives from ``ThreadlineError``.
Backend exceptions (``OSError``, ``sqlite3.Error``, ``psycopg.Error``, SDK
errors) are translated where they cross into threadline and chained with
``from`` so the original stays visible in tracebacks.

::

    ThreadlineError
    +-- ConfigError                  bad store URL, bad option, missing API key or extra
    +-- StoreError                   anything a Store reports
    |   +-- SessionNotFound
    |   +-- SessionExists
    |   +-- InvalidSessionId
    |   +-- InvalidEntry             an entry refused before anything was written
    |   +-- CorruptLog               a stored line/row that cannot be decoded
    |   +-- DurabilityError          fsync/commit failed; the handle is poisoned
    |   +-- CopyConflict             copy_sessions found a different destination
    |   +-- StoreUnavailable         connection lost or refused; retrying is safe
    |   +-- BlobNotFound             no blob under this key (names the session and entry when known)
    |   +-- BlobTooLarge             a blob over the size limit; nothing was stored
    |   +-- PrivacyError             the encryption layer or its keyring refused
    |       +-- KeyUnavailable       no key (or the wrong one) for an entry; nothing changed
    |       +-- MalformedEnvelope    one sealed entry cannot be opened; the others still read
    |       +-- PlaintextEntry       an unencrypted entry where encryption is required
    +-- ModelError                   anything a LanguageModel reports
    |   +-- AuthenticationError
    |   +-- RateLimitError           .retry_after seconds when the provider says
    |   +-- ContextOverflowError
    |   +-- TransientProviderError   5xx, overloaded, connection reset
    +-- ToolError                    bad tool definition
    +-- InvalidMessage               a message from a client (the web app) it cannot take
    +-- AgentError                   misuse of an agent
        +-- NoLoopError              run() on an agent opened with no factory
        +-- EntryNotFound            branch()/get() with an unknown entry id
        +-- SubprocessError          an external agent CLI misbehaved
        +-- ApprovalError            approve/deny for a call not awaiting a decision
        |   +-- DecisionConflict     another decision for that call was stored first
        +-- RunActive                a session already has a run going (any process)
        +-- BudgetExceeded           a model call would go over the session's budget
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AgentError",
    "ApprovalError",
    "AuthenticationError",
    "BlobNotFound",
    "BlobTooLarge",
    "BudgetExceeded",
    "ConfigError",
    "ContextOverflowError",
    "CopyConflict",
    "CorruptLog",
    "DecisionConflict",
    "DurabilityError",
    "EntryNotFound",
    "InvalidEntry",
    "InvalidMessage",
    "InvalidSessionId",
    "KeyUnavailable",
    "MalformedEnvelope",
    "ModelError",
    "NoLoopError",
    "PlaintextEntry",
    "PrivacyError",
    "RateLimitError",
    "RunActive",
    "SessionExists",
    "SessionNotFound",
    "StoreError",
    "StoreUnavailable",
    "SubprocessError",
    "ThreadlineError",
    "ToolError",
    "TransientProviderError",
]


class ThreadlineError(Exception):
    """Root of every error threadline raises on purpose."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Subclasses build their message from keyword arguments, so the default
        # pickling (calling the class with ``args``) would garble them on the
        # way through a process pool. Rebuild from the message and attributes.
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(
    cls: type[ThreadlineError], args: tuple[Any, ...], state: dict[str, Any]
) -> ThreadlineError:
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class ConfigError(ThreadlineError):
    """A setting, URL or argument the library cannot use, or a missing optional extra."""


def missing_extra(extra: str, needed_by: str, cause: ImportError) -> ConfigError:
    """The error for an optional dependency that cannot be imported (internal helper).

    Names the module that failed, since "installed but too old" (an SDK
    release that lacks a module we import) reads differently from "not
    installed". Raise it ``from`` the ImportError.
    """
    module = f" (cannot import {cause.name!r})" if cause.name else ""
    return ConfigError(f"{needed_by}: the {extra!r} extra is missing or too old{module}; "
                       f"pip install -U 'threadline[{extra}]'")


class StoreError(ThreadlineError):
    """A store could not do what was asked. ``session_id`` names the session when known."""

    def __init__(self, message: str, *, session_id: str | None = None) -> None:
        super().__init__(message)
        self.session_id = session_id


class SessionNotFound(StoreError):
    """No session has this id in the store (never created, or deleted).

    ``session_id`` is the id the caller asked for. Every store method that
    takes an id raises it, ``append_entries`` with an empty batch included;
    ``durable.open`` turns it into ``create_session``.
    """

    def __init__(self, session_id: str, where: str = "") -> None:
        suffix = f" in {where}" if where else ""
        super().__init__(f"session {session_id!r} not found{suffix}", session_id=session_id)


class SessionExists(StoreError):
    """``create_session`` found the id taken, even by an identical record.

    Nothing was changed. Of several concurrent creates of one id exactly one
    succeeds and the others get this; ``durable.open`` then loads the session.
    """

    def __init__(self, session_id: str, where: str = "") -> None:
        suffix = f" in {where}" if where else ""
        super().__init__(f"session {session_id!r} already exists{suffix}", session_id=session_id)


class InvalidSessionId(StoreError):
    """The id breaks the one session-id rule: not a non-empty ``str`` of valid
    Unicode without NUL, at most 1,024 UTF-8 bytes (``check_session_id``)."""


class InvalidEntry(StoreError):
    """An entry a store refused before writing anything of the call.

    Raised for what could not be stored so that it loads back exactly: an
    empty id, text that is not valid Unicode, nesting deeper than the codec's
    ``MAX_DEPTH``, a value JSON cannot carry (NaN, bytes, ...). ``entry_id``
    names the entry when it has a usable id.
    """

    def __init__(
        self, problem: str, *, session_id: str | None = None, entry_id: str | None = None
    ) -> None:
        what = f"entry {entry_id!r}" if entry_id else "an entry"
        where = f"session {session_id!r}: " if session_id is not None else ""
        super().__init__(f"{where}{what} {problem}; nothing was appended",
                         session_id=session_id)
        self.entry_id = entry_id
        self.problem = problem


class CorruptLog(StoreError):
    """A stored record cannot be decoded. Names the file (or table) and line (or row)."""

    def __init__(
        self,
        detail: str,
        *,
        session_id: str | None = None,
        path: str | None = None,
        line: int | None = None,
    ) -> None:
        where = path or "<store>"
        if line is not None:
            where = f"{where} line {line}"
        super().__init__(f"{where}: {detail}", session_id=session_id)
        self.path = path
        self.line = line
        self.detail = detail


class DurabilityError(StoreError):
    """A write could not be made durable.

    After an fsync failure the kernel may already have dropped the dirty pages,
    so retrying would report success for data that is not on disk. The handle
    that saw the failure refuses every later append.
    """


class CopyConflict(StoreError):
    """``copy_sessions`` found a destination session whose content differs from the source."""


class StoreUnavailable(StoreError):
    """The store's server could not be reached, or the connection died mid-call.

    Whether a write in flight committed is unknown. Retrying the same call is
    safe: a retried append is recognised as already stored, a retried
    ``create_session`` reports ``SessionExists``.
    """


class BlobNotFound(StoreError):
    """No blob is stored under ``key`` (never put, collected, or erased with its subject).

    ``session_id`` and ``entry_id`` name the session and entry that referenced
    it when the caller knows them.
    """

    def __init__(self, key: str, where: str = "", *, session_id: str | None = None,
                 entry_id: str | None = None) -> None:
        whose = ""
        if session_id is not None:
            whose = f" (referenced by session {session_id!r}"
            whose += f", entry {entry_id!r})" if entry_id is not None else ")"
        suffix = f" in {where}" if where else ""
        super().__init__(f"blob {key!r} not found{suffix}{whose}", session_id=session_id)
        self.key = key
        self.entry_id = entry_id


class BlobTooLarge(StoreError):
    """A blob is bigger than the limit it was attached under; nothing was stored."""

    def __init__(self, size: int, limit: int, *, session_id: str | None = None,
                 name: str | None = None) -> None:
        what = f"file {name!r}" if name is not None else "a blob"
        where = f"session {session_id!r}: " if session_id is not None else ""
        super().__init__(f"{where}{what} of {size:,} bytes is over the {limit:,}-byte limit; "
                         f"nothing was stored", session_id=session_id)
        self.size = size
        self.limit = limit


class PrivacyError(StoreError):
    """The encryption layer (``threadline.privacy``) or its keyring refused.

    ``session_id`` and ``entry_id`` name the entry when there is one; a
    keyring problem names the keyring file in the message instead.
    """

    def __init__(
        self, message: str, *, session_id: str | None = None, entry_id: str | None = None
    ) -> None:
        where = ""
        if session_id is not None:
            where = f"session {session_id!r}"
            if entry_id is not None:
                where += f", entry {entry_id!r}"
            where += ": "
        super().__init__(where + message, session_id=session_id)
        self.entry_id = entry_id


class KeyUnavailable(PrivacyError):
    """The data key an entry names is not in the keyring, or cannot be unwrapped.

    A missing key file, a key-encryption key that does not unwrap the data
    key (the wrong key), no key-encryption key given at all, or a key
    provider that failed. Nothing was deleted or rewritten.
    """


class MalformedEnvelope(PrivacyError):
    """One sealed entry cannot be opened although its key is at hand.

    Its envelope is damaged, names a cipher this version does not know, or
    does not authenticate (the ciphertext was altered, or the row was moved
    to another session or entry). It concerns that entry only.
    """


class PlaintextEntry(PrivacyError):
    """A store that requires encryption holds an entry that is not sealed.

    Read it only in the layer's migration mode (``plaintext="read"``), which
    can rewrite the session encrypted.
    """


class ModelError(ThreadlineError):
    """A language model call failed. ``provider``, ``model`` and ``base_url`` say which.

    Raised by a provider, it chains the SDK or transport exception it
    translates (``__cause__``).
    """

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        model: str = "",
        status_code: int | None = None,
        base_url: str | None = None,
    ) -> None:
        super().__init__(message)
        self.provider = provider
        self.model = model
        self.status_code = status_code
        self.base_url = base_url


class AuthenticationError(ModelError):
    pass


class RateLimitError(ModelError):
    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        model: str = "",
        status_code: int | None = None,
        base_url: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, provider=provider, model=model, status_code=status_code,
                         base_url=base_url)
        self.retry_after = retry_after


class ContextOverflowError(ModelError):
    pass


class TransientProviderError(ModelError):
    pass


class ToolError(ThreadlineError):
    """A tool definition is unusable (bad schema, unsupported signature)."""


class InvalidMessage(ThreadlineError):
    """A message a client sent (to ``threadline.web``) that cannot be run; says what and where."""


class AgentError(ThreadlineError):
    """An agent was used in a way it cannot serve."""


class NoLoopError(AgentError):
    pass


class EntryNotFound(AgentError):
    pass


class SubprocessError(AgentError):
    pass


class ApprovalError(AgentError):
    """A decision for a call that is not awaiting one (already decided, answered, unknown)."""


class DecisionConflict(ApprovalError):
    """Another decision for the same call was stored first; this one is recorded but inert.

    ``winner`` is the decision that counts.
    """

    def __init__(self, message: str, winner: object = None) -> None:
        super().__init__(message)
        self.winner = winner


class RunActive(AgentError):
    """A run was started on a session that already has one going, in this or another process.

    ``run_id`` names the active run (follow it, or stop it), ``owner`` the
    process that owns it (``host:pid``).
    """

    def __init__(self, session_id: str, run_id: str, owner: str = "") -> None:
        where = f" (owned by {owner})" if owner else ""
        super().__init__(f"session {session_id!r} already has run {run_id!r} going{where}: "
                         "follow it or stop it before starting another")
        self.session_id = session_id
        self.run_id = run_id
        self.owner = owner


class BudgetExceeded(AgentError):
    """A durable run stopped before a model call that would go over its budget.

    ``limit`` names what was exceeded (``"tokens"`` or ``"cost"``), ``spent``
    what the session has used by the stored totals, ``estimate`` what the
    refused call was expected to add, ``maximum`` the budget's bound.
    """

    def __init__(self, session_id: str, limit: str, spent: float, estimate: float,
                 maximum: float) -> None:
        super().__init__(
            f"session {session_id!r}: budget of {maximum:g} {limit} reached ({spent:g} used, "
            f"the next model call is estimated at {estimate:g} more); the run stopped before it"
        )
        self.session_id = session_id
        self.limit = limit
        self.spent = spent
        self.estimate = estimate
        self.maximum = maximum
