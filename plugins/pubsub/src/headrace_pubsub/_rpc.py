"""Pull, Acknowledge and ModifyAckDeadline sent straight on the subscriber client's gRPC channel.

The source makes one Pull per ~100 messages (the emulator's and often the service's answer size)
and one Acknowledge per 1,000. Through ``SubscriberClient`` each call also builds proto-plus
request and response wrappers, a deprecation warning for ``return_immediately``, a logging
interceptor, a deadline object and a retry closure: about half of this process's CPU per message
(``bench/pubsub.py``: 11 µs against 6 µs per message pulled and acknowledged). Here each call
serialises the plain protobuf messages (``PullRequest.pb()`` etc.) on the same channel (so the
same credentials, TLS and endpoint), with the metadata the client would send (routing header and
``x-goog-api-client``), and the client's own retry policy for each method (api_core ``Retry``
with the GAPIC defaults of google-cloud-pubsub 2.x: 0.1 s, x1.3 a retry, up to 60 s, on the
codes the client retries). Errors are the client's (``google.api_core.exceptions``), mapped by
api_core's ``wrap_errors``.

Imported by the source module only (it imports the client library).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.api_core import exceptions as gexc
from google.api_core import gapic_v1, grpc_helpers
from google.api_core import retry as retries
from google.pubsub_v1.services.subscriber.transports.base import DEFAULT_CLIENT_INFO
from google.pubsub_v1.types import pubsub

__all__ = ["SubscriberCalls"]

_SERVICE = "/google.pubsub.v1.Subscriber/"


def _retry(*codes: type[Exception]) -> retries.Retry:
    """The client's default retry (google/pubsub_v1/services/subscriber/transports/base.py)."""
    return retries.Retry(initial=0.1, maximum=60.0, multiplier=1.3, timeout=60.0,
                         predicate=retries.if_exception_type(*codes))  # fmt: skip


class SubscriberCalls:
    """The three calls the source makes per message, for one subscription of one client.

    Built once per source (after the client is); thread-safe like the channel. ``timeout`` is each
    attempt's deadline in seconds."""

    def __init__(self, client: Any, subscription: str, timeout: float) -> None:
        channel = client.transport.grpc_channel  # the client's own channel: credentials, TLS, endpoint
        self.subscription = subscription
        self._timeout = timeout
        self._metadata = (
            DEFAULT_CLIENT_INFO.to_grpc_metadata(),
            gapic_v1.routing_header.to_grpc_metadata((("subscription", subscription),)),
        )
        self._pull_pb = pubsub.PullRequest.pb()
        self._ack_pb = pubsub.AcknowledgeRequest.pb()
        self._modify_pb = pubsub.ModifyAckDeadlineRequest.pb()
        pull = grpc_helpers.wrap_errors(channel.unary_unary(
            _SERVICE + "Pull", request_serializer=self._pull_pb.SerializeToString,
            response_deserializer=pubsub.PullResponse.pb().FromString))  # fmt: skip
        ack = grpc_helpers.wrap_errors(channel.unary_unary(
            _SERVICE + "Acknowledge", request_serializer=self._ack_pb.SerializeToString,
            response_deserializer=None))  # fmt: skip
        modify = grpc_helpers.wrap_errors(channel.unary_unary(
            _SERVICE + "ModifyAckDeadline", request_serializer=self._modify_pb.SerializeToString,
            response_deserializer=None))  # fmt: skip
        self._pull = _retry(gexc.Aborted, gexc.InternalServerError, gexc.ServiceUnavailable, gexc.Unknown)(pull)
        self._ack = _retry(gexc.ServiceUnavailable)(ack)
        self._modify = _retry(gexc.ServiceUnavailable)(modify)

    def pull(self, max_messages: int) -> Sequence[Any]:
        """One Pull that answers at once (``return_immediately``): the protobuf
        ``ReceivedMessage`` objects, maybe none. Raises api_core exceptions."""
        request = self._pull_pb(subscription=self.subscription, max_messages=max_messages, return_immediately=True)
        return self._pull(request, timeout=self._timeout, metadata=self._metadata).received_messages

    def acknowledge(self, ack_ids: Sequence[str]) -> None:
        """One Acknowledge of ``ack_ids`` (at most 1,000 by the caller's chunking)."""
        self._ack(self._ack_pb(subscription=self.subscription, ack_ids=ack_ids), timeout=self._timeout,
                  metadata=self._metadata)  # fmt: skip

    def modify_ack_deadline(self, ack_ids: Sequence[str], seconds: int) -> None:
        """One ModifyAckDeadline: push the deadline of ``ack_ids`` to ``seconds`` from now (0: hand back)."""
        self._modify(self._modify_pb(subscription=self.subscription, ack_ids=ack_ids, ack_deadline_seconds=seconds),
                     timeout=self._timeout, metadata=self._metadata)  # fmt: skip
