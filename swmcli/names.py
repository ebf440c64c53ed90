"""Names that become parts of paths: checked once, before anything is written or read by them.

A dataset key becomes a folder (``episode_000000/<key>/``), an HDF5 dataset, a Lance column, a
LeRobot feature and its video directory; a preset name becomes ``presets/<name>.toml``. Each
comes from somewhere swm does not control (a foreign dataset's metadata, ``--map``, the user's
episode dict, a flag), so each is checked here, by one rule, before it is joined to a path.
"""

from swmcli.errors import UsageError

_SEPARATORS = ("/", "\\", "\0")


def bad_name(name: object) -> str | None:
    """Why ``name`` cannot be one part of a path (empty, ``.`` or ``..``, absolute, holding a
    separator), or None when it can."""
    if not isinstance(name, str):
        return f"is a {type(name).__name__}, not text"
    if not name.strip():
        return "is empty"
    if name in (".", ".."):
        return "is '.' or '..'"
    if any(separator in name for separator in _SEPARATORS):
        return "holds a path separator"
    return None


def check_name(name: object, what: str, error=UsageError, hint: str | None = None) -> str:
    """``name`` when it is one plain path part; else one ``error`` (a UsageError unless the
    caller says the name came from damaged data) naming it and ``what`` it is."""
    why = bad_name(name)
    if why is not None:
        raise error(
            f"{what} {name!r} {why}: it must be a plain name, one part of a path",
            hint or "give it a plain name: letters, digits, '_', '-', '.' (no '/', no '..')",
        )
    return name
