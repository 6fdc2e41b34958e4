"""Contract test suites every connector opts into with one subclass.

Sources::

    from headrace.protocols import ReadLimit
    from headrace.testing import SourceContract

    class TestKafkaSourceContract(SourceContract):
        connector = "kafka"
        limit = ReadLimit(max_rows=7)          # splits the seeded rows into several batches

        @pytest.fixture
        def source_options(self, kafka, tmp_path):   # a fresh, empty stream; reads from its start
            ...
        @pytest.fixture
        def seed(self, source_options):              # seed(n) appends n new, distinct rows
            ...

Sinks::

    class TestDeltaSinkContract(SinkContract):
        connector = "delta"
        transform = None                       # or "module:function": Table(timestamp, value) -> your rows

        @pytest.fixture
        def sink_options(self, tmp_path): ...
        @pytest.fixture
        def read_back(self, sink_options):     # () -> the ``value`` ints the sink holds now
            ...

What they check: discovery through the ``headrace`` entry point, unknown options rejected with
a did-you-mean, offsets that survive a JSON round trip, empty ranges, the read limit, range
boundaries (``[a,b) + [b,c) == [a,c)``, no row read twice or lost at ``b``, no partition
reading past its end), every supported read limit exact (per batch, all partitions together;
offsets surviving JSON and a restart; ``start`` left unchanged), ``page_rows`` rows read as one
range and as many small ones, ``Source.commit(b)`` leaving ``[b, c)`` readable, record batches
of the declared schema, deterministic replay, picklable partitions and commit messages, the
available-now cap, kill-and-restart (a kill-free baseline run first; then SIGKILL at every
engine crash point, at the connector's own crash points found by tracing a run, between the
calls the sink's commit makes to its client, and at random moments timed from a measured run,
weighted towards the sink's write and commit, each checked to have landed; then a clean run)
with every row exactly once for exactly-once pairs and at least once otherwise, rows invisible
until commit, idempotent re-commit of a batch id across runs, several writers committing one
batch, two queries writing the same batch ids into one target, a commit failing on an injected
client fault (optional ``commit_fault`` fixture) and its replay, abort, empty batches, and a
clean, idempotent ``close``. Every failure names the bug and where (offsets, batch, row, crash
point).

Kill tests are marked ``slow`` and ``headrace_kill`` (registered by the kit's pytest plugin):
``pytest -m "not slow"`` skips them. Their random kills use one seed per session, printed in
pytest's header; ``--headrace-seed=N`` or ``HEADRACE_KIT_SEED=N`` repeats it.
"""

from __future__ import annotations

from headrace.testing._checks import KILLS, SINK_KILLS, row_keys
from headrace.testing._kills import CRASH_POINTS
from headrace.testing._sink_suite import InjectedFault, SinkContract
from headrace.testing._source_suite import SourceContract

__all__ = ["CRASH_POINTS", "KILLS", "SINK_KILLS", "InjectedFault", "SinkContract", "SourceContract", "row_keys"]
