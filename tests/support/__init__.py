"""What the tests share, so that no test module imports another.

One module per subject: ``stores`` (each built-in store by kind, for threads and
child processes; conformance hooks into files), ``sqlite``/``postgres`` (raw rows
and locks under a store), ``codec`` (Hypothesis strategies), ``effects`` and
``engines`` (durable tools, real side effects, fork servers for DBOS/Temporal),
``cli`` (the command as a child process, the hostile session), ``providers`` and
``wire_server`` (model APIs over real HTTP), ``viewer`` and ``web`` (servers and a
browser), ``pgbouncer``, ``tcp_proxy`` and ``temporal_server`` (real services to
break). Scripts that a test runs by path stay in ``tests/``.
"""
