"""Host librdkafka's mock Kafka cluster in a process of its own, controlled over loopback HTTP.

Run as ``python -m tests.services._kafka_mock_server --port CONTROL_PORT [--brokers N]``.
It loads the librdkafka shared library bundled in the confluent-kafka wheel through ctypes,
creates a mock cluster (real Kafka wire protocol, in memory, brokers on kernel-chosen ports)
and serves a tiny JSON API on 127.0.0.1:CONTROL_PORT:

    GET  /                    -> {"bootstrap_servers": "127.0.0.1:a,127.0.0.1:b,..."}
    POST /topics              {"name": str, "partitions": int, "replication_factor": int}
    POST /topics/delete       {"name": str}
    POST /delete_records      {"topic": str, "partition": int, "before_offset": int}
    POST /broker              {"broker_id": int, "up": bool}   (-1 = every broker)
    POST /rtt                 {"broker_id": int, "rtt_ms": int}

Every POST answers ``{"error": 0, "error_name": "NO_ERROR"}`` or a non-zero librdkafka error
code with HTTP 400. The process runs until it gets SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import signal
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.util import find_spec
from pathlib import Path
from typing import Any

RD_KAFKA_PRODUCER = 0


def find_librdkafka() -> Path:
    """The librdkafka shared library that ships inside the confluent-kafka wheel."""
    spec = find_spec("confluent_kafka")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("confluent-kafka is not installed: `pip install confluent-kafka`")
    site = Path(spec.origin).parent.parent
    libs = sorted((site / "confluent_kafka.libs").glob("librdkafka*.so*"))
    if not libs:
        raise FileNotFoundError(f"no librdkafka*.so* in {site / 'confluent_kafka.libs'}")
    return libs[0]


class MockCluster:
    """ctypes bindings for the few ``rd_kafka_mock_*`` functions we use."""

    def __init__(self, brokers: int, lib_path: Path | None = None) -> None:
        lib = ctypes.CDLL(str(lib_path or find_librdkafka()))
        vp, cp, i32, i64 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32, ctypes.c_int64
        sigs: dict[str, tuple[Any, list[Any]]] = {
            "rd_kafka_conf_new": (vp, []),
            "rd_kafka_conf_set": (ctypes.c_int, [vp, cp, cp, cp, ctypes.c_size_t]),
            "rd_kafka_new": (vp, [ctypes.c_int, vp, cp, ctypes.c_size_t]),
            "rd_kafka_err2name": (cp, [ctypes.c_int]),
            "rd_kafka_mock_cluster_new": (vp, [vp, ctypes.c_int]),
            "rd_kafka_mock_cluster_bootstraps": (cp, [vp]),
            "rd_kafka_mock_topic_create": (ctypes.c_int, [vp, cp, ctypes.c_int, ctypes.c_int]),
            "rd_kafka_mock_topic_delete": (ctypes.c_int, [vp, cp]),
            "rd_kafka_mock_partition_delete_records": (ctypes.c_int, [vp, cp, i32, i64]),
            "rd_kafka_mock_broker_set_down": (ctypes.c_int, [vp, i32]),
            "rd_kafka_mock_broker_set_up": (ctypes.c_int, [vp, i32]),
            "rd_kafka_mock_broker_set_rtt": (ctypes.c_int, [vp, i32, ctypes.c_int]),
            "rd_kafka_mock_group_initial_rebalance_delay_ms": (None, [vp, i32]),
        }
        for fname, (restype, argtypes) in sigs.items():
            fn = getattr(lib, fname)
            fn.restype = restype
            fn.argtypes = argtypes
        self.lib = lib
        errstr = ctypes.create_string_buffer(512)
        conf = lib.rd_kafka_conf_new()
        lib.rd_kafka_conf_set(conf, b"log_level", b"4", errstr, len(errstr))
        self.rk = lib.rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, len(errstr))
        if not self.rk:
            raise RuntimeError(f"rd_kafka_new failed: {errstr.value.decode()}")
        self.mcluster = lib.rd_kafka_mock_cluster_new(self.rk, brokers)
        if not self.mcluster:
            raise RuntimeError("rd_kafka_mock_cluster_new failed")
        self.bootstrap_servers: str = lib.rd_kafka_mock_cluster_bootstraps(self.mcluster).decode()

    def err_name(self, err: int) -> str:
        return str(self.lib.rd_kafka_err2name(err).decode())

    def set_initial_rebalance_delay_ms(self, ms: int) -> None:
        self.lib.rd_kafka_mock_group_initial_rebalance_delay_ms(self.mcluster, ms)

    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 1) -> int:
        return int(
            self.lib.rd_kafka_mock_topic_create(self.mcluster, name.encode(), partitions, replication_factor)
        )

    def delete_topic(self, name: str) -> int:
        return int(self.lib.rd_kafka_mock_topic_delete(self.mcluster, name.encode()))

    def delete_records(self, topic: str, partition: int, before_offset: int) -> int:
        return int(
            self.lib.rd_kafka_mock_partition_delete_records(
                self.mcluster, topic.encode(), partition, before_offset
            )
        )

    def set_broker(self, broker_id: int, up: bool) -> int:
        fn = self.lib.rd_kafka_mock_broker_set_up if up else self.lib.rd_kafka_mock_broker_set_down
        return int(fn(self.mcluster, broker_id))

    def set_rtt(self, broker_id: int, rtt_ms: int) -> int:
        return int(self.lib.rd_kafka_mock_broker_set_rtt(self.mcluster, broker_id, rtt_ms))


def make_handler(cluster: MockCluster) -> type[BaseHTTPRequestHandler]:
    routes: dict[str, Callable[[dict[str, Any]], int]] = {
        "/topics": lambda b: cluster.create_topic(
            b["name"], int(b.get("partitions", 1)), int(b.get("replication_factor", 1))
        ),
        "/topics/delete": lambda b: cluster.delete_topic(b["name"]),
        "/delete_records": lambda b: cluster.delete_records(
            b["topic"], int(b["partition"]), int(b["before_offset"])
        ),
        "/broker": lambda b: cluster.set_broker(int(b.get("broker_id", -1)), bool(b["up"])),
        "/rtt": lambda b: cluster.set_rtt(int(b.get("broker_id", -1)), int(b["rtt_ms"])),
    }

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, status: int, payload: dict[str, Any]) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/":
                self._reply(200, {"bootstrap_servers": cluster.bootstrap_servers})
            else:
                self._reply(404, {"error": -1, "error_name": f"no route {self.path}"})

        def do_POST(self) -> None:
            route = routes.get(self.path)
            if route is None:
                self._reply(404, {"error": -1, "error_name": f"no route {self.path}"})
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                err = route(body)
            except (KeyError, ValueError, TypeError) as e:
                self._reply(400, {"error": -1, "error_name": f"bad request: {e!r}"})
                return
            self._reply(200 if err == 0 else 400, {"error": err, "error_name": cluster.err_name(err)})

        def log_message(self, format: str, *args: Any) -> None:
            sys.stderr.write("control: " + (format % args) + "\n")

    return Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True, help="control HTTP port on 127.0.0.1")
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--initial-rebalance-delay-ms", type=int, default=0)
    args = parser.parse_args(argv)

    cluster = MockCluster(args.brokers)
    cluster.set_initial_rebalance_delay_ms(args.initial_rebalance_delay_ms)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(cluster))
    server.daemon_threads = True

    def shutdown(signum: int, frame: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    print(
        f"mock kafka cluster: bootstrap_servers={cluster.bootstrap_servers} control=127.0.0.1:{args.port}",
        flush=True,
    )
    server.serve_forever(poll_interval=0.1)


if __name__ == "__main__":
    main()
