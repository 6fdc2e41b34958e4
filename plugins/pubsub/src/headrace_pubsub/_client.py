"""Building google-cloud-pubsub clients from headrace options: endpoint, emulator, credentials.

Imported by the source and sink modules only (it imports the client library).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import grpc
from google.api_core import exceptions as gexc
from google.cloud import pubsub_v1
from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

from headrace.errors import HeadraceError
from headrace.options import Options
from headrace_pubsub._options import (  # typed option handles
    CLIENT_EMAIL,
    CLIENT_ID,
    CREDENTIALS_FILE,
    ENDPOINT,
    PRIVATE_KEY,
    PRIVATE_KEY_ID,
    PROJECT_ID,
)

__all__ = ["Endpoint", "PubSubError", "credentials_from", "describe_api_error", "publisher_client", "resolve_endpoint",
           "subscriber_client"]  # fmt: skip

_CHANNEL_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
_TOKEN_URI = "https://oauth2.googleapis.com/token"
_SCOPES = ["https://www.googleapis.com/auth/pubsub"]


class PubSubError(HeadraceError):
    """A Pub/Sub call failed in a way the user must fix (missing topic, permission, bad credentials)."""


@dataclass(frozen=True)
class Endpoint:
    """Where clients connect: ``host`` (None = Google's default) and whether it is a plaintext emulator."""

    host: str | None
    emulator: bool

    def __str__(self) -> str:
        if self.host is None:
            return "pubsub.googleapis.com"
        return f"{self.host} ({'emulator, plaintext' if self.emulator else 'TLS'})"


def resolve_endpoint(options: Options) -> Endpoint:
    """The ``endpoint`` option, else ``$PUBSUB_EMULATOR_HOST``, else Google's endpoint.

    Called once per source/sink construction. A bare ``host:port`` (or ``http://host:port``) is an
    emulator (plaintext, anonymous); ``https://host[:port]`` is a TLS endpoint with credentials.
    """
    raw = options[ENDPOINT] or os.environ.get("PUBSUB_EMULATOR_HOST") or None
    if raw is None:
        return Endpoint(None, False)
    text = str(raw).strip()
    if text.startswith("https://"):
        return Endpoint(text.removeprefix("https://").rstrip("/"), False)
    return Endpoint(text.removeprefix("http://").rstrip("/"), True)


def credentials_from(options: Options) -> Any:
    """Credentials from clientEmail/clientId/privateKey/privateKeyId, or credentialsFile, or None
    (application default credentials, resolved by the client library). Never logs a secret."""
    from google.oauth2 import service_account

    if options.is_set(PRIVATE_KEY):
        info = {
            "type": "service_account",
            "project_id": options[PROJECT_ID],
            "client_email": options.reveal(CLIENT_EMAIL),
            "client_id": options.reveal(CLIENT_ID),
            "private_key": str(options.reveal(PRIVATE_KEY)).replace("\\n", "\n"),
            "private_key_id": options.reveal(PRIVATE_KEY_ID),
            "token_uri": _TOKEN_URI,
        }
        try:
            return service_account.Credentials.from_service_account_info(info, scopes=_SCOPES)
        except (ValueError, KeyError) as e:
            # the message of a key parse error can quote key material: keep only its type
            raise PubSubError(
                f"pubsub: the service-account key given in privateKey/clientEmail/clientId/privateKeyId is "
                f"invalid ({type(e).__name__}); fix: pass the private_key of the JSON key file exactly, "
                "including the BEGIN/END PRIVATE KEY lines"
            ) from None
    if options[CREDENTIALS_FILE]:
        path = str(options[CREDENTIALS_FILE])
        if not os.path.isfile(path):
            raise PubSubError(f"pubsub: credentialsFile {path!r} does not exist; fix: give the path of a service-account JSON key")
        try:
            return service_account.Credentials.from_service_account_file(path, scopes=_SCOPES)
        except (ValueError, KeyError) as e:
            raise PubSubError(
                f"pubsub: credentialsFile {path!r} is not a service-account JSON key ({type(e).__name__}); "
                "fix: download a key for the service account (IAM > Service accounts > Keys)"
            ) from None
    return None


def _channel(endpoint: Endpoint) -> grpc.Channel:
    assert endpoint.host is not None
    return grpc.insecure_channel(endpoint.host, options=_CHANNEL_OPTIONS)


def subscriber_client(options: Options, endpoint: Endpoint) -> pubsub_v1.SubscriberClient:
    """A SubscriberClient for ``endpoint``. Called once per source (and per pickled copy that pulls)."""
    if endpoint.emulator:
        return pubsub_v1.SubscriberClient(transport=SubscriberGrpcTransport(channel=_channel(endpoint)))
    kwargs: dict[str, Any] = {}
    creds = credentials_from(options)
    if creds is not None:
        kwargs["credentials"] = creds
    if endpoint.host:
        kwargs["client_options"] = {"api_endpoint": endpoint.host}
    return pubsub_v1.SubscriberClient(**kwargs)


def publisher_client(options: Options, endpoint: Endpoint, **kwargs: Any) -> pubsub_v1.PublisherClient:
    """A PublisherClient for ``endpoint`` with ``batch_settings`` / ``publisher_options`` in kwargs."""
    if endpoint.emulator:
        return pubsub_v1.PublisherClient(transport=PublisherGrpcTransport(channel=_channel(endpoint)), **kwargs)
    creds = credentials_from(options)
    if creds is not None:
        kwargs["credentials"] = creds
    if endpoint.host:
        kwargs["client_options"] = {"api_endpoint": endpoint.host}
    return pubsub_v1.PublisherClient(**kwargs)


def describe_api_error(e: Exception, what: str, endpoint: Endpoint) -> str:
    """A one-line explanation of a Pub/Sub API error with the fix, for ``what`` (a resource path)."""
    if isinstance(e, gexc.NotFound):
        return f"{what} does not exist at {endpoint}; fix: create it or correct the id"
    if isinstance(e, gexc.PermissionDenied | gexc.Unauthenticated):
        return (f"{what}: permission denied at {endpoint} ({type(e).__name__}); fix: grant the credentials "
                "roles/pubsub.subscriber (read), roles/pubsub.publisher (write) or roles/pubsub.editor "
                "(to create or delete subscriptions)")  # fmt: skip
    if isinstance(e, gexc.ServiceUnavailable | gexc.DeadlineExceeded):
        return f"{what}: Pub/Sub at {endpoint} is unreachable ({type(e).__name__}); fix: check the endpoint and network"
    return f"{what}: {type(e).__name__}: {getattr(e, 'message', e)}"
