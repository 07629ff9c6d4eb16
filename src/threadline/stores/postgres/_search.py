"""The PostgreSQL store's full-text index: ``tsvector`` rows with a GIN index.

``search`` holds one row per entry that has indexed text: ``(session_id,
seq)`` and the id of the entry, the text and its ``tsvector`` in the ``simple``
configuration (words lower-cased, no stemming, no stop words: the same
words for every language). Triggers keep it, so both of the store's append
paths (psycopg's and the wire's) and any later one are covered with no
change to their statements: a statement trigger on ``entries`` inserts the
rows of the entries an append inserted, in that statement, so in the
append's own transaction; another removes the rows of deleted entries in
the delete's, and a third empties the index when ``entries`` is truncated
(a truncate fires no delete trigger, and rows left behind would collide with
the entries numbered anew).

The text is computed in SQL from the compact row (``stores/_rows.py``) by
``search_text``, the same rules as ``stores/_search.py``'s ``indexed_text``; the trigger reads
a plain message's text inline, so most appends call no SQL function (a
statement that does pays for planning it)
(the conformance part compares them). JSON that ``jsonb`` refuses (a
``\\u0000`` escape) makes the trigger fall back to a row-by-row pass in which
such an escape is read as U+2400 and a row that still fails is left out of
the index, never failing the append.
"""

from __future__ import annotations

from typing import Any

from psycopg import sql

from threadline.stores._contract import SearchHit
from threadline.stores._rows import KINDS, id_text
from threadline.stores._search import Query, path_keys, snippet_of

__all__ = ["MIGRATION", "run_search"]


_TYPES = ("message", "compaction", "branch_summary", "custom_message")
_KINDS = ", ".join(["0", *(str(k) for k, (t, _, _) in enumerate(KINDS) if k and t in _TYPES)])


# Kinds whose data is mostly the JSON-escaped text of a message's one text
# part: when it holds no unescaped quote it is read as a JSON string, with no
# document to parse (most entries of a chat).
_PLAIN = ", ".join(str(k) for k, (t, start, end) in enumerate(KINDS)
                   if t == "message" and start.endswith(b'"text":"') and end == b'"}]}}')


def _kind_types() -> str:
    """``CASE kind`` arms giving the ``type`` of each compact kind (0: the line has it)."""
    arms = []
    for k, (t, start, end) in enumerate(KINDS):
        if k == 0 or t not in _TYPES:
            continue
        head = '{"type":"' + t + '","_":0'
        arms.append(f"WHEN {k} THEN ('{head}' || "
                    f"'{start.decode()}' || convert_from(data, 'UTF8') || '{end.decode()}')")
    return "CASE kind WHEN 0 THEN convert_from(data, 'UTF8') " + " ".join(arms) + " END"


