"""Is this storage error a "not found"? For local files, S3 (botocore), Google Cloud, Azure,
delta-rs / object_store, fsspec and HTTP clients, without importing any of them."""

from __future__ import annotations

import errno

__all__ = ["is_not_found"]

# objects, files and tables; a missing bucket or container is a configuration error, not "not found"
_CODES = {"NoSuchKey", "NotFound", "404", "ResourceNotFoundException", "BlobNotFound", "PathNotFound", "NoSuchUpload"}
_BUCKET_CODES = {"NoSuchBucket", "ContainerNotFound", "FileSystemNotFound"}
_TEXT = ("no such file or directory", "not found", "notfound", "nosuchkey", "does not exist", "(404)", "status code: 404",
         "error code: 404")  # fmt: skip


def is_not_found(error: BaseException) -> bool:
    """True when ``error`` (or an exception it was raised from) says the object, file or table
    does not exist. A missing bucket (``NoSuchBucket``) is not "not found": it is a wrong
    configuration, which callers must not mistake for a deleted file."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, FileNotFoundError) or (isinstance(e, OSError) and e.errno == errno.ENOENT):
            return True
        response = getattr(e, "response", None)  # botocore ClientError: the code decides
        if isinstance(response, dict) and response.get("Error", {}).get("Code"):
            aws = str(response["Error"]["Code"])
            return aws in _CODES or (aws not in _BUCKET_CODES and response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404)
        code = getattr(e, "code", None) or getattr(e, "status_code", None) or getattr(e, "error_code", None)
        if code == 404 or str(code) in _CODES or type(e).__name__ in ("NotFound", "ResourceNotFoundError",
                                                                       "TableNotFoundError"):  # fmt: skip
            return True
        text = str(e).lower()
        if any(t in text for t in _TEXT) and not isinstance(e, PermissionError):
            return True
        e = e.__cause__ or e.__context__
    return False
