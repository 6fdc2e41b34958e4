"""Built-in connectors (like Spark's): ``rate``, ``rate-micro-batch``, ``memory``, ``console``,
``noop``, ``files`` and ``foreach_batch``. Their option schemas live in ``headrace._builtin``."""
