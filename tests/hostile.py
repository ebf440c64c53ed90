"""The hostile-input corpus (issue 31): one small crafted case per way swm was broken, written at
run time under a temporary root, never committed as a blob.

Every case writes what it needs under its root: the input in ``in/``, destinations in ``out/``,
the user's own code in ``code/`` (on ``PYTHONPATH``), and ``outside/``, which no command may read
or write (hostile links point there). ``make(root)`` returns a ``Case``: the ``swm`` arguments,
the exit code and the line they must give (or, for a case that must work, a ``check`` of what was
read or written), and the paths the command may write. ``tests/test_hostile.py`` runs each in
process and compares the whole tree before and after; ``tests/hostile_sweep.py`` runs each as a
real ``swm`` process (under strace where it can) and counts what left the root.
"""

import hashlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FIXTURES = Path(__file__).parent / "fixtures"
LEROBOT = FIXTURES / "lerobot" / "dots"
UPSTREAM_FOLDER = FIXTURES / "stable_worldmodel" / "main" / "tworoom-folder"
SECRET = "swm-hostile-secret: a read outside the dataset"
# Settings every training case shares: seconds on a CPU, one process, nothing held out but one.
TRAIN = ["--steps", "1", "--batch-size", "2", "--history-len", "2", "--frameskip", "1",
         "--set", "eval.heldout_episodes=1", "--set", "data.num_workers=0",
         "--set", "runtime.cpu_threads=1"]  # fmt: skip


@dataclass
class Case:
    """What one case runs and what must come of it."""

    args: list[str]  # swm's arguments
    code: int  # the exit code
    says: str  # text the output holds: the refusal's line, or a word of the success
    writes: tuple[str, ...] = ()  # paths (relative to the root) the command may write under
    check: Callable[[Path], None] | None = None  # what must then be true (read back correctly)
    env: dict[str, str | None] = field(default_factory=dict)  # None: unset it


CASES: dict[str, Callable[[Path], Case]] = {}


def case(function: Callable[[Path], Case]) -> Callable[[Path], Case]:
    """Register ``function`` as the case named after it (``_`` as ``-``)."""
    CASES[function.__name__.replace("_", "-")] = function
    return function


def table(build: Callable[..., Case], rows: dict[str, tuple]) -> None:
    """One case per row: ``build(root, *row)``."""
    for name, row in rows.items():
        CASES[name] = lambda root, row=row: build(root, *row)


def make(name: str, root: Path) -> Case:
    """Write case ``name`` under ``root`` (its ``outside/`` secret included)."""
    for part in ("in", "out", "code", "outside"):
        (root / part).mkdir(parents=True, exist_ok=True)
    (root / "outside" / "secret.txt").write_text(SECRET * 64)
    return CASES[name](root)


def tree(root: Path) -> dict[str, str]:
    """Every file and link under ``root`` with what it holds (a link by its target)."""
    import os

    found = {}
    for directory, folders, files in os.walk(root):
        for name in files + [f for f in folders if os.path.islink(os.path.join(directory, f))]:
            path = Path(directory, name)
            relative = str(path.relative_to(root))
            if path.is_symlink():
                found[relative] = "-> " + os.readlink(path)
            elif not path.is_file():  # a FIFO or socket: reading it would block
                found[relative] = "special file"
            else:
                found[relative] = hashlib.blake2b(path.read_bytes(), digest_size=8).hexdigest()
    return found


def written_outside(before: dict, after: dict, allowed: tuple[str, ...]) -> list[str]:
    """Paths added, changed or removed under the root that are not under an ``allowed`` one."""
    changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    return sorted(p for p in changed if not any(Path(p).is_relative_to(a) for a in allowed))


# ------------------------------------------------------------------------------- builders


def swm_data(path: Path, pixels=(16, 16, 3), action=(2,), dtype=np.uint8, episodes=4, length=8):
    """A dataset in swm's own Lance format, written by swm's writer: random frames."""
    from swmcli import open_writer

    rng = np.random.default_rng(0)
    with open_writer(path, mode="overwrite") as writer:
        for _ in range(episodes):
            frames = rng.integers(0, 256, (length, *pixels))
            writer.write_episode({
                "pixels": (frames if dtype == np.uint8 else frames / 255).astype(dtype),
                "action": rng.standard_normal((length, *action)).astype(np.float32),
                "reward": np.zeros(length, np.float32),
                "terminated": np.zeros(length, bool),
                "truncated": np.zeros(length, bool),
            })  # fmt: skip
    return path


def upstream_hdf5(path: Path, columns: dict, lengths=(3, 3), build=None) -> Path:
    """A file in stable-worldmodel's HDF5 layout; ``build(file)`` adds what a case needs."""
    import h5py

    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    with h5py.File(path, "w") as file:
        for name, value in columns.items():
            file.create_dataset(name, data=value)
        file["ep_len"] = np.asarray(lengths, np.int32)
        file["ep_offset"] = offsets[: len(lengths)]
        if build is not None:
            build(file)
    return path


def upstream_lance(path: Path, episodes, steps, metadata=None, **columns) -> Path:
    """A table in stable-worldmodel's Lance layout: ``columns`` of floats (lists) or bytes."""
    import lance
    import pyarrow as pa

    arrays = {
        "episode_idx": pa.array(episodes, pa.int32()),
        "step_idx": pa.array(steps, pa.int32()),
    }
    for name, values in columns.items():
        if not len(values) or isinstance(values[0], bytes):
            arrays[name] = pa.array(values, pa.binary())
        else:
            flat = np.asarray(values, np.float32)
            width = flat[0].size
            arrays[name] = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), width)
    table = pa.table(arrays)
    if metadata:
        table = table.replace_schema_metadata(metadata)
    lance.write_dataset(table, str(path))
    return path


def image_bytes(side=8, kind="JPEG", value=0) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.full((side, side, 3), value, np.uint8)).save(buffer, kind)
    return buffer.getvalue()


def lerobot(root: Path, info=None, episodes=None) -> Path:
    """A copy of the LeRobot v3 fixture, ``info(dict)`` and ``episodes(dict of lists)`` edited."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = root / "in" / "dots"
    shutil.copytree(LEROBOT, path)
    if info is not None:
        meta = json.loads((path / "meta/info.json").read_text())
        info(meta)
        (path / "meta/info.json").write_text(json.dumps(meta))
    if episodes is not None:
        file = path / "meta/episodes/chunk-000/file-000.parquet"
        table = pq.read_table(file).to_pydict()
        episodes(table)
        pq.write_table(pa.Table.from_pydict(table), file)
    return path


def minari(path: Path, actions, observations=None, build=None) -> Path:
    """A Minari dataset of episodes with these ``actions`` (T each) and T+1 observations."""
    import h5py

    (path / "data").mkdir(parents=True)
    (path / "data" / "metadata.json").write_text('{"dataset_id": "hostile/case-v0"}')
    rng = np.random.default_rng(0)
    with h5py.File(path / "data" / "main_data.hdf5", "w") as file:
        for index, action in enumerate(actions):
            steps = len(action)
            group = file.create_group(f"episode_{index}")
            frames = rng.integers(0, 256, (steps + 1, 16, 16, 3), dtype=np.uint8)
            group["observations"] = frames if observations is None else observations(steps)
            group["actions"] = action
            group["rewards"] = np.zeros(steps)
            group["terminations"] = np.zeros(steps, bool)
            group["truncations"] = np.zeros(steps, bool)
        if build is not None:
            build(file)
    return path


def code_file(root: Path, name: str, text: str) -> str:
    """The user's module ``name`` (unique to its case), in ``code/``."""
    (root / "code" / f"{name}.py").write_text(text)
    return name