# Split on ";\n" by the runner: each function body is one line.
MIGRATION = (
    """
CREATE FUNCTION {s}.search_json(j jsonb) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT CASE WHEN j->>'type' = 'message' AND j#>>'{{message,role}}' = 'tool_result' THEN nullif(j#>>'{{message,tool_name}}', '') WHEN j->>'type' = 'message' AND j#>>'{{message,role}}' IN ('user', 'assistant') OR j->>'type' = 'custom_message' THEN (SELECT string_agg(t, E'\\n' ORDER BY n) FROM jsonb_array_elements(CASE WHEN j->>'type' = 'message' THEN j#>'{{message,content}}' ELSE j->'content' END) WITH ORDINALITY AS p(v, n), LATERAL (SELECT CASE WHEN v->>'type' = 'text' THEN v->>'text' WHEN v->>'type' = 'tool_call' AND j#>>'{{message,role}}' = 'assistant' THEN v->>'name' END AS t) AS x WHERE t <> '') WHEN j->>'type' IN ('compaction', 'branch_summary') THEN nullif(j->>'summary', '') END $$;
CREATE FUNCTION {s}.search_line(kind smallint, data bytea) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT KINDS_CASE $$;
CREATE FUNCTION {s}.search_text(kind smallint, data bytea) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT CASE WHEN kind IN (PLAIN_LIST) AND convert_from(data, 'UTF8') !~ '(^|[^\\\\])(\\\\\\\\)*"' THEN nullif(('"' || convert_from(data, 'UTF8') || '"')::jsonb #>> '{{}}', '') WHEN kind IN (KINDS_LIST) THEN {s}.search_json({s}.search_line(kind, data)::jsonb) END $$;
CREATE FUNCTION {s}.search_text_lenient(kind smallint, data bytea) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$ BEGIN RETURN {s}.search_text(kind, convert_to(replace(convert_from(data, 'UTF8'), '\\u0000', '\\u2400'), 'UTF8')); EXCEPTION WHEN data_exception THEN RETURN NULL; END $$;
CREATE TABLE {s}.search (
    seq bigint NOT NULL,
    session_id text COLLATE "C" NOT NULL,
    entry_id bytea NOT NULL,
    body text NOT NULL,
    tsv tsvector NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE INDEX search_tsv ON {s}.search USING gin (tsv);
CREATE FUNCTION {s}.search_added() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN BEGIN INSERT INTO {s}.search (seq, session_id, entry_id, body, tsv) SELECT seq, session_id, entry_id, t, to_tsvector('simple', t) FROM (SELECT seq, session_id, entry_id, CASE WHEN kind IN (PLAIN_LIST) AND convert_from(data, 'UTF8') !~ '(^|[^\\\\])(\\\\\\\\)*"' THEN nullif(('"' || convert_from(data, 'UTF8') || '"')::jsonb #>> '{{}}', '') ELSE {s}.search_text(kind, data) END AS t FROM added WHERE kind IN (KINDS_LIST)) AS a WHERE t IS NOT NULL; EXCEPTION WHEN data_exception THEN INSERT INTO {s}.search (seq, session_id, entry_id, body, tsv) SELECT seq, session_id, entry_id, t, to_tsvector('simple', t) FROM (SELECT seq, session_id, entry_id, {s}.search_text_lenient(kind, data) AS t FROM added WHERE kind IN (KINDS_LIST)) AS a WHERE t IS NOT NULL; END; RETURN NULL; END $$;
CREATE FUNCTION {s}.search_removed() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN DELETE FROM {s}.search x USING gone g WHERE x.tenant = g.tenant AND x.session_id = g.session_id AND x.seq = g.seq; RETURN NULL; END $$;
CREATE TRIGGER search_added AFTER INSERT ON {s}.entries REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION {s}.search_added();
CREATE TRIGGER search_removed AFTER DELETE ON {s}.entries REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION {s}.search_removed();
CREATE FUNCTION {s}.search_truncated() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN TRUNCATE {s}.search; RETURN NULL; END $$;
CREATE TRIGGER search_truncated AFTER TRUNCATE ON {s}.entries FOR EACH STATEMENT EXECUTE FUNCTION {s}.search_truncated();
INSERT INTO {s}.search (seq, session_id, entry_id, body, tsv) SELECT seq, session_id, entry_id, t, to_tsvector('simple', t) FROM (SELECT seq, session_id, entry_id, {s}.search_text_lenient(kind, data) AS t FROM {s}.entries WHERE kind IN (KINDS_LIST)) AS a WHERE t IS NOT NULL
""".replace("KINDS_CASE", _kind_types().replace("{", "{{").replace("}", "}}"))  # noqa: E501
    .replace("KINDS_LIST", _KINDS).replace("PLAIN_LIST", _PLAIN)
)


def search_sql(schema: sql.Identifier, q: Query) -> sql.Composed:
    """The search statement: the best rows first, from the index table alone (the
    snippet is cut in Python: ``ts_headline`` drops what its parser takes for HTML
    tags)."""
    scope: sql.Composable = sql.SQL("")
    for column, value in (("owner", q.owner), ("meta_tenant", q.tenant)):
        if value is not None:
            scope += sql.SQL(" AND s.{} = %s").format(sql.Identifier(column))
    if q.owner is not None or q.tenant is not None:
        scope = sql.SQL(" AND EXISTS (SELECT 1 FROM {s}.sessions s "
                        "WHERE s.tenant = x.tenant AND s.session_id = x.session_id{scope})"
                        ).format(s=schema,
                                                                           scope=scope)
    limit = sql.SQL("") if q.active_path else sql.SQL(" LIMIT %s")
    return sql.SQL(
        "SELECT x.session_id, x.entry_id, x.body, ts_rank(x.tsv, q) AS rank "
        "FROM {s}.search x, plainto_tsquery('simple', %s) AS q WHERE x.tenant = %s "
        "AND x.tsv @@ q"
        "{scope} ORDER BY rank DESC, x.session_id, x.seq{limit}").format(
            s=schema, scope=scope, limit=limit)


def search_args(tenant: str, q: Query) -> list[Any]:
    """``search_sql``'s parameters; ``tenant`` is the store's (row-level security's)."""
    args: list[Any] = [" ".join(q.terms), tenant,
                       *(v for v in (q.owner, q.tenant) if v is not None)]
    return args if q.active_path else [*args, q.limit]


def path_sql(schema: sql.Identifier) -> sql.Composed:
    return sql.SQL("SELECT entry_id, parent_id FROM {s}.entries WHERE tenant = %s "
                   "AND session_id = %s ORDER BY seq").format(s=schema)


def run_search(rows: list[tuple[Any, ...]], q: Query,
               paths: dict[str, set[bytes]] | None) -> list[SearchHit]:
    """Hits from the statement's rows; with ``paths`` (session -> its active path's id
    keys) only those on it."""
    hits = []
    for sid, stored_key, body, rank in rows:
        key = bytes(stored_key)
        if paths is not None and key not in paths[sid]:
            continue
        hits.append(SearchHit(session_id=sid, entry_id=id_text(key),
                              snippet=snippet_of(body, q.terms), rank=float(rank)))
        if len(hits) == q.limit:
            break
    return hits


def active_paths(parents: dict[str, dict[bytes, bytes | None]]) -> dict[str, set[bytes]]:
    return {sid: path_keys(p) for sid, p in parents.items()}
