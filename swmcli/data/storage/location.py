"""Where a dataset lives: a local path, or an object-store URI (``s3://bucket/prefix/name.lance``).

A location is a ``pathlib.Path`` for a local dataset and a ``URI`` (a string that says it is one)
for one on object storage: ``as_location`` makes one from what the user typed, and no plain string
is ever taken to mean object storage. Local paths go through pathlib exactly as before; URIs go
through fsspec (s3fs) for listing and small reads, and through Lance's own object store for Lance
data. The endpoint and the credentials come only from the standard AWS environment variables
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``)
that boto and Lance both read: swm never asks for them and never writes them anywhere.
"""

import os
import shutil
from pathlib import Path

from swmcli.errors import UsageError

OBJECT_STORE_SCHEMES = ("s3",)
# What a write leaves free on its disk beyond the bytes it writes, so that a full disk is refused
# before a write (an episode, a Lance merge), never met inside one.
FREE_SPACE_MARGIN_BYTES = 64 * 2**20
S3_EXTRA_HINT = "pip install 'swmcli[s3]'  (or: pip install s3fs)"


class URI(str):
    """A dataset on object storage, ``s3://bucket/prefix/name.lance``, normalised."""

    __slots__ = ()


Location = Path | URI


def as_location(path: str | Path) -> Location:
    """``path`` as a location: a Path, or a URI for ``s3://bucket/key`` (other schemes
    refused)."""
    if isinstance(path, Path | URI):
        return path
    text = str(path)
    scheme, separator, rest = text.partition("://")
    if not separator:
        return Path(text)
    if scheme.lower() not in OBJECT_STORE_SCHEMES:
        raise UsageError(
            f"unsupported dataset location {text!r}: swm reads local paths and s3:// URIs",
            hint="use a local path or s3://bucket/prefix/name.lance",
        )
    bucket, _, key = rest.partition("/")
    if not bucket or not key.strip("/"):
        raise UsageError(
            f"{text} names a bucket but no dataset in it",
            hint="use s3://bucket/prefix/name.lance",
        )
    return URI(f"{scheme.lower()}://{bucket}/{key.strip('/')}")


def is_remote(location: Location) -> bool:
    """True for a dataset on object storage."""
    return isinstance(location, URI)


def filesystem():
    """The fsspec filesystem for s3:// URIs; the exact ``pip install`` line when s3fs is missing.

    Listings are not cached: a dataset being appended to must look the same to every call.
    """
    try:
        import s3fs
    except ImportError:
        raise UsageError("s3:// datasets need the s3fs package", hint=S3_EXTRA_HINT) from None
    return s3fs.S3FileSystem(use_listings_cache=False)


def lance_storage_options(location: Location) -> dict[str, str] | None:
    """Options Lance's object store needs beyond the AWS variables: plain-http endpoints
    (a local S3-compatible server) are allowed when ``AWS_ENDPOINT_URL`` says http://."""
    if not is_remote(location):
        return None
    if os.environ.get("AWS_ENDPOINT_URL", "").startswith("http://"):
        return {"allow_http": "true"}
    return {}


def join(location: Location, *parts: str) -> Location:
    """``location / part / ...``."""
    if is_remote(location):
        return URI("/".join([location, *parts]))
    return location.joinpath(*parts)


def name(location: Location) -> str:
    """The last component (``name.lance``)."""
    return location.rsplit("/", 1)[-1] if is_remote(location) else location.name


def with_name(location: Location, new_name: str) -> Location:
    """A sibling of ``location`` called ``new_name``."""
    if is_remote(location):
        return URI(f"{location.rsplit('/', 1)[0]}/{new_name}")
    return location.with_name(new_name)


def exists(location: Location) -> bool:
    """True when a file or a directory (a non-empty prefix on object storage) is there."""
    return filesystem().exists(location) if is_remote(location) else location.exists()


def is_file(location: Location) -> bool:
    """True for a file (an object)."""
    return filesystem().isfile(location) if is_remote(location) else location.is_file()


def is_dir(location: Location) -> bool:
    """True for a directory (a prefix holding objects)."""
    return filesystem().isdir(location) if is_remote(location) else location.is_dir()


def read_head(location: Location, size: int) -> bytes:
    """The first ``size`` bytes of a file."""
    if is_remote(location):
        return filesystem().cat_file(location, start=0, end=size)
    with location.open("rb") as handle:
        return handle.read(size)


def read_tails(files: dict[Location, int], size: int) -> dict[Location, bytes]:
    """The last ``size`` bytes of each file (all of a shorter one), given ``{file: its size}``;
    on object storage the reads go out together."""
    starts = {file: max(total - size, 0) for file, total in files.items()}
    if files and is_remote(next(iter(files))):
        paths = list(files)
        tails = filesystem().cat_ranges(
            paths, [starts[p] for p in paths], [files[p] for p in paths], on_error="raise"
        )
        return dict(zip(paths, tails, strict=True))
    tails = {}
    for file, start in starts.items():
        with file.open("rb") as handle:
            handle.seek(start)
            tails[file] = handle.read()
    return tails


def resolve(location: Location) -> Location:
    """An absolute location (a URI already is one)."""
    return location if is_remote(location) else location.resolve()


def make_parent(location: Location) -> None:
    """Create the directory ``location`` goes in (object storage has none to make)."""
    if not is_remote(location):
        location.parent.mkdir(parents=True, exist_ok=True)


def remove(location: Location) -> None:
    """Delete a file or a directory tree, if there."""
    if is_remote(location):
        fs = filesystem()
        if fs.exists(location):
            fs.rm(location, recursive=True)
    elif location.is_dir():
        shutil.rmtree(location, ignore_errors=True)
    elif location.exists():
        location.unlink()


def nbytes_under(location: Location) -> int:
    """Bytes stored in a file or under a directory."""
    if is_remote(location):
        return int(filesystem().du(location, total=True))
    if location.is_file():
        return location.stat().st_size
    total = 0
    for path in location.rglob("*"):
        try:  # a writer's temporary may vanish between the listing and the stat
            total += path.stat().st_size if path.is_file() else 0
        except FileNotFoundError:
            continue
    return total


def free_bytes(path: Path) -> int:
    """Free bytes on the local disk of ``path`` (of its parent where it does not exist yet)."""
    return shutil.disk_usage(path if path.exists() else path.parent).free


def write_text(location: Location, text: str) -> None:
    """Write a small text file (a local file, or one object)."""
    if is_remote(location):
        filesystem().pipe_file(location, text.encode())
    else:
        location.write_text(text)


def move(source: Location, destination: Location) -> None:
    """Move a dataset onto a free ``destination``: a rename locally; on object storage a copy
    of every object, the Lance manifests (``_versions``) last, so the destination becomes a
    dataset only once all its data is there, then the source is deleted."""
    if not is_remote(source):
        os.rename(source, destination)
        return
    fs = filesystem()
    prefix = source.split("://", 1)[1]
    objects = sorted(fs.find(source), key=lambda key: "/_versions/" in key)
    for key in objects:
        fs.copy(key, destination + key[len(prefix) :])
    fs.rm(source, recursive=True)