MODEL = '''
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, action_dim, frameskip):
        super().__init__()
        self.encoder = nn.Linear(3, 8)
        self.dynamics = nn.Linear(8 + action_dim * frameskip, 8)

    def encode(self, pixels):
        return self.encoder(pixels.float().mean(dim=(-3, -2)) / 255)

    def predict(self, latents, actions):
        actions = torch.nan_to_num(actions).to(latents.dtype)
        return self.dynamics(torch.cat([latents, actions], -1))


def build(action_dim, frameskip):
    return Model(action_dim, frameskip)
'''


def model_case(root: Path, body: str, code: int, says: str, extra=()) -> Case:
    """``swm train --model`` with the model file ``MODEL`` + ``body`` (which may override)."""
    name = "h31_model_" + hashlib.sha1(body.encode()).hexdigest()[:8]
    (root / "code" / f"{name}.py").write_text(MODEL + body)
    data = swm_data(root / "in" / "data.lance")
    return Case(
        ["train", "--data", str(data), "--model", f"code/{name}.py:build",
         "--out", str(root / "out" / "run"), *TRAIN, *extra],
        code, says, writes=("out/run",),
    )  # fmt: skip


def train_on(root: Path, data: Path, code: int, says: str) -> Case:
    args = ["train", "--preset", "tiny", "--data", str(data), "--out", str(root / "out/run")]
    return Case([*args, *TRAIN], code, says, writes=("out/run",))


def convert(root: Path, source: Path, code: int, says: str, *flags: str, to="out/copy.lance"):
    return Case(["convert", str(source), str(root / to), *flags], code, says, writes=(to,))


# ------------------------------------------------------------------- nothing written outside


@case
def lerobot_key_escapes(root):
    def info(meta):
        meta["swm_keys"] = {"observation.image": "../../../../ESCAPED_IMG"}

    source = lerobot(root, info)
    return convert(root, source, 1, "would become the key", "--to", "folder", to="out/a/b/c/d/x")


@case
def lerobot_key_absolute(root):
    def info(meta):
        meta["swm_keys"] = {"observation.image": str(root / "outside" / "ESCAPED")}

    return convert(root, lerobot(root, info), 1, "would become the key", "--to", "folder")


@case
def upstream_lance_absolute_column(root):
    frames = [image_bytes(value=v) for v in (0, 80, 160)]
    source = upstream_lance(root / "in" / "up.lance", [0, 0, 0], [0, 1, 2],
                            **{str(root / "outside" / "ESCAPED"): frames})  # fmt: skip
    return convert(root, source, 1, "would become the key", "--to", "folder", to="out/x")


@case
def map_key_escapes(root):
    return convert(root, lerobot(root), 2, "--map observation.image=", "--to", "folder",
                   "--map", "observation.image=../../../../X", to="out/a/b/c/d/x")  # fmt: skip


@case
def map_lerobot_export_escapes(root):
    return convert(root, lerobot(root), 2, "the key", "--layout", "lerobot",
                   "--map", "observation.state=/../../../../../../X", to="out/lr")  # fmt: skip


def merge(root: Path, to: str, code: int, says: str, *flags: str) -> Case:
    """``swm merge`` of two swm datasets in ``in/`` into ``to``; only a merge that works may
    write there."""
    sources = [swm_data(root / "in" / name) for name in ("a.lance", "b.lance")]
    args = ["merge", *map(str, sources), str(root / to), *flags]
    return Case(args, code, says, writes=(to,) if code == 0 else ())


table(merge, {
    "merge-into-its-source": ("in/a.lance/merged.lance", 2, "is inside the source"),
    "merge-over-its-source": ("in/b.lance", 2, "the same path", "--overwrite"),
    "merge-around-its-sources": ("in", 2, "a folder holding the source", "--overwrite"),
    "merge-map-escapes": ("out/m", 2, "the key", "--to", "folder", "--map", "pixels=../../X"),
    "merge-beside-its-sources": ("out/m", 0, "verified", "--to", "folder", "--heldout", "1"),
})  # fmt: skip


@case
def merge_through_a_link_into_its_source(root):
    (root / "out" / "link").symlink_to(root / "in" / "a.lance")
    return merge(root, "out/link/merged.h5", 2, "is inside the source")


# ------------------------------------------------------------------- nothing read outside


def _outside_h5(root: Path) -> Path:
    import h5py

    path = root / "outside" / "secret.h5"
    with h5py.File(path, "w") as file:
        file["pixels"] = np.full((6, 8, 8, 3), 7, np.uint8)
    return path


def _columns():
    return {"pixels": np.zeros((6, 8, 8, 3), np.uint8), "action": np.ones((6, 2), np.float32)}


@case
def hdf5_external_link(root):
    import h5py

    outside = _outside_h5(root)
    columns = {"action": np.ones((6, 2), np.float32)}

    def build(file):
        file["pixels"] = h5py.ExternalLink(str(outside), "/pixels")

    source = upstream_hdf5(root / "in" / "x.h5", columns, build=build)
    return convert(root, source, 1, "is an external link")


@case
def hdf5_external_storage(root):
    secret = root / "outside" / "secret.txt"

    def build(file):
        file.create_dataset("state", shape=(6, 4), dtype=np.uint8, external=[(str(secret), 0, 24)])

    source = upstream_hdf5(root / "in" / "x.h5", _columns(), build=build)
    return convert(root, source, 1, "is stored outside the file")


@case
def hdf5_virtual_dataset(root):
    import h5py

    outside = _outside_h5(root)

    def build(file):
        layout = h5py.VirtualLayout(shape=(6, 8, 8, 3), dtype=np.uint8)
        layout[:] = h5py.VirtualSource(str(outside), "pixels", shape=(6, 8, 8, 3))
        file.create_virtual_dataset("pixels", layout)

    source = upstream_hdf5(root / "in" / "x.h5", {"action": np.ones((6, 2))}, build=build)
    return convert(root, source, 1, "is a virtual dataset")


@case
def minari_external_link(root):
    import h5py

    outside = _outside_h5(root)

    def build(file):
        del file["episode_0/observations"]
        file["episode_0/observations"] = h5py.ExternalLink(str(outside), "/pixels")

    source = minari(root / "in" / "minari", [np.zeros((5, 2), np.float32)], build=build)
    return convert(root, source, 1, "is an external link")


@case
def swm_hdf5_external_storage(root):
    import h5py

    from swmcli.data.copy import copy_dataset

    path = root / "in" / "own.h5"
    copy_dataset(swm_data(root / "in" / "own.lance"), path)
    with h5py.File(path, "a") as file:
        rows = file["reward"].shape[0]
        del file["reward"]
        external = [(str(root / "outside" / "secret.txt"), 0, 4 * rows)]
        file.create_dataset("reward", shape=(rows,), dtype=np.float32, external=external)
    return convert(root, path, 1, "is stored outside the file")


