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
    +-- ModelError                   anything a LanguageModel reports
    |   +-- AuthenticationError
    |   +-- RateLimitError           .retry_after seconds when the provider says
    |   +-- ContextOverflowError
    |   +-- TransientProviderError   5xx, overloaded, connection reset
    +-- ToolError                    bad tool definition
    +-- AgentError                   misuse of an agent
        +-- NoLoopError              run() on an agent opened with no factory
        +-- EntryNotFound            branch()/get() with an unknown entry id
        +-- SubprocessError          an external agent CLI misbehaved
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AgentError",
    "ApprovalError",
    "AuthenticationError",
    "ConfigError",
    "ContextOverflowError",
    "CopyConflict",
    "CorruptLog",
    "DecisionConflict",
    "DurabilityError",
    "EntryNotFound",
    "InvalidEntry",
    "InvalidSessionId",
    "ModelError",
    "NoLoopError",
    "RateLimitError",
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
    safe: a retried append is recognised as already stored (S25), a retried
    ``create_session`` reports ``SessionExists``.
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
