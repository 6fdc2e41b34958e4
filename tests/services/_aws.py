"""What the AWS-compatible test servers (kinesalite, moto) share: an HTTP endpoint on
127.0.0.1, a region and dummy credentials, as boto3 arguments or environment variables."""

from __future__ import annotations


class AwsEndpoint:
    """Mixin for a :class:`tests.services._base.Service` that speaks an AWS API over HTTP.

    ``endpoint_env`` names the environment variable the AWS SDKs read the endpoint from.
    """

    region = "us-east-1"
    aws_access_key_id = "testing"
    aws_secret_access_key = "testing"
    endpoint_env = "AWS_ENDPOINT_URL"
    bind_host: str
    port: int

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.bind_host}:{self.port}"

    def credentials(self) -> dict[str, str]:
        """boto3 keyword arguments: endpoint, region and dummy credentials."""
        return {
            "endpoint_url": self.endpoint_url,
            "region_name": self.region,
            "aws_access_key_id": self.aws_access_key_id,
            "aws_secret_access_key": self.aws_secret_access_key,
        }

    def env(self) -> dict[str, str]:
        """Environment variables for a subprocess using an AWS SDK against this server."""
        return {
            self.endpoint_env: self.endpoint_url,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_ACCESS_KEY_ID": self.aws_access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.aws_secret_access_key,
        }
