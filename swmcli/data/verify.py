"""Every episode of a dataset read against its checksums (``swm info --verify``).

Reading runs in a child process, so a decoder that crashes on damaged bytes (a native library's
abort) is counted as damage and verification goes on after that episode; the parent only
collects the verdicts.
"""

import warnings

from swmcli.data.formats import open_reader
from swmcli.data.storage.checksums import damaged_keys
from swmcli.errors import DatasetError

_FORMAT_MODULES = [f"swmcli.data.storage.{name}" for name in ("lance", "hdf5", "folder")]
# Lance warns on every fork once imported; the verify server forks only children that open
# their own dataset (this module is what it imports first, so the filter is set there).
warnings.filterwarnings("ignore", message="lance is not fork-safe")
MAX_CRASHES = 10  # decoder crashes after which verification stops (each costs a new process)


def verify(reader) -> dict:
    """Read every episode of ``reader`` and compare it with its checksums: a DatasetError naming
    the damaged episodes (the first five, and how many), else ``{"verified_episodes",
    "checksums"}`` (False for another tool's dataset, which has none: only its reads were
    checked).

    The episodes are read in a child process: some damage makes a decoder crash the process
    that reads it (Lance aborts on an absurd allocation size read from a damaged page), and then
    only the child dies; its episode is named as damaged and a new child goes on after it.
    """
    import multiprocessing

    context = multiprocessing.get_context("forkserver")  # this process may have opened Lance
    # The server imports what every child needs once (importing Lance is fork-safe; opening a
    # dataset is not): a child then starts in milliseconds instead of importing for a second.
    context.set_forkserver_preload([__name__, "lance", "h5py", "PIL.Image", *_FORMAT_MODULES])
    damaged: dict[int, str] = {}
    start, crashes, done = 0, 0, None
    while done is None:
        receive, send = context.Pipe(duplex=False)
        child = context.Process(target=_verify_from, args=(reader.path, start, send), daemon=True)
        child.start()
        send.close()
        reading = start
        while done is None:
            try:
                kind, index, text = receive.recv()
            except EOFError:
                break
            if kind == "reading":
                reading = index
            elif kind == "damaged":
                damaged[index] = text
            else:
                done = text
        child.join()
        if done is None:
            crashes += 1
            damaged[reading] = f"reading it crashed the decoder ({_death(child.exitcode)})"
            start = reading + 1
            if crashes == MAX_CRASHES:
                damaged[start] = f"not verified from here: the decoder crashed {crashes} times"
                break
    if damaged:
        shown = "; ".join(f"episode {index}: {why}" for index, why in list(damaged.items())[:5])
        more = f" (and {len(damaged) - 5} more)" if len(damaged) > 5 else ""
        raise DatasetError(
            f"{reader.path}: {len(damaged)} of {reader.num_episodes} episodes are damaged: "
            f"{shown}{more}",
            hint="restore the dataset, or collect again (convert refuses damaged episodes)",
        )
    return {"verified_episodes": reader.num_episodes, "checksums": done}


def _verify_from(path, start: int, send) -> None:
    """The child of ``verify``: episodes ``start..`` of ``path``, reported through ``send`` as
    ``("reading", i, None)``, ``("damaged", i, why)`` and last ``("done", None, has_checksums)``."""
    import os
    import signal


    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    if os.environ.get("SWM_DEBUG") != "1":  # a decoder's dying words are the parent's to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    reader = open_reader(path)
    try:
        keys = list(reader.keys)
        has_checksums = reader.read_checksums(0) is not None if reader.num_episodes else False
        for index in range(start, reader.num_episodes):
            send.send(("reading", index, None))
            try:
                episode = reader.read_episode(index)
                if has_checksums:
                    bad = damaged_keys(episode, reader.read_checksums(index), keys)
                    if bad:
                        send.send(("damaged", index, f"checksum mismatch in {', '.join(bad)}"))
            except DatasetError as error:
                send.send(("damaged", index, error.message))
        send.send(("done", None, has_checksums))
    finally:
        reader.close()


def _death(exitcode: int | None) -> str:
    """How a child process ended, in words: ``killed by SIGABRT`` or ``exit code 1``."""
    import signal

    if exitcode is not None and exitcode < 0:
        return f"killed by {signal.Signals(-exitcode).name}"
    return f"exit code {exitcode}"
