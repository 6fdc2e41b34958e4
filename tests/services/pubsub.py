"""Google's official Pub/Sub emulator (Java) on 127.0.0.1.

Install: the Debian package ``google-cloud-cli-pubsub-emulator`` (Java 17 needed), or
``gcloud components install pubsub-emulator``. It is looked for under
``/usr/lib/google-cloud-sdk`` and ``$CLOUDSDK_ROOT``/``$(gcloud info --format=value(installation.sdk_root))``.

The emulator's start script passes ``$JAVA_OPTS`` and ``$CLOUD_PUBSUB_EMULATOR_OPTS`` to the JVM
(not ``JAVA_TOOL_OPTIONS``, which would work but makes the JVM print a banner): we set
``JAVA_OPTS=-Xmx512m``. The script ``exec``s java, so the PID we hold is the JVM's.

The fixture does not set ``PUBSUB_EMULATOR_HOST`` for the whole process; pass it explicitly,
e.g. ``os.environ.update(emu.env())`` inside a test or ``subprocess.run(..., env=...)``, or
build clients with :meth:`PubSubEmulator.publisher` / :meth:`PubSubEmulator.subscriber`.
Known gap (measured): subscription filters are ignored.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.services._base import Service, ServiceUnavailable, http_get

INSTALL_HINT = (
    "Pub/Sub emulator not found: `apt-get install google-cloud-cli-pubsub-emulator openjdk-17-jre-headless` "
    "(Google Cloud's apt repository) or `gcloud components install pubsub-emulator`"
)
_REL = Path("platform/pubsub-emulator/bin/cloud-pubsub-emulator")


def find_emulator() -> Path | None:
    roots = [Path("/usr/lib/google-cloud-sdk"), Path("/usr/share/google-cloud-sdk")]
    if os.environ.get("CLOUDSDK_ROOT"):
        roots.insert(0, Path(os.environ["CLOUDSDK_ROOT"]))
    gcloud = shutil.which("gcloud")
    if gcloud:
        roots.append(Path(gcloud).resolve().parent.parent)
    for root in roots:
        if (root / _REL).exists():
            return root / _REL
    return None


class PubSubEmulator(Service):
    """The Pub/Sub emulator; ``host`` is ``"127.0.0.1:PORT"`` (what PUBSUB_EMULATOR_HOST wants)."""

    name = "pubsub-emulator"

    def __init__(
        self,
        *,
        project_id: str = "headrace-test",
        port: int | None = None,
        startup_timeout: float = 60.0,
        max_heap: str = "512m",
    ) -> None:
        super().__init__(port=port, startup_timeout=startup_timeout)
        self.project_id = project_id
        self.max_heap = max_heap
        self.binary = find_emulator()

    @property
    def host(self) -> str:
        """``"127.0.0.1:PORT"``, the value for ``PUBSUB_EMULATOR_HOST``."""
        return f"{self.bind_host}:{self.port}"

    def env(self) -> dict[str, str]:
        """The variables a google-cloud-pubsub client needs to talk to this emulator."""
        return {"PUBSUB_EMULATOR_HOST": self.host, "PUBSUB_PROJECT_ID": self.project_id}

    def check_available(self) -> None:
        if self.binary is None:
            raise ServiceUnavailable(INSTALL_HINT)
        if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
            raise ServiceUnavailable(
                "java not found (the Pub/Sub emulator needs Java 17+): `apt-get install openjdk-17-jre-headless`"
            )

    def command(self) -> Sequence[str]:
        return [str(self.binary), f"--host={self.bind_host}", f"--port={self.port}"]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env["JAVA_OPTS"] = f"{env.get('JAVA_OPTS', '')} -Xmx{self.max_heap}".strip()
        env.pop("PUBSUB_EMULATOR_HOST", None)
        return env

    def is_ready(self) -> bool:
        got = http_get(f"http://{self.bind_host}:{self.port}/")
        return got is not None and got[0] == 200 and got[1].strip() == b"Ok"

    # --- clients ----------------------------------------------------------------------
    def publisher(self, **kwargs: Any) -> Any:
        """A ``pubsub_v1.PublisherClient`` bound to this emulator (no global env needed)."""
        import grpc
        from google.cloud import pubsub_v1
        from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport

        channel = grpc.insecure_channel(self.host)
        return pubsub_v1.PublisherClient(transport=PublisherGrpcTransport(channel=channel), **kwargs)

    def subscriber(self, **kwargs: Any) -> Any:
        """A ``pubsub_v1.SubscriberClient`` bound to this emulator (no global env needed)."""
        import grpc
        from google.cloud import pubsub_v1
        from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

        channel = grpc.insecure_channel(self.host)
        return pubsub_v1.SubscriberClient(transport=SubscriberGrpcTransport(channel=channel), **kwargs)
