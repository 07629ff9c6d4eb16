"""The PostgreSQL store: many processes and machines share one database (extra ``postgres``)."""

from threadline.stores.postgres._store import PostgresStore

__all__ = ["PostgresStore"]