def _folder(root: Path) -> Path:
    path = root / "in" / "folder"
    shutil.copytree(UPSTREAM_FOLDER, path)
    return path


def linked_out(root: Path, dataset: Callable, relative: str, copied: bool, says: str) -> Case:
    """``swm info`` (``swm convert`` when ``copied``) on ``dataset(root)`` whose file
    ``relative`` was moved to ``outside/`` and replaced by a link to it."""
    path = dataset(root)
    file, moved = path / relative, root / "outside" / Path(relative).name
    file.rename(moved)
    file.symlink_to(moved)
    return convert(root, path, 1, says) if copied else Case(["info", str(path)], 1, says)


table(linked_out, {
    "folder-ep-len-link": (_folder, "ep_len.npz", False, "ep_len.npz is a link to"),
    "lerobot-info-link": (lerobot, "meta/info.json", False, "meta/info.json is a link to"),
    "folder-frame-link": (_folder, "pixels/ep_0_step_0.jpeg", True,
                          "pixels/ep_0_step_0.jpeg is a link to"),
})  # fmt: skip


@case
def link_inside_reads(root):
    path = lerobot(root)
    data = path / "data/chunk-000/file-000.parquet"
    (path / "store").mkdir()
    data.rename(path / "store" / "frames.parquet")
    data.symlink_to(path / "store" / "frames.parquet")  # resolves inside the dataset: read

    def check(root):
        from swmcli.data.formats import open_reader

        reader = open_reader(root / "out" / "copy.lance")
        assert reader.num_episodes == 3 and reader.num_steps == 24
        reader.close()

    found = convert(root, path, 0, "verified")
    found.check = check
    return found


@case
def link_loop(root):
    path = lerobot(root)
    (path / "loop").symlink_to(path / "loop")
    return Case(["info", str(path)], 1, "is a link that loops")


# ------------------------------------------------------------------- bounded work


