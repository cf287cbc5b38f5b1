"""What a failure to reach a store is, and how to say it: shared by the results store's
commands and the compile cache's transfers (fsspec surfaces each service's own exception types)."""

from __future__ import annotations

_STORE_ERROR_MODULES = ("httpx", "httpx2", "botocore", "aiobotocore", "aiohttp", "hf_xet", "s3fs")


def is_store_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the storage failing (I/O, network, the service's refusal), as opposed
    to a bug here, which must surface as itself."""
    if isinstance(exc, OSError | TimeoutError):
        return True
    return any(cls.__module__.split(".", 1)[0] in _STORE_ERROR_MODULES for cls in type(exc).__mro__)


def access_failure_reason(exc: BaseException) -> str:
    """Why a store could not be used, in words that say what to check: no credentials, access
    denied, the endpoint unreachable, or else the failure itself."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    cause = f"{type(exc).__name__}: {exc}"
    if names & {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"}:
        return (
            f"no credentials were found for it ({cause}); set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or run where a role provides them"
        )
    if isinstance(exc, PermissionError) or names & {"AccessDenied", "ClientAuthenticationError"}:
        return f"access was denied ({cause}); check that the credentials in use may read it"
    if (
        isinstance(exc, ConnectionError | TimeoutError)
        or names & {"EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError"}
        or "ConnectError" in names
    ):
        return f"its endpoint did not answer ({cause}); check the URL, AWS_ENDPOINT_URL and the network"
    return f"{cause}; check the location, its credentials and the network"