@case
def video_frames_huge(root):
    import av

    path = root / "in" / "video"
    shutil.copytree(FIXTURES / "stable_worldmodel" / "main" / "tworoom-video", path)
    video = path / "pixels" / "ep_0.mp4"
    container = av.open(str(video), "w")
    stream = container.add_stream("libx264", rate=10, options={"preset": "ultrafast", "crf": "51"})
    stream.width = stream.height = 4096
    stream.pix_fmt = "yuv420p"
    black = np.zeros((4096 * 3 // 2, 4096), np.uint8)
    for _ in range(7):
        container.mux(stream.encode(av.VideoFrame.from_ndarray(black, format="yuv420p")))
    container.mux(stream.encode())
    container.close()
    return convert(root, path, 1, "more than any real video decodes to")


def lerobot_info(root: Path, keys: tuple, value, code: int, says: str) -> Case:
    """``swm info`` on the LeRobot fixture whose ``info.json`` holds ``value`` at ``keys``."""

    def info(meta):
        node = meta
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value

    return Case(["info", str(lerobot(root, info))], code, says)


table(lerobot_info, {
    "lerobot-template-width": (("data_path",),
                               "data/chunk-{chunk_index:0>400000000}/file-{file_index:03d}.parquet",
                               1, "formats chunk_index as '0>400000000'"),
    "lerobot-shape-negative": (("features", "action", "shape"), [-2], 1,
                               "gives action the shape [-2]"),
    "lerobot-shape-huge": (("features", "action", "shape"), [10**6, 10**6], 1,
                           "its data holds 2 values a row"),
    "lerobot-v21": (("codebase_version",), "v2.1", 2, "is a LeRobot v2.1 dataset"),
})  # fmt: skip


@case
def lerobot_length_huge(root):
    def info(meta):
        meta.pop("total_frames")

    def episodes(table):
        table["length"][2] = 10**12
        table["dataset_to_index"][2] = table["dataset_from_index"][2] + 10**12

    source = lerobot(root, info, episodes)
    return Case(["info", str(source)], 1, "its episodes claim 1000000000016 rows, it holds 24")


# ------------------------------------------------------------------- order and meaning


def _read(path: Path) -> list[dict]:
    from swmcli.data.formats import open_reader

    reader = open_reader(path)
    try:
        return [reader.read_episode(i) for i in range(reader.num_episodes)]
    finally:
        reader.close()


def stored_out_of_order(root: Path, layout: str, code: int, says: str) -> Case:
    """stable-worldmodel's ``layout`` with one episode's rows stored as steps 2, 0, 1, 5, 3, 4
    (each row's ``state`` says its step): read in step order, or refused where it cannot be."""
    steps = [2, 0, 1, 5, 3, 4]
    state = np.array([[10.0 * s] for s in steps], np.float32)
    action = np.array([[float(s), 0.0] for s in steps], np.float32)
    if layout == "lance":
        source = upstream_lance(root / "in" / "order.lance", [0] * 6, steps, state=state,
                                action=action)  # fmt: skip
    elif layout == "hdf5":
        columns = {"state": state, "action": action, "step_idx": np.array(steps)}
        source = upstream_hdf5(root / "in" / "order.h5", columns, lengths=(6,))
    else:
        source = root / "in" / "order"
        source.mkdir()
        arrays = {"ep_len": [6], "ep_offset": [0], "step_idx": steps, "state": state}
        for name, values in arrays.items():
            np.savez(source / f"{name}.npz", np.asarray(values))

    def check(root):
        (episode,) = _read(source)
        np.testing.assert_array_equal(episode["state"].reshape(-1), np.arange(0, 60, 10))
        np.testing.assert_array_equal(episode["action"][:-1, 0], np.arange(5))
        assert np.isnan(episode["action"][-1]).all()  # the NaN on step 5's row, not storage's

    return Case(["info", str(source)], code, says, check=check if code == 0 else None)


table(stored_out_of_order, {
    "lance-step-order": ("lance", 0, "stable-worldmodel-lance"),
    "hdf5-step-order": ("hdf5", 0, "stable-worldmodel-hdf5"),
    "folder-step-order": ("folder", 1, "frames are named by position"),
})  # fmt: skip


@case
def lance_step_repeated(root):
    source = upstream_lance(root / "in" / "repeat.lance", [0] * 6, [0, 0, 1, 2, 3, 4],
                            state=[[0.0]] * 6)  # fmt: skip
    return Case(["info", str(source)], 1, "is not a permutation of consecutive steps")


@case
def lerobot_ranges_overlap(root):
    def episodes(table):
        table["dataset_from_index"][1], table["dataset_to_index"][1] = 4, 12

    source = lerobot(root, episodes=episodes)
    return Case(["info", str(source)], 1, "the rows of episodes 0 and 1 overlap (0..7 and 4..11)")


@case
def float_pixels(root):
    rng = np.random.default_rng(0)
    pixels = rng.random((6, 8, 8, 3)).astype(np.float32)
    source = upstream_hdf5(root / "in" / "float.h5", {**_columns(), "pixels": pixels})

    def check(root):
        frames = np.concatenate([e["pixels"] for e in _read(source)])
        assert frames.dtype == np.uint8
        np.testing.assert_array_equal(frames, np.rint(pixels * 255).astype(np.uint8))

    return Case(["info", str(source)], 0, "float values in [0, 1] read as uint8", check=check)


@case
def float_pixels_beyond_one(root):
    pixels = np.full((6, 8, 8, 3), 200.0, np.float32)
    source = upstream_hdf5(root / "in" / "float.h5", {**_columns(), "pixels": pixels})
    return convert(root, source, 1, "values outside [0, 1]")


@case
def folder_integer_actions(root):
    path = root / "in" / "ints"
    path.mkdir()
    for name, value in (("ep_len", [3, 3]), ("ep_offset", [0, 3]), ("step_idx", [0, 1, 2] * 2)):
        np.savez(path / f"{name}.npz", np.array(value, np.int64))
    np.savez(path / "action.npz", np.arange(12, dtype=np.int64).reshape(6, 2))

    def check(root):
        for episode in _read(path):
            action = episode["action"]
            assert action.dtype == np.float32 and np.isnan(action[-1]).all()
            assert not np.isnan(action[:-1]).any()

    return Case(["info", str(path)], 0, "float32", check=check)


@case
def minari_discrete_actions(root):
    rng = np.random.default_rng(0)
    actions = [rng.integers(0, 4, 9) for _ in range(4)]  # Discrete(4): one integer a step
    source = minari(root / "in" / "minari", actions)
    return train_on(root, source, 0, "swm train")


# ------------------------------------------------------------------- what is recorded


def command(root: Path, args: str, code: int, says: str, settings: str | None = None) -> Case:
    """``swm ARGS``: ``{out}`` is a path under ``out/``, ``{settings}`` a TOML file holding
    ``settings``."""
    file = root / "in" / "settings.toml"
    if settings is not None:
        file.write_text(settings)
    words = [word.format(out=root / "out" / "x", settings=file) for word in args.split()]
    return Case(words, code, says)


table(command, {
    "config-section-scalar": ("train --preset tiny --config {settings} --steps 3 --out {out}", 2,
                              "train is a section of settings, not 5", "train = 5\n"),
    "config-collect-scalar": ("collect --config {settings} --steps 3 --out {out}", 2,
                              "collect is a section of settings, not 5", "collect = 5\n"),
    "env-kwargs-tworoom": ("collect --set env.kwargs.door_width=3 --steps 3 --out {out}", 2,
                           "swm/TwoRoom-v0 does not take env.kwargs {'door_width': 3}"),
    "steps-beyond-int64": (f"train --preset tiny --steps {10**30} --out {{out}}", 2,
                           "is beyond the largest integer swm takes"),
    "episodes-and-steps": ("collect --episodes 2 --steps 10 --out {out}", 2,
                           "episodes (2) and steps (10) both say how much to collect"),
    "preset-path": ("collect --preset ../pyproject --steps 3 --out {out}", 2,
                    "preset '../pyproject' holds a path separator"),
    "env-empty-module": ("collect --env :Foo --steps 3 --out {out}", 2,
                         "--env ':Foo' is not a gymnasium id nor module:Id"),
})  # fmt: skip


@case
def collect_executed_action(root):
    module = code_file(root, "h31_far_policy", """
import numpy as np


def far(env, seed):
    return lambda observation: np.array([50.0, -50.0], np.float32)
""")
    out = root / "out" / "far.lance"

    def check(root):
        for episode in _read(out):  # what TwoRoom executed: the action clipped to [-1, 1]
            executed = np.broadcast_to([1.0, -1.0], episode["action"][:-1].shape)
            np.testing.assert_array_equal(episode["action"][:-1], executed)

    args = ["collect", "--preset", "tiny", "--policy", f"{module}:far", "--steps", "6",
            "--out", str(out)]  # fmt: skip
    return Case(args, 0, "collect", writes=("out/far.lance", "out/far.lance.config.json"),
                check=check)  # fmt: skip


# ------------------------------------------------------------------- the user's errors


def _subclass(name: str, method: str, body: str) -> str:
    """A model file: ``MODEL`` and a subclass overriding ``method`` with ``body``."""
    return f"""

class {name}(Model):
    def {method}:
        {body}


def build(action_dim, frameskip):
    return {name}(action_dim, frameskip)
"""


table(model_case, {
    "predict-sys-exit": (_subclass("Leaves", "predict(self, latents, actions)",
                                   "raise SystemExit(0)"),
                         1, "your code called sys.exit(0), in predict"),
    "factory-raises": ("\n\ndef build(action_dim, frameskip):\n    raise ValueError('no model')\n",
                       1, "your code raised ValueError: no model, in build"),
    "factory-syntax-error": ("\n\ndef build(:\n    pass\n", 1, "your code has a syntax error"),
    "factory-unknown-keyword": ("", 2, "build() cannot be called with",
                                ("--set", "model.kwargs.width=64")),
    "predict-wrong-shape": (_subclass("Short", "predict(self, latents, actions)",
                                      "return super().predict(latents, actions)[..., :5]"),
                            2, "returned a tensor of shape (2, 1, 5)"),
    "encode-wrong-shape": (_subclass("Flat", "encode(self, pixels)",
                                     "return super().encode(pixels).reshape(-1)"),
                           2, "not latents of shape (2, 2, 'D')"),
    "encode-fails-in-torch": (_subclass("Mismatch", "encode(self, pixels)",
                                        "return self.encoder(pixels.float().mean(-1))"),
                              1, "your code raised RuntimeError"),
    "predict-nan": (_subclass("Nan", "predict(self, latents, actions)",
                              "return super().predict(latents, actions) * float('nan')"),
                    2, "predict returned NaN or infinite values"),
    "model-without-parameters": (_subclass("Empty", "parameters(self, recurse=True)",
                                           "return iter(())"),
                                 2, "has no parameters: there is nothing to train"),
    "model-frozen": ("\n\ndef build(action_dim, frameskip):\n"
                     "    return Model(action_dim, frameskip).requires_grad_(False)\n",
                     2, "has only frozen parameters"),
    "loss-not-scalar": (_subclass("Vector", "loss(self, batch)",
                                  "return {'loss': self.encode(batch['pixels']).sum(-1)}"),
                        2, "loss(batch)['loss'] is a tensor of shape"),
})  # fmt: skip


def policy(root: Path, returns: str, exit_code: int, says: str) -> Case:
    """``swm collect --policy`` with a policy whose action is ``returns`` (a statement)."""
    module = code_file(root, "h31_policy_" + hashlib.sha1(returns.encode()).hexdigest()[:8], f"""
import numpy as np


def policy(env, seed):
    def act(observation):
        {returns}

    return act
""")
    args = ["collect", "--preset", "tiny", "--policy", f"{module}:policy", "--steps", "4",
            "--out", str(root / "out" / "p.lance")]  # fmt: skip
    return Case(args, exit_code, says, writes=("out/p.lance",))


table(policy, {
    "policy-raises": ("raise KeyError('no action')", 1,
                      "your code raised KeyError: 'no action', in act"),
    "policy-nan": ("return np.array([np.nan, 0.0])", 2, "returned array([nan,  0.])"),
    "policy-text": ("return 'left'", 2, "returned 'left'"),
    "policy-wrong-shape": ("return np.zeros(5)", 2,
                           "which the env's action space Box(-1.0, 1.0, (2,), float32) cannot "
                           "take"),
})  # fmt: skip


ENV = """
import gymnasium as gym
import numpy as np


class Env(gym.Env):
    metadata = {{"render_modes": ["rgb_array"]}}

    def __init__(self, render_mode=None):
        box = gym.spaces.Box(-1, 1, (2,), np.float32)
        self.observation_space = gym.spaces.Dict({{{key!r}: box}})
        self.action_space = box

    def reset(self, *, seed=None, options=None):
        {reset}
        return {{{key!r}: np.zeros(2, np.float32)}}, {{}}

    def step(self, action):
        return {{{key!r}: np.zeros(2, np.float32)}}, 0.0, False, False, {{}}

    def render(self):
        return np.zeros((16, 16, 3), np.uint8)


gym.register({env_id!r}, entry_point=__name__ + ":Env")
"""


def user_env(root: Path, key: str, reset: str, code: int, says: str) -> Case:
    """``swm collect --format folder`` from the user's env (``ENV``): observations under
    ``key``, ``reset`` running first in its reset."""
    digest = hashlib.sha1(f"{key}{reset}".encode()).hexdigest()[:8]
    env_id = f"H31Env{digest}-v0"
    module = code_file(root, f"h31_env_{digest}", ENV.format(key=key, reset=reset, env_id=env_id))
    out = "out/a/b/env"
    args = ["collect", "--env", f"{module}:{env_id}", "--policy", "random", "--steps", "4",
            "--format", "folder", "--out", str(root / out)]  # fmt: skip
    return Case(args, code, says, writes=(out,))


table(user_env, {
    "env-key-escapes": ("../../escaped", "super().reset(seed=seed)", 2,
                        "episode key '../../escaped' holds a path separator"),
    "env-reset-raises": ("state", "raise RuntimeError('the robot is not connected')", 1,
                         "your code raised RuntimeError: the robot is not connected, in reset"),
})  # fmt: skip


@case
def logger_wandb_without_key(root):
    data = swm_data(root / "in" / "data.lance")
    args = ["train", "--preset", "tiny", "--data", str(data), "--logger", "wandb",
            "--out", str(root / "out" / "run"), *TRAIN]  # fmt: skip
    env = {"HOME": str(root / "out" / "home"), "WANDB_API_KEY": None, "WANDB_MODE": None,
           "WANDB_DIR": None, "WANDB_CONFIG_DIR": None}  # fmt: skip
    return Case(args, 1, "--logger wandb could not start", writes=("out/run", "out/home"), env=env)


def exported(root: Path, metadata: str, says: str) -> Case:
    """stable-worldmodel's Lance table with ``metadata`` as its swm export schema."""
    source = upstream_lance(root / "in" / "x.lance", [0, 0, 0], [0, 1, 2],
                            metadata={"swm_export": metadata}, action=[[0.0, 1.0]] * 3)
    return convert(root, source, 1, says)


table(exported, {
    "export-metadata-hostile": (json.dumps({"keys": {"action": ["<f4", [10**6, 10**6]]}}),
                                "its swm_export metadata gives action the shape"),
    "export-metadata-garbage": ("{not json", "its swm_export metadata is damaged"),
})  # fmt: skip


def unusable(root: Path, pixels: tuple, action: tuple, says: str) -> Case:
    """``swm train`` on swm's own dataset of frames ``pixels`` and actions ``action``."""
    return train_on(root, swm_data(root / "in" / "x.lance", pixels, action), 2, says)


table(unusable, {
    "pixels-grayscale": ((16, 16, 1), (2,), "cannot use pixels uint8 (16, 16, 1)"),
    "pixels-rgba": ((16, 16, 4), (2,), "drop the alpha channel"),
    "pixels-not-square": ((16, 24, 3), (2,), "crop or resize the 16x24 frames to a square"),
    "actions-three-dimensional": ((16, 16, 3), (2, 3, 4), "cannot use action float32 (2, 3, 4)"),
})  # fmt: skip


# ------------------------------------------------------------------- messages rewritten


@case
def lengths_with_an_empty_episode(root):
    source = upstream_hdf5(root / "in" / "x.h5", _columns(), lengths=(6, 0))
    return Case(["info", str(source)], 1, "episode 1 has 0 rows")


def _empty_folder(path: Path) -> Path:
    path.mkdir()
    for name in ("ep_len", "ep_offset", "action"):
        np.savez(path / f"{name}.npz", np.zeros(0, np.int64))
    return path


def _empty_lerobot_episodes(table: dict) -> None:
    for values in table.values():
        del values[:]


def empty(root: Path, write: Callable[[Path], Path]) -> Case:
    """``swm info`` on a dataset of no episodes: said as such, not as damage."""
    return Case(["info", str(write(root / "in" / "empty"))], 2, "holds no episodes")


table(empty, {
    "empty-upstream-hdf5": (lambda path: upstream_hdf5(path.with_suffix(".h5"), {
        "pixels": np.zeros((0, 8, 8, 3), np.uint8), "action": np.zeros((0, 2))}, lengths=()),),
    "empty-upstream-lance": (lambda path: upstream_lance(path.with_suffix(".lance"), [], [],
                                                         pixels=[]),),
    "empty-upstream-folder": (_empty_folder,),
    "empty-minari": (lambda path: minari(path, []),),
    "empty-lerobot": (lambda path: lerobot(path.parents[1], episodes=_empty_lerobot_episodes),),
})  # fmt: skip


@case
def gzip_sizes_as_stored(root):
    import h5py

    def build(file):
        state = file.create_dataset("state", (6, 2**24), np.float32, compression="gzip")
        state[0, :1024] = 1.0  # one chunk stored, 384 MiB claimed

    source = upstream_hdf5(root / "in" / "x.h5", _columns(), build=build)
    with h5py.File(source) as file:
        stored = file["state"].id.get_storage_size()  # as stored, not times the 1000x allowed
    says = f"state claims 402653184 bytes but only {stored} are stored (compressed"
    return Case(["info", str(source)], 1, says)


@case
def png_frames(root):
    frames = [image_bytes(kind="PNG", value=v) for v in (0, 80, 160)]
    source = upstream_lance(root / "in" / "png.lance", [0, 0, 0], [0, 1, 2], pixels=frames)
    return Case(["info", str(source)], 0, "PNG (lossless)")


@case
def cartpole_says_no_error(root):
    args = ["collect", "--env", "CartPole-v1", "--policy", "random", "--steps", "5",
            "--out", str(root / "out" / "cp.lance")]  # fmt: skip
    return Case(args, 0, "CartPole-v1", writes=("out/cp.lance", "out/cp.lance.config.json"))


# ------------------------------------------------- issue 56 (hostile-a): locks, side files, FIFOs,
# threads, settings that do nothing


def linked_lock(root: Path, args: str, lock: str, code: int, says: str) -> Case:
    """``swm ARGS`` (``{root}`` the case's root) whose writer lock ``out/LOCK`` is a link to a
    file outside: the link is refused, never written through."""
    swm_data(root / "in" / "data.lance")
    victim = root / "outside" / "victim.txt"
    victim.write_text("the victim's own text\n")
    (root / "out" / lock).symlink_to(victim)
    return Case(args.format(root=root).split() + (TRAIN if args.startswith("train") else []),
                code, says)  # fmt: skip


table(linked_lock, {
    "lock-link-collect": ("collect --preset tiny --steps 3 --out {root}/out/t.lance",
                          ".t.lance.swm-writer", 1, "is a link"),
    "lock-link-train": ("train --preset tiny --data {root}/in/data.lance --out {root}/out/run",
                        ".run.swm-writer", 1, "is a link"),
    "lock-link-convert": ("convert {root}/in/data.lance {root}/out/x.h5", ".x.h5.swm-writer", 1,
                          "is a link"),
})  # fmt: skip


@case
def convert_around_its_source(root):
    holder = root / "in" / "ds"
    source = swm_data(holder / "inner.lance")
    (holder / "swm_folder.json").write_text("{}")  # the holder reads as a folder dataset
    return Case(["convert", str(source), str(holder), "--to", "folder", "--overwrite"], 2,
                "is a folder holding the source")  # fmt: skip


@case
def convert_over_a_side_table(root):
    """A stable-worldmodel table's frames live in a side table beside it: a destination there
    would delete them."""
    holder = root / "in" / "db"
    shutil.copytree(UPSTREAM_FOLDER.parent / "tworoom-lance-video", holder)
    return Case(["convert", str(holder / "tworoom.lance"), str(holder / "tworoom_videos.lance"),
                 "--to", "lance", "--overwrite"], 2, "a side table the source")  # fmt: skip


@case
def minari_inner_path_side_link(root):
    source = minari(root / "in" / "mn", [np.zeros((5, 2), np.float32)])
    side = source / "data" / "metadata.json"
    side.rename(root / "outside" / "metadata.json")
    side.symlink_to(root / "outside" / "metadata.json")
    return Case(["info", str(source / "data" / "main_data.hdf5")], 1, "is a link to")


@case
def upstream_lance_side_link(root):
    table = upstream_lance(root / "in" / "db" / "main.lance", [0, 0, 0], [0, 1, 2],
                           action=[[0.0, 1.0]] * 3)  # fmt: skip
    videos = upstream_lance(root / "outside" / "videos.lance", [0, 0, 0], [0, 1, 2],
                            pixels=[image_bytes(value=v) for v in (0, 80, 160)])  # fmt: skip
    (root / "in" / "db" / "main_videos.lance").symlink_to(videos)
    return Case(["info", str(table)], 1, "is a link to")


def fifo(root: Path, dataset: Callable[[Path], Path], relative: str, says: str) -> Case:
    """``swm convert`` of ``dataset(root)`` whose file ``relative`` is a FIFO (a read of it would
    wait forever)."""
    import os

    path = dataset(root)
    (path / relative).unlink()
    os.mkfifo(path / relative)
    return convert(root, path, 2, says)


def _swm_folder(root: Path) -> Path:
    from swmcli.data.copy import copy_dataset

    path = root / "in" / "swm-folder"
    copy_dataset(swm_data(root / "in" / "data.lance"), path, to="folder")
    return path


table(fifo, {
    "fifo-folder-arrays": (_swm_folder, "episode_000000/arrays.npz", "is a FIFO"),
    "fifo-upstream-state": (_folder, "state.npz", "is a FIFO"),
    "fifo-lerobot-parquet": (lerobot, "data/chunk-000/file-000.parquet", "is a FIFO"),
    "fifo-lerobot-video": (lerobot, "videos/observation.image/chunk-000/file-000.mp4",
                           "is a FIFO"),
})  # fmt: skip


@case
def fifo_config(root):
    import os

    os.mkfifo(root / "in" / "fifo.toml")
    return Case(["train", "--preset", "tiny", "--config", str(root / "in" / "fifo.toml"),
                 "--out", str(root / "out" / "x")], 2, "is a FIFO")  # fmt: skip


@case
def thread_left_running(root):
    """A factory's non-daemon thread (here one that waits for the check: at most 600 s in a
    ``swm`` process, past the sweep's timeout, 30 s under pytest): the run is saved and swm's
    process exits (``swm``'s entry point leaves after a grace period, saying so; in this test's
    process the check lets the thread go)."""
    release = root / "out" / "run" / "release"  # where the run may write
    body = f"""

import os
import sys
import threading
import time


def _wait():
    deadline = time.monotonic() + (30 if "pytest" in sys.modules else 600)
    while time.monotonic() < deadline and not os.path.exists({str(release)!r}):
        time.sleep(0.05)


def build(action_dim, frameskip):
    threading.Thread(target=_wait, name="user-poller").start()
    return Model(action_dim, frameskip)
"""
    found = model_case(root, body, 0, "swm train")

    def check(root):
        release.write_text("go")
        assert (root / "out" / "run" / "checkpoint.pt").is_file()

    found.check = check
    return found


@case
def memprofile_nproc_huge(root):
    return Case(["memprofile", "--preset", "tiny", "--nproc", "1000000"], 2, "runtime.nproc")


@case
def eval_data_rewritten(root):
    """``swm eval`` of a run whose dataset was rewritten since it trained: its held-out episodes
    would be episodes it trained on, so it is refused."""
    from typer.testing import CliRunner

    from swmcli.cli.app import app

    trained = model_case(root, "", 0, "")
    factory = trained.args.index("--model") + 1
    trained.args[factory] = str(root / trained.args[factory])
    result = CliRunner().invoke(app, trained.args)
    assert result.exit_code == 0, result.output
    swm_data(root / "in" / "data.lance", episodes=5)
    return Case(["eval", str(root / "out" / "run")], 2, "changed since")


table(command, {
    "cpu-threads-huge": ("train --preset tiny --set runtime.cpu_threads=100000 --out {out}", 2,
                         "runtime.cpu_threads"),
    "cpu-threads-huge-toml": ("train --preset tiny --config {settings} --out {out}", 2,
                              "runtime.cpu_threads", "[runtime]\ncpu_threads = 100000\n"),
    "steps-true-toml": ("train --preset tiny --config {settings} --out {out}", 2,
                        "train.steps", "[train]\nsteps = true\n"),
    "log-every-true": ("train --preset tiny --set train.log_every=true --out {out}", 2,
                       "train.log_every"),
    "kwargs-own-model": ("train --preset tiny --set model.kwargs.width=64 --out {out}", 2,
                         "kwargs {'width': 64} are for --model's factory"),
    "memprofile-freeze-unknown": ("memprofile --preset tiny --freeze nosuch", 2, "nosuch"),
    "memprofile-picture-directory": ("memprofile --preset tiny --picture in", 2,
                                     "is a directory"),
})  # fmt: skip


@case
def map_repeated(root):
    data = swm_data(root / "in" / "data.lance")
    return Case(["info", str(data), "--map", "pixels=a", "--map", "pixels=b"], 2, "--map pixels")


table(policy, {
    "policy-os-exit": ("import os; os._exit(0)", 1, "your code called os._exit(0), in act"),
})  # fmt: skip


table(model_case, {
    "predict-unprintable-error": (
        "\n\nclass Unprintable(Exception):\n    def __str__(self):\n"
        "        raise RuntimeError('no words')\n"
        + _subclass("Mute", "predict(self, latents, actions)", "raise Unprintable()"),
        1, "your code raised Unprintable"),
})  # fmt: skip




# --------------------------------------------- issue 56, hostile-b: overflow, wrong imports, errors


def _lerobot_lengths_wrap(table: dict) -> None:
    """Four episodes whose lengths (two near 2**63) add up, wrapped in int64, to the 24 rows."""
    for values in table.values():
        values.append(values[-1])
    big = 2**63 - 1
    table["episode_index"][3] = 3
    table["length"][:] = [8, big, big, 18]
    table["dataset_from_index"][:] = [0, 8, 16, 24]
    table["dataset_to_index"][:] = [8, 8 + big - 2**64, 16 + big - 2**64, 42]


def _lerobot_stamps_doubled(path: Path) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    file = path / "data/chunk-000/file-000.parquet"
    frames = pq.read_table(file)
    stamps = pc.multiply(frames.column("timestamp"), pa.scalar(2.0, pa.float32()))
    where = frames.schema.get_field_index("timestamp")
    pq.write_table(frames.set_column(where, "timestamp", stamps), file)


def lerobot_edited(root: Path, info: dict | None, episodes, edit, code: int, says: str) -> Case:
    """``swm convert`` of the LeRobot fixture with ``info`` merged into its info.json,
    ``episodes`` editing its episode table and ``edit(path)`` its files."""
    path = lerobot(root, (lambda meta: meta.update(info)) if info else None, episodes)
    if edit is not None:
        edit(path)
    return convert(root, path, code, says)


table(lerobot_edited, {
    "lerobot-lengths-wrap": ({"total_frames": None}, _lerobot_lengths_wrap, None, 1,
                             "episode 1 has length 9223372036854775807 but the data rows"),
    "lerobot-fps-below-video": ({"fps": 5}, None, None, 1,
                                "is a video of 10 frames a second, info.json's fps is 5"),
    "lerobot-fps-tiny": ({"fps": 1e-9}, None, None, 1, "info.json's fps is 1e-09"),
    "lerobot-fps-true": ({"fps": True}, None, None, 1, "info.json gives the fps True"),
    "lerobot-timestamps-off": (None, None, _lerobot_stamps_doubled, 1,
                               "episode 0's step 1 has the timestamp 0.2 s, not 0.1 s"),
})  # fmt: skip


def _lerobot_column(name: str, values: list, kind: str):
    """An edit of the LeRobot fixture's data: its column ``name`` replaced by ``values`` (pyarrow
    type ``kind``; ``"ragged"``: lists of floats of the rows' own lengths)."""

    def edit(path: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        file = path / "data/chunk-000/file-000.parquet"
        frames = pq.read_table(file)
        rows = [values[i % len(values)] for i in range(frames.num_rows)]
        column = pa.array(rows, pa.list_(pa.float32()) if kind == "ragged" else kind)
        where = frames.schema.get_field_index(name)
        pq.write_table(frames.set_column(where, name, column), file)

    return edit


def _declare(name: str, dtype: str) -> dict:
    meta = json.loads((LEROBOT / "meta/info.json").read_text())
    meta["features"][name]["dtype"] = dtype
    return {"features": meta["features"]}


table(lerobot_edited, {
    "lerobot-uint8-wraps": (_declare("next.reward", "uint8"), None,
                            _lerobot_column("next.reward", [300.7, 1.0], "float64"), 1,
                            "the column next.reward holds 300.7 (12 such values), not a whole "
                            "number in uint8's 0..255; info.json declares it uint8"),
    "lerobot-int8-wraps": (_declare("next.reward", "int8"), None,
                           _lerobot_column("next.reward", [1000], "int64"), 1,
                           "holds 1000 (24 such values), not a whole number in int8's"),
    "lerobot-list-ragged": (None, None,
                            _lerobot_column("observation.state", [[1.0, 2.0, 3.0], [4.0]],
                                            "ragged"), 1,
                            "row 0 of the column observation.state holds 3 values, not the 2"),
})  # fmt: skip


def minari_episode_one(root: Path, frames: Callable[[int], np.ndarray], says: str) -> Case:
    """``swm convert`` of a Minari dataset whose episode_1 holds the observations ``frames(T+1)``
    (episode_0 holds uint8 frames of 16x16x3)."""

    def build(file):
        steps = file["episode_1/actions"].shape[0]
        del file["episode_1/observations"]
        file["episode_1/observations"] = frames(steps + 1)

    actions = [np.zeros((4, 2), np.float32)] * 2
    return convert(root, minari(root / "in" / "minari", actions, build=build), 1, says)


table(minari_episode_one, {
    "minari-episode-channels-first": (lambda rows: np.zeros((rows, 3, 16, 16), np.uint8),
                                      "episode_1/observations holds uint8 rows of shape "
                                      "(3, 16, 16), episode_0 uint8 rows of shape (16, 16, 3)"),
    "minari-episode-float": (lambda rows: np.full((rows, 16, 16, 3), 0.5),
                             "episode_1/observations holds float64 rows of shape (16, 16, 3), "
                             "episode_0 uint8"),
})  # fmt: skip


def _png16(value: int) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.full((8, 8), value, np.uint16)).save(buffer, "PNG")
    return buffer.getvalue()


def frames_lance(root: Path, frames: list, code: int, says: str, command="info") -> Case:
    """``swm info`` (or convert) of stable-worldmodel's Lance table whose frames are ``frames``."""
    source = upstream_lance(root / "in" / "frames.lance", [0] * len(frames),
                            list(range(len(frames))), pixels=frames)  # fmt: skip
    if command == "convert":
        return convert(root, source, code, says)
    return Case(["info", str(source)], code, says)


table(frames_lance, {
    "png-sixteen-bit": ([_png16(v) for v in (300, 40000, 65535)], 1,
                        "a frame of PNG mode I;16 (more than 8 bits a channel)"),
    "png-then-jpeg": ([image_bytes(kind="PNG"), image_bytes(kind="PNG"),
                       image_bytes(value=90)], 1,
                      "a frame is JPEG quality 75, the column's first PNG (lossless): frames of "
                      "mixed codecs", "convert"),
})  # fmt: skip


def _float64_huge(path: Path) -> Path:
    """swm's own HDF5 dataset whose float64 column ``state`` holds 1e300 on one row."""
    from swmcli import open_writer

    with open_writer(path, mode="overwrite") as writer:
        writer.write_episode({
            "action": np.zeros((3, 2), np.float32),
            "state": np.array([[0.5], [1e300], [2.0]]),
        })  # fmt: skip
    return path


@case
def float64_huge_to_upstream_lance(root):
    source = _float64_huge(root / "in" / "big.h5")
    says = "the column state holds 1e+300 (1 such values), beyond float32's largest"
    return convert(root, source, 2, says, "--layout", "stable-worldmodel", to="out/up.lance")


table(lerobot_edited, {
    "lerobot-float64-huge": (None, None,
                             _lerobot_column("next.reward", [1e300, 0.0], "float64"), 1,
                             "the column next.reward holds 1e+300 (12 such values), beyond "
                             "float32's largest"),
})  # fmt: skip


def _uint16_state(path: Path) -> Path:
    """swm's dataset with a uint16 column ``state`` of shape (1,) (60000 fits no int16)."""
    from swmcli import open_writer

    with open_writer(path, mode="overwrite") as writer:
        writer.write_episode({
            "pixels": np.zeros((3, 16, 16, 3), np.uint8),
            "action": np.ones((3, 2), np.float32),  # a last action, as a user's writer may keep
            "state": np.array([[1], [60000], [3]], np.uint16),
        })  # fmt: skip
    return path


def _reads_back(to: str, key: str, dtype, shape: tuple):
    def check(root: Path) -> None:
        from swmcli.data.formats import open_reader

        reader = open_reader(root / to)
        try:
            assert reader.keys[key] == (np.dtype(dtype), shape), reader.keys
        finally:
            reader.close()

    return check


def export_case(root: Path, write, to: str, flags: str, code: int, says: str, check=None) -> Case:
    """``swm convert`` of the dataset ``write(path)`` to ``to`` with ``flags`` (an export)."""
    source = write(root / "in" / "x.lance")
    found = convert(root, source, code, says, *flags.split(), to=to)
    found.check = check
    return found


table(export_case, {
    "export-float-pixels": (lambda p: swm_data(p, dtype=np.float32, episodes=1, length=3),
                            "out/lr", "--layout lerobot", 2,
                            "pixels holds float32 frames; a --layout lerobot export cannot keep "
                            "them"),
    "export-uint16-pixels": (lambda p: swm_data(p, dtype=np.uint16, episodes=1, length=3),
                             "out/up.lance", "--layout stable-worldmodel", 2,
                             "stable-worldmodel's Lance layout (JPEG) holds 8-bit frames"),
    "export-uint16-column": (_uint16_state, "out/lr", "--layout lerobot", 0, "verified",
                             _reads_back("out/lr", "state", np.uint16, (1,))),
    "export-minari-renamed": (lambda p: swm_data(p, episodes=1, length=3), "out/m-v0",
                              "--layout minari --map pixels=rgb", 0, "verified",
                              _reads_back("out/m-v0", "rgb", np.uint8, (16, 16, 3))),
})  # fmt: skip


@case
def minari_metadata_list(root):
    source = minari(root / "in" / "minari", [np.zeros((3, 2), np.float32)])
    (source / "data" / "metadata.json").write_text("[1, 2]")
    return convert(root, source, 1, "holds a JSON list, not Minari's object of fields")


@case
def lerobot_version_capital(root):
    source = lerobot(root, lambda meta: meta.update(codebase_version="V3.0"))
    return Case(["info", str(source)], 0, "LeRobot")


@case
def lerobot_info_huge(root):
    source = lerobot(root, lambda meta: meta.update(padding="x" * (4 * 2**20)))
    return Case(["info", str(source)], 1, "MiB: larger than any LeRobot info.json")


@case
def model_buffer_nan(root):
    body = ("\n\ndef build(action_dim, frameskip):\n    model = Model(action_dim, frameskip)\n"
            "    model.register_buffer('scale', torch.full((2,), float('nan')))\n"
            "    return model\n")  # fmt: skip
    return model_case(root, body, 2, "the model holds non-finite values in model.scale before "
                      "its first training step")  # fmt: skip


@case
def path_emoji_code(root):
    return Case(["info", str(root / "in" / "pol:factory:")], 2, "in/pol:factory:")


@case
def out_newline_lance(root):
    out = root / "out" / "a\nb.lance"
    args = ["collect", "--preset", "tiny", "--steps", "3", "--out", str(out)]
    return Case(args, 2, "b.lance' holds a control character", writes=("out",))


@case
def lock_name_too_long(root):
    out = root / "out" / ("n" * 250 + ".lance")
    args = ["collect", "--preset", "tiny", "--steps", "3", "--out", str(out)]
    return Case(args, 1, "choose a name of at most 243 bytes", writes=("out",))


table(exported, {
    "export-metadata-keys-list": (json.dumps({"keys": [1, 2]}), 'holds no object "keys"'),
    "export-metadata-entry-text": (json.dumps({"keys": {"action": "f4"}}),
                                   'gives action "f4", not [DTYPE, SHAPE] of numbers'),
})  # fmt: skip


@case
def convert_over_a_dataset_being_read(root):
    """``convert --overwrite`` onto a Lance dataset another reader holds open (what a streaming
    train does): refused, and the dataset reads as before once the reader lets go."""
    from swmcli.data.formats import open_reader

    source = swm_data(root / "in" / "x.lance", episodes=1, length=3)
    target = swm_data(root / "out" / "read.lance", episodes=2, length=3)
    reader = open_reader(target)  # held until the check: the command runs meanwhile

    def check(root: Path) -> None:
        reader.close()
        again = open_reader(target)
        try:
            assert again.num_episodes == 2
        finally:
            again.close()

    found = convert(root, source, 2, "another process is reading it", "--overwrite",
                    to="out/read.lance")  # fmt: skip
    found.check = check
    return found


def _features_with(name: str, value) -> dict:
    meta = json.loads((LEROBOT / "meta/info.json").read_text())
    return {"features": {**meta["features"], name: value}}


table(lerobot_edited, {
    "lerobot-features-list": ({"features": [1]}, None, None, 1,
                              "info.json's features is a list, not an object of features"),
    "lerobot-feature-list": (_features_with("observation.state", [1]), None, None, 1,
                             "info.json's feature observation.state is a list, not an object"),
})  # fmt: skip


def minari_actions(root: Path, actions: np.ndarray, says: str) -> Case:
    """``swm convert`` of a Minari dataset whose episode_0 holds the actions ``actions``."""

    def build(file):
        del file["episode_0/actions"]
        file["episode_0/actions"] = actions

    source = minari(root / "in" / "minari", [np.zeros((3, 2), np.float32)], build=build)
    return convert(root, source, 1, says)


table(minari_actions, {
    "minari-actions-single-value": (np.float32(1), "/episode_0/actions is a single value, not one "
                                    "action a step"),
    "minari-actions-no-values": (np.zeros((3, 0), np.float32), "/episode_0/actions holds rows of "
                                 "shape (0,): no values a row"),
})  # fmt: skip


def _video_garbage(path: Path) -> None:
    (path / "videos/observation.image/chunk-000/file-000.mp4").write_bytes(b"x" * 5000)


table(lerobot_edited, {
    "lerobot-video-garbage": (None, None, _video_garbage, 1,
                              "file-000.mp4: Invalid data found when processing input (not a "
                              "video FFmpeg decodes)"),
})  # fmt: skip


@case
def memprofile_picture_format(root):
    args = ["memprofile", "--preset", "tiny", "--picture", str(root / "out" / "p.xyz")]
    return Case(args, 2, "matplotlib writes no .xyz picture")


def upstream_folder_array(root: Path, name: str, values: np.ndarray, says: str) -> Case:
    """``swm convert`` of stable-worldmodel's folder layout whose ``name.npz`` holds ``values``."""
    path = _folder(root)
    np.savez(path / f"{name}.npz", values)
    return convert(root, path, 1, says, to="out/copy.h5")


table(upstream_folder_array, {
    "upstream-folder-no-values": ("state", np.zeros((14, 2, 0), np.float32),
                                  "the column state holds rows of shape (2, 0): no values a row"),
    "upstream-folder-steps-2d": ("step_idx", np.zeros((14, 2), np.int64),
                                 "step_idx holds 28 values (shape (14, 2)), not one step for each "
                                 "of the 14 rows"),
})  # fmt: skip


@case
def upstream_folder_single_reward(root):
    path = _folder(root)
    np.savez(path / "reward.npz", np.float32(1))
    return Case(["info", str(path)], 0, "a single float32 value, not one a row")
